"""Long agent states are stored incrementally: their long lists in shared chunks.

A tool-using agent's history grows with every call; stored whole in every snapshot, a run
would take space quadratic in its length. These tests hold the store to what a user relies
on: every state reads back byte for byte (whole states of older databases too), a database
grows linearly with a run's tool calls, damage to a chunk is reported as a damaged
snapshot, and deleting the states nobody refers to keeps what other runs share.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentsnap import (
    Agent,
    AgentState,
    Context,
    JsonValue,
    Message,
    RunInfo,
    Runtime,
    Snapshot,
    SnapshotPolicy,
    SnapshotStatus,
    StoreRetry,
    tool,
)
from agentsnap.state import canonical_json, content_hash
from agentsnap.store import migrate
from agentsnap.store.chunks import (
    LEAF_MIN,
    WHOLE_BELOW,
    ChunkWrites,
    SplitMemo,
    StoredState,
    delete_unreferenced_states,
    join_state,
    split_state,
)
from agentsnap.store.sql import SqlStore

from .test_contract import make_cut, make_snapshot
from .test_one_statement_writes import FAILURES, conflict_on, rows_tried

AT = "2026-01-01 00:00:00.000000"
FAST = StoreRetry(timeout=5.0, deadline=30.0, first_wait=0.01, max_wait=0.1)


def call(i: int, run: str = "r") -> dict[str, JsonValue]:
    """A tool call as an agent's history holds it (about 300 characters of JSON)."""
    return {
        "tool": "search",
        "arguments": {"query": f"what happened on day {i} of {run}?", "limit": i % 50},
        "key": content_hash(f"{run}/{i}"),
        "status": "ok",
        "result": {"hits": i % 9, "summary": f"day {i}: nothing to report, as usual ✓"},
        "message_id": f"$env>worker#{i}",
        "attempts": 1,
        "error": None,
    }


def agent_state(calls: int, run: str = "r", talk: int = 0) -> dict[str, JsonValue]:
    """A state with ``calls`` tool calls and ``talk`` lines of conversation in memory."""
    return {
        "memory": {
            "conversation": [{"role": "user", "text": f"line {i} of {run}"} for i in range(talk)],
            "topic": run,
        },
        "plan": [{"description": "answer", "status": "in_progress", "note": None}],
        "tool_calls": [call(i, run) for i in range(calls)],
    }


def rebuild(stored: StoredState) -> str:
    assert stored.lists is not None
    assert stored.roots is not None
    return join_state(stored.state, stored.lists, stored.roots, stored.chunks)


def stored_chunks(text: str) -> dict[str, tuple[int, str]]:
    stored = split_state(text)
    return {} if stored is None else stored.chunks


# -- the stored form -------------------------------------------------------------------------


def test_a_long_state_is_stored_without_its_long_lists_and_rebuilt_exactly() -> None:
    text = canonical_json(agent_state(200, talk=150))
    stored = split_state(text)

    assert stored is not None
    assert rebuild(stored) == text
    # What stays in the row is the state with its long lists cut down to their tails.
    assert len(stored.state) < 2 * LEAF_MIN + 500
    kept: dict[str, Any] = json.loads(stored.state)
    assert kept["memory"]["topic"] == "r"
    assert kept["plan"] == [{"description": "answer", "note": None, "status": "in_progress"}]
    assert len(kept["tool_calls"]) < 200
    assert len(kept["memory"]["conversation"]) < 150
    assert stored.lists is not None
    assert len(json.loads(stored.lists)) == 2  # both long lists
    for chunk_hash, (_, body) in stored.chunks.items():
        assert content_hash(body) == chunk_hash


