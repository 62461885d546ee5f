"""The ``agentsnap`` group, and the options every command takes.

``--no-color`` by all; ``--utc`` and ``--wide`` by the commands that print times and tables
(``TIMES``, ``TABLES``), before the command's name or after it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import click

from agentsnap import __version__

UTC_KEY = "agentsnap.utc"
"""Where ``--utc`` is kept in the context's ``meta`` (shared by a command and its group)."""


WIDE_KEY = "agentsnap.wide"
"""Where ``--wide`` is kept in the context's ``meta``."""


def _no_color(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--no-color``: print no ANSI colours, even on a terminal."""
    if value:
        ctx.color = False


def _utc(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--utc``: show times in UTC rather than local time."""
    if value:
        ctx.meta[UTC_KEY] = True


def _wide(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--wide``: show tables whole, however wide, rather than fitted to the terminal."""
    if value:
        ctx.meta[WIDE_KEY] = True


def _eager_flag(
    name: str, callback: Callable[[click.Context, click.Parameter, bool], None], help_text: str
) -> click.Option:
    """A flag taken before the command's name or after it, acting at once (not passed on)."""
    return click.Option(
        [name], is_flag=True, expose_value=False, is_eager=True, callback=callback, help=help_text
    )


def wide_option() -> click.Option:
    """``--wide``, for the commands that print tables."""
    return _eager_flag(
        "--wide", _wide, "Show tables whole, even wider than the terminal (as they are when piped)."
    )


def no_color_option() -> click.Option:
    """``--no-color``, taken before the command's name or after it."""
    return _eager_flag(
        "--no-color",
        _no_color,
        "No colours (also when NO_COLOR is set; there are none off a terminal).",
    )


def utc_option() -> click.Option:
    """``--utc``, for the commands that print times, before their name or after it."""
    return _eager_flag("--utc", _utc, "Show times in UTC instead of local time.")


class _MainGroup(click.Group):
    """The ``agentsnap`` group: honours ``NO_COLOR`` (https://no-color.org) from the start,
    and stops quietly when standard output is closed (``agentsnap export RUN | head``).
    """  # noqa: D205

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        if os.environ.get("NO_COLOR"):  # any non-empty value
            extra["color"] = False
        with _quiet_on_closed_stdout():  # --help and --version print here
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with _quiet_on_closed_stdout():
            result = super().invoke(ctx)
            # What is still buffered goes now, while a closed pipe can be told apart.
            if sys.stdout is not None:
                sys.stdout.flush()
            return result


@contextlib.contextmanager
def _quiet_on_closed_stdout() -> Iterator[None]:
    """Exit with status 0 and nothing on standard error when standard output is closed.

    A reader that has seen enough (``head``, ``less`` quit early) closes the pipe; like
    other Unix tools, the command then stops without complaining. The rest of the output
    goes to ``/dev/null``, so that Python's final flush at exit does not fail again.
    """
    try:
        yield
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (AttributeError, OSError, ValueError):  # no real file behind stdout (a test's)
            pass
        raise click.exceptions.Exit(0) from None


@click.group(
    cls=_MainGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    params=[no_color_option(), utc_option(), wide_option()],
)
@click.version_option(__version__, prog_name="agentsnap")
def main() -> None:
    """Inspect and drive agentsnap runs."""


def commands(group: click.Group, path: str = "") -> Iterator[tuple[str, click.Command]]:
    """Every command under ``group`` that runs on its own, with its path, depth first.

    That is every command that is not a group, and every group that does something when
    invoked without a command.
    """
    for name, command in group.commands.items():
        here = f"{path} {name}".strip()
        if isinstance(command, click.Group):
            if command.invoke_without_command:
                yield here, command
            yield from commands(command, here)
        else:
            yield here, command


TABLES = frozenset(
    {
        "runs",
        "snapshots",
        "owners",
        "rollbacks",
        "checkpoints",
        "tools list",
        "model-calls",
        "requests",
        "events",
    }
)
"""The commands that print tables, and so take ``--wide``."""

TIMES = frozenset(
    {
        "runs",
        "runs delete",
        "runs prune",
        "snapshots",
        "show",
        "history",
        "owners",
        "rollbacks",
        "checkpoints",
        "tools list",
        "requests",
        "events",
    }
)
"""The commands that print times (in local time, or UTC with ``--utc``), and so take ``--utc``.

JSON output and ``export`` have times in UTC always.
"""


def add_shared_options(group: click.Group) -> None:
    """Give every command under ``group`` ``--no-color``, and ``--utc`` and ``--wide`` to
    those of ``TIMES`` and ``TABLES``: each is taken after the command's name too.
    """  # noqa: D205
    for path, command in commands(group):
        command.params.append(no_color_option())
        if path in TIMES:
            command.params.append(utc_option())
        if path in TABLES:
            command.params.append(wide_option())
