"""``agentsnap fork`` and ``agentsnap bisect``: a run from a cut, the first bad snapshot."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import click

from agentsnap.cli._common import DB, JSON, app_option, importable_here, read, state_models
from agentsnap.cli._format import diff_lines, print_json
from agentsnap.cli._main import main
from agentsnap.cli._results import Bisection, Forked, SnapshotRef

if TYPE_CHECKING:
    from agentsnap.fork import MessageEdits
    from agentsnap.records import RunInfo
    from agentsnap.store.sql import SqlStore


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
@DB
@app_option(
    "Validate the --edit states against this app's state classes, as they are now "
    "(else against the schemas stored with RUN); the current directory is importable."
)
@JSON
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
    models = state_models(app_spec)

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
        run = read(db, go)
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
        print_json(Forked.of(run))
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
    importable_here()
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
@DB
@JSON
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
    result = read(db, lambda store: bisect_run(store, run_id, check))
    first_bad, last_good = result.first_bad, result.last_good
    either = first_bad or last_good
    run = either.run_id if either is not None else run_id
    command = None
    if last_good is not None and first_bad is not None:
        command = f"agentsnap fork {run} --snapshot {last_good.id} --db {db}"

    if as_json:
        print_json(
            Bisection(
                run_id=run,
                first_bad=SnapshotRef.of(first_bad),
                last_good=SnapshotRef.of(last_good),
                holds_at_first=result.holds_at_first,
                checked=result.checked,
                snapshots=result.snapshots,
                diff=result.diff,
                fork_command=command,
            )
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
    changed = [a for a in result.diff.agents if a.change != "unchanged"]
    for agent in changed:
        click.echo(f"  {agent.agent} ({agent.change})")
        for line in diff_lines(agent.diff):
            click.echo(f"    {line}")
    if not changed:
        click.echo("  no agent's state changed (only messages in flight)")
    click.echo("fork a run from the last good cut:")
    click.echo(f"  {command}")
