"""Throughput of the agentsnap bus, measured against bare asyncio queues in the same process.

The timed comparisons run as interleaved repetitions (reference and agentsnap alternately,
the order flipped on every repetition). Rates are medians over the repetitions; each ratio is
the median of the per-repetition ratios, so that both sides of a ratio ran seconds apart on
the same (shared, noisy) machine:

* hand-off: the program sends N small messages to one agent whose handler only counts them,
  against one producer task and one consumer task sharing an unbounded ``asyncio.Queue``.
  Both producers yield to the event loop every 64 items. Reported as ``ratio_vs_queue``.
* ping-pong: two agents bouncing one message back and forth N times, against two tasks doing
  the same through two ``asyncio.Queue`` objects. Reported as ``pingpong_ratio``.
* snapshots: a ring of 6 agents passing 4 tokens (injected together, so they travel as a
  convoy and every run follows the same schedule) for a fixed number of messages, once
  without snapshots and once with ``SnapshotPolicy(every_seconds=0.1)``, each run on a
  ``SqlStore`` on a new SQLite file (the runtime's durability: WAL, ``synchronous=NORMAL``;
  the journal on, as by default with a database). Each node holds a distinct state of about
  10 KB of JSON (memory, plan, tool calls) that every message changes, so each snapshot
  encodes and writes 6 new states. Reported as ``snapshot_overhead = 1 - with / without``.
  The message count is calibrated at start-up so that each run lasts about a second (also
  with ``--quick``); the program exits with status 1 if a run completed fewer than 5
  snapshots (2 with ``--quick``).
* tracing without an SDK, counted in instructions: the default runtime, which has only the
  OpenTelemetry API and no SDK configured (so it decides at start-up not to trace), against
  a runtime built with ``telemetry=False``. A timing cannot tell a few percent apart on a
  shared machine, so each side runs in a process of its own under
  ``valgrind --tool=callgrind``, counting instructions only around two hand-offs, of n1
  = 2,000 and n2 = 10,000 messages, after an uncounted warm-up (not with ``--quick``: an
  interpreter under callgrind takes most of a minute to start on a loaded machine). A
  side's cost per message is ``(I(n2) - I(n1)) / (n2 - n1)``, so the runtime's start and
  end cancel out. Reported as ``tracing_noop_overhead = default / off
  - 1`` (in instructions per message). A third process runs the ``telemetry=False`` side
  again: ``tracing_noop_resolution`` is how far two identical sides differ, the smallest
  difference the figure can tell apart (it is ``null`` without valgrind or with ``--quick``,
  and so is whether its target is met).
* tracing with the SDK: the hand-off of N / 20 messages by a runtime given the SDK (a
  ``TracerProvider`` sampling everything, a ``SimpleSpanProcessor`` and an
  ``InMemorySpanExporter``, emptied after each run; every message makes three spans that
  stay in memory) against ``telemetry=False``, timed: ``tracing_sdk_overhead = 1 - SDK /
  off``.
* delivery log: the hand-off of N messages by the default runtime, which logs every delivery
  and every input for replay after a crash, against a runtime built with ``replay=False``.
  Reported as ``delivery_log_overhead = 1 - default / off``, with the lowest and highest
  per-repetition figure as ``delivery_log_overhead_spread``. No side-effecting tool runs, so
  the log is written to the (memory) store only every few thousand entries: this is the
  per-message cost every run pays.

``--json`` prints a single JSON object on stdout; ``--quick`` runs smaller and fewer
repetitions, without callgrind (under a minute, on a loaded machine too). Run it from the
repository root with:

    python benchmarks/bus.py
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import workloads

from agentsnap import Agent, AgentState, Context, Message, Runtime, SnapshotPolicy
from agentsnap.store.sql import SqlStore
from agentsnap.telemetry import Telemetry, resolve

TARGET_RATIO_VS_QUEUE = 0.5
TARGET_SNAPSHOT_OVERHEAD = 0.10
TARGET_TRACING_NOOP_OVERHEAD = 0.05
SDK_DIVISOR = 20  # the SDK comparison sends N / 20 messages: each one's spans stay in memory
SNAPSHOT_EVERY_SECONDS = 0.1
RING_STATE_BYTES = 10_000  # each ring node's state, as JSON, in the snapshot comparison
YIELD_EVERY = 64  # producers yield to the event loop after this many sends / puts
WARM_UP_MESSAGES = 200  # handed off before callgrind starts counting
CALLGRIND_PROCESSES = 2

# name: (hand-off N, ping-pong N, repetitions, target seconds of one ring run, min snapshots)
PROFILES: dict[str, tuple[int, int, int, float, int]] = {
    "full": (300_000, 100_000, 9, 1.0, 5),
    "quick": (20_000, 10_000, 3, 1.0, 2),
}
# name: the two message counts whose difference gives the instructions per message
# (the quick profile runs no callgrind)
CALLGRIND_COUNTS: dict[str, tuple[int, int] | None] = {"full": (2_000, 10_000), "quick": None}

# -- agents ----------------------------------------------------------------------------------


class Sink(Agent[AgentState]):
    """Counts what it receives, in a plain attribute (the bus is measured, not pydantic)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.count = 0

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.count += 1


