"""The same scenarios in one process and spread over three workers: what both modes share.

Each test runs once on a [`Runtime`][agentsnap.Runtime] (SQLite in the test's directory) and
once as a [`DistributedRun`][agentsnap.distributed.DistributedRun] with three
[`Worker`][agentsnap.distributed.Worker]s in this event loop (NATS JetStream, a store in
memory shared by every host, as ``test_distributed.py`` does), and asserts the behaviour the
two must have in common:

1. every handled message yields a handler span naming its agent;
2. work a handler lost to a transient database fault is redone from the last complete cut
   once the database answers, its effect happening once, with no handler failure;
3. a snapshot begun while a handler waits completes before the handler returns, recording
   the agent's state as before the handler and the message being handled in flight;
4. a handler that raises is recorded as a ``HandlerFailed``;
5. an ``on_rollback`` that raises is recorded as a ``HandlerFailed`` too, logged, and the
   run goes on.

The scenarios are written once, against ``Mode``: add the agents (and their checks), send,
wait until the run is idle, snapshot, list the failures.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from nats_server import SHARED_URL, OwnServer, reachable, server_binary, unavailable
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import Field

import agentsnap.telemetry
from agentsnap import (
    Agent,
    AgentState,
    Context,
    HandlerFailed,
    MemoryStore,
    Message,
    RetryPolicy,
    RollbackInfo,
    Runtime,
    StoreError,
    tool,
)
from agentsnap.distributed import App, DistributedRun, Worker
from agentsnap.handles import SnapshotHandle
from agentsnap.jetstream import JetStreamLink
from agentsnap.ledger import Ledger, LedgerEntry
from agentsnap.messages import ENVIRONMENT
from agentsnap.store.faults import classify
from agentsnap.store.sql import SqlStore

PATIENCE = 30.0
"""Seconds a run may take to become idle before the test reports it stuck (never reached
when green: each scenario takes well under a second or two)."""
WAIT_INSIDE = 5.0
"""Seconds a snapshot begun inside a waiting handler is given to complete."""
WORKERS = 3
MODES = ["one-process", "three-workers"]


# -- the two modes --------------------------------------------------------------------------


@dataclass
class Cast:
    """A run's agents, the checks on their outputs and the retry policy: built anew for
    every process of a run (each process of a distributed run builds its own agents)."""

    agents: list[Agent[Any]]
    checks: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """``(agent, keyword arguments of Runtime.check / App.check)``."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)


class Mode(ABC):
    """One way of running a cast: the operations the scenarios need."""

    @abstractmethod
    async def start(self, make: Callable[[], Cast]) -> None:
        """Build the cast (once per process) and start the run."""

    @abstractmethod
    def agent(self, name: str) -> Agent[Any]:
        """The instance of agent ``name`` that handles its messages."""

    @abstractmethod
    def send(self, to: str, payload: Any = None, *, kind: str = "message") -> Message:
        """Send ``to`` a message from the environment."""

    @abstractmethod
    async def idle(self) -> None:
        """Wait until the run has nothing left to do (failing after ``PATIENCE``)."""

    @abstractmethod
    def snapshot(self) -> SnapshotHandle:
        """Begin a snapshot now."""

    @abstractmethod
    def failures(self) -> list[Any]:
        """The handler failures recorded so far, oldest first."""

    @abstractmethod
    def ledger_of(self, name: str) -> Ledger:
        """The ledger agent ``name``'s side-effecting tool calls go to."""

    @property
    @abstractmethod
    def rollbacks(self) -> list[RollbackInfo]:
        """The run's rollbacks so far."""

    @abstractmethod
    async def close(self) -> None:
        """Close everything ``start`` opened."""


