"""How long a run spread over processes goes without a coordinator when its coordinator dies.

The run: six relays in a ring on three ``agentsnap worker`` processes, each relay bumping a
counter and passing its chain on (chains long enough never to end while measured), a
snapshot begun every tenth of a second. Its coordinator is a process of its own (this file,
with ``--coordinator``). Each round SIGKILLs the coordinator while the run is busy and times
``takeover_ms``: from the kill until the coordinator that took the run over stored its first
complete snapshot (the run's lease taken, the run read back from PostgreSQL and the stream,
every process rolled back to the last complete cut and resumed on the run's timeline, the
work after the cut redone in the order logged, a new snapshot's parts written, joined and
stored).

Two ways of taking over alternate, round by round:

* ``standby``: a coordinator started beforehand waits on the run's lease
  (``DistributedRun.take_over(..., wait=...)``) and takes the run over as soon as the lease's
  owner is gone (this host: at once; another host: once the lease expires);
* ``cold``: a coordinator process is started after the kill (the figure then includes
  starting Python and importing agentsnap).

It prints the median and the spread (lowest and highest) of each over ``--rounds`` rounds;
``--json`` prints one JSON object. ``--nats URL`` names the NATS server (JetStream on),
``--db URL`` the PostgreSQL database (by default ``AGENTSNAP_TEST_POSTGRES_URL``). Run it from
the repository root with:

    python benchmarks/distributed_takeover.py --db postgresql://postgres@127.0.0.1:5432/agentsnap
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agentsnap import Agent, AgentState, Context, Message
from agentsnap.distributed import App, DistributedRun
from agentsnap.jetstream import JetStreamLink
from agentsnap.snapshot import SnapshotPolicy
from agentsnap.store.sql import SqlStore

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RELAYS = 6
WORKERS = 3
CHAINS = 6
HOPS = 10**9
LEASE = 2.0
PATIENCE = 120.0
"""Seconds any step may take before the benchmark gives up."""


class Hop(BaseModel):
    hops: int


class RelayState(AgentState):
    passed: int = 0


class Relay(Agent[RelayState]):
    """Counts what it passes on, and passes every chain to the next relay."""

    def __init__(self, name: str, after: str) -> None:
        super().__init__(name, RelayState())
        self.after = after

    async def handle(self, message: Message, ctx: Context[RelayState]) -> None:
        hop = message.payload_as(Hop)
        self.state.passed += 1
        await asyncio.sleep(0.001)
        if hop.hops > 0:
            ctx.send(self.after, Hop(hops=hop.hops - 1))


def make_app() -> App:
    """The ring of relays (what ``agentsnap worker --app distributed_takeover:make_app`` loads)."""
    names = [f"relay-{i}" for i in range(RELAYS)]
    return App(agents=[Relay(name, names[(i + 1) % RELAYS]) for i, name in enumerate(names)])


# -- the coordinator process ----------------------------------------------------------------


def say(line: str) -> None:
    print(line, flush=True)


async def coordinate(nats: str, db: str, run_id: str, mode: str) -> None:
    """Coordinate the run (``new``: create and feed it; ``standby``: wait to take it over)."""
    link = await JetStreamLink.connect(nats)
    store = SqlStore(db)
    policy = SnapshotPolicy(every_seconds=0.1)
    if mode == "new":
        run = DistributedRun(link, store, make_app(), run_id=run_id, policy=policy, lease=LEASE)
    else:
        run = DistributedRun.take_over(
            link, store, make_app(), run_id, wait=3600, policy=policy, lease=LEASE
        )
        say("waiting")
    await run.start()
    if mode == "new":
        for chain in range(CHAINS):
            run.send(f"relay-{chain % RELAYS}", {"hops": HOPS})
        await run.flush()
    say("started")
    seen = len(run.complete)
    while True:  # killed by the benchmark
        for snapshot in run.complete[seen:]:
            say(f"complete {snapshot.seq} {time.time():.6f}")
        seen = len(run.complete)
        await asyncio.sleep(0.002)


# -- the benchmark ----------------------------------------------------------------------------


class Child:
    """A child process whose output goes to a log."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path) -> None:
        self.process = process
        self.log = log

    @classmethod
    async def start(cls, log: Path, *args: str) -> Child:
        path = os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "PYTHONPATH": path}
        with log.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                sys.executable, *args, env=env, stdout=out, stderr=out
            )
        return cls(process, log)

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()

    async def until(self, prefix: str, after: int = 0) -> str:
        deadline = time.monotonic() + PATIENCE
        while True:
            found = next((ln for ln in self.lines()[after:] if ln.startswith(prefix)), None)
            if found is not None:
                return found
            if self.process.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no {prefix!r} in {self.log}:\n{self.log.read_text()[-2000:]}")
            await asyncio.sleep(0.005)

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


