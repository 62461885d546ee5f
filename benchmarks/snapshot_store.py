"""Cost of keeping snapshots and the message journal in SQLite, against plain sqlite3.

Four figures. The timed ones come from interleaved repetitions (reference and agentsnap
alternately, the order flipped on every repetition). Times are medians over the repetitions;
each ratio is the median of the per-repetition ratios, so that both sides of a ratio ran
seconds apart on the same (shared, noisy) machine:

* persist: one snapshot of 100 agents, each with a distinct state of about 10 KB of canonical
  JSON, plus the ``$env`` process and a few in-flight messages, encoded and written to a
  fresh SQLite file (schema migrated and run created before the clock starts). The clock
  starts before the states are encoded, on both sides. agentsnap encodes each state as the
  runtime does when it records one it has not seen (``encode_checked``: canonical JSON, its
  hash, the round-trip check), builds the ``Snapshot`` and saves it with
  ``SqlStore.save_snapshot``; the stdlib ``sqlite3`` side encodes each state with pydantic's
  ``model_dump_json`` and its SHA-256, the counters and payloads with ``json.dumps``, and
  inserts the rows into the same table layout in one transaction, on a fresh file with the
  same pragmas (WAL, ``synchronous=NORMAL``, foreign keys on). Reported as
  ``persist_ratio_vs_raw_sqlite = agentsnap time / sqlite3 time``. For context, a third
  snapshot with 100 new states is then encoded and written by the same store, whose SQL
  statements are compiled by now: ``warm_persist_ratio_vs_raw_sqlite``; the second one
  (below) is timed from the encoding of its one new state too.
* incremental bytes: a second snapshot of the same run in which 1 % of the agents (1 of 100)
  has a new state. Bytes written are the growth of the database file (checkpointed with
  ``PRAGMA wal_checkpoint(TRUNCATE)`` from a separate connection) across each snapshot.
  Reported as ``incremental_bytes_ratio = second / first``, next to the bytes the WAL received
  and the logical bytes (new state texts plus row payloads) of each snapshot.
* tool history: a ``Runtime`` on a ``SqlStore`` (SQLite) runs one agent that makes
  1,000 tool calls through the tool API (``@tool``), one per message, with a snapshot after
  every delivery (``SnapshotPolicy(every_deliveries=1)``), so a snapshot after each call,
  each holding the whole call history so far. The database file is measured (checkpointed
  as above) after 200 and after 1,000 calls. Reported as
  ``tool_history_bytes_ratio_1000_vs_200 = bytes at 1,000 / bytes at 200`` (5 is linear
  growth; a store that kept every state whole would grow with the square of the calls),
  with both sizes (``tool_history_db_bytes_200``, ``tool_history_db_bytes_1000``), the
  length of the final state and the seconds the run took. Measured once per run of this
  program (it is a size, not a time).
* journal: a ring of 6 agents passing 4 tokens (the ring of ``bus.py``) for a fixed number
  of messages, on a ``SqlStore`` with the journal (``Runtime(journal=True)``, the default
  with a database) against one with ``journal=False``, timed from the first send until
  ``run_until_idle()`` returns (journal writes included). Reported as
  ``journal_throughput_ratio = with / without`` (rates), with both rates. The message
  count is calibrated at start-up so that a run without the journal lasts about a second
  (0.25 s with ``--quick``).

Each SQLite file is new and lives in a temporary directory (``--dir`` chooses where). The
program exits with status 1 if a journaled run's journal misses messages.
``--json`` prints a single JSON object on stdout; ``--quick`` runs smaller and fewer
repetitions (under a minute, most of it the tool-history run, which is the same in both
profiles). Run it from the repository root with:

    python benchmarks/snapshot_store.py
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import random
import sqlite3
import statistics
import sys
import time
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import workloads

from agentsnap import (
    ENVIRONMENT,
    Agent,
    AgentCut,
    AgentState,
    ChannelRecord,
    Context,
    JsonValue,
    Message,
    RecordedMessage,
    RunInfo,
    Runtime,
    Snapshot,
    SnapshotPolicy,
    SnapshotStatus,
    tool,
)
from agentsnap.journal import read_journal
from agentsnap.records import utcnow
from agentsnap.state import StateBlob, canonical_json, encode_checked, encode_state
from agentsnap.store.sql import SqlStore

TARGET_PERSIST_RATIO = 1.5
TARGET_INCREMENTAL_BYTES_RATIO = 0.05
TARGET_JOURNAL_THROUGHPUT_RATIO = 0.5
TARGET_TOOL_HISTORY_BYTES_RATIO = 6.0

AGENTS = 100
STATE_BYTES = 10_000  # each agent's state is at least this long as canonical JSON
CHANGED_AGENTS = 1  # agents with a new state in the second snapshot (1 % of 100)
IN_FLIGHT_CHANNELS = 3  # channels with messages in flight at each cut ...
IN_FLIGHT_PER_CHANNEL = 2  # ... and how many on each
SEED = 20_261_122
TOOL_CALLS = 1_000  # calls of the tool-history run ...
TOOL_CALLS_EARLY = 200  # ... and when its database is measured first

# name: (persist repetitions, ring repetitions, target seconds of one ring run)
PROFILES: dict[str, tuple[int, int, float]] = {
    "full": (15, 9, 1.0),
    "quick": (7, 5, 0.25),
}

# -- the snapshots written ---------------------------------------------------------------------


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(workloads.word(rng) for _ in range(words)).capitalize() + "."


def make_state(index: int, version: int) -> AgentState:
    """A distinct state of about ``STATE_BYTES`` of canonical JSON, as the runtime encodes it."""
    rng = random.Random(f"{SEED}/{index}/{version}")
    plan, calls = workloads.plan_and_calls(rng, _sentence, f"{index}-{version}")
    memory: dict[str, Any] = {"agent": index, "version": version, "facts": {}, "notes": []}
    while True:
        state = AgentState(memory=memory, plan=plan, tool_calls=calls)
        blob = encode_state(f"agent-{index}", state)
        missing = STATE_BYTES - len(blob.json)
        if missing <= 0:
            return state
        workloads.add_notes(rng, _sentence, memory["notes"], memory["facts"], missing)


def _names() -> list[str]:
    return [f"agent-{i:03d}" for i in range(AGENTS)]


def make_snapshot(
    run_id: str, seq: int, states: list[StateBlob], delivered: int, started_at: datetime
) -> Snapshot:
    """A complete snapshot of a ring of ``AGENTS`` agents fed by ``$env``.

    Agent ``i`` sends to agent ``i + 1``; ``delivered`` sets the channel counters, so later
    snapshots carry new counters for every agent (as they would in a run).
    """
    names = _names()
    env_blob = StateBlob("{}")
    agents: dict[str, AgentCut] = {
        ENVIRONMENT: AgentCut(
            state_json=env_blob.json,
            state_hash=env_blob.hash,
            sent={names[0]: workloads.RING_TOKENS},
        )
    }
    for i, (name, blob) in enumerate(zip(names, states, strict=True)):
        received = {names[i - 1]: delivered + (i - 1) % AGENTS + 1}  # all its peer sent
        if i == 0:
            received[ENVIRONMENT] = workloads.RING_TOKENS
        agents[name] = AgentCut(
            state_json=blob.json,
            state_hash=blob.hash,
            sent={names[(i + 1) % AGENTS]: delivered + i + 1},
            received=received,
        )
    channels: list[ChannelRecord] = []
    for c in range(IN_FLIGHT_CHANNELS):
        src, dst = names[c * 31], names[c * 31 + 1]
        sent = agents[src].sent[dst]
        messages = [
            RecordedMessage(
                id=f"{src}>{dst}#{sent - k}",
                seq=sent - k,
                kind="message",
                payload={"t": k, "h": sent - k, "text": f"token {k} on its way to {dst}"},
                headers={"trace": f"{seq}-{c}-{k}"},
                epoch=seq - 1,
            )
            for k in reversed(range(IN_FLIGHT_PER_CHANNEL))
        ]
        channels.append(ChannelRecord(src=src, dst=dst, messages=messages))
        # A consistent cut: the receiver has not taken what is in flight to it.
        received = {**agents[dst].received, src: sent - IN_FLIGHT_PER_CHANNEL}
        agents[dst] = agents[dst].model_copy(update={"received": received})
    return Snapshot(
        id=f"{seq:08x}{run_id[8:]}",
        run_id=run_id,
        seq=seq,
        initiator=ENVIRONMENT,
        status=SnapshotStatus.COMPLETE,
        started_at=started_at,
        completed_at=started_at + timedelta(milliseconds=40),
        agents=agents,
        channels=channels,
    )


@dataclass(frozen=True)
class Cut:
    """What one snapshot is made of before anything is encoded: the agents' states."""

    seq: int
    delivered: int
    started_at: datetime
    states: list[AgentState | StateBlob]
    """Each agent's state: a new one to encode, or the blob of one encoded before."""

    def build(self, run_id: str) -> Snapshot:
        """The snapshot, its new states encoded as the runtime encodes them when it records
        them (canonical JSON, hash, and the round-trip check of a state not seen before)."""
        blobs = [
            state if isinstance(state, StateBlob) else encode_checked(name, state)
            for name, state in zip(_names(), self.states, strict=True)
        ]
        return make_snapshot(run_id, self.seq, blobs, self.delivered, self.started_at)


