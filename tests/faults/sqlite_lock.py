"""Another process holding an SQLite database's write lock, as a second writer would.

The holder is a child Python process: it opens the database, runs ``BEGIN IMMEDIATE`` (which
takes the write lock; readers go on in WAL mode), says so, and keeps the lock until its time
is up or it is told to let go, then rolls back and exits::

    with SqliteLockHolder(path, seconds=3) as holder:   # returns once the lock is held
        ...                                              # every writer now waits or fails
    # left: released (early if need be)

``holder.wait()`` waits for it to let go on its own; ``holder.release()`` makes it let go now.
"""

from __future__ import annotations

import contextlib
import select
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Self

__all__ = ["SqliteLockHolder"]

_HOLDER = """
import select, sqlite3, sys
path, seconds = sys.argv[1], float(sys.argv[2])
conn = sqlite3.connect(path, timeout=60, isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
select.select([sys.stdin], [], [], seconds)  # a line (or EOF) on stdin lets go early
conn.execute("ROLLBACK")
conn.close()
print("released", flush=True)
"""
_READY_TIMEOUT = 60.0


class SqliteLockHolder:
    """A child process that holds the write lock of the SQLite file ``path``.

    Args:
        path: The database file (created empty if missing).
        seconds: How long the lock is held once taken, unless released earlier.

    Attributes:
        locked_at: ``time.monotonic()`` when the child reported the lock held.
        released_at: ``time.monotonic()`` when the child had let go (exited).
    """

    def __init__(self, path: Path | str, *, seconds: float) -> None:
        self.path = Path(path)
        self.seconds = seconds
        self.locked_at: float | None = None
        self.released_at: float | None = None
        self._process: subprocess.Popen[str] | None = None

    def __repr__(self) -> str:
        return (
            f"SqliteLockHolder({str(self.path)!r}, seconds={self.seconds}, held={self.is_held()})"
        )

    def is_held(self) -> bool:
        """Whether the child holds the lock now."""
        return (
            self._process is not None
            and self.locked_at is not None
            and self._process.poll() is None
        )

    def start(self) -> Self:
        """Start the child and return once it holds the lock.

        Raises:
            RuntimeError: The child could not take the lock (its error is in the message).
        """
        if self._process is not None:
            raise RuntimeError("this holder was already started")
        process = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(self.path), repr(self.seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._process = process
        line = _read_line(process.stdout, _READY_TIMEOUT)
        if line.strip() != "locked":
            self._kill()
            error = process.stderr.read() if process.stderr else ""
            raise RuntimeError(f"the lock holder did not take the lock: {line!r} {error}")
        self.locked_at = time.monotonic()
        return self

    def release(self) -> None:
        """Make the child let go now (if it still holds the lock) and wait for it to exit."""
        process = self._process
        if process is None:
            return
        if process.poll() is None and process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.write("\n")
                process.stdin.flush()
        self.wait()

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the child let go of the lock on its own and exited."""
        process = self._process
        if process is None:
            return
        limit = self.seconds + _READY_TIMEOUT if timeout is None else timeout
        try:
            process.wait(limit)
        except subprocess.TimeoutExpired:
            self._kill()
        if self.released_at is None:
            self.released_at = time.monotonic()
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def _kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _read_line(stream: IO[str] | None, timeout: float) -> str:
    """One line from the child's stdout, or ``""`` after ``timeout`` seconds."""
    if stream is None:
        return ""
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if ready else ""
