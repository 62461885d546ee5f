"""Snapshots damaged in the database read back as damaged, with a one-line reason.

Each test runs a small scripted workflow into a real SQLite file and a real PostgreSQL
database, damages what the store holds with SQL (deleted rows, edited state blobs, broken
counters, lost messages), and checks what the inspection API, the CLI and the runtime make
of it: never a complete snapshot with parts missing, never a traceback, never a rollback,
resume or fork from it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy
from click.testing import CliRunner, Result

from agentsnap import (
    Agent,
    AgentState,
    Context,
    Message,
    Runtime,
    SnapshotDamaged,
    SnapshotPolicy,
    SnapshotStatus,
)
from agentsnap.cli import main
from agentsnap.inspect import (
    SnapshotRow,
    agent_history_table,
    diff_snapshots,
    export_run,
    fork_run,
    show_snapshot,
    snapshots_table,
)
from agentsnap.integrity import cut_problems
from agentsnap.messages import ENVIRONMENT
from agentsnap.records import AgentCut, ChannelRecord, RecordedMessage, Snapshot, utcnow
from agentsnap.state import content_hash
from agentsnap.store.migrate import sync_url
from agentsnap.store.sql import SqlStore
from agentsnap.testing import ScriptedScheduler


class CountState(AgentState):
    count: int = 0


class Relay(Agent[CountState]):
    """Counts what it handles; forwards to ``payload["to"]``."""

    async def handle(self, message: Message, ctx: Context[CountState]) -> None:
        self.state.count += 1
        if isinstance(message.payload, dict) and isinstance(to := message.payload.get("to"), str):
            ctx.send(to, {"from": self.name}, kind="relayed")


AGENTS = ("alice", "bob", "carol")


@dataclass(frozen=True)
class Run:
    db: str
    id: str
    first: str
    second: str


async def scripted_run(db: str) -> Run:
    """Snapshot 1 at the first input; snapshot 2 with ``alice>bob#1`` in flight, bob having
    received nothing from alice, carol idle. The run is left interrupted (input to carol
    was never delivered), so it can be resumed; it takes no snapshot as it closes, so that
    snapshot 2 is the one a resume goes back to.
    """
    store = SqlStore(db)
    scheduler = ScriptedScheduler()
    try:
        async with Runtime(
            store=store, scheduler=scheduler, snapshot_policy=SnapshotPolicy(at_end=False)
        ) as runtime:
            for name in AGENTS:
                runtime.add(Relay(name))
            runtime.send("alice", {"to": "bob"})
            await scheduler.deliver("$env", "alice")
            handle = runtime.snapshot()
            for src, dst in [
                ("$env", "alice"),
                ("$env", "bob"),
                ("$env", "carol"),
                ("alice", "bob"),
                ("alice", "bob"),
            ]:
                await scheduler.deliver(src, dst)
            await handle
            runtime.send("carol", "later")
        first, second = await store.list_snapshots(runtime.run_id)
    finally:
        await store.close()
    assert (first.status, second.status) == (SnapshotStatus.COMPLETE, SnapshotStatus.COMPLETE)
    assert [(c.src, c.dst, [m.seq for m in c.messages]) for c in second.channels] == [
        ("alice", "bob", [1])
    ]
    return Run(db, runtime.run_id, first.id, second.id)


@pytest.fixture
async def run(empty_db: str) -> Run:
    return await scripted_run(empty_db)


def damage(db: str, *statements: str, **params: Any) -> None:
    """Run SQL against the database behind agentsnap's back (foreign keys not enforced)."""
    engine = sqlalchemy.create_engine(sync_url(db))
    try:
        with engine.begin() as connection:
            if engine.dialect.name == "postgresql":  # let rows go that others still name
                connection.execute(sqlalchemy.text("SET LOCAL session_replication_role = replica"))
            for statement in statements:
                connection.execute(sqlalchemy.text(statement), params)
    finally:
        engine.dispose()


async def read(run: Run) -> list[SnapshotRow]:
    store = SqlStore(run.db, create=False)
    try:
        return await snapshots_table(store, run.id)
    finally:
        await store.close()


