"""The ``agentsnap`` command line: a thin shell over the library.

The database comes from ``--db``, else the ``AGENTSNAP_DB`` environment variable, else
``sqlite:///agentsnap.db``. Errors are one line on standard error and a non-zero exit status.
Colour is used only on a terminal, and never with ``--no-color`` or ``NO_COLOR`` set; times
are shown in local time with their UTC offset (``--utc`` for UTC), and in ISO 8601 UTC in JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import IO, TYPE_CHECKING, Any, Literal, TypeVar

import click
from click.core import ParameterSource

from agentsnap import __version__, console
from agentsnap.exceptions import AgentsnapError
from agentsnap.ledger import ToolCallStatus
from agentsnap.records import RunStatus
from agentsnap.store.faults import StoreRetry

if TYPE_CHECKING:
    from pydantic import BaseModel

    from agentsnap.demo import DemoResult
    from agentsnap.distributed.app import App
    from agentsnap.fork import MessageEdits
    from agentsnap.ledger import Ledger
    from agentsnap.records import RunInfo, Snapshot
    from agentsnap.store.retention import DeleteReport
    from agentsnap.store.spool import ReplayReport, Spool
    from agentsnap.store.sql import SqlStore
    from agentsnap.telemetry import Exporter

__all__ = ["main"]

T = TypeVar("T")

# A command waits a few seconds for a database that does not answer, then says so.
_RETRY = StoreRetry(timeout=10.0, deadline=5.0)

_DB = click.option(
    "--db",
    envvar="AGENTSNAP_DB",
    default="sqlite:///agentsnap.db",
    show_default=True,
    help="Database URL (or set AGENTSNAP_DB).",
)


_UTC_KEY = "agentsnap.utc"
"""Where ``--utc`` is kept in the context's ``meta`` (shared by a command and its group)."""


_WIDE_KEY = "agentsnap.wide"
"""Where ``--wide`` is kept in the context's ``meta``."""


def _no_color(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--no-color``: print no ANSI colours, even on a terminal."""
    if value:
        ctx.color = False


def _utc(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--utc``: show times in UTC rather than local time."""
    if value:
        ctx.meta[_UTC_KEY] = True


def _wide(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--wide``: show tables whole, however wide, rather than fitted to the terminal."""
    if value:
        ctx.meta[_WIDE_KEY] = True


def _wide_option() -> click.Option:
    """``--wide``, for the commands that print tables."""
    return click.Option(
        ["--wide"],
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_wide,
        help="Show tables whole, even wider than the terminal (as they are when piped).",
    )


def _no_color_option() -> click.Option:
    """``--no-color``, taken before the command's name or after it."""
    return click.Option(
        ["--no-color"],
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_no_color,
        help="No colours (also when NO_COLOR is set; there are none off a terminal).",
    )


def _utc_option() -> click.Option:
    """``--utc``, for the commands that print times, before their name or after it."""
    return click.Option(
        ["--utc"],
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_utc,
        help="Show times in UTC instead of local time.",
    )


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
    params=[_no_color_option(), _utc_option(), _wide_option()],
)
@click.version_option(__version__, prog_name="agentsnap")
def main() -> None:
    """Inspect and drive agentsnap runs."""


@main.group()
def db() -> None:
    """Manage the database: its schema, and writes spooled while it was unavailable."""


@db.command()
@_DB
@click.option("--revision", default="head", show_default=True, help="Target revision.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {revision, newest, up_to_date}.")
def upgrade(db: str, revision: str, as_json: bool) -> None:
    """Upgrade the schema to the newest revision (or --revision)."""
    from agentsnap.store import migrate  # noqa: PLC0415  # keeps `agentsnap --help` fast

    _guard(lambda: migrate.check_database(db, create=True))
    _guard(lambda: migrate.upgrade(db, revision))
    found = _guard(lambda: migrate.current(db))
    if as_json:
        newest = migrate.head()
        _print_json({"revision": found, "newest": newest, "up_to_date": found == newest})
    else:
        click.echo(f"schema at {found}")


@db.command()
@_DB
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON: {exists, revision, newest, up_to_date}.",
)
def current(db: str, as_json: bool) -> None:
    """Print the schema revision of the database and whether it is the newest.

    Nothing is created: for an SQLite file that does not exist, it says so.
    """
    from agentsnap.store import migrate  # noqa: PLC0415
    from agentsnap.store.dialect import database_exists  # noqa: PLC0415

    exists = _guard(lambda: database_exists(db))
    if exists:  # a directory, or a file that is not SQLite, is an error
        _guard(lambda: migrate.check_database(db, create=False))
    found = _guard(lambda: migrate.current(db)) if exists else None
    newest = migrate.head()
    if as_json:
        _print_json(
            {"exists": exists, "revision": found, "newest": newest, "up_to_date": found == newest}
        )
    elif not exists:
        click.echo(
            f"there is no database at {db} (newest schema is {newest}): check the --db URL, "
            "or create it with `agentsnap db upgrade`"
        )
    elif found is None:
        click.echo(f"no agentsnap schema (newest is {newest}): run `agentsnap db upgrade`")
    elif found == newest:
        click.echo(f"{found} (newest)")
    else:
        click.echo(f"{found} (newest is {newest}): run `agentsnap db upgrade`")


@db.command()
@_DB
@click.option(
    "--spool",
    "spool_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="The spool directory [default: DB_FILE.spool beside an SQLite database, else the "
    "database's directory under $XDG_STATE_HOME/agentsnap/spool].",
)
@click.option("--run", "run_id", default=None, help="Only this run (an id or a unique prefix).")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON: {spool, applied, kept, complete}.",
)
def recover(db: str, spool_dir: str | None, run_id: str | None, as_json: bool) -> None:
    """Write to the database what runs spooled locally while it was unavailable.

    A run that closes while its database is down keeps the writes it could not make in a
    local spool; `agentsnap db recover` replays them, printing one line per spooled write
    (applied, already stored, no change, stale) and a summary. It exits with status 1 when
    writes are left in the spool, saying why: fix that and run it again.
    """
    from agentsnap.store.spool import Spool  # noqa: PLC0415

    spool = _guard(lambda: Spool.for_url(db, spool_dir))
    spooled = _guard(spool.runs)
    if run_id is not None:
        spooled = _spooled_run(spooled, run_id)
    if not spooled:
        of_run = f" of run {run_id}" if run_id is not None else ""
        if as_json:
            _print_json(
                {"spool": str(spool.directory), "applied": [], "kept": [], "complete": True}
            )
        else:
            click.echo(f"nothing to recover: no spooled writes{of_run} in {spool.directory}")
        return

    async def go() -> ReplayReport:
        from agentsnap.store.sql import SqlStore  # noqa: PLC0415
        from agentsnap.store.sql_ledger import SqlLedger  # noqa: PLC0415

        store = SqlStore(db, create=False, retry=_RETRY)
        ledger = SqlLedger(db, create=False, retry=_RETRY)
        try:
            return await spool.replay(store, ledger, spooled[0] if run_id is not None else None)
        finally:
            await ledger.close()
            await store.close()

    report = _guard(lambda: asyncio.run(go()))
    if as_json:
        _print_json(_recover_document(report, spool))
        if not report.complete:
            raise click.ClickException(_recover_advice(report))
        return
    for done in report.applied:
        click.echo(f"{done.outcome.value:<14}  {done.op.run_id}  {done.op.describe()}")
    runs_done = len({done.op.run_id for done in report.applied})
    click.echo(
        f"recovered {_many(len(report.applied), 'spooled write')} of {_many(runs_done, 'run')} "
        f"from {spool.directory}"
    )
    if report.complete:
        return
    for run, count in sorted(report.kept.items()):
        error = report.errors.get(run)
        why = str(error) if error is not None else "spooled while recovering"
        click.echo(f"kept {_many(count, 'spooled write')} of run {run} in {spool.file(run)}: {why}")
    raise click.ClickException(_recover_advice(report))


def _recover_document(report: ReplayReport, spool: Spool) -> dict[str, Any]:
    """What ``db recover --json`` prints: each write dealt with, what is left and why."""
    return {
        "spool": str(spool.directory),
        "applied": [
            {
                "run_id": done.op.run_id,
                "op": done.op.op,
                "outcome": done.outcome.value,
                "description": done.op.describe(),
            }
            for done in report.applied
        ],
        "kept": [
            {
                "run_id": run,
                "count": count,
                "file": str(spool.file(run)),
                "error": None if report.errors.get(run) is None else str(report.errors[run]),
            }
            for run, count in sorted(report.kept.items())
        ],
        "complete": report.complete,
    }


def _spooled_run(spooled: list[str], run_id: str) -> list[str]:
    """The spooled run that ``run_id`` names, as an id or a unique prefix (or none)."""
    if run_id in spooled:
        return [run_id]
    found = [run for run in spooled if run.startswith(run_id)]
    if len(found) > 1:
        raise click.ClickException(
            f"{run_id!r} matches several spooled runs: {', '.join(found)}; give more of the id"
        )
    return found


def _recover_advice(report: ReplayReport) -> str:
    """The one-line error of a recovery that left writes in the spool: why, and what to do."""
    from agentsnap.exceptions import NotFoundError, StoreError  # noqa: PLC0415
    from agentsnap.store.spool import SpoolError  # noqa: PLC0415

    left = sum(report.kept.values()) or len(report.errors)
    errors = list(report.errors.values())
    if any(isinstance(error, StoreError) for error in errors):
        advice = (
            "the database is unavailable or refused them; run `agentsnap db recover` again "
            "once it is back"
        )
    elif any(isinstance(error, NotFoundError) for error in errors):
        advice = (
            "their run is not in this database: give the database the run was written to "
            "with --db, then run `agentsnap db recover` again"
        )
    elif any(isinstance(error, SpoolError) for error in errors):
        advice = (
            "a line of the spool is malformed: fix or remove it by hand, then run "
            "`agentsnap db recover` again"
        )
    elif errors:
        advice = "fix the cause above, then run `agentsnap db recover` again"
    else:
        advice = "more were spooled while recovering: run `agentsnap db recover` again"
    return f"{_many(left, 'spooled write')} not recovered, kept in the spool: {advice}"


