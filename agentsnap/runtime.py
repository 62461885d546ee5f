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
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Self, TypeVar, Unpack

from pydantic import BaseModel

from agentsnap._cadence import Cadence
from agentsnap._closing import Closer, replay_spool
from agentsnap._following import REPLAY_HOLDS, Following
from agentsnap._phases import NOT_STARTED, WITHOUT_CUT, Phase, Phases
from agentsnap._record import RunParts, RunRecord, finished_error
from agentsnap._recovery import Line, Recovery
from agentsnap._team import Team
from agentsnap.agents import Agent, Context
from agentsnap.bus import AsyncioScheduler, Bus, Scheduler, Transport
from agentsnap.checks import CheckOptions, declare_check
from agentsnap.exceptions import (
    ConfigurationError,
    DuplicateAgentError,
    HandlerFailed,
    NotFoundError,
    RunCancelled,
    UnknownAgentError,
)
from agentsnap.fork import check_forkable, fork_snapshot, tools_of
from agentsnap.handles import SnapshotHandle
from agentsnap.journal import Journal
from agentsnap.ledger import Ledger, mark_orphaned
from agentsnap.limits import check_run_id, check_run_labels
from agentsnap.messages import ENVIRONMENT, Message
from agentsnap.once import KnownTools, PendingOutcomes
from agentsnap.records import RollbackInfo, RunStatus, Snapshot
from agentsnap.replay import InputLog, ReplayLog
from agentsnap.requests import ApprovalPolicy, approval_rules, carry_requests
from agentsnap.rollback import RetryPolicy
from agentsnap.snapshot import SnapshotCoordinator, SnapshotPolicy
from agentsnap.state import check_round_trip
from agentsnap.store import KeptInDatabase
from agentsnap.store.ledger import MemoryLedger, ledger_for
from agentsnap.store.memory import MemoryStore
from agentsnap.telemetry import Telemetry, resolve

if TYPE_CHECKING:
    from types import TracebackType

    from agentsnap.messages import JsonInput
    from agentsnap.redaction import Redaction
    from agentsnap.store import OneProcessStore

__all__ = ["Runtime", "interrupted_message"]

A = TypeVar("A", bound="Agent[Any]")

logger = logging.getLogger("agentsnap")
_SEAL_INPUTS_EVERY = 256


def interrupted_message(run_id: str, db: str | None) -> str:
    """One line for a program stopped by Ctrl-C: what became of run ``run_id``, and how to
    resume it when it is kept in the database at ``db`` (``None``: in memory only).
    """  # noqa: D205
    if db:
        from agentsnap._hints import cli_command  # noqa: PLC0415 (only for this message)

        return (
            f"cancelled: run {run_id} is recorded as cancelled in {db}; resume it with "
            f"Runtime(store=SqlStore({db!r}), run_id={run_id!r}).resume(), or see where it "
            f"stopped with: {cli_command('snapshots', run_id, '--db', db)}"
        )
    return (
        f"cancelled: run {run_id} stopped; it was kept in memory or a temporary database "
        "(pass --db to keep it, and resume it later)"
    )


def _unknown_checked(unknown: list[str], registered: Mapping[str, object]) -> UnknownAgentError:
    """The error for checks declared on agents that were never added."""
    names = ", ".join(repr(name) for name in unknown)
    error = UnknownAgentError("Runtime.check()", unknown[0], sorted(registered))
    known = ", ".join(repr(name) for name in sorted(registered)) or "none"
    error.args = (
        f"Runtime.check() names {names}, which is not a registered agent (registered: "
        f"{known}); add the agent with Runtime.add() before the run takes input, or fix "
        "the name: a check on an agent that is never added would never run",
    )
    return error


def _check_checked_agents(team: Team) -> None:
    """Every agent a check names is registered, now that the run takes input."""
    unknown = [name for name in team.checks if name not in team.agents]
    if unknown:
        raise _unknown_checked(unknown, team.agents)


