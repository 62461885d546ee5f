"""A worker: hosts some agents of a run spread over processes, and records their parts.

```text
agentsnap worker --nats nats://127.0.0.1:4222 --db postgresql://127.0.0.1/db
    --app myproject.bank:make_app --run RUN --group 0/3
```

A worker claims its agents in the store (a lease per agent, renewed every third of its time
to live: a second worker for one of them is refused), consumes what is sent to them from the
run's stream, delivers it, and writes its part of every snapshot the run's coordinator
begins. It stops cleanly on SIGTERM or SIGINT (``stop``): snapshots in progress fail (the
part says why), its consumers and leases are let go.

A NATS server that goes away and comes back (a restart) is waited for: the worker publishes
what it queued meanwhile and consumes from where it stopped. One that stays away longer than
``nats_patience`` seconds makes the worker give up: it stops as on ``stop()``, and
[`run`][agentsnap.distributed.Worker.run] raises a
[`TransportError`][agentsnap.exceptions.TransportError] saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection
from datetime import timedelta
from typing import TYPE_CHECKING

import orjson

from agentsnap.distributed.app import App, check_run
from agentsnap.distributed.host import Host, control_subject
from agentsnap.exceptions import ConfigurationError, TransportError
from agentsnap.limits import MAX_WORKER_NAME, check_text
from agentsnap.liveness import owner_id
from agentsnap.records import utcnow

if TYPE_CHECKING:
    from agentsnap.jetstream import JetStreamLink
    from agentsnap.store import Store

__all__ = ["AgentsHeld", "Worker"]

logger = logging.getLogger("agentsnap.distributed")


class AgentsHeld(ConfigurationError):
    """Another live worker hosts some of the agents this one was to host."""


class Worker:
    """Hosts some agents of a run on NATS JetStream, writing their parts of its snapshots.

    Args:
        link: The connection to NATS.
        store: The run's store (which holds the run: its coordinator created it).
        run_id: The run.
        app: Every agent of the run.
        agents: The names of those hosted here.
        name: The worker's name in the run; by default ``host:pid:token``.
        lease: Seconds a claim on the agents holds without renewal.
        nats_patience: Seconds the worker waits for a lost NATS server to come back before
            it gives up (and stops).
    """

    def __init__(
        self,
        link: JetStreamLink,
        store: Store,
        run_id: str,
        app: App,
        agents: Collection[str],
        *,
        name: str | None = None,
        lease: float = 10.0,
        nats_patience: float = 60.0,
    ) -> None:
        hosted = {agent.name: agent for agent in app.agents if agent.name in set(agents)}
        if not hosted:
            raise ConfigurationError("a worker hosts at least one of the app's agents")
        self.name = (
            owner_id()
            if name is None
            else check_text(name, "worker name", MAX_WORKER_NAME, "use a shorter name")
        )
        self.run_id = run_id
        self.store = store
        self.agents = sorted(hosted)
        self.lease = lease
        if nats_patience <= 0:
            raise ConfigurationError(
                f"nats_patience is a number of seconds above 0, not {nats_patience}"
            )
        self.nats_patience = nats_patience
        self.error: TransportError | None = None
        """Why the worker stopped on its own (its NATS server stayed away), if it did."""
        self.host = Host(link, store, run_id, app.names, hosted, worker=self.name)
        self._app = app
        self._link = link
        self._heartbeat: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self.stopped = asyncio.Event()
        """Set when the worker stops (asked to, or its claim on the agents was lost)."""

    async def _claim(self) -> None:
        expires = utcnow() + timedelta(seconds=self.lease)
        held = await self.store.claim_agents(self.run_id, self.name, self.agents, expires)
        if held:
            described = ", ".join(f"{lease.agent} by {lease.owner}" for lease in held)
            raise AgentsHeld(
                f"run {self.run_id}: agents already hosted by another live worker ({described}); "
                "stop it first, or host other agents"
            )

    async def start(self) -> None:
        """Claim the agents, then start consuming and delivering.

        Raises:
            AgentsHeld: Another live worker hosts some of the agents.
            NotFoundError: The store holds no such run.
            ConfigurationError: The run is not one of this app's, or it has ended
                ([`check_run`][agentsnap.distributed.check_run]).
        """
        check_run(await self.store.get_run(self.run_id), self._app)
        await self._claim()
        self._heartbeat = asyncio.get_running_loop().create_task(
            self._renew(), name=f"agentsnap:worker-lease:{self.name}"
        )
        self._watchdog = asyncio.get_running_loop().create_task(
            self._watch_link(), name=f"agentsnap:worker-link:{self.name}"
        )
        await self.host.start()
        logger.info("worker %s hosts %s of run %s", self.name, ", ".join(self.agents), self.run_id)

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                await self._claim()
            except AgentsHeld as exc:
                logger.error("worker %s lost its agents: %s", self.name, exc)
                self.stopped.set()
                return
            except Exception as exc:  # the store is away: the claim holds a while yet
                logger.warning("worker %s could not renew its claim: %r", self.name, exc)

    async def _watch_link(self) -> None:
        link = self._link
        while not self.stopped.is_set():
            await asyncio.sleep(min(1.0, self.nats_patience / 4))
            away = link.away_for()
            if away > self.nats_patience:
                self.error = TransportError(
                    f"worker {self.name} gave up: the NATS server at {link.url} has been "
                    f"unreachable for {away:.0f} s (more than --nats-patience "
                    f"{self.nats_patience:g}); start it again, then start the worker again"
                )
                logger.error("%s", self.error)
                self.stopped.set()
                return

    async def request_snapshot(self) -> None:
        """Ask the run's coordinator to begin a snapshot (it numbers every snapshot)."""
        body = orjson.dumps({"snapshot": self.name})
        await self._link.nc.publish(control_subject(self.run_id), body)

    def stop(self) -> None:
        """Have [`run`][agentsnap.distributed.Worker.run] return (a signal handler calls it)."""
        self.stopped.set()

    async def run(self) -> None:
        """Start, serve until ``stop()``, and close.

        Raises:
            TransportError: The worker gave up on its NATS server.
        """
        await self.start()
        try:
            await self.stopped.wait()
        finally:
            await self.close()
        if self.error is not None:
            raise self.error

    async def close(self) -> None:
        """Stop delivering, let the snapshots in progress fail here, release the agents."""
        for task in (self._heartbeat, self._watchdog):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._heartbeat = self._watchdog = None
        # A server that is away takes nothing: do not wait for it to confirm what is queued.
        await self.host.close(drain=0.0 if self.error is not None else 10.0)
        try:
            await self.store.release_agents(self.run_id, self.name)
        except Exception as exc:  # they expire by themselves
            logger.warning("worker %s: agents not released: %r", self.name, exc)
