"""``agentsnap export`` and ``agentsnap timeline``: a run as one JSON document, or drawn."""

from __future__ import annotations

from typing import IO, TYPE_CHECKING, Any

import click

from agentsnap.cli._common import DB, Option, guard, read
from agentsnap.cli._format import Steps
from agentsnap.cli._main import main

if TYPE_CHECKING:
    from agentsnap.store.sql import SqlStore


def _output(help: str, **settings: Any) -> Option:
    """The ``-o/--output`` option (``output``): where the command writes what it makes."""
    return click.option("-o", "--output", help=help, **settings)


@main.command()
@click.argument("run_id")
@DB
@_output(
    "Write the document to this file instead of standard output.",
    type=click.File("w", encoding="utf-8"),
    default="-",
)
@click.option("--indent", type=click.IntRange(min=0), default=None, help="Pretty-print.")
def export(run_id: str, db: str, output: IO[str], indent: int | None) -> None:
    """Print run RUN_ID as one JSON document: the run, its snapshots, its journal.

    RUN_ID may be a unique prefix of the id. The document's keys are described in the
    documentation (reference/export).
    """
    from agentsnap.inspect import resolve_run, write_export  # noqa: PLC0415

    async def query(store: SqlStore) -> None:
        run = await resolve_run(store, run_id)
        count = (await store.snapshot_counts()).get(run.id, 0)
        steps.next(f"writing {count} snapshots")
        # Written as it is read, a page of snapshots at a time, so that a long run's
        # export holds little in memory.
        await write_export(store, run.id, output.write, indent=indent)
        output.write("\n")

    with Steps("export", 2) as steps:
        steps.next(f"reading run {run_id}")
        read(db, query)


@main.command()
@click.argument("run_id")
@DB
@_output(
    "The file to write: .svg, or .html for a page that zooms, pans and shows details.",
    required=True,
    type=click.Path(dir_okay=False),
)
def timeline(run_id: str, db: str, output: str) -> None:
    """Draw run RUN_ID as a space-time diagram: agents, messages, cuts and rollbacks."""
    from pathlib import Path  # noqa: PLC0415

    from agentsnap.timeline import FORMATS, load_timeline, render  # noqa: PLC0415

    path = Path(output)
    if path.suffix.lower() not in FORMATS:
        raise click.ClickException(f"cannot write {output}: use a .svg or .html file")
    with Steps("timeline", 3) as steps:
        steps.next(f"reading run {run_id}")
        found = read(db, lambda store: load_timeline(store, run_id))
        messages = len(found.messages or [])
        steps.next(f"drawing {messages} messages, {len(found.snapshots)} snapshots")
        text = guard(lambda: render(found, path.suffix))
        steps.next(f"writing {output}")
        guard(lambda: path.write_text(text, encoding="utf-8"))
    click.echo(f"wrote {output}")
