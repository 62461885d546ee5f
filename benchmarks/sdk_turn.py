"""The cost of one pydantic-ai agent turn: alone, as an agentsnap agent, and under DBOS.

One turn is what an SDK agent does for one prompt: a model request that asks for a tool, the
tool call, and a model request that answers (a ``FunctionModel`` answering at once, so that
only the framework's cost is left). Three sides run the same pydantic-ai agent, side by side
in one process, in interleaved rounds (the order rotated every round):

* ``plain``: the agent alone, ``await agent.run(prompt)``, nothing durable: the baseline;
* ``agentsnap``: the agent with ``AgentsnapDurability`` run by a ``PydanticAIAgent`` on a
  ``Runtime`` over a ``SqlStore``, one message per turn (``runtime.send`` then
  ``run_until_idle``): each model request is a recorded step, written before the agent goes
  on; the tool goes through the ledger (claimed before it runs, its result recorded after);
  the delivery and the input are logged for replay after a crash, and the run takes a
  snapshot (a consistent cut of the team) as it goes idle after each turn. A new
  conversation each turn, as on the other sides, and a new run each round;
* ``dbos``: the agent with pydantic-ai's own ``DBOSDurability``, run in a ``@DBOS.workflow``
  per turn, its tool a ``@DBOS.step``: the workflow's start and end, each model request and
  the tool's result are written before the agent goes on.

Both durable sides commit each step to the database before going on, on the same database:
on SQLite one file (WAL, ``synchronous=NORMAL`` for both: a committed step survives a killed
process, not a power cut; DBOS is given an engine with those settings, since its own has
SQLite's default ``synchronous=FULL``, an fsync per commit, which agentsnap's ``SqlStore``
does not offer), on PostgreSQL one database (each commit waits for the WAL flush, the
server's default ``synchronous_commit=on``; DBOS's tables in its ``dbos`` schema). The
agentsnap side does more per turn: its tool call is claimed before it runs (exactly once),
where a DBOS step records its result after (at least once), and every turn keeps the team's
consistent cut recoverable.

Reported per database: each side's time per turn (median over rounds), each durable side's
overhead over ``plain`` per turn, and the headline ``overhead(agentsnap) / overhead(dbos)``,
median of the per-round ratios with its min and max (target: at most 1). ``--db`` chooses
SQLite, PostgreSQL (``--postgres URL``, default a ``sdk_bench`` database on the local server,
created when missing) or both; ``--quick`` runs fewer, smaller rounds; ``--json`` prints one
JSON object; ``--profile`` prints where the agentsnap side's time goes (cProfile). Run it
from the repository root with:

    python benchmarks/sdk_turn.py --db both
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import logging
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from dbos import DBOS, DBOSConfig
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.durable_exec.dbos import DBOSDurability
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentsnap import Runtime
from agentsnap.agents import Context
from agentsnap.integrations.pydantic_ai import AgentsnapDurability, PydanticAIAgent
from agentsnap.messages import Message
from agentsnap.store.ledger import ledger_for
from agentsnap.store.sql import SqlStore

PROMPT = "Where is order A17?"
POSTGRES = "postgresql://postgres@127.0.0.1:5432/sdk_bench"
SIDES = ("plain", "agentsnap", "dbos")


def turn_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Ask for the tool, then answer: at once."""
    returned = any(
        isinstance(part, ToolReturnPart) for message in messages for part in message.parts
    )
    if not returned:
        return ModelResponse(parts=[ToolCallPart("lookup", {"order": "A17"})])
    return ModelResponse(parts=[TextPart("Order A17 is packed and ships today.")])


def lookup(order: str) -> str:
    """Where an order is."""
    return f"order {order}: packed"


plain_agent = PydanticAgent(FunctionModel(turn_model), name="plain")
plain_agent.tool_plain(lookup)

snap_agent = PydanticAgent(
    FunctionModel(turn_model), name="snap", capabilities=[AgentsnapDurability()]
)
snap_agent.tool_plain(lookup)

dbos_agent = PydanticAgent(FunctionModel(turn_model), name="dbos", capabilities=[DBOSDurability()])
dbos_agent.tool_plain(DBOS.step(name="lookup")(lookup))


