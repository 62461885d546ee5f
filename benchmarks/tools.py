"""What the ledger adds to a side-effecting tool call, measured against the bare function.

An agent handles N messages; in each handler it awaits one function once. Two variants run
as interleaved repetitions (the order flipped every repetition), on the same runtime setup:

* bare: the handler awaits the undecorated async function;
* tool: the handler awaits the same function declared ``@tool(side_effect=True)``, with a
  key derived from the call: arguments validated and fingerprinted, the key claimed in the
  ledger, the outcome recorded, the call added to the agent's ``tool_calls``.

``ledger_overhead_ms_<ledger> = (tool - bare) / N``, median over the repetitions, for the
in-memory ledger, SQLite (a file in a temporary directory; also with ``durable=True``, where
every ledger write is flushed to disk) and PostgreSQL (``--postgres URL``, else the
``AGENTSNAP_TEST_POSTGRES_URL`` environment variable; skipped without either). The SQL
ledgers write to their own database, apart from the runs (the runtime keeps those in
memory here), so that only the ledger is measured. Target: well under 1 ms on SQLite.

``--json`` prints a single JSON object on stdout; ``--quick`` runs fewer calls and
repetitions (about 10 s). Run it from the repository root with:

    python benchmarks/tools.py
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import workloads

from agentsnap import Agent, AgentState, Context, Message, Runtime, tool
from agentsnap.ledger import Ledger
from agentsnap.store.ledger import MemoryLedger
from agentsnap.store.sql_ledger import SqlLedger

TARGET_SQLITE_MS = 1.0
POSTGRES_VARIABLE = "AGENTSNAP_TEST_POSTGRES_URL"

# name: (calls per repetition, calls per durable repetition, repetitions)
PROFILES: dict[str, tuple[int, int, int]] = {
    "full": (2_000, 300, 9),
    "quick": (500, 100, 5),
}


async def pay(order: int, amount: int) -> dict[str, int]:
    """The function under test: as cheap as possible, so that the ledger is what shows."""
    return {"order": order, "amount": amount}


pay_tool = tool(side_effect=True, name="bench_pay")(pay)


class Payer(Agent[AgentState]):
    """Calls ``pay`` once per message, bare or as a tool."""

    def __init__(self, name: str, use_tool: bool) -> None:
        super().__init__(name)
        self.use_tool = use_tool

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        order = message.payload
        assert isinstance(order, int)
        if self.use_tool:
            await pay_tool(ctx, order=order, amount=5)
        else:
            await pay(order=order, amount=5)


async def timed_run(ledger: Ledger, calls: int, use_tool: bool) -> float:
    """Seconds to deliver ``calls`` messages to a payer, each making one call."""
    async with Runtime(ledger=ledger, run_id=uuid.uuid4().hex) as runtime:
        runtime.add(Payer("payer", use_tool))
        for order in range(calls):
            runtime.send("payer", order)
        gc.collect()
        began = time.perf_counter()
        await runtime.run_until_idle()
        return time.perf_counter() - began


async def overhead(
    make: Callable[[], Awaitable[Ledger]], calls: int, repetitions: int
) -> tuple[float, list[float], float]:
    """Median per-call overhead (ms) of the tool over the bare call, samples, bare µs."""
    ledger = await make()
    try:
        await timed_run(ledger, max(calls // 10, 20), use_tool=True)  # warm-up, not timed
        await timed_run(ledger, max(calls // 10, 20), use_tool=False)
        bare_s, tool_s = await workloads.pairs(
            lambda: timed_run(ledger, calls, use_tool=False),
            lambda: timed_run(ledger, calls, use_tool=True),
            repetitions,
        )
    finally:
        await ledger.close()
    samples = [(t - b) / calls * 1e3 for b, t in zip(bare_s, tool_s, strict=True)]
    bare_us = [b / calls * 1e6 for b in bare_s]
    return statistics.median(samples), samples, statistics.median(bare_us)


async def measure(profile: str, postgres: str | None, folder: Path) -> dict[str, Any]:
    """Run every comparison and return the results as a JSON-ready dict."""
    calls, durable_calls, repetitions = PROFILES[profile]
    began = time.perf_counter()

    async def memory() -> Ledger:
        return MemoryLedger()

    def sql(url: str, durable: bool = False) -> Callable[[], Awaitable[Ledger]]:
        async def make() -> Ledger:
            return SqlLedger(url, durable=durable)

        return make

    figures: dict[str, float | None] = {}
    samples: dict[str, list[float]] = {}
    bare: dict[str, float] = {}
    runs: list[tuple[str, Callable[[], Awaitable[Ledger]], int]] = [
        ("memory", memory, calls),
        ("sqlite", sql(f"sqlite:///{folder / 'ledger.db'}"), calls),
        ("sqlite_durable", sql(f"sqlite:///{folder / 'durable.db'}", durable=True), durable_calls),
    ]
    if postgres:
        runs.append(("postgres", sql(postgres), calls))
    else:
        figures["postgres"] = None
    for name, make, count in runs:
        median, found, bare_us = await overhead(make, count, repetitions)
        figures[name] = round(median, 4)
        samples[name] = [round(s, 4) for s in found]
        bare[name] = round(bare_us, 2)

    sqlite_ms = figures["sqlite"]
    assert sqlite_ms is not None
    return {
        **workloads.environment("agentsnap tools", profile, "sqlite"),
        "statistic": "median over repetitions of (tool - bare) / calls",
        "repetitions": repetitions,
        "calls": calls,
        "durable_calls": durable_calls,
        "bare_handler_call_us": bare["memory"],
        "ledger_overhead_ms_memory": figures["memory"],
        "ledger_overhead_ms_sqlite": sqlite_ms,
        "ledger_overhead_ms_sqlite_durable": figures["sqlite_durable"],
        "ledger_overhead_ms_postgres": figures["postgres"],
        "postgres": "measured"
        if postgres
        else f"skipped: no --postgres and no {POSTGRES_VARIABLE}",
        "samples_ms": samples,
        "targets": {"sqlite_ms_max": TARGET_SQLITE_MS, "sqlite_met": sqlite_ms < TARGET_SQLITE_MS},
        "elapsed_s": round(time.perf_counter() - began, 2),
    }


def _table(r: dict[str, Any]) -> str:
    def ms(value: float | None) -> str:
        return "skipped" if value is None else f"{value:.3f} ms"

    met = "MET" if r["targets"]["sqlite_met"] else "NOT MET"
    return "\n".join(
        [
            f"agentsnap {r['agentsnap_version']} tool ledger benchmark, "
            f"{r['python_implementation']} {r['python']}, SQLite {r['sqlite_version']}, "
            f"{r['cpu_count']} CPUs, profile {r['profile']}",
            f"per-call overhead of @tool(side_effect=True) over the bare call, median of "
            f"{r['repetitions']} interleaved repetitions of {r['calls']:,} calls "
            f"({r['durable_calls']:,} when durable)",
            f"bare call from a handler: {r['bare_handler_call_us']:.1f} µs",
            "",
            f"{'memory ledger':<24}{ms(r['ledger_overhead_ms_memory']):>14}",
            f"{'SQLite':<24}{ms(r['ledger_overhead_ms_sqlite']):>14}",
            f"{'SQLite, durable=True':<24}{ms(r['ledger_overhead_ms_sqlite_durable']):>14}",
            f"{'PostgreSQL':<24}{ms(r['ledger_overhead_ms_postgres']):>14}",
            "",
            f"ledger_overhead_ms_sqlite = {r['ledger_overhead_ms_sqlite']:.3f}  "
            f"target < {r['targets']['sqlite_ms_max']}: {met}",
            f"total {r['elapsed_s']} s",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = workloads.argument_parser(__doc__, "fewer calls and repetitions")
    parser.add_argument(
        "--postgres",
        default=os.environ.get(POSTGRES_VARIABLE),
        metavar="URL",
        help=f"PostgreSQL database to measure (default: ${POSTGRES_VARIABLE}); "
        "agentsnap's tables are created there if missing",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        results = asyncio.run(
            measure("quick" if args.quick else "full", args.postgres, Path(folder))
        )
    workloads.report(results, args.json, _table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