async def cli(run: Run, *args: str) -> Result:
    """The CLI's result; in a thread, since it runs its own event loop."""
    result = await asyncio.to_thread(CliRunner().invoke, main, [*args, "--db", run.db])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


async def the_damage(run: Run) -> tuple[str, list[str]]:
    """The second snapshot's reason and damaged agents; the first must be intact."""
    first, second = await read(run)
    assert (first.status, first.error, first.damaged_agents) == ("complete", None, [])
    assert second.status == "damaged"
    assert second.error is not None
    assert "\n" not in second.error
    return second.error, second.damaged_agents


# -- missing rows -----------------------------------------------------------------------------

DELETE_AGENT = "DELETE FROM agentsnap_snapshot_agents WHERE snapshot_id = :id AND agent = :agent"
# A snapshot stored as the changes to a base finds an unchanged agent's part in the base's row.
DELETE_PART = (
    "DELETE FROM agentsnap_snapshot_agents WHERE agent = :agent AND snapshot_id IN "
    "(SELECT id FROM agentsnap_snapshots WHERE id = :id UNION "
    "SELECT base_id FROM agentsnap_snapshots WHERE id = :id)"
)


async def test_a_deleted_agent_row_is_damage_everywhere_it_is_shown(run: Run) -> None:
    damage(run.db, DELETE_AGENT, id=run.second, agent="bob")
    reason, lost = await the_damage(run)
    assert "the part of 'bob' is missing" in reason
    assert lost == ["bob"]

    table = await cli(run, "snapshots", run.id)
    assert table.exit_code == 0
    rows = table.output.splitlines()
    assert rows[2].split()[:3] == ["2", run.second, "damaged"]
    assert rows[-1] == f"! snapshot 2 is damaged: {reason}"

    shown = await cli(run, "show", run.second)
    assert shown.exit_code == 0
    assert f"damaged: {reason}" in shown.output
    assert "missing or unreadable: bob" in shown.output
    assert "alice -> bob #1 relayed" in shown.output  # what could be read is shown
    only_bob = await cli(run, "show", run.second, "--agent", "bob", "--json")
    assert only_bob.exit_code == 0

    history = await cli(run, "history", run.id, "--agent", "bob")
    assert history.exit_code == 0
    assert f"snapshot 2  {run.second}" in history.output
    assert f"! damaged: {reason}" in history.output

    diff = await cli(run, "diff", run.first, run.second)
    assert diff.exit_code == 0
    assert f"! snapshot {run.second} is damaged: {reason}" in diff.output
    assert "agent bob: damaged" in diff.output

    store = SqlStore(run.db, create=False)
    try:
        doc = await show_snapshot(store, run.second, "bob")
        assert (doc.status, doc.agents, doc.damaged_agents) == ("damaged", {}, ["bob"])
        history_rows = await agent_history_table(store, run.id, "bob")
        assert [(r.seq, r.damaged, r.state) for r in history_rows] == [
            (1, None, {"count": 0, "memory": {}, "plan": [], "tool_calls": []}),
            (2, reason, None),
        ]
        changes = await diff_snapshots(store, run.first, run.second)
        assert (changes.a_damaged, changes.b_damaged) == (None, reason)
        assert {e.agent: e.change for e in changes.agents}["bob"] == "damaged"
        exported = await export_run(store, run.id)
    finally:
        await store.close()
    second = exported["snapshots"][1]
    assert (second["status"], second["error"], second["damaged_agents"]) == (
        "damaged",
        reason,
        ["bob"],
    )
    assert sorted(second["agents"]) == ["$env", "alice", "carol"]
    assert (await cli(run, "export", run.id)).exit_code == 0


async def test_an_agent_that_never_talked_is_missed_through_the_environment(run: Run) -> None:
    damage(run.db, DELETE_AGENT, id=run.second, agent="carol")
    reason, lost = await the_damage(run)
    assert "the part of 'carol' is missing" in reason
    assert lost == ["carol"]


