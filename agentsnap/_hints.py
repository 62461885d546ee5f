"""``agentsnap`` command lines to print for a user, written so that they run when pasted.

A program that tells its user what to run next (the demo's "inspect it with: ...") must name
the command as the user's shell can find it. After ``make demo`` the ``agentsnap`` script sits
in ``.venv/bin``, which is not on the ``PATH``: a bare ``agentsnap export ...`` would fail.
``cli_command`` names the script the way it can be run from the current directory:

- ``agentsnap`` when the ``PATH`` finds this installation's script (or this installation has
  none and the ``PATH`` has one);
- else the path of this installation's script, relative to the current directory when it lies
  under it (``.venv/bin/agentsnap``), absolute otherwise;
- else, for a package run from a source tree without being installed, the interpreter with
  ``-m agentsnap``.

Every word is quoted for the shell where it needs to be (a database URL with ``?`` or ``&``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

__all__ = ["cli_command", "cli_words"]

SCRIPT = "agentsnap"
"""The name of the console script the package installs."""


def cli_command(*args: str) -> str:
    """The shell command line that runs ``agentsnap`` with ``args`` from the current directory.

    Example:
        ``cli_command("export", run_id, "--db", url)`` gives
        ``.venv/bin/agentsnap export 3fa2… --db sqlite:///agentsnap.db`` after ``make demo``,
        or ``agentsnap export …`` once the virtual environment is active.
    """
    return _join([*cli_words(), *args])


def cli_words(
    *,
    search_path: str | None = None,
    cwd: Path | None = None,
    scripts: Sequence[Path] | None = None,
) -> list[str]:
    """The words that start an ``agentsnap`` command line, as a user here can type them.

    Args:
        search_path: The ``PATH`` to search (the environment's by default).
        cwd: The directory the command will be typed in (the current one by default).
        scripts: The directories where this installation may have put its script (by
            default the running interpreter's scripts directories: its environment's, then
            the user's).
    """
    here = Path.cwd() if cwd is None else cwd
    own = _own_script(_scripts_dirs() if scripts is None else scripts)
    on_path = shutil.which(SCRIPT, path=search_path)
    if on_path is not None and (own is None or _same_file(Path(on_path), own)):
        return [SCRIPT]
    if own is not None:
        return [_shown(own, here)]
    # Not installed as a script (imported from a source tree): the interpreter runs it.
    return [_shown(Path(sys.executable), here), "-m", "agentsnap"]


def _scripts_dirs() -> list[Path]:
    """Where the running interpreter's installs put scripts: its environment, then the user's."""
    found = [Path(sysconfig.get_path("scripts"))]
    try:
        user = sysconfig.get_path("scripts", sysconfig.get_preferred_scheme("user"))
    except KeyError:  # a build without a user scheme
        return found
    found.append(Path(user))
    return found


def _own_script(dirs: Sequence[Path]) -> Path | None:
    """This installation's ``agentsnap`` script, if one of ``dirs`` holds it."""
    for folder in dirs:
        found = shutil.which(SCRIPT, path=str(folder))
        if found is not None:
            return Path(found)
    return None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:
        return False


def _shown(path: Path, cwd: Path) -> str:
    """``path`` as typed in ``cwd``: relative when under it (``./`` kept if needed), else whole."""
    if not path.is_absolute():
        path = Path(os.path.abspath(path))
    if path.is_relative_to(cwd):
        relative = str(path.relative_to(cwd))
        # A bare name would be looked up on the PATH instead.
        return relative if os.sep in relative else os.path.join(os.curdir, relative)
    return str(path)


def _join(words: Sequence[str]) -> str:
    if os.name == "nt":
        return subprocess.list2cmdline(words)
    return shlex.join(words)