class OneProcess(Mode):
    """A ``Runtime`` on SQLite in the test's directory."""

    def __init__(self, tmp_path: Path) -> None:
        self.store = SqlStore(f"sqlite:///{tmp_path / 'agentsnap.db'}")
        self.runtime: Runtime | None = None

    async def start(self, make: Callable[[], Cast]) -> None:
        cast = make()
        runtime = self.runtime = Runtime(store=self.store, retry=cast.retry)
        for agent in cast.agents:
            runtime.add(agent)
        for name, check in cast.checks:
            runtime.check(name, **check)
        await runtime.start()

    @property
    def _runtime(self) -> Runtime:
        assert self.runtime is not None, "start() first"
        return self.runtime

    def agent(self, name: str) -> Agent[Any]:
        return self._runtime.agents[name]

    def send(self, to: str, payload: Any = None, *, kind: str = "message") -> Message:
        return self._runtime.send(to, payload, kind=kind)

    async def idle(self) -> None:
        async with asyncio.timeout(PATIENCE):
            await self._runtime.run_until_idle(raise_failures=False)

    def snapshot(self) -> SnapshotHandle:
        return self._runtime.snapshot()

    def failures(self) -> list[Any]:
        return list(self._runtime.failures)

    def ledger_of(self, name: str) -> Ledger:
        return self._runtime.ledger

    @property
    def rollbacks(self) -> list[RollbackInfo]:
        return self._runtime.rollbacks

    async def close(self) -> None:
        try:
            if self.runtime is not None:
                await self.runtime.close()
        finally:
            await self.store.close()


class ThreeWorkers(Mode):
    """A ``DistributedRun`` and three ``Worker``s in this event loop, each with its own
    connection to NATS, sharing one store in memory; the agents are dealt to the workers in
    the cast's order (agent ``i`` to worker ``i % 3``)."""

    def __init__(self, nats_url: str) -> None:
        self.nats_url = nats_url
        self.store = MemoryStore()
        self.links: list[JetStreamLink] = []
        self.run: DistributedRun | None = None
        self.workers: list[Worker] = []
        self.started: list[Worker] = []
        self.apps: list[App] = []
        self.hosting: dict[str, int] = {}

    async def start(self, make: Callable[[], Cast]) -> None:
        def app() -> App:
            cast = make()
            built = App(agents=cast.agents, retry=cast.retry)
            for name, check in cast.checks:
                built.check(name, **check)
            return built

        names = app().names
        assert len(names) >= WORKERS, "every worker hosts at least one agent"
        self.hosting = {name: i % WORKERS for i, name in enumerate(names)}
        self.links = [await JetStreamLink.connect(self.nats_url) for _ in range(WORKERS + 1)]
        run = self.run = DistributedRun(self.links[0], self.store, app(), part_timeout=PATIENCE)
        self.apps = [app() for _ in range(WORKERS)]
        self.workers = [
            Worker(
                link,
                self.store,
                run.run_id,
                self.apps[i],
                [name for name, n in self.hosting.items() if n == i],
                name=f"w{i}",
            )
            for i, link in enumerate(self.links[1:])
        ]
        await run.start()
        for worker in self.workers:
            await worker.start()
            self.started.append(worker)
        # The run's first cut, before any input, as a Runtime takes one at its first input:
        # the cut a rollback or a redo goes back to.
        async with asyncio.timeout(PATIENCE):
            await run.snapshot()

    @property
    def _run(self) -> DistributedRun:
        assert self.run is not None, "start() first"
        return self.run

    def agent(self, name: str) -> Agent[Any]:
        (found,) = [a for a in self.apps[self.hosting[name]].agents if a.name == name]
        return found

    def send(self, to: str, payload: Any = None, *, kind: str = "message") -> Message:
        return self._run.send(to, payload, kind=kind)

    async def idle(self) -> None:
        async with asyncio.timeout(PATIENCE):
            await self._run.run_until_idle(every=0.2)

    def snapshot(self) -> SnapshotHandle:
        return self._run.snapshot()

    def failures(self) -> list[Any]:
        # Each worker records the failures of the agents it hosts.
        return [failure for worker in self.workers for failure in worker.host.failures]

    def ledger_of(self, name: str) -> Ledger:
        return self.workers[self.hosting[name]].host.ledger

    @property
    def rollbacks(self) -> list[RollbackInfo]:
        return self._run.rollbacks

    async def close(self) -> None:
        try:
            if self.run is not None:
                await self.run.close()
        finally:
            for worker in self.started:
                await worker.close()
            if self.run is not None and self.links:
                await self.links[0].delete_stream(self.run.run_id)
            for link in self.links:
                await link.close()