@dataclass(frozen=True)
class Fixture:
    """The run and the snapshots every repetition writes."""

    run: RunInfo
    first: Snapshot
    """``AGENTS`` distinct states, on a fresh store."""
    second: Snapshot
    """``CHANGED_AGENTS`` new states, the others as in ``first``."""
    third: Snapshot
    """``AGENTS`` new states again, written by the same (warm) store after ``second``."""
    cuts: tuple[Cut, Cut, Cut]
    """The three snapshots before encoding: what the timed writes start from."""
    first_states: list[AgentState]
    """The states of ``first``, for the sqlite3 side to encode."""


def make_fixture() -> Fixture:
    """Build the run and its three snapshots (300 states of about ``STATE_BYTES`` each)."""
    run = RunInfo(id=random.Random(SEED).randbytes(16).hex(), metadata={"benchmark": True})
    names = _names()
    states = [make_state(i, 0) for i in range(AGENTS)]
    blobs = [encode_state(name, state) for name, state in zip(names, states, strict=True)]
    changed = {round((k + 0.5) * AGENTS / CHANGED_AGENTS) for k in range(CHANGED_AGENTS)}
    later: list[AgentState | StateBlob] = [
        make_state(i, 1) if i in changed else blob for i, blob in enumerate(blobs)
    ]
    fresh = [make_state(i, 2) for i in range(AGENTS)]
    started = utcnow()
    cuts = (
        Cut(1, 1_000, started, list(states)),
        Cut(2, 1_500, started + timedelta(seconds=1), later),
        Cut(3, 2_000, started + timedelta(seconds=2), list(fresh)),
    )
    first, second, third = (cut.build(run.id) for cut in cuts)
    return Fixture(run, first, second, third, cuts, states)