def test_short_states_and_text_that_is_not_compact_json_are_stored_whole() -> None:
    assert split_state(canonical_json(agent_state(20))) is None  # under WHOLE_BELOW
    long = canonical_json(agent_state(200))
    assert len(long) > WHOLE_BELOW
    assert split_state(long.replace(",", ", ")) is None  # whitespace: stored as it is
    assert split_state("[" + long + "]") is None  # not an object
    assert split_state(long[:-1]) is None  # not JSON
    few_long_items = canonical_json({"notes": ["x" * 9_000, "y" * 9_000]})
    stored = split_state(few_long_items)
    assert stored is not None
    assert rebuild(stored) == few_long_items


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    items=st.lists(json_values, min_size=1, max_size=30),
    repeat=st.integers(1, 40),
    key=st.text(min_size=1, max_size=8),
    extra=st.dictionaries(st.text(max_size=8), json_values, max_size=4),
)
def test_any_state_is_rebuilt_byte_for_byte(
    items: list[JsonValue], repeat: int, key: str, extra: dict[str, JsonValue]
) -> None:
    padding = '≈ padding with "quotes", brackets ] [ and braces } {'
    state: dict[str, JsonValue] = {
        **extra,
        key: [*items, *([padding] * 30 * repeat)],
        "nested": {"deeper": {"list": [padding] * 400, "after": [1, 2]}},
    }
    text = canonical_json(state)
    stored = split_state(text)
    assert stored is not None
    assert rebuild(stored) == text


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(
        st.tuples(
            st.sampled_from(["append", "rollback", "fork", "edit", "drop-first", "other"]),
            st.integers(0, 10_000),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_a_memo_of_earlier_splits_changes_nothing_stored(edits: list[tuple[str, int]]) -> None:
    memo, forgetful = SplitMemo(), SplitMemo(keys=1, characters=20_000)
    calls = [call(i) for i in range(120)]
    for kind, n in edits:
        if kind == "append":
            calls = calls + [call(len(calls) + k) for k in range(1 + n % 40)]
        elif kind == "rollback":
            calls = calls[: max(1, len(calls) - 1 - n % 60)]
        elif kind == "fork":
            calls = calls + [call(n + k, "fork") for k in range(1 + n % 7)]
        elif kind == "edit" and calls:  # dropping the first ones may have left none
            calls = [*calls]
            calls[n % len(calls)] = {**calls[n % len(calls)], "status": f"edited {n}"}
        elif kind == "drop-first":
            calls = calls[1 + n % 5 :]
        text = canonical_json(
            {"memory": {"other": [call(k, "x") for k in range(n % 200)]}, "tool_calls": calls}
            if kind == "other"
            else {"memory": {}, "tool_calls": calls}
        )
        assert split_state(text, memo) == split_state(text) == split_state(text, forgetful)


def test_appending_to_a_list_writes_what_changed_not_the_history() -> None:
    memo = SplitMemo()
    calls = [call(i) for i in range(400)]
    previous = stored_chunks(canonical_json({"tool_calls": calls[:100]}))
    sizes = []
    for count in range(101, 401):
        stored = split_state(canonical_json({"tool_calls": calls[:count]}), memo)
        assert stored is not None
        new = {h: chunk for h, chunk in stored.chunks.items() if h not in previous}
        assert sum(1 for height, _ in new.values() if height == 0) <= 1  # one leaf at most
        assert len(new) <= 1 + 9  # and the nodes it completes
        sizes.append(len(stored.state) + len(stored.roots or "") + len(stored.lists or ""))
        previous = stored.chunks
    # The row itself grows with the logarithm of the history at most.
    assert max(sizes[-100:]) < 2 * max(sizes[:100])


def test_a_fork_shares_the_chunks_of_the_common_history() -> None:
    common = [call(i) for i in range(400)]
    one = canonical_json({"tool_calls": [*common, *(call(i, "one") for i in range(100))]})
    two = canonical_json({"tool_calls": [*common, *(call(i, "two") for i in range(100))]})
    prefix = stored_chunks(canonical_json({"tool_calls": common}))
    leaves_of_prefix = {h for h, (height, _) in prefix.items() if height == 0}

    shared = stored_chunks(one).keys() & stored_chunks(two).keys()

    # Every leaf of the common history but the last (which the fork may complete) is shared.
    assert len(shared & leaves_of_prefix) >= len(leaves_of_prefix) - 1
    assert any(prefix[h][0] > 2 for h in shared & prefix.keys())  # and the subtrees over them


# -- a store ----------------------------------------------------------------------------------


def growing_snapshots(run_id: str, count: int, start: int = 150) -> list[Snapshot]:
    """Snapshots of two agents whose histories grow by one call each time."""
    snapshots = []
    for k in range(count):
        agents = {
            "$env": make_cut({}),
            "worker": make_cut(agent_state(start + k, run_id)),
            "talker": make_cut(agent_state(10, "t", talk=400 + 3 * k)),
            "small": make_cut({"count": k}),
        }
        snapshots.append(make_snapshot(run_id, k + 1, agents=agents, channels=[]))
    return snapshots


def rows(url: str, query: str, **params: Any) -> list[Any]:
    engine = sa.create_engine(migrate.sync_url(url))
    try:
        with engine.begin() as conn:
            result = conn.execute(sa.text(query), params)
            return list(result) if result.returns_rows else []
    finally:
        engine.dispose()


@contextmanager
def connection(url: str) -> Iterator[sa.Connection]:
    engine = sa.create_engine(migrate.sync_url(url))
    try:
        with engine.begin() as conn:
            yield conn
    finally:
        engine.dispose()


def assert_same(read: Snapshot, written: Snapshot) -> None:
    assert read.status is SnapshotStatus.COMPLETE, read.error
    assert read.model_dump() == written.model_dump()


async def test_chunked_states_read_back_exactly_everywhere(sql_store: SqlStore) -> None:
    run = RunInfo(id=uuid.uuid4().hex)
    await sql_store.create_run(run)
    snapshots = growing_snapshots(run.id, 12)
    for snapshot in snapshots:
        await sql_store.save_snapshot(snapshot)

    for read, written in zip(await sql_store.list_snapshots(run.id), snapshots, strict=True):
        assert_same(read, written)
    assert_same(await sql_store.load_snapshot(snapshots[5].id), snapshots[5])
    history = await sql_store.agent_history(run.id, "worker")
    assert [v.cut for v in history] == [s.agents["worker"] for s in snapshots]

    # A second store (no cache) reads them and writes on top of them.
    again = SqlStore(sql_store.url)
    try:
        more = growing_snapshots(run.id, 14)[12:]
        for snapshot in more:
            await again.save_snapshot(snapshot)
        for read, written in zip(await again.list_snapshots(run.id), snapshots + more, strict=True):
            assert_same(read, written)
    finally:
        await again.close()

    stored = rows(
        sql_store.url,
        "SELECT hash, lists, roots FROM agentsnap_state_blobs WHERE hash = :h",
        h=snapshots[-1].agents["worker"].state_hash,
    )
    assert stored[0].lists is not None
    assert rows(
        sql_store.url,
        "SELECT hash FROM agentsnap_state_blobs WHERE hash = :h AND lists IS NULL",
        h=snapshots[-1].agents["small"].state_hash,
    )


async def test_states_stored_whole_still_read(sql_store: SqlStore) -> None:
    run = RunInfo(id=uuid.uuid4().hex)
    await sql_store.create_run(run)
    (snapshot,) = growing_snapshots(run.id, 1, start=300)
    await sql_store.save_snapshot(snapshot)
    # As a store before chunks wrote them: the whole texts, no chunks.
    for cut in snapshot.agents.values():
        rows(
            sql_store.url,
            "UPDATE agentsnap_state_blobs SET state = :state, lists = NULL, roots = NULL "
            "WHERE hash = :h",
            state=cut.state_json,
            h=cut.state_hash,
        )
    rows(sql_store.url, "DELETE FROM agentsnap_state_chunks")

    reader = SqlStore(sql_store.url)
    try:
        assert_same(await reader.load_snapshot(snapshot.id), snapshot)
    finally:
        await reader.close()


async def test_an_older_database_is_upgraded_and_downgraded_with_its_states(
    empty_db: str,
) -> None:
    migrate.upgrade(empty_db, "0008")
    run = RunInfo(id=uuid.uuid4().hex)
    old, new = growing_snapshots(run.id, 2, start=300)
    big = old.agents["worker"]
    with connection(empty_db) as conn:  # a run stored before 0009, its big state whole
        conn.execute(
            sa.text(
                "INSERT INTO agentsnap_runs (id, created_at, metadata) VALUES (:id, :at, '{}')"
            ),
            {"id": run.id, "at": AT},
        )
        conn.execute(
            sa.text(
                "INSERT INTO agentsnap_snapshots (id, run_id, seq, initiator, status, "
                "started_at, completed_at) VALUES (:id, :run, 1, '$env', 'complete', :at, :at)"
            ),
            {"id": old.id, "run": run.id, "at": AT},
        )
        for name, cut in old.agents.items():
            conn.execute(
                sa.text(
                    "INSERT INTO agentsnap_state_blobs (hash, state) VALUES (:h, :s) "
                    "ON CONFLICT DO NOTHING"
                ),
                {"h": cut.state_hash, "s": cut.state_json},
            )
            conn.execute(
                sa.text(
                    "INSERT INTO agentsnap_snapshot_agents VALUES (:id, :agent, :h, '{}', '{}')"
                ),
                {"id": old.id, "agent": name, "h": cut.state_hash},
            )

    migrate.upgrade(empty_db)
    store = SqlStore(empty_db)
    try:
        assert (await store.load_snapshot(old.id)).agents == old.agents
        await store.save_snapshot(new)  # chunked, sharing nothing stored whole
        assert_same(await store.load_snapshot(new.id), new)
    finally:
        await store.close()
    assert rows(empty_db, "SELECT count(*) FROM agentsnap_state_chunks")[0][0] > 0

    migrate.downgrade(empty_db, "0008")
    for snapshot in (old, new):
        for cut in snapshot.agents.values():
            ((state,),) = rows(
                empty_db,
                "SELECT state FROM agentsnap_state_blobs WHERE hash = :h",
                h=cut.state_hash,
            )
            assert state == cut.state_json
    assert big.state_hash in {
        r[0] for r in rows(empty_db, "SELECT hash FROM agentsnap_state_blobs")
    }


# -- damage --------------------------------------------------------------------------------------


def a_leaf_of(snapshot: Snapshot, agent: str = "worker") -> str:
    stored = split_state(snapshot.agents[agent].state_json)
    assert stored is not None
    return next(h for h, (height, _) in stored.chunks.items() if height == 0)


async def damaged(store: SqlStore, snapshot: Snapshot) -> tuple[str, list[str]]:
    reader = SqlStore(store.url)  # no cache in the way
    try:
        read = await reader.load_snapshot(snapshot.id)
    finally:
        await reader.close()
    assert read.status is SnapshotStatus.DAMAGED
    assert read.error is not None
    assert "\n" not in read.error
    return read.error, read.damaged_agents


@pytest.fixture
async def stored(sql_store: SqlStore) -> Snapshot:
    run = RunInfo(id=uuid.uuid4().hex)
    await sql_store.create_run(run)
    (snapshot,) = growing_snapshots(run.id, 1)
    await sql_store.save_snapshot(snapshot)
    return snapshot


async def test_a_missing_chunk_is_a_damaged_snapshot(sql_store: SqlStore, stored: Snapshot) -> None:
    leaf = a_leaf_of(stored)
    rows(sql_store.url, "DELETE FROM agentsnap_state_chunks WHERE hash = :h", h=leaf)

    reason, lost = await damaged(sql_store, stored)

    assert f"the state of 'worker' is incomplete (the store holds no state chunk {leaf[:12]})" in (
        reason
    )
    assert lost == ["worker"]


async def test_an_edited_chunk_is_a_damaged_snapshot(sql_store: SqlStore, stored: Snapshot) -> None:
    leaf = a_leaf_of(stored)
    rows(
        sql_store.url,
        "UPDATE agentsnap_state_chunks SET body = REPLACE(body, 'nothing', 'NOTHING') "
        "WHERE hash = :h",
        h=leaf,
    )

    reason, lost = await damaged(sql_store, stored)

    assert f"its state chunk {leaf[:12]} does not match its hash" in reason
    assert lost == ["worker"]


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        ("lists", "[[1,", "its column lists is not JSON"),
        ("lists", '[["a",1]]', "its column lists is not a list of [offset, leaves]"),
        ("roots", "abc", "its column roots holds"),
        ("lists", "[[5,1000000]]", "its column roots holds"),
    ],
    ids=["not-json", "wrong-shape", "short-roots", "wrong-count"],
)
async def test_an_edited_state_row_is_a_damaged_snapshot(
    sql_store: SqlStore, stored: Snapshot, column: str, value: str, says: str
) -> None:
    rows(
        sql_store.url,
        f"UPDATE agentsnap_state_blobs SET {column} = :v WHERE hash = :h",
        v=value,
        h=stored.agents["worker"].state_hash,
    )

    reason, lost = await damaged(sql_store, stored)

    assert f"the state of 'worker' is damaged ({says}" in reason
    assert lost == ["worker"]


