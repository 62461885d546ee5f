"""A small disk that a test fills up and frees again: a tmpfs of a few MB.

The database lives on it; ``fill()`` writes a filler file until the disk has no byte left, so
that the next write that needs space fails with ``ENOSPC`` (SQLite: ``SQLITE_FULL``,
"database or disk is full"); ``clear()`` deletes the filler and the space is back::

    with SmallDisk.mount(tmp_path / "disk", size_mb=8) as disk:
        url = f"sqlite:///{disk.path / 'agentsnap.db'}"
        disk.fill()
        ...
        disk.clear()

Mounting needs root (or ``CAP_SYS_ADMIN``); ``mount()`` raises ``DiskUnavailable`` saying
why when it is not allowed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["DiskUnavailable", "SmallDisk"]

_FILLER = ".filler"
_BIG = 1 << 20
_SMALL = 4096


class DiskUnavailable(Exception):
    """A tmpfs cannot be mounted here; the message says why."""


class SmallDisk:
    """A tmpfs mounted at ``path``, with a filler file to make it full.

    Attributes:
        path: The mount point.
        size_mb: The disk's size.
    """

    def __init__(self, path: Path, size_mb: int) -> None:
        self.path = path
        self.size_mb = size_mb
        self._mounted = False

    def __repr__(self) -> str:
        return f"SmallDisk({str(self.path)!r}, {self.size_mb} MB, free={self.free_bytes()})"

    @classmethod
    def mount(cls, path: Path, *, size_mb: int = 8) -> SmallDisk:
        """Mount a tmpfs of ``size_mb`` MB at ``path`` (created if missing).

        Raises:
            DiskUnavailable: ``mount`` is missing or not permitted.
        """
        mount = shutil.which("mount")
        if mount is None:
            raise DiskUnavailable("no mount command to mount a tmpfs for the disk-full fault")
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [mount, "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise DiskUnavailable(
                f"mounting a {size_mb} MB tmpfs at {path} is not permitted here "
                f"(euid {os.geteuid()}): {done.stderr.strip() or done.returncode}"
            )
        disk = cls(path, size_mb)
        disk._mounted = True
        return disk

    def free_bytes(self) -> int:
        """Bytes free for an ordinary user's files."""
        stats = os.statvfs(self.path)
        return stats.f_bavail * stats.f_frsize

    @property
    def full(self) -> bool:
        """Whether the filler is there."""
        return (self.path / _FILLER).exists()

    def fill(self) -> int:
        """Write the filler until the disk is full; how many bytes it took."""
        written = 0
        with (self.path / _FILLER).open("ab", buffering=0) as filler:
            for size in (_BIG, _SMALL, 1):
                chunk = b"\0" * size
                while True:
                    try:
                        written += filler.write(chunk) or 0
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
        return written

    def clear(self) -> None:
        """Delete the filler: the space is free again."""
        with contextlib.suppress(FileNotFoundError):
            (self.path / _FILLER).unlink()

    def unmount(self) -> None:
        """Unmount (lazily if something still has a file open on it)."""
        if not self._mounted:
            return
        self._mounted = False
        done = subprocess.run(["umount", str(self.path)], capture_output=True, check=False)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.unmount()