class Runtime:
    """Runs agents on an in-process bus and takes consistent snapshots of them.

    Use it as an async context manager, or call [`start`][agentsnap.Runtime.start] and
    [`close`][agentsnap.Runtime.close] yourself.

    Args:
        store: Where runs and snapshots go; a fresh [`MemoryStore`][agentsnap.MemoryStore]
            by default.
        scheduler: Decides which message is delivered next; an
            [`AsyncioScheduler`][agentsnap.AsyncioScheduler] by default.
        transport: Makes the bus's channels (see [`Transport`][agentsnap.bus.Transport]);
            they are kept in this process by default.
        snapshot_policy: When to take snapshots without being asked.
        run_id: Id of the run (32 hex digits are generated when omitted); at most 64
            characters, or ``ConfigurationError`` is raised here. A run given its id is
            recorded in the store once it takes input or a snapshot, not at ``start()``:
            it may be one to ``resume()``, and resuming an id the store does not hold
            writes nothing.
        metadata: JSON recorded with the run.
        name: A name for people, stored with the run and shown by ``agentsnap runs``
            (``--name`` filters by it); runs of one workflow usually share it. At most 128
            characters.
        tags: Labels stored with the run, to find it by (``agentsnap runs --tag key=value``):
            string keys of at most 128 characters, string values of at most 255.
        journal: Keep a journal of every send and delivery in the store (see
            [`agentsnap.journal`][agentsnap.journal]), which the run's timeline and
            ``agentsnap export`` show. On by default with an ``SqlStore`` (or any store kept
            in a database), off with a store in memory; ``False`` turns it off (it costs
            a little per message: see the benchmarks).
        retry: How often a rejected output is retried by rolling back, and how long to wait
            in between (see [`agentsnap.rollback`][agentsnap.rollback]).
        ledger: Where side-effecting tool calls are recorded (see
            [`agentsnap.ledger`][agentsnap.ledger]); by default an
            [`SqlLedger`][agentsnap.store.sql_ledger.SqlLedger] on the store's database when
            the store is an ``SqlStore``, else a
            [`MemoryLedger`][agentsnap.store.ledger.MemoryLedger]. A ledger you pass is not
            closed by the runtime.
        telemetry: Where spans and metrics go (see [`agentsnap.telemetry`][agentsnap.telemetry]):
            by default the global OpenTelemetry providers when an SDK is installed there,
            and nothing otherwise; ``False`` records nothing; a
            [`Telemetry`][agentsnap.telemetry.Telemetry] uses its providers. Decided here,
            once: configure the SDK before creating the runtime.
        replay: Log which message each agent takes next, and the environment's input, and
            make that log durable before each side-effecting tool call, so that a run resumed
            after a crash re-executes its handlers in the same order and derives the same
            idempotency keys (see [`agentsnap.replay`][agentsnap.replay]). Turning it off
            saves a little per message, and keeps exactly-once across a crash only for
            tools called with an explicit ``key=``.
        lease: Seconds the runtime's ownership of its run holds without renewal (it renews
            it every third of that). One runtime at a time owns a run; a runtime that
            stopped renewing (its process died, or hung) loses the run once its lease
            expires, and its late writes are refused (see
            [`agentsnap.ownership`][agentsnap.ownership]). A dead process on this host is
            noticed at once.
        spool: The directory where writes the database still refuses when the runtime
            closes (after the store's retries: the run's status, the journal's and the
            replay log's tail, rollback records, tool outcomes) are kept, to be written when
            the run is resumed or by ``agentsnap db recover``. By default beside an SQLite
            file (``<file>.spool``), else under ``~/.local/state/agentsnap/spool`` (see
            [`agentsnap.store.spool`][agentsnap.store.spool]).
        redact: What the run must never write (see
            [`agentsnap.redaction`][agentsnap.redaction]): applied to each snapshot, journal
            segment, replay-log input, ledger record, model call and span reason before it
            is written, never to the values the agents hold. A resume, or a rollback to a
            cut read back from the store, that needs a redacted value gets it from the
            policy's ``secret`` provider, or raises
            [`RedactedValueNeeded`][agentsnap.RedactedValueNeeded]. Off (``None``) by
            default, at no cost.
        approvals: Tools whose side-effecting calls wait for a person's approval before
            they are claimed in the ledger, by tool name: ``True``, a predicate on the
            call's arguments (``lambda a: a["amount"] > 100``), or an
            [`Approval`][agentsnap.requests.Approval] (who, deadline). A call needs
            approval when the tool's own ``approval=`` or this policy says so (see [Ask a
            person before acting](../how-to/ask-a-person.md)).

    Attributes:
        run_id: Id of this run.
        store: The store snapshots are written to.
        ledger: The tool-call ledger.
        tools: The tools this runtime knows, by name: a tool joins when an agent first
            calls it. Declare one with ``runtime.tools.add(tool)`` to have its compensating
            action run at close even when no handler calls it in this process (a resumed
            run). Two different tools with one name are a ``ConfigurationError``.
        failures: Every handler failure so far, oldest first.
    """

    def __init__(
        self,
        *,
        store: OneProcessStore | None = None,
        scheduler: Scheduler | None = None,
        transport: Transport | None = None,
        snapshot_policy: SnapshotPolicy | None = None,
        run_id: str | None = None,
        metadata: Mapping[str, JsonInput] | None = None,
        name: str | None = None,
        tags: Mapping[str, str] | None = None,
        journal: bool | None = None,
        retry: RetryPolicy | None = None,
        ledger: Ledger | None = None,
        telemetry: Telemetry | bool | None = None,
        replay: bool = True,
        lease: float = 15.0,
        spool: str | Path | None = None,
        redact: Redaction | None = None,
        approvals: Mapping[str, ApprovalPolicy] | None = None,
    ) -> None:
        self.run_id = check_run_id(run_id) if run_id else uuid.uuid4().hex
        self.store: OneProcessStore = store if store is not None else MemoryStore()
        owns_ledger = ledger is None
        if ledger is None:
            ledger = ledger_for(self.store) or MemoryLedger()
        self.ledger: Ledger = ledger
        self.tools = KnownTools()
        name, tags = check_run_labels(name, tags)
        self._scheduler: Scheduler = scheduler if scheduler is not None else AsyncioScheduler()
        bus = self._bus = Bus(self._scheduler, transport)
        self._environment = bus.environment
        if journal is None:  # a store kept in a database keeps the journal too
            journal = isinstance(self.store, KeptInDatabase)
        self._journal = Journal(bus, self.store, self.run_id, redaction=redact) if journal else None
        agents: dict[str, Agent[Any]] = {}
        self._agents = agents
        # Without an SDK this is None, and the hot paths pay one None check per message.
        self._telemetry = resolve(telemetry)
        # Its collaborators, each with one job; built with what it needs, in that order.
        self._phases = phases = Phases(self._scheduler)
        self._record = record = RunRecord(
            self.store,
            ledger,
            self.run_id,
            named=bool(run_id),
            phases=phases,
            agents=agents,
            journal=self._journal,
            lease=lease,
            metadata=dict(metadata or {}),
            name=name,
            tags=tags,
            redaction=redact,
        )
        self._snapshots = coordinator = SnapshotCoordinator(
            bus, agents, self.run_id, record.persist
        )
        # A scheduler that can tell when a process waits for work lets a snapshot record it
        # without a marker.
        coordinator.at_rest = self._scheduler.at_rest
        coordinator.observer = self._telemetry
        phases.coordinator = coordinator
        # Every message the environment sent, replayed after a rollback like a source.
        self._inputs = inputs = InputLog()
        inputs.redaction = redact
        self._replay = (
            ReplayLog(record.append_replay, inputs, every=REPLAY_HOLDS) if replay else None
        )
        parts = RunParts(
            self.run_id, bus, coordinator, phases, record, ledger, self._replay, self._telemetry
        )
        line = Line()  # the run's timeline, when no replay log keeps it
        self._recovery = recovery = Recovery(
            parts, policy=retry or RetryPolicy(), inputs=inputs, line=line
        )
        self.failures: list[HandlerFailed] = recovery.failures
        # Outcomes of tool calls the ledger could not record yet: the team's calls keep them
        # here, and closing writes them.
        pending = PendingOutcomes()
        self._team = team = Team(
            bus,
            coordinator,
            self.run_id,
            recovery,
            ledger=ledger,
            tools=self.tools,
            line=self._replay if self._replay is not None else line,
            replay=self._replay,
            telemetry=self._telemetry,
            redaction=redact,
            approvals=approval_rules(approvals),
            pending=pending,
        )
        self._following = (
            Following(self.run_id, bus, team, self._replay) if self._replay is not None else None
        )
        self._cadence = cadence = Cadence(
            snapshot_policy or SnapshotPolicy(), parts, team=team, failures=self.failures
        )
        recovery.attach(team, cadence, self._following)
        record.interrupt = team.quiesce  # a cancelled run's handlers stop where they are
        self._closer = Closer(
            run=parts,
            cadence=cadence,
            agents=agents,
            failures=self.failures,
            owns_ledger=owns_ledger,
            tools=self.tools,
            pending=pending,
            asking=team.asking,
            journal=self._journal,
            following=self._following,
            spool=spool,
        )
        tracing = self._telemetry if self._telemetry and self._telemetry.tracing else None
        if tracing is not None:
            bus.observe(tracing)
        if self._telemetry is not None:
            self._telemetry.watch(bus)
        self._reported = 0

    # -- set-up ---------------------------------------------------------------------------

    @property
    def agents(self) -> Mapping[str, Agent[Any]]:
        """The registered agents, by name."""
        return MappingProxyType(self._agents)

    @property
    def telemetry(self) -> Telemetry | None:
        """Where the run's spans and metrics go, or ``None`` when nothing is recorded."""
        return self._telemetry

    def context(self, agent: str) -> Context[Any]:
        """The context handed to ``agent``'s handlers.

        Outside a handler it serves to call a tool on the agent's behalf, with an explicit
        idempotency key.

        Raises:
            ConfigurationError: No agent of that name is registered.
        """
        ctx = self._team.contexts.get(agent)
        if ctx is None:
            names = ", ".join(repr(n) for n in self._agents) or "none"
            raise ConfigurationError(
                f"there is no agent {agent!r} in this runtime (registered: {names}); "
                "register it with Runtime.add() first"
            )
        return ctx

    def add(self, agent: A) -> A:
        """Register an agent and return it.

        Raises:
            DuplicateAgentError: An agent with the same name is registered.
            StateNotSerializable: The agent's state is not JSON, or does not survive a JSON
                round trip; the error names the field.
        """
        self._phases.check_open()
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
        self._team.add(agent, self._bus.add(agent.name, epoch), blob.json, blob.hash)
        return agent

    def mark_changed(self, *agents: str) -> None:
        """Say that the states of ``agents`` changed outside their handlers.

        A snapshot encodes again only the states that may have changed since they were last
        recorded. Changes made by a handler, by ``on_rollback`` or by assigning
        ``agent.state`` are seen by the runtime; code that changes a registered agent's
        state in place anywhere else (``agent.state.count += 1`` between two runs, say) must
        call this before the next snapshot, or the snapshot may record the state as it was.

        Raises:
            ConfigurationError: One of ``agents`` is not registered.
        """
        for name in agents:
            self.context(name)  # refuses an unknown name
        self._snapshots.mark_changed(*agents)

    def check(self, agent: str, kind: str | None = None, **options: Unpack[CheckOptions]) -> None:
        """Declare a check on what ``agent`` sends: a failing message makes the run roll back.

        Checks run as the message is sent, in the order declared. Declare them after adding
        the agent, or before it while the run has taken no input yet: the first input
        (``send``, ``resume``, ``fork_from``) then raises ``UnknownAgentError`` if a check
        still names an agent that was never added, so a misspelt name cannot leave a check
        that never runs.

        Args:
            agent: The agent whose messages are checked.
            kind: Only messages of this kind (default: every message the agent sends).
            **options: The [`CheckOptions`][agentsnap.checks.CheckOptions]: ``schema=``, a
                pydantic model the payload must validate against; ``check=``, a callable
                given the message, returning ``True``/``None`` to pass, or ``False``, a
                reason string or ``Verdict.failed(reason)`` to fail; ``name=``, how the
                check is called in feedback and in the store (default: ``"schema"`` for a
                schema, the callable's name for a check).

        Raises:
            TypeError: A keyword other than ``schema``, ``check`` and ``name`` is given.
            ConfigurationError: Neither ``schema`` nor ``check`` is given, or ``schema`` is not
                a pydantic model, or the name or the kind is longer than 128 characters (the
                longest every store can hold; the name is recorded with each rollback).
            UnknownAgentError: ``agent`` is not registered and the run already took input.
        """
        declared = declare_check(kind, **options)
        if agent not in self._agents and self._phases.now not in WITHOUT_CUT:
            raise _unknown_checked([agent], self._agents)
        self._team.check(agent, declared)

    async def start(self) -> None:
        """Record the run in the store and start delivering messages.

        A run given a ``run_id`` that the store does not hold is recorded later, once it
        takes input or a snapshot. Snapshots of the ``snapshot_policy`` begin once the run
        has its first cut: its first input, or ``resume()`` or ``fork_from()`` done.
        """
        phases, record = self._phases, self._record
        phases.check_open()
        if phases.now not in NOT_STARTED:
            return
        await record.ensure(create=phases.now is Phase.PRIMED or not record.named)
        phases.check_open()  # closed meanwhile, or started by another call
        if phases.now not in NOT_STARTED:
            return
        primed = phases.now is Phase.PRIMED
        if record.stored_before and primed:  # input sent before start, not resumed
            raise record.stored_run_error("input sent")
        phases.enter(Phase.RUNNING if primed else Phase.STARTED)
        self._closer.watch_the_loop()
        self._scheduler.start()
        if self._journal is not None and record.created:  # else once it is recorded
            self._journal.start()
        self._cadence.start()
        if self._following is not None:
            self._following.watch()

    async def close(self) -> None:
        """Stop delivering, fail the snapshots still in progress, and wait for store writes.

        Messages still queued stay on their channels; nothing is handled after this. The run
        is recorded as failed when a rollback gave up or a handler raised; as interrupted
        when messages were still queued (``resume`` continues it); else as succeeded. The
        run's [`status_reason`][agentsnap.RunInfo.status_reason] says why, in one line.
        """
        await self._closer.close(failed=None)

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException as exc:  # __aexit__ is not called: close what start() began
            await self._closer.close(failed=exc)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the runtime; the exception that ends the block decides the run's status.

        Ctrl-C (``KeyboardInterrupt``) or a cancelled task (``CancelledError``, which is
        what ``asyncio.run`` raises in the main task on Ctrl-C) records the run as
        cancelled, so ``resume()`` continues it, and so does
        [`RunCancelled`][agentsnap.RunCancelled] (the run was cancelled on request); any
        other exception records it as failed, with the exception as its reason.
        """
        if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)):
            await self._closer.close(failed=None, cancelled=exc)
        elif isinstance(exc, RunCancelled):  # cancelled on request: recorded as such
            await self._closer.close(failed=None)
        else:
            await self._closer.close(failed=exc)

    # -- driving a run ------------------------------------------------------------------

    def send(
        self,
        to: str,
        payload: JsonInput | BaseModel = None,
        *,
        kind: str = "message",
        headers: Mapping[str, str] | None = None,
    ) -> Message:
        """Inject work: send a message to agent ``to`` from the environment.

        The message travels on the channel ``$env -> to`` and belongs to snapshots like any
        other message.

        Raises:
            UnknownAgentError: ``to`` is not a registered agent; or, at the first input, a
                ``Runtime.check()`` names an agent that was never added.
            PayloadNotSerializable: ``payload`` is not JSON.
            ConfigurationError: The store held this run (``run_id``) before this runtime
                started: ``resume()`` it first; or ``kind`` is longer than 128 characters
                (the longest kind every store can hold).
            RollbackExhausted: The run stopped: its retry policy gave up.
            RuntimeClosedError: The runtime is closed.
        """
        if not self._phases.taking_input:
            self._before_input()
        message = self._bus.send(self._environment, to, payload, kind, headers)
        buffer = self._inputs.buffer
        buffer.append(message)
        if len(buffer) >= _SEAL_INPUTS_EVERY:
            self._recovery.prune_inputs()
        return message

    def _before_input(self) -> None:
        """The checks ``send`` skips while input flows: closed, stopped, first input."""
        phases = self._phases
        phases.check_open()
        self._recovery.raise_if_stopped()
        phase = phases.now
        if phase in WITHOUT_CUT:
            self._record.check_not_stored_before("input sent")
            if phase is Phase.RESTORING:
                raise ConfigurationError(
                    "input sent while resume() or fork_from() is under way: await it first"
                )
            _check_checked_agents(self._team)
            phases.enter(Phase.PRIMED if phase is Phase.NEW else Phase.RUNNING)
            if self._cadence.policy.at_start:
                self._cadence.first()
            elif phase is Phase.STARTED and not self._record.created:
                # A named run takes its first input: record it before anything is delivered.
                self._team.gate = asyncio.ensure_future(self._record.record_named())

    @property
    def inputs_sent(self) -> Mapping[str, int]:
        """How many messages the environment has sent each agent in this run.

        After [`resume`][agentsnap.Runtime.resume] this counts the input restored from the
        store, so an application feeding the run from elsewhere knows what it already sent.
        """
        return {dst: ch.sent for dst, ch in self._bus.environment.outgoing.items()}

    def snapshot(self, initiator: str | None = None) -> SnapshotHandle:
        """Start a coordinated snapshot; await the handle for the completed snapshot.

        Must be called from within the event loop. The bus keeps running while the snapshot
        is taken; deterministic schedulers complete it as the run is driven.

        Args:
            initiator: Name of the agent that starts it, or ``None`` for the runtime.

        Raises:
            UnknownAgentError: ``initiator`` is not a registered agent.
            ConfigurationError: Called outside a running event loop, or on a run the store
                already held before this runtime started and that was not resumed.
        """
        self._phases.check_open()
        self._record.check_not_stored_before("snapshot() called")
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
        recovery = self._recovery
        recovery.raise_if_stopped()
        while True:
            await self._scheduler.run_until_idle()
            await self._snapshots.drain()
            if recovery.stopped() or not any(self._bus.channels.values()):
                break
        if self._cadence.last() is not None:
            await self._snapshots.drain()
        if self._journal is not None and self._record.lost is None:
            await self._journal.flush()
        recovery.raise_if_stopped()
        if raise_failures and len(self.failures) > self._reported:
            first = self.failures[self._reported]
            self._reported = len(self.failures)
            raise first
        self._reported = len(self.failures)

    @property
    def rollbacks(self) -> list[RollbackInfo]:
        """Every rollback of this runtime so far, oldest first."""
        return list(self._recovery.history)

    async def rollback(
        self, snapshot_id: str | None = None, *, reason: str = "rolled back on request"
    ) -> RollbackInfo:
        """Put every agent and channel back on a complete snapshot of this run.

        Call it from outside handlers (a handler rejects work with ``ctx.reject``). The
        rollback is recorded in the store like any other; no retry budget is used.

        Args:
            snapshot_id: The snapshot to go back to (default: the newest complete one).
            reason: Recorded with the rollback and shown to every agent's ``on_rollback``.

        Raises:
            NotFoundError: The store holds no such snapshot.
            SnapshotDamaged: The snapshot is damaged in the store (rows deleted or changed).
            ConfigurationError: The snapshot failed, belongs to another run, or there is no
                complete snapshot yet; or the store held this run before this runtime started
                and it was not resumed.
        """
        self._phases.check_open()
        await self.start()
        self._record.check_not_stored_before("rollback() called")
        return await self._recovery.manual(snapshot_id, reason)

    async def resume(self, *, wait: float | None = None) -> Snapshot:
        """Continue this run (``run_id``) after its process stopped: a crash, a kill, a reboot.

        Register the same agents first, then call this instead of sending input. The run goes
        back to its last complete snapshot: agents' states, channels' counters and the
        messages in flight at the cut. The environment's input sent after the cut is
        restored from the store as far as it was made durable (always up to the last
        side-effecting tool call; see [`inputs_sent`][agentsnap.Runtime.inputs_sent] for
        what that is), so do not send it again. Each agent then first takes the messages it
        took before the stop, in the same order, so handlers re-executed get the recorded
        answers of their model calls, derive the same idempotency keys and get the recorded
        results of effects that already happened.

        One runtime at a time owns a run. When the run's last owner is a process of this host
        that no longer runs (or a zombie, not reaped yet), it is taken over at once. An owner
        that is alive (a process of this host that runs, or one that renews its lease), or
        another resume that took the run over first, makes this fail at once with
        ``RunOwnedError``. An owner elsewhere that stopped renewing (its host crashed) is
        waited for until its lease expires, up to ``wait`` seconds. Claims of side-effecting
        calls the last owner left in progress are marked ``unknown``.

        Args:
            wait: Seconds to wait for a silent owner's lease to expire (default: twice the
                lease); ``0`` refuses at once.

        Returns:
            The snapshot the run continues from.

        Raises:
            NotFoundError: The store holds no run with this id (the message names the runs
                whose id starts with it, if any); nothing is written for it.
            RunOwnedError: Another runtime owns the run, still after ``wait`` seconds; of
                two resumes at once, the one that does not take the run over.
            SnapshotDamaged: Every snapshot the run could go back to is damaged in the store
                (a damaged snapshot is passed over, like a failed one, when an older intact
                one of the same timeline is left).
            ConfigurationError: The run succeeded (it has nothing left to do), or this runtime
                already took input. A failed run can be resumed: it goes back to its last
                cut, with a fresh retry budget.
        """
        self._recovery.check_fresh("resume()")
        _check_checked_agents(self._team)
        return await self._resume("resume()", wait)

    async def _resume(self, what: str, wait: float | None) -> Snapshot:
        """Put the run the store holds on its current cut, and take it over (``resume()``)."""
        record, recovery, phases = self._record, self._recovery, self._phases
        await replay_spool(self.store, self.ledger, self.run_id, self._closer.spool)
        try:
            run = await self.store.get_run(self.run_id)
        except NotFoundError:
            raise await record.unknown_run() from None
        if run.status is RunStatus.SUCCEEDED:
            raise finished_error(run)
        if run.cancel_requested is not None:  # resuming a run withdraws a request to stop it
            await self.store.request_cancel(self.run_id, None)
        await record.own(wait=2 * record.ownership.ttl if wait is None else wait)
        # Another resume may have taken the run over, finished it and let go meanwhile.
        run = await self.store.get_run(self.run_id)
        if run.status is RunStatus.SUCCEEDED:
            await record.ownership.release()
            record.ownership.lease = None  # so closing leaves the run as it found it
            raise finished_error(run)
        if run.status is not RunStatus.RUNNING:  # it runs again, until it is closed
            await self.store.finish_run(self.run_id, RunStatus.RUNNING, None)
        if run.traceback is not None:
            await self.store.save_traceback(self.run_id, None)
        if tools_of(run) == "dry":
            self._team.make_dry()
        await mark_orphaned(self.ledger, self.store, self.run_id)
        await self.start()
        recovery.raise_if_stopped()
        recovery.check_fresh(what)  # no input or restore came in meanwhile
        phases.enter(Phase.RESTORING)
        try:
            snapshot = await recovery.restore_current_cut()
        except BaseException:
            if phases.now is Phase.RESTORING:
                phases.enter(Phase.STARTED)
            raise
        phases.enter(Phase.RUNNING)
        return snapshot

    async def fork_from(self, snapshot_id: str) -> Snapshot:
        """Start this (new) run from a complete snapshot of another run.

        Register the same agents first. The run is forked as
        [`fork_run`][agentsnap.inspect.fork_run] (and ``agentsnap fork``) forks one: it
        records its parent run and snapshot, and gets a copy of the snapshot as its snapshot
        1, its own cut to roll back to; then it is resumed from that copy. The original run
        is not touched. The requests to people that the cut holds (asked by handlers whose
        message is in flight there) are copied into the new run, pending.

        Returns:
            The snapshot the new run starts from (the other run's).

        Raises:
            NotFoundError: The store holds no such snapshot.
            SnapshotDamaged: The snapshot is damaged in the store.
            ConfigurationError: The snapshot failed, or this runtime already took input, or
                the store held this run (``run_id``) before this runtime started.
        """
        recovery, record = self._recovery, self._record
        recovery.check_fresh("fork_from()")
        _check_checked_agents(self._team)
        snapshot = await self.store.load_snapshot(snapshot_id)
        check_forkable(snapshot)
        if snapshot.run_id == self.run_id:
            raise ConfigurationError(
                "fork_from() starts a new run; to go back within this run, use rollback()"
            )
        recovery.check_fresh("fork_from()")
        if record.stored_before:
            raise record.stored_run_error("fork_from() called")
        await fork_snapshot(
            self.store,
            snapshot,
            run_id=self.run_id,
            metadata=record.metadata,
            name=record.name,
            tags=record.tags,
            recorded=record.created,  # started: the run is recorded, with no snapshot
        )
        await carry_requests(self.ledger, snapshot, self.run_id)
        await self._resume("fork_from()", None)
        return snapshot

    async def list_snapshots(self) -> list[Snapshot]:
        """Every snapshot of this run held by the store, in the order they were started."""
        return await self.store.list_snapshots(self.run_id)
