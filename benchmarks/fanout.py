"""The instructions the bus spends per message, for ``valgrind --tool=callgrind``.

An agent ``src`` whose handler sends N messages to an agent ``sink`` that counts them, on the
default runtime without snapshots or journal (memory store, asyncio scheduler). Run it under
callgrind for two values of N; the difference of the instruction counts divided by the
difference of N is the cost of one message, send and delivery, free of start-up:

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/tmp/f5.out \
        python benchmarks/fanout.py 5000
    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/tmp/f15.out \
        python benchmarks/fanout.py 15000

Instruction counts do not depend on the load of the machine, unlike timings. ``--journal``
runs the same with ``journal=True``.
"""

from __future__ import annotations

import asyncio
import sys

from agentsnap import Agent, AgentState, Context, Message, Runtime, SnapshotPolicy


class Src(Agent[AgentState]):
    """Sends ``n`` messages to ``sink`` when told to."""

    def __init__(self, name: str, n: int) -> None:
        super().__init__(name)
        self.n = n

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        for i in range(self.n):
            ctx.send("sink", i)


class SinkState(AgentState):
    """What the sink has counted."""

    count: int = 0


class Sink(Agent[SinkState]):
    """Counts what it receives, in its state."""

    async def handle(self, message: Message, ctx: Context[SinkState]) -> None:
        self.state.count += 1


async def main(n: int, journal: bool = False) -> None:
    """Have ``src`` send ``n`` messages to ``sink`` and wait until every one was handled."""
    policy = SnapshotPolicy(at_start=False, at_end=False)
    async with Runtime(snapshot_policy=policy, journal=journal) as runtime:
        sink = Sink("sink")
        runtime.add(Src("src", n))
        runtime.add(sink)
        runtime.send("src", None)
        await runtime.run_until_idle()
    assert sink.state.count == n


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), journal="--journal" in sys.argv[2:]))