async def test_an_edited_tail_does_not_match_the_state_hash(
    sql_store: SqlStore, stored: Snapshot
) -> None:
    rows(
        sql_store.url,
        "UPDATE agentsnap_state_blobs SET state = REPLACE(state, 'in_progress', 'in_progres!') "
        "WHERE hash = :h",
        h=stored.agents["worker"].state_hash,
    )

    reason, lost = await damaged(sql_store, stored)

    assert "the state of 'worker' does not match its hash" in reason
    assert lost == ["worker"]


# -- deleting what nobody refers to -------------------------------------------------------------


def forget_run(conn: sa.Connection, run_id: str) -> None:
    """Delete a run's snapshots, as run deletion does (the states stay)."""
    ids = "SELECT id FROM agentsnap_snapshots WHERE run_id = :run"
    conn.execute(
        sa.text(f"DELETE FROM agentsnap_snapshot_agents WHERE snapshot_id IN ({ids})"),
        {"run": run_id},
    )
    conn.execute(sa.text("DELETE FROM agentsnap_snapshots WHERE run_id = :run"), {"run": run_id})


def reachable(snapshots: list[Snapshot]) -> tuple[set[str], set[str]]:
    """The state hashes and chunk hashes that ``snapshots`` refer to."""
    states: set[str] = set()
    chunks: set[str] = set()
    for snapshot in snapshots:
        for cut in snapshot.agents.values():
            states.add(cut.state_hash)
            chunks.update(stored_chunks(cut.state_json))
    return states, chunks


