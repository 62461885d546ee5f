"""Time of one rollback, from the rejected output until the bus delivers again.

A run of N workers (10, 100 and 1000), each holding a distinct state of about 10 KB of
canonical JSON (memory, plan, tool calls), plus one critic, on the default
``AsyncioScheduler``. A ``work`` message bumps a counter in a worker's state; a ``relay``
makes the worker send ``work`` to the next worker (the last one sends to the first).

1. Every worker receives a ``relay`` from the environment and, right behind it, the marker
   of a snapshot, which is awaited until it is written: that is the cut. Each worker records
   before its predecessor's ``work`` reaches it, so the cut holds N messages in flight.
2. Every worker receives a ``work`` message, so every state moves away from the cut.
3. The critic receives a ``verdict`` and every worker a ``relay``, all queued at once. The
   critic runs first and rejects the output of ``agent-0000`` with ``ctx.reject`` while the
   N relays still wait on their channels. The runtime quiesces the bus, restores every agent
   from the cut (the newest snapshot, held in memory), puts the cut's N in-flight messages
   back, replays the 2N + 1 messages the environment sent after the cut, records the
   rollback in the store, calls every agent's ``on_rollback`` and resumes the bus.

``rollback_ms_N`` is the time from the moment the critic raises (``time.perf_counter()``
just before ``ctx.reject``) until the first handler call after the rollback (its first line
reads the clock), on a ``SqlStore`` (a SQLite file, WAL). The same run on a ``MemoryStore`` is
reported beside it, and so is a manual rollback: in step 3 the critic gets no verdict and the
program calls ``await runtime.rollback()`` (to the newest snapshot) with the N relays queued;
both the call's duration and the time until the first delivery after it are reported. Every
run checks that each worker ends on the counter the cut plus the replayed messages give.

Each rollback is split into phases: from the raise (or the call) until
``agentsnap.rollback.restore_cut`` starts (quiesce, retry policy, choice of the cut); the
restore itself (every agent's state parsed back from the cut's JSON, the channels emptied and
refilled); from there until the store has recorded the rollback; and from there until the
first delivery (``on_rollback`` hooks, resume). The restore is timed by a wrapper around
``restore_cut`` installed in ``agentsnap.runtime`` for the run, the store write by a store
subclass whose ``save_rollback`` reads the clock when it returns, and the cyclic garbage
collector's share by a ``gc.callbacks`` hook. For context, the time a ``SqlStore`` takes to
load the cut (which ``Runtime.rollback(snapshot_id)``, and a rejection whose cut is not the
newest snapshot, pay first) is measured after each SQLite run.

Every rollback runs on a new runtime (and a new SQLite file, in a temporary directory that
``--dir`` chooses); garbage is collected before the clock starts and only the rollback is
timed. Repetitions (9, or 3 with ``--quick``) visit the four variants (SqlStore or
MemoryStore, rejection or manual) in an order flipped every repetition; figures are medians
over the repetitions. agentsnap's log records (the warning each rollback logs) go to a
``NullHandler``. ``--json`` prints a single JSON object on stdout; ``--quick`` runs fewer
repetitions (well under 30 s); ``--profile`` runs one rejection with 1000 workers on a
``SqlStore`` under ``cProfile`` (on from the raise to the first delivery) and prints the
heaviest calls. Run it from the repository root with:

    python benchmarks/rollback.py
"""

from __future__ import annotations

import asyncio
import cProfile
import functools
import gc
import io
import logging
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import workloads

import agentsnap
import agentsnap.runtime
from agentsnap import (
    Agent,
    AgentState,
    Context,
    MemoryStore,
    Message,
    RollbackInfo,
    Runtime,
    Snapshot,
    SnapshotPolicy,
)
from agentsnap.rollback import restore_cut
from agentsnap.state import encode_state
from agentsnap.store.sql import SqlStore
from agentsnap.testing import bus_of

AGENT_COUNTS = (10, 100, 1000)
STATE_BYTES = 10_000  # each worker's state is at least this long as canonical JSON
SEED = 20_261_129
CRITIC = "critic"
REJECTED = "agent-0000"  # the worker whose output the critic rejects
PROFILE_AGENTS = 1000

