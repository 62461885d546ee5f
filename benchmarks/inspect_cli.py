"""How the inspection commands scale with the run: ``timeline`` in time, ``export`` in memory.

Runs are built once, each in its own SQLite file (WAL) by a ``Runtime(journal=True)``: the
ring of ``workloads.RING_AGENTS`` agents is sent, S times over, M / S / 5 tokens that make
5 hops each, and a snapshot is taken (and awaited) behind them: M messages journaled and S
snapshots in all, the run busy throughout (it goes idle, which flushes the journal, only
at the end).

* ``timeline_s400_vs_s100``: the time ``agentsnap timeline RUN -o run.svg`` spends (the
  library calls behind it: ``load_timeline`` then ``render(".svg")``, in this process) on a
  run of 400 snapshots, over the time on a run of 100 snapshots, both at M = 10,000
  messages. A timeline linear in snapshots plus messages keeps it near 1 (the messages cost
  the same on both sides); one that re-reads the journal for each snapshot makes it about 4.
  Target: at most 1.5.
* ``export_rss_1e5_vs_1e4``: the peak resident memory of ``agentsnap export RUN -o
  /dev/null`` on a run of M = 100,000 messages and 200 snapshots, over that on a run of
  M = 10,000 messages and 20 snapshots (each snapshot has up to 500 messages in flight).
  Each export runs the CLI in a new Python process, which reports its own peak resident
  set size (``VmHWM`` of ``/proc/self/status`` on Linux, where ``resource.getrusage``
  would carry this process's peak over; ``ru_maxrss`` elsewhere); the process's baseline
  (Python, SQLAlchemy, agentsnap) is in both. An export holding the whole run grows with
  it; a streaming one stays near 1. Target: at most 2.

Each ratio is measured in one run of this program: rounds (7, or 3 with ``--quick``) time
both sides one after the other, in an order flipped every round; the figure is the median
of the per-round ratios, with the lowest and highest beside it. ``--json`` prints a single
JSON object on stdout; ``--quick`` runs fewer rounds (well under 60 s, building the runs
included). Run it from the repository root with:

    python benchmarks/inspect_cli.py
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import workloads

from agentsnap import Runtime
from agentsnap.snapshot import SnapshotPolicy
from agentsnap.store.sql import SqlStore
from agentsnap.timeline import load_timeline, render

TIMELINE_MESSAGES = 10_000
TIMELINE_SNAPSHOTS = (100, 400)
EXPORT_MESSAGES = (10_000, 100_000)
EXPORT_STEP = 500  # messages per snapshot: the longer run has more of both
TARGETS = {"timeline_s400_vs_s100_max": 1.5, "export_rss_1e5_vs_1e4_max": 2.0}

# The child that exports: the CLI itself, then its own peak resident set, on standard error.
# Linux carries the parent's peak over into ru_maxrss across fork and exec, so the peak of
# the child's own memory is read from /proc (VmHWM) where there is one.
_EXPORT = """
import resource, sys
from agentsnap.cli import main
main(sys.argv[1:], standalone_mode=False)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    with open("/proc/self/status") as status:
        peak = next(int(li.split()[1]) for li in status if li.startswith("VmHWM:"))
except OSError:
    pass