async def test_deleting_unreferenced_states_keeps_what_other_runs_share(empty_db: str) -> None:
    store = SqlStore(empty_db)
    first, second = RunInfo(id="first"), RunInfo(id="second")
    try:
        for run in (first, second):
            await store.create_run(run)
        # The second run shares the first one's history up to 150 calls, then diverges.
        gone = growing_snapshots(first.id, 6, start=150)
        kept = growing_snapshots(second.id, 4, start=160)
        for snapshot in gone + kept:
            await store.save_snapshot(snapshot)
    finally:
        await store.close()
    gone_states, gone_chunks = reachable(gone)
    kept_states, kept_chunks = reachable(kept)
    assert gone_chunks & kept_chunks  # the runs do share chunks
    assert gone_chunks - kept_chunks  # and each has its own

    with connection(empty_db) as conn:
        forget_run(conn, first.id)
        deleted = delete_unreferenced_states(conn)

    assert deleted == len(gone_states - kept_states) + len(gone_chunks - kept_chunks)
    assert {r[0] for r in rows(empty_db, "SELECT hash FROM agentsnap_state_blobs")} == kept_states
    assert {r[0] for r in rows(empty_db, "SELECT hash FROM agentsnap_state_chunks")} == kept_chunks
    with connection(empty_db) as conn:
        assert delete_unreferenced_states(conn) == 0
    reader = SqlStore(empty_db)
    try:
        for read, written in zip(await reader.list_snapshots(second.id), kept, strict=True):
            assert_same(read, written)
    finally:
        await reader.close()


