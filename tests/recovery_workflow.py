"""A small deterministic workflow that ``tests/test_recovery.py`` kills and resumes.

Jobs go from a dispatcher round a ring of workers to a tally. The tally is also a critic: it
rejects a worker's result that is a multiple of 7 until that worker has been told to check
its work, so runs roll back as well. Each job takes a fixed path through the workers and adds
a fixed value to the tally, so the final result does not depend on the interleaving: a run
resumed from any consistent cut must end with the result of an uninterrupted run.

The input is sent once, at the start. The first snapshot is taken right before it (the
runtime's start snapshot), and the later ones every few deliveries, so every snapshot after
the first holds all of it in its cut. ``Runtime.resume`` does not restore input sent after
the cut it resumes from, so a run must be resumed from a snapshot numbered 2 or more; the
resume mode prints the number.

Usage::

    python tests/recovery_workflow.py DB --run-id RUN_ID [--seed N] [--hold-after K] [--slow]
    python tests/recovery_workflow.py DB --resume RUN_ID [--seed N]

``DB`` is an SQLite file. The result is printed as one line of JSON. With ``--hold-after K``
the run stops making progress once K complete snapshots are committed: the next worker
handler, after changing its state and sending, prints ``HOLDING`` and waits forever for the
process to be killed. Every worker handler sleeps a little, so that snapshots are written
while the run goes on; ``--slow`` makes it sleep longer, so that the run lasts long enough
to be killed at a random moment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from pydantic import BaseModel, Field

from agentsnap import (
    Agent,
    AgentState,
    Context,
    Message,
    Runtime,
    Snapshot,
    SnapshotPolicy,
    SnapshotStatus,
)
from agentsnap.store.sql import SqlStore
from agentsnap.testing import SeededScheduler

JOBS = 40
WORKERS = 3
BATCH = 10
SNAPSHOT_EVERY = 15
WORKER_NAMES = [f"worker-{i}" for i in range(WORKERS)]


class CountingStore(SqlStore):
    """An SqlStore that counts the complete snapshots it has committed."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.complete = 0

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        await super().save_snapshot(snapshot)
        if snapshot.status is SnapshotStatus.COMPLETE:
            self.complete += 1


class DispatcherState(AgentState):
    dispatched: int = 0


class Dispatcher(Agent[DispatcherState]):
    """Sends each job of a batch to its first worker."""

    async def handle(self, message: Message, ctx: Context[DispatcherState]) -> None:
        for job in message.payload_as(dict[str, list[int]])["jobs"]:
            self.state.dispatched += 1
            first = WORKER_NAMES[job % WORKERS]
            ctx.send(first, {"job": job, "hops": 2 + job % 5, "value": job}, kind="work")


class WorkerState(AgentState):
    handled: int = 0


class Worker(Agent[WorkerState]):
    """Mixes its index into the job's value and passes it on, then hands it to the tally."""

    def __init__(self, name: str, index: int, store: CountingStore, options: Any) -> None:
        super().__init__(name)
        self.index = index
        self.store = store
        self.options = options

    async def handle(self, message: Message, ctx: Context[WorkerState]) -> None:
        payload = message.payload_as(dict[str, int])
        self.state.handled += 1
        value = (payload["value"] * 31 + 7 * self.index + 3) % 1009
        if payload["hops"] > 0:
            following = WORKER_NAMES[(self.index + 1) % WORKERS]
            work = {"job": payload["job"], "hops": payload["hops"] - 1, "value": value}
            ctx.send(following, work, kind="work")
        else:
            result = {"job": payload["job"], "value": value, "checked": bool(ctx.feedback)}
            ctx.send("tally", result, kind="result")
        hold_after = self.options.hold_after
        if hold_after is not None and self.store.complete >= hold_after:
            print("HOLDING", flush=True)
            await asyncio.Event().wait()
        # Let the snapshot writes go on while the run does.
        await asyncio.sleep(0.002 if self.options.slow else 0.0002)


class TallyState(AgentState):
    total: int = 0
    jobs: list[int] = Field(default_factory=list)


class Result(BaseModel):
    job: int
    value: int
    checked: bool


class Tally(Agent[TallyState]):
    """Adds up the results; rejects an unchecked result that is a multiple of 7."""

    async def handle(self, message: Message, ctx: Context[TallyState]) -> None:
        result = message.payload_as(Result)
        if result.value % 7 == 0 and not result.checked:
            ctx.reject(
                message.src,
                f"result {result.value} of job {result.job} is a multiple of 7: check it",
            )
        self.state.total += result.value
        self.state.jobs.append(result.job)


def add_agents(runtime: Runtime, store: CountingStore, options: Any) -> None:
    runtime.add(Dispatcher("dispatcher"))
    for index, name in enumerate(WORKER_NAMES):
        runtime.add(Worker(name, index, store, options))
    runtime.add(Tally("tally"))


async def main(options: Any) -> dict[str, Any]:
    store = CountingStore(f"sqlite:///{options.db}")
    runtime = Runtime(
        store=store,
        scheduler=SeededScheduler(options.seed),
        snapshot_policy=SnapshotPolicy(every_deliveries=SNAPSHOT_EVERY),
        run_id=options.resume or options.run_id,
    )
    resumed_from: int | None = None
    try:
        async with runtime:
            add_agents(runtime, store, options)
            if options.resume:
                resumed_from = (await runtime.resume()).seq
            else:
                for start in range(0, JOBS, BATCH):
                    batch = list(range(start, min(start + BATCH, JOBS)))
                    runtime.send("dispatcher", {"jobs": batch}, kind="jobs")
            await runtime.run_until_idle()
            agents = runtime.agents
            tally = agents["tally"].state
            result = {
                "run_id": runtime.run_id,
                "resumed_from": resumed_from,
                "rollbacks": len(runtime.rollbacks),
                "dispatched": agents["dispatcher"].state.dispatched,
                "handled": {name: agents[name].state.handled for name in WORKER_NAMES},
                "tally": {"total": tally.total, "jobs": sorted(tally.jobs)},
            }
    finally:
        await store.close()
    return result


def parse(argv: list[str]) -> Any:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", help="SQLite database file")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--run-id", default=None, help="id of a new run")
    parser.add_argument("--resume", metavar="RUN_ID", default=None, help="resume this run")
    parser.add_argument("--hold-after", type=int, default=None)
    parser.add_argument("--slow", action="store_true")
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse(sys.argv[1:]))), sort_keys=True), flush=True)