class Player(Agent[AgentState]):
    """Sends every ball back to its peer until the ball has been handed on ``limit`` times."""

    def __init__(self, name: str, peer: str, limit: int) -> None:
        super().__init__(name)
        self.peer = peer
        self.limit = limit
        self.count = 0

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.count += 1
        payload = message.payload
        assert isinstance(payload, dict)
        k = payload["k"]
        assert isinstance(k, int)
        if k < self.limit:
            ctx.send(self.peer, {"k": k + 1})


# -- one timed run of each workload ----------------------------------------------------------


async def queue_handoff(n: int) -> float:
    """Seconds for one producer task to hand ``n`` items to one consumer task."""
    queue: asyncio.Queue[dict[str, int]] = asyncio.Queue()
    received = 0

    async def producer() -> None:
        put = queue.put_nowait  # the bus's send is synchronous too
        for i in range(n):
            put({"i": i})
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)

    async def consumer() -> None:
        nonlocal received
        get = queue.get
        for _ in range(n):
            await get()
            received += 1

    start = time.perf_counter()
    await asyncio.gather(producer(), consumer())
    elapsed = time.perf_counter() - start
    assert received == n, (received, n)
    return elapsed


async def bus_handoff(
    n: int, telemetry: Telemetry | bool | None = None, *, replay: bool = True
) -> float:
    """Seconds to send ``n`` messages to one counting agent until the runtime is idle."""
    async with Runtime(telemetry=telemetry, replay=replay) as runtime:
        sink = Sink("sink")
        runtime.add(sink)
        await runtime.run_until_idle()
        send = runtime.send
        start = time.perf_counter()
        for i in range(n):
            send("sink", {"i": i})
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)
        await runtime.run_until_idle()
        elapsed = time.perf_counter() - start
    assert sink.count == n, (sink.count, n)
    return elapsed


async def queue_pingpong(n: int) -> float:
    """Seconds for two tasks to bounce one item ``n`` times through two queues."""
    a_in: asyncio.Queue[dict[str, int] | None] = asyncio.Queue()
    b_in: asyncio.Queue[dict[str, int] | None] = asyncio.Queue()
    counts = [0, 0]

    async def player(index: int, inbox: asyncio.Queue[Any], outbox: asyncio.Queue[Any]) -> None:
        while True:
            item = await inbox.get()
            if item is None:
                return
            counts[index] += 1
            k = item["k"]
            if k < n:
                outbox.put_nowait({"k": k + 1})
            else:
                outbox.put_nowait(None)
                return

    start = time.perf_counter()
    a_in.put_nowait({"k": 1})
    await asyncio.gather(player(0, a_in, b_in), player(1, b_in, a_in))
    elapsed = time.perf_counter() - start
    assert sum(counts) == n, (counts, n)
    return elapsed


async def bus_pingpong(n: int) -> float:
    """Seconds for two agents to bounce one message ``n`` times."""
    async with Runtime() as runtime:
        a = Player("a", "b", n)
        b = Player("b", "a", n)
        runtime.add(a)
        runtime.add(b)
        await runtime.run_until_idle()
        start = time.perf_counter()
        runtime.send("a", {"k": 1})
        await runtime.run_until_idle()
        elapsed = time.perf_counter() - start
    assert a.count + b.count == n, (a.count, b.count, n)
    return elapsed