async def test_a_store_writes_again_what_was_deleted_under_it(empty_db: str) -> None:
    store = SqlStore(empty_db, retry=FAST)
    first, second = RunInfo(id="first"), RunInfo(id="second")
    try:
        for run in (first, second):
            await store.create_run(run)
        for snapshot in growing_snapshots(first.id, 3):
            await store.save_snapshot(snapshot)
        # Another process deletes the first run and its states; this store's caches say
        # they are stored. The second run holds the same states, then one call more.
        with connection(empty_db) as conn:
            forget_run(conn, first.id)
            assert delete_unreferenced_states(conn) > 0
        later = growing_snapshots(second.id, 4)[2:]
        for snapshot in later:
            await store.save_snapshot(snapshot)
        for read, written in zip(await store.list_snapshots(second.id), later, strict=True):
            assert_same(read, written)
    finally:
        await store.close()


async def test_a_new_state_does_not_rely_on_chunks_deleted_under_the_store(
    empty_db: str,
) -> None:
    store = SqlStore(empty_db, retry=FAST)
    first, second = RunInfo(id="first"), RunInfo(id="second")
    try:
        for run in (first, second):
            await store.create_run(run)
        for snapshot in growing_snapshots(first.id, 3):
            await store.save_snapshot(snapshot)
        with connection(empty_db) as conn:
            forget_run(conn, first.id)
            delete_unreferenced_states(conn)
        # Every state is new to the store, but the conversation's chunks are in its cache.
        talk = agent_state(10, "t", talk=500)
        snapshot = make_snapshot(
            second.id,
            1,
            agents={"$env": make_cut({"new": True}), "talker": make_cut(talk)},
            channels=[],
        )
        await store.save_snapshot(snapshot)
        assert_same(await store.load_snapshot(snapshot.id), snapshot)
    finally:
        await store.close()


