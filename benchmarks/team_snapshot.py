"""Cost of a team snapshot end to end, against a naive stop-the-world dump of every state.

Three ratios, each from rounds in which the two sides alternate (the order flipped every
round); a ratio is the median of the per-round ratios, reported with the lowest and highest:

* ``vs_naive_1pct_1000``: 1,000 agents with distinct states of about 10 KB of canonical
  JSON; between two snapshots 1 % of them (10) handle a message that changes their state.
  The later snapshot, timed from ``runtime.snapshot()`` until its handle resolves (the states
  encoded, the cut written to a ``SqlStore`` on an SQLite file), against the naive dump: each
  agent's ``model_dump_json()`` written as one row each, in one transaction, with the stdlib
  ``sqlite3`` module on a fresh file with the pragmas of the ``SqlStore`` (WAL,
  ``synchronous=NORMAL``). Target ``<= 0.7``.
* ``vs_naive_all_100``: the same with 100 agents, every one of which changed. Target
  ``<= 1.5``.
* ``later_vs_first_10000``: 10,000 agents with states of about 2 KB; the first snapshot of a
  fresh runtime (every state encoded and written) against a later one with 1 % changed.
  Reported as later / first. Target ``<= 0.3``.
* ``bytes_per_unchanged_agent_10000`` (not timed): after that later snapshot, one more with
  nothing changed; the database pages it adds (``PRAGMA page_count`` less the free list,
  times ``page_size``, the WAL checkpointed into the file before and after), divided by the
  processes of the cut (10,001). With a row per process in every snapshot this is the size
  of an ``agentsnap_snapshot_agents`` row and its index entries; a snapshot that holds only
  the rows changed since its run's last full snapshot adds the rows of the 1 % changed since
  then. ``later_snapshot_bytes_10000`` is what the later snapshot itself adds (the changed
  states and rows, and the replay log's record of the deliveries that changed them).
* ``mesh_vs_ring_100``: 100 agents with the states of ``vs_naive_all_100``, connected as a
  full mesh (every agent has sent one message to every other: 9,900 channels between
  agents) against the same agents connected as a ring (each has sent one message to the
  next: 100 channels). One snapshot each, after the connecting messages were delivered
  (they leave the states as they were, but every agent received something, so every state
  is encoded again), timed from ``runtime.snapshot()`` until its handle resolves. Reported
  as mesh / ring. Target ``<= 1.5``: a snapshot's cost grows with the agents and what
  changed, not with the channels.

* ``snapshot_time_share_10000``: 10,000 agents with states of about 2 KB under
  ``SnapshotPolicy(every_seconds=0.1)``; the environment sends one message to each agent and
  each handles it (its state changes), round after round in one runtime. The time spent in
  snapshot work (the coordinator's protocol calls, which record and encode states, check and
  assemble the cut, plus persisting it: the store's work on the event loop and its writer
  thread's time in the transaction), measured by timing those calls, divided by the wall
  time of the rounds (each from the first send until ``run_until_idle`` returns). The
  policy spaces its snapshots by what they cost, so the share is measured over whole
  periods of it: rounds are run untimed until two snapshots have been written (the first
  may be the run's first cut), then timed until 1 (``--quick``) or 3 more have been
  written, ending with the round that wrote the last one, so the window holds as many
  snapshots as gaps between them; the rounds follow each other without a pause (no
  ``gc.collect()`` between them), so their wall times add up to the policy's clock. The
  spread is that of the single rounds. Target ``< 0.25``: snapshots by time never starve
  the run.

Every round builds a new runtime on a new SQLite file; the messages that change the states
are delivered (``run_until_idle``) before the clock starts, garbage is collected, and the
SQLite file's WAL is checkpointed (emptied), as the naive dump's new file has an empty WAL:
neither timed write copies earlier writes' pages into the database file (SQLite does that at
the commit that brings the WAL past 1,000 pages, whichever write that is). The fan-out rounds
leave those checkpoints where SQLite makes them: they count as snapshot work there. For the
mesh and the ring, the replay log's background write of the connecting deliveries (made a
few times a second) is let happen before the clock starts: it is not part of the snapshot. The
naive dump runs on the same agents' states, right before or after. ``--json`` prints one JSON
object on stdout; ``--quick`` runs fewer rounds (3, and 2 of the comparison with 10,000
agents; the sizes are the same; under a minute on an idle machine).
Run it from the repository root with:

    python benchmarks/team_snapshot.py
"""

