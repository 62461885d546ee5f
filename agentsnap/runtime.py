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
import enum
import functools
import json
import logging
import time
import uuid
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from pydantic import BaseModel

from agentsnap.agents import Agent, Context, evaluate_outputs, guard_for
from agentsnap.bus import AsyncioScheduler, Bus, Channel, Endpoint, Scheduler, Transport
from agentsnap.checks import Check, Guard, OutputCheck, declare_check
from agentsnap.exceptions import (
    ConfigurationError,
    DuplicateAgentError,
    HandlerFailed,
    NotFoundError,
    OutputRejected,
    OwnershipLost,
    RuntimeClosedError,
    StoreError,
    UnknownAgentError,
)
from agentsnap.fork import check_forkable, fork_snapshot
from agentsnap.handles import SnapshotHandle
from agentsnap.journal import Journal
from agentsnap.ledger import Ledger, ToolCallStatus, mark_orphaned, owner_id
from agentsnap.limits import check_run_id, check_run_labels
from agentsnap.messages import ENVIRONMENT, JsonValue, Marker, Message
from agentsnap.model_calls import ModelCallLog
from agentsnap.once import KnownTools, reconcile, recorded, unrecorded
from agentsnap.ownership import RunOwnership
from agentsnap.records import (
    ReplaySegment,
    RollbackInfo,
    RunInfo,
    RunStatus,
    Snapshot,
    utcnow,
)
from agentsnap.replay import InputLog, ReplayLog, ReplayPlan, plan_replay
from agentsnap.rollback import (
    RetryPolicy,
    RollbackManager,
    current_cut,
    earlier_targets,
    restore_cut,
)
from agentsnap.snapshot import Handling, SnapshotCoordinator, SnapshotPolicy
from agentsnap.state import check_round_trip
from agentsnap.store.faults import classify
from agentsnap.store.ledger import MemoryLedger, ledger_for
from agentsnap.store.memory import MemoryStore
from agentsnap.store.spool import (
    AppendJournal,
    AppendReplay,
    FinishRun,
    SaveRollback,
    Spool,
    SpoolError,
    SpoolOp,
    UpdateLedger,
)
from agentsnap.telemetry import Telemetry, resolve

if TYPE_CHECKING:
    from types import TracebackType

    from agentsnap.messages import JsonInput
    from agentsnap.store import Store

__all__ = ["Runtime"]

A = TypeVar("A", bound="Agent[Any]")

logger = logging.getLogger("agentsnap")
_SEAL_INPUTS_EVERY = 256
_REPLAY_HOLDS = 4096  # deliveries (or inputs) the replay log holds before it writes them
_REPLAY_WATCH_SECONDS = 0.25
_WRITES_BEHIND = 16  # snapshot writes in flight at which policy snapshots are skipped
_STRETCH = 6  # timed snapshots start at most once per this many times the latest one took
_PROBE_FIRST = 0.1  # seconds between probes of a database that does not answer, at first
_PROBE_MAX = 5.0
_PROBE_KEY = "agentsnap:probe"  # a ledger key read to see whether the ledger answers


@functools.cache
def _state_schema(model: type[BaseModel]) -> dict[str, JsonValue] | None:
    """The JSON schema of a state model, or ``None`` when pydantic cannot write one."""
    try:
        schema: dict[str, JsonValue] = model.model_json_schema()
        json.dumps(schema, allow_nan=False)
    except Exception as exc:  # a field type without a JSON schema: edits go unchecked
        logger.debug("no JSON schema for state model %s: %s", model.__name__, exc)
        return None
    return schema


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


def _one_line(error: BaseException) -> str:
    """``error`` as one line: its type, and the first line of its message."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _finished(run: RunInfo) -> ConfigurationError:
    """The error for resuming ``run``, which succeeded."""
    finished = run.finished_at.isoformat(timespec="seconds") if run.finished_at else "?"
    return ConfigurationError(
        f"run {run.id} already finished ({run.status.value}, at {finished}): there is "
        "nothing to resume; fork a new run from one of its snapshots (Runtime.fork_from, or "
        "`agentsnap fork`)"
    )


def _environment_sent(snapshot: Snapshot) -> Mapping[str, int]:
    """How many messages the environment had sent each agent at ``snapshot``'s cut."""
    environment = snapshot.agents.get(ENVIRONMENT)
    return environment.sent if environment is not None else {}


def _lost_to_database(error: BaseException) -> bool:
    """Whether ``error`` is a database fault that passes (the work can be redone later)."""
    if not isinstance(error, StoreError):
        return False
    fault = classify(error)
    return fault is not None and fault.transient


class _Line:
    """The run's timeline, for a runtime without a replay log (which keeps it otherwise)."""

    __slots__ = ("resumed", "timeline")

    def __init__(self) -> None:
        self.timeline = 0
        self.resumed = -1  # the newest timeline an earlier process may have recorded in


class _Phase(enum.Enum):
    """Where a runtime is in its life; it moves only as ``_MOVES`` allows."""

    NEW = "new"
    """Created: agents and checks are added; nothing started, no input yet."""
    PRIMED = "primed"
    """Input was sent before ``start()``: the run has its first cut, and waits to start."""
    STARTED = "started"
    """Started, and waiting for its first input, ``resume()`` or ``fork_from()``."""
    RESTORING = "restoring"
    """``resume()`` or ``fork_from()`` puts the run on its cut."""
    RUNNING = "running"
    """Started, with its first cut: input is taken and delivered."""
    STOPPED = "stopped"
    """The run gave up (its retry policy, or another runtime took it over): nothing more is
    delivered, sent or snapshotted; only closing is left."""
    CLOSING = "closing"
    """``close()`` is under way."""
    CLOSED = "closed"
    """Closed: nothing more can be done with it."""


_MOVES: Mapping[_Phase, frozenset[_Phase]] = {
    _Phase.NEW: frozenset({_Phase.PRIMED, _Phase.STARTED, _Phase.STOPPED, _Phase.CLOSING}),
    _Phase.PRIMED: frozenset({_Phase.RUNNING, _Phase.STOPPED, _Phase.CLOSING}),
    _Phase.STARTED: frozenset({_Phase.RUNNING, _Phase.RESTORING, _Phase.STOPPED, _Phase.CLOSING}),
    # A restore that failed leaves the runtime as it found it: started, without a cut.
    _Phase.RESTORING: frozenset({_Phase.RUNNING, _Phase.STARTED, _Phase.STOPPED, _Phase.CLOSING}),
    _Phase.RUNNING: frozenset({_Phase.STOPPED, _Phase.CLOSING}),
    _Phase.STOPPED: frozenset({_Phase.CLOSING}),
    _Phase.CLOSING: frozenset({_Phase.CLOSED}),
    _Phase.CLOSED: frozenset(),
}
"""The moves each phase allows."""

_NOT_STARTED = frozenset({_Phase.NEW, _Phase.PRIMED})
_WITHOUT_CUT = frozenset({_Phase.NEW, _Phase.STARTED, _Phase.RESTORING})
"""The run has no cut yet: no input taken, not resumed or forked."""
_TAKING_INPUT = frozenset({_Phase.PRIMED, _Phase.RUNNING})
"""Input is sent on the fast path, without the checks of ``_before_input``."""
_ENDED = frozenset({_Phase.CLOSING, _Phase.CLOSED})