def _many(count: int, noun: str) -> str:
    """``1 run``, ``2 runs``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


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

    with _Steps("export", 2) as steps:
        steps.next(f"reading run {run_id}")
        _read(db, query)


@main.command()
@click.argument("run_id")
@_DB
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="The file to write: .svg, or .html for a page that zooms, pans and shows details.",
)
def timeline(run_id: str, db: str, output: str) -> None:
    """Draw run RUN_ID as a space-time diagram: agents, messages, cuts and rollbacks."""
    from pathlib import Path  # noqa: PLC0415

    from agentsnap.timeline import FORMATS, load_timeline, render  # noqa: PLC0415

    path = Path(output)
    if path.suffix.lower() not in FORMATS:
        raise click.ClickException(f"cannot write {output}: use a .svg or .html file")
    with _Steps("timeline", 3) as steps:
        steps.next(f"reading run {run_id}")
        found = _read(db, lambda store: load_timeline(store, run_id))
        messages = len(found.messages or [])
        steps.next(f"drawing {messages} messages, {len(found.snapshots)} snapshots")
        text = _guard(lambda: render(found, path.suffix))
        steps.next(f"writing {output}")
        _guard(lambda: path.write_text(text, encoding="utf-8"))
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


class _ToolsGroup(click.Group):
    """``tools [RUN]`` lists the ledger's calls; ``tools list`` says the same, ``tools resolve``
    settles a call.
    """  # noqa: D205

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        asks_help = bool(args) and args[0] in ctx.help_option_names
        if not asks_help and (not args or args[0] not in self.commands):
            args = [_LIST, *args]
        return super().parse_args(ctx, args)

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        path = ctx.command_path
        formatter.write_usage(path, "[RUN] [--status S] [--json] [--wide] [--db URL]")
        formatter.write_usage(path, "resolve KEY (--result JSON | --error TEXT)", prefix="   or: ")


_LIST = "list"
"""The command behind ``agentsnap tools [RUN]``; ``tools list [RUN]`` names it as well."""


@main.group(cls=_ToolsGroup)
def tools() -> None:
    """Side-effecting tool calls in the ledger.

    `agentsnap tools [RUN]` prints the ledger's calls, of run RUN (an id or a unique prefix)
    when given: key, status, tool, attempts, run, agent, updated (`agentsnap tools list
    [RUN]` is the same command). Calls whose outcome is unknown are marked with a leading
    `!`: check the outside system, then settle them with `agentsnap tools resolve`.
    """


_STATUSES = tuple(status.value for status in ToolCallStatus)
"""What ``tools --status`` takes: the values of ``ToolCallStatus``."""


@tools.command(_LIST)
@click.argument("run_id", metavar="[RUN]", required=False)
@_DB
@click.option(
    "--status", type=click.Choice(_STATUSES), default=None, help="Only calls in this status."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def list_tool_calls(run_id: str | None, db: str, status: str | None, as_json: bool) -> None:
    """Print the ledger's calls, of run RUN (an id or a unique prefix) when given.

    Also `agentsnap tools [RUN]`. A call still in progress whose owner stopped (its process
    is gone, or its run was taken over or left without an owner) is shown as unknown, and
    marked with a leading `!` like every call whose outcome is unknown.
    """
    from agentsnap.inspect import ledger_calls_table, resolve_run  # noqa: PLC0415

    async def query(store: SqlStore) -> list[dict[str, Any]]:
        run = None if run_id is None else (await resolve_run(store, run_id)).id
        return await ledger_calls_table(store, run)

    rows = _read(db, query)
    rows = [row for row in rows if status is None or row["status"] == status]
    _print_rows(
        rows,
        as_json,
        {
            "": lambda r: "!" if r["unknown"] else " ",
            "KEY": "key",
            "STATUS": "status",
            "TOOL": "tool",
            "ATTEMPTS": "attempts",
            "RUN": "run",
            "AGENT": "agent",
            "UPDATED": lambda r: _when(r["updated_at"]),
        },
    )
    if as_json:
        return
    unknown = sum(r["unknown"] for r in rows)
    if unknown:
        click.echo(
            console.paint_warning(
                f"! {unknown} call{'s' if unknown > 1 else ''} with an unknown outcome: check "
                "the outside system, then `agentsnap tools resolve KEY --result JSON | --error "
                "TEXT`"
            )
        )


@main.command("model-calls")
@click.argument("run_id")
@_DB
@click.option("--agent", default=None, help="Only this agent's calls.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON: {run_id, timeline, calls, totals}."
)
def model_calls(run_id: str, db: str, agent: str | None, as_json: bool) -> None:
    """Print the model calls of run RUN_ID, in the order they were made, with token totals.

    RUN_ID may be a unique prefix of the id. Each call shows its agent, the message its
    handler was handling, its position among that handler's calls, the timeline it was
    made on, the model, tokens in and out, latency, start, and how many times a re-executed
    handler got its answer replayed. A call marked `~` was made on a timeline a rollback
    discarded: the handler asked again on a later one. With --json, each call is whole,
    request and answer included.
    """
    from agentsnap.inspect import model_calls_table  # noqa: PLC0415

    doc = _read(db, lambda store: model_calls_table(store, run_id, agent))
    if as_json:
        _print_json(doc)
        return
    calls = doc["calls"]
    if not calls:
        who = f" of agent {agent}" if agent else ""
        click.echo(f"run {doc['run_id']} recorded no model calls{who}")
        return
    totals = doc["totals"]
    rows: list[list[object]] = [
        [
            "~" if c["discarded"] else " ",
            c["agent"],
            c["message"],
            c["position"],
            c["timeline"],
            c["model"],
            c["input_tokens"],
            c["output_tokens"],
            _latency(c["latency_ms"]),
            _when(c["started_at"]),
            c["replays"],
        ]
        for c in calls
    ]
    by_agent = totals["agents"] if len(totals["agents"]) > 1 else {}
    footer = [_total_row(name, t) for name, t in by_agent.items()]
    footer.append(_total_row("total", totals))
    _print_table(
        _MODEL_CALL_HEADERS,
        [*rows, *footer],
        kinds={"MESSAGE": console.Kind.TEXT, "MODEL": console.Kind.TEXT},
    )
    discarded = sum(c["discarded"] for c in calls)
    if discarded:
        click.echo(
            f"~ {_many(discarded, 'call')} of a discarded timeline (asked again after a "
            f"rollback); the run's latest timeline is {doc['timeline']}"
        )


_MODEL_CALL_HEADERS = [
    "",  # the mark of a call of a discarded timeline
    "AGENT",
    "MESSAGE",
    "POS",
    "TIMELINE",
    "MODEL",
    "IN",
    "OUT",
    "LATENCY",
    "STARTED",
    "REPLAYS",
]


def _total_row(name: str, totals: dict[str, Any]) -> list[object]:
    """A footer line of ``model-calls``: how many calls, and their tokens in and out."""
    calls = _many(totals["calls"], "call")
    tokens = [totals["input_tokens"], totals["output_tokens"]]
    return [" ", name, calls, "", "", "", *tokens, "", "", ""]


def _latency(ms: float) -> str:
    """``0.4 ms``, ``840 ms``, ``12.5 s``."""
    if ms < 10:
        return f"{ms:.1f} ms"
    return f"{ms:.0f} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


@tools.command("resolve")
@click.argument("key")
@_DB
@click.option("--result", "result", metavar="JSON", help="It happened: what the tool returned.")
@click.option("--error", metavar="TEXT", help="It did not happen: what went wrong.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {key, status, result, error}.")
def resolve_tool_call(
    key: str, db: str, result: str | None, error: str | None, as_json: bool
) -> None:
    """Record the outcome of tool call KEY, whose outcome is unknown.

    Check the outside system first (did the card get charged?). With --result, later calls
    with this key return that JSON without running the tool; with --error, they fail.
    """
    from agentsnap.ledger import resolve  # noqa: PLC0415

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
    if as_json:
        _print_json(
            {
                "key": entry.key,
                "status": entry.status.value,
                "result": entry.result,
                "error": entry.error,
            }
        )
    else:
        click.echo(f"{entry.key}: {entry.status.value}")


# -- requests to people: list, answer --------------------------------------------------------


@main.command("requests")
@click.argument("run_id", required=False)
@_DB
@click.option("--pending", is_flag=True, help="Only the requests that wait for an answer.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: a list of requests, whole.")
def requests_command(run_id: str | None, db: str, pending: bool, as_json: bool) -> None:
    """List the requests to people of run RUN_ID (of every run without it), oldest first.

    RUN_ID may be a unique prefix of the id. A request is a question a handler asked
    (`ctx.ask`) or an approval a side-effecting call waits for. Each row shows its id (what
    `agentsnap answer` takes), status, kind, agent, who may answer, the question, and the
    answer or the reason. A `pending` request waits for an answer; `withdrawn` ones were
    discarded by a rollback (the redone handler asked again, under a new id).
    """
    from agentsnap.inspect import list_requests, resolve_run  # noqa: PLC0415

    async def query(store: SqlStore) -> list[dict[str, Any]]:
        run = None if run_id is None else (await resolve_run(store, run_id)).id
        found = await list_requests(store, run, pending=pending)
        return [request.to_json() for request in found]

    rows = _read(db, query)
    if as_json:
        _print_json(rows)
        return
    if not rows:
        what = "pending requests" if pending else "requests"
        click.echo(f"no {what}" + ("" if run_id is None else f" in run {run_id}"))
        return
    _print_rows(
        rows,
        False,
        {
            "ID": "id",
            "STATUS": "status",
            "KIND": "kind",
            "AGENT": "agent",
            "WHO": lambda r: r["who"] or "-",
            "ASKED": lambda r: _when(r["asked_at"]),
            "QUESTION": lambda r: _brief(r["question"]),
            "ANSWER": _request_outcome,
        },
        kinds={"QUESTION": console.Kind.TEXT, "ANSWER": console.Kind.TEXT},
    )
    waiting = sum(r["status"] == "pending" for r in rows)
    if waiting:
        click.echo(
            f"{_many(waiting, 'request')} pending: `agentsnap answer ID --json VALUE`, "
            "`--approve` or `--deny --reason TEXT`"
        )


def _brief(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _request_outcome(row: dict[str, Any]) -> str:
    status = row["status"]
    if status == "pending":
        return "-"
    if row["kind"] == "approval" and status in {"answered", "rejected", "expired"}:
        approved = isinstance(row["answer"], dict) and row["answer"].get("approved") is True
        verdict = "approved" if approved else "denied"
        return f"{verdict}: {row['reason']}" if row["reason"] else verdict
    if status == "answered" or (status == "expired" and row["answer"] is not None):
        return _brief(row["answer"])
    return str(row["reason"] or status)


@main.command("answer")
@click.argument("request_id")
@_DB
@click.option("--json", "value", metavar="JSON", help="The answer to a question, as JSON.")
@click.option("--approve", is_flag=True, help="Approve a call that waits for approval.")
@click.option(
    "--deny", is_flag=True, help="Deny an approval, or turn a question down (give --reason)."
)
@click.option("--reason", metavar="TEXT", help="Why; a denial's reason reaches the agent.")
@click.option("--by", metavar="NAME", help="Who answers, recorded with the answer.")
def answer_command(  # noqa: PLR0917
    request_id: str,
    db: str,
    value: str | None,
    approve: bool,
    deny: bool,
    reason: str | None,
    by: str | None,
) -> None:
    """Answer request REQUEST_ID, from any process, while its run runs or not.

    A question takes --json VALUE, checked against the request's schema; an approval takes
    --approve or --deny (with --reason, which the agent gets). The answer is stored: a
    handler waiting on it gets it within a couple of seconds, and a run whose program is
    down gets it when it is resumed. A request that is no longer pending (answered,
    expired, or withdrawn by a rollback) cannot be answered.
    """
    from agentsnap.inspect import answer  # noqa: PLC0415

    if sum((value is not None, approve, deny)) != 1:
        raise click.UsageError("give one of --json VALUE, --approve, --deny")
    answer_value: Any = None
    if value is not None:
        try:
            answer_value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--json") from exc
    decision = True if approve else (False if deny else None)
    done = _read(
        db,
        lambda store: answer(
            store, request_id, answer_value, approve=decision, reason=reason, by=by
        ),
    )
    click.echo(f"{done.id}: {done.status} ({_request_outcome(done.to_json())})")


_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")

_APP = click.option(
    "--app",
    "app_spec",
    default=None,
    metavar="MODULE:FACTORY",
    help="Read the states as this app's state classes read them now, through their "
    "upcasters: a factory returning an agentsnap.distributed.App or a list of agents (the "
    "current directory is importable).",
)


def _state_models(app_spec: str | None) -> dict[str, type[BaseModel]] | None:
    """The state classes of the app ``--app`` names, by agent name (``None`` without one)."""
    if app_spec is None:
        return None
    from agentsnap.distributed.app import load_app  # noqa: PLC0415
    from agentsnap.exceptions import ConfigurationError  # noqa: PLC0415

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return load_app(app_spec).state_models()
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--app") from exc


# -- runs: list, delete, prune ---------------------------------------------------------------

_RUN_STATUSES = tuple(status.value for status in RunStatus)
"""What ``runs --status`` takes: the values of ``RunStatus``."""

_RUNS_DB_KEY = "agentsnap.runs.db"
"""Where ``runs --db URL`` is kept for ``runs delete`` and ``runs prune`` (``ctx.meta``)."""

_DURATION = re.compile(r"(\d+)\s*(s|m|h|d|w)")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def _duration(text: str) -> timedelta | None:
    """``7d``, ``12h``, ``30m``, ``45s``, ``2w`` as a timedelta; ``None`` for other text."""
    found = _DURATION.fullmatch(text.strip().lower())
    if found is None:
        return None
    try:
        span = timedelta(**{_UNITS[found[2]]: int(found[1])})
    except OverflowError:
        return None
    # A span that reaches back before the year 1 names no time.
    return span if span < datetime.now(UTC) - datetime.min.replace(tzinfo=UTC) else None


def _duration_option(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> timedelta | None:
    """``--older-than``: a span of time, ``7d``, ``12h``, ``30m``, ``45s`` or ``2w``."""
    if value is None:
        return None
    found = _duration(value)
    if found is None:
        raise click.BadParameter(
            f"{value!r} is not a duration: give a number and a unit, like 7d, 12h, 30m, 45s or 2w",
            ctx,
            param,
        )
    return found


def _since_option(ctx: click.Context, param: click.Parameter, value: str | None) -> datetime | None:
    """``--since``: a span back from now (``7d``), or an ISO 8601 date or date and time.

    A date or time without an offset is local time (UTC with ``--utc``), as times are shown.
    """
    if value is None:
        return None
    span = _duration(value)
    if span is not None:
        return datetime.now(UTC) - span
    try:
        moment = datetime.fromisoformat(value.strip())
        if moment.tzinfo is None:
            utc = bool(ctx.meta.get(_UTC_KEY))
            moment = moment.replace(tzinfo=UTC) if utc else moment.astimezone()
        moment.astimezone(UTC)  # the store compares in UTC: one before the year 1 is no time
    except (ValueError, OverflowError):
        raise click.BadParameter(
            f"{value!r} is not a time: give a span back from now (7d, 12h, 30m) or an ISO "
            "date or date and time (2026-11-24, 2026-11-24T09:30, 2026-11-24T09:30+01:00)",
            ctx,
            param,
        ) from None
    return moment


def _tags_option(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> dict[str, str]:
    """``--tag KEY=VALUE``, repeated: the tags every run listed must carry."""
    tags = {}
    for given in value:
        key, equals, text = given.partition("=")
        if not equals or not key:
            raise click.BadParameter(
                f"{given!r} is not KEY=VALUE: give a tag like team=billing", ctx, param
            )
        tags[key] = text
    return tags


def _run_filters(command: Callable[..., None]) -> Callable[..., None]:
    """``--status``, ``--name`` and ``--tag``: which runs a command looks at."""
    for option in reversed(
        [
            click.option(
                "--status",
                "statuses",
                type=click.Choice(_RUN_STATUSES),
                multiple=True,
                help="Only runs in this status (repeat for several).",
            ),
            click.option(
                "--name", default=None, help="Only runs of this name; * stands for any text."
            ),
            click.option(
                "--tag",
                "tags",
                metavar="KEY=VALUE",
                multiple=True,
                callback=_tags_option,
                help="Only runs with this tag, KEY=VALUE (repeat: every one must match).",
            ),
        ]
    ):
        command = option(command)
    return command


_LISTING = {
    "statuses": "--status",
    "name": "--name",
    "tags": "--tag",
    "since": "--since",
    "limit": "--limit",
    "tracebacks": "--traceback",
    "as_json": "--json",
}
"""The ``runs`` options that only listing takes, by parameter."""


@main.group(invoke_without_command=True)
@_DB
@_run_filters
@click.option(
    "--since",
    metavar="WHEN",
    default=None,
    callback=_since_option,
    help="Only runs created since: 7d, 12h, 30m back from now, or an ISO date or time.",
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the newest N.")
@click.option(
    "--traceback",
    "tracebacks",
    is_flag=True,
    help="After the table, print the tracebacks each failed run recorded.",
)
@_JSON
@click.pass_context
def runs(
    ctx: click.Context,
    *,
    db: str,
    statuses: tuple[str, ...],
    name: str | None,
    tags: dict[str, str],
    since: datetime | None,
    limit: int | None,
    tracebacks: bool,
    as_json: bool,
) -> None:
    """List runs, oldest first: id, name, status, tags, created, snapshots, parent.

    Why a run ended so, when it is known, is on a line of its own under the run's row
    (`why: <reason>`; `status_reason` with `--json`), with where a failed run's error was
    raised; `--traceback` prints each failed run's tracebacks (handler failures and the
    error that ended it, exception chains included) after the table (`traceback` with
    `--json`). The filters combine: `--status failed
    --status cancelled --tag team=billing --since 7d` lists the failed or cancelled runs of
    the last seven days tagged team=billing; `--limit N` keeps the newest N of them.

    `agentsnap runs delete` and `agentsnap runs prune` remove runs and everything they hold.
    """
    if ctx.invoked_subcommand is not None:
        given = [
            flag
            for param, flag in _LISTING.items()
            if ctx.get_parameter_source(param) is ParameterSource.COMMANDLINE
        ]
        if given:
            options = ", ".join(given)
            raise click.UsageError(
                f"{options} list runs: give `{ctx.invoked_subcommand}` its own options after "
                "its name"
            )
        if ctx.get_parameter_source("db") is ParameterSource.COMMANDLINE:
            ctx.meta[_RUNS_DB_KEY] = db
        return
    from agentsnap.inspect import runs_table  # noqa: PLC0415

    rows = _read(
        db,
        lambda store: runs_table(
            store,
            status=statuses or None,
            name=name,
            tags=tags,
            since=since,
            limit=limit,
        ),
    )
    _print_rows(
        rows,
        as_json,
        {
            "ID": "id",
            "NAME": "name",
            "STATUS": "status",
            "TAGS": lambda r: ",".join(f"{k}={v}" for k, v in sorted(r["tags"].items())) or None,
            "CREATED": lambda r: _when(r["created_at"]),
            "SNAPSHOTS": "snapshots",
            "PARENT": "parent_run_id",
        },
        # Under its row, whole: a reason is often longer than the rest of the row.
        notes=lambda r: (
            f"why: {' '.join(r['status_reason'].split())}{_raised_at(r['traceback'])}"
            if r["status_reason"]
            else None
        ),
    )
    if tracebacks and not as_json:
        for row in rows:
            if row["traceback"]:
                click.echo(f"\n--- run {row['id']} ({row['status']}) ---")
                click.echo(row["traceback"].rstrip())


def _raised_at(traceback: str | None) -> str:
    """`` (at FILE:LINE in FUNCTION)``: where a failed run's first failure began (the
    innermost frame of the first exception of its chain, which a traceback prints first).
    """  # noqa: D205
    if not traceback:
        return ""
    first = re.split(r"\n(?:The above exception|During handling)", traceback, maxsplit=1)[0]
    frames = re.findall(r'^\s*File "([^"]+)", line (\d+), in (.+)$', first, re.MULTILINE)
    if not frames:
        return ""
    path, line, function = frames[-1]
    return f" (at {os.path.basename(path)}:{line} in {function.strip()})"


def _runs_db(ctx: click.Context, db: str) -> str:
    """The database of ``runs delete`` or ``runs prune``: its own ``--db``, else that of
    ``runs`` (``agentsnap runs --db URL delete RUN``), else the environment or default.
    """  # noqa: D205
    if ctx.get_parameter_source("db") is ParameterSource.COMMANDLINE:
        return db
    return str(ctx.meta.get(_RUNS_DB_KEY, db))


def _removal_options(command: Callable[..., None]) -> Callable[..., None]:
    """``--yes``, ``--dry-run``, ``--vacuum`` and ``--json`` of ``runs delete`` and ``prune``."""
    for option in reversed(
        [
            click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation."),
            click.option(
                "--dry-run", is_flag=True, help="Show what would be deleted; delete nothing."
            ),
            click.option(
                "--vacuum",
                is_flag=True,
                help="Then give the space back: VACUUM the SQLite file (it shrinks), or "
                "VACUUM ANALYZE on PostgreSQL.",
            ),
            click.option("--json", "as_json", is_flag=True, help="Print what was deleted as JSON."),
            click.option(
                "--nats",
                "nats_url",
                metavar="URL",
                default=None,
                help="Also delete the runs' NATS JetStream streams (runs spread over "
                "processes) on this server; it must answer before anything is deleted.",
            ),
        ]
    ):
        command = option(command)
    return command


async def _run_streams(nats_url: str, run_ids: list[str], *, delete: bool) -> list[str]:
    """The runs' JetStream streams on the server at ``nats_url`` (deleted, with ``delete``)."""
    from agentsnap.jetstream import JetStreamLink  # noqa: PLC0415
    from agentsnap.jetstream.codec import stream_name  # noqa: PLC0415

    link = await JetStreamLink.connect(nats_url)
    try:
        found: list[str] = []
        for run_id in run_ids:
            there = await link.delete_stream(run_id) if delete else await link.has_stream(run_id)
            if there:
                found.append(stream_name(run_id))
        return found
    finally:
        await link.close()


