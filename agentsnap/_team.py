"""The delivery kernel: one process's agents, their contexts and guards, how a message is handled.

A [`Runtime`][agentsnap.Runtime] and a host of a run spread over processes
([`agentsnap.distributed.Host`][agentsnap.distributed.Host]) both deliver through a ``Team``:
the handler runs inside its span, its outputs pass the checks and the agent's own
evaluation, a snapshot due while it ran is recorded as it returns, and a snapshot begun
while it runs can record the agent from before it began (``handling``). What is rare leaves
the team through `TeamEvents`, which each mode implements: a
rejected output, work lost to a database that did not answer, a handler that raised, a
message redone after a rejection that passed. The one-process recovery rolls the run back
itself; a distributed host reports to its run's coordinator, which orders every process back.

The options that differ between the modes are explicit, and on in both unless a mode cannot
have them: tracing (a handler span, when telemetry is configured), the replay log (in a
run spread over processes, every worker appends its agents' deliveries to the run's one
log), recording inside running handlers, and redoing work lost to a database fault.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from agentsnap._handler import Timeline, engine_of
from agentsnap.agents import Agent, Context, DoneEffect, evaluate_outputs, guard_for
from agentsnap.checks import Guard, OutputCheck
from agentsnap.exceptions import HandlerFailed, OutputRejected, StoreError
from agentsnap.messages import Marker, Message
from agentsnap.model_calls import ModelCallLog
from agentsnap.once import KnownTools, PendingOutcomes, effects_done
from agentsnap.requests import RequestLog
from agentsnap.rollback import restore_cut
from agentsnap.snapshot import Handling
from agentsnap.store.faults import classify

if TYPE_CHECKING:
    from agentsnap.bus import Bus, Channel, Endpoint
    from agentsnap.ledger import Ledger
    from agentsnap.records import RollbackInfo, Snapshot
    from agentsnap.redaction import Redaction
    from agentsnap.replay import InputLog, ReplayLog
    from agentsnap.requests import Approval
    from agentsnap.snapshot import SnapshotCoordinator
    from agentsnap.telemetry import Telemetry

__all__ = [
    "PROBE_FIRST",
    "PROBE_MAX",
    "Follower",
    "Team",
    "TeamEvents",
    "lost_to_database",
    "until_answers",
]

logger = logging.getLogger("agentsnap")

PROBE_FIRST = 0.1  # seconds between probes of a database that does not answer, at first
PROBE_MAX = 5.0


def lost_to_database(error: BaseException) -> bool:
    """Whether ``error`` is a database fault that passes (the work can be redone later)."""
    if not isinstance(error, StoreError):
        return False
    fault = classify(error)
    return fault is not None and fault.transient


async def until_answers(
    probe: Callable[[], Awaitable[object]], run_id: str, going: Callable[[], bool] | None = None
) -> bool:
    """Probe the database until it answers, backing off; ``False`` if ``going`` turned false.

    The one wait for a database that does not answer, in both modes: before a run goes back
    to its last cut to redo work a database fault cut off.

    Raises:
        StoreError: The probe failed for a reason that does not pass.
    """
    pause = PROBE_FIRST
    while going is None or going():
        try:
            await probe()
        except StoreError as exc:
            if not lost_to_database(exc):
                raise
            logger.warning("run %s: the database is still unavailable: %s", run_id, exc)
            await asyncio.sleep(pause)
            pause = min(pause * 2, PROBE_MAX)
        else:
            return True
    return False


class TeamEvents(Protocol):
    """What a team reports of its rare outcomes; each mode of running implements it."""

    def failed(self, failure: HandlerFailed) -> None:
        """A handler (or an ``on_rollback``) raised; the other agents go on."""

    async def rejected(
        self, rejection: OutputRejected, generation: int, handling: Message | None
    ) -> None:
        """An output was rejected by a handler of ``generation`` (handling ``handling``)."""

    async def lost(self, error: Exception, agent: str, message: Message, generation: int) -> None:
        """A handler could not finish because the database did not answer in time."""

    def passed(self, message: Message) -> None:
        """A message being redone after a rejection was handled without one."""

    def snapshot_due(self) -> None:
        """Another ``every`` deliveries were made (see ``Team.every``)."""


class Follower(Protocol):
    """Follows a resumed run's replay plans: it sees each delivery while they last."""

    def replayed(self, endpoint: Endpoint, channel: Channel, message: Message) -> None:
        """``endpoint`` took ``message`` off ``channel``."""


