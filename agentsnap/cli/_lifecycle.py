"""Driving runs: ``run``, ``resume``, ``cancel``, ``events`` and ``demo``.

``events`` lists a run's handler executions, from its journal, replay log and ledger.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TYPE_CHECKING, Any

import click

from agentsnap.cli._common import DB, JSON, act, app_of, app_option, guard, read, seconds_option
from agentsnap.cli._format import print_json, print_rows, when
from agentsnap.cli._main import main
from agentsnap.cli._results import Cancelled, Outcome
from agentsnap.records import RunStatus

if TYPE_CHECKING:
    from agentsnap.demo import DemoResult
    from agentsnap.records import RunInfo
    from agentsnap.telemetry import Exporter


@main.command()
@DB
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

    chat = guard(lambda: load_model(model)) if model else None
    # Before the runtime exists: it decides once whether to trace.
    shutdown = guard(lambda: install_sdk(exporter)) if exporter else None

    async def go() -> DemoResult:
        store = SqlStore(db)
        try:
            return await run_demo(store, chat)
        finally:
            await store.close()

    try:
        result = guard(lambda: asyncio.run(go()))
    finally:
        if shutdown is not None:
            shutdown()  # flushes the spans and metrics (printed before the summary)
    for line in describe(result, db):
        click.echo(line)
    if result.report is None or result.run.status.value != "succeeded":
        raise click.exceptions.Exit(1)


# -- acting on runs: run an app, resume, cancel; a run's history of handlers --------------

_RUN_APP = app_option(
    "The app: a factory returning an agentsnap.distributed.App (or a list of agents); "
    "the current directory is importable.",
    required=True,
)


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


def _outcome(run: RunInfo, as_json: bool) -> None:
    """Print how ``run`` ended, and exit non-zero unless it succeeded."""
    if as_json:
        print_json(Outcome.of(run))
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
@DB
@JSON
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

    app = app_of(app_spec)
    payload = _input_value(input_text)

    def started(new_id: str) -> None:
        if not as_json:
            click.echo(f"run {new_id}: started")
            sys.stdout.flush()

    run = act(
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
@seconds_option(
    "--wait",
    "Seconds to wait for an owner on another host that stopped renewing its lease "
    "(default: twice the lease); a live process of this host is refused at once.",
    default=None,
)
@DB
@JSON
def resume_command(run_id: str, app_spec: str, wait: float | None, db: str, as_json: bool) -> None:
    """Resume run RUN_ID (or a unique prefix) in this process, and run it to its end.

    The run goes back to its last complete snapshot and its handlers are re-executed in
    the order logged: recorded model answers and tool results are given back, so nothing
    the world saw happens twice. Give the app the run was started with. The run's status
    is printed at the end; the exit status is 0 only when it succeeded. A run that
    succeeded, or that a live process owns, is refused.
    """
    from agentsnap.inspect import resume_app  # noqa: PLC0415

    app = app_of(app_spec)

    def resumed(snapshot_id: str) -> None:
        if not as_json:
            click.echo(f"resumed from snapshot {snapshot_id}")
            sys.stdout.flush()

    run = act(db, lambda store: resume_app(store, app, run_id, wait=wait, resumed=resumed))
    _outcome(run, as_json)


@main.command("cancel")
@click.argument("run_id")
@click.option("--reason", default="cancelled on request", show_default=True, help="Why.")
@seconds_option("--wait", "Seconds to wait for the run's process to stop it.", default=0.0)
@DB
@JSON
def cancel_command(run_id: str, reason: str, wait: float, db: str, as_json: bool) -> None:
    """Ask run RUN_ID (or a unique prefix) to stop.

    The process running it sees the request at its next lease renewal (within 5 seconds
    with the default lease), delivers nothing more, lets the handlers under way finish and
    records the run as cancelled. A run no process runs is recorded as cancelled at once.
    `agentsnap resume` continues a cancelled run.
    """
    from agentsnap.inspect import cancel_run  # noqa: PLC0415

    run = act(db, lambda store: cancel_run(store, run_id, reason, wait=wait))
    if as_json:
        print_json(Cancelled.of(run))
    elif run.status is RunStatus.RUNNING:
        click.echo(f"run {run.id}: cancel requested; its process stops it at its next renewal")
    else:
        click.echo(f"run {run.id}: {run.status.value}")


@main.command("events")
@click.argument("run_id")
@click.option("--agent", default=None, help="Only this agent's handler executions.")
@click.option("--kind", default=None, help="Only executions of messages of this kind.")
@click.option("--grep", default=None, help="Only executions holding this text (any case).")
@DB
@JSON
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

    rows = read(db, lambda store: events_table(store, run_id, agent=agent, kind=kind, grep=grep))
    print_rows(
        rows,
        as_json,
        {
            "#": "index",
            "STARTED": lambda r: when(r.started_at),
            "AGENT": "agent",
            "TOOK": lambda r: f"{r.message} {r.kind}" if r.kind else r.message,
            "SENT": lambda r: ", ".join(f"{m.to}#{m.seq} {m.kind}" for m in r.sent) or "-",
            "TOOLS": lambda r: ", ".join(f"{c.tool} {c.status}" for c in r.tool_calls) or "-",
            "MODEL": lambda r: len(r.model_calls) or "-",
            "MS": lambda r: "-" if r.duration_ms is None else f"{r.duration_ms:.1f}",
            "TL": "timeline",
        },
    )