def _streams_of(nats_url: str | None, run_ids: list[str]) -> list[str] | None:
    """The runs' streams (``None`` without ``--nats``): also a check that NATS answers."""
    if nats_url is None:
        return None
    return _guard(lambda: asyncio.run(_run_streams(nats_url, run_ids, delete=False)))


def _delete_streams(nats_url: str | None, run_ids: list[str]) -> list[str] | None:
    """Delete the deleted runs' streams (``None`` without ``--nats``)."""
    if nats_url is None or not run_ids:
        return None if nats_url is None else []
    try:
        return asyncio.run(_run_streams(nats_url, run_ids, delete=True))
    except Exception as exc:
        from agentsnap.jetstream.codec import stream_name  # noqa: PLC0415

        names = ", ".join(stream_name(run_id) for run_id in run_ids)
        raise click.ClickException(
            f"deleted {_many(len(run_ids), 'run')} from the database, but not their NATS "
            f"streams ({type(exc).__name__}: {exc}): delete them once the server answers "
            f"(nats stream rm NAME): {names}"
        ) from exc


@runs.command("delete", short_help="Delete runs and everything they hold.")
@click.argument("run_ids", metavar="RUN...", nargs=-1, required=True)
@_DB
@click.option(
    "--force",
    is_flag=True,
    help="Delete even a run that a live runtime owns, or whose LangGraph checkpoints a fork needs.",
)
@_removal_options
@click.pass_context
def delete_runs_command(
    ctx: click.Context,
    *,
    run_ids: tuple[str, ...],
    db: str,
    force: bool,
    yes: bool,
    dry_run: bool,
    vacuum: bool,
    as_json: bool,
    nats_url: str | None,
) -> None:
    """Delete runs and everything they hold; RUN is an id or a unique prefix of one.

    Their snapshots, journal, replay log, rollbacks, lease, tags, tool calls in the ledger,
    LangGraph checkpoints, and the agent states no other run holds: nothing of them is left.
    Runs forked from them keep working. It asks first, showing what goes (unless --yes);
    --dry-run only shows it. A run that a live runtime owns is refused (--force deletes it
    even so). With --nats, the NATS JetStream streams of runs spread over processes go too.
    """
    from agentsnap.inspect import resolve_run  # noqa: PLC0415
    from agentsnap.store.retention import delete_runs  # noqa: PLC0415

    db = _runs_db(ctx, db)

    async def resolve(store: SqlStore) -> list[RunInfo]:
        found = [await resolve_run(store, prefix) for prefix in run_ids]
        return list({run.id: run for run in found}.values())

    chosen = _read(db, resolve)
    ids = [run.id for run in chosen]
    plan = _refusing(lambda: _read(db, lambda s: delete_runs(s, ids, force=force, dry_run=True)))
    streams = _streams_of(nats_url, plan.run_ids)
    if dry_run:
        _print_removal(plan, chosen, as_json, streams)
        return
    if not yes:
        _confirm(plan, chosen)
    report = _refusing(lambda: _read(db, lambda s: delete_runs(s, ids, force=force, vacuum=vacuum)))
    _print_removal(report, chosen, as_json, _delete_streams(nats_url, report.run_ids))