async def measure(nats: str, db: str, rounds: int, logs: Path) -> dict[str, Any]:
    run_id = uuid.uuid4().hex
    started = 0

    async def coordinator(mode: str) -> Child:
        nonlocal started
        started += 1
        args = [str(HERE / "distributed_takeover.py"), "--coordinator", nats, db, run_id, mode]
        return await Child.start(logs / f"coordinator-{started}.log", *args)

    current = await coordinator("new")
    children = [current]
    figures: dict[str, list[float]] = {"standby": [], "cold": []}
    try:
        await current.until("started")
        for n in range(WORKERS):
            args = ["-m", "agentsnap", "worker", "--nats", nats, "--db", db]
            args += ["--app", "distributed_takeover:make_app", "--run", run_id]
            args += ["--agents", ",".join(f"relay-{i}" for i in range(n, RELAYS, WORKERS))]
            worker = await Child.start(logs / f"worker-{n}.log", *args)
            children.append(worker)
            await worker.until("worker ")
        for n in range(rounds * 2):
            mode = "standby" if n % 2 == 0 else "cold"
            standby = None
            if mode == "standby":
                standby = await coordinator("standby")
                children.append(standby)
                await standby.until("waiting")
            # Busy: snapshots complete one after the other under the current coordinator.
            seen = len(current.lines())
            await current.until("complete", seen)
            await current.until("complete", len(current.lines()))
            killed = time.time()
            await current.kill()
            if standby is None:
                standby = await coordinator("standby")
                children.append(standby)
            await standby.until("started")
            line = await standby.until("complete")
            figures[mode].append((float(line.split()[2]) - killed) * 1000)
            current = standby
    finally:
        for child in children:
            await child.kill()
        link = await JetStreamLink.connect(nats)
        with contextlib.suppress(Exception):
            await link.delete_stream(run_id)
        await link.close()
    return {
        "rounds": rounds,
        "durability": "PostgreSQL (synchronous commit), JetStream file storage",
        **{
            f"takeover_ms_{mode}": {
                "median": round(statistics.median(values), 1),
                "low": round(min(values), 1),
                "high": round(max(values), 1),
            }
            for mode, values in figures.items()
        },
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--coordinator":
        nats, db, run_id, mode = sys.argv[2:6]
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        asyncio.run(coordinate(nats, db, run_id, mode))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nats", default="nats://127.0.0.1:4222", help="the NATS server")
    parser.add_argument(
        "--db", default=os.environ.get("AGENTSNAP_TEST_POSTGRES_URL"), help="PostgreSQL URL"
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each way")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    options = parser.parse_args()
    if not options.db:
        parser.error("give --db postgresql://... (or set AGENTSNAP_TEST_POSTGRES_URL)")
    with tempfile.TemporaryDirectory(prefix="agentsnap-takeover-") as logs:
        results = asyncio.run(measure(options.nats, options.db, options.rounds, Path(logs)))
    if options.json:
        print(json.dumps(results))
        return
    durability = results["durability"]
    print(f"coordinator takeover after SIGKILL, {options.rounds} rounds each ({durability})")
    for mode in ("standby", "cold"):
        figure = results[f"takeover_ms_{mode}"]
        print(
            f"  {mode:8} median {figure['median']:8.1f} ms   "
            f"spread {figure['low']:.1f} .. {figure['high']:.1f} ms"
        )


if __name__ == "__main__":
    main()