from __future__ import annotations

import asyncio
import gc
import random
import sqlite3
import statistics
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import workloads
from pydantic import Field

from agentsnap import Agent, AgentState, Context, Message, Runtime, SnapshotPolicy
from agentsnap.store.sql import SqlStore

TARGETS = {
    "vs_naive_1pct_1000": 0.7,
    "vs_naive_all_100": 1.5,
    "later_vs_first_10000": 0.3,
    "mesh_vs_ring_100": 1.5,
    "snapshot_time_share_10000": 0.25,
}
# The replay log is written in the background this often (the runtime's watch period).
REPLAY_WATCH_SECONDS = 0.25
SEED = 20_261_201

# name: rounds of each comparison
PROFILES: dict[str, int] = {"full": 7, "quick": 3}
# name: rounds of the comparison with 10,000 agents (each round takes two first snapshots of
# them: the one that writes the run's row, not timed, and the timed one)
PROFILES_10000: dict[str, int] = {"full": 7, "quick": 2}
# name: policy snapshots written during the timed fan-out rounds to 10,000 agents
FAN_OUT_SNAPSHOTS: dict[str, int] = {"full": 3, "quick": 1}
# Seconds after which the fan-out rounds stop even if the policy wrote fewer snapshots (the
# figure is then reported over the rounds run, and flagged).
FAN_OUT_PATIENCE = 60.0


class WorkerState(AgentState):
    handled: int = 0
    notes: list[str] = Field(default_factory=list)


class Worker(Agent[WorkerState]):
    """Notes every message it handles: its state changes on every delivery."""

    async def handle(self, message: Message, ctx: Context[WorkerState]) -> None:
        self.state.handled += 1
        self.state.notes.append(f"handled {message.id}")


class Peer(Agent[WorkerState]):
    """Sends one message to each agent a message names; its state never changes."""

    async def handle(self, message: Message, ctx: Context[WorkerState]) -> None:
        payload = message.payload
        assert isinstance(payload, dict)
        peers = payload.get("to", [])
        assert isinstance(peers, list)
        for peer in peers:
            assert isinstance(peer, str)
            ctx.send(peer, {"hello": 1})


# Made-up words that sentences pick from: one draw per word (drawing each letter made
# making 10,000 states a large part of the benchmark's time).
_WORDS = workloads.vocabulary(SEED)


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(_WORDS, k=words)).capitalize() + "."


def make_state(index: int, size: int) -> WorkerState:
    """A distinct state of at least ``size`` bytes of canonical JSON."""
    rng = random.Random(f"{SEED}/{index}/{size}")
    plan, calls = workloads.plan_and_calls(rng, _sentence, f"w{index}")
    facts: dict[str, Any] = {}
    notes: list[Any] = []
    state = WorkerState(memory={"agent": index, "facts": facts, "notes": notes})
    if size >= 8_000:
        state.plan, state.tool_calls = plan, calls
    missing = size - len(state.model_dump_json())
    workloads.add_notes(rng, _sentence, notes, facts, missing)
    return state


_made: dict[tuple[int, int], list[str]] = {}


def team_states(agents: int, size: int) -> list[str]:
    """The JSON of ``make_state(i, size)`` for each agent, made once per run of the benchmark.

    Each runtime validates its own copies from it (``fresh``).
    """
    states = _made.get((agents, size))
    if states is None:
        states = _made[agents, size] = [
            make_state(i, size).model_dump_json() for i in range(agents)
        ]
    return states


def fresh(state: str) -> WorkerState:
    """A new state from ``team_states`` JSON (a deep copy, for a fraction of ``model_copy``)."""
    return WorkerState.model_validate_json(state)


