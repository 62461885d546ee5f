"""One process of a run spread over processes: its bus on NATS, its agents, its recording.

Both a worker and the run's coordinator (which hosts the environment) are a ``Host``: every
process of the run is an endpoint of its bus, those hosted here are local, and the
[`JetStreamTransport`][agentsnap.jetstream.JetStreamTransport] carries the channels to and
from the others over NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from agentsnap.agents import Agent, Context
from agentsnap.bus import AsyncioScheduler, Bus, Channel
from agentsnap.distributed.recording import PartCoordinator
from agentsnap.jetstream import JetStreamLink, JetStreamTransport
from agentsnap.jetstream.codec import encode_token
from agentsnap.messages import ENVIRONMENT, Marker, Message
from agentsnap.state import check_round_trip

if TYPE_CHECKING:
    from agentsnap.records import SnapshotPart
    from agentsnap.store import Store

__all__ = ["CONTROL", "Host", "control_subject"]

logger = logging.getLogger("agentsnap.distributed")

CONTROL = "agentsnap-control"
"""First token of a run's control subject: outside the run's stream (``agentsnap.<run>.>``),
so that requests and notices are not stored with the channels."""


def control_subject(run_id: str) -> str:
    """The subject on which a run's workers ask its coordinator for snapshots, and tell it
    of the parts they wrote (plain NATS, not stored).
    """  # noqa: D205
    return f"{CONTROL}.{encode_token(run_id)}"


class Host:
    """The bus, agents and snapshot recording of one process of a run.

    Args:
        link: The connection to NATS.
        store: Where the parts go.
        run_id: The run.
        names: Every agent of the run.
        agents: The agents hosted here (a subset of ``names``).
        worker: This process's name in the run (its parts are stored under it).
        environment: Whether this process hosts the environment (the run's coordinator).

    Attributes:
        bus: The bus.
        transport: The transport on NATS.
        coordinator: Records this process's part of each snapshot.
        failures: Handler failures, as ``(agent, message id, error)``, oldest first.
    """

    def __init__(
        self,
        link: JetStreamLink,
        store: Store,
        run_id: str,
        names: Collection[str],
        agents: Mapping[str, Agent[Any]],
        *,
        worker: str,
        environment: bool = False,
    ) -> None:
        self.link = link
        self.store = store
        self.run_id = run_id
        self.worker = worker
        local = set(agents) | ({ENVIRONMENT} if environment else set())
        self.transport = JetStreamTransport(link, run_id, local)
        self.scheduler = AsyncioScheduler()
        self.bus = Bus(self.scheduler, self.transport)
        self.coordinator = PartCoordinator(
            self.bus, agents, run_id, worker=worker, local=local, write=self._write_part
        )
        self.scheduler.bind(self.bus, self._deliver)
        self.failures: list[tuple[str, str, str]] = []
        self._agents = dict(agents)
        self._contexts: dict[str, Context[Any]] = {}
        self._control = control_subject(run_id)
        for name in names:
            endpoint = self.bus.add(name, 0)
            agent = self._agents.get(name)
            if agent is None:
                continue
            blob = check_round_trip(name, agent.state)
            self._contexts[name] = Context(agent, endpoint, self.bus, self.coordinator, run_id)
            agent._state_changed = self.coordinator.changed
            self.coordinator.joined(endpoint, blob.hash)
        # Every channel between a process hosted here and any other exists from the start,
        # so that every recording sends a marker on every channel a message could take.
        endpoints = self.bus.endpoints
        for name in agents:
            for other in names:
                if other != name:
                    self.bus.channel(endpoints[other], name)
                    self.bus.channel(endpoints[name], other)
        if environment:
            for name in names:
                self.bus.channel(self.bus.environment, name)

    async def start(self) -> None:
        """Start consuming from the run's stream and delivering."""
        await self.transport.start()
        self.scheduler.start()

    async def close(self, drain: float = 10.0) -> None:
        """Stop delivering; the snapshots in progress fail here; wait for the part writes.

        Args:
            drain: Seconds to wait at most for the server to confirm what is still queued
                for it (a server that is away confirms nothing).
        """
        await self.scheduler.close()
        self.coordinator.abort_all(f"worker {self.worker} stopped before recording its part")
        await self.coordinator.drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.transport.flush(), drain)
        await self.transport.close()

    async def _write_part(self, part: SnapshotPart) -> None:
        await self.store.save_snapshot_part(part)
        notice = orjson.dumps({"part": part.seq, "worker": part.worker})
        try:
            await self.link.nc.publish(self._control, notice)
        except Exception as exc:  # the coordinator finds the part in the store anyway
            logger.debug("%s: notice of part %d not sent: %r", self.worker, part.seq, exc)

    async def _deliver(self, channel: Channel) -> None:
        item = channel.take()
        endpoint = channel.receiver
        snapshots = self.coordinator
        if type(item) is Marker:
            snapshots.on_marker(endpoint, channel, item.snapshot)
            return
        message: Message = item  # type: ignore[assignment]
        snapshots.on_message(endpoint, channel, message)
        ctx = self._contexts[endpoint.name]
        channel.delivered += 1
        ctx.message = message
        endpoint.busy = True
        try:
            await ctx.agent.handle(message, ctx)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("%s failed handling %s", endpoint.name, message.id)
            self.failures.append((endpoint.name, message.id, f"{type(exc).__name__}: {exc}"))
        finally:
            endpoint.busy = False
            ctx.message = None
            # A recording due while the handler ran is made now that it returned.
            wanted = snapshots.wanted.get(endpoint.name)
            if wanted:
                snapshots.record(endpoint, wanted)