# name: repetitions of each (agent count, store, method)
PROFILES: dict[str, int] = {"full": 9, "quick": 3}

StoreKind = Literal["sql", "memory"]
Method = Literal["rejection", "manual"]
VARIANTS: tuple[tuple[StoreKind, Method], ...] = (
    ("sql", "rejection"),
    ("sql", "manual"),
    ("memory", "rejection"),
    ("memory", "manual"),
)


# -- the states ----------------------------------------------------------------------------------


class WorkerState(AgentState):
    round: int = 0


VOCABULARY = workloads.vocabulary(SEED)


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(VOCABULARY, k=words)).capitalize() + "."


def make_state(index: int) -> str:
    """A distinct worker state of about ``STATE_BYTES`` of canonical JSON (memory, plan and
    tool calls, as in ``snapshot_store.py``)."""
    rng = random.Random(f"{SEED}/{index}")
    plan, calls = workloads.plan_and_calls(rng, _sentence, str(index))
    notes: list[agentsnap.JsonValue] = []
    facts: dict[str, agentsnap.JsonValue] = {}
    size = len(encode_state("probe", WorkerState(plan=plan, tool_calls=calls)).json)
    workloads.add_notes(rng, _sentence, notes, facts, STATE_BYTES - size)
    state = WorkerState(
        memory={"agent": index, "notes": notes, "facts": facts}, plan=plan, tool_calls=calls
    )
    return encode_state(f"agent-{index:04d}", state).json


# -- what each run measures ------------------------------------------------------------------------


@dataclass
class Marks:
    """Clock readings (``time.perf_counter()``) of one rollback, and what surrounded it."""

    profiler: cProfile.Profile | None = None
    start: float = 0.0
    """The critic is about to raise, or the program calls ``Runtime.rollback``."""
    restore_start: float = 0.0
    restore_end: float = 0.0
    saved: float = 0.0
    """The store's ``save_rollback`` returned."""
    returned: float = 0.0
    """``Runtime.rollback`` returned (manual rollbacks)."""
    first: float = 0.0
    """The first handler call after the rollback began."""
    first_by: str = ""
    armed: bool = False
    queued: int = 0
    """Messages on the channels when the rollback began (all dropped)."""
    restores: int = 0
    gc_started: float = 0.0
    gc_s: float = 0.0
    """Time the cyclic garbage collector ran between ``start`` and ``first``."""
    gc_restore_s: float = 0.0
    """The part of ``gc_s`` during ``restore_cut``."""
    gc_runs: list[int] = field(default_factory=lambda: [0, 0, 0])
    """Collections of each generation between ``start`` and ``first``."""

    def delivered(self, agent: str) -> None:
        """A handler runs after the rollback: the bus delivers again."""
        self.first = time.perf_counter()
        if self.profiler is not None:
            self.profiler.disable()
        self.armed = False
        self.first_by = agent


class _Current:
    marks = Marks()


def _gc_callback(phase: str, info: dict[str, int]) -> None:
    """Add the collections that run during a rollback to its marks."""
    marks = _Current.marks
    if phase == "start":
        marks.gc_started = time.perf_counter()
        return
    began = marks.gc_started
    if not marks.start or began < marks.start or marks.first:
        return
    spent = time.perf_counter() - began
    marks.gc_s += spent
    marks.gc_runs[info["generation"]] += 1
    if marks.restore_start and began >= marks.restore_start and not marks.restore_end:
        marks.gc_restore_s += spent


def _timed_restore_cut(*args: Any, **kwargs: Any) -> int:
    marks = _Current.marks
    marks.restore_start = time.perf_counter()
    try:
        return restore_cut(*args, **kwargs)
    finally:
        marks.restore_end = time.perf_counter()
        marks.restores += 1


class TimedSqlStore(SqlStore):
    """A SqlStore that notes when the rollback is recorded."""

    def __init__(self, url: str, marks: Marks) -> None:
        super().__init__(url)
        self.marks = marks

    async def save_rollback(self, rollback: RollbackInfo) -> None:
        await super().save_rollback(rollback)
        self.marks.saved = time.perf_counter()


