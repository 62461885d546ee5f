"""The ``agentsnap`` command line: a thin shell over the library.

The database comes from ``--db``, else the ``AGENTSNAP_DB`` environment variable, else
``sqlite:///agentsnap.db``. Errors are one line on standard error and a non-zero exit status.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import IO, TYPE_CHECKING, TypeVar

import click

from agentsnap import __version__
from agentsnap.exceptions import AgentsnapError

if TYPE_CHECKING:
    from agentsnap.store.sql import SqlStore

__all__ = ["main"]

T = TypeVar("T")

_DB = click.option(
    "--db",
    envvar="AGENTSNAP_DB",
    default="sqlite:///agentsnap.db",
    show_default=True,
    help="Database URL (or set AGENTSNAP_DB).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="agentsnap")
def main() -> None:
    """Inspect and drive agentsnap runs."""


@main.group()
def db() -> None:
    """Manage the database schema."""


@db.command()
@_DB
@click.option("--revision", default="head", show_default=True, help="Target revision.")
def upgrade(db: str, revision: str) -> None:
    """Upgrade the schema to the newest revision (or --revision)."""
    from agentsnap.store import migrate  # noqa: PLC0415  # keeps `agentsnap --help` fast

    _guard(lambda: migrate.upgrade(db, revision))
    click.echo(f"schema at {_guard(lambda: migrate.current(db))}")


@db.command()
@_DB
def current(db: str) -> None:
    """Print the schema revision of the database and whether it is the newest."""
    from agentsnap.store import migrate  # noqa: PLC0415

    found = _guard(lambda: migrate.current(db))
    newest = migrate.head()
    if found is None:
        click.echo(f"no agentsnap schema (newest is {newest}): run `agentsnap db upgrade`")
    elif found == newest:
        click.echo(f"{found} (newest)")
    else:
        click.echo(f"{found} (newest is {newest}): run `agentsnap db upgrade`")


@main.command()
@click.argument("run_id")
@_DB
@click.option(
    "-o",
    "--output",
    type=click.File("w", encoding="utf-8"),
    default="-",
    help="Write the document to this file instead of standard output.",
)
@click.option("--indent", type=click.IntRange(min=0), default=None, help="Pretty-print.")
def export(run_id: str, db: str, output: IO[str], indent: int | None) -> None:
    """Print run RUN_ID as one JSON document: the run, its snapshots, its journal.

    The document's keys are described in the documentation (reference/export).
    """
    from agentsnap.inspect import export_run  # noqa: PLC0415

    document = _read(db, lambda store: export_run(store, run_id))
    json.dump(document, output, indent=indent, ensure_ascii=False)
    output.write("\n")


def _read(db: str, query: Callable[[SqlStore], Awaitable[T]]) -> T:
    """Run one query against the database at ``db`` without creating anything there."""
    from agentsnap.store.sql import SqlStore  # noqa: PLC0415

    async def go() -> T:
        store = SqlStore(db, create=False)
        try:
            return await query(store)
        finally:
            await store.close()

    return _guard(lambda: asyncio.run(go()))


def _guard(action: Callable[[], T]) -> T:
    try:
        return action()
    except AgentsnapError as exc:
        raise click.ClickException(str(exc)) from exc
    except Exception as exc:  # a database error: one line, no traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise click.ClickException(f"{type(exc).__name__}: {first}") from exc
