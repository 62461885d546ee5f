"""The runtime: agents on a bus, with snapshots written to a store.

Example:
    ```python
    import asyncio
    from agentsnap import Agent, AgentState, Context, Message, Runtime

    class EchoState(AgentState):
        seen: int = 0

    class Echo(Agent[EchoState]):
        async def handle(self, message: Message, ctx: Context[EchoState]) -> None:
            self.state.seen += 1

    async def main() -> None:
        async with Runtime() as runtime:
            runtime.add(Echo("echo"))
            runtime.send("echo", {"text": "hello"})
            snapshot = await runtime.snapshot()
            await runtime.run_until_idle()
            print(snapshot.agents["echo"].state["seen"])

    asyncio.run(main())
    ```
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Self

from agentsnap.agents import Agent, Context
from agentsnap.bus import AsyncioScheduler, Bus, Channel, Scheduler
from agentsnap.exceptions import (
    ConfigurationError,
    DuplicateAgentError,
    HandlerFailed,
    RuntimeClosedError,
    UnknownAgentError,
)
from agentsnap.journal import Journal
from agentsnap.messages import ENVIRONMENT, Marker, Message
from agentsnap.records import RunInfo, Snapshot
from agentsnap.snapshot import SnapshotCoordinator, SnapshotHandle, SnapshotPolicy
from agentsnap.state import check_round_trip
from agentsnap.store.ledger import MemoryLedger, ledger_for
from agentsnap.store.memory import MemoryStore
from agentsnap.tools import Ledger, reconcile

if TYPE_CHECKING:
    from types import TracebackType

    from pydantic import BaseModel

    from agentsnap.messages import JsonValue
    from agentsnap.store import Store

__all__ = ["Runtime"]

logger = logging.getLogger("agentsnap")
_now_ns = time.time_ns


class Runtime:
    """Runs agents on an in-process bus and takes consistent snapshots of them.

    Use it as an async context manager, or call [`start`][agentsnap.Runtime.start] and
    [`close`][agentsnap.Runtime.close] yourself.

    Args:
        store: Where runs and snapshots go; a fresh [`MemoryStore`][agentsnap.MemoryStore]
            by default.
        scheduler: Decides which message is delivered next; an
            [`AsyncioScheduler`][agentsnap.AsyncioScheduler] by default.
        snapshot_policy: When to take snapshots without being asked.
        run_id: Id of the run (32 hex digits are generated when omitted).
        metadata: JSON recorded with the run.
        journal: Keep a journal of every send and delivery in the store (see
            [`agentsnap.journal`][agentsnap.journal]); off by default.
        ledger: Where side-effecting tool calls are recorded (see
            [`agentsnap.tools`][agentsnap.tools]); by default an
            [`SqlLedger`][agentsnap.store.sql_ledger.SqlLedger] on the store's database when
            the store is an ``SqlStore``, else a
            [`MemoryLedger`][agentsnap.store.ledger.MemoryLedger]. A ledger you pass is not
            closed by the runtime.

    Attributes:
        run_id: Id of this run.
        store: The store snapshots are written to.
        ledger: The tool-call ledger.
        failures: Every handler failure so far, oldest first.
    """

    def __init__(
        self,
        *,
        store: Store | None = None,
        scheduler: Scheduler | None = None,
        snapshot_policy: SnapshotPolicy | None = None,
        run_id: str | None = None,
        metadata: Mapping[str, JsonValue] | None = None,
        journal: bool = False,
        ledger: Ledger | None = None,
    ) -> None:
        self.run_id = run_id or uuid.uuid4().hex
        self.store: Store = store if store is not None else MemoryStore()
        self._owns_ledger = ledger is None
        if ledger is None:
            ledger = ledger_for(self.store) or MemoryLedger()
        self.ledger: Ledger = ledger
        self.failures: list[HandlerFailed] = []
        self._metadata = dict(metadata or {})
        self._scheduler: Scheduler = scheduler if scheduler is not None else AsyncioScheduler()
        self._bus = Bus(self._scheduler)
        self._journal = Journal(self._bus, self.store, self.run_id) if journal else None
        self._agents: dict[str, Agent[Any]] = {}
        self._snapshots = SnapshotCoordinator(self._bus, self._agents, self.run_id, self._persist)
        self._policy = snapshot_policy or SnapshotPolicy()
        self._countdown = self._policy.every_deliveries or 0
        self._timer: asyncio.Task[None] | None = None
        self._started = False
        self._run_created = False
        self._closed = False
        self._reported = 0
        self._scheduler.bind(self._bus, self._deliver)

    # -- set-up ---------------------------------------------------------------------------

    @property
    def agents(self) -> Mapping[str, Agent[Any]]:
        """The registered agents, by name."""
        return MappingProxyType(self._agents)

    @property
    def bus(self) -> Bus:
        """The bus (channels, counters), for inspection and tests."""
        return self._bus

    def add(self, agent: Agent[Any]) -> Agent[Any]:
        """Register an agent and return it.

        Raises:
            DuplicateAgentError: An agent with the same name is registered.
            StateNotSerializable: The agent's state is not JSON, or does not survive a JSON
                round trip; the error names the field.
        """
        self._check_open()
        if not isinstance(agent, Agent):
            raise ConfigurationError(
                f"Runtime.add() takes an agentsnap.Agent, got {type(agent).__name__}"
            )
        if agent.name in self._agents:
            raise DuplicateAgentError(agent.name)
        blob = check_round_trip(agent.name, agent.state)
        coordinator = self._snapshots
        # A newcomer records the snapshots in progress at its first moment (joined() below).
        epoch = min(coordinator.active) - 1 if coordinator.active else coordinator.last_seq
        self._agents[agent.name] = agent
        endpoint = self._bus.add(agent.name, epoch)
        endpoint.context = Context(agent, endpoint, self._bus, coordinator, self.run_id)
        endpoint.context.ledger = self.ledger
        coordinator.joined(endpoint, blob.hash)
        return agent

    async def start(self) -> None:
        """Record the run in the store and start delivering messages."""
        self._check_open()
        if self._started:
            return
        self._started = True
        await self._ensure_run()
        self._scheduler.start()
        if self._journal is not None:
            self._journal.start()
        if self._policy.every_seconds is not None:
            self._timer = asyncio.get_running_loop().create_task(
                self._tick(self._policy.every_seconds), name="agentsnap:snapshot-timer"
            )

    async def close(self) -> None:
        """Stop delivering, fail the snapshots still in progress, and wait for store writes.

        Messages still queued stay on their channels; nothing is handled after this.
        """
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            await asyncio.gather(self._timer, return_exceptions=True)
        await self._scheduler.close()
        self._snapshots.abort_all("the runtime was closed before the snapshot completed")
        await self._snapshots.drain()
        if self._journal is not None:
            await self._journal.close()
        try:
            if self._started:  # effects no final state holds were abandoned by rollbacks
                await reconcile(self.ledger, self.run_id, [a.state for a in self._agents.values()])
        finally:
            if self._owns_ledger:
                await self.ledger.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- driving a run ------------------------------------------------------------------

    def send(
        self,
        to: str,
        payload: JsonValue | BaseModel = None,
        *,
        kind: str = "message",
        headers: Mapping[str, str] | None = None,
    ) -> Message:
        """Inject work: send a message to agent ``to`` from the environment.

        The message travels on the channel ``$env -> to`` and belongs to snapshots like any
        other message.

        Raises:
            UnknownAgentError: ``to`` is not a registered agent.
            PayloadNotSerializable: ``payload`` is not JSON.
        """
        if self._closed:
            self._check_open()
        return self._bus.send(self._bus.environment, to, payload, kind, headers)

    def snapshot(self, initiator: str | None = None) -> SnapshotHandle:
        """Start a coordinated snapshot; await the handle for the completed snapshot.

        Must be called from within the event loop. The bus keeps running while the snapshot
        is taken; deterministic schedulers complete it as the run is driven.

        Args:
            initiator: Name of the agent that starts it, or ``None`` for the runtime.

        Raises:
            UnknownAgentError: ``initiator`` is not a registered agent.
            ConfigurationError: Called outside a running event loop.
        """
        self._check_open()
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise ConfigurationError(
                "Runtime.snapshot() must be called from a coroutine running in the event loop "
                "(inside an async function), since the snapshot completes asynchronously"
            ) from None
        endpoint = None
        if initiator is not None:
            if initiator not in self._agents:
                raise UnknownAgentError(ENVIRONMENT, initiator, list(self._agents))
            endpoint = self._bus.endpoints[initiator]
        return self._snapshots.begin(endpoint)

    @property
    def snapshots_in_progress(self) -> int:
        """How many snapshots have started and not yet completed or failed."""
        return len(self._snapshots.active)

    async def run_until_idle(self, *, raise_failures: bool = True) -> None:
        """Deliver until no message is left and no handler runs; then wait for the writes.

        Every snapshot completed so far, and the journal when there is one, is in the store
        when this returns.

        Args:
            raise_failures: Raise the first handler failure that happened during this call.
                The other agents kept running regardless; all failures are in ``failures``.

        Raises:
            HandlerFailed: A handler raised (when ``raise_failures``); the cause is attached.
        """
        await self.start()
        while True:
            await self._scheduler.run_until_idle()
            await self._snapshots.drain()
            if not self._has_queued():
                break
        if self._journal is not None:
            await self._journal.flush()
        if raise_failures and len(self.failures) > self._reported:
            first = self.failures[self._reported]
            self._reported = len(self.failures)
            raise first
        self._reported = len(self.failures)

    async def list_snapshots(self) -> list[Snapshot]:
        """Every snapshot of this run held by the store, in the order they were started."""
        return await self.store.list_snapshots(self.run_id)

    # -- delivery -------------------------------------------------------------------------

    async def _deliver(self, channel: Channel) -> None:
        item = channel.queue.popleft()
        endpoint = channel.receiver
        snapshots = self._snapshots
        if type(item) is Marker:
            snapshots.on_marker(endpoint, channel, item.snapshot)
            return
        message: Message = item  # type: ignore[assignment]
        if snapshots.active:
            snapshots.on_message(endpoint, channel, message)
        channel.delivered += 1
        log = channel.delivered_log
        if log is not None:
            log.append(message.seq)
            log.append(_now_ns() // 1000)
        ctx = endpoint.context
        assert ctx is not None, "only agents receive messages"
        ctx.message = message
        endpoint.busy = True
        try:
            await ctx.agent.handle(message, ctx)
        except Exception as exc:
            self._handler_failed(endpoint.name, message, exc)
        finally:
            endpoint.busy = False
            ctx.message = None
            if endpoint.record_wanted:
                snapshots.record(endpoint, endpoint.record_wanted)
        if self._countdown:
            self._countdown -= 1
            if not self._countdown:
                self._countdown = self._policy.every_deliveries or 0
                self._policy_snapshot()

    def _handler_failed(self, agent: str, message: Message, exc: Exception) -> None:
        failure = HandlerFailed(agent, message, exc)
        failure.__cause__ = exc
        self.failures.append(failure)
        logger.error("%s", failure, exc_info=exc)

    def _policy_snapshot(self) -> None:
        if len(self._snapshots.active) < self._policy.max_in_progress:
            self._snapshots.begin(None)

    async def _tick(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            self._policy_snapshot()

    async def _ensure_run(self) -> None:
        if not self._run_created:
            await self.store.create_run(RunInfo(id=self.run_id, metadata=self._metadata))
            self._run_created = True

    async def _persist(self, snapshot: Snapshot) -> None:
        await self._ensure_run()
        await self.store.save_snapshot(snapshot)

    def _has_queued(self) -> bool:
        return any(ch.queue for ch in self._bus.channels.values())

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeClosedError("this runtime is closed; create a new Runtime to go on")