@runs.command("prune", short_help="Delete old runs by a policy: --keep N, --older-than D.")
@_DB
@click.option(
    "--keep",
    type=click.IntRange(min=0),
    default=None,
    help="Keep the newest N of the runs the filters select.",
)
@click.option(
    "--older-than",
    metavar="DURATION",
    default=None,
    callback=_duration_option,
    help="Delete only runs created longer ago than this: 7d, 12h, 30m, 2w.",
)
@_run_filters
@_removal_options
@click.pass_context
def prune_runs_command(
    ctx: click.Context,
    *,
    db: str,
    keep: int | None,
    older_than: timedelta | None,
    statuses: tuple[str, ...],
    name: str | None,
    tags: dict[str, str],
    yes: bool,
    dry_run: bool,
    vacuum: bool,
    as_json: bool,
    nats_url: str | None,
) -> None:
    """Delete old runs: all but the newest N (--keep), or those older than a time, or both.

    Given both, a run goes when it is outside the newest N and older than the time. --status,
    --name and --tag narrow the runs looked at (`prune --keep 10 --status failed` keeps the
    ten newest failed runs, and deletes the other failed ones). Runs that a live runtime owns
    are never deleted. It asks first, showing what goes (unless --yes); --dry-run only shows
    it. With --nats, the NATS JetStream streams of runs spread over processes go too.
    """
    from dataclasses import replace  # noqa: PLC0415

    from agentsnap.store.retention import delete_runs, prune_runs  # noqa: PLC0415

    if keep is None and older_than is None:
        raise click.UsageError("give --keep N, --older-than DURATION (7d, 12h…), or both")
    db = _runs_db(ctx, db)
    plan = _read(
        db,
        lambda store: prune_runs(
            store,
            keep=keep,
            older_than=older_than,
            status=statuses or None,
            name=name,
            tags=tags,
            dry_run=True,
        ),
    )
    chosen = _read(db, lambda store: _runs_of(store, [*plan.run_ids, *plan.skipped]))
    streams = _streams_of(nats_url, plan.run_ids)
    if dry_run or not plan.run_ids:
        _print_removal(plan, chosen, as_json, streams)
        return
    if not yes:
        _confirm(plan, chosen)
    report = _read(
        db, lambda store: delete_runs(store, plan.run_ids, skip_refused=True, vacuum=vacuum)
    )
    _print_removal(
        replace(report, skipped={**plan.skipped, **report.skipped}),
        chosen,
        as_json,
        _delete_streams(nats_url, report.run_ids),
    )


def _refusing(action: Callable[[], T]) -> T:
    """``action()``, a refused delete's error saying what to do on the command line."""
    from agentsnap.store.retention import DeleteRefused  # noqa: PLC0415

    try:
        return action()
    except click.ClickException as exc:
        refused = exc.__cause__
        if not isinstance(refused, DeleteRefused):
            raise
        reasons = "; ".join(f"run {run_id} {why}" for run_id, why in refused.refused.items())
        raise click.ClickException(
            f"refused to delete {_many(len(refused.refused), 'run')}, so nothing was deleted: "
            f"{reasons}; or pass --force to delete even so"
        ) from refused


async def _runs_of(store: SqlStore, run_ids: list[str]) -> list[RunInfo]:
    """The runs of these ids, in this order (those not found left out)."""
    wanted = set(run_ids)
    found = {run.id: run for run in await store.list_runs() if run.id in wanted}
    return [found[run_id] for run_id in run_ids if run_id in found]


def _confirm(plan: DeleteReport, runs: list[RunInfo]) -> None:
    """Show what a delete removes, on standard error, and ask; raise unless confirmed."""
    going = [run for run in runs if run.id in set(plan.run_ids)]
    for run in going:
        click.echo(f"  {_run_line(run)}", err=True)
    for run_id, why in plan.skipped.items():
        click.echo(f"  kept {run_id}: {why}", err=True)
    snapshots = plan.rows.get("agentsnap_snapshots", 0)
    question = (
        f"Delete {_many(len(plan.run_ids), 'run')} ({_many(snapshots, 'snapshot')}, "
        f"{_many(plan.total_rows, 'row')} in all)? This cannot be undone"
    )
    try:
        confirmed = click.confirm(question, default=False, err=True)
    except click.Abort:  # end of input
        confirmed = False
        click.echo(err=True)
    else:
        if not sys.stdin.isatty():  # the answer read was not echoed: end the prompt's line
            click.echo(err=True)
    if not confirmed:
        raise click.ClickException("nothing deleted: not confirmed (--yes deletes without asking)")


def _run_line(run: RunInfo) -> str:
    name = run.name if run.name is not None else "-"
    return f"{run.id}  {name}  {run.status.value}  created {_when(run.created_at.isoformat())}"


def _print_removal(
    report: DeleteReport, runs: list[RunInfo], as_json: bool, streams: list[str] | None = None
) -> None:
    """What a delete or prune removed (or, dry, would remove); ``streams``: with ``--nats``."""
    if as_json:
        document: dict[str, Any] = {
            "dry_run": report.dry_run,
            "run_ids": report.run_ids,
            "rows": report.rows,
            "total_rows": report.total_rows,
            "skipped": report.skipped,
            "reclaimed_bytes": report.reclaimed_bytes,
        }
        if streams is not None:
            document["streams"] = streams
        _print_json(document)
        return
    known = {run.id: run for run in runs}
    for run_id, why in report.skipped.items():
        click.echo(console.paint_warning(f"kept {run_id}: {why}"))
    if not report.run_ids:
        click.echo("nothing to delete")
        return
    verb = "would delete" if report.dry_run else "deleted"
    click.echo(f"{verb} {_many(len(report.run_ids), 'run')}:")
    for run_id in report.run_ids:
        click.echo(f"  {_run_line(known[run_id]) if run_id in known else run_id}")
    rows = "rows that would go" if report.dry_run else "rows removed"
    click.echo(f"{rows}: {report.total_rows}")
    counted = {table: count for table, count in report.rows.items() if count}
    width = max(map(len, counted), default=0)
    for table, count in counted.items():
        click.echo(f"  {table.ljust(width)}  {count}")
    if report.reclaimed_bytes is not None:
        click.echo(f"the database file shrank by {_many(report.reclaimed_bytes, 'byte')}")
    if streams is not None:
        verb = "would delete" if report.dry_run else "deleted"
        click.echo(f"{verb} {_many(len(streams), 'NATS stream')}: {', '.join(streams) or '-'}")


@main.command()
@click.argument("run_id")
@_DB
@_JSON
def snapshots(run_id: str, db: str, as_json: bool) -> None:
    """List the snapshots of run RUN_ID (or a unique prefix of it).

    Why a snapshot failed is on a line of its own below the table, and so is what is wrong
    with a snapshot damaged in the database (rows deleted or changed by hand).
    """
    from agentsnap.inspect import snapshots_table  # noqa: PLC0415

    rows = _read(db, lambda store: snapshots_table(store, run_id))
    _print_rows(
        rows,
        as_json,
        {
            "SEQ": "seq",
            "ID": "id",
            "STATUS": "status",
            "INITIATOR": "initiator",
            "STARTED": lambda r: _when(r["started_at"]),
            "AGENTS": lambda r: ",".join(r["agents"]),
            "IN-FLIGHT": "in_flight",
        },
    )
    if not as_json:
        for row in rows:
            if row["status"] == "damaged":
                click.echo(
                    console.paint_warning(f"! snapshot {row['seq']} is damaged: {row['error']}")
                )
            elif row["status"] == "failed" and row["error"]:
                click.echo(console.paint_warning(f"! snapshot {row['seq']} failed: {row['error']}"))


