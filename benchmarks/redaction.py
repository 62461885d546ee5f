"""Cost of redaction per snapshot: the same snapshots with a redaction policy and without.

``AGENTS`` agents hold states of about 2 KB of canonical JSON with a card number, an email
and a list of tool calls; between two snapshots ``CHANGED`` of them handle a message (their
state changes, a payload with a card in it is delivered). Each round takes one snapshot in
a runtime with ``Runtime(redact=...)`` and one without (the order flipped every round),
timed from ``runtime.snapshot()`` until its handle resolves, the cut written to a
``SqlStore`` on an SQLite file. Reported: the median time of each and the median per-round
difference, in milliseconds per snapshot, with the lowest and highest; and the time of
``Redaction.snapshot`` alone on a cut of the same run (every state changed, so nothing comes
from its cache), per agent.

Run it with:

    python benchmarks/redaction.py --agents 200 --changed 20 --rounds 15
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from pydantic import Field

from agentsnap import Agent, AgentState, Context, Message, Redaction, Runtime, SnapshotPolicy
from agentsnap.store.sql import SqlStore


class Account(AgentState):
    card: str = "4111 1111 1111 1111"
    email: str = "ada@example.org"
    notes: list[str] = Field(default_factory=list)
    count: int = 0


class Clerk(Agent[Account]):
    async def handle(self, message: Message, ctx: Context[Account]) -> None:
        ctx.state.count += 1
        ctx.state.card = message.payload_as(dict[str, str])["card"]


def policy() -> Redaction:
    return Redaction(
        state=["card", "email"], payload=["card"], tool_arguments=["card"], key="bench key"
    )


async def setup(url: str, agents: int, redact: Redaction | None) -> Runtime:
    runtime = Runtime(
        store=SqlStore(url),
        redact=redact,
        snapshot_policy=SnapshotPolicy(at_start=False, at_end=False),
        replay=False,
        journal=False,
    )
    for i in range(agents):
        state = Account(notes=[f"note {i} {j} " + "x" * 80 for j in range(20)])
        runtime.add(Clerk(f"clerk{i}", state))
    await runtime.start()
    await runtime.snapshot()
    return runtime


async def one_snapshot(runtime: Runtime, changed: int, round_: int) -> float:
    for i in range(changed):
        card = f"4000 0000 0000 {round_ * changed + i:04d}"
        runtime.send(f"clerk{(round_ * changed + i) % len(runtime.agents)}", {"card": card})
    await runtime.run_until_idle()
    started = time.perf_counter()
    await runtime.snapshot()
    return time.perf_counter() - started


async def main(options: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        plain = await setup(f"sqlite:///{Path(tmp) / 'plain.db'}", options.agents, None)
        redacted = await setup(f"sqlite:///{Path(tmp) / 'red.db'}", options.agents, policy())
        on: list[float] = []
        off: list[float] = []
        diff: list[float] = []
        for r in range(options.rounds):
            pair = [(redacted, on), (plain, off)]
            if r % 2:
                pair.reverse()
            times = {}
            for runtime, kept in pair:
                took = await one_snapshot(runtime, options.changed, r)
                kept.append(took)
                times[id(kept)] = took
            diff.append(times[id(on)] - times[id(off)])
        cut = await plain.snapshot()
        await plain.close()
        await redacted.close()
    alone = []
    for _ in range(options.rounds):
        fresh = policy()
        started = time.perf_counter()
        fresh.snapshot(cut)
        alone.append(time.perf_counter() - started)
    ms = 1000.0
    return {
        "agents": options.agents,
        "changed_per_snapshot": options.changed,
        "snapshot_ms_redaction_off": round(statistics.median(off) * ms, 3),
        "snapshot_ms_redaction_on": round(statistics.median(on) * ms, 3),
        "redaction_cost_ms_per_snapshot": round(statistics.median(diff) * ms, 3),
        "redaction_cost_ms_min_max": [round(min(diff) * ms, 3), round(max(diff) * ms, 3)],
        "redact_whole_cut_us_per_agent": round(
            statistics.median(alone) / (options.agents + 1) * 1e6, 2
        ),
    }


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--changed", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    return parser.parse_args()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse())), indent=2))