def naive_dump(path: Path, agents: list[Worker]) -> float:
    """Seconds to dump every agent's state, one row each, in one sqlite3 transaction."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE IF NOT EXISTS dump (agent TEXT PRIMARY KEY, state TEXT)")
        gc.collect()
        start = time.perf_counter()
        rows = [(agent.name, agent.state.model_dump_json()) for agent in agents]
        conn.execute("BEGIN")
        conn.executemany("INSERT OR REPLACE INTO dump VALUES (?, ?)", rows)
        conn.execute("COMMIT")
        return time.perf_counter() - start
    finally:
        conn.close()


def used_bytes(path: Path) -> int:
    """Bytes of the pages the database at ``path`` uses, its WAL copied in first (not timed).

    Pages on the free list (none in these new files, which only grow) are not counted.
    """
    checkpoint(path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        (free,) = conn.execute("PRAGMA freelist_count").fetchone()
        (size,) = conn.execute("PRAGMA page_size").fetchone()
    finally:
        conn.close()
    return int((pages - free) * size)


def checkpoint(path: Path) -> None:
    """Copy what the WAL of ``path`` holds into the database file and empty it (not timed).

    SQLite does so on its own at the commit that brings the WAL past 1,000 pages, so a write
    pays for the pages of the writes before it that often. The naive dump's file is new, its
    WAL empty; the snapshot's file starts each timed write with an empty WAL too.
    """
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


async def timed_snapshot(runtime: Runtime, path: Path | None = None) -> float:
    if path is not None:
        checkpoint(path)
    gc.collect()
    start = time.perf_counter()
    await runtime.snapshot()
    return time.perf_counter() - start


async def change(runtime: Runtime, agents: list[Worker], share: float) -> None:
    """Deliver one message to ``share`` of the agents (spread over the team)."""
    step = max(1, round(1 / share))
    for agent in agents[::step]:
        runtime.send(agent.name, {"work": 1})
    await runtime.run_until_idle()


class Round(NamedTuple):
    """One round of a comparison."""

    first: float
    """Seconds of the first snapshot (every agent changed)."""
    later: float
    """Seconds of the later snapshot (``share`` of the agents changed)."""
    naive: float
    """Seconds of the naive dump."""
    later_bytes: int
    """Database bytes the later snapshot added."""
    unchanged_bytes: int
    """Database bytes a snapshot right after the later one, nothing changed, added."""


async def one_round(directory: Path, states: list[str], share: float, naive_first: bool) -> Round:
    """One round: the first snapshot, a later one after ``share`` changed, the naive dump,
    then (not timed) one more snapshot with nothing changed, for the bytes it adds.
    """
    path = workloads.fresh_db(directory, "team")
    naive_path = workloads.fresh_db(directory, "naive")
    store = SqlStore(f"sqlite:///{path}")
    policy = SnapshotPolicy(at_start=False, at_end=False)
    try:
        async with Runtime(store=store, snapshot_policy=policy, journal=False) as runtime:
            agents = [
                runtime.add(Worker(f"w{i:05d}", fresh(state))) for i, state in enumerate(states)
            ]
            await runtime.snapshot()  # the run row, SQL statements compiled: not timed
            await change(runtime, agents, 1.0)  # everyone changed: a first snapshot's work
            first = await timed_snapshot(runtime, path)
            await change(runtime, agents, share)
            naive = 0.0
            if naive_first:
                naive = naive_dump(naive_path, agents)
            before = used_bytes(path)
            later = await timed_snapshot(runtime, path)
            await asyncio.sleep(REPLAY_WATCH_SECONDS * 1.5)  # the replay log written
            after = used_bytes(path)
            if not naive_first:
                naive = naive_dump(naive_path, agents)
            await runtime.snapshot()
            unchanged = used_bytes(path) - after
    finally:
        await store.close()
        workloads.remove_db(path)
        workloads.remove_db(naive_path)
    return Round(first, later, naive, after - before, unchanged)


async def connected_snapshot(directory: Path, states: list[str], mesh: bool) -> float:
    """Seconds of one snapshot of agents connected as a full mesh, or as a ring."""
    path = workloads.fresh_db(directory, "mesh" if mesh else "ring")
    store = SqlStore(f"sqlite:///{path}")
    policy = SnapshotPolicy(at_start=False, at_end=False)
    try:
        async with Runtime(store=store, snapshot_policy=policy, journal=False) as runtime:
            names = [f"p{i:03d}" for i in range(len(states))]
            for name, state in zip(names, states, strict=True):
                runtime.add(Peer(name, fresh(state)))
            await runtime.snapshot()  # the run row, SQL statements compiled: not timed
            for i, name in enumerate(names):
                peers = [p for p in names if p != name] if mesh else [names[(i + 1) % len(names)]]
                runtime.send(name, {"to": peers})
            await runtime.run_until_idle()
            await asyncio.sleep(REPLAY_WATCH_SECONDS * 1.5)  # the replay log written
            return await timed_snapshot(runtime, path)
    finally:
        await store.close()
        workloads.remove_db(path)


async def mesh_vs_ring(directory: Path, agents: int, size: int, rounds: int) -> dict[str, Any]:
    states = team_states(agents, size)
    meshes: list[float] = []
    rings: list[float] = []
    for r in range(rounds):
        for mesh in (r % 2 == 0, r % 2 != 0):
            (meshes if mesh else rings).append(await connected_snapshot(directory, states, mesh))
    ratios = [mesh / ring for mesh, ring in zip(meshes, rings, strict=True)]
    return {
        "agents": agents,
        "state_bytes": size,
        "mesh_ms": workloads.ms(meshes),
        "ring_ms": workloads.ms(rings),
        "mesh_vs_ring": round(statistics.median(ratios), 3),
        "mesh_vs_ring_spread": _spread(ratios),
        "samples_mesh_ms": workloads.samples_ms(meshes),
        "samples_ring_ms": workloads.samples_ms(rings),
    }


class SnapshotWork:
    """Seconds of snapshot work in a runtime, timed around the calls that do it.

    The coordinator's protocol calls (outermost only: a marker's handling records, which
    encodes, which may complete the cut) run on the event loop; persisting runs partly on
    the loop (the store turns the cut into rows) and partly on the SQLite writer thread (the
    transaction), whose time counts too.
    """

    def __init__(self, runtime: Runtime, store: SqlStore) -> None:
        self.seconds = 0.0
        self.snapshots = 0
        self._depth = 0
        coordinator = runtime._snapshots
        for name in ("begin", "capture", "record", "on_marker", "on_message", "keep_before"):
            setattr(coordinator, name, self._timed(getattr(coordinator, name)))
        writer = store._writer
        assert writer is not None, "the benchmark writes to SQLite"
        write_rows = store._write_snapshot
        writer_write = writer.write
        thread_write = writer._write

        async def write_snapshot(snapshot: Any) -> None:
            start = time.perf_counter()
            self._waiting = 0.0
            try:
                await write_rows(snapshot)
            finally:
                self.seconds += time.perf_counter() - start - self._waiting
                self.snapshots += 1

        async def awaited(rows: Any) -> None:
            start = time.perf_counter()
            try:
                await writer_write(rows)
            finally:
                self._waiting += time.perf_counter() - start

        def in_thread(rows: Any) -> None:
            start = time.perf_counter()
            try:
                thread_write(rows)
            finally:
                self.seconds += time.perf_counter() - start

        store._write_snapshot = write_snapshot  # type: ignore[method-assign]
        writer.write = awaited  # type: ignore[method-assign]
        writer._write = in_thread  # type: ignore[method-assign]
        self._waiting = 0.0

    def _timed(self, call: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return call(*args, **kwargs)
            self._depth += 1
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self._depth -= 1

        return timed


async def fan_out_rounds(
    directory: Path, states: list[str], snapshots: int
) -> tuple[list[tuple[float, float, int]], bool]:
    """Fan-out rounds one after the other under ``every_seconds=0.1``, over whole periods.

    Rounds run untimed until a policy snapshot has been written, then are measured until
    ``snapshots`` more have been. Per measured round: (seconds of snapshot work, wall
    seconds, snapshots written during it); and whether the policy wrote them all before
    ``FAN_OUT_PATIENCE``.
    """
    path = workloads.fresh_db(directory, "fanout")
    store = SqlStore(f"sqlite:///{path}")
    policy = SnapshotPolicy(every_seconds=0.1, at_end=False)
    try:
        async with Runtime(store=store, snapshot_policy=policy, journal=False) as runtime:
            agents = [
                runtime.add(Worker(f"w{i:05d}", fresh(state))) for i, state in enumerate(states)
            ]
            # Not timed: the run's first input (and its first cut, taken before anything is
            # delivered).
            runtime.send(agents[0].name, {"work": 0})
            await runtime.run_until_idle()
            work = SnapshotWork(runtime, store)
            measured: list[tuple[float, float, int]] = []
            handled = 0
            began = time.perf_counter()

            async def one_round() -> tuple[float, float, int]:
                nonlocal handled
                # No gc.collect() here: the policy's clock runs between rounds too, so time
                # spent outside the rounds would be left out of the wall time but not out of
                # the policy's period.
                before, written = work.seconds, work.snapshots
                start = time.perf_counter()
                for agent in agents:
                    runtime.send(agent.name, {"work": 1})
                await runtime.run_until_idle()
                wall = time.perf_counter() - start
                handled += 1
                assert all(a.state.handled >= handled for a in agents), "a round did not finish"
                return work.seconds - before, wall, work.snapshots - written

            # Untimed: up to the end of the round that wrote the second snapshot, where a
            # period of the policy begins (the first may be the run's first cut, written while
            # the policy's own period is still ``every_seconds``).
            while work.snapshots < 2 and time.perf_counter() - began < FAN_OUT_PATIENCE:
                await one_round()
            complete = work.snapshots >= 2
            while complete and sum(taken for _, _, taken in measured) < snapshots:
                measured.append(await one_round())
                if time.perf_counter() - began > FAN_OUT_PATIENCE:
                    complete = sum(taken for _, _, taken in measured) >= snapshots
                    break
            return measured, complete
    finally:
        await store.close()
        workloads.remove_db(path)


async def time_share(directory: Path, agents: int, size: int, snapshots: int) -> dict[str, Any]:
    measured, complete = await fan_out_rounds(directory, team_states(agents, size), snapshots)
    if not measured:
        return {"agents": agents, "complete": False, "share": float("nan"), "share_spread": []}
    works = [work for work, _, _ in measured]
    walls = [wall for _, wall, _ in measured]
    shares = [work / wall for work, wall, _ in measured]
    return {
        "agents": agents,
        "state_bytes": size,
        "every_seconds": 0.1,
        "rounds": len(measured),
        # False if the policy wrote fewer snapshots than asked within FAN_OUT_PATIENCE.
        "complete": complete,
        "window_s": round(sum(walls), 3),
        "round_ms": workloads.ms(walls),
        "snapshot_work_ms": round(sum(works) * 1000 / max(1, sum(t for _, _, t in measured)), 3),
        "snapshots_written": sum(taken for _, _, taken in measured),
        # Over all the rounds: a snapshot spans rounds, and its work lands in one.
        "share": round(sum(works) / sum(walls), 3),
        "share_spread": _spread(shares),
        "samples_round_ms": workloads.samples_ms(walls),
        "samples_work_ms": workloads.samples_ms(works),
    }


def _spread(values: list[float]) -> list[float]:
    return [round(min(values), 3), round(max(values), 3)]


async def compare(
    directory: Path, agents: int, size: int, share: float, rounds: int
) -> dict[str, Any]:
    states = team_states(agents, size)
    measured = [
        await one_round(directory, states, share, naive_first=r % 2 == 0) for r in range(rounds)
    ]
    firsts = [m.first for m in measured]
    laters = [m.later for m in measured]
    naives = [m.naive for m in measured]
    # The processes of the cut: the agents and the environment.
    per_agent = [m.unchanged_bytes / (agents + 1) for m in measured]
    vs_naive = [later / naive for later, naive in zip(laters, naives, strict=True)]
    later_vs_first = [later / first for later, first in zip(laters, firsts, strict=True)]
    return {
        "agents": agents,
        "state_bytes": size,
        "changed_share": share,
        "first_ms": workloads.ms(firsts),
        "later_ms": workloads.ms(laters),
        "naive_ms": workloads.ms(naives),
        "vs_naive": round(statistics.median(vs_naive), 3),
        "vs_naive_spread": _spread(vs_naive),
        "later_vs_first": round(statistics.median(later_vs_first), 3),
        "later_vs_first_spread": _spread(later_vs_first),
        "later_snapshot_bytes": int(statistics.median(m.later_bytes for m in measured)),
        "bytes_per_unchanged_agent": round(statistics.median(per_agent), 1),
        "bytes_per_unchanged_agent_spread": [round(min(per_agent), 1), round(max(per_agent), 1)],
        "samples_later_ms": workloads.samples_ms(laters),
        "samples_first_ms": workloads.samples_ms(firsts),
        "samples_naive_ms": workloads.samples_ms(naives),
    }


async def measure(profile: str, parent: Path | None) -> dict[str, Any]:
    rounds = PROFILES[profile]
    began = time.perf_counter()
    results = workloads.environment("team_snapshot", profile, "sqlite", "pydantic", "orjson")
    with workloads.scratch_directory(parent) as directory:
        one_pct = await compare(directory, 1_000, 10_000, 0.01, rounds)
        everyone = await compare(directory, 100, 10_000, 1.0, rounds)
        big = await compare(directory, 10_000, 2_000, 0.01, PROFILES_10000[profile])
        connected = await mesh_vs_ring(directory, 100, 10_000, rounds)
        fan_out = await time_share(directory, 10_000, 2_000, FAN_OUT_SNAPSHOTS[profile])
    results.update(
        {
            "vs_naive_1pct_1000": one_pct["vs_naive"],
            "vs_naive_1pct_1000_spread": one_pct["vs_naive_spread"],
            "vs_naive_all_100": everyone["vs_naive"],
            "vs_naive_all_100_spread": everyone["vs_naive_spread"],
            "later_vs_first_10000": big["later_vs_first"],
            "later_vs_first_10000_spread": big["later_vs_first_spread"],
            "bytes_per_unchanged_agent_10000": big["bytes_per_unchanged_agent"],
            "bytes_per_unchanged_agent_10000_spread": big["bytes_per_unchanged_agent_spread"],
            "later_snapshot_bytes_10000": big["later_snapshot_bytes"],
            "mesh_vs_ring_100": connected["mesh_vs_ring"],
            "mesh_vs_ring_100_spread": connected["mesh_vs_ring_spread"],
            "snapshot_time_share_10000": fan_out["share"],
            "snapshot_time_share_10000_spread": fan_out["share_spread"],
            "fan_out_10000": fan_out,
            "rounds": rounds,
            "rounds_10000": PROFILES_10000[profile],
            "by_case": {"1pct_1000": one_pct, "all_100": everyone, "1pct_10000": big},
            "mesh_and_ring_100": connected,
        }
    )
    results["targets"] = {
        **{f"{name}_max": limit for name, limit in TARGETS.items()},
        **{f"{name}_met": results[name] <= limit for name, limit in TARGETS.items()},
        "snapshot_time_share_10000_met": results["snapshot_time_share_10000"] < 0.25,
    }
    results["elapsed_s"] = round(time.perf_counter() - began, 1)
    return results


def _table(r: dict[str, Any]) -> str:
    cases = r["by_case"]
    lines = [
        f"team snapshot vs naive dump ({r['profile']}, {r['rounds']} rounds, medians in ms)",
        f"{'case':<28}{'first':>10}{'later':>10}{'naive':>10}",
    ]
    for name, case in cases.items():
        lines.append(
            f"{name:<28}{case['first_ms']:>10,.2f}{case['later_ms']:>10,.2f}"
            f"{case['naive_ms']:>10,.2f}"
        )
    lines.append(
        f"10,000 agents: a snapshot with nothing changed adds "
        f"{r['bytes_per_unchanged_agent_10000']:,.1f} bytes per agent to the database, "
        f"the later one (1 % changed) {r['later_snapshot_bytes_10000']:,} bytes"
    )
    connected = r["mesh_and_ring_100"]
    lines.append(
        f"one snapshot of 100 agents: as a mesh {connected['mesh_ms']:,.2f} ms, "
        f"as a ring {connected['ring_ms']:,.2f} ms"
    )
    fan_out = r["fan_out_10000"]
    if fan_out.get("rounds"):
        lines.append(
            f"fan-out to 10,000 agents, every_seconds=0.1: {fan_out['rounds']} rounds in "
            f"{fan_out['window_s']:,.1f} s (median {fan_out['round_ms']:,.2f} ms), "
            f"{fan_out['snapshots_written']} snapshots written, "
            f"{fan_out['snapshot_work_ms']:,.2f} ms of work each"
        )
    if not fan_out["complete"]:
        lines.append(
            f"fan-out: the policy wrote fewer snapshots than asked in {FAN_OUT_PATIENCE:.0f} s"
        )
    lines.append("")
    t = r["targets"]
    for name in TARGETS:
        low, high = r[f"{name}_spread"]
        lines.append(
            f"{name:<22} = {r[name]:.3f} (spread {low:.3f} .. {high:.3f})  "
            f"target <= {t[f'{name}_max']}: {workloads.met(t[f'{name}_met'])}"
        )
    lines.append(f"total {r['elapsed_s']} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = workloads.argument_parser(__doc__, "fewer rounds (< 60 s)", directory=True)
    args = parser.parse_args(argv)
    results = asyncio.run(measure("quick" if args.quick else "full", args.dir))
    workloads.report(results, args.json, _table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