@main.command()
@click.argument("snapshot_id")
@_DB
@click.option("--agent", default=None, help="Only this agent and its channels.")
@_APP
@_JSON
def show(snapshot_id: str, db: str, agent: str | None, app_spec: str | None, as_json: bool) -> None:
    """Print snapshot SNAPSHOT_ID: each agent's state and counters, messages in flight.

    A snapshot damaged in the database is printed as damaged, with what is wrong and what
    could still be read; a failed snapshot with why it failed. When the snapshot's run
    ended for a reason, the reason is printed, and a failed run's tracebacks.

    Each state is printed as stored, with the version of its class it
    was stored with; with --app, as the app's state classes read it now.
    """
    from agentsnap.inspect import show_snapshot  # noqa: PLC0415

    models = _state_models(app_spec)
    doc = _read(db, lambda store: show_snapshot(store, snapshot_id, agent, models=models))
    if as_json:
        _print_json(doc)
        return
    click.echo(
        f"snapshot {doc['id']}  run {doc['run_id']}  seq {doc['seq']}  {doc['status']}  "
        f"by {doc['initiator']}  started {_when(doc['started_at'])}"
    )
    if doc["status"] == "damaged":
        click.echo(f"damaged: {doc['error']}")
        if doc["damaged_agents"]:
            click.echo(f"missing or unreadable: {', '.join(doc['damaged_agents'])}")
    elif doc["error"]:
        click.echo(f"error: {doc['error']}")
    run = doc["run"]
    if run["status_reason"]:
        click.echo(f"run {run['status']}: {run['status_reason']}")
    if run["traceback"]:
        click.echo(run["traceback"].rstrip())
    for name, cut in doc["agents"].items():
        # A state's version is shown once its class declares one (1 is the default).
        version = f", version {cut['state_version']}" if cut["state_version"] != 1 else ""
        if cut.get("read_as", cut["state_version"]) != cut["state_version"]:
            version = f", version {cut['state_version']}, read as version {cut['read_as']}"
        click.echo(f"agent {name}  (state {cut['state_hash'][:12]}{version})")
        if "unreadable" in cut:
            click.echo(console.paint_warning(f"  ! {cut['unreadable']}"))
        click.echo(f"  sent: {_counters(cut['sent'])}")
        click.echo(f"  received: {_counters(cut['received'])}")
        for key, value in cut["state"].items():
            click.echo(f"  {key}: {_value(value)}")
        _show_model_calls(cut["model_calls"], doc["previous"])
    messages = [(c["src"], c["dst"], m) for c in doc["channels"] for m in c["messages"]]
    click.echo(f"in flight: {len(messages)}")
    for src, dst, m in messages:
        click.echo(f"  {src} -> {dst} #{m['seq']} {m['kind']}: {_value(m['payload'])}")


@main.group()
def states() -> None:
    """Stored agent states, as the current code reads them."""


@states.command("check")
@click.argument("run_id", required=False)
@_DB
@click.option(
    "--app",
    "app_spec",
    required=True,
    metavar="MODULE:FACTORY",
    help="The code to check against: a factory returning an agentsnap.distributed.App or a "
    "list of agents (the current directory is importable).",
)
@_JSON
def check(run_id: str | None, db: str, app_spec: str, as_json: bool) -> None:
    """Report which stored states of RUN (or of every run) the app's state classes can read.

    Every agent's state in every complete snapshot is read as a resume, rollback or fork
    would read it: through the upcasters of its state class, from the version it was
    stored with to the version the class is at now. One row per run, agent and stored
    version. The exit status is 1 when some state cannot be read, 0 otherwise.
    """
    from agentsnap.inspect import check_stored_states  # noqa: PLC0415

    models = _state_models(app_spec)
    assert models is not None
    rows = _read(db, lambda store: check_stored_states(store, models, run_id))
    bad = [row for row in rows if row["unreadable"]]
    _print_rows(
        rows,
        as_json,
        {
            "RUN": "run_id",
            "AGENT": "agent",
            "STORED": "stored_version",
            "NOW": lambda r: "-" if r["current_version"] is None else r["current_version"],
            "SNAPSHOTS": lambda r: _seqs(r["snapshots"]),
            "READABLE": "readable",
            "UNREADABLE": "unreadable",
        },
        notes=lambda r: None if r["error"] is None else f"! {r['error']}",
    )
    if not as_json:
        if not rows:
            click.echo("no stored states")
        elif not bad:
            click.echo("every stored state is readable")
        else:
            click.echo(f"{len(bad)} of {len(rows)} rows hold states the code cannot read")
    if bad:
        raise click.exceptions.Exit(1)


def _seqs(seqs: list[int]) -> str:
    """Snapshot numbers in short: ``1-4,7``."""
    parts: list[str] = []
    start = previous = None
    for seq in [*sorted(seqs), None]:
        if seq is not None and previous is not None and seq == previous + 1:
            previous = seq
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = seq
    return ",".join(parts)


def _show_model_calls(calls: list[dict[str, Any]], previous: dict[str, Any] | None) -> None:
    """An agent's model calls since the previous cut, one line each, under a count."""
    if not calls:
        return
    since = "the run began" if previous is None else f"snapshot {previous['seq']}"
    tokens_in = sum(c["input_tokens"] for c in calls)
    tokens_out = sum(c["output_tokens"] for c in calls)
    click.echo(
        f"  model calls since {since}: {len(calls)} ({tokens_in} tokens in, {tokens_out} out)"
    )
    for c in calls:
        mark = "~" if c["discarded"] else " "
        answer = c["answer"] if len(c["answer"]) <= 60 else c["answer"][:57] + "..."
        click.echo(
            f"   {mark}{c['message']} #{c['position']} timeline {c['timeline']}  "
            f"{c['model'] or '-'}  {c['input_tokens']}/{c['output_tokens']} tokens  "
            f"{_latency(c['latency_ms'])}: {answer}"
        )


@main.command()
@click.argument("snapshot_a")
@click.argument("snapshot_b")
@_DB
@click.option("--agent", default=None, help="Only this agent.")
@_APP
@_JSON
def diff(  # noqa: PLR0917
    snapshot_a: str,
    snapshot_b: str,
    db: str,
    agent: str | None,
    app_spec: str | None,
    as_json: bool,
) -> None:
    """Show how each agent's state changed from SNAPSHOT_A to SNAPSHOT_B.

    The snapshots may be of two runs (a fork and the run it came from, say): the first line
    then names the run of each. With --app, states stored with an older version of their
    class are compared as the app's state classes read them now.
    """
    from agentsnap.inspect import diff_snapshots  # noqa: PLC0415

    models = _state_models(app_spec)
    doc = _read(
        db, lambda store: diff_snapshots(store, snapshot_a, snapshot_b, agent, models=models)
    )
    if as_json:
        _print_json(doc)
        return
    if doc["a_run_id"] == doc["b_run_id"]:
        header = f"diff {doc['a']} -> {doc['b']}"
    else:  # snapshots of two runs (a fork and its parent, say): name both runs
        header = f"diff {doc['a']} (run {doc['a_run_id']}) -> {doc['b']} (run {doc['b_run_id']})"
    click.echo(console.paint_header(header))
    for side in ("a", "b"):
        if doc[f"{side}_damaged"]:
            damaged = f"! snapshot {doc[side]} is damaged: {doc[f'{side}_damaged']}"
            click.echo(console.paint_warning(damaged))
    for entry in doc["agents"]:
        click.echo(console.paint_header(f"agent {entry['agent']}: {entry['change']}"))
        for line in _diff_lines(entry):
            click.echo(console.paint_diff_line(f"  {line}"))


@main.command()
@click.argument("run_id")
@_DB
@click.option("--agent", required=True, help="The agent to follow.")
@_JSON
def history(run_id: str, db: str, agent: str, as_json: bool) -> None:
    """Show one agent's state across the snapshots of RUN_ID, and what changed each time.

    Snapshots damaged in the database are marked, with what is wrong.
    """
    from agentsnap.inspect import agent_history_table  # noqa: PLC0415

    rows = _read(db, lambda store: agent_history_table(store, run_id, agent))
    if as_json:
        _print_json(rows)
        return
    for row in rows:
        state = "-" if row["state_hash"] is None else row["state_hash"][:12]
        click.echo(
            console.paint_header(
                f"snapshot {row['seq']}  {row['snapshot_id']}  {_when(row['completed_at'])}  "
                f"state {state}"
            )
        )
        if row["damaged"]:
            click.echo(console.paint_warning(f"  ! damaged: {row['damaged']}"))
        if row["state"] is None:
            continue
        if row["changes"] is None:
            for key, value in row["state"].items():
                click.echo(f"  {key}: {_value(value)}")
        else:
            lines = _diff_lines(row["changes"])
            for line in lines or ["(unchanged)"]:
                click.echo(console.paint_diff_line(f"  {line}"))


@main.command()
@click.argument("run_id")
@_DB
@_JSON
def rollbacks(run_id: str, db: str, as_json: bool) -> None:
    """List the rollbacks of run RUN_ID: when, to which snapshot, whose output, why."""
    from agentsnap.inspect import rollbacks_table  # noqa: PLC0415

    _print_rows(
        _read(db, lambda store: rollbacks_table(store, run_id)),
        as_json,
        {
            "AT": lambda r: _when(r["at"]),
            "SNAPSHOT": "snapshot_id",
            "AGENT": "agent",
            "SOURCE": "source",
            "ATTEMPT": "attempt",
            "DISCARDED": "discarded",
            "REASON": "reason",
        },
    )


@main.command()
@click.argument("run_id")
@_DB
@click.option("--agent", default=None, help="Only this graph agent.")
@_JSON
def checkpoints(run_id: str, db: str, agent: str | None, as_json: bool) -> None:
    """List the LangGraph checkpoints of RUN_ID's graph agents, oldest first.

    SNAPSHOTS are the run's snapshots that hold each checkpoint. Checkpoints are found when
    the graph agents' checkpointer is an AgentsnapSaver on this database.
    """
    from agentsnap.inspect import graph_checkpoints_table  # noqa: PLC0415

    _print_rows(
        _read(db, lambda store: graph_checkpoints_table(store, run_id, agent)),
        as_json,
        {
            "AGENT": "agent",
            "THREAD": lambda r: _thread(r["thread_id"]),
            "CHECKPOINT": lambda r: _short(r["checkpoint_id"]),
            "PARENT": lambda r: _short(r["parent_id"]),
            "STEP": "step",
            "SOURCE": "source",
            "CREATED": lambda r: _when(r["created_at"]),
            "SNAPSHOTS": lambda r: ",".join(map(str, r["snapshots"])) or None,
        },
    )


def _thread(thread_id: str) -> str:
    """A graph agent's thread as its number: 1 for ``RUN:AGENT``, N for ``RUN:AGENT:N``."""
    _, _, rest = thread_id.partition(":")
    _, _, number = rest.partition(":")
    return number or "1"


def _short(checkpoint_id: str | None) -> str | None:
    """A LangGraph checkpoint id cut to what tells checkpoints apart (the time part)."""
    return None if checkpoint_id is None else checkpoint_id[:18]