async def ring(directory: Path, hops: int, snapshots: bool) -> tuple[float, int]:
    """Seconds for the ring to forward ``RING_TOKENS * hops`` messages, and snapshots taken.

    The ring runs on a ``SqlStore`` on a new SQLite file in ``directory`` (the runtime's
    defaults: WAL, ``synchronous=NORMAL``, the journal on), its nodes holding states of
    about ``RING_STATE_BYTES``, which every message changes.
    """
    # No snapshot at the first input or at the end either: the runs differ by the timed
    # snapshots only.
    every = SNAPSHOT_EVERY_SECONDS if snapshots else None
    policy = SnapshotPolicy(every_seconds=every, at_start=False, at_end=False)
    path = workloads.fresh_db(directory, "ring")
    store = SqlStore(f"sqlite:///{path}")
    try:
        # Entering the runtime migrates the schema and creates the run, off the clock.
        async with Runtime(store=store, snapshot_policy=policy) as runtime:
            nodes = workloads.add_ring(runtime, hops, RING_STATE_BYTES)
            gc.collect()
            elapsed = await workloads.drive_ring(runtime, nodes)
            taken = [s for s in await runtime.list_snapshots() if s.status == "complete"]
    finally:
        await store.close()
        workloads.remove_db(path)
    workloads.check_ring(nodes, hops)
    if not snapshots:
        assert not taken
    return elapsed, len(taken)


# -- tracing, in instructions -----------------------------------------------------------------


def _callgrind(request: str) -> None:
    """Send ``request`` to the callgrind running this process; wait until it is done.

    Callgrind acts on a request while the process runs, so the wait is a poll that sleeps,
    not a blocking wait.
    """
    switch = subprocess.Popen(
        ["callgrind_control", request, str(os.getpid())],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while switch.poll() is None:
        time.sleep(0.002)


def handoff_instructions_child(side: str, counts: tuple[int, int]) -> None:
    """Under callgrind (started with instrumentation off): hand off ``counts`` messages.

    A warm-up hand-off runs first, uninstrumented. Then callgrind counts from zero, the
    hand-off of ``counts[0]`` messages runs and its count is dumped, then that of
    ``counts[1]`` messages, dumped too; the process ends without instrumentation.
    """
    telemetry = None if side == "default" else False
    if telemetry is None:
        assert resolve(None) is None, "an OpenTelemetry SDK is configured globally"
    asyncio.run(bus_handoff(WARM_UP_MESSAGES, telemetry))
    gc.collect()
    _callgrind("--instr=on")
    _callgrind("--zero")
    for n in counts:
        asyncio.run(bus_handoff(n, telemetry))
        _callgrind("--dump")
    _callgrind("--instr=off")
    sys.stdout.flush()
    os._exit(0)  # the interpreter's teardown is not measured: skip it


def _instructions(side: str, counts: tuple[int, int]) -> tuple[int, int]:
    """Instructions of the two hand-offs of ``handoff_instructions_child``."""
    with tempfile.TemporaryDirectory(prefix="agentsnap-callgrind-") as folder:
        out = Path(folder) / "callgrind.out"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={out}",
                f"--log-file={folder}/valgrind.log",
                sys.executable,
                str(Path(__file__).resolve()),
                "--instructions-of",
                side.split("#", maxsplit=1)[0],  # "off#2" is a second, identical "off"
                *map(str, counts),
            ],
            check=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},
            stdout=subprocess.DEVNULL,
        )
        found = []
        for dump in (1, 2):
            summary = re.search(r"^summary:\s*(\d+)", Path(f"{out}.{dump}").read_text(), re.M)
            assert summary is not None, f"no instruction count from callgrind for {side}"
            found.append(int(summary.group(1)))
    return found[0], found[1]


def per_message_instructions(sides: list[str], counts: tuple[int, int]) -> list[float]:
    """Instructions per message of each side: the difference between two hand-offs, of
    ``counts[1]`` and ``counts[0]`` messages, over the difference in messages (so that the
    runtime's start and end cancel out). One callgrind process per side, two at a time."""
    with ThreadPoolExecutor(max_workers=CALLGRIND_PROCESSES) as pool:
        found = list(pool.map(lambda side: _instructions(side, counts), sides))
    small, large = counts
    return [(big - little) / (large - small) for little, big in found]