class TimedMemoryStore(MemoryStore):
    """A MemoryStore that notes when the rollback is recorded."""

    def __init__(self, marks: Marks) -> None:
        super().__init__()
        self.marks = marks

    async def save_rollback(self, rollback: RollbackInfo) -> None:
        await super().save_rollback(rollback)
        self.marks.saved = time.perf_counter()


# -- agents ------------------------------------------------------------------------------------


class Worker(Agent[WorkerState]):
    """Bumps its round on ``work``; passes a ``relay`` on to the next worker as ``work``."""

    def __init__(self, name: str, state: WorkerState, nxt: str, marks: Marks) -> None:
        super().__init__(name, state)
        self.next = nxt
        self.marks = marks
        self.handled = 0  # a plain attribute: it survives rollbacks

    async def handle(self, message: Message, ctx: Context[WorkerState]) -> None:
        if self.marks.armed:
            self.marks.delivered(self.name)
        self.handled += 1
        if message.kind == "relay":
            ctx.send(self.next, kind="work")
        else:
            self.state.round += 1


class Critic(Agent[AgentState]):
    """Rejects ``agent-0000``'s output on its first ``verdict``, then accepts everything."""

    def __init__(self, marks: Marks, channels: Callable[[], int]) -> None:
        super().__init__(CRITIC)
        self.marks = marks
        self.queued = channels
        self.rejected = False  # a plain attribute: it survives rollbacks

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        marks = self.marks
        if marks.armed:
            marks.delivered(self.name)
        if message.kind == "verdict" and not self.rejected:
            self.rejected = True
            marks.queued = self.queued()
            if marks.profiler is not None:
                marks.profiler.enable()
            marks.start = time.perf_counter()
            ctx.reject(REJECTED, "the summary leaves out the figures it was asked for")

    async def on_rollback(self, rollback: RollbackInfo, ctx: Context[AgentState]) -> None:
        # Called after every agent's state is back on the cut and before the bus resumes.
        self.marks.armed = True


# -- one timed rollback --------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """What one rollback measured (seconds)."""

    total_s: float
    """From the raise (or the call) until the first delivery after the rollback."""
    call_s: float | None
    """Duration of ``await runtime.rollback()`` (manual rollbacks)."""
    before_restore_s: float
    restore_s: float
    record_s: float
    resume_s: float
    gc_s: float
    gc_restore_s: float
    gc_runs: list[int]
    load_s: float | None
    """``SqlStore.load_snapshot`` of the cut, timed after the run (SqlStore only)."""
    cut_in_flight: int
    queued: int
    requeued: int
    first_by: str


def _queued(runtime: Runtime) -> int:
    return sum(
        type(item) is Message for channel in bus_of(runtime).channels.values() for item in channel
    )