async def test_a_retried_write_leaves_every_chunk_stored(
    sql_store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqlStore(sql_store.url, retry=FAST)
    run = RunInfo(id=uuid.uuid4().hex)
    failures: list[str] = []

    # The first write of chunks fails after sending them, as a lock or a dropped
    # connection would make it: its transaction is rolled back and retried. (PostgreSQL
    # writes a snapshot with one statement: there the database refuses its first chunks.)
    def fail_once(kind: str) -> None:
        if not failures:
            failures.append(kind)
            error = sqlite3.OperationalError("database is locked")
            error.sqlite_errorcode = sqlite3.SQLITE_BUSY
            raise error

    write, write_async = ChunkWrites.write, ChunkWrites.write_async

    def flaky_write(self: ChunkWrites, connection: sqlite3.Connection) -> None:
        write(self, connection)
        fail_once("sqlite3")

    async def flaky_write_async(self: ChunkWrites, connection: Any) -> None:
        await write_async(self, connection)
        try:
            fail_once("driver")
        except sqlite3.OperationalError as exc:
            raise sa.exc.OperationalError("INSERT", {}, exc) from exc

    monkeypatch.setattr(ChunkWrites, "write", flaky_write)
    monkeypatch.setattr(ChunkWrites, "write_async", flaky_write_async)
    refusing = None
    try:
        await store.create_run(run)
        if store.url.startswith("postgresql"):
            refusing = conflict_on(store.url, "agentsnap_state_chunks")
        snapshots = growing_snapshots(run.id, 3)
        for snapshot in snapshots:
            await store.save_snapshot(snapshot)
        if refusing is None:
            assert failures
        else:
            assert rows_tried(refusing) > FAILURES
            refusing.dispose()
        reader = SqlStore(store.url)
        try:
            for read, written in zip(await reader.list_snapshots(run.id), snapshots, strict=True):
                assert_same(read, written)
        finally:
            await reader.close()
    finally:
        await store.close()


# -- a run of a tool-using agent ------------------------------------------------------------------


@tool
async def lookup(question: str, day: int) -> dict[str, JsonValue]:
    """Look something up (no side effect)."""
    return {"day": day, "answer": f"the answer to {question!r} is in the archive, shelf {day % 40}"}


class Researcher(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        day = message.payload_as(dict[str, int])["day"]
        await lookup(ctx, question=f"what happened on day {day}?", day=day)


def database_bytes(path: Path) -> int:
    """The SQLite file's size once its WAL is checkpointed into it and truncated."""
    with closing(sqlite3.connect(path)) as conn:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0
    return path.stat().st_size


async def test_a_database_grows_linearly_with_an_agents_tool_calls(tmp_path: Path) -> None:
    path = tmp_path / "run.db"
    store = SqlStore(f"sqlite:///{path}")
    measured: dict[int, int] = {}
    try:
        # A snapshot after every delivery: one after each tool call.
        policy = SnapshotPolicy(every_deliveries=1)
        async with Runtime(store=store, snapshot_policy=policy) as runtime:
            runtime.add(Researcher("researcher"))
            for day in range(1, 1_001):
                runtime.send("researcher", {"day": day})
                await runtime.run_until_idle()
                if day in {200, 1_000}:
                    measured[day] = database_bytes(path)
            history = await store.agent_history(runtime.run_id, "researcher")
        final = runtime.agents["researcher"].state
    finally:
        await store.close()

    assert len(final.tool_calls) == 1_000
    calls = [len(json.loads(v.cut.state_json)["tool_calls"]) for v in history if v.cut]
    assert set(calls) == set(range(1_001))  # a snapshot after each call, read back
    last = history[-1].cut
    assert last is not None
    assert last.state_json == canonical_json(final.model_dump(mode="json"))
    # Linear growth would make this 5; storing every state whole makes it about 25.
    assert measured[1_000] <= 6 * measured[200], measured