@pytest.fixture
def nats_url(tmp_path: Path) -> Iterator[str]:
    """The shared server's URL, or one of this test's own when there is none."""
    if reachable(SHARED_URL):
        yield SHARED_URL
        return
    binary = server_binary()
    if binary is None:
        unavailable(f"no NATS server at {SHARED_URL} and no nats-server binary")
        return
    server = OwnServer(binary, tmp_path / "jetstream")
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(params=MODES, ids=MODES)
async def mode(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Mode]:
    made: Mode
    if request.param == "one-process":
        made = OneProcess(tmp_path)
    else:
        made = ThreeWorkers(request.getfixturevalue("nats_url"))
    try:
        yield made
    finally:
        await made.close()


def agent_state(mode: Mode, name: str) -> Any:
    return mode.agent(name).state


# -- 1. spans around handlers --------------------------------------------------------------


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """An SDK tracer provider installed as the global one for this test only.

    Both modes resolve their telemetry as a ``Runtime`` does by default: the global
    providers, when an SDK is installed there. The global provider can be set only once per
    process, so it is put in place (and taken away) under the API's own variable.
    """
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        # The telemetry made on this provider is cached by the provider's id: forget it.
        defaults = agentsnap.telemetry._defaults
        for key in [key for key in defaults if key[0] == id(provider)]:
            del defaults[key]


class Relay(Agent[AgentState]):
    """Remembers what it handles and passes it on to the next agent, if it has one."""

    def __init__(self, name: str, to: str | None = None) -> None:
        super().__init__(name)
        self.to = to

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.state.memory[message.id] = message.payload
        if self.to is not None:
            ctx.send(self.to, message.payload, kind="relayed")


def relays() -> Cast:
    return Cast([Relay("first", "second"), Relay("second", "third"), Relay("third")])


async def test_each_handled_message_yields_a_handler_span_naming_its_agent(
    spans: InMemorySpanExporter, mode: Mode
) -> None:
    # ``spans`` first: the provider is in place before the run starts, and until it closed.
    await mode.start(relays)
    for n in range(2):
        mode.send("first", {"n": n})
    await mode.idle()

    for name in ("first", "second", "third"):
        assert len(agent_state(mode, name).memory) == 2, name
    handlers = [
        span
        for span in spans.get_finished_spans()
        if (span.attributes or {}).get("gen_ai.operation.name") == "invoke_agent"
    ]
    # One handler span per handled message, named after its agent and saying which it is.
    assert Counter(
        (span.name, (span.attributes or {}).get("gen_ai.agent.name")) for span in handlers
    ) == {
        ("invoke_agent first", "first"): 2,
        ("invoke_agent second", "second"): 2,
        ("invoke_agent third", "third"): 2,
    }


# -- 2. redo after an injected database fault ----------------------------------------------

BOOKED: Counter[str] = Counter()
"""The outside world: how many times each order was booked."""


@tool(side_effect=True, name="kernel_modes_book")
async def book(order: str) -> str:
    """Books an order: an effect outside the run."""
    BOOKED[order] += 1
    return f"booked {order}"


class Orders(AgentState):
    orders: list[str] = Field(default_factory=list)


class Clerk(Agent[Orders]):
    """Books each order (a side-effecting tool call), then passes it on."""

    def __init__(self, name: str, to: str) -> None:
        super().__init__(name, Orders())
        self.to = to

    async def handle(self, message: Message, ctx: Context[Orders]) -> None:
        order = str(message.payload)
        await book(ctx, key=f"book-{order}", order=order)
        ctx.state.orders.append(order)
        ctx.send(self.to, order, kind="booked")


class Filer(Agent[Orders]):
    """Files each order it is told of, and passes it on, if it has someone to tell."""

    def __init__(self, name: str, to: str | None = None) -> None:
        super().__init__(name, Orders())
        self.to = to

    async def handle(self, message: Message, ctx: Context[Orders]) -> None:
        ctx.state.orders.append(str(message.payload))
        if self.to is not None:
            ctx.send(self.to, message.payload, kind="filed")


