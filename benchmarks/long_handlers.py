"""Snapshots and rollbacks while agents are inside long handlers (model calls).

Ten agents, each handling messages that take 1 to 3 seconds (a sleep stands in for the model
call; the durations are drawn from a seeded generator and travel in the messages), on the
default ``AsyncioScheduler`` and a ``SqlStore`` (a SQLite file, WAL, in a temporary
directory). Two figures, each a ratio to the handlers' own duration:

``snapshot_latency_vs_handler``
    A snapshot is started at a random moment while every agent is inside a handler; its
    latency (from ``runtime.snapshot()`` until the snapshot is stored) is divided by the
    duration of the longest handler in progress at that moment: the time a snapshot that
    waits for handler boundaries could take. Each round takes one snapshot during every
    agent's first handler (states not changed since the run's first snapshot) and one
    during the second (states changed since, kept as the handler began), reported apart as
    ``..._first`` and ``..._later``; the headline is the median over both. Target: <= 0.1.

``rollback_time_vs_handler``
    A critic rejects a writer's output while the ten agents are inside their handlers. The
    time from the rejection until the run is idle again is divided by the duration of the
    longest handler, which the rollback has to redo (its message goes back in flight). A
    rollback that waits for the handlers to return pays the rest of the longest one first.
    Target: <= 1.2.

Every figure is the median over the rounds, with its min and max. ``--quick`` scales the
handlers down to 0.3 to 0.9 seconds and runs two rounds; ``--rounds N`` sets the rounds
(5 by default); ``--json`` prints a single JSON object. Run it from the repository root with:

    python benchmarks/long_handlers.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from agentsnap import Agent, AgentState, Context, Message, Runtime
from agentsnap.store.sql import SqlStore

AGENTS = 10


class WorkState(AgentState):
    done: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class Thinker(Agent[WorkState]):
    """Takes ``payload["seconds"]`` per message, then notes what it did."""

    def __init__(self, name: str) -> None:
        super().__init__(name, WorkState(notes=[f"{name} knows {i}" for i in range(20)]))
        self.busy = False
        self.seconds = 0.0
        self.started = asyncio.Event()

    async def handle(self, message: Message, ctx: Context[WorkState]) -> None:
        task = message.payload_as(dict[str, str | float])
        self.seconds = float(task["seconds"])
        self.busy = True
        self.started.set()
        try:
            await asyncio.sleep(self.seconds)
        finally:
            self.busy = False
        self.state.done.append(str(task["task"]))


class Writer(Agent[WorkState]):
    async def handle(self, message: Message, ctx: Context[WorkState]) -> None:
        ctx.send("critic", f"draft {message.payload}")


class Critic(Agent[WorkState]):
    """Rejects the writer's first draft once ``go`` is set; notes when it did."""

    def __init__(self, go: asyncio.Event) -> None:
        super().__init__("critic", WorkState())
        self.go = go
        self.rejected_at: float | None = None

    async def handle(self, message: Message, ctx: Context[WorkState]) -> None:
        await self.go.wait()
        if self.rejected_at is None:
            self.rejected_at = time.perf_counter()
            ctx.reject("writer", "not good enough")
        self.state.done.append(str(message.payload))


def _longest_in_progress(thinkers: list[Thinker]) -> float:
    """The duration of the longest handler running now."""
    return max(t.seconds for t in thinkers if t.busy)


async def _started(thinkers: list[Thinker]) -> None:
    for thinker in thinkers:
        await thinker.started.wait()
        thinker.started.clear()


async def snapshot_round(
    rng: random.Random, directory: Path, scale: float
) -> tuple[list[float], list[float]]:
    store = SqlStore(f"sqlite:///{directory / f'snap-{rng.random()}.db'}")
    thinkers = [Thinker(f"agent-{i:02d}") for i in range(AGENTS)]
    first: list[float] = []
    later: list[float] = []
    async with Runtime(store=store) as runtime:
        for thinker in thinkers:
            runtime.add(thinker)
        for n in range(2):
            durations = [scale * rng.uniform(1.0, 3.0) for _ in thinkers]
            for thinker, seconds in zip(thinkers, durations, strict=True):
                runtime.send(thinker.name, {"task": f"t{n}", "seconds": seconds})
            await _started(thinkers)
            await asyncio.sleep(rng.uniform(0.1, 0.4) * min(durations))
            began = time.perf_counter()
            longest = _longest_in_progress(thinkers)
            await runtime.snapshot()
            latency = time.perf_counter() - began
            (first if n == 0 else later).append(latency / longest)
            await runtime.run_until_idle()
    await store.close()
    return first, later


async def rollback_round(rng: random.Random, directory: Path, scale: float) -> float:
    store = SqlStore(f"sqlite:///{directory / f'roll-{rng.random()}.db'}")
    thinkers = [Thinker(f"agent-{i:02d}") for i in range(AGENTS)]
    go = asyncio.Event()
    critic = Critic(go)
    async with Runtime(store=store) as runtime:
        for thinker in thinkers:
            runtime.add(thinker)
        runtime.add(Writer("writer"))
        runtime.add(critic)
        durations = [scale * rng.uniform(1.0, 3.0) for _ in thinkers]
        for thinker, seconds in zip(thinkers, durations, strict=True):
            runtime.send(thinker.name, {"task": "t0", "seconds": seconds})
        runtime.send("writer", "essay")
        await _started(thinkers)
        await asyncio.sleep(rng.uniform(0.1, 0.4) * min(durations))
        go.set()
        await runtime.run_until_idle()
        idle = time.perf_counter()
        if len(runtime.rollbacks) != 1 or not all(t.state.done == ["t0"] for t in thinkers):
            raise RuntimeError("the run did not roll back once and redo every handler once")
    await store.close()
    assert critic.rejected_at is not None
    return (idle - critic.rejected_at) / max(durations)


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


async def main(rounds: int, scale: float) -> dict[str, Any]:
    rng = random.Random(20261125)
    first: list[float] = []
    later: list[float] = []
    rollbacks: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        for _ in range(rounds):
            one, two = await snapshot_round(rng, directory, scale)
            first += one
            later += two
            rollbacks.append(await rollback_round(rng, directory, scale))
    return {
        "agents": AGENTS,
        "handler_seconds": [round(scale * 1.0, 2), round(scale * 3.0, 2)],
        "rounds": rounds,
        "snapshot_latency_vs_handler": statistics.median(first + later),
        "snapshot_latency_vs_handler_first": _spread(first),
        "snapshot_latency_vs_handler_later": _spread(later),
        "rollback_time_vs_handler": statistics.median(rollbacks),
        "rollback_time_vs_handler_spread": _spread(rollbacks),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="shorter handlers, two rounds")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5)")
    options = parser.parse_args()
    rounds = options.rounds or (2 if options.quick else 5)
    result = asyncio.run(main(rounds, 0.3 if options.quick else 1.0))
    if options.json:
        json.dump(result, sys.stdout)
        print()
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
