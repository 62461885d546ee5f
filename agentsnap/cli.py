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
    from agentsnap.demo import DemoResult
    from agentsnap.store.sql import SqlStore
    from agentsnap.telemetry import Exporter
    from agentsnap.tools import Ledger

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


@main.command()
@click.argument("run_id")
@_DB
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="The file to write: .svg, or .html for a page with details on hover.",
)
def timeline(run_id: str, db: str, output: str) -> None:
    """Draw run RUN_ID as a space-time diagram: agents, messages, cuts and rollbacks."""
    from pathlib import Path  # noqa: PLC0415

    from agentsnap.timeline import FORMATS, load_timeline, render  # noqa: PLC0415

    path = Path(output)
    if path.suffix.lower() not in FORMATS:
        raise click.ClickException(f"cannot write {output}: use a .svg or .html file")
    found = _read(db, lambda store: load_timeline(store, run_id))
    _guard(lambda: path.write_text(render(found, path.suffix), encoding="utf-8"))
    click.echo(f"wrote {output}")


@main.command()
@_DB
@click.option(
    "--model",
    default=None,
    metavar="PROVIDER:NAME",
    help="Use this LangChain chat model instead of the scripted one (needs langchain).",
)
@click.option(
    "--trace",
    "exporter",
    type=click.Choice(["console", "otlp"]),
    default=None,
    help="Export spans and metrics: print them, or send them with OTLP (OTEL_* settings).",
)
def demo(db: str, model: str | None, exporter: Exporter | None) -> None:
    """Run the demo: a critic rejects a draft, the team rolls back, the second draft passes."""
    from agentsnap.demo import describe, run_demo  # noqa: PLC0415
    from agentsnap.models import load_model  # noqa: PLC0415
    from agentsnap.store.sql import SqlStore  # noqa: PLC0415
    from agentsnap.telemetry import install_sdk  # noqa: PLC0415

    chat = _guard(lambda: load_model(model)) if model else None
    # Before the runtime exists: it decides once whether to trace.
    shutdown = _guard(lambda: install_sdk(exporter)) if exporter else None

    async def go() -> DemoResult:
        store = SqlStore(db)
        try:
            return await run_demo(store, chat)
        finally:
            await store.close()

    try:
        result = _guard(lambda: asyncio.run(go()))
    finally:
        if shutdown is not None:
            shutdown()  # flushes the spans and metrics (printed before the summary)
    for line in describe(result, db):
        click.echo(line)
    if result.report is None or result.run.status.value != "succeeded":
        raise click.exceptions.Exit(1)


@main.group()
def tools() -> None:
    """Side-effecting tool calls in the ledger: list them, resolve unknown outcomes."""


@tools.command("list")
@click.argument("run_id", required=False)
@_DB
@click.option("--status", default=None, help="Only calls in this status (e.g. unknown).")
def list_tool_calls(run_id: str | None, db: str, status: str | None) -> None:
    """Print the ledger's calls (of run RUN_ID, if given): key, status, tool, run, agent."""
    entries = _ledger(db, lambda ledger: ledger.list_calls(run_id))
    for entry in entries:
        if status is None or entry.status.value == status:
            click.echo(
                f"{entry.key}  {entry.status.value}  {entry.tool}  attempts={entry.attempts}  "
                f"run={entry.run_id or '-'}  agent={entry.agent or '-'}"
            )


@tools.command("resolve")
@click.argument("key")
@_DB
@click.option("--result", "result", metavar="JSON", help="It happened: what the tool returned.")
@click.option("--error", metavar="TEXT", help="It did not happen: what went wrong.")
def resolve_tool_call(key: str, db: str, result: str | None, error: str | None) -> None:
    """Record the outcome of tool call KEY, whose outcome is unknown.

    Check the outside system first (did the card get charged?). With --result, later calls
    with this key return that JSON without running the tool; with --error, they fail.
    """
    from agentsnap.tools import resolve  # noqa: PLC0415

    if (result is None) == (error is None):
        raise click.UsageError("give either --result JSON or --error TEXT")
    if result is not None:
        try:
            value = json.loads(result)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--result") from exc
        entry = _ledger(db, lambda ledger: resolve(ledger, key, result=value))
    else:
        entry = _ledger(db, lambda ledger: resolve(ledger, key, error=error))
    click.echo(f"{entry.key}: {entry.status.value}")


def _ledger(db: str, action: Callable[[Ledger], Awaitable[T]]) -> T:
    """Run ``action`` against the ledger at ``db`` without creating anything there."""
    from agentsnap.store.sql_ledger import SqlLedger  # noqa: PLC0415

    async def go() -> T:
        ledger = SqlLedger(db, create=False)
        try:
            return await action(ledger)
        finally:
            await ledger.close()

    return _guard(lambda: asyncio.run(go()))


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