async def one_rollback(
    n: int,
    store_kind: StoreKind,
    method: Method,
    states: list[str],
    directory: Path,
    *,
    profiler: cProfile.Profile | None = None,
) -> Sample:
    """Build the run of ``n`` workers, take the cut, move away from it, and roll back once."""
    marks = _Current.marks = Marks(profiler=profiler)
    path = workloads.fresh_db(directory, "rollback")
    store = TimedSqlStore(f"sqlite:///{path}", marks) if store_kind == "sql" else None
    try:
        runtime = Runtime(
            store=store if store is not None else TimedMemoryStore(marks),
            # The one cut is taken below; none when the run goes idle, so that it stays the
            # newest snapshot the rollback goes back to.
            snapshot_policy=SnapshotPolicy(at_start=False, at_end=False),
            journal=False,  # the same work on both stores: the journal is timed elsewhere
        )
        async with runtime:  # creates the run (and the schema) first
            names = [f"agent-{i:04d}" for i in range(n)]
            workers = [
                Worker(name, WorkerState.model_validate_json(states[i]), names[(i + 1) % n], marks)
                for i, name in enumerate(names)
            ]
            for worker in workers:
                runtime.add(worker)
            runtime.add(Critic(marks, lambda: _queued(runtime)))

            # 1. The cut: each relay is delivered before the marker behind it, and each
            # worker records before its predecessor's work reaches it.
            for name in names:
                runtime.send(name, kind="relay")
            cut: Snapshot = await runtime.snapshot()
            await runtime.run_until_idle()
            # 2. Every state moves away from the cut.
            for name in names:
                runtime.send(name, kind="work")
            await runtime.run_until_idle()
            # 3. Messages in flight, and the rollback.
            if method == "rejection":
                runtime.send(CRITIC, kind="verdict")
            for name in names:
                runtime.send(name, kind="relay")
            gc.collect()
            if method == "manual":
                marks.queued = _queued(runtime)
                marks.start = time.perf_counter()
                await runtime.rollback()
                marks.returned = time.perf_counter()
            await runtime.run_until_idle()
            load_s = None
            if store is not None:
                gc.collect()
                start = time.perf_counter()
                loaded = await store.load_snapshot(cut.id)
                load_s = time.perf_counter() - start
                assert len(loaded.agents) == len(cut.agents)
            rollbacks = runtime.rollbacks
        assert marks.restores == 1, "agentsnap.runtime did not call restore_cut once"
        assert marks.first > 0, "no message was delivered after the rollback"
        assert len(rollbacks) == 1, rollbacks
        assert rollbacks[0].snapshot_id == cut.id, (rollbacks[0], cut.id)
        # Restored to round 0, then: the cut's in-flight work, step 2's work and the work
        # relayed in step 3.
        rounds = {w.state.round for w in workers}
        assert rounds == {3}, rounds
        # Steps 1 and 2 (3n), then the 4n messages after the rollback: step 3's relays never
        # reached a worker before it.
        handled = sum(w.handled for w in workers)
        assert handled == 7 * n, (handled, 7 * n)
    finally:
        if store is not None:
            await store.close()
        workloads.remove_db(path)
    replayed = 2 * n + (method == "rejection")
    cut_in_flight = sum(len(channel.messages) for channel in cut.channels)
    return Sample(
        total_s=marks.first - marks.start,
        call_s=marks.returned - marks.start if method == "manual" else None,
        before_restore_s=marks.restore_start - marks.start,
        restore_s=marks.restore_end - marks.restore_start,
        record_s=marks.saved - marks.restore_end,
        resume_s=marks.first - marks.saved,
        gc_s=marks.gc_s,
        gc_restore_s=marks.gc_restore_s,
        gc_runs=marks.gc_runs,
        load_s=load_s,
        cut_in_flight=cut_in_flight,
        queued=marks.queued,
        requeued=cut_in_flight + replayed,
        first_by=marks.first_by,
    )


# -- driver ------------------------------------------------------------------------------------


def _install_timers() -> Callable[[], None]:
    """Have the runtime call ``restore_cut`` through the timing wrapper, and account for the
    garbage collector's runs; return the undo."""
    module: Any = agentsnap.runtime
    if module.restore_cut is not restore_cut:
        raise RuntimeError("agentsnap.runtime.restore_cut is not agentsnap.rollback.restore_cut")
    module.restore_cut = functools.wraps(restore_cut)(_timed_restore_cut)
    gc.callbacks.append(_gc_callback)

    def undo() -> None:
        module.restore_cut = restore_cut
        gc.callbacks.remove(_gc_callback)

    return undo


def _summary(samples: list[Sample], method: Method) -> dict[str, Any]:
    """Medians of one (agent count, store, method) over the repetitions."""
    total = [s.total_s for s in samples]
    restore = [s.restore_s for s in samples]
    out: dict[str, Any] = {
        "to_first_delivery_ms": workloads.ms(total),
        "phases_ms": {
            "before_restore": workloads.ms([s.before_restore_s for s in samples]),
            "restore": workloads.ms(restore),
            "record": workloads.ms([s.record_s for s in samples]),
            "resume": workloads.ms([s.resume_s for s in samples]),
        },
        "restore_share": round(
            statistics.median(r / t for r, t in zip(restore, total, strict=True)), 4
        ),
        "gc_ms": workloads.ms([s.gc_s for s in samples]),
        "gc_in_restore_ms": workloads.ms([s.gc_restore_s for s in samples]),
        "gc_collections_by_generation": [
            statistics.median(s.gc_runs[g] for s in samples) for g in range(3)
        ],
        "first_delivery_by": sorted({s.first_by for s in samples}),
    }
    if method == "manual":
        out["call_ms"] = workloads.ms([s.call_s or 0.0 for s in samples])
    return out