class Team:
    """One process's agents and how their messages are handled.

    Args:
        bus: The process's bus.
        coordinator: Its snapshot coordinator.
        run_id: The run.
        events: Where rare outcomes go.
        ledger: Where side-effecting tool calls are recorded.
        tools: The tools the agents called.
        line: Where the run's current timeline is read.
        replay: The replay log (``None``: deliveries are not logged).
        telemetry: Where spans and metrics go (``None``: nowhere).
        redaction: What the agents' tool calls and model calls record redacted, and what
            gives back the values a restored cut holds redacted (``None``: nothing).
        approvals: Which tools' calls need a person's approval, by tool name.
        pending: Where the outcomes of tool calls the ledger could not record are kept
            until written (a new one when omitted).

    Attributes:
        generation: Raised by each rollback: what a handler of an older generation did is
            thrown away.
        redoing: The messages being redone after a rejection (checked for truth on each
            delivery only).
        delivered: Where each delivery's channel is logged (the replay log's deliveries), or
            ``None`` while a follower sees them, or when there is no replay log.
        follower: Sees each delivery while a resumed run follows its replay plans.
        gate: Awaited before the next delivery (the run's first cut being stored).
        every: Deliveries between ``snapshot_due`` reports (0: none).
    """

    def __init__(
        self,
        bus: Bus,
        coordinator: SnapshotCoordinator,
        run_id: str,
        events: TeamEvents,
        *,
        ledger: Ledger,
        tools: KnownTools,
        line: Timeline,
        replay: ReplayLog | None = None,
        telemetry: Telemetry | None = None,
        redaction: Redaction | None = None,
        approvals: Mapping[str, Approval] | None = None,
        pending: PendingOutcomes | None = None,
    ) -> None:
        self.bus = bus
        self.coordinator = coordinator
        self.run_id = run_id
        self.events = events
        self.ledger = ledger
        self.tools = tools
        self.pending = pending if pending is not None else PendingOutcomes()
        """Where the outcomes of tool calls the ledger could not record are kept."""
        self.line = line
        self.replay = replay
        self.telemetry = telemetry
        self.redaction = redaction
        self._tracing = telemetry if telemetry is not None and telemetry.tracing else None
        self._model_calls = ledger if isinstance(ledger, ModelCallLog) else None
        self._requests = ledger if isinstance(ledger, RequestLog) else None
        self.approvals: Mapping[str, Approval] = dict(approvals or {})
        """Which tools' calls need a person's approval, by tool name (the runtime's policy)."""
        self.dry_tools = False
        """The run's side-effecting tools are dry (a what-if fork): see ``make_dry``."""
        self.agents: dict[str, Agent[Any]] = {}
        self.contexts: dict[str, Context[Any]] = {}
        """Each agent's handler context, by name; also in its endpoint's context slot, where
        a delivery finds it."""
        self.checks: dict[str, list[OutputCheck]] = {}
        """The checks declared on each agent's outputs (an agent may not be added yet)."""
        self.initial: dict[str, str] = {}
        """The state each agent was added with, as JSON: a cut from before it joined gives
        it back."""
        self.generation = 0
        self.redoing: Collection[object] = ()
        self.delivered: list[Channel] | None = replay.deliveries if replay is not None else None
        self.follower: Follower | None = None
        self.gate: asyncio.Future[None] | None = None
        self.every = 0
        self._countdown = 0
        coordinator.handling = self.handling
        bus.scheduler.bind(bus, self.deliver)

    def make_dry(self) -> None:
        """Make the team's side-effecting tools dry from now on (a what-if fork).

        Their calls are recorded, and the tools do not run.
        """
        self.dry_tools = True
        for ctx in self.contexts.values():
            engine_of(ctx).dry_tools = True

    # -- agents -----------------------------------------------------------------------------

    def add(self, agent: Agent[Any], endpoint: Endpoint, state_json: str, state_hash: str) -> None:
        """Make ``agent`` (on ``endpoint``, its state checked as ``state_json``) one of the team."""
        name = agent.name
        self.agents[name] = agent
        self.initial[name] = state_json
        ctx = self.contexts[name] = endpoint.context = Context(
            agent, endpoint, self.bus, self.coordinator, self.run_id
        )
        engine = engine_of(ctx)
        engine.ledger = self.ledger
        engine.replay = self.replay
        engine.tools = self.tools
        engine.pending = self.pending
        engine.model_calls = self._model_calls
        engine.requests = self._requests
        engine.approvals = self.approvals
        engine.dry_tools = self.dry_tools
        engine.line = self.line
        engine.telemetry = self.telemetry
        engine.redaction = self.redaction
        agent._state_changed = self.coordinator.changed  # assigning agent.state marks it
        self.coordinator.joined(endpoint, state_hash)
        self._arm(name)

    def check(self, agent: str, declared: OutputCheck) -> None:
        """Check ``agent``'s outputs with ``declared`` too (it may be added later)."""
        self.checks.setdefault(agent, []).append(declared)
        if agent in self.agents:
            self._arm(agent)

    def _arm(self, name: str) -> None:
        """Give ``name``'s context a guard when it has checks or evaluates itself."""
        guard = guard_for(self.agents[name], self.checks.get(name, []))
        engine_of(self.contexts[name]).guard = guard

    # -- delivery ---------------------------------------------------------------------------

    async def deliver(self, channel: Channel) -> None:
        """Take the next item off ``channel`` and act on it: the kernel of every delivery."""
        gate = self.gate
        if gate is not None:
            generation = self.generation
            await gate
            self.gate = None
            if generation != self.generation:
                return  # a rollback emptied the channels meanwhile and queued them again
        item = channel.take()
        endpoint = channel.receiver
        snapshots = self.coordinator
        if type(item) is Marker:
            snapshots.on_marker(endpoint, channel, item.snapshot)
            return
        message: Message = item  # type: ignore[assignment]
        if snapshots.active:
            snapshots.on_message(endpoint, channel, message)
        if TYPE_CHECKING:
            ctx = cast("Context[Any]", endpoint.context)
        else:  # the same, without a call on the hot path (cast costs ~2% of a delivery)
            ctx = endpoint.context
        engine = ctx._engine  # engine_of(ctx), without a call on the hot path
        if engine.keep_before:
            snapshots.keep_before(endpoint, channel, message)
        # What bus.delivered() does, written out: this is the hot path of every delivery.
        channel.delivered += 1
        on_deliver = self.bus.on_deliver
        if on_deliver is not None:
            on_deliver(channel, message)
        delivered = self.delivered
        if delivered is not None:
            delivered.append(channel)  # bounded by the replay log's watch, not here
        elif self.follower is not None:
            self.follower.replayed(endpoint, channel, message)
        ctx.message = message
        engine.position = 0
        endpoint.busy = True
        generation = self.generation
        rejected: OutputRejected | None = None
        lost_to: Exception | None = None
        tracing = self._tracing
        guard = engine.guard
        try:
            if tracing is None:
                await ctx.agent.handle(message, ctx)
                if guard is not None and guard.evaluates and engine.rejected is None:
                    await evaluate_outputs(ctx)
            else:
                with tracing.handling(self.run_id, endpoint.name, message):
                    await ctx.agent.handle(message, ctx)
                    if guard is not None and guard.evaluates and engine.rejected is None:
                        await evaluate_outputs(ctx)
        except OutputRejected as exc:
            rejected = exc
        except Exception as exc:
            if engine.rejected is None:
                if lost_to_database(exc):
                    lost_to = exc  # redone from the last cut once the database answers
                else:
                    self.failed(endpoint.name, message, exc)
        finally:
            endpoint.busy = False
            ctx.message = None
            # A rejection the handler caught (even with ``except BaseException``) counts.
            if rejected is None and lost_to is None and engine.rejected is None:
                if guard is not None and guard.outputs:
                    self._handled(ctx, guard, generation)
                if snapshots.wanted and generation == self.generation:
                    wanted = snapshots.wanted.get(endpoint.name)
                    if wanted:
                        snapshots.record(endpoint, wanted)
            else:
                rejected = rejected or engine.rejected
                engine.rejected = None
                if guard is not None:
                    # Held back, and now never sent (or sent when the handler is redone,
                    # after a database fault).
                    guard.outputs.clear()
        if generation != self.generation:
            return  # a rollback threw this handler's work away (and may have cancelled it)
        if rejected is not None:
            await self.events.rejected(rejected, generation, message)
            return
        if lost_to is not None:
            await self.events.lost(lost_to, endpoint.name, message, generation)
            return
        if self.redoing:
            self.events.passed(message)
        if self._countdown:
            self._countdown -= 1
            if not self._countdown:
                self._countdown = self.every
                self.events.snapshot_due()

    def asking(self) -> int:
        """How many handlers of the team wait for a person's answer now."""
        return sum(engine_of(ctx).asking for ctx in self.contexts.values())

    def count_from(self, every: int) -> None:
        """Report ``snapshot_due`` every ``every`` deliveries from now on (0: never)."""
        self.every = self._countdown = every

    def _handled(self, ctx: Context[Any], guard: Guard, generation: int) -> None:
        """Release what a handler held back for self-evaluation, unless it was discarded."""
        if generation == self.generation:
            post_held(ctx)
        else:
            guard.outputs.clear()  # a rollback threw this handler's work away

    def handling(self, endpoint: Endpoint) -> Handling | None:
        """What the running handler of ``endpoint`` did so far, for a recording inside it.

        ``None`` when it made a message visible already. An agent found inside a handler at
        a recording keeps its state as each later handler begins, so that the next
        recordings need not wait for its handlers either.
        """
        ctx = self.contexts.get(endpoint.name)
        message = None if ctx is None else ctx.message
        if ctx is None or message is None:
            return None
        engine = engine_of(ctx)
        engine.keep_before = True
        channel = endpoint.incoming.get(message.src)
        if engine.shown is message or channel is None:
            return None
        guard = engine.guard
        return Handling(message, channel, tuple(guard.outputs) if guard is not None else ())

    def failed(self, agent: str, message: Message | None, error: Exception) -> None:
        """Report that ``agent`` raised ``error`` handling ``message`` (``None``: in a hook)."""
        failure = HandlerFailed(agent, message, error)
        failure.__cause__ = error
        logger.error("%s", failure, exc_info=error)
        self.events.failed(failure)

    # -- rollback ---------------------------------------------------------------------------

    async def quiesce(self, reason: str) -> None:
        """Pause the bus, cancel the handlers under way, and wait until none runs.

        Their work is thrown away (the generation goes up), so they are not awaited to the
        end: a handler awaiting a model is cancelled at once. One inside a side-effecting
        tool call finishes that call first, so its outcome is in the ledger (see
        [`Tool`][agentsnap.tools.Tool]). The snapshots in progress fail with ``reason``.
        """
        scheduler = self.bus.scheduler
        scheduler.pause()
        self.generation += 1
        coordinator = self.coordinator
        coordinator.abort_all(reason)
        endpoints = [self.bus.endpoints[name] for name in self.agents]
        for endpoint in endpoints:
            if endpoint.busy:
                scheduler.interrupt(endpoint)
        delay = 0.0
        while any(endpoint.busy for endpoint in endpoints):
            await asyncio.sleep(delay)
            delay = min(delay * 2 or 0.0005, 0.05)
        # A handler that finished meanwhile may have started one more.
        coordinator.abort_all(reason)
        await coordinator.drain()

    def restore(
        self,
        snapshot: Snapshot,
        *,
        epoch: int,
        inputs: InputLog | None,
        local: Collection[str] | None = None,
    ) -> int:
        """Put the team and every channel into it back on ``snapshot``'s cut.

        The snapshots in progress fail; the states are taken as changed; what the handlers
        held back or rejected is forgotten. ``inputs``: the environment's input, sent again
        after the cut's messages; ``local``: the processes hosted here, when the run is
        spread over processes (see [`restore_cut`][agentsnap.rollback.restore_cut]).

        Returns:
            How many messages queued here were discarded.
        """
        coordinator = self.coordinator
        coordinator.abort_all("the run rolled back before the snapshot completed")
        coordinator.forget_handlers()
        coordinator.mark_changed(*self.agents)
        for ctx in self.contexts.values():
            engine = engine_of(ctx)
            engine.rejected = None
            if engine.guard is not None:
                engine.guard.outputs.clear()
        return restore_cut(
            self.bus,
            self.agents,
            snapshot,
            initial_states=self.initial,
            epoch=epoch,
            replay=inputs,
            local=local,
            redaction=self.redaction,
        )

    async def after_rollback(self, info: RollbackInfo) -> None:
        """Tell the agent whose output was rejected why, and call every ``on_rollback``.

        An ``on_rollback`` that raises is a failure of that agent (``TeamEvents.failed``),
        logged; the other agents' hooks run and the run goes on. An output it sends that a
        check rejects is dropped (it was checked before it was enqueued: nobody saw it).
        """
        if info.agent is not None and info.agent in self.contexts:
            await tell_rollback(self.contexts[info.agent], info.reason, info.source)
        changed = self.coordinator.changed
        for name, agent in self.agents.items():
            try:
                await agent.on_rollback(info, self.contexts[name])
            except OutputRejected as exc:
                logger.error(
                    "agent %r sent an output from on_rollback that was rejected, and not sent: %s",
                    name,
                    exc,
                )
            except Exception as exc:
                self.failed(name, None, exc)
            finally:
                changed.add(name)  # whatever the hook did to the state


def post_held(ctx: Context[Any]) -> None:
    """Make visible what ``ctx``'s handler sent and self-evaluation held back.

    The runtime calls it once the evaluation passed.
    """
    guard = engine_of(ctx).guard
    if guard is not None and guard.outputs:
        for message in guard.outputs:
            ctx._bus.post(ctx._endpoint, message)
        guard.outputs.clear()


async def tell_rollback(ctx: Context[Any], reason: str, source: str) -> None:
    """Give ``ctx``'s agent a rollback's feedback, with the effects its undone work performed.

    The effects are the ledger's entries of this agent in the run that its restored state
    does not hold; when the ledger cannot be read now, the feedback comes without them.
    """
    done: list[DoneEffect] = []
    ledger = engine_of(ctx).ledger
    name = ctx.agent.name
    if ledger is not None:
        try:
            entries = await effects_done(ledger, ctx.run_id, name, ctx.state)
        except StoreError as exc:
            logger.warning(
                "agent %r: the effects its undone work performed could not be read: %s",
                name,
                exc,
            )
            entries = []
        done = [
            DoneEffect(tool=e.tool, arguments=e.arguments, result=e.result, key=e.key)
            for e in entries
        ]
    ctx.add_feedback(reason, source, done)