class _LoopEnd(asyncio.Future[None]):
    """What a runtime's close-watch waits on: cancelled only as the event loop ends.

    It notes whether a handler was running the moment it is cancelled: the runner cancels
    every task before any of them runs again, so a handler cancelled with it has not ended
    yet, whichever task the runner cancelled first.
    """

    def __init__(self, bus: Bus) -> None:
        super().__init__()
        self._bus = bus
        self.busy = False

    def cancel(self, msg: Any = None) -> bool:
        self.busy = any(endpoint.busy for endpoint in self._bus.endpoints.values())
        return super().cancel(msg)


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
        store: Store | None = None,
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
    ) -> None:
        self.run_id = check_run_id(run_id) if run_id else uuid.uuid4().hex
        # A run the caller named may be one to resume: it is recorded once it takes input
        # or a snapshot, not at start, so that resuming an id the store does not hold
        # writes nothing.
        self._named = bool(run_id)
        self.store: Store = store if store is not None else MemoryStore()
        self._owns_ledger = ledger is None
        if ledger is None:
            ledger = ledger_for(self.store) or MemoryLedger()
        self.ledger: Ledger = ledger
        self.tools = KnownTools()
        self.failures: list[HandlerFailed] = []
        self._metadata = dict(metadata or {})
        self._name, self._tags = check_run_labels(name, tags)
        self._scheduler: Scheduler = scheduler if scheduler is not None else AsyncioScheduler()
        self._bus = Bus(self._scheduler, transport)
        self._environment = self._bus.environment
        if journal is None:  # a store kept in a database keeps the journal too
            journal = isinstance(getattr(self.store, "url", None), str)
        self._journal = Journal(self._bus, self.store, self.run_id) if journal else None
        self._agents: dict[str, Agent[Any]] = {}
        # Each agent's handler context, by name; also in its endpoint's context slot, where a
        # delivery finds it.
        self._contexts: dict[str, Context[Any]] = {}
        self._bus.replay_stalled = self._replay_stalled
        self._snapshots = SnapshotCoordinator(self._bus, self._agents, self.run_id, self._persist)
        self._snapshots.handling = self._handling
        # A scheduler that can tell when a process waits for work lets a snapshot record it
        # without a marker.
        self._snapshots.at_rest = getattr(self._scheduler, "at_rest", None)
        # Without an SDK this is None, and the hot paths pay one None check per message.
        self._telemetry = resolve(telemetry)
        self._tracing = self._telemetry if self._telemetry and self._telemetry.tracing else None
        self._snapshots.observer = self._telemetry
        if self._tracing is not None:
            self._bus.observe(self._tracing)
        if self._telemetry is not None:
            self._telemetry.watch(self._bus)
        self._policy = snapshot_policy or SnapshotPolicy()
        self._countdown = self._policy.every_deliveries or 0
        self._timer: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._replay_watch: asyncio.TimerHandle | None = None
        self._phase = _Phase.NEW  # changed by _enter() only
        # The store holds the run (this runtime created it, or found it).
        self._run_created = False
        self._looked_up = False  # whether the store was asked if it holds the run
        self._recording_run = asyncio.Lock()
        self._schemas_saved: set[str] = set()  # agents whose state schema the store has
        # The store held this run before this runtime started: it must be resumed, not
        # written to as if new (its snapshot numbers would collide).
        self._stored_before = False
        self._reported = 0
        self._scheduler.bind(self._bus, self._deliver)
        # Rollback: checks by agent, the state each agent was registered with, and every
        # message the environment sent (replayed after a rollback, like a source).
        self._guards: dict[str, Guard] = {}
        self._checks: dict[str, list[OutputCheck]] = {}
        self._initial: dict[str, str] = {}
        self._inputs = InputLog()
        self._input_buffer = self._inputs.buffer
        self._replay = (
            ReplayLog(self._append_replay, self._inputs, every=_REPLAY_HOLDS) if replay else None
        )
        self._delivered = self._replay.deliveries if self._replay is not None else None
        self._line = _Line()  # the run's timeline, when no replay log keeps it
        # While a resumed run follows its replay plans, deliveries take the slow path.
        self._replaying = False
        # Whether the phase takes input (_TAKING_INPUT), kept by _enter(): send() otherwise
        # takes the slow path through _before_input().
        self._taking_input = False
        self._status_on_close: RunStatus | None = None
        self._stopped_because: str | None = None  # why the run gave up, in one line
        # Single-flight rollback: one at a time; every rollback starts a new generation, and
        # a rejection from a handler that began in an earlier one is dropped.
        self._generation = 0
        self._rolling_back = False
        self._rollback_lock = asyncio.Lock()
        # The start-of-run snapshot being written: nothing is delivered before it is stored.
        self._first_write: asyncio.Future[None] | None = None
        self._ownership = RunOwnership(self.store, self.run_id, ttl=lease)
        self._spool_directory = spool
        # Rollbacks for a database that keeps failing are spaced out (see _lost_to_database).
        self._last_fault_rollback = -float("inf")
        self._fault_pause = 0.0
        # Rollback records the store could not write yet (written later, or spooled).
        self._unsaved_rollbacks: list[RollbackInfo] = []
        self._lost: OwnershipLost | None = None
        self._rollbacks = RollbackManager(
            self.run_id,
            self._bus,
            coordinator=self._snapshots,
            policy=retry or RetryPolicy(),
            restore=self._restore,
            load=self.store.load_snapshot,
            save=self._save_rollback,
        )
        # Messages redone after a rejected output (the same dict): empty but for rollbacks.
        self._redoing = self._rollbacks.open

    # -- set-up ---------------------------------------------------------------------------

    @property
    def agents(self) -> Mapping[str, Agent[Any]]:
        """The registered agents, by name."""
        return MappingProxyType(self._agents)

    @property
    def bus(self) -> Bus:
        """The bus (channels, counters), for inspection and tests."""
        return self._bus

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
        ctx = self._contexts.get(agent)
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
        self._initial[agent.name] = blob.json
        endpoint = self._bus.add(agent.name, epoch)
        ctx = self._contexts[agent.name] = endpoint.context = Context(
            agent, endpoint, self._bus, coordinator, self.run_id
        )
        ctx.ledger = self.ledger
        ctx.replay = self._replay
        ctx.tools = self.tools
        ctx.model_calls = self.ledger if isinstance(self.ledger, ModelCallLog) else None
        ctx.line = self._replay if self._replay is not None else self._line
        ctx.telemetry = self._telemetry
        agent._state_changed = coordinator.changed  # assigning agent.state marks it
        coordinator.joined(endpoint, blob.hash)
        self._arm(agent.name)
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

    def check(
        self,
        agent: str,
        kind: str | None = None,
        *,
        schema: type[BaseModel] | None = None,
        check: Check | None = None,
        name: str | None = None,
    ) -> None:
        """Declare a check on what ``agent`` sends: a failing message makes the run roll back.

        Checks run as the message is sent, in the order declared. Declare them after adding
        the agent, or before it while the run has taken no input yet: the first input
        (``send``, ``resume``, ``fork_from``) then raises ``UnknownAgentError`` if a check
        still names an agent that was never added, so a misspelt name cannot leave a check
        that never runs.

        Args:
            agent: The agent whose messages are checked.
            kind: Only messages of this kind (default: every message the agent sends).
            schema: A pydantic model the payload must validate against.
            check: A callable given the message; returns ``True``/``None`` to pass, or
                ``False``, a reason string or ``Verdict.failed(reason)`` to fail.
            name: How the check is called in feedback and in the store (default: ``"schema"``
                for a schema, the callable's name for a check).

        Raises:
            ConfigurationError: Neither ``schema`` nor ``check`` is given, or ``schema`` is not
                a pydantic model, or the name or the kind is longer than 128 characters (the
                longest every store can hold; the name is recorded with each rollback).
            UnknownAgentError: ``agent`` is not registered and the run already took input.
        """
        declared = declare_check(kind, schema=schema, check=check, name=name)
        if agent not in self._agents and self._phase not in _WITHOUT_CUT:
            raise self._unknown_checked([agent])
        self._checks.setdefault(agent, []).append(declared)
        if agent in self._agents:
            self._arm(agent)

    def _check_checked_agents(self) -> None:
        """Every agent a check names is registered, now that the run takes input."""
        unknown = [name for name in self._checks if name not in self._agents]
        if unknown:
            raise self._unknown_checked(unknown)

    def _unknown_checked(self, unknown: list[str]) -> UnknownAgentError:
        names = ", ".join(repr(name) for name in unknown)
        error = UnknownAgentError("Runtime.check()", unknown[0], sorted(self._agents))
        known = ", ".join(repr(name) for name in sorted(self._agents)) or "none"
        error.args = (
            f"Runtime.check() names {names}, which is not a registered agent (registered: "
            f"{known}); add the agent with Runtime.add() before the run takes input, or fix "
            "the name: a check on an agent that is never added would never run",
        )
        return error

    def _arm(self, name: str) -> None:
        """Give ``name``'s context a guard when it has checks or evaluates itself."""
        guard = guard_for(self._agents[name], self._checks.get(name, []))
        self._contexts[name].guard = guard
        if guard is not None:
            self._guards[name] = guard

    async def start(self) -> None:
        """Record the run in the store and start delivering messages.

        A run given a ``run_id`` that the store does not hold is recorded later, once it
        takes input or a snapshot. Snapshots of the ``snapshot_policy`` begin once the run
        has its first cut: its first input, or ``resume()`` or ``fork_from()`` done.
        """
        self._check_open()
        if self._phase not in _NOT_STARTED:
            return
        await self._ensure_run(create=self._phase is _Phase.PRIMED or not self._named)
        self._check_open()  # closed meanwhile, or started by another call
        if self._phase not in _NOT_STARTED:
            return
        primed = self._phase is _Phase.PRIMED
        if self._stored_before and primed:  # input sent before start, not resumed
            raise self._stored_run_error("input sent")
        self._enter(_Phase.RUNNING if primed else _Phase.STARTED)
        self._watch = asyncio.get_running_loop().create_task(
            self._close_with_the_loop(), name="agentsnap:close-watch"
        )
        self._scheduler.start()
        if self._journal is not None and self._run_created:  # else once it is recorded
            self._journal.start()
        if self._policy.every_seconds is not None:
            self._timer = asyncio.get_running_loop().create_task(
                self._tick(self._policy.every_seconds), name="agentsnap:snapshot-timer"
            )
        if self._replay is not None:
            self._watch_replay()

    def _watch_replay(self) -> None:
        """Write the replay log in the background whenever it holds many deliveries.

        Checked a few times a second rather than on every delivery, which would cost the bus
        a few per cent; at any rate the log is written before each side-effecting call.
        """
        replay = self._replay
        assert replay is not None
        if len(replay.deliveries) >= _REPLAY_HOLDS:
            replay.flush_soon()
        self._replay_watch = asyncio.get_running_loop().call_later(
            _REPLAY_WATCH_SECONDS, self._watch_replay
        )

    async def close(self) -> None:
        """Stop delivering, fail the snapshots still in progress, and wait for store writes.

        Messages still queued stay on their channels; nothing is handled after this. The run
        is recorded as failed when a rollback gave up or a handler raised; as interrupted
        when messages were still queued (``resume`` continues it); else as succeeded. The
        run's [`status_reason`][agentsnap.RunInfo.status_reason] says why, in one line.
        """
        await self._close(failed=None)

    async def _close_with_the_loop(self) -> None:
        """Close the runtime if its event loop ends while it is open (``close()`` forgotten).

        ``asyncio.run`` (and any runner) cancels the tasks left when the program's main
        coroutine returns, and lets them finish: this one then closes the runtime, so the run
        is recorded, its writes made and its lease released, and warns with a
        ``ResourceWarning``. It costs one idle task per runtime, nothing per message.
        """
        loop_end = _LoopEnd(self._bus)
        try:
            await loop_end
        except asyncio.CancelledError:
            if self._closed:
                raise
            busy = loop_end.busy
            self._watch = None
            await self._close(
                failed=None, cancelled=asyncio.CancelledError() if busy else None, cut_off=busy
            )
            text = (
                f"the Runtime of run {self.run_id} was never closed; it was closed as its "
                "event loop ended. Use `async with Runtime(...) as runtime:` or call "
                "`await runtime.close()`"
            )
            logger.warning("%s", text)
            warnings.warn(text, ResourceWarning, stacklevel=1)

    async def _close(
        self,
        *,
        failed: BaseException | None,
        cancelled: BaseException | None = None,
        cut_off: bool = False,
    ) -> None:
        """Close the runtime once; ``cut_off``: a handler was cancelled half-way."""
        phase = self._phase
        if phase in _ENDED:
            return
        self._enter(_Phase.CLOSING)
        try:
            await self._shut_down(
                failed,
                cancelled,
                started=phase not in _NOT_STARTED,
                live=phase is _Phase.RUNNING and not cut_off,
            )
        finally:
            self._enter(_Phase.CLOSED)

    async def _shut_down(
        self,
        failed: BaseException | None,
        cancelled: BaseException | None,
        *,
        started: bool,
        live: bool,
    ) -> None:
        """Close a runtime that was ``started`` (and ``live``: running) when closing began."""
        if self._watch is not None:
            self._watch.cancel()  # closed as it should be: nothing left to watch for
            self._watch = None
        if self._telemetry is not None:
            self._telemetry.unwatch(self._bus)
        if self._timer is not None:
            self._timer.cancel()
            await asyncio.gather(self._timer, return_exceptions=True)
        if self._replay_watch is not None:
            self._replay_watch.cancel()
        self._take_last_snapshot(live)  # none while a handler is half-way (a cancelled run)
        await self._scheduler.close()
        self._snapshots.abort_all("the runtime was closed before the snapshot completed")
        await self._snapshots.drain()
        if live and not self._run_created:
            try:  # a named run whose recording at its first input failed
                await self._ensure_run()
            except StoreError as exc:
                logger.error("run %s could not be recorded: %s", self.run_id, exc)
        # A runtime that never owned its run (a refused resume) leaves it as it found it.
        owner = self._ownership.lease is not None and self._lost is None
        closing = _Closing(self)
        if self._journal is not None:
            left = await self._journal.close()
            if left and owner:
                closing.spool(AppendJournal(run_id=self.run_id, segments=left))
        if self._replay is not None:
            await self._replay.close()
            if owner:
                # Input not handled yet is then restored by a resume.
                await closing.write(self._replay.flush, self._spool_replay)
        unreconciled: Exception | None = None
        try:
            if owner:
                await self._record_outcomes(closing)
            if started and owner:  # effects no final state holds were abandoned
                await reconcile(
                    self.ledger,
                    self.run_id,
                    [a.state for a in self._agents.values()],
                    self.tools,
                    store=self.store,
                )
        except Exception as exc:  # the run's status is still recorded; then it is raised
            unreconciled = exc
        finally:
            if self._owns_ledger:
                await self.ledger.close()
        if owner:
            try:  # agents registered after the run started
                await self._save_schemas()
            except Exception as exc:  # only the inspector's checks of edits miss them
                logger.warning("run %s: state schemas not recorded: %s", self.run_id, exc)
            status, reason = self._outcome(failed, cancelled, unreconciled)
            for info in self._unsaved_rollbacks:
                await closing.write(
                    functools.partial(self.store.save_rollback, info),
                    [SaveRollback(info=info)],
                )
            self._unsaved_rollbacks.clear()
            finished_at = utcnow()
            token = self._ownership.lease.token if self._ownership.lease else None
            await closing.write(
                functools.partial(self.store.finish_run, self.run_id, status, finished_at, reason),
                lambda: [
                    FinishRun(
                        run_id=self.run_id,
                        status=status,
                        finished_at=finished_at,
                        reason=reason,
                        token=token,
                    )
                ],
            )
            try:
                await self._ownership.release()
            except StoreError as exc:  # it expires by itself
                logger.warning("run %s: its lease was not released: %s", self.run_id, exc)
        elif self._lost is not None:
            await self._ownership.release()  # stops the heartbeat; the run is another's
        closing.finish()
        if unreconciled is not None:
            raise unreconciled

    def _outcome(
        self,
        failed: BaseException | None,
        cancelled: BaseException | None,
        unreconciled: Exception | None,
    ) -> tuple[RunStatus, str | None]:
        """How the run ends, and why in one line."""
        if failed is not None:
            return RunStatus.FAILED, _one_line(failed)
        if self._status_on_close is RunStatus.FAILED:
            return RunStatus.FAILED, self._stopped_because or "the run stopped"
        if self.failures:
            first = self.failures[0]
            more = len(self.failures) - 1
            return RunStatus.FAILED, _one_line(first) + (
                f" (and {more} more handler failure{'s' * (more > 1)})" if more else ""
            )
        if unreconciled is not None:
            return RunStatus.FAILED, _one_line(unreconciled)
        if cancelled is not None:
            how = "Ctrl-C" if isinstance(cancelled, KeyboardInterrupt) else "task cancelled"
            return RunStatus.CANCELLED, f"{how}; resume() continues it"
        if self._has_queued():
            queued = sum(type(item) is Message for ch in self._bus.channels.values() for item in ch)
            return RunStatus.INTERRUPTED, (
                f"closed with {queued} message{'s' * (queued != 1)} not delivered yet; "
                "resume() continues it"
            )
        return RunStatus.SUCCEEDED, None

    def _spool(self) -> Spool | None:
        """Where writes the database refused at close go: beside the database, by default."""
        url = getattr(self.store, "url", None)
        if not isinstance(url, str):
            return None  # a store in memory never refuses a write
        return Spool.for_url(url, self._spool_directory)

    async def _replay_spool(self) -> None:
        """Write what an earlier runtime of this run spooled when it closed."""
        spool = self._spool()
        if spool is None or not spool.file(self.run_id).exists():
            return
        report = await spool.replay(self.store, self.ledger, self.run_id)
        if not report.complete:
            raise StoreError(
                f"run {self.run_id} has writes spooled in {spool.file(self.run_id)} that could "
                f"not be written yet ({report}); resume it once the database answers, or run "
                "`agentsnap db recover`"
            )
        logger.info("run %s: wrote what was spooled at its last close", self.run_id)

    def _spool_replay(self) -> list[SpoolOp]:
        assert self._replay is not None
        return [AppendReplay.of(self.run_id, s) for s in self._replay.take_unwritten()]

    async def _record_outcomes(self, closing: _Closing) -> None:
        """Write the outcomes of tool calls the ledger could not record when they ran."""
        for pending in unrecorded(self.run_id):
            await closing.write(
                functools.partial(pending.record, self.ledger),
                [
                    UpdateLedger.of(
                        self.run_id,
                        pending.key,
                        pending.change,
                        (ToolCallStatus.IN_PROGRESS, ToolCallStatus.UNKNOWN),
                        owner_id(),
                        pending.attempt,
                    )
                ],
            )
            recorded(pending.key)

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException as exc:  # __aexit__ is not called: close what start() began
            await self._close(failed=exc)
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
        cancelled, so ``resume()`` continues it; any other exception records it as failed,
        with the exception as its reason.
        """
        if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)):
            await self._close(failed=None, cancelled=exc)
        else:
            await self._close(failed=exc)

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
        if not self._taking_input:
            self._before_input()
        message = self._bus.send(self._environment, to, payload, kind, headers)
        buffer = self._input_buffer
        buffer.append(message)
        if len(buffer) >= _SEAL_INPUTS_EVERY:
            self._prune_inputs()
        return message

    def _before_input(self) -> None:
        """The checks ``send`` skips while input flows: closed, stopped, first input."""
        self._check_open()
        self._raise_if_stopped()
        phase = self._phase
        if phase in _WITHOUT_CUT:
            self._check_not_stored_before("input sent")
            if phase is _Phase.RESTORING:
                raise ConfigurationError(
                    "input sent while resume() or fork_from() is under way: await it first"
                )
            self._check_checked_agents()
            self._enter(_Phase.PRIMED if phase is _Phase.NEW else _Phase.RUNNING)
            if self._policy.at_start:
                self._take_first_snapshot()
            elif phase is _Phase.STARTED and not self._run_created:
                # A named run takes its first input: record it before anything is delivered.
                self._first_write = asyncio.ensure_future(self._record_named_run())

    def _take_first_snapshot(self) -> None:
        """Take the run's first cut; nothing is delivered until it is stored.

        A crash can then never leave a run that did something without a cut to resume from.
        """
        handle = self._snapshots.capture()
        if handle is None:
            self._snapshots.begin(None)
            return
        self._first_write = asyncio.ensure_future(self._first_cut_stored(handle))

    async def _first_cut_stored(self, handle: SnapshotHandle) -> None:
        """The first cut is stored, and with it the input sent so far."""
        await handle.settled()
        if self._replay is not None:
            try:  # a run killed before its first side effect still gets its input back
                await self._replay.flush()
            except Exception as exc:
                logger.warning("run %s: the replay log was not written: %s", self.run_id, exc)

    @property
    def inputs_sent(self) -> Mapping[str, int]:
        """How many messages the environment has sent each agent in this run.

        After [`resume`][agentsnap.Runtime.resume] this counts the input restored from the
        store, so an application feeding the run from elsewhere knows what it already sent.
        """
        return {dst: ch.sent for dst, ch in self._bus.environment.outgoing.items()}

    def _prune_inputs(self) -> None:
        """Seal the buffered input; forget what no rollback target can need."""
        oldest = self._snapshots.oldest_target()
        if oldest is not None:
            self._inputs.forget(oldest[1])
        elif not self._snapshots.active:
            self._inputs.forget(None)  # no cut to go back to, and none coming
        else:
            self._inputs.seal()

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
        self._check_open()
        self._check_not_stored_before("snapshot() called")
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
        self._raise_if_stopped()
        while True:
            await self._scheduler.run_until_idle()
            await self._snapshots.drain()
            if self._rollbacks.exhausted is not None or self._lost or not self._has_queued():
                break
        if self._take_last_snapshot() is not None:
            await self._snapshots.drain()
        if self._journal is not None and self._lost is None:
            await self._journal.flush()
        self._raise_if_stopped()
        if raise_failures and len(self.failures) > self._reported:
            first = self.failures[self._reported]
            self._reported = len(self.failures)
            raise first
        self._reported = len(self.failures)

    @property
    def rollbacks(self) -> list[RollbackInfo]:
        """Every rollback of this runtime so far, oldest first."""
        return list(self._rollbacks.history)

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
        self._check_open()
        await self.start()
        self._check_not_stored_before("rollback() called")
        async with self._rollback_lock:
            return await self._manual_rollback(snapshot_id, reason)

    async def _manual_rollback(self, snapshot_id: str | None, reason: str) -> RollbackInfo:
        if self._rollbacks.exhausted is not None:
            raise self._rollbacks.exhausted
        latest = self._snapshots.latest
        if snapshot_id is None and latest is None:
            raise ConfigurationError(
                "there is no complete snapshot of this run to roll back to yet"
            )
        if latest is not None and snapshot_id in {None, latest.id}:
            snapshot = latest
        else:
            assert snapshot_id is not None
            snapshot = await self.store.load_snapshot(snapshot_id)
        self._rolling_back = True
        self._generation += 1
        try:
            work = self._rollbacks.manual(snapshot, reason)
            if self._telemetry is not None:
                work = self._telemetry.rolling_back(work, self.run_id, reason=reason)
            info = await work
            await self._after_rollback(info)
        finally:
            self._rolling_back = False
        return info

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
        self._check_fresh("resume()")
        self._check_checked_agents()
        return await self._resume("resume()", wait)

    async def _resume(self, what: str, wait: float | None) -> Snapshot:
        """Put the run the store holds on its current cut, and take it over (``resume()``)."""
        await self._replay_spool()
        try:
            run = await self.store.get_run(self.run_id)
        except NotFoundError:
            raise await self._unknown_run() from None
        if run.status is RunStatus.SUCCEEDED:
            raise _finished(run)
        await self._own(wait=2 * self._ownership.ttl if wait is None else wait)
        # Another resume may have taken the run over, finished it and let go meanwhile.
        run = await self.store.get_run(self.run_id)
        if run.status is RunStatus.SUCCEEDED:
            await self._ownership.release()
            self._ownership.lease = None  # so closing leaves the run as it found it
            raise _finished(run)
        if run.status is not RunStatus.RUNNING:  # it runs again, until it is closed
            await self.store.finish_run(self.run_id, RunStatus.RUNNING, None)
        await mark_orphaned(self.ledger, self.store, self.run_id)
        await self.start()
        self._raise_if_stopped()
        self._check_fresh(what)  # no input or restore came in meanwhile
        self._enter(_Phase.RESTORING)
        try:
            snapshot = await self._restore_current_cut()
        except BaseException:
            if self._phase is _Phase.RESTORING:
                self._enter(_Phase.STARTED)
            raise
        self._enter(_Phase.RUNNING)
        return snapshot

    async def _restore_current_cut(self) -> Snapshot:
        """Restore the run's current cut, and the input and replay plans logged after it."""
        snapshots = await self.store.list_snapshots(self.run_id)
        rollbacks = await self.store.list_rollbacks(self.run_id)
        segments = await self.store.load_replay(self.run_id) if self._replay else []
        if snapshots:
            self._snapshots.last_seq = max(s.seq for s in snapshots)
        snapshot = current_cut(snapshots, rollbacks)
        if snapshot is None:
            # Stopped before its first cut was stored, so before anything was delivered:
            # the registered states are that cut.
            handle = self._snapshots.capture()
            if handle is None:  # pragma: no cover - a fresh runtime is always quiet
                raise ConfigurationError(f"run {self.run_id} cannot be resumed: the bus is busy")
            snapshot = await handle
        plan = plan_replay(segments, snapshot)
        inputs, before = self._rollback_targets(snapshots, rollbacks, segments, snapshot, plan)
        self._inputs.restore(inputs, before)
        for name, steps in plan.order.items():
            endpoint = self._bus.endpoints.get(name)
            if endpoint is not None and name != ENVIRONMENT:
                endpoint.replay = steps
        if self._bus.replaying():
            self._replaying = True
            self._delivered = None
        if self._replay is not None:
            self._replay.timeline = self._replay.resumed = self._replay.written = plan.timeline
        # Model calls of the timeline the run stopped on may be recorded: look for them.
        self._line.resumed = self._line.timeline
        if plan.deliveries or plan.inputs:
            logger.info(
                "run %s resumes from snapshot %d: %d input(s) restored, %d deliveries replayed",
                self.run_id,
                snapshot.seq,
                len(plan.inputs),
                plan.deliveries,
            )
        await self._rollbacks.restart(snapshot, own=True)
        return snapshot

    def _rollback_targets(
        self,
        snapshots: list[Snapshot],
        rollbacks: list[RollbackInfo],
        segments: list[ReplaySegment],
        cut: Snapshot,
        plan: ReplayPlan,
    ) -> tuple[list[Message], Mapping[str, int]]:
        """Make the stored cuts before ``cut`` rollback targets again, as they were before
        the run stopped; return the input to hold for them, and what was sent before it.

        An output in flight in ``cut`` was sent before it: only an older cut lets the agent
        redo it. A cut qualifies when the replay log holds all the input sent after it, which
        a rollback there replays.
        """  # noqa: D205
        sent = _environment_sent(cut)
        earlier = earlier_targets(snapshots, rollbacks, cut)[: self._snapshots.max_targets - 1]
        for position in range(len(earlier) - 1, -1, -1):  # the oldest first
            target_sent = _environment_sent(earlier[position])
            inputs = plan_replay(segments, earlier[position]).inputs
            between = sum(sent.values()) - sum(target_sent.values())
            if len(inputs) >= between + len(plan.inputs):
                for target in earlier[: position + 1]:
                    self._snapshots.written(target)
                return inputs, target_sent
        return plan.inputs, sent

    async def fork_from(self, snapshot_id: str) -> Snapshot:
        """Start this (new) run from a complete snapshot of another run.

        Register the same agents first. The run is forked as
        [`fork_run`][agentsnap.inspect.fork_run] (and ``agentsnap fork``) forks one: it
        records its parent run and snapshot, and gets a copy of the snapshot as its snapshot
        1, its own cut to roll back to; then it is resumed from that copy. The original run
        is not touched.

        Returns:
            The snapshot the new run starts from (the other run's).

        Raises:
            NotFoundError: The store holds no such snapshot.
            SnapshotDamaged: The snapshot is damaged in the store.
            ConfigurationError: The snapshot failed, or this runtime already took input, or
                the store held this run (``run_id``) before this runtime started.
        """
        self._check_fresh("fork_from()")
        self._check_checked_agents()
        snapshot = await self.store.load_snapshot(snapshot_id)
        check_forkable(snapshot)
        if snapshot.run_id == self.run_id:
            raise ConfigurationError(
                "fork_from() starts a new run; to go back within this run, use rollback()"
            )
        self._check_fresh("fork_from()")
        if self._stored_before:
            raise self._stored_run_error("fork_from() called")
        await fork_snapshot(
            self.store,
            snapshot,
            run_id=self.run_id,
            metadata=self._metadata,
            name=self._name,
            tags=self._tags,
            recorded=self._run_created,  # started: the run is recorded, with no snapshot
        )
        await self._resume("fork_from()", None)
        return snapshot

    async def _unknown_run(self) -> NotFoundError:
        """The error for resuming a run the store does not hold, naming the runs it may mean."""
        found = await self.store.find_ids("run", self.run_id)
        if not found:
            return NotFoundError(
                "run",
                self.run_id,
                f"no run with id {self.run_id!r} in this store: nothing to resume (list the "
                "runs with `agentsnap runs`)",
            )
        runs = f"run {found[0]}" if len(found) == 1 else "runs " + ", ".join(found)
        return NotFoundError(
            "run",
            self.run_id,
            f"no run with id {self.run_id!r} in this store, but it starts the id of {runs}: "
            "pass the whole id of the run to resume",
        )

    def _check_fresh(self, what: str) -> None:
        self._check_open()
        if self._phase is _Phase.RESTORING:
            raise ConfigurationError(
                f"{what} called while resume() or fork_from() is under way; await it first"
            )
        if self._phase not in (_Phase.NEW, _Phase.STARTED) or (
            self._inputs or self._snapshots.last_seq
        ):
            raise ConfigurationError(
                f"{what} must come before the runtime takes input or snapshots; create a new "
                "Runtime, register the agents, then call it"
            )

    async def list_snapshots(self) -> list[Snapshot]:
        """Every snapshot of this run held by the store, in the order they were started."""
        return await self.store.list_snapshots(self.run_id)

    # -- delivery -------------------------------------------------------------------------

    async def _deliver(self, channel: Channel) -> None:
        first = self._first_write
        if first is not None:
            generation = self._generation
            await first
            self._first_write = None
            if generation != self._generation:
                return  # a rollback emptied the channels meanwhile and queued them again
        item = channel.take()
        endpoint = channel.receiver
        snapshots = self._snapshots
        if type(item) is Marker:
            snapshots.on_marker(endpoint, channel, item.snapshot)
            return
        message: Message = item  # type: ignore[assignment]
        if snapshots.active:
            snapshots.on_message(endpoint, channel, message)
        ctx: Context[Any] = endpoint.context
        if ctx.keep_before:
            snapshots.keep_before(endpoint, channel, message)
        # What bus.delivered() does, written out: this is the hot path of every delivery.
        channel.delivered += 1
        on_deliver = self._bus.on_deliver
        if on_deliver is not None:
            on_deliver(channel, message)
        delivered = self._delivered
        if delivered is not None:
            delivered.append(channel)  # bounded by _watch_replay, not here: the hot path
        elif self._replaying:
            self._replayed(endpoint, channel, message)
        ctx.message = message
        ctx.position = 0
        endpoint.busy = True
        generation = self._generation
        rejected: OutputRejected | None = None
        lost_to: Exception | None = None
        tracing = self._tracing
        guard = ctx.guard
        try:
            if tracing is None:
                await ctx.agent.handle(message, ctx)
                if guard is not None and guard.evaluates and ctx.rejected is None:
                    await evaluate_outputs(ctx)
            else:
                with tracing.handling(self.run_id, endpoint.name, message):
                    await ctx.agent.handle(message, ctx)
                    if guard is not None and guard.evaluates and ctx.rejected is None:
                        await evaluate_outputs(ctx)
        except OutputRejected as exc:
            rejected = exc
        except Exception as exc:
            if ctx.rejected is None:
                if _lost_to_database(exc):
                    lost_to = exc  # redone from the last cut once the database answers
                else:
                    self._handler_failed(endpoint.name, message, exc)
        finally:
            endpoint.busy = False
            ctx.message = None
            # A rejection the handler caught (even with ``except BaseException``) counts.
            if rejected is None and lost_to is None and ctx.rejected is None:
                if guard is not None and guard.outputs:
                    self._handled(ctx, guard, generation)
                if snapshots.wanted and generation == self._generation:
                    wanted = snapshots.wanted.get(endpoint.name)
                    if wanted:
                        snapshots.record(endpoint, wanted)
            else:
                rejected = rejected or ctx.rejected
                ctx.rejected = None
                if guard is not None:
                    # Held back, and now never sent (or sent when the handler is redone,
                    # after a database fault).
                    guard.outputs.clear()
        if generation != self._generation:
            return  # a rollback threw this handler's work away (and may have cancelled it)
        if rejected is not None:
            await self._rejected(rejected, generation, message)
            return
        if lost_to is not None:
            await self._lost_to_database(lost_to, endpoint.name, message, generation)
            return
        if self._redoing and self._rollbacks.passed(message):
            # A message redone after a rejection passed this time: a cut after it keeps a
            # later rollback from redoing it again.
            self._policy_snapshot()
        if self._countdown:
            self._countdown -= 1
            if not self._countdown:
                self._countdown = self._policy.every_deliveries or 0
                self._policy_snapshot()

    def _handled(self, ctx: Context[Any], guard: Guard, generation: int) -> None:
        """Release what a handler held back for self-evaluation, unless it was discarded."""
        if generation == self._generation:
            ctx.post_held()
        else:
            guard.outputs.clear()  # a rollback threw this handler's work away

    def _handling(self, endpoint: Endpoint) -> Handling | None:
        """What the running handler of ``endpoint`` did so far, for a recording inside it.

        ``None`` when it made a message visible already. An agent found inside a handler at
        a recording keeps its state as each later handler begins, so that the next
        recordings need not wait for its handlers either.
        """
        ctx = self._contexts.get(endpoint.name)
        message = None if ctx is None else ctx.message
        if ctx is None or message is None:
            return None
        ctx.keep_before = True
        channel = endpoint.incoming.get(message.src)
        if ctx.shown is message or channel is None:
            return None
        guard = ctx.guard
        return Handling(message, channel, tuple(guard.outputs) if guard is not None else ())

    async def _rejected(
        self, rejected: OutputRejected, generation: int, handling: Message | None = None
    ) -> None:
        """Act on a rejected output: at most one rollback at a time, for the live timeline.

        A rejection raised while a rollback is under way, or by a handler that began before
        the latest rollback (its work was thrown away), or after the run stopped, is dropped
        and uses no retry budget.
        """
        if (
            generation != self._generation
            or self._rolling_back
            or self._rollbacks.exhausted is not None
            or self._closed
        ):
            logger.debug("dropped a rejection from a discarded timeline: %s", rejected)
            return
        self._rolling_back = True
        self._generation += 1
        # Stop the world now, before any other handler sees what this one did.
        self._scheduler.pause()
        self._snapshots.suspended = "the run rolled back before the snapshot completed"
        self._snapshots.abort_all("an output was rejected before the snapshot completed")
        try:
            async with self._rollback_lock:
                await self._recover(rejected, handling)
        except Exception as exc:
            # The rejected output was not redone: the run cannot end as succeeded, even when
            # the application catches this.
            self._stop(exc)
            raise
        finally:
            self._rolling_back = False

    async def _lost_to_database(
        self, error: Exception, agent: str, message: Message, generation: int
    ) -> None:
        """A handler could not finish because the database did not answer in time.

        Its message was taken off its channel and what it did is half done, so the run goes
        back to its last cut once the database answers again, and redoes the work from
        there: nothing is lost, and the ledger makes the effects happen once. Like a
        rejection, at most one such rollback runs at a time, and one from a handler of a
        discarded timeline is dropped.
        """
        if generation != self._generation or self._rolling_back or self._closed:
            logger.debug("dropped a database failure from a discarded timeline: %s", error)
            return
        if self._rollbacks.exhausted is not None or self._lost is not None:
            return
        target = self._snapshots.latest
        if target is None:  # no cut to redo the work from
            self._handler_failed(agent, message, error)
            return
        self._rolling_back = True
        self._generation += 1
        self._scheduler.pause()
        reason = f"the database was unavailable: {error}"
        self._snapshots.suspended = f"the run rolled back: {reason}"
        self._snapshots.abort_all(self._snapshots.suspended)
        logger.warning(
            "run %s: agent %r could not finish %s: %s; the run goes back to snapshot %d once "
            "the database answers",
            self.run_id,
            agent,
            message.id,
            error,
            target.seq,
        )
        try:
            async with self._rollback_lock:
                if not await self._until_store_answers():
                    return
                await self._pace_fault_rollbacks()
                work = self._rollbacks.recover(self._snapshots.latest or target, reason)
                if self._telemetry is not None:
                    work = self._telemetry.rolling_back(work, self.run_id, reason=reason)
                await self._after_rollback(await work)
        finally:
            self._rolling_back = False

    async def _pace_fault_rollbacks(self) -> None:
        """Space rollbacks for a database that answers reads and still refuses writes.

        A full disk answers the probe, then fails the redone work again: back off between
        such rollbacks, doubling the pause while they keep coming.
        """
        now = time.monotonic()
        if now - self._last_fault_rollback < 2 * _PROBE_MAX:
            self._fault_pause = min(self._fault_pause * 2 or _PROBE_FIRST, _PROBE_MAX)
            await asyncio.sleep(self._fault_pause)
        else:
            self._fault_pause = 0.0
        self._last_fault_rollback = time.monotonic()

    async def _until_store_answers(self) -> bool:
        """Wait until the store and the ledger answer again; False if the run ended first."""
        pause = _PROBE_FIRST
        while not self._closed and self._lost is None:
            try:
                await self.store.get_run(self.run_id)
                await self.ledger.get(_PROBE_KEY)
            except StoreError as exc:
                if not _lost_to_database(exc):
                    raise
                logger.warning("run %s: the database is still unavailable: %s", self.run_id, exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, _PROBE_MAX)
            else:
                return True
        return False

    async def _recover(self, rejected: OutputRejected, handling: Message | None) -> None:
        """Roll back for a rejected output, or stop the run when the policy gave up."""
        work = self._rollbacks.reject(rejected, handling)
        if self._telemetry is not None:
            work = self._telemetry.rolling_back(work, self.run_id, rejection=rejected)
        info = await work
        if info is None:
            self._stop(self._rollbacks.exhausted)
            return
        await self._after_rollback(info)

    def _stop(self, reason: BaseException | None) -> None:
        """The run gave up: nothing is delivered, sent or snapshotted any more."""
        self._status_on_close = RunStatus.FAILED
        if reason is not None and self._stopped_because is None:
            self._stopped_because = _one_line(reason)
        if _Phase.STOPPED in _MOVES[self._phase]:  # not while closing
            self._enter(_Phase.STOPPED)
        self._scheduler.pause()
        self._scheduler.reset()
        self._snapshots.suspended = f"the run stopped: {reason}"
        self._snapshots.abort_all(self._snapshots.suspended)

    def _replay_stalled(self) -> None:
        """Every agent waits for a message its replay plan names, and none can come."""
        logger.warning(
            "run %s: the resumed run could not repeat the order in which its agents took their "
            "messages before it stopped (a handler that is not deterministic, or input that "
            "was not restored); it goes on in any order, and calls of side-effecting tools "
            "without an explicit key= may run again under new keys",
            self.run_id,
        )
        self._bus.abandon_replay()
        self._replay_done()
        if self._replay is not None:
            self._replay.new_timeline()

    def _replayed(self, endpoint: Endpoint, channel: Channel, message: Message) -> None:
        """``endpoint`` took ``message`` while the run replays what it did before it stopped."""
        replay = self._replay
        assert replay is not None
        plan = endpoint.replay
        if plan:
            if plan[0][0] == message.src and plan[0][1] == message.seq:
                plan.popleft()  # logged before the stop already
                if not plan and not self._bus.replaying():
                    self._replay_done()
                return
            self._replay_diverged(endpoint.name, plan[0], message)
        elif not self._bus.replaying():  # pragma: no cover - the plans ended elsewhere
            self._replay_done()
        replay.deliveries.append(channel)

    def _replay_done(self) -> None:
        """Every plan is done: deliveries are logged on the fast path again."""
        self._replaying = False
        if self._replay is not None:
            self._delivered = self._replay.deliveries

    def _replay_diverged(self, agent: str, planned: tuple[str, int], message: Message) -> None:
        logger.warning(
            "run %s: agent %r took %s, but before the run stopped it took %s>%s#%d next; the "
            "replay is abandoned",
            self.run_id,
            agent,
            message.id,
            planned[0],
            agent,
            planned[1],
        )
        self._replay_stalled()

    async def _append_replay(self, segment: ReplaySegment) -> None:
        await self._ensure_run()
        await self.store.append_replay(self.run_id, segment)

    async def _after_rollback(self, info: RollbackInfo) -> None:
        if info.agent is not None and info.agent in self._agents:
            await self._contexts[info.agent].tell_rollback(info.reason, info.source)
        for name, agent in self._agents.items():
            ctx = self._contexts[name]
            try:
                await agent.on_rollback(info, ctx)
            except OutputRejected as exc:  # checked before it was enqueued: nobody saw it
                logger.error(
                    "agent %r sent an output from on_rollback that was rejected, and not sent: %s",
                    name,
                    exc,
                )
            finally:
                self._snapshots.changed.add(name)  # whatever the hook did to the state
        if self._rollbacks.exhausted is None and not self._closed:
            self._snapshots.suspended = None
            self._rollbacks.resume()

    def _restore(self, snapshot: Snapshot) -> int:
        self._snapshots.abort_all("the run rolled back before the snapshot completed")
        self._snapshots.forget_handlers()
        self._snapshots.mark_changed(*self._agents)
        return restore_cut(
            self._bus,
            self._agents,
            snapshot,
            initial_states=self._initial,
            epoch=self._snapshots.last_seq,
            replay=self._inputs,
        )

    async def _save_rollback(self, info: RollbackInfo) -> None:
        """Record a rollback that has happened; a failure to write it stops nothing.

        The rollback is done in memory whatever the store says. A record the store's retries
        could not write is kept and written later: after the next snapshot, or at close
        (spooled if the database is still away).
        """
        if self._replay is not None:
            self._replay.new_timeline()
        else:
            self._line.timeline += 1
        try:
            await self._ensure_run()
            await self.store.save_rollback(info)
        except StoreError as exc:
            logger.error(
                "run %s: rollback %s was not recorded yet, and will be: %s",
                self.run_id,
                info.id,
                exc,
            )
            self._unsaved_rollbacks.append(info)

    async def _save_unsaved_rollbacks(self) -> None:
        """Write the rollback records the store refused before, oldest first."""
        while self._unsaved_rollbacks:
            await self.store.save_rollback(self._unsaved_rollbacks[0])
            del self._unsaved_rollbacks[0]

    def _handler_failed(self, agent: str, message: Message, exc: Exception) -> None:
        failure = HandlerFailed(agent, message, exc)
        failure.__cause__ = exc
        self.failures.append(failure)
        logger.error("%s", failure, exc_info=exc)

    def _take_last_snapshot(self, live: bool | None = None) -> SnapshotHandle | None:
        """Record where the run stands as it goes idle or closes (``SnapshotPolicy.at_end``).

        Taken at once (no markers) when no handler is half-way and nothing was sent or
        delivered since the newest snapshot; ``None`` when none was taken. ``live``: the run
        was running (default: it is).
        """
        if live is None:
            live = self._phase is _Phase.RUNNING
        if (
            not (self._policy.at_end and live)
            or self._lost is not None
            or self._snapshots.suspended is not None
            # A cut after a failed handler would hold its message as handled: resuming the
            # failed run from the newest cut before it handles that message again.
            or self.failures
        ):
            return None
        newest = self._snapshots.newest
        if newest is not None:
            sent = delivered = 0
            for channel in self._bus.channels.values():
                sent += channel.sent
                delivered += channel.delivered
            then_sent = then_received = 0
            for cut in newest.agents.values():
                then_sent += sum(cut.sent.values())
                then_received += sum(cut.received.values())
            if (sent, delivered) == (then_sent, then_received):
                return None  # nothing happened since: that snapshot is where the run stands
        return self._snapshots.capture()

    def _policy_snapshot(self) -> SnapshotHandle | None:
        snapshots = self._snapshots
        if (
            # Not before the run has its first cut: input taken, or resume() or fork_from()
            # done (a timed snapshot must not take the place of the cut they restore).
            self._taking_input
            and snapshots.suspended is None
            and len(snapshots.active) < self._policy.max_in_progress
            # While the store is behind (slow, or away), a policy snapshot is skipped rather
            # than queued: the next one records everything it would have.
            and snapshots.writing < _WRITES_BEHIND
        ):
            return self._snapshots.begin(None)
        return None

    async def _tick(self, seconds: float) -> None:
        # Snapshots by time: the next one waits until the store has taken the ones before
        # (up to max_in_progress of them), so that a slow store cannot make them pile up;
        # and the period stretches to _STRETCH times the time the latest one took from its
        # start until it was written, so that snapshots whose recording or writing takes
        # long (a big team, a round that keeps every agent busy) take a sixth of the run's
        # time at most (the store's writer thread works beside the loop: under a quarter
        # counting it), however short ``every_seconds`` is.
        loop = asyncio.get_running_loop()
        outstanding: list[SnapshotHandle] = []
        limit = self._policy.max_in_progress
        period = seconds
        started = loop.time()

        def settled(begun: float) -> Callable[[asyncio.Future[None]], None]:
            def took(_: asyncio.Future[None]) -> None:
                nonlocal period
                period = max(seconds, _STRETCH * (loop.time() - begun))

            return took

        while True:
            await asyncio.sleep(max(0.0, started + period - loop.time()))
            outstanding = [handle for handle in outstanding if not handle.done()]
            if len(outstanding) >= limit:
                await asyncio.sleep(seconds)  # then look again
                continue
            started = loop.time()
            handle = self._policy_snapshot()
            if handle is not None:
                outstanding.append(handle)
                asyncio.ensure_future(handle.settled()).add_done_callback(settled(started))

    async def _ensure_run(self, *, create: bool = True) -> None:
        """Find out whether the store held the run before, and record it (``create``).

        Without ``create``, a run the store does not hold is left unrecorded: a named run
        started without input is recorded once it takes input or a snapshot.
        """
        if not self._run_created:
            async with self._recording_run:  # one recording, whoever asks first
                if not self._run_created:
                    if not self._looked_up:
                        try:
                            await self.store.get_run(self.run_id)
                        except NotFoundError:
                            pass
                        else:
                            self._stored_before = True
                        self._looked_up = True
                    if not (create or self._stored_before):
                        return
                    await self.store.create_run(
                        RunInfo(
                            id=self.run_id,
                            metadata=self._metadata,
                            name=self._name,
                            tags=self._tags,
                        )
                    )
                    self._run_created = True
                    if not self._stored_before:
                        await self._own(wait=0.0)  # a new run: nobody else can hold it
                    if self._journal is not None and self._phase not in _NOT_STARTED:
                        self._journal.start()  # deferred by start() until the run was recorded
        await self._save_schemas()

    async def _record_named_run(self) -> None:
        """Record a named run at its first input, when no first snapshot will."""
        try:
            await self._ensure_run()
        except Exception as exc:  # recorded by the next write that needs it, or at close
            logger.warning("run %s was not recorded yet: %s", self.run_id, exc)

    async def _save_schemas(self) -> None:
        """Record the state schemas of the agents registered since the last time.

        An inspector checks edited states against them without importing this program.
        """
        new = [name for name in self._agents if name not in self._schemas_saved]
        if not new:
            return
        # Claimed before the write: the writes of concurrent snapshots must not repeat it.
        self._schemas_saved.update(new)
        try:
            schemas: dict[str, dict[str, JsonValue]] = {}
            for name in new:
                model: type[BaseModel] = type(self._agents[name].state)
                schema = _state_schema(model)
                if schema is not None:
                    schemas[name] = schema
            if schemas:
                await self.store.save_state_schemas(self.run_id, schemas)
        except BaseException:
            self._schemas_saved.difference_update(new)  # written by a later call
            raise

    async def _own(self, *, wait: float) -> None:
        """Take the run's lease, fence every write with its token, and keep it renewed."""
        if self._ownership.lease is not None:
            return
        await self._ownership.acquire(wait=wait, refuse_live=True)
        self._ownership.fence_ledger(self.ledger)
        self._ownership.start_heartbeat(self._ownership_lost)

    def _ownership_lost(self, lost: OwnershipLost) -> None:
        """Another runtime took the run over: stop at once, writing nothing more."""
        logger.error("%s", lost)
        self._lost = lost
        self._stop(lost)

    def _check_not_stored_before(self, what: str) -> None:
        if self._stored_before and self._phase in _WITHOUT_CUT:
            raise self._stored_run_error(what)

    def _stored_run_error(self, what: str) -> ConfigurationError:
        return ConfigurationError(
            f"{what} on run {self.run_id}, which the store already holds: call "
            "`await runtime.resume()` first to continue it, or leave run_id out to start "
            "a new run (fork_from() starts one from a snapshot of it)"
        )

    async def _persist(self, snapshot: Snapshot) -> None:
        await self._ensure_run()
        await self.store.save_snapshot(snapshot)
        if self._unsaved_rollbacks:
            try:
                await self._save_unsaved_rollbacks()
            except StoreError as exc:
                logger.warning("run %s: rollback records still not written: %s", self.run_id, exc)

    def _has_queued(self) -> bool:
        return any(self._bus.channels.values())

    def _raise_if_stopped(self) -> None:
        if self._lost is not None:
            raise self._lost
        if self._rollbacks.exhausted is not None:
            raise self._rollbacks.exhausted

    def _enter(self, phase: _Phase) -> None:
        """Move to ``phase``: the one place the phase changes."""
        assert phase in _MOVES[self._phase], f"a runtime cannot go from {self._phase} to {phase}"
        self._phase = phase
        self._taking_input = phase in _TAKING_INPUT

    @property
    def _closed(self) -> bool:
        """Closing or closed: nothing more is handled."""
        return self._phase in _ENDED

    def _check_open(self) -> None:
        if self._phase in _ENDED:
            raise RuntimeClosedError("this runtime is closed; create a new Runtime to go on")


