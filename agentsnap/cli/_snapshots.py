"""A run's snapshots and what they hold: ``snapshots``, ``show``, ``diff``, ``history``, ...

Also ``owners`` (who owned a run, when), ``rollbacks`` and ``checkpoints`` (a run's
LangGraph checkpoints).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from agentsnap import console
from agentsnap.cli._common import APP, DB, JSON, read, state_models
from agentsnap.cli._format import (
    clipped,
    counters,
    diff_lines,
    latency,
    print_json,
    print_rows,
    when,
)
from agentsnap.cli._main import main
from agentsnap.records import SnapshotStatus

if TYPE_CHECKING:
    from agentsnap.inspect import CallSummary, PreviousSnapshot, SnapshotRow


@main.command()
@click.argument("run_id")
@DB
@JSON
def snapshots(run_id: str, db: str, as_json: bool) -> None:
    """List the snapshots of run RUN_ID (or a unique prefix of it).

    Why a snapshot failed is on a line of its own below the table, and so is what is wrong
    with a snapshot damaged in the database (rows deleted or changed by hand).
    """
    from agentsnap.inspect import snapshots_table  # noqa: PLC0415

    rows = read(db, lambda store: snapshots_table(store, run_id))
    print_rows(
        rows,
        as_json,
        {
            "SEQ": "seq",
            "ID": "id",
            "STATUS": "status",
            "INITIATOR": "initiator",
            "STARTED": lambda r: when(r.started_at),
            "AGENTS": lambda r: ",".join(r.agents),
            "IN-FLIGHT": "in_flight",
        },
    )
    if not as_json:
        for row in rows:
            if problem := _problem(row):
                click.echo(console.paint_warning(f"! snapshot {row.seq} {problem}: {row.error}"))


def _problem(row: SnapshotRow) -> str | None:
    """What the line under the table says of a snapshot, if anything."""
    if row.status is SnapshotStatus.DAMAGED:
        return "is damaged"
    return "failed" if row.status is SnapshotStatus.FAILED and row.error else None


@main.command()
@click.argument("snapshot_id")
@DB
@click.option("--agent", default=None, help="Only this agent and its channels.")
@APP
@JSON
def show(snapshot_id: str, db: str, agent: str | None, app_spec: str | None, as_json: bool) -> None:
    """Print snapshot SNAPSHOT_ID: each agent's state and counters, messages in flight.

    A snapshot damaged in the database is printed as damaged, with what is wrong and what
    could still be read; a failed snapshot with why it failed. When the snapshot's run
    ended for a reason, the reason is printed, and a failed run's tracebacks.

    Each state is printed as stored, with the version of its class it
    was stored with; with --app, as the app's state classes read it now.
    """
    from agentsnap.inspect import show_snapshot  # noqa: PLC0415

    models = state_models(app_spec)
    doc = read(db, lambda store: show_snapshot(store, snapshot_id, agent, models=models))
    if as_json:
        print_json(doc)
        return
    click.echo(
        f"snapshot {doc.id}  run {doc.run_id}  seq {doc.seq}  {doc.status.value}  "
        f"by {doc.initiator}  started {when(doc.started_at)}"
    )
    if doc.status is SnapshotStatus.DAMAGED:
        click.echo(f"damaged: {doc.error}")
        if doc.damaged_agents:
            click.echo(f"missing or unreadable: {', '.join(doc.damaged_agents)}")
    elif doc.error:
        click.echo(f"error: {doc.error}")
    run = doc.run
    if run.status_reason:
        click.echo(f"run {run.status.value}: {run.status_reason}")
    if run.traceback:
        click.echo(run.traceback.rstrip())
    for name, cut in doc.agents.items():
        # A state's version is shown once its class declares one (1 is the default).
        version = f", version {cut.state_version}" if cut.state_version != 1 else ""
        if cut.read_as is not None and cut.read_as != cut.state_version:
            version = f", version {cut.state_version}, read as version {cut.read_as}"
        click.echo(f"agent {name}  (state {cut.state_hash[:12]}{version})")
        if cut.unreadable is not None:
            click.echo(console.paint_warning(f"  ! {cut.unreadable}"))
        click.echo(f"  sent: {counters(cut.sent)}")
        click.echo(f"  received: {counters(cut.received)}")
        for key, value in cut.state.items():
            click.echo(f"  {key}: {clipped(value)}")
        _show_model_calls(cut.model_calls, doc.previous)
    messages = [(c.src, c.dst, m) for c in doc.channels for m in c.messages]
    click.echo(f"in flight: {len(messages)}")
    for src, dst, m in messages:
        click.echo(f"  {src} -> {dst} #{m.seq} {m.kind}: {clipped(m.payload)}")


def _show_model_calls(calls: list[CallSummary], previous: PreviousSnapshot | None) -> None:
    """An agent's model calls since the previous cut, one line each, under a count."""
    if not calls:
        return
    since = "the run began" if previous is None else f"snapshot {previous.seq}"
    tokens_in = sum(c.input_tokens for c in calls)
    tokens_out = sum(c.output_tokens for c in calls)
    click.echo(
        f"  model calls since {since}: {len(calls)} ({tokens_in} tokens in, {tokens_out} out)"
    )
    for c in calls:
        mark = "~" if c.discarded else " "
        answer = c.answer if len(c.answer) <= 60 else c.answer[:57] + "..."
        click.echo(
            f"   {mark}{c.message} #{c.position} timeline {c.timeline}  "
            f"{c.model or '-'}  {c.input_tokens}/{c.output_tokens} tokens  "
            f"{latency(c.latency_ms)}: {answer}"
        )