async def test_a_snapshot_whose_agent_rows_are_all_gone_is_not_complete_and_empty(
    run: Run,
) -> None:
    damage(run.db, "DELETE FROM agentsnap_snapshot_agents WHERE snapshot_id = :id", id=run.second)
    reason, lost = await the_damage(run)
    assert "the part of '$env' is missing (the environment takes part in every cut)" in reason
    assert lost == ["$env", "alice", "bob"]  # carol is named by no row left
    shown = await cli(run, "snapshots", run.id)
    assert shown.output.splitlines()[2].split()[:3] == ["2", run.second, "damaged"]
    # The snapshot's own messages in flight are still all there is.
    doc = await cli(run, "show", run.second, "--json")
    assert '"agents": {}' in doc.output


async def test_a_deleted_state_blob(run: Run) -> None:
    damage(
        run.db,
        "DELETE FROM agentsnap_state_blobs WHERE hash = (SELECT state_hash FROM "
        "agentsnap_snapshot_agents WHERE snapshot_id = :id AND agent = 'alice')",
        id=run.second,
    )
    reason, lost = await the_damage(run)
    assert "the state of 'alice' is missing (the store holds no state blob" in reason
    assert lost == ["alice"]
    assert (await cli(run, "show", run.second)).exit_code == 0


# -- rows that were changed -------------------------------------------------------------------

EDIT_ALICES_STATE = (
    "UPDATE agentsnap_state_blobs SET state = :state WHERE hash = (SELECT state_hash FROM "
    "agentsnap_snapshot_agents WHERE snapshot_id = :id AND agent = 'alice')"
)


@pytest.mark.parametrize(
    ("state", "says"),
    [
        ("[1, 2]", "the state of 'alice' is a JSON array, not an object"),
        ('"text"', "the state of 'alice' is a JSON string, not an object"),
        ("{not json", "the state of 'alice' is not JSON"),
        (
            '{"count": 99, "memory": {}, "plan": [], "tool_calls": []}',
            "the state of 'alice' does not match its hash",
        ),
    ],
    ids=["array", "string", "not-json", "edited"],
)
async def test_a_state_blob_of_the_wrong_shape(run: Run, state: str, says: str) -> None:
    damage(run.db, EDIT_ALICES_STATE, state=state, id=run.second)
    reason, lost = await the_damage(run)
    assert says in reason
    assert lost == ["alice"]
    for args in (["show", run.second], ["history", run.id, "--agent", "alice"]):
        result = await cli(run, *args)
        assert result.exit_code == 0
        assert reason in result.output


EDIT_COUNTERS = (
    "UPDATE agentsnap_snapshot_agents SET {column} = :value WHERE snapshot_id = :id AND agent = :a"
)


@pytest.mark.parametrize(
    ("agent", "column", "value", "says"),
    [
        ("alice", "sent", "[1]", "the sent counters of 'alice' are not a JSON object"),
        ("alice", "sent", "garbage", "the sent counters of 'alice' are not a JSON object"),
        ("bob", "received", '{"$env": -1}', "the received counters of 'bob' are not a JSON"),
        ("bob", "received", '{"$env": "1"}', "the received counters of 'bob' are not a JSON"),
    ],
    ids=["array", "not-json", "negative", "string-count"],
)
async def test_broken_counters(run: Run, agent: str, column: str, value: str, says: str) -> None:
    damage(run.db, EDIT_COUNTERS.format(column=column), value=value, id=run.second, a=agent)
    reason, lost = await the_damage(run)
    assert says in reason
    assert lost == [agent]
    assert (await cli(run, "show", run.second)).exit_code == 0


async def test_counters_that_disagree_with_the_messages_in_flight(run: Run) -> None:
    damage(
        run.db,
        EDIT_COUNTERS.format(column="received"),
        value='{"$env": 0, "alice": 5}',
        id=run.second,
        a="bob",
    )
    reason, lost = await the_damage(run)
    assert "channel alice>bob: bob received 5 but alice had sent only 1" in reason
    assert lost == []


async def test_a_lost_message_in_flight(run: Run) -> None:
    damage(run.db, "DELETE FROM agentsnap_snapshot_messages WHERE snapshot_id = :id", id=run.second)
    reason, _ = await the_damage(run)
    assert reason == "channel alice>bob: in flight [], expected [1] (sent 1, received 0)"