async def measure(profile: str, directory: Path) -> dict[str, Any]:
    """Run every variant and return the results as a JSON-ready dict."""
    repetitions = PROFILES[profile]
    began = time.perf_counter()
    logging.getLogger("agentsnap").addHandler(logging.NullHandler())
    states = [make_state(i) for i in range(max(AGENT_COUNTS))]
    state_sizes = [len(s.encode()) for s in states]
    undo = _install_timers()
    try:
        # Warm-up (imports, schema migration code, code paths), not timed.
        for store_kind, method in VARIANTS:
            await one_rollback(100, store_kind, method, states, directory)
        runs: dict[tuple[int, StoreKind, Method], list[Sample]] = {
            (n, s, m): [] for n in AGENT_COUNTS for s, m in VARIANTS
        }
        for rep in range(repetitions):
            order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]
            for n in AGENT_COUNTS:
                for store_kind, method in order:
                    sample = await one_rollback(n, store_kind, method, states, directory)
                    runs[n, store_kind, method].append(sample)
    finally:
        undo()

    by_agents: dict[str, Any] = {}
    samples: dict[str, list[float]] = {}
    for n in AGENT_COUNTS:
        entry: dict[str, Any] = {}
        for store_kind, method in VARIANTS:
            got = runs[n, store_kind, method]
            entry.setdefault(store_kind, {})[method] = _summary(got, method)
            key = f"{store_kind}_{method}_ms_{n}"
            samples[key] = workloads.samples_ms([s.total_s for s in got])
            samples[f"{store_kind}_{method}_restore_ms_{n}"] = workloads.samples_ms(
                [s.restore_s for s in got]
            )
            if method == "manual":
                samples[f"{store_kind}_manual_call_ms_{n}"] = workloads.samples_ms(
                    [s.call_s or 0.0 for s in got]
                )
        loads = [
            s.load_s
            for method in ("rejection", "manual")
            for s in runs[n, "sql", method]
            if s.load_s is not None
        ]
        entry["sql"]["load_snapshot_ms"] = workloads.ms(loads)
        samples[f"sql_load_snapshot_ms_{n}"] = workloads.samples_ms(loads)
        last = runs[n, "sql", "rejection"][-1]
        manual = runs[n, "sql", "manual"][-1]
        entry["cut_in_flight"] = last.cut_in_flight
        entry["queued_at_rollback"] = {"rejection": last.queued, "manual": manual.queued}
        entry["requeued"] = {"rejection": last.requeued, "manual": manual.requeued}
        by_agents[str(n)] = entry

    result: dict[str, Any] = {
        **workloads.environment(
            "agentsnap rollback", profile, "pydantic", "sqlite", "sqlalchemy", "aiosqlite"
        ),
        "db_dir": str(directory),
        "statistic": "median of repetitions",
        "repetitions": repetitions,
        "agent_counts": list(AGENT_COUNTS),
        "state_bytes_min": min(state_sizes),
        "state_bytes_max": max(state_sizes),
        "rollback_measure": (
            "rejection_to_first_delivery: SqlStore, from just before ctx.reject raises "
            "OutputRejected in a critic's handler to the first handler call after the rollback"
        ),
    }
    for n in AGENT_COUNTS:
        result[f"rollback_ms_{n}"] = by_agents[str(n)]["sql"]["rejection"]["to_first_delivery_ms"]
    for n in AGENT_COUNTS:
        memory = by_agents[str(n)]["memory"]["rejection"]["to_first_delivery_ms"]
        result[f"rollback_ms_memory_{n}"] = memory
    for n in AGENT_COUNTS:
        result[f"restore_ms_{n}"] = by_agents[str(n)]["sql"]["rejection"]["phases_ms"]["restore"]
    result["by_agents"] = by_agents
    result["samples"] = samples
    result["elapsed_s"] = round(time.perf_counter() - began, 2)
    return result