print("maxrss_kb", peak, file=sys.stderr)
"""


HOPS = 5


async def build_run(path: Path, snapshots: int, messages: int) -> dict[str, Any]:
    """A journaled run of ``messages`` messages and ``snapshots`` snapshots, evenly spread.

    S times over: tokens of ``HOPS`` hops each, M / S messages' worth, are sent round the
    ring, and a snapshot is taken once they are on their way (it completes after them). The
    run does not go idle in between, so the journal is flushed as a busy run's is (every
    quarter second, and when a channel logged 128 sends), whatever S.
    """
    tokens = messages // snapshots // HOPS
    store = SqlStore(f"sqlite:///{path}")
    try:
        async with Runtime(
            store=store,
            journal=True,
            snapshot_policy=SnapshotPolicy(at_start=False, at_end=False),
        ) as runtime:
            nodes = workloads.add_ring(runtime, HOPS)
            for step in range(snapshots):
                for token in range(tokens):
                    runtime.send(nodes[token % len(nodes)].name, {"t": token, "s": step, "h": 1})
                await runtime.snapshot()
            await runtime.run_until_idle()
        counts = await store.snapshot_counts()
        segments = await store.load_journal(runtime.run_id)
    finally:
        await store.close()
    size = await asyncio.to_thread(os.path.getsize, path)
    sends = sum(s.last_seq - s.first_seq + 1 for s in segments if s.event == "send")
    return {
        "db": f"sqlite:///{path}",
        "run_id": runtime.run_id,
        "snapshots": counts.get(runtime.run_id, 0),
        "messages": sends,
        "journal_segments": len(segments),
        "bytes": size,
    }


async def timeline_seconds(run: dict[str, Any]) -> float:
    """What ``agentsnap timeline RUN -o run.svg`` spends, minus opening the database."""
    store = SqlStore(run["db"], create=False)
    try:
        gc.collect()
        start = time.perf_counter()
        timeline = await load_timeline(store, run["run_id"])
        render(timeline, ".svg")
        return time.perf_counter() - start
    finally:
        await store.close()


def export_peak_kb(run: dict[str, Any]) -> int:
    """Peak resident memory of ``agentsnap export`` of the run, in a process of its own."""
    args = ["export", run["run_id"], "--db", run["db"], "-o", "/dev/null"]
    done = subprocess.run(
        [sys.executable, "-c", _EXPORT, *args], capture_output=True, text=True, check=True
    )
    line = next(li for li in done.stderr.splitlines() if li.startswith("maxrss_kb"))
    return int(line.split()[1])


def ratios(pairs: list[tuple[float, float]]) -> dict[str, float]:
    found = [big / small for small, big in pairs]
    return {
        "median": round(statistics.median(found), 3),
        "min": round(min(found), 3),
        "max": round(max(found), 3),
    }


async def measure(profile: str, directory: Path) -> dict[str, Any]:
    rounds = 3 if profile == "quick" else 7
    began = time.perf_counter()
    small, large = [
        await build_run(workloads.fresh_db(directory, f"timeline-s{s}"), s, TIMELINE_MESSAGES)
        for s in TIMELINE_SNAPSHOTS
    ]
    light, heavy = [
        await build_run(workloads.fresh_db(directory, f"export-m{m}"), m // EXPORT_STEP, m)
        for m in EXPORT_MESSAGES
    ]
    built = time.perf_counter() - began

    timeline_pairs: list[tuple[float, float]] = []
    export_pairs: list[tuple[float, float]] = []
    for number in range(rounds):
        if number % 2 == 0:
            a = await timeline_seconds(small)
            b = await timeline_seconds(large)
            c = export_peak_kb(light)
            d = export_peak_kb(heavy)
        else:
            b = await timeline_seconds(large)
            a = await timeline_seconds(small)
            d = export_peak_kb(heavy)
            c = export_peak_kb(light)
        timeline_pairs.append((a, b))
        export_pairs.append((c, d))

    timeline = ratios(timeline_pairs)
    export = ratios(export_pairs)
    return {
        **workloads.environment("inspect_cli", profile, "sqlite", "sqlalchemy"),
        "rounds": rounds,
        "runs": {
            "timeline_s100": small,
            "timeline_s400": large,
            "export_m1e4": light,
            "export_m1e5": heavy,
        },
        "timeline_s400_vs_s100": timeline["median"],
        "timeline_s400_vs_s100_min": timeline["min"],
        "timeline_s400_vs_s100_max": timeline["max"],
        "timeline_s100_s": [round(a, 4) for a, _ in timeline_pairs],
        "timeline_s400_s": [round(b, 4) for _, b in timeline_pairs],
        "export_rss_1e5_vs_1e4": export["median"],
        "export_rss_1e5_vs_1e4_min": export["min"],
        "export_rss_1e5_vs_1e4_max": export["max"],
        "export_m1e4_maxrss_kb": [int(c) for c, _ in export_pairs],
        "export_m1e5_maxrss_kb": [int(d) for _, d in export_pairs],
        "targets": {
            **TARGETS,
            "timeline_s400_vs_s100_met": timeline["median"] <= TARGETS["timeline_s400_vs_s100_max"],
            "export_rss_1e5_vs_1e4_met": export["median"] <= TARGETS["export_rss_1e5_vs_1e4_max"],
        },
        "build_s": round(built, 1),
        "elapsed_s": round(time.perf_counter() - began, 1),
    }


def _table(r: dict[str, Any]) -> str:
    t = r["targets"]
    runs = r["runs"]
    lines = [
        f"inspection commands ({r['profile']}, {r['rounds']} rounds, "
        f"Python {r['python']}, SQLite {r['sqlite_version']})",
        *(
            f"  run {name}: {run['snapshots']} snapshots, {run['messages']:,} messages, "
            f"{run['journal_segments']:,} journal segments, {run['bytes'] / 1e6:.1f} MB"
            for name, run in runs.items()
        ),
        f"timeline_s400_vs_s100 = {r['timeline_s400_vs_s100']:.3f} "
        f"(min {r['timeline_s400_vs_s100_min']:.3f}, max {r['timeline_s400_vs_s100_max']:.3f})  "
        f"target <= {t['timeline_s400_vs_s100_max']}: "
        f"{workloads.met(t['timeline_s400_vs_s100_met'])}",
        f"  timeline s100: {statistics.median(r['timeline_s100_s']):.3f} s, "
        f"s400: {statistics.median(r['timeline_s400_s']):.3f} s (medians)",
        f"export_rss_1e5_vs_1e4 = {r['export_rss_1e5_vs_1e4']:.3f} "
        f"(min {r['export_rss_1e5_vs_1e4_min']:.3f}, max {r['export_rss_1e5_vs_1e4_max']:.3f})  "
        f"target <= {t['export_rss_1e5_vs_1e4_max']}: "
        f"{workloads.met(t['export_rss_1e5_vs_1e4_met'])}",
        f"  export peak RSS 1e4: {statistics.median(r['export_m1e4_maxrss_kb']) / 1024:.1f} MB, "
        f"1e5: {statistics.median(r['export_m1e5_maxrss_kb']) / 1024:.1f} MB (medians)",
        f"built the runs in {r['build_s']} s; total {r['elapsed_s']} s",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = workloads.argument_parser(__doc__, "fewer rounds (< 1 min)", directory=True)
    args = parser.parse_args(argv)
    with workloads.scratch_directory(args.dir) as directory:
        results = asyncio.run(measure("quick" if args.quick else "full", directory))
    workloads.report(results, args.json, _table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