async def test_a_message_in_flight_that_cannot_be_read(run: Run) -> None:
    damage(
        run.db,
        "UPDATE agentsnap_snapshot_messages SET payload = '{oops' WHERE snapshot_id = :id",
        id=run.second,
    )
    reason, _ = await the_damage(run)
    assert reason.startswith("message alice>bob#1 in flight cannot be read: its payload is not")
    assert (await cli(run, "show", run.second)).exit_code == 0


async def test_a_status_agentsnap_never_writes(run: Run) -> None:
    damage(run.db, "UPDATE agentsnap_snapshots SET status = 'bogus' WHERE id = :id", id=run.second)
    reason, _ = await the_damage(run)
    assert reason == "its status 'bogus' is not one agentsnap writes"


# -- the runtime never goes back to a damaged snapshot ------------------------------------------


async def resume(run: Run) -> Any:
    store = SqlStore(run.db)
    try:
        async with Runtime(store=store, run_id=run.id) as runtime:
            for name in AGENTS:
                runtime.add(Relay(name))
            cut = await runtime.resume()
            await runtime.run_until_idle()
            return cut.seq, {n: a.state.count for n, a in runtime.agents.items()}
    finally:
        await store.close()


async def test_resume_passes_over_a_damaged_snapshot(
    run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    damage(run.db, DELETE_AGENT, id=run.second, agent="bob")
    with caplog.at_level(logging.WARNING, logger="agentsnap.rollback"):
        seq, counts = await resume(run)
    assert seq == 1  # not snapshot 2: like a failed one
    assert f"snapshot 2 ({run.second}) is damaged in the store" in caplog.text
    # From snapshot 1 the run redoes everything: each agent handled its message once.
    assert counts == {"alice": 1, "bob": 1, "carol": 1}


async def test_resume_refuses_when_every_cut_is_damaged(run: Run) -> None:
    damage(
        run.db,
        "DELETE FROM agentsnap_snapshot_agents WHERE agent = '$env'",
    )
    with pytest.raises(SnapshotDamaged) as info:
        await resume(run)
    assert info.value.snapshot_id == run.second
    assert "no intact snapshot is left in its timeline" in str(info.value)
    assert f"agentsnap show {run.second}" in str(info.value)


async def test_a_rollback_to_a_damaged_snapshot_is_refused(empty_db: str) -> None:
    store = SqlStore(empty_db)
    try:
        async with Runtime(store=store) as runtime:
            for name in AGENTS:
                runtime.add(Relay(name))
            runtime.send("alice", {"to": "bob"})
            await runtime.run_until_idle()
            second = await runtime.snapshot()
            # At the first input, as the run went idle, and ``second``.
            (first, _, _) = await runtime.list_snapshots()
            damage(empty_db, DELETE_AGENT, id=first.id, agent="carol")
            with pytest.raises(SnapshotDamaged, match="the run cannot roll back to it"):
                await runtime.rollback(first.id, reason="go back")
            # The intact one is still a target.
            info = await runtime.rollback(second.id, reason="go back")
            assert info.snapshot_id == second.id
    finally:
        await store.close()


async def test_an_automatic_rollback_whose_target_is_damaged_stops_the_run(empty_db: str) -> None:
    store = SqlStore(empty_db)
    try:
        async with Runtime(store=store) as runtime:
            for name in AGENTS:
                runtime.add(Relay(name))
            # Alice's first message to bob passes, the second is rejected.
            runtime.check("alice", "relayed", check=lambda m: m.seq < 2, name="once")
            runtime.send("alice", {"to": "bob"})
            await runtime.run_until_idle()
            target = await runtime.snapshot()
            damage(empty_db, DELETE_PART, id=target.id, agent="bob")
            # The newest cut is normally restored from memory; make the runtime read it back.
            runtime._snapshots.latest = None
            runtime.send("alice", {"to": "bob"})
            with pytest.raises(SnapshotDamaged) as info:
                await runtime.run_until_idle()
            assert info.value.snapshot_id == target.id
            assert runtime.rollbacks == []
        assert "the run could not roll back to it after once rejected the output of 'alice'" in (
            str(info.value)
        )
        assert (await store.get_run(runtime.run_id)).status.value == "failed"
    finally:
        await store.close()


async def test_no_run_is_forked_from_a_damaged_snapshot(run: Run) -> None:
    damage(run.db, DELETE_AGENT, id=run.second, agent="bob")
    store = SqlStore(run.db, create=False)
    try:
        with pytest.raises(SnapshotDamaged, match="no run can be forked from it"):
            await fork_run(store, run.second)
        forked = await fork_run(store, run.first)  # an intact one can be
        assert forked.parent_snapshot_id == run.first
    finally:
        await store.close()
    refused = await cli(run, "fork", run.second)
    assert refused.exit_code == 1
    (line,) = refused.output.strip().splitlines()
    assert line.startswith(f"Error: snapshot {run.second} is damaged in the store")


def _cut(sent: dict[str, int], received: dict[str, int]) -> AgentCut:
    return AgentCut(state_json="{}", state_hash=content_hash("{}"), sent=sent, received=received)


def _complete(agents: dict[str, AgentCut], channels: list[ChannelRecord]) -> Snapshot:
    """A complete snapshot with these cuts and channels' messages in flight."""
    now = utcnow()
    return Snapshot(
        id="s",
        run_id="r",
        seq=2,
        initiator=ENVIRONMENT,
        status=SnapshotStatus.COMPLETE,
        started_at=now,
        completed_at=now,
        agents=agents,
        channels=channels,
    )


def test_the_consistency_check_finds_every_channel_however_it_is_named() -> None:
    # Channels named only by a sender, only by a receiver, only by messages in flight, and
    # by a process missing from the cut: each reported once, in the channels' order.
    stray = RecordedMessage(id="carol>alice#1", seq=1, kind="message")
    snapshot = _complete(
        {
            ENVIRONMENT: _cut({"alice": 1}, {}),
            "alice": _cut({"dave": 1}, {ENVIRONMENT: 1, "bob": 2}),
            "bob": _cut({}, {}),
            "carol": _cut({}, {}),
        },
        [ChannelRecord(src="carol", dst="alice", messages=[stray])],
    )
    assert cut_problems(snapshot) == [
        "channel alice>dave names a process missing from the cut",
        "channel bob>alice: alice received 2 but bob had sent only 0",
        "channel bob>alice: in flight [], expected [] (sent 0, received 2)",
        "channel carol>alice: in flight [1], expected [] (sent 0, received 0)",
    ]
    consistent = snapshot.model_copy(
        update={
            "agents": {**snapshot.agents, "alice": _cut({}, {ENVIRONMENT: 1})},
            "channels": [],
        }
    )
    assert cut_problems(consistent) == []


@pytest.mark.parametrize(
    ("alice_sent", "bob_received", "says"),
    [
        ({"bob": 3}, {"alice": 2}, "channel alice>bob: in flight [], expected [3]"),
        ({"bob": 2}, {"alice": 3}, "channel alice>bob: bob received 3 but alice had sent only 2"),
        ({}, {"alice": 1}, "channel alice>bob: bob received 1 but alice had sent only 0"),
    ],
)
def test_counters_that_disagree_with_nothing_in_flight_are_found(
    alice_sent: dict[str, int], bob_received: dict[str, int], says: str
) -> None:
    # A cut of a team at rest, as most are: the quick check of such cuts must still find a
    # message that was lost or received twice.
    snapshot = _complete(
        {
            ENVIRONMENT: _cut({"alice": 1, "bob": 1}, {}),
            "alice": _cut(alice_sent, {ENVIRONMENT: 1}),
            "bob": _cut({}, {ENVIRONMENT: 1, **bob_received}),
        },
        [],
    )
    assert says in cut_problems(snapshot)[0]
    fixed = {**snapshot.agents, "bob": _cut({}, {ENVIRONMENT: 1, "alice": 2})}
    agree = snapshot.model_copy(
        update={"agents": {**fixed, "alice": _cut({"bob": 2}, {ENVIRONMENT: 1})}}
    )
    assert cut_problems(agree) == []