@DBOS.workflow(name="sdk_turn")
async def dbos_turn(prompt: str) -> str:
    """One turn of the DBOS side: a workflow."""
    result = await dbos_agent.run(prompt)
    return result.output


class OneTurn(PydanticAIAgent):
    """The agentsnap side: each message a new conversation, as a turn on the other sides."""

    async def handle(self, message: Message, ctx: Context[Any]) -> None:
        self.state.messages = []
        await super().handle(message, ctx)


def sqlite_engine(path: Path) -> sa.Engine:
    """DBOS's SQLite engine, as DBOS makes it, with agentsnap's WAL and ``synchronous``."""
    engine = sa.create_engine(f"sqlite:///{path}")

    @sa.event.listens_for(engine, "connect")
    def setup(dbapi_conn: Any, record: Any) -> None:
        dbapi_conn.isolation_level = "IMMEDIATE"
        dbapi_conn.execute("PRAGMA busy_timeout=30000")
        dbapi_conn.execute("PRAGMA foreign_keys=ON")
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")

    return engine


def fresh_postgres(url: str) -> None:
    """Drop and create the benchmark's PostgreSQL database."""
    base, _, name = url.rpartition("/")
    engine = sa.create_engine(f"{base}/postgres", isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()


async def timed(turn: Callable[[], Awaitable[Any]], turns: int) -> float:
    """Seconds per turn over ``turns`` turns."""
    started = time.perf_counter()
    for _ in range(turns):
        await turn()
    return (time.perf_counter() - started) / turns


def spread(values: list[float], digits: int = 3) -> list[float]:
    return [round(min(values), digits), round(max(values), digits)]


class AgentsnapSide:
    """The agentsnap side: one run (a ``Runtime``) per round, started and ended off the clock.

    A run's agent keeps a record of each of its tool calls in its state, and each turn ends
    with a snapshot of that state, so a run's turns get slower as it grows: a new run per
    round keeps every round at the same length, as a new workflow per turn does for DBOS.
    """

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        self.ledger = ledger_for(store)
        self.runtime: Runtime | None = None

    async def start(self) -> None:
        self.runtime = Runtime(store=self.store, ledger=self.ledger)
        self.runtime.add(OneTurn("clerk", snap_agent))
        await self.runtime.start()

    async def stop(self) -> None:
        if self.runtime is not None:
            await self.runtime.close()
            self.runtime = None

    async def turn(self) -> None:
        assert self.runtime is not None
        self.runtime.send("clerk", PROMPT)
        await self.runtime.run_until_idle()

    async def close(self) -> None:
        await self.stop()
        if self.ledger is not None:
            await self.ledger.close()
        await self.store.close()


async def plain_turn() -> None:
    await plain_agent.run(PROMPT)


async def dbos_side_turn() -> None:
    await dbos_turn(PROMPT)


async def one_database(
    db: str, url: str, dbos_config: DBOSConfig, *, rounds: int, turns: int, profile: bool
) -> dict[str, Any]:
    """Interleaved rounds of the three sides on one database."""
    DBOS(config=dbos_config)
    DBOS.launch()
    snap = AgentsnapSide(SqlStore(url))
    sides = {"plain": plain_turn, "agentsnap": snap.turn, "dbos": dbos_side_turn}
    per_turn: dict[str, list[float]] = {side: [] for side in SIDES}
    profiled = None
    try:
        await snap.start()
        for side in SIDES:  # warm up: imports, caches, connections, prepared statements
            await timed(sides[side], max(3, turns // 5))
        await snap.stop()
        for r in range(rounds):
            await snap.start()
            for side in SIDES[r % 3 :] + SIDES[: r % 3]:
                per_turn[side].append(await timed(sides[side], turns))
            await snap.stop()
        if profile:
            await snap.start()
            profiled = await profile_side(snap.turn, turns)
    finally:
        await snap.close()
        DBOS.destroy()
    ms = {side: [t * 1000 for t in per_turn[side]] for side in SIDES}
    over_snap = [s - p for s, p in zip(ms["agentsnap"], ms["plain"], strict=True)]
    over_dbos = [d - p for d, p in zip(ms["dbos"], ms["plain"], strict=True)]
    ratios = [s / d for s, d in zip(over_snap, over_dbos, strict=True)]
    result: dict[str, Any] = {
        "db": db,
        "rounds": rounds,
        "turns_per_round": turns,
        **{f"{side}_ms_per_turn": round(statistics.median(ms[side]), 3) for side in SIDES},
        "agentsnap_overhead_ms": round(statistics.median(over_snap), 3),
        "agentsnap_overhead_ms_spread": spread(over_snap),
        "dbos_overhead_ms": round(statistics.median(over_dbos), 3),
        "dbos_overhead_ms_spread": spread(over_dbos),
        "overhead_ratio": round(statistics.median(ratios), 3),
        "overhead_ratio_spread": spread(ratios),
        "target_met": statistics.median(ratios) <= 1.0,
    }
    if profiled is not None:
        result["profile"] = profiled
    return result


async def profile_side(turn: Callable[[], Awaitable[Any]], turns: int) -> str:
    """cProfile's 25 costliest functions (cumulative) over the agentsnap side's turns."""
    profiler = cProfile.Profile()
    profiler.enable()
    await timed(turn, turns)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(25)
    return out.getvalue()


def measure(db: str, postgres: str, quick: bool, profile: bool) -> dict[str, Any]:
    """The three sides on one database, on an event loop of their own.

    DBOS makes its thread pool the loop's default executor and shuts it down on
    ``DBOS.destroy()``: each database gets a new loop.
    """
    rounds, turns = (5, 20) if quick else (11, 100)
    with tempfile.TemporaryDirectory() as folder:
        if db == "sqlite":
            path = Path(folder) / "bench.db"
            url = f"sqlite:///{path}"
            config: DBOSConfig = {
                "name": "sdk_turn",
                "system_database_url": url,
                "system_database_engine": sqlite_engine(path),
            }
        else:
            fresh_postgres(postgres)
            url = postgres
            config = {"name": "sdk_turn", "system_database_url": postgres}
        config["log_level"] = "WARNING"
        return asyncio.run(
            one_database(db, url, config, rounds=rounds, turns=turns, profile=profile)
        )


def report(results: dict[str, Any]) -> str:
    lines = []
    for db in ("sqlite", "postgres"):
        if db not in results:
            continue
        r = results[db]
        lines += [
            f"{db}: {r['rounds']} interleaved rounds of {r['turns_per_round']} turns per side",
            f"  plain (no durability)      {r['plain_ms_per_turn']:8.3f} ms per turn",
            f"  agentsnap (SqlStore)       {r['agentsnap_ms_per_turn']:8.3f} ms per turn, "
            f"overhead {r['agentsnap_overhead_ms']:.3f} ms "
            f"({r['agentsnap_overhead_ms_spread'][0]}-{r['agentsnap_overhead_ms_spread'][1]})",
            f"  DBOS (DBOSDurability)      {r['dbos_ms_per_turn']:8.3f} ms per turn, "
            f"overhead {r['dbos_overhead_ms']:.3f} ms "
            f"({r['dbos_overhead_ms_spread'][0]}-{r['dbos_overhead_ms_spread'][1]})",
            f"  overhead agentsnap / DBOS  {r['overhead_ratio']:8.3f} "
            f"(min-max {r['overhead_ratio_spread'][0]}-{r['overhead_ratio_spread'][1]}); "
            f"target <= 1: {'met' if r['target_met'] else 'MISSED'}",
        ]
        if "profile" in r:
            lines.append(r["profile"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="sqlite")
    parser.add_argument("--postgres", default=POSTGRES, help="the PostgreSQL database's URL")
    parser.add_argument("--quick", action="store_true", help="fewer, smaller rounds")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--profile", action="store_true", help="profile the agentsnap side")
    options = parser.parse_args(argv)
    logging.getLogger("dbos").setLevel(logging.WARNING)
    dbs = ["sqlite", "postgres"] if options.db == "both" else [options.db]
    results: dict[str, Any] = {"profile": "quick" if options.quick else "full"}
    for db in dbs:
        results[db] = measure(db, options.postgres, options.quick, options.profile)
    print(json.dumps(results, indent=2) if options.json else report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
