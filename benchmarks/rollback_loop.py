"""The instructions one manual rollback costs, for ``valgrind --tool=callgrind``.

Ten workers, each holding a distinct state of about 10 KB, on the memory store and the
default scheduler, without journal or snapshot policy. R times: a snapshot is taken and
awaited (the cut), every worker gets a ``work`` message that changes its state, the bus runs
until idle, ten more ``work`` messages are queued, and ``await runtime.rollback()`` goes back
to the cut with them queued; the bus then delivers the twenty messages the environment sent
after the cut again. The bus is idle whenever a rollback starts, so no handler is cancelled
and no poll waits for one: every run does the same work. Run it under callgrind for two
values of R; the difference of the instruction counts divided by the difference of R is the
cost of one round, free of start-up. ``--no-rollback`` runs the same rounds without the
rollback (the queued messages are delivered once); the difference of the two per-round
costs is what a rollback costs, its redelivered messages included:

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/tmp/r20.out \
        python benchmarks/rollback_loop.py 20
    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/tmp/r60.out \
        python benchmarks/rollback_loop.py 60
"""

from __future__ import annotations

import asyncio
import sys

from pydantic import Field

from agentsnap import Agent, AgentState, Context, Message, Runtime, SnapshotPolicy

WORKERS = 10


class WorkerState(AgentState):
    """A counter beside about 10 KB of notes."""

    count: int = 0
    notes: list[str] = Field(default_factory=list)


class Worker(Agent[WorkerState]):
    """Counts the ``work`` it receives."""

    async def handle(self, message: Message, ctx: Context[WorkerState]) -> None:
        self.state.count += 1


async def main(rounds: int, rollback: bool = True) -> None:
    """Take a cut, change every state and roll back to the cut, ``rounds`` times."""
    policy = SnapshotPolicy(at_start=False, at_end=False)
    async with Runtime(snapshot_policy=policy) as runtime:
        workers = []
        for i in range(WORKERS):
            worker = Worker(f"w{i}")
            worker.state = WorkerState(notes=[f"note {i} {j} " * 8 for j in range(100)])
            runtime.add(worker)
            workers.append(worker)
        for _ in range(rounds):
            await runtime.snapshot()
            await runtime.run_until_idle()
            for worker in workers:
                runtime.send(worker.name, "work")
            await runtime.run_until_idle()
            for worker in workers:
                runtime.send(worker.name, "work")
            if rollback:
                await runtime.rollback()
            await runtime.run_until_idle()
    assert all(worker.state.count == 2 * rounds for worker in workers)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), rollback="--no-rollback" not in sys.argv[2:]))