def office() -> Cast:
    return Cast([Clerk("clerk", "filer"), Filer("filer", "archive"), Filer("archive")])


def connection_dropped() -> StoreError:
    """A transient database fault: the connection was dropped under the call."""
    error = StoreError("the connection to the database was lost")
    error.__cause__ = ConnectionResetError(104, "Connection reset by peer")
    return error


class Outage:
    """Makes a ledger's claims fail with a dropped connection for its first ``calls``."""

    def __init__(self, ledger: Ledger, calls: int) -> None:
        self.left = calls
        self.refused = 0
        self._claim: Callable[[LedgerEntry], Awaitable[LedgerEntry | None]] = ledger.claim

        async def claim(entry: LedgerEntry) -> LedgerEntry | None:
            if self.left:
                self.left -= 1
                self.refused += 1
                raise connection_dropped()
            return await self._claim(entry)

        ledger.claim = claim  # type: ignore[method-assign]


async def test_work_lost_to_a_database_fault_is_redone_from_the_last_cut_with_one_effect(
    mode: Mode,
) -> None:
    fault = classify(connection_dropped())
    assert fault is not None
    assert fault.transient
    BOOKED.clear()
    await mode.start(office)
    outage = Outage(mode.ledger_of("clerk"), calls=2)
    mode.send("clerk", "o1")
    await mode.idle()
    mode.send("clerk", "o2")
    await mode.idle()

    assert outage.refused == 2, "the outage hit the claims"
    assert BOOKED == {"o1": 1, "o2": 1}, "each order booked once: none lost, none twice"
    assert mode.failures() == []
    assert any(r.source == "database" for r in mode.rollbacks), mode.rollbacks
    for name in ("clerk", "filer", "archive"):
        assert agent_state(mode, name).orders == ["o1", "o2"], name


# -- 3. a snapshot recorded inside a long handler ------------------------------------------


class Thinker(Agent[Orders]):
    """Waits for ``release`` in each handler (a model call, say), then passes the message on."""

    def __init__(self, name: str, to: str, entered: asyncio.Event, release: asyncio.Event) -> None:
        super().__init__(name, Orders())
        self.to = to
        self.entered = entered
        self.release = release
        self.finished = 0

    async def handle(self, message: Message, ctx: Context[Orders]) -> None:
        self.entered.set()
        await self.release.wait()
        ctx.state.orders.append(str(message.payload))
        ctx.send(self.to, message.payload, kind="thought")
        self.finished += 1


async def test_a_snapshot_begun_inside_a_waiting_handler_completes_before_it_returns(
    mode: Mode,
) -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    await mode.start(
        lambda: Cast([Thinker("thinker", "sink", entered, release), Filer("sink"), Filer("idle")])
    )
    question = mode.send("thinker", "q1")
    async with asyncio.timeout(PATIENCE):
        await entered.wait()
    handle = mode.snapshot()
    snapshot = None
    try:
        async with asyncio.timeout(WAIT_INSIDE):
            snapshot = await asyncio.shield(handle.wait())
        finished_then = mode.agent("thinker").finished  # type: ignore[attr-defined]
    except TimeoutError:
        finished_then = None
    finally:
        release.set()
    await mode.idle()

    assert snapshot is not None, (
        f"the snapshot did not complete within {WAIT_INSIDE} s while the handler waited"
    )
    assert finished_then == 0, "complete while the handler still waited"
    thinker = snapshot.agents["thinker"]
    # The state from before the handler, and the message being handled in flight.
    assert thinker.state["orders"] == []
    assert thinker.received.get(ENVIRONMENT, 0) == 0
    assert [m.id for m in snapshot.in_flight(ENVIRONMENT, "thinker")] == [question.id]
    assert snapshot.agents["sink"].received.get("thinker", 0) == 0
    # Afterwards the handler ended as usual.
    assert agent_state(mode, "thinker").orders == ["q1"]
    assert agent_state(mode, "sink").orders == ["q1"]


