"""Running a command with a pseudo-terminal as its standard output, as a user's shell does."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import termios


def run_on_terminal(command: list[str], env: dict[str, str], columns: int | None = None) -> str:
    """What ``command`` wrote to a terminal (``columns`` wide, if given); it must succeed."""
    leader, follower = pty.openpty()
    if columns is not None:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    try:
        process = subprocess.Popen(command, stdout=follower, stderr=subprocess.PIPE, env=env)
    finally:
        os.close(follower)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal is closed: the process is done
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return b"".join(chunks).decode()