def logical_bytes(snapshot: Snapshot, stored: set[str]) -> int:
    """Bytes of what a snapshot adds: state texts not in ``stored``, plus every row's payload.

    Text columns count their UTF-8 length, JSON columns their compact JSON, integers 8 bytes
    and timestamps 26 (their ISO text).
    """
    new = {cut.state_hash: cut.state_json for cut in snapshot.agents.values()}
    total = sum(len(h) + len(text.encode()) for h, text in new.items() if h not in stored)
    total += len(snapshot.id) + len(snapshot.run_id) + 8 + len(snapshot.initiator)
    total += len(snapshot.status.value) + 2 * 26
    for name, cut in snapshot.agents.items():
        total += len(snapshot.id) + len(name.encode()) + len(cut.state_hash)
        total += len(canonical_json(cut.sent).encode()) + len(canonical_json(cut.received).encode())
    for channel in snapshot.channels:
        for m in channel.messages:
            total += len(snapshot.id) + len(channel.src) + len(channel.dst) + 8 + len(m.kind)
            total += len(canonical_json(m.payload).encode()) + 8
            total += len(canonical_json(dict(m.headers)).encode())
    return total


# -- SQLite files --------------------------------------------------------------------------------


def checkpointed_size(path: Path) -> int:
    """Size of the database file once the WAL is checkpointed into it and truncated.

    The checkpoint runs on a separate connection; the file size then equals
    ``page_count * page_size``, which is checked.
    """
    with closing(sqlite3.connect(path)) as conn:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0, f"the checkpoint of {path} was blocked"
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    size = path.stat().st_size
    assert size == pages * page_size, (size, pages, page_size)
    return size


def wal_size(path: Path) -> int:
    """Bytes in the WAL file (frames written since the last truncating checkpoint)."""
    wal = Path(f"{path}-wal")
    return wal.stat().st_size if wal.exists() else 0