async def profile_once(directory: Path, top: int) -> str:
    """Profile one rejection with ``PROFILE_AGENTS`` workers on a SqlStore; return the stats."""
    logging.getLogger("agentsnap").addHandler(logging.NullHandler())
    states = [make_state(i) for i in range(PROFILE_AGENTS)]
    undo = _install_timers()
    try:
        await one_rollback(100, "sql", "rejection", states, directory)  # warm-up
        profiler = cProfile.Profile()
        sample = await one_rollback(
            PROFILE_AGENTS, "sql", "rejection", states, directory, profiler=profiler
        )
    finally:
        undo()
    lines = [
        f"one rejection with {PROFILE_AGENTS} workers on a SqlStore: "
        f"{sample.total_s * 1000:.2f} ms to the first delivery "
        f"(restore_cut {sample.restore_s * 1000:.2f} ms); profiled from the raise to it",
    ]
    for key in ("tottime", "cumulative"):
        stream = io.StringIO()
        pstats.Stats(profiler, stream=stream).strip_dirs().sort_stats(key).print_stats(top)
        lines.append(stream.getvalue())
    return "\n".join(lines)


def _table(r: dict[str, Any]) -> str:
    counts: list[int] = r["agent_counts"]
    entries = [r["by_agents"][str(n)] for n in counts]

    def line(label: str, values: list[Any], fmt: str = ">12.2f") -> str:
        return f"{label:<36}" + "".join(f"{v:{fmt}}" for v in values)

    lines = [
        f"agentsnap {r['agentsnap_version']} rollback benchmark, {r['python_implementation']} "
        f"{r['python']}, SQLite {r['sqlite_version']}, {r['cpu_count']} CPUs, "
        f"profile {r['profile']}",
        f"median of {r['repetitions']} repetitions; worker states {r['state_bytes_min']:,}-"
        f"{r['state_bytes_max']:,} bytes",
        "",
        line("rollback (ms), agents:", counts, ">12,"),
    ]
    for store_kind, title in (("sql", "SqlStore"), ("memory", "MemoryStore")):
        rejection = [e[store_kind]["rejection"] for e in entries]
        manual = [e[store_kind]["manual"] for e in entries]
        lines += [
            title,
            line("  rejection -> first delivery", [x["to_first_delivery_ms"] for x in rejection]),
            line("    before restore_cut", [x["phases_ms"]["before_restore"] for x in rejection]),
            line("    restore_cut", [x["phases_ms"]["restore"] for x in rejection]),
            line("      garbage collection in it", [x["gc_in_restore_ms"] for x in rejection]),
            line("    until recorded in the store", [x["phases_ms"]["record"] for x in rejection]),
            line("    hooks, resume, delivery", [x["phases_ms"]["resume"] for x in rejection]),
            line("  Runtime.rollback() call", [x["call_ms"] for x in manual]),
            line("  Runtime.rollback() -> delivery", [x["to_first_delivery_ms"] for x in manual]),
        ]
    lines += [
        line("SqlStore.load_snapshot of the cut", [e["sql"]["load_snapshot_ms"] for e in entries]),
        line(
            "restore share (SqlStore rejection)",
            [e["sql"]["rejection"]["restore_share"] for e in entries],
            ">12.3f",
        ),
        line("messages in flight in the cut", [e["cut_in_flight"] for e in entries], ">12,"),
        line(
            "queued when rejected (dropped)",
            [e["queued_at_rollback"]["rejection"] for e in entries],
            ">12,",
        ),
        line("put back on the channels", [e["requeued"]["rejection"] for e in entries], ">12,"),
        "",
        "rollback_ms_N (SqlStore, rejection -> first delivery): "
        + ", ".join(f"{n}: {r[f'rollback_ms_{n}']:.2f}" for n in counts),
        f"total {r['elapsed_s']} s",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = workloads.argument_parser(__doc__, "fewer repetitions (< 30 s)", directory=True)
    parser.add_argument(
        "--profile",
        action="store_true",
        help=f"profile one rejection with {PROFILE_AGENTS} workers and print the heaviest calls",
    )
    args = parser.parse_args(argv)

    with workloads.scratch_directory(args.dir) as directory:
        if args.profile:
            print(asyncio.run(profile_once(directory, 25)))
            return 0
        results = asyncio.run(measure("quick" if args.quick else "full", directory))
    workloads.report(results, args.json, _table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
