"""Ctrl-C (SIGINT) to a process a test started, and why it did not stop when it does not.

A process started while the test process ignores SIGINT ignores it too: an ignored signal
stays ignored across ``exec``, and Python then installs no ``KeyboardInterrupt`` handler, so
the child never notices Ctrl-C. A shell that runs a command in the background without job
control (``(make test &)`` in a script, or a launcher doing the same) starts it that way;
``conftest.py`` gives the test process Python's handler back, and [`interrupt`][] checks the
child all the same, so such a failure names its cause at once instead of timing out.

Start the child with [`DUMP_ON_ABORT`][] in its environment: when it does not stop in time,
[`stopped`][] tells its signal state from ``/proc`` and what each of its threads was doing
(``faulthandler`` prints their stacks on SIGABRT), with everything it wrote.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

DUMP_ON_ABORT = {"PYTHONFAULTHANDLER": "1"}
"""Environment for a Python child: on SIGABRT it prints every thread's stack, then dies."""


def _signal_names(mask: str) -> list[str]:
    """The signals set in a ``/proc`` hexadecimal signal mask, by name."""
    bits = int(mask, 16)
    names = []
    for number in range(1, 65):
        if bits & (1 << (number - 1)):
            try:
                names.append(signal.Signals(number).name)
            except ValueError:
                names.append(str(number))
    return names


def _status(path: Path) -> dict[str, str]:
    """The fields of a ``/proc/.../status`` file; empty when it is gone."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    return {
        key: value.strip() for key, _, value in (line.partition(":") for line in text.splitlines())
    }


def signal_state(pid: int) -> str:
    """Which signals process ``pid`` ignores, catches, and blocks in each thread; one line each."""
    process = _status(Path(f"/proc/{pid}/status"))
    if not process:
        return f"process {pid}: gone"
    lines = [
        f"process {pid} ({process.get('Name', '?')}, {process.get('State', '?')}): "
        f"ignores {_signal_names(process.get('SigIgn', '0')) or 'nothing'}, "
        f"catches {_signal_names(process.get('SigCgt', '0')) or 'nothing'}, "
        f"pending {_signal_names(process.get('ShdPnd', '0')) or 'nothing'}"
    ]
    with contextlib.suppress(OSError):
        for task in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
            status = _status(Path(f"/proc/{pid}/task/{task}/status"))
            wchan = Path(f"/proc/{pid}/task/{task}/wchan")
            waits = wchan.read_text() if wchan.exists() else "?"
            lines.append(
                f"  thread {task} ({status.get('Name', '?')}, {status.get('State', '?')}, "
                f"waits in {waits or '-'}): "
                f"blocks {_signal_names(status.get('SigBlk', '0')) or 'nothing'}"
            )
    return "\n".join(lines)


def unreachable(pid: int, sig: signal.Signals = signal.SIGINT) -> str | None:
    """Why ``sig`` cannot reach process ``pid`` (it ignores it, or every thread blocks it).

    ``None`` when it can (or the process is gone: then there is nothing to say here).
    """
    process = _status(Path(f"/proc/{pid}/status"))
    if not process:
        return None
    if sig.name in _signal_names(process.get("SigIgn", "0")):
        return f"process {pid} ignores {sig.name}"
    with contextlib.suppress(OSError):
        masks = [
            _status(Path(f"/proc/{pid}/task/{task}/status")).get("SigBlk", "0")
            for task in os.listdir(f"/proc/{pid}/task")
        ]
        if masks and all(sig.name in _signal_names(mask) for mask in masks):
            return f"every thread of process {pid} blocks {sig.name}"
    return None


def _own_sigint() -> str:
    """How this test process handles SIGINT, which its children inherit when ignored."""
    handler = signal.getsignal(signal.SIGINT)
    shown = getattr(handler, "__name__", repr(handler))
    return f"this test process (pid {os.getpid()}) handles SIGINT with {shown}"


def interrupt(process: subprocess.Popen[str]) -> None:
    """Send Ctrl-C (SIGINT) to ``process``, failing at once if it cannot arrive."""
    reason = unreachable(process.pid)
    assert reason is None, (
        f"{reason}, so Ctrl-C cannot stop it; it inherited that from the process that started "
        f"it ({_own_sigint()}; a shell running the tests in the background without job "
        f"control starts them ignoring SIGINT)\n{signal_state(process.pid)}"
    )
    process.send_signal(signal.SIGINT)


def stopped(process: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """What ``process`` wrote (stdout, stderr) once it ended, within ``timeout`` seconds.

    When it is still running then, fail with its signal state, what its threads were doing
    (a ``faulthandler`` dump, if it was started with [`DUMP_ON_ABORT`][]) and its output.
    """
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    state = signal_state(process.pid)
    process.send_signal(signal.SIGABRT)
    try:
        stdout, stderr = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
    raise AssertionError(
        f"process {process.pid} ({process.args!r}) did not end within "
        f"{timeout} s\n{state}\n{_own_sigint()}\n"
        f"stdout:\n{stdout}\nstderr (then its threads' stacks, on SIGABRT):\n{stderr}"
    )


__all__ = ["DUMP_ON_ABORT", "interrupt", "signal_state", "stopped", "unreachable"]