# The table layout of agentsnap's schema (migration 0001), without SQLAlchemy in the way.
RAW_SCHEMA = """
CREATE TABLE runs (
    id VARCHAR(64) NOT NULL PRIMARY KEY,
    created_at DATETIME NOT NULL,
    parent_run_id VARCHAR(64),
    parent_snapshot_id VARCHAR(64),
    metadata TEXT NOT NULL
);
CREATE TABLE state_blobs (hash VARCHAR(64) NOT NULL PRIMARY KEY, state TEXT NOT NULL);
CREATE TABLE snapshots (
    id VARCHAR(64) NOT NULL PRIMARY KEY,
    run_id VARCHAR(64) NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    initiator VARCHAR(128) NOT NULL,
    status VARCHAR(16) NOT NULL,
    started_at DATETIME NOT NULL,
    completed_at DATETIME,
    error TEXT,
    UNIQUE (run_id, seq)
);
CREATE INDEX ix_snapshots_run_id ON snapshots (run_id);
CREATE TABLE snapshot_agents (
    snapshot_id VARCHAR(64) NOT NULL REFERENCES snapshots (id) ON DELETE CASCADE,
    agent VARCHAR(128) NOT NULL,
    state_hash VARCHAR(64) NOT NULL REFERENCES state_blobs (hash),
    sent TEXT NOT NULL,
    received TEXT NOT NULL,
    PRIMARY KEY (snapshot_id, agent)
);
CREATE INDEX ix_snapshot_agents_state_hash ON snapshot_agents (state_hash);
CREATE TABLE snapshot_messages (
    snapshot_id VARCHAR(64) NOT NULL REFERENCES snapshots (id) ON DELETE CASCADE,
    src VARCHAR(128) NOT NULL,
    dst VARCHAR(128) NOT NULL,
    seq INTEGER NOT NULL,
    kind VARCHAR(128) NOT NULL,
    payload TEXT NOT NULL,
    headers TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    PRIMARY KEY (snapshot_id, src, dst, seq)
);
"""


def _sqlite_time(value: datetime | None) -> str | None:
    return None if value is None else value.replace(tzinfo=None).isoformat(" ")


@dataclass(frozen=True)
class RawInput:
    """One snapshot for sqlite3, as data not yet encoded (built before any timing)."""

    snapshot: tuple[Any, ...]
    states: list[tuple[str, AgentState]]
    counters: list[tuple[str, dict[str, int], dict[str, int]]]
    messages: list[tuple[Any, ...]]
    """Each message's key, kind and epoch, its payload and headers as data."""