@main.command()
@click.argument("snapshot_a")
@click.argument("snapshot_b")
@DB
@click.option("--agent", default=None, help="Only this agent.")
@APP
@JSON
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

    models = state_models(app_spec)
    doc = read(
        db, lambda store: diff_snapshots(store, snapshot_a, snapshot_b, agent, models=models)
    )
    if as_json:
        print_json(doc)
        return
    if doc.a_run_id == doc.b_run_id:
        header = f"diff {doc.a} -> {doc.b}"
    else:  # snapshots of two runs (a fork and its parent, say): name both runs
        header = f"diff {doc.a} (run {doc.a_run_id}) -> {doc.b} (run {doc.b_run_id})"
    click.echo(console.paint_header(header))
    for side, damage in ((doc.a, doc.a_damaged), (doc.b, doc.b_damaged)):
        if damage:
            click.echo(console.paint_warning(f"! snapshot {side} is damaged: {damage}"))
    for entry in doc.agents:
        click.echo(console.paint_header(f"agent {entry.agent}: {entry.change}"))
        for line in diff_lines(entry.diff):
            click.echo(console.paint_diff_line(f"  {line}"))


@main.command()
@click.argument("run_id")
@DB
@click.option("--agent", required=True, help="The agent to follow.")
@JSON
def history(run_id: str, db: str, agent: str, as_json: bool) -> None:
    """Show one agent's state across the snapshots of RUN_ID, and what changed each time.

    Snapshots damaged in the database are marked, with what is wrong.
    """
    from agentsnap.inspect import agent_history_table  # noqa: PLC0415

    rows = read(db, lambda store: agent_history_table(store, run_id, agent))
    if as_json:
        print_json(rows)
        return
    for row in rows:
        state = "-" if row.state_hash is None else row.state_hash[:12]
        click.echo(
            console.paint_header(
                f"snapshot {row.seq}  {row.snapshot_id}  {when(row.completed_at)}  state {state}"
            )
        )
        if row.damaged:
            click.echo(console.paint_warning(f"  ! damaged: {row.damaged}"))
        if row.state is None:
            continue
        if row.changes is None:
            for key, value in row.state.items():
                click.echo(f"  {key}: {clipped(value)}")
        else:
            lines = diff_lines(row.changes)
            for line in lines or ["(unchanged)"]:
                click.echo(console.paint_diff_line(f"  {line}"))


@main.command()
@click.argument("run_id")
@DB
@JSON
def owners(run_id: str, db: str, as_json: bool) -> None:
    """List who owned run RUN_ID: each process that took its lease, when, and how it ended.

    HOW is `released` (it stopped cleanly), `crashed` (it stopped without giving the run
    back: the next owner took the run over; LAST SEEN is its last lease renewal) or
    `holds`. Runs that started before the database kept owners list only later ones.
    """
    from agentsnap.inspect import owners_table  # noqa: PLC0415

    print_rows(
        read(db, lambda store: owners_table(store, run_id)),
        as_json,
        {
            "TOKEN": "token",
            "OWNER": "owner",
            "ACQUIRED": lambda r: when(r.acquired_at),
            "ENDED": lambda r: when(r.ended_at),
            "HOW": "ended",
            "LAST SEEN": lambda r: when(r.last_renewed_at),
        },
    )


@main.command()
@click.argument("run_id")
@DB
@JSON
def rollbacks(run_id: str, db: str, as_json: bool) -> None:
    """List the rollbacks of run RUN_ID: when, to which snapshot, whose output, why."""
    from agentsnap.inspect import rollbacks_table  # noqa: PLC0415

    print_rows(
        read(db, lambda store: rollbacks_table(store, run_id)),
        as_json,
        {
            "AT": lambda r: when(r.at),
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
@DB
@click.option("--agent", default=None, help="Only this graph agent.")
@JSON
def checkpoints(run_id: str, db: str, agent: str | None, as_json: bool) -> None:
    """List the LangGraph checkpoints of RUN_ID's graph agents, oldest first.

    SNAPSHOTS are the run's snapshots that hold each checkpoint. Checkpoints are found when
    the graph agents' checkpointer is an AgentsnapSaver on this database.
    """
    from agentsnap.inspect import graph_checkpoints_table  # noqa: PLC0415

    print_rows(
        read(db, lambda store: graph_checkpoints_table(store, run_id, agent)),
        as_json,
        {
            "AGENT": "agent",
            "THREAD": lambda r: _thread(r.thread_id),
            "CHECKPOINT": lambda r: _short(r.checkpoint_id),
            "PARENT": lambda r: _short(r.parent_id),
            "STEP": "step",
            "SOURCE": "source",
            "CREATED": lambda r: when(r.created_at),
            "SNAPSHOTS": lambda r: ",".join(map(str, r.snapshots)) or None,
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
