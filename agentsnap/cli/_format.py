"""The one place output is shaped: JSON, tables, times, counts, values, diffs, progress.

Tables fit the terminal unless ``--wide`` is given; times are local unless ``--utc`` is; JSON
is printed from the commands' typed results, times in ISO 8601 UTC.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any, TypeAlias, TypeVar

import click
from pydantic import BaseModel

from agentsnap import console
from agentsnap.cli._main import UTC_KEY, WIDE_KEY

if TYPE_CHECKING:
    from agentsnap.inspect import StateDiff


def jsonable(value: object) -> object:
    """``value`` as JSON data: a typed result (or a list of them) dumped in JSON mode."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        return [jsonable(item) for item in value]
    return value


def print_json(value: object) -> None:
    """Print a typed result, or JSON data a query of ``agentsnap.inspect`` returned, indented."""
    click.echo(json.dumps(jsonable(value), indent=2, ensure_ascii=False))


Row = TypeVar("Row", bound="dict[str, Any] | BaseModel")

Column: TypeAlias = str | Callable[[Row], object]
"""A table column: the row's field (or key) to show, or a function of the row."""


def print_rows(
    rows: Sequence[Row],
    as_json: bool,
    columns: dict[str, Column[Row]],
    *,
    kinds: dict[str, console.Kind] | None = None,
    notes: Callable[[Row], str | None] | None = None,
) -> None:
    """Print ``rows`` (typed results, or JSON objects) as JSON, or as a table with one
    column per entry of ``columns``.

    The table fits the terminal unless ``--wide`` is given (see ``agentsnap.console``);
    ``kinds`` says how columns give way, by header, where the header does not tell;
    ``notes`` gives the text to show on lines of its own under a row, if any.
    """  # noqa: D205
    if as_json:
        print_json(list(rows))
        return
    print_table(
        list(columns),
        [[c(r) if callable(c) else _field(r, c) for c in columns.values()] for r in rows],
        kinds=kinds,
        notes=None if notes is None else [notes(r) for r in rows],
    )


def _field(row: dict[str, Any] | BaseModel, name: str) -> object:
    return row[name] if isinstance(row, dict) else getattr(row, name)


def print_table(
    headers: list[str],
    rows: list[list[object]],
    *,
    kinds: dict[str, console.Kind] | None = None,
    notes: list[str | None] | None = None,
) -> None:
    """Print a table fitted to the terminal (whole with ``--wide``), one line per row."""
    # Colour codes are written always: click drops them when the output is not a terminal
    # (a pipe, a file, a test), and with --no-color or NO_COLOR (the context's ``color``).
    ctx = click.get_current_context(silent=True)
    wide = ctx is not None and bool(ctx.meta.get(WIDE_KEY))
    lines = console.render_table(
        headers,
        rows,
        width=console.table_width(sys.stdout, wide=wide),
        kinds=kinds,
        ellipsis=console.ellipsis_for(sys.stdout),
        notes=notes,
    )
    for line in lines:
        click.echo(line)


def when(moment: datetime | str | None) -> str:
    """A time (or an ISO 8601 one) as ``2026-11-24 21:05:03 +01:00``: local time, or UTC
    with ``--utc``.

    A time without an offset is taken to be UTC (as agentsnap stores them).
    """  # noqa: D205
    if moment is None:
        return "-"
    if isinstance(moment, datetime):
        parsed = moment
    else:
        try:
            parsed = datetime.fromisoformat(moment)
        except ValueError:
            return moment
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    ctx = click.get_current_context(silent=True)
    utc = ctx is not None and bool(ctx.meta.get(UTC_KEY))
    shown = parsed.astimezone(UTC if utc else None)
    offset = shown.strftime("%z")
    return f"{shown:%Y-%m-%d %H:%M:%S} {offset[:3]}:{offset[3:]}"


def counters(counts: dict[str, int]) -> str:
    """A cut's counters by channel: ``critic=2, writer=1`` (``-`` for none)."""
    return ", ".join(f"{name}={n}" for name, n in sorted(counts.items())) or "-"


def clipped(value: object, limit: int = 200) -> str:
    """``value`` as JSON on one line, keys sorted, cut to ``limit`` characters."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def diff_lines(diff: StateDiff) -> list[str]:
    """An agent's state diff (``diff_states``) as lines: ``+`` added, ``-`` removed, ``~``."""
    lines = []
    for prefix, changes in (
        ("memory.", diff.memory),
        ("tool_calls.", diff.tool_calls),
        ("", diff.fields),
    ):
        lines += [f"+ {prefix}{k}: {clipped(v)}" for k, v in changes.added.items()]
        lines += [f"- {prefix}{k}: {clipped(v)}" for k, v in changes.removed.items()]
        lines += [
            f"~ {prefix}{k}: {clipped(v.old)} -> {clipped(v.new)}"
            for k, v in changes.changed.items()
        ]
    for step in diff.plan:
        if step.change == "added":
            lines.append(f"+ plan[{step.index}]: {clipped(step.new)}")
        elif step.change == "removed":
            lines.append(f"- plan[{step.index}]: {clipped(step.old)}")
        else:
            lines.append(f"~ plan[{step.index}]: {clipped(step.old)} -> {clipped(step.new)}")
    return lines


def many(count: int, noun: str) -> str:
    """``1 run``, ``2 runs``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def latency(ms: float) -> str:
    """``0.4 ms``, ``840 ms``, ``12.5 s``."""
    if ms < 10:
        return f"{ms:.1f} ms"
    return f"{ms:.0f} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


def progress_stream() -> IO[str] | None:
    """Where progress goes: standard error when it is a terminal, else nowhere."""
    stream = sys.stderr
    return stream if stream is not None and stream.isatty() else None


class Steps:
    """Shows which step of a long command runs, on one line of standard error.

    Only when standard error is a terminal, so pipes, files and tests see nothing; the line
    is erased when the command is done (or fails, before its error is printed).
    """

    def __init__(self, command: str, total: int) -> None:
        self._stream = progress_stream()
        self._command = command
        self._total = total
        self._done = 0

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stream is not None and self._done:
            self._stream.write("\r\033[K")
            self._stream.flush()

    def next(self, what: str) -> None:
        self._done += 1
        if self._stream is not None:
            self._stream.write(f"\r\033[K{self._command} [{self._done}/{self._total}] {what}...")
            self._stream.flush()
