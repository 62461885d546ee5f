"""A run's coordinator as a process of its own, to be killed and taken over by the tests.

```text
python tests/coordinator_process.py NATS DB RUN DONE new CHAINS HOPS [EVERY]  # create, feed
python tests/coordinator_process.py NATS DB RUN DONE take-over         # take it over
```

It coordinates the bank of ``distributed_effects.py`` with a snapshot every tenth of a
second until the run is idle (``new`` sends a chain every ``EVERY`` seconds, all at once by
default); then, once the file ``DONE`` exists, it closes the run and
exits 0 (so that it may still be killed, and the run taken over, once the run is idle). It
prints, one a line and flushed: ``started`` once it holds the run (``new``), ``fed`` once
the input is in the run's stream (``new``),
``waiting`` as it starts waiting for the run's lease and ``took-over`` once it holds the run
(``take-over``: a standby, started while the coordinator it replaces still runs),
``complete SEQ TIME`` for every snapshot it completes (``TIME``: the wall clock), ``idle``
once the run is idle; and ``fenced`` with exit status 3 when another coordinator took the
run over from it.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path

from distributed_effects import chain_start, make_app

from agentsnap.distributed import DistributedRun
from agentsnap.exceptions import OwnershipLost
from agentsnap.jetstream import JetStreamLink
from agentsnap.records import RunStatus
from agentsnap.snapshot import SnapshotPolicy
from agentsnap.store.sql import SqlStore

LEASE = 2.0
"""Seconds the coordinator's lease holds: a suspended one is taken over that long after."""


def say(line: str) -> None:
    print(line, flush=True)


async def report(run: DistributedRun) -> None:
    seen = len(run.complete)
    while True:
        for snapshot in run.complete[seen:]:
            say(f"complete {snapshot.seq} {time.time():.6f}")
        seen = len(run.complete)
        await asyncio.sleep(0.005)


async def main(nats: str, db: str, run_id: str, done: str, mode: str, *rest: str) -> int:
    link = await JetStreamLink.connect(nats)
    store = SqlStore(db)
    policy = SnapshotPolicy(every_seconds=0.1)
    try:
        if mode == "new":
            run = DistributedRun(
                link, store, make_app(), run_id=run_id, policy=policy, part_timeout=8, lease=LEASE
            )
        else:
            # A standby: it waits for the run's coordinator to stop, then takes over.
            run = DistributedRun.take_over(
                link,
                store,
                make_app(),
                run_id,
                wait=600,
                policy=policy,
                part_timeout=8,
                lease=LEASE,
            )
            say("waiting")
        await run.start()
        reporter = asyncio.ensure_future(report(run))
        if mode == "new":
            say("started")
            chains, hops = int(rest[0]), int(rest[1])
            every = float(rest[2]) if len(rest) > 2 else 0.0
            for chain in range(chains):
                run.send(chain_start(chain), {"chain": chain, "hops": hops}, kind="go")
                if every:
                    await asyncio.sleep(every)
            await run.flush()
            say("fed")
        else:
            say("took-over")
        try:
            await run.run_until_idle()
        except OwnershipLost as exc:
            say(f"fenced: {exc}")
            await run.close(RunStatus.FAILED)
            return 3
        say("idle")
        finish = Path(done)
        while not await asyncio.to_thread(finish.exists):
            if run.fenced is not None:  # replaced while it waited
                say(f"fenced: {run.fenced}")
                await run.close(RunStatus.FAILED)
                return 3
            await asyncio.sleep(0.02)
        reporter.cancel()
        await run.close()
        return 0
    finally:
        await store.close()
        await link.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sys.exit(asyncio.run(main(*sys.argv[1:])))