def raw_input(snapshot: Snapshot, states: list[AgentState]) -> RawInput:
    """The rows SqlStore writes for ``snapshot``, with ``states`` (its agents' states, in
    order, ``$env`` left out) still to be encoded, and counters and payloads as data."""
    return RawInput(
        snapshot=(
            snapshot.id,
            snapshot.run_id,
            snapshot.seq,
            snapshot.initiator,
            snapshot.status.value,
            _sqlite_time(snapshot.started_at),
            _sqlite_time(snapshot.completed_at),
            snapshot.error,
        ),
        states=list(zip(_names(), states, strict=True)),
        counters=[
            (name, dict(cut.sent), dict(cut.received)) for name, cut in snapshot.agents.items()
        ],
        messages=[
            (
                snapshot.id,
                channel.src,
                channel.dst,
                m.seq,
                m.kind,
                m.payload,
                dict(m.headers),
                m.epoch,
            )
            for channel in snapshot.channels
            for m in channel.messages
        ],
    )


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def raw_save(path: Path, run: RunInfo, rows: RawInput) -> float:
    """Seconds for sqlite3 to encode and write ``rows`` in one transaction on a fresh file.

    The clock starts before the states are encoded: each with pydantic's
    ``model_dump_json`` and its SHA-256, counters and payloads with ``json.dumps``.
    """
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.executescript(RAW_SCHEMA)
        conn.execute(
            "INSERT INTO runs VALUES (?, ?, NULL, NULL, ?)",
            (run.id, _sqlite_time(run.created_at), canonical_json(run.metadata)),
        )
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # as on the SqlStore side
        gc.collect()
        start = time.perf_counter()
        env = "{}"
        hashes = {ENVIRONMENT: hashlib.sha256(env.encode()).hexdigest()}
        blobs = [(hashes[ENVIRONMENT], env)]
        for name, state in rows.states:
            text = state.model_dump_json()
            hashes[name] = hashlib.sha256(text.encode()).hexdigest()
            blobs.append((hashes[name], text))
        agents = [
            (rows.snapshot[0], name, hashes[name], _dumps(sent), _dumps(received))
            for name, sent, received in rows.counters
        ]
        messages = [
            (*key, kind, _dumps(payload), _dumps(headers), epoch)
            for *key, kind, payload, headers, epoch in rows.messages
        ]
        conn.execute("BEGIN")
        conn.execute("INSERT INTO snapshots VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows.snapshot)
        conn.executemany("INSERT OR IGNORE INTO state_blobs VALUES (?, ?)", blobs)
        conn.executemany("INSERT INTO snapshot_agents VALUES (?, ?, ?, ?, ?)", agents)
        conn.executemany("INSERT INTO snapshot_messages VALUES (?, ?, ?, ?, ?, ?, ?, ?)", messages)
        conn.execute("COMMIT")
        elapsed = time.perf_counter() - start
        (count,) = conn.execute("SELECT count(*) FROM snapshot_agents").fetchone()
        assert count == len(rows.counters), (count, len(rows.counters))
    finally:
        conn.close()
    return elapsed


@dataclass(frozen=True)
class StoreSample:
    """What one SqlStore repetition measured."""

    first_s: float
    second_s: float
    third_s: float
    first_db_bytes: int
    second_db_bytes: int
    first_wal_bytes: int
    second_wal_bytes: int


async def _timed_save(store: SqlStore, run_id: str, cut: Cut) -> float:
    """Seconds for ``store`` to save the snapshot of ``cut``, from before its new states are
    encoded; the garbage collected first."""
    gc.collect()
    start = time.perf_counter()
    await store.save_snapshot(cut.build(run_id))
    return time.perf_counter() - start


async def store_save(path: Path, fixture: Fixture, check: bool) -> StoreSample:
    """Write both snapshots with SqlStore on a fresh file; time each and measure the growth."""
    store = SqlStore(f"sqlite:///{path}")
    try:
        await store.create_run(fixture.run)  # migrates the empty database first
        base = checkpointed_size(path)
        first_s = await _timed_save(store, fixture.run.id, fixture.cuts[0])
        first_wal = wal_size(path)
        after_first = checkpointed_size(path)
        second_s = await _timed_save(store, fixture.run.id, fixture.cuts[1])
        second_wal = wal_size(path)
        after_second = checkpointed_size(path)
        third_s = await _timed_save(store, fixture.run.id, fixture.cuts[2])
        if check:
            for snapshot in (fixture.first, fixture.second, fixture.third):
                loaded = await store.load_snapshot(snapshot.id)
                assert loaded.model_dump() == snapshot.model_dump(), snapshot.seq
    finally:
        await store.close()
    return StoreSample(
        first_s,
        second_s,
        third_s,
        after_first - base,
        after_second - after_first,
        first_wal,
        second_wal,
    )


# -- the journaled ring ------------------------------------------------------------------------


async def ring(path: Path, hops: int, journal: bool, check: bool = False) -> tuple[float, int]:
    """Seconds for the ring to forward ``RING_TOKENS * hops`` messages on a SqlStore at
    ``path``, and how many messages its journal holds afterwards (0 without a journal).

    Messages are counted from the segments' sequence ranges; with ``check`` the journal is
    also read back in full with ``read_journal`` (slower, so done once).
    """
    store = SqlStore(f"sqlite:///{path}")
    try:
        runtime = Runtime(store=store, journal=journal)
        async with runtime:  # creates the run (and the schema) before the clock starts
            nodes = workloads.add_ring(runtime, hops)
            gc.collect()
            elapsed = await workloads.drive_ring(runtime, nodes)
        journaled = 0
        if journal:
            segments = await store.load_journal(runtime.run_id)
            counts = {"send": 0, "deliver": 0}
            for segment in segments:
                counts[segment.event] += segment.last_seq - segment.first_seq + 1
            assert counts["send"] == counts["deliver"], counts
            journaled = counts["send"]
            if check:
                messages = read_journal(segments)
                assert len(messages) == journaled, (len(messages), journaled)
                assert all(m.delivered_at is not None for m in messages)
    finally:
        await store.close()
    workloads.check_ring(nodes, hops)
    return elapsed, journaled


# -- the tool history ----------------------------------------------------------------------------


@tool
async def lookup(question: str, day: int) -> dict[str, JsonValue]:
    """Look something up in the archive (no side effect)."""
    return {"day": day, "answer": f"the answer to {question!r} is in the archive, shelf {day % 40}"}


class Researcher(Agent[AgentState]):
    """Makes one tool call per message."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        payload = message.payload
        assert isinstance(payload, dict)
        day = payload["day"]
        assert isinstance(day, int)
        await lookup(ctx, question=f"what happened on day {day}?", day=day)


@dataclass(frozen=True)
class ToolHistory:
    """What the tool-history run measured."""

    db_bytes: dict[int, int]
    """Checkpointed database bytes after ``TOOL_CALLS_EARLY`` and ``TOOL_CALLS`` calls."""
    final_state_bytes: int
    seconds: float


async def tool_history(path: Path) -> ToolHistory:
    """Run the researcher for ``TOOL_CALLS`` calls on a fresh SQLite file at ``path``."""
    store = SqlStore(f"sqlite:///{path}")
    db_bytes: dict[int, int] = {}
    try:
        policy = SnapshotPolicy(every_deliveries=1)
        runtime = Runtime(store=store, snapshot_policy=policy)
        async with runtime:
            runtime.add(Researcher("researcher"))
            start = time.perf_counter()
            for day in range(1, TOOL_CALLS + 1):
                runtime.send("researcher", {"day": day})
                await runtime.run_until_idle()
                if day in {TOOL_CALLS_EARLY, TOOL_CALLS}:
                    db_bytes[day] = checkpointed_size(path)
            seconds = time.perf_counter() - start
            state = runtime.agents["researcher"].state
            history = await store.agent_history(runtime.run_id, "researcher")
    finally:
        await store.close()
    assert len(state.tool_calls) == TOOL_CALLS, len(state.tool_calls)
    last = history[-1].cut
    assert last is not None
    assert last.state_json == encode_state("researcher", state).json
    return ToolHistory(db_bytes, len(last.state_json.encode()), seconds)


# -- driver ------------------------------------------------------------------------------------


async def _calibrate_ring(directory: Path, target_seconds: float) -> int:
    """Hops per token so that a ring run without the journal lasts about ``target_seconds``."""
    probe = 10_000
    times = []
    for _ in range(3):
        path = workloads.fresh_db(directory, "probe")
        times.append((await ring(path, probe, journal=False))[0])
        workloads.remove_db(path)
    return max(probe, round(probe * target_seconds / min(times)))


async def measure(profile: str, directory: Path) -> dict[str, Any]:
    """Run every comparison and return the results as a JSON-ready dict."""
    persist_reps, ring_reps, ring_seconds = PROFILES[profile]
    began = time.perf_counter()

    fixture = make_fixture()
    first_rows = raw_input(fixture.first, fixture.first_states)
    samples: list[StoreSample] = []

    async def raw() -> float:
        path = workloads.fresh_db(directory, "raw")
        try:
            return raw_save(path, fixture.run, first_rows)
        finally:
            workloads.remove_db(path)

    async def sqlstore() -> float:
        path = workloads.fresh_db(directory, "store")
        try:
            sample = await store_save(path, fixture, check=not samples)
        finally:
            workloads.remove_db(path)
        samples.append(sample)
        return sample.first_s

    # Warm-up (imports, page cache, code paths), not timed.
    await raw()
    await sqlstore()
    samples.clear()

    # Each side collects garbage itself, after its set-up and before its clock starts.
    raw_s, store_s = await workloads.pairs(raw, sqlstore, persist_reps)
    persist_ratios = [s / r for r, s in zip(raw_s, store_s, strict=True)]
    persist_ratio = statistics.median(persist_ratios)
    warm_s = [s.third_s for s in samples]
    warm_ratios = [w / r for r, w in zip(raw_s, warm_s, strict=True)]
    bytes_ratios = [s.second_db_bytes / s.first_db_bytes for s in samples]
    bytes_ratio = statistics.median(bytes_ratios)
    first_logical = logical_bytes(fixture.first, set())
    second_logical = logical_bytes(
        fixture.second, {cut.state_hash for cut in fixture.first.agents.values()}
    )
    state_sizes = [
        len(cut.state_json.encode())
        for name, cut in fixture.first.agents.items()
        if name != ENVIRONMENT
    ]

    path = workloads.fresh_db(directory, "tools")
    try:
        history = await tool_history(path)
    finally:
        workloads.remove_db(path)
    tool_ratio = history.db_bytes[TOOL_CALLS] / history.db_bytes[TOOL_CALLS_EARLY]

    hops = await _calibrate_ring(directory, ring_seconds)
    ring_n = workloads.RING_TOKENS * hops
    journaled: list[int] = []

    async def without() -> float:
        path = workloads.fresh_db(directory, "ring")
        try:
            return (await ring(path, hops, journal=False))[0]
        finally:
            workloads.remove_db(path)

    async def with_journal() -> float:
        path = workloads.fresh_db(directory, "journal")
        try:
            elapsed, kept = await ring(path, hops, journal=True)
        finally:
            workloads.remove_db(path)
        journaled.append(kept)
        return elapsed

    # Warm-up of the journal's code paths, not timed; its journal is read back in full.
    path = workloads.fresh_db(directory, "journal")
    await ring(path, hops, journal=True, check=True)
    workloads.remove_db(path)
    nojournal_s, journal_s = await workloads.pairs(without, with_journal, ring_reps)
    journal_ratio = workloads.median_ratio(nojournal_s, journal_s)

    return {
        **workloads.environment(
            "agentsnap snapshot store", profile, "sqlite", "sqlalchemy", "aiosqlite"
        ),
        "db_dir": str(directory),
        "statistic": "median of repetitions; ratios are medians of per-repetition ratios",
        "persist_repetitions": persist_reps,
        "ring_repetitions": ring_reps,
        "agents": AGENTS,
        "state_bytes_min": min(state_sizes),
        "state_bytes_max": max(state_sizes),
        "in_flight_messages": IN_FLIGHT_CHANNELS * IN_FLIGHT_PER_CHANNEL,
        "changed_agents": CHANGED_AGENTS,
        "raw_sqlite_save_ms": workloads.ms(raw_s),
        "sqlstore_save_ms": workloads.ms(store_s),
        "persist_ratio_vs_raw_sqlite": round(persist_ratio, 4),
        "sqlstore_incremental_save_ms": workloads.ms([s.second_s for s in samples]),
        "sqlstore_warm_save_ms": workloads.ms(warm_s),
        "warm_persist_ratio_vs_raw_sqlite": round(statistics.median(warm_ratios), 4),
        "first_snapshot_db_bytes": statistics.median(s.first_db_bytes for s in samples),
        "second_snapshot_db_bytes": statistics.median(s.second_db_bytes for s in samples),
        "incremental_bytes_ratio": round(bytes_ratio, 4),
        "first_snapshot_wal_bytes": statistics.median(s.first_wal_bytes for s in samples),
        "second_snapshot_wal_bytes": statistics.median(s.second_wal_bytes for s in samples),
        "first_snapshot_logical_bytes": first_logical,
        "second_snapshot_logical_bytes": second_logical,
        "logical_bytes_ratio": round(second_logical / first_logical, 4),
        "tool_calls": TOOL_CALLS,
        "tool_history_db_bytes_200": history.db_bytes[TOOL_CALLS_EARLY],
        "tool_history_db_bytes_1000": history.db_bytes[TOOL_CALLS],
        "tool_history_bytes_ratio_1000_vs_200": round(tool_ratio, 4),
        "tool_history_final_state_bytes": history.final_state_bytes,
        "tool_history_run_s": round(history.seconds, 2),
        "ring_agents": workloads.RING_AGENTS,
        "ring_tokens": workloads.RING_TOKENS,
        "ring_n": ring_n,
        "nojournal_msgs_per_s": workloads.rate(ring_n, nojournal_s),
        "journal_msgs_per_s": workloads.rate(ring_n, journal_s),
        "journal_throughput_ratio": round(journal_ratio, 4),
        "journaled_messages_per_repetition": journaled,
        "samples": {
            "raw_sqlite_save_ms": workloads.samples_ms(raw_s),
            "sqlstore_save_ms": workloads.samples_ms(store_s),
            "persist_ratio": [round(r, 4) for r in persist_ratios],
            "sqlstore_incremental_save_ms": workloads.samples_ms([s.second_s for s in samples]),
            "sqlstore_warm_save_ms": workloads.samples_ms(warm_s),
            "incremental_bytes_ratio": [round(r, 4) for r in bytes_ratios],
            "nojournal_msgs_per_s": workloads.rates(ring_n, nojournal_s),
            "journal_msgs_per_s": workloads.rates(ring_n, journal_s),
        },
        "targets": {
            "persist_ratio_vs_raw_sqlite_max": TARGET_PERSIST_RATIO,
            "persist_ratio_vs_raw_sqlite_met": persist_ratio <= TARGET_PERSIST_RATIO,
            "incremental_bytes_ratio_max": TARGET_INCREMENTAL_BYTES_RATIO,
            "incremental_bytes_ratio_met": bytes_ratio <= TARGET_INCREMENTAL_BYTES_RATIO,
            "tool_history_bytes_ratio_max": TARGET_TOOL_HISTORY_BYTES_RATIO,
            "tool_history_bytes_ratio_met": tool_ratio <= TARGET_TOOL_HISTORY_BYTES_RATIO,
            "journal_throughput_ratio_min": TARGET_JOURNAL_THROUGHPUT_RATIO,
            "journal_throughput_ratio_met": journal_ratio >= TARGET_JOURNAL_THROUGHPUT_RATIO,
            "journal_complete_met": all(n == ring_n for n in journaled),
        },
        "elapsed_s": round(time.perf_counter() - began, 2),
    }


def _table(r: dict[str, Any]) -> str:
    t = r["targets"]
    met = workloads.met
    lines = [
        f"agentsnap {r['agentsnap_version']} snapshot store benchmark, "
        f"{r['python_implementation']} {r['python']}, SQLite {r['sqlite_version']}, "
        f"{r['cpu_count']} CPUs, profile {r['profile']}",
        f"median of {r['persist_repetitions']} (persist) and {r['ring_repetitions']} (journal) "
        "interleaved repetitions (ratios: median of per-run ratios)",
        f"snapshot: {r['agents']} agents + $env, states {r['state_bytes_min']:,}-"
        f"{r['state_bytes_max']:,} bytes, {r['in_flight_messages']} messages in flight; "
        f"ring {r['ring_agents']} agents x {r['ring_tokens']} tokens = {r['ring_n']:,} messages",
        "",
        f"{'baseline vs measured':<40}{'baseline':>14}{'measured':>14}{'ratio':>9}",
        f"{'persist: sqlite3 vs SqlStore (ms)':<40}{r['raw_sqlite_save_ms']:>14,.2f}"
        f"{r['sqlstore_save_ms']:>14,.2f}{r['persist_ratio_vs_raw_sqlite']:>9.3f}",
        f"{'  same, 3rd snapshot of a warm store':<40}{r['raw_sqlite_save_ms']:>14,.2f}"
        f"{r['sqlstore_warm_save_ms']:>14,.2f}{r['warm_persist_ratio_vs_raw_sqlite']:>9.3f}",
        f"{'db growth: 1st vs 2nd snapshot (bytes)':<40}{r['first_snapshot_db_bytes']:>14,}"
        f"{r['second_snapshot_db_bytes']:>14,}{r['incremental_bytes_ratio']:>9.3f}",
        f"{'  WAL written (bytes)':<40}{r['first_snapshot_wal_bytes']:>14,}"
        f"{r['second_snapshot_wal_bytes']:>14,}"
        f"{r['second_snapshot_wal_bytes'] / r['first_snapshot_wal_bytes']:>9.3f}",
        f"{'  logical (bytes)':<40}{r['first_snapshot_logical_bytes']:>14,}"
        f"{r['second_snapshot_logical_bytes']:>14,}{r['logical_bytes_ratio']:>9.3f}",
        f"{'tool history: 200 vs 1,000 calls (bytes)':<40}{r['tool_history_db_bytes_200']:>14,}"
        f"{r['tool_history_db_bytes_1000']:>14,}{r['tool_history_bytes_ratio_1000_vs_200']:>9.3f}",
        f"{'ring: no journal vs journal (msg/s)':<40}{r['nojournal_msgs_per_s']:>14,.0f}"
        f"{r['journal_msgs_per_s']:>14,.0f}{r['journal_throughput_ratio']:>9.3f}",
        "",
        f"the second (incremental) snapshot took {r['sqlstore_incremental_save_ms']:.2f} ms",
        f"journaled messages per run: {r['journaled_messages_per_repetition']} "
        f"(need {r['ring_n']:,}: {met(t['journal_complete_met'])})",
        f"persist_ratio_vs_raw_sqlite = {r['persist_ratio_vs_raw_sqlite']:.3f}  "
        f"target <= {t['persist_ratio_vs_raw_sqlite_max']}: "
        f"{met(t['persist_ratio_vs_raw_sqlite_met'])}",
        f"incremental_bytes_ratio     = {r['incremental_bytes_ratio']:.3f}  "
        f"target <= {t['incremental_bytes_ratio_max']}: {met(t['incremental_bytes_ratio_met'])}",
        f"tool_history_bytes_ratio_1000_vs_200 = {r['tool_history_bytes_ratio_1000_vs_200']:.3f}  "
        f"target <= {t['tool_history_bytes_ratio_max']}: {met(t['tool_history_bytes_ratio_met'])} "
        f"(final state {r['tool_history_final_state_bytes']:,} bytes, run "
        f"{r['tool_history_run_s']} s)",
        f"journal_throughput_ratio    = {r['journal_throughput_ratio']:.3f}  "
        f"target >= {t['journal_throughput_ratio_min']}: "
        f"{met(t['journal_throughput_ratio_met'])}",
        f"total {r['elapsed_s']} s",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = workloads.argument_parser(__doc__, "smaller and fewer runs (< 1 min)", directory=True)
    args = parser.parse_args(argv)

    with workloads.scratch_directory(args.dir) as directory:
        results = asyncio.run(measure("quick" if args.quick else "full", directory))
    workloads.report(results, args.json, _table)
    if not results["targets"]["journal_complete_met"]:
        print(
            f"error: a journaled run kept {min(results['journaled_messages_per_repetition'])} "
            f"of {results['ring_n']} messages; the journal figure would mean little",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