# -- 4. failures of the same type ----------------------------------------------------------


class Picky(Agent[Orders]):
    """Raises on an order marked bad; passes the others on."""

    def __init__(self, name: str, to: str) -> None:
        super().__init__(name, Orders())
        self.to = to

    async def handle(self, message: Message, ctx: Context[Orders]) -> None:
        payload = message.payload_as(dict[str, Any])
        if payload.get("bad"):
            raise ValueError("a bad order")
        ctx.state.orders.append(str(payload["n"]))
        ctx.send(self.to, str(payload["n"]), kind="good")


async def test_a_handler_that_raises_is_recorded_as_handler_failed(mode: Mode) -> None:
    await mode.start(
        lambda: Cast([Filer("intake", "picky"), Picky("picky", "tally"), Filer("tally")])
    )
    for n, bad in enumerate([False, True, False]):
        mode.send("intake", {"n": n, "bad": bad})
    await mode.idle()

    failures = mode.failures()
    assert len(failures) == 1, f"one failure expected, recorded: {failures!r}"
    failure = failures[0]
    assert isinstance(failure, HandlerFailed), f"recorded as {failure!r}"
    assert failure.agent == "picky"
    assert failure.message is not None
    assert failure.message.src == "intake"
    assert failure.message.payload == {"n": 1, "bad": True}
    assert isinstance(failure.__cause__, ValueError)
    assert str(failure.__cause__) == "a bad order"
    # The other messages were handled regardless.
    assert agent_state(mode, "tally").orders == ["0", "2"]


# -- 5. a raising on_rollback --------------------------------------------------------------

DRAFTS_CHECKED: Counter[str] = Counter()


def first_draft_rejected(message: Message) -> str | None:
    """Rejects the run's first draft the first time it is checked; passes every other."""
    DRAFTS_CHECKED[str(message.payload)] += 1
    if DRAFTS_CHECKED.total() == 1:
        return "a first draft is never good enough"
    return None


class Writer(Agent[Orders]):
    """Writes a draft for each order."""

    async def handle(self, message: Message, ctx: Context[Orders]) -> None:
        ctx.state.orders.append(str(message.payload))
        ctx.send("reader", f"draft of {message.payload}", kind="draft")


class Fragile(Filer):
    """Cannot be rolled back: its ``on_rollback`` raises."""

    async def on_rollback(self, rollback: RollbackInfo, ctx: Context[Orders]) -> None:
        raise ValueError("fragile cannot roll back")


def newsroom() -> Cast:
    return Cast(
        [Writer("writer", Orders()), Filer("reader", "fragile"), Fragile("fragile")],
        checks=[("writer", {"kind": "draft", "check": first_draft_rejected})],
    )


async def test_an_on_rollback_that_raises_is_recorded_and_the_run_goes_on(
    mode: Mode, caplog: pytest.LogCaptureFixture
) -> None:
    DRAFTS_CHECKED.clear()
    caplog.set_level(logging.ERROR)
    await mode.start(newsroom)
    mode.send("writer", "a")
    await mode.idle()
    mode.send("writer", "b")  # a later message, after the rollback
    await mode.idle()

    rollbacks = mode.rollbacks
    assert [r.agent for r in rollbacks] == ["writer"], rollbacks
    assert DRAFTS_CHECKED == {"draft of a": 2, "draft of b": 1}
    # The retried draft passed, and the later one too.
    assert agent_state(mode, "reader").orders == ["draft of a", "draft of b"]
    assert agent_state(mode, "fragile").orders == ["draft of a", "draft of b"]
    failures = mode.failures()
    assert len(failures) == 1, f"one failure expected, recorded: {failures!r}"
    failure = failures[0]
    assert isinstance(failure, HandlerFailed), f"recorded as {failure!r}"
    assert failure.agent == "fragile"
    assert isinstance(failure.__cause__, ValueError)
    assert any(
        record.levelno >= logging.ERROR and "fragile" in record.getMessage()
        for record in caplog.records
    ), [record.getMessage() for record in caplog.records]