def _json_file(path: str, param_hint: str, what: str) -> Any:
    """The JSON in file ``path`` (``-``: standard input), or a usage error naming ``what``."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as file:
                text = file.read()
    except OSError as exc:
        raise click.BadParameter(
            f"cannot read {path}: {exc.strerror or exc}", param_hint=param_hint
        ) from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(
            f"{path} does not hold JSON ({exc}); give {what} as JSON", param_hint=param_hint
        ) from exc


def _edits(edits: tuple[str, ...]) -> dict[str, Any]:
    """``AGENT=FILE`` options as ``{agent: the JSON in FILE}`` (``-``: standard input)."""
    states: dict[str, Any] = {}
    for edit in edits:
        agent, sep, path = edit.partition("=")
        if not sep or not agent or not path:
            raise click.BadParameter(
                f"{edit!r} is not AGENT=FILE (a state as JSON in FILE, - for standard input)",
                param_hint="--edit",
            )
        if agent in states:
            raise click.BadParameter(f"agent {agent!r} is edited twice", param_hint="--edit")
        states[agent] = _json_file(path, "--edit", "the agent's state as a JSON object")
    return states


def _message_edits(
    drops: tuple[str, ...], edits: tuple[str, ...], adds: tuple[str, ...]
) -> MessageEdits | None:
    """The ``--drop-message``, ``--edit-message`` and ``--add-message`` options, checked."""
    from agentsnap.fork import MessageEdits, NewMessage  # noqa: PLC0415

    edited: dict[str, Any] = {}
    for edit in edits:
        message_id, sep, path = edit.rpartition("=")
        if not sep or not message_id or not path:
            raise click.BadParameter(
                f"{edit!r} is not ID=FILE (a message's id, src>dst#seq, and its new payload "
                "as JSON in FILE, - for standard input)",
                param_hint="--edit-message",
            )
        if message_id in edited:
            raise click.BadParameter(
                f"message {message_id!r} is edited twice", param_hint="--edit-message"
            )
        edited[message_id] = _json_file(path, "--edit-message", "the message's payload")
    added = []
    for add in adds:
        channel, sep, path = add.rpartition("=")
        src, arrow, dst = channel.partition(">")
        if not sep or not path or not arrow or not src or not dst:
            raise click.BadParameter(
                f"{add!r} is not SRC>DST=FILE (the sender, the receiver, and the payload as "
                "JSON in FILE; quote it in a shell)",
                param_hint="--add-message",
            )
        added.append(
            NewMessage(src=src, dst=dst, payload=_json_file(path, "--add-message", "the payload"))
        )
    edits_made = MessageEdits(drop=list(drops), edit=edited, add=added)
    return edits_made or None


@main.command()
@click.argument("target", metavar="RUN")
@click.option(
    "--snapshot",
    "snapshot_id",
    default=None,
    help="The snapshot of RUN to start from (an id or a unique prefix).",
)
@click.option(
    "--edit",
    "edits",
    multiple=True,
    metavar="AGENT=FILE",
    help="Give AGENT the state in FILE (a JSON object; - for standard input). Repeatable.",
)
@click.option(
    "--drop-message",
    "drop_messages",
    multiple=True,
    metavar="ID",
    help="Leave out the message in flight with this id (src>dst#seq). Repeatable.",
)
@click.option(
    "--edit-message",
    "edit_messages",
    multiple=True,
    metavar="ID=FILE",
    help="Give the message in flight ID the payload in FILE (JSON; - for standard input). "
    "Repeatable.",
)
@click.option(
    "--add-message",
    "add_messages",
    multiple=True,
    metavar="SRC>DST=FILE",
    help="Put a message from SRC to DST in flight, after those on its channel, with the "
    "payload in FILE (JSON). Repeatable; quote it in a shell.",
)
@click.option(
    "--tools",
    type=click.Choice(["dry", "live"]),
    default="dry",
    show_default=True,
    help="dry: a what-if fork, whose side-effecting calls are recorded as dry and return "
    "the tools' stand-ins, and nothing reaches the world; live: they run for real.",
)
@click.option("--name", default=None, help="The new run's name.")
@_DB
@click.option(
    "--app",
    "app_spec",
    default=None,
    metavar="MODULE:FACTORY",
    help="Validate the --edit states against this app's state classes, as they are now "
    "(else against the schemas stored with RUN); the current directory is importable.",
)
@_JSON
def fork(  # noqa: PLR0917
    target: str,
    snapshot_id: str | None,
    edits: tuple[str, ...],
    drop_messages: tuple[str, ...],
    edit_messages: tuple[str, ...],
    add_messages: tuple[str, ...],
    tools: Literal["dry", "live"],
    name: str | None,
    db: str,
    app_spec: str | None,
    as_json: bool,
) -> None:
    """Add a run that starts from snapshot --snapshot of RUN, and print its id.

    The new run records its parent run and snapshot and gets a copy of the snapshot as its
    snapshot 1, with the states given by --edit in place of the recorded ones (each checked
    against the agent's state schema stored with the run, or with --app against the agent's
    state class as it is now, and recorded with its version), and its messages in flight
    changed by --drop-message, --edit-message and --add-message (the cut stays consistent:
    a dropped message's later ones move up, and its sender's count goes down). By default
    the fork's tools are dry (--tools dry): when it is continued, its side-effecting calls
    are recorded with their arguments and return the tools' stand-ins, and nothing reaches
    the world; --tools live makes them run for real. Nothing runs: continue it from
    a program that registers the same agents, with
    `Runtime(store=..., run_id=NEW_RUN).resume()`.

    `agentsnap fork SNAPSHOT` (without --snapshot) forks from that snapshot, whatever its run.
    """
    from agentsnap.exceptions import StateInvalid  # noqa: PLC0415
    from agentsnap.inspect import fork_run, resolve_run, resolve_snapshot  # noqa: PLC0415

    states = _edits(edits)
    messages = _message_edits(drop_messages, edit_messages, add_messages)
    models = _state_models(app_spec)

    async def go(store: SqlStore) -> RunInfo:
        chosen = target
        if snapshot_id is not None:
            run = await resolve_run(store, target)
            snapshot = await resolve_snapshot(store, snapshot_id)
            if snapshot.run_id != run.id:
                raise click.ClickException(
                    f"snapshot {snapshot.id} belongs to run {snapshot.run_id}, not to {run.id}"
                )
            chosen = snapshot.id
        return await fork_run(
            store,
            chosen,
            states=states or None,
            name=name,
            models=models,
            messages=messages,
            tools=tools,
        )

    try:
        run = _read(db, go)
    except click.ClickException as exc:
        cause = exc.__cause__
        if isinstance(cause, StateInvalid):
            lines = [f"  {p['agent']} at {p['path']}: {p['message']}" for p in cause.problems]
            of_messages = all(p["path"].startswith("message ") for p in cause.problems)
            raise click.ClickException(
                (
                    "the message edits do not fit the cut (name messages in flight by their "
                    "id, as `agentsnap show` lists them)"
                    if of_messages
                    else "the edited states do not match the agents' state "
                    + ("classes" if models else "schemas")
                )
                + ":\n"
                + "\n".join(lines)
            ) from cause
        raise
    if as_json:
        _print_json(
            {
                "id": run.id,
                "name": run.name,
                "parent_run_id": run.parent_run_id,
                "parent_snapshot_id": run.parent_snapshot_id,
            }
        )
        return
    click.echo(run.id)


def _load_predicate(spec: str) -> Callable[[dict[str, Any]], bool]:
    """The function ``module:function`` names, imported from the current directory too."""
    import importlib  # noqa: PLC0415

    module_name, sep, function = spec.partition(":")
    if not sep or not module_name or not function:
        raise click.BadParameter(
            f"{spec!r} is not MODULE:FUNCTION (as in checks:still_good)",
            param_hint="--predicate",
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(
            f"cannot import {module_name!r}: {exc}", param_hint="--predicate"
        ) from exc
    found: object = module
    for part in function.split("."):
        found = getattr(found, part, None)
    if not callable(found):
        raise click.BadParameter(
            f"{module_name} has no function {function!r}", param_hint="--predicate"
        )
    return found


@main.command()
@click.argument("run_id")
@click.option(
    "--predicate",
    required=True,
    metavar="MODULE:FUNCTION",
    help="A function of {agent: state} that is true while the run is good.",
)
@_DB
@_JSON
def bisect(run_id: str, predicate: str, db: str, as_json: bool) -> None:
    """Find the first complete snapshot of RUN where --predicate is false.

    The predicate is given every agent's state (a dict of JSON objects, by agent name) and
    returns whether the run is still good there. The search assumes it holds at the first
    snapshot and, once false, stays false; it checks the first snapshot and says so when
    the predicate is false already there. Prints the first bad snapshot, the last good one,
    what changed between them, and the command that forks a run from the last good cut.
    """
    from agentsnap.inspect import bisect_run  # noqa: PLC0415

    check = _load_predicate(predicate)
    result = _read(db, lambda store: bisect_run(store, run_id, check))
    first_bad, last_good = result.first_bad, result.last_good
    either = first_bad or last_good
    run = either.run_id if either is not None else run_id
    command = None
    if last_good is not None and first_bad is not None:
        command = f"agentsnap fork {run} --snapshot {last_good.id} --db {db}"

    def described(snapshot: Snapshot | None) -> dict[str, Any] | None:
        if snapshot is None:
            return None
        completed = snapshot.completed_at
        return {
            "id": snapshot.id,
            "seq": snapshot.seq,
            "completed_at": None if completed is None else completed.isoformat(),
        }

    if as_json:
        _print_json(
            {
                "run_id": run,
                "first_bad": described(first_bad),
                "last_good": described(last_good),
                "holds_at_first": result.holds_at_first,
                "checked": result.checked,
                "snapshots": result.snapshots,
                "diff": result.diff,
                "fork_command": command,
            }
        )
        return
    if result.snapshots == 0:
        click.echo(f"run {run} has no complete snapshot: nothing to search")
        return
    if not result.holds_at_first:
        assert first_bad is not None
        click.echo(
            f"the predicate is false already at the first snapshot ({first_bad.seq}, "
            f"{first_bad.id}): nothing to search; bisect needs it true at the start"
        )
        return
    if first_bad is None:
        assert last_good is not None
        click.echo(
            f"the predicate holds at every snapshot, the last being {last_good.seq} "
            f"({last_good.id}); checked {result.checked} of {result.snapshots}"
        )
        return
    assert last_good is not None
    assert result.diff is not None
    click.echo(f"first bad:  snapshot {first_bad.seq}  {first_bad.id}")
    click.echo(f"last good:  snapshot {last_good.seq}  {last_good.id}")
    click.echo(f"checked {result.checked} of {result.snapshots} snapshots")
    click.echo("what changed from the last good to the first bad:")
    changed = [a for a in result.diff["agents"] if a["change"] != "unchanged"]
    for agent in changed:
        click.echo(f"  {agent['agent']} ({agent['change']})")
        for line in _diff_lines(agent):
            click.echo(f"    {line}")
    if not changed:
        click.echo("  no agent's state changed (only messages in flight)")
    click.echo("fork a run from the last good cut:")
    click.echo(f"  {command}")


_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


@main.command()
@_DB
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    help="Port to listen on (0: any free port).",
)
@click.option(
    "--open/--no-open",
    "open_browser",
    default=None,
    help="Open the page in a browser (by default when standard output is a terminal).",
)
@click.option(
    "--allow-fork",
    is_flag=True,
    help="Let the page fork runs (with edited states); read-only otherwise.",
)
@click.option(
    "--allow-answer",
    is_flag=True,
    help="Let the page answer requests to people (approve, deny, answer); off otherwise.",
)
@click.option(
    "--allow-run",
    is_flag=True,
    help="Let the page resume runs (with --app, each in a process of its own) and cancel "
    "them; off otherwise (the page shows the commands instead).",
)
@click.option(
    "--token",
    envvar="AGENTSNAP_UI_TOKEN",
    default=None,
    help="A secret every write must present (X-Agentsnap-Token), typed into the page; "
    "needed to listen beyond this machine with forks, answers or runs allowed "
    "(default: $AGENTSNAP_UI_TOKEN).",
)
@_APP
def ui(  # noqa: PLR0917
    db: str,
    host: str,
    port: int,
    open_browser: bool | None,
    allow_fork: bool,
    allow_answer: bool,
    allow_run: bool,
    token: str | None,
    app_spec: str | None,
) -> None:
    """Serve the web inspector for the runs in the database, until Ctrl-C.

    It listens on this machine only (127.0.0.1) unless --host says otherwise; anyone who
    can reach the address can read the runs (fork them with --allow-fork, answer their
    requests to people with --allow-answer, resume and cancel them with --allow-run, which
    resumes a run with --app's app in a process of its own). Every write carries a token
    the page gets from the server; listening beyond this machine with writes allowed needs
    --token, a secret typed into the page instead. The API is described at /docs. With --app,
    states are shown as the app's state classes read them now, and edited states of a fork
    are validated against them. Needs the ui extra: pip install 'agentsnap[ui]'.
    """
    import socket  # noqa: PLC0415

    from agentsnap import ui as inspector  # noqa: PLC0415

    _guard(inspector.require)
    import uvicorn  # noqa: PLC0415

    from agentsnap.store.sql import SqlStore  # noqa: PLC0415
    from agentsnap.ui.server import create_app  # noqa: PLC0415

    writes = [
        name
        for name, allowed in (
            ("--allow-fork", allow_fork),
            ("--allow-answer", allow_answer),
            ("--allow-run", allow_run),
        )
        if allowed
    ]
    if host not in _LOOPBACK and writes and not token:
        raise click.UsageError(
            f"listening on {host} with {', '.join(writes)} lets anyone who reaches it change "
            "runs: give a secret with --token (or AGENTSNAP_UI_TOKEN), which every write "
            "must present, or listen on 127.0.0.1"
        )
    if token is not None and len(token) < 16:
        raise click.BadParameter("give a token of at least 16 characters", param_hint="--token")
    models = _state_models(app_spec)
    _read(db, lambda store: store.list_runs(limit=1))  # a clear error without a schema
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host!r}: {exc}; check --host") from exc
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        raise click.ClickException(
            f"cannot listen on {host} port {port} ({exc.strerror or exc}): it is taken or not "
            "yours; pick another with --port (0 for any free one)"
        ) from exc
    listener.listen(2048)  # requests wait from now on, while the server starts
    bound = listener.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}/"
    if host not in _LOOPBACK:
        click.echo(
            f"warning: listening on {host}, not only on this machine: anyone who can reach it "
            "can read these runs"
            + (" and fork them" if allow_fork else "")
            + (" and answer their requests" if allow_answer else ""),
            err=True,
        )
    store = SqlStore(db, create=False, retry=_RETRY)
    app = create_app(
        store,
        allow_fork=allow_fork,
        allow_answer=allow_answer,
        allow_run=allow_run,
        app_spec=app_spec,
        token=token,
        close_store=True,
        models=models,
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    if open_browser is None:
        open_browser = sys.stdout is not None and sys.stdout.isatty()
    try:
        click.echo(f"agentsnap inspector at {url} (Ctrl-C to stop)")
        if open_browser:
            import threading  # noqa: PLC0415
            import webbrowser  # noqa: PLC0415

            threading.Timer(0.5, webbrowser.open, [url]).start()
        server.run(sockets=[listener])
    except KeyboardInterrupt:  # before the server took over Ctrl-C, or a second one
        pass
    finally:
        listener.close()


def _progress_stream() -> IO[str] | None:
    """Where progress goes: standard error when it is a terminal, else nowhere."""
    stream = sys.stderr
    return stream if stream is not None and stream.isatty() else None


class _Steps:
    """Shows which step of a long command runs, on one line of standard error.

    Only when standard error is a terminal, so pipes, files and tests see nothing; the line
    is erased when the command is done (or fails, before its error is printed).
    """

    def __init__(self, command: str, total: int) -> None:
        self._stream = _progress_stream()
        self._command = command
        self._total = total
        self._done = 0

    def __enter__(self) -> _Steps:
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


@main.command()
@click.option(
    "--nats", "nats_url", required=True, metavar="URL", help="The NATS server (JetStream on)."
)
@_DB
@click.option(
    "--app",
    "app_spec",
    required=True,
    metavar="MODULE:FACTORY",
    help="The run's app: a factory returning an agentsnap.distributed.App (the current "
    "directory is importable).",
)
@click.option("--run", "run_id", required=True, help="The run (its coordinator created it).")
@click.option("--agents", "agent_names", metavar="A,B", help="Host these agents.")
@click.option(
    "--group", metavar="N/M", help="Host the agents whose name hashes to group N of M (0 <= N < M)."
)
@click.option(
    "--lease",
    type=click.FloatRange(min=1.0),
    default=10.0,
    show_default=True,
    help="Seconds the claim on the agents holds without renewal.",
)
@click.option(
    "--nats-patience",
    type=click.FloatRange(min=0.1),
    default=60.0,
    show_default=True,
    help="Seconds to wait for a lost NATS server to come back before giving up (exit status 1).",
)
@click.option(
    "--wait",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="Seconds to wait for agents another worker holds: to take over the agents of a "
    "worker that stopped, once its leases expire.",
)
@click.option(
    "--move",
    is_flag=True,
    help="Take the agents from the workers hosting them, at a cut, while the run goes on "
    "(to rebalance): the run's coordinator takes a snapshot, the worker hosting them lets "
    "them go and serves on with its others, and the run goes back to that snapshot.",
)
def worker(  # noqa: PLR0917 - click passes the options positionally
    nats_url: str,
    db: str,
    app_spec: str,
    run_id: str,
    agent_names: str | None,
    group: str | None,
    lease: float,
    nats_patience: float,
    wait: float,
    move: bool,
) -> None:
    """Host some agents of a run spread over processes, until SIGTERM or Ctrl-C.

    Every worker of the run builds the same app and hosts the agents placed on it; the
    others are reached over NATS JetStream. It writes its part of every snapshot the run's
    coordinator begins to the database (see agentsnap.distributed). A worker started again
    after a crash (or given the agents of a worker that stopped, with --wait) restores them
    from the run's last complete snapshot, the whole run rolling back to it. With --move it
    takes its agents from a running worker, which lets them go and serves on with its others
    (it exits when it hosts nothing more). Needs the nats extra: pip install 'agentsnap[nats]'.
    """
    from agentsnap.distributed import load_app, place  # noqa: PLC0415
    from agentsnap.exceptions import ConfigurationError  # noqa: PLC0415

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # an app next to where the worker is started
    try:
        app = load_app(app_spec)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--app") from exc
    try:
        names = None if agent_names is None else [n.strip() for n in agent_names.split(",")]
        hosted = place(app.names, agents=names, group=group)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    _guard(
        lambda: asyncio.run(
            _serve_worker(nats_url, db, app, run_id, hosted, lease, nats_patience, wait, move)
        )
    )


async def _serve_worker(  # noqa: PLR0917
    nats_url: str,
    db: str,
    app: Any,
    run_id: str,
    hosted: list[str],
    lease: float,
    nats_patience: float,
    wait: float,
    move: bool = False,
) -> None:
    """Check the run and NATS (writing nothing), then serve until a signal says stop."""
    import signal  # noqa: PLC0415

    from agentsnap.distributed import Worker, check_run  # noqa: PLC0415
    from agentsnap.jetstream import JetStreamLink  # noqa: PLC0415
    from agentsnap.store.sql import SqlStore  # noqa: PLC0415

    # What the worker goes through (rollbacks, recoveries, a lost claim) is told on stderr.
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logging.getLogger("agentsnap").addHandler(handler)
    store = SqlStore(db, create=False, retry=_RETRY)
    try:
        check_run(await store.get_run(run_id), app)
        link = await JetStreamLink.connect(nats_url)
        try:
            serving = Worker(
                link,
                store,
                run_id,
                app,
                hosted,
                lease=lease,
                nats_patience=nats_patience,
                wait=wait,
                move=move,
            )
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, serving.stop)
            await serving.start()
            click.echo(
                f"worker {serving.name} hosts {', '.join(serving.agents)} of run {run_id}",
                err=True,
            )
            try:
                await serving.stopped.wait()
            finally:
                await serving.close()
            if serving.moved_out:
                click.echo(
                    f"worker {serving.name} let {', '.join(serving.moved_out)} go to another",
                    err=True,
                )
            if serving.error is not None:
                raise serving.error
        finally:
            await link.close(drain=0.0 if link.away_for() else 10.0)
    finally:
        await store.close()


# -- acting on runs: run an app, resume, cancel; a run's history of handlers --------------

_RUN_APP = click.option(
    "--app",
    "app_spec",
    required=True,
    metavar="MODULE:FACTORY",
    help="The app: a factory returning an agentsnap.distributed.App (or a list of agents); "
    "the current directory is importable.",
)


def _load_app(app_spec: str) -> App:
    """The app ``--app`` names, or a usage error saying what is wrong with it."""
    from agentsnap.distributed.app import load_app  # noqa: PLC0415
    from agentsnap.exceptions import ConfigurationError  # noqa: PLC0415

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return load_app(app_spec)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--app") from exc


def _input_value(text: str) -> Any:
    """``--input``: JSON text, or ``@file`` holding JSON."""
    source = "--input"
    if text.startswith("@"):
        path = text[1:]
        try:
            with open(path, encoding="utf-8") as file:
                text = file.read()
        except OSError as exc:
            raise click.BadParameter(
                f"cannot read {path}: {exc.strerror}", param_hint="--input"
            ) from exc
        source = path
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(
            f"{source} is not JSON ({exc}): give JSON text, or @FILE holding JSON",
            param_hint="--input",
        ) from exc


def _act(db: str, action: Callable[[SqlStore], Awaitable[T]], *, create: bool = False) -> T:
    """Run ``action`` with a store on ``db`` that writes (``create``: a database and its
    schema are created if there is none).
    """  # noqa: D205
    from agentsnap.store.sql import SqlStore  # noqa: PLC0415

    async def go() -> T:
        store = SqlStore(db, create=create)
        try:
            return await action(store)
        finally:
            await store.close()

    return _guard(lambda: asyncio.run(go()))


def _outcome(run: RunInfo, as_json: bool) -> None:
    """Print how ``run`` ended, and exit non-zero unless it succeeded."""
    if as_json:
        _print_json(
            {
                "id": run.id,
                "status": run.status.value,
                "status_reason": run.status_reason,
                "traceback": run.traceback,
                "finished_at": None if run.finished_at is None else run.finished_at.isoformat(),
            }
        )
    else:
        why = f": {run.status_reason}" if run.status_reason else ""
        click.echo(f"run {run.id}: {run.status.value}{why}")
        if run.traceback:
            click.echo(run.traceback.rstrip(), err=True)
    if run.status is not RunStatus.SUCCEEDED:
        sys.exit(1)


@main.command("run")
@_RUN_APP
@click.option(
    "--input",
    "input_text",
    required=True,
    metavar="JSON|@FILE",
    help="The payload sent to the first agent: JSON text, or @FILE holding JSON.",
)
@click.option("--to", default=None, help="The agent the input goes to (default: the app's first).")
@click.option("--run-id", default=None, help="Id of the new run (default: 32 hex digits).")
@click.option("--name", default=None, help="A name for the run, shown by `agentsnap runs`.")
@_DB
@_JSON
def run_command(  # noqa: PLR0917 - click passes the options positionally
    app_spec: str,
    input_text: str,
    to: str | None,
    run_id: str | None,
    name: str | None,
    db: str,
    as_json: bool,
) -> None:
    """Start a run of an app in this process and run it to its end.

    The run's id is printed as soon as the run is recorded (`run <id>: started`), before
    anything is delivered: if this process is killed, `agentsnap resume <id> --app ...`
    finishes the run, each side-effecting tool call happening once. At the end, the run's
    status is printed (`run <id>: succeeded`), with why it failed and its tracebacks (on
    standard error); the exit status is 0 only when the run succeeded. Ctrl-C records the
    run as cancelled; `agentsnap cancel <id>` from another shell asks it to stop.
    """
    from agentsnap.inspect import run_app  # noqa: PLC0415

    app = _load_app(app_spec)
    payload = _input_value(input_text)

    def started(new_id: str) -> None:
        if not as_json:
            click.echo(f"run {new_id}: started")
            sys.stdout.flush()

    run = _act(
        db,
        lambda store: run_app(
            store, app, payload, to=to, run_id=run_id, name=name, started=started
        ),
        create=True,
    )
    _outcome(run, as_json)


@main.command("resume")
@click.argument("run_id")
@_RUN_APP
@click.option(
    "--wait",
    type=click.FloatRange(min=0.0),
    default=None,
    help="Seconds to wait for an owner on another host that stopped renewing its lease "
    "(default: twice the lease); a live process of this host is refused at once.",
)
@_DB
@_JSON
def resume_command(run_id: str, app_spec: str, wait: float | None, db: str, as_json: bool) -> None:
    """Resume run RUN_ID (or a unique prefix) in this process, and run it to its end.

    The run goes back to its last complete snapshot and its handlers are re-executed in
    the order logged: recorded model answers and tool results are given back, so nothing
    the world saw happens twice. Give the app the run was started with. The run's status
    is printed at the end; the exit status is 0 only when it succeeded. A run that
    succeeded, or that a live process owns, is refused.
    """
    from agentsnap.inspect import resume_app  # noqa: PLC0415

    app = _load_app(app_spec)

    def resumed(snapshot_id: str) -> None:
        if not as_json:
            click.echo(f"resumed from snapshot {snapshot_id}")
            sys.stdout.flush()

    run = _act(db, lambda store: resume_app(store, app, run_id, wait=wait, resumed=resumed))
    _outcome(run, as_json)


@main.command("cancel")
@click.argument("run_id")
@click.option("--reason", default="cancelled on request", show_default=True, help="Why.")
@click.option(
    "--wait",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="Seconds to wait for the run's process to stop it.",
)
@_DB
@_JSON
def cancel_command(run_id: str, reason: str, wait: float, db: str, as_json: bool) -> None:
    """Ask run RUN_ID (or a unique prefix) to stop.

    The process running it sees the request at its next lease renewal (within 5 seconds
    with the default lease), delivers nothing more, lets the handlers under way finish and
    records the run as cancelled. A run no process runs is recorded as cancelled at once.
    `agentsnap resume` continues a cancelled run.
    """
    from agentsnap.inspect import cancel_run  # noqa: PLC0415

    run = _act(db, lambda store: cancel_run(store, run_id, reason, wait=wait))
    if as_json:
        _print_json({"id": run.id, "status": run.status.value, "status_reason": run.status_reason})
    elif run.status is RunStatus.RUNNING:
        click.echo(f"run {run.id}: cancel requested; its process stops it at its next renewal")
    else:
        click.echo(f"run {run.id}: {run.status.value}")


@main.command("events")
@click.argument("run_id")
@click.option("--agent", default=None, help="Only this agent's handler executions.")
@click.option("--kind", default=None, help="Only executions of messages of this kind.")
@click.option("--grep", default=None, help="Only executions holding this text (any case).")
@_DB
@_JSON
def events(  # noqa: PLR0917 - click passes the options positionally
    run_id: str, agent: str | None, kind: str | None, grep: str | None, db: str, as_json: bool
) -> None:
    """List the handler executions of run RUN_ID (or a unique prefix), in the order they began.

    One row each time an agent took a message: the agent, the message taken, the messages
    its handler sent, its tool calls and model calls, how long it ran (to its last recorded
    act) and its timeline (rollbacks before it). Built from the run's journal, replay log,
    ledger and recorded model calls.
    """
    from agentsnap.inspect import events_table  # noqa: PLC0415

    rows = _read(db, lambda store: events_table(store, run_id, agent=agent, kind=kind, grep=grep))
    _print_rows(
        rows,
        as_json,
        {
            "#": "index",
            "STARTED": lambda r: _when(r["started_at"]),
            "AGENT": "agent",
            "TOOK": lambda r: f"{r['message']} {r['kind']}" if r["kind"] else r["message"],
            "SENT": lambda r: (
                ", ".join(f"{m['to']}#{m['seq']} {m['kind']}" for m in r["sent"]) or "-"
            ),
            "TOOLS": lambda r: (
                ", ".join(f"{c['tool']} {c['status']}" for c in r["tool_calls"]) or "-"
            ),
            "MODEL": lambda r: len(r["model_calls"]) or "-",
            "MS": lambda r: "-" if r["duration_ms"] is None else f"{r['duration_ms']:.1f}",
            "TL": "timeline",
        },
    )


def _print_json(value: object) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


Column = str | Callable[[dict[str, Any]], object]
"""A table column: the row's key to show, or a function of the row."""


def _print_rows(
    rows: list[dict[str, Any]],
    as_json: bool,
    columns: dict[str, Column],
    *,
    kinds: dict[str, console.Kind] | None = None,
    notes: Callable[[dict[str, Any]], str | None] | None = None,
) -> None:
    """Print ``rows`` as JSON, or as a table with one column per entry of ``columns``.

    The table fits the terminal unless ``--wide`` is given (see ``agentsnap.console``);
    ``kinds`` says how columns give way, by header, where the header does not tell;
    ``notes`` gives the text to show on lines of its own under a row, if any.
    """
    if as_json:
        _print_json(rows)
        return
    _print_table(
        list(columns),
        [[c(r) if callable(c) else r[c] for c in columns.values()] for r in rows],
        kinds=kinds,
        notes=None if notes is None else [notes(r) for r in rows],
    )


def _print_table(
    headers: list[str],
    rows: list[list[object]],
    *,
    kinds: dict[str, console.Kind] | None = None,
    notes: list[str | None] | None = None,
) -> None:
    # Colour codes are written always: click drops them when the output is not a terminal
    # (a pipe, a file, a test), and with --no-color or NO_COLOR (the context's ``color``).
    ctx = click.get_current_context(silent=True)
    wide = ctx is not None and bool(ctx.meta.get(_WIDE_KEY))
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


def _when(moment: str | None) -> str:
    """An ISO 8601 time as ``2026-11-24 21:05:03 +01:00``: local time, or UTC with ``--utc``.

    A time without an offset is taken to be UTC (as agentsnap stores them).
    """
    if moment is None:
        return "-"
    try:
        parsed = datetime.fromisoformat(moment)
    except ValueError:
        return moment
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    ctx = click.get_current_context(silent=True)
    utc = ctx is not None and bool(ctx.meta.get(_UTC_KEY))
    shown = parsed.astimezone(UTC if utc else None)
    offset = shown.strftime("%z")
    return f"{shown:%Y-%m-%d %H:%M:%S} {offset[:3]}:{offset[3:]}"


def _counters(counts: dict[str, int]) -> str:
    return ", ".join(f"{name}={n}" for name, n in sorted(counts.items())) or "-"


def _value(value: object, limit: int = 200) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _diff_lines(diff: dict[str, Any]) -> list[str]:
    lines = []
    for part in ("memory", "tool_calls", "fields"):
        prefix = "" if part == "fields" else f"{part}."
        changes = diff[part]
        lines += [f"+ {prefix}{k}: {_value(v)}" for k, v in changes["added"].items()]
        lines += [f"- {prefix}{k}: {_value(v)}" for k, v in changes["removed"].items()]
        lines += [
            f"~ {prefix}{k}: {_value(v['old'])} -> {_value(v['new'])}"
            for k, v in changes["changed"].items()
        ]
    for step in diff["plan"]:
        if step["change"] == "added":
            lines.append(f"+ plan[{step['index']}]: {_value(step['new'])}")
        elif step["change"] == "removed":
            lines.append(f"- plan[{step['index']}]: {_value(step['old'])}")
        else:
            lines.append(f"~ plan[{step['index']}]: {_value(step['old'])} -> {_value(step['new'])}")
    return lines


def _ledger(db: str, action: Callable[[Ledger], Awaitable[T]]) -> T:
    """Run ``action`` against the ledger at ``db`` without creating anything there."""
    from agentsnap.store.sql_ledger import SqlLedger  # noqa: PLC0415

    async def go() -> T:
        ledger = SqlLedger(db, create=False, retry=_RETRY)
        try:
            return await action(ledger)
        finally:
            await ledger.close()

    return _guard(lambda: asyncio.run(go()))


def _read(db: str, query: Callable[[SqlStore], Awaitable[T]]) -> T:
    """Run one query against the database at ``db`` without creating anything there."""
    from agentsnap.store.sql import SqlStore  # noqa: PLC0415

    async def go() -> T:
        store = SqlStore(db, create=False, retry=_RETRY)
        try:
            return await query(store)
        finally:
            await store.close()

    return _guard(lambda: asyncio.run(go()))


def _guard(action: Callable[[], T]) -> T:
    try:
        return action()
    except BrokenPipeError:  # standard output was closed: the main group stops quietly
        raise
    except AgentsnapError as exc:
        raise click.ClickException(str(exc)) from exc
    except Exception as exc:  # a database error: one line, no traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise click.ClickException(f"{type(exc).__name__}: {first}") from exc


def _commands(group: click.Group, path: str = "") -> Iterator[tuple[str, click.Command]]:
    """Every command under ``group`` that runs on its own, with its path, depth first.

    That is every command that is not a group, and every group that does something when
    invoked without a command.
    """
    for name, command in group.commands.items():
        here = f"{path} {name}".strip()
        if isinstance(command, click.Group):
            if command.invoke_without_command:
                yield here, command
            yield from _commands(command, here)
        else:
            yield here, command


_TABLES = frozenset(
    {
        "runs",
        "snapshots",
        "rollbacks",
        "checkpoints",
        "tools list",
        "model-calls",
        "requests",
        "events",
    }
)
"""The commands that print tables, and so take ``--wide``."""

_TIMES = frozenset(
    {
        "runs",
        "runs delete",
        "runs prune",
        "snapshots",
        "show",
        "history",
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


for _path, _command in _commands(main):
    _command.params.append(_no_color_option())
    if _path in _TIMES:
        _command.params.append(_utc_option())
    if _path in _TABLES:
        _command.params.append(_wide_option())