def sdk_telemetry() -> tuple[Telemetry, Callable[[], None]]:
    """A telemetry on the SDK, recording every span into memory; and what empties it."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON, shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Telemetry(tracer_provider=provider), exporter.clear


# -- driver ------------------------------------------------------------------------------------


async def _pairs(
    reference: workloads.Timed, subject: workloads.Timed, repetitions: int
) -> tuple[list[float], list[float]]:
    """Run both ``repetitions`` times, alternating which goes first, the garbage collected
    before each run; return both timings."""
    return await workloads.pairs(
        workloads.collected(reference), workloads.collected(subject), repetitions
    )


async def _calibrate_ring(directory: Path, target_seconds: float) -> int:
    """Hops per token so that a ring run without snapshots lasts about ``target_seconds``."""
    probe = 1_000
    fastest = min([(await ring(directory, probe, snapshots=False))[0] for _ in range(3)])
    # Sized from the fastest probe: a probe slowed down by noise must not shorten the runs
    # (and with them the number of snapshots taken).
    return max(probe, round(probe * target_seconds / fastest))


async def measure(profile: str) -> dict[str, Any]:
    """Run every comparison and return the results as a JSON-ready dict."""
    n, pingpong_n, repetitions, ring_seconds, min_snapshots = PROFILES[profile]
    began = time.perf_counter()

    # Tracing without an SDK, in instructions: the callgrind runs first, two at a time, on
    # an idle machine as far as this program goes.
    callgrind_counts = CALLGRIND_COUNTS[profile]
    per_message: list[float] | None = None
    if callgrind_counts and shutil.which("valgrind") and shutil.which("callgrind_control"):
        per_message = await asyncio.to_thread(
            per_message_instructions, ["off", "default", "off#2"], callgrind_counts
        )

    # Warm-up (allocator, caches, code paths), not timed.
    await queue_handoff(n // 10)
    await bus_handoff(n // 10)
    await queue_pingpong(pingpong_n // 10)
    await bus_pingpong(pingpong_n // 10)

    queue_s, bus_s = await _pairs(lambda: queue_handoff(n), lambda: bus_handoff(n), repetitions)
    qpp_s, pp_s = await _pairs(
        lambda: queue_pingpong(pingpong_n), lambda: bus_pingpong(pingpong_n), repetitions
    )

    snapshot_counts: list[int] = []
    with workloads.scratch_directory(None) as directory:
        hops = await _calibrate_ring(directory, ring_seconds)

        async def without() -> float:
            return (await ring(directory, hops, snapshots=False))[0]

        async def with_snapshots() -> float:
            elapsed, taken = await ring(directory, hops, snapshots=True)
            snapshot_counts.append(taken)
            return elapsed

        # Each side collects garbage itself, after its set-up and before its clock starts.
        nosnap_s, snap_s = await workloads.pairs(without, with_snapshots, repetitions)
    ring_n = workloads.RING_TOKENS * hops

    sdk_n = n // SDK_DIVISOR
    sdk, clear_spans = sdk_telemetry()

    async def with_sdk() -> float:
        try:
            return await bus_handoff(sdk_n, telemetry=sdk)
        finally:
            clear_spans()

    await with_sdk()  # warm-up
    sdk_off_s, sdk_s = await _pairs(
        lambda: bus_handoff(sdk_n, telemetry=False), with_sdk, repetitions
    )

    nolog_s, log_s = await _pairs(
        lambda: bus_handoff(n, replay=False), lambda: bus_handoff(n), repetitions
    )
    log_overheads = sorted(1 - nolog / log for nolog, log in zip(nolog_s, log_s, strict=True))

    ratio = workloads.median_ratio(queue_s, bus_s)
    overhead = 1 - workloads.median_ratio(nosnap_s, snap_s)
    snapshots_taken = min(snapshot_counts)
    noop_overhead: float | None = None
    resolution: float | None = None
    if per_message is not None:
        off, default, twin = per_message
        noop_overhead = default / off - 1
        resolution = abs(twin / off - 1)
    noop_met = None if noop_overhead is None else noop_overhead < TARGET_TRACING_NOOP_OVERHEAD
    sdk_overhead = 1 - workloads.median_ratio(sdk_off_s, sdk_s)
    return {
        **workloads.environment("agentsnap bus", profile),
        "statistic": "median of repetitions; ratios are medians of per-repetition ratios",
        "repetitions": repetitions,
        "n": n,
        "pingpong_n": pingpong_n,
        "ring_agents": workloads.RING_AGENTS,
        "ring_tokens": workloads.RING_TOKENS,
        "ring_n": ring_n,
        "queue_msgs_per_s": workloads.rate(n, queue_s),
        "bus_msgs_per_s": workloads.rate(n, bus_s),
        "ratio_vs_queue": round(ratio, 4),
        "queue_pingpong_msgs_per_s": workloads.rate(pingpong_n, qpp_s),
        "pingpong_msgs_per_s": workloads.rate(pingpong_n, pp_s),
        "pingpong_ratio": round(workloads.median_ratio(qpp_s, pp_s), 4),
        "nosnapshot_msgs_per_s": workloads.rate(ring_n, nosnap_s),
        "snapshot_msgs_per_s": workloads.rate(ring_n, snap_s),
        "snapshot_overhead": round(overhead, 4),
        "snapshot_every_s": SNAPSHOT_EVERY_SECONDS,
        "snapshots_taken": snapshots_taken,
        "snapshots_per_repetition": snapshot_counts,
        "min_snapshots_required": min_snapshots,
        "ring_state_bytes": RING_STATE_BYTES,
        "ring_store": "SqlStore, SQLite file (WAL, synchronous=NORMAL), journal on",
        "tracing_noop_method": "callgrind instructions per message: (I(n2) - I(n1)) / (n2 - n1)",
        "tracing_noop_counts": None if callgrind_counts is None else list(callgrind_counts),
        "tracing_off_instructions_per_msg": _rounded(per_message, 0),
        "tracing_noop_instructions_per_msg": _rounded(per_message, 1),
        "tracing_off_twin_instructions_per_msg": _rounded(per_message, 2),
        "tracing_noop_overhead": None if noop_overhead is None else round(noop_overhead, 5),
        "tracing_noop_resolution": None if resolution is None else round(resolution, 5),
        "tracing_sdk_n": sdk_n,
        "tracing_sdk_off_msgs_per_s": workloads.rate(sdk_n, sdk_off_s),
        "tracing_sdk_msgs_per_s": workloads.rate(sdk_n, sdk_s),
        "tracing_sdk_overhead": round(sdk_overhead, 4),
        "tracing_sdk_spans_per_message": 3,
        "delivery_log_off_msgs_per_s": workloads.rate(n, nolog_s),
        "delivery_log_msgs_per_s": workloads.rate(n, log_s),
        "delivery_log_overhead": round(1 - workloads.median_ratio(nolog_s, log_s), 4),
        "delivery_log_overhead_spread": [round(log_overheads[0], 4), round(log_overheads[-1], 4)],
        "samples_msgs_per_s": {
            "queue": workloads.rates(n, queue_s),
            "bus": workloads.rates(n, bus_s),
            "queue_pingpong": workloads.rates(pingpong_n, qpp_s),
            "pingpong": workloads.rates(pingpong_n, pp_s),
            "nosnapshot": workloads.rates(ring_n, nosnap_s),
            "snapshot": workloads.rates(ring_n, snap_s),
            "tracing_sdk_off": workloads.rates(sdk_n, sdk_off_s),
            "tracing_sdk": workloads.rates(sdk_n, sdk_s),
            "delivery_log_off": workloads.rates(n, nolog_s),
            "delivery_log": workloads.rates(n, log_s),
        },
        "targets": {
            "ratio_vs_queue_min": TARGET_RATIO_VS_QUEUE,
            "ratio_vs_queue_met": ratio >= TARGET_RATIO_VS_QUEUE,
            "snapshot_overhead_max": TARGET_SNAPSHOT_OVERHEAD,
            "snapshot_overhead_met": overhead < TARGET_SNAPSHOT_OVERHEAD,
            "snapshots_taken_met": snapshots_taken >= min_snapshots,
            "tracing_noop_overhead_max": TARGET_TRACING_NOOP_OVERHEAD,
            "tracing_noop_overhead_met": noop_met,
        },
        "elapsed_s": round(time.perf_counter() - began, 2),
    }


def _table(r: dict[str, Any]) -> str:
    t = r["targets"]
    met = workloads.met
    lines = [
        f"agentsnap {r['agentsnap_version']} bus benchmark, {r['python_implementation']} "
        f"{r['python']}, {r['cpu_count']} CPUs, profile {r['profile']}",
        f"median of {r['repetitions']} interleaved repetitions (ratios: median of per-run ratios)",
        f"hand-off N={r['n']:,}, ping-pong N={r['pingpong_n']:,}, ring {r['ring_agents']} agents x "
        f"{r['ring_tokens']} tokens = {r['ring_n']:,} messages",
        "",
        f"{'baseline vs measured':<34}{'baseline msg/s':>17}{'measured msg/s':>17}{'ratio':>9}",
        f"{'hand-off: asyncio.Queue vs bus':<34}{r['queue_msgs_per_s']:>17,.0f}"
        f"{r['bus_msgs_per_s']:>17,.0f}{r['ratio_vs_queue']:>9.3f}",
        f"{'ping-pong: 2 Queues vs 2 agents':<34}{r['queue_pingpong_msgs_per_s']:>17,.0f}"
        f"{r['pingpong_msgs_per_s']:>17,.0f}{r['pingpong_ratio']:>9.3f}",
        f"{'ring: no snapshots vs every 0.1 s':<34}{r['nosnapshot_msgs_per_s']:>17,.0f}"
        f"{r['snapshot_msgs_per_s']:>17,.0f}"
        f"{1 - r['snapshot_overhead']:>9.3f}",
        f"{'tracing: off vs SDK, in memory':<34}{r['tracing_sdk_off_msgs_per_s']:>17,.0f}"
        f"{r['tracing_sdk_msgs_per_s']:>17,.0f}{1 - r['tracing_sdk_overhead']:>9.3f}",
        f"{'delivery log: off vs on (default)':<34}{r['delivery_log_off_msgs_per_s']:>17,.0f}"
        f"{r['delivery_log_msgs_per_s']:>17,.0f}{1 - r['delivery_log_overhead']:>9.3f}",
        "",
        f"snapshots taken per run: {r['snapshots_per_repetition']} "
        f"(need >= {r['min_snapshots_required']}: {met(t['snapshots_taken_met'])})",
        f"ratio_vs_queue    = {r['ratio_vs_queue']:.3f}  "
        f"target >= {t['ratio_vs_queue_min']}: {met(t['ratio_vs_queue_met'])}",
        f"snapshot_overhead = {r['snapshot_overhead']:.3f}  "
        f"target <  {t['snapshot_overhead_max']}: {met(t['snapshot_overhead_met'])}",
        _tracing_line(r),
        f"tracing_sdk_overhead  = {r['tracing_sdk_overhead']:.3f}  "
        f"(SDK, 3 spans per message, N={r['tracing_sdk_n']:,}; no target)",
        f"delivery_log_overhead = {r['delivery_log_overhead']:.3f}  "
        f"(spread {r['delivery_log_overhead_spread'][0]:.3f} .. "
        f"{r['delivery_log_overhead_spread'][1]:.3f}; no target)",
        f"total {r['elapsed_s']} s",
    ]
    return "\n".join(lines)


def _rounded(values: list[float] | None, index: int) -> float | None:
    return None if values is None else round(values[index], 1)


def _tracing_line(r: dict[str, Any]) -> str:
    t = r["targets"]
    if r["tracing_noop_overhead"] is None:
        why = "--quick" if r["profile"] == "quick" else "valgrind's callgrind is not installed"
        return f"tracing_noop_overhead: not measured ({why})"
    return (
        f"tracing_noop_overhead = {r['tracing_noop_overhead']:.4f}  "
        f"({r['tracing_noop_instructions_per_msg']:,.0f} vs "
        f"{r['tracing_off_instructions_per_msg']:,.0f} instructions per message; "
        f"identical sides differ by {r['tracing_noop_resolution']:.4f})  "
        f"target <  {t['tracing_noop_overhead_max']}: "
        f"{workloads.met(t['tracing_noop_overhead_met'])}"
    )


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 5 and sys.argv[1] == "--instructions-of":
        handoff_instructions_child(sys.argv[2], (int(sys.argv[3]), int(sys.argv[4])))
        return 0
    parser = workloads.argument_parser(__doc__, "smaller and fewer runs, no callgrind (< 60 s)")
    args = parser.parse_args(argv)

    results = asyncio.run(measure("quick" if args.quick else "full"))
    workloads.report(results, args.json, _table)
    if not results["targets"]["snapshots_taken_met"]:
        print(
            f"error: a run with snapshots took only {results['snapshots_taken']}; "
            f"the overhead figure needs at least {results['min_snapshots_required']}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