class _Closing:
    """The writes of a closing runtime: what the database refuses is spooled, not lost.

    Once one write failed for a passing reason after the store's retries, the database is
    taken to be away and the writes after it are spooled at once.
    """

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self.ops: list[SpoolOp] = []
        self.away: StoreError | None = None
        self.error: StoreError | None = None

    def spool(self, op: SpoolOp) -> None:
        """Spool ``op`` whatever happens."""
        self.ops.append(op)

    async def write(
        self,
        attempt: Callable[[], Awaitable[object]],
        spooled: Sequence[SpoolOp] | Callable[[], Sequence[SpoolOp]],
    ) -> None:
        """``attempt`` the write; if the database is away, spool ``spooled`` (or what it
        gives) instead.
        """  # noqa: D205
        if self.away is None:
            try:
                await attempt()
            except StoreError as exc:
                if not _lost_to_database(exc):
                    self.error = self.error or exc  # raised once the rest is done
                    return
                self.away = exc
            else:
                return
        self.ops.extend(spooled() if callable(spooled) else spooled)

    def finish(self) -> None:
        """Spool what the database refused; raise what could not be kept at all.

        Raises:
            StoreError: A write failed for good, or could not even be spooled.
        """
        runtime = self._runtime
        if self.ops:
            spool = runtime._spool()
            if spool is None:  # pragma: no cover - only SQL stores fail like this
                raise StoreError(
                    f"run {runtime.run_id}: {len(self.ops)} write(s) at close failed and "
                    f"cannot be spooled: {self.away}"
                )
            try:
                for op in self.ops:
                    spool.add(op)
            except (OSError, SpoolError) as exc:
                raise StoreError(
                    f"run {runtime.run_id}: {len(self.ops)} write(s) at close failed "
                    f"({self.away}), and spooling them to {spool.directory} failed too ({exc}): "
                    "they are lost"
                ) from exc
            logger.warning(
                "run %s: the database did not take %d write(s) at close (%s); they are kept "
                "in %s and written when the run is resumed, or by `agentsnap db recover`",
                runtime.run_id,
                len(self.ops),
                self.away,
                spool.file(runtime.run_id),
            )
        if self.error is not None:
            raise self.error
