"""OpenTelemetry: spans that follow a message across agents, snapshot and rollback spans, metrics.

Every test gives the runtime providers of its own (the SDK's in-memory exporter and metric
reader), so nothing depends on the process-wide providers, which can be set only once; what
the global providers do is checked in subprocesses.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util.types import AttributeValue

import agentsnap.telemetry
from agentsnap import (
    Agent,
    AgentState,
    Context,
    HandlerFailed,
    Message,
    RetryPolicy,
    RollbackExhausted,
    Runtime,
    SnapshotPolicy,
    ToolFailed,
    tool,
)
from agentsnap import semconv as names
from agentsnap.store.sql import SqlStore
from agentsnap.telemetry import NAMES, Telemetry, markdown_table, resolve
from agentsnap.testing import SeededScheduler

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float = 10) -> T:
    """Await ``awaitable``, failing instead of hanging."""
    async with asyncio.timeout(seconds):
        return await awaitable


@dataclass
class Recorded:
    """What the runtime under test recorded."""

    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    telemetry: Telemetry
    tracer: trace.Tracer

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.finished() if span.name == name]

    def one(self, name: str) -> ReadableSpan:
        (span,) = self.named(name)
        return span

    def metrics(self) -> dict[str, list[Any]]:
        data = self.reader.get_metrics_data()
        found: dict[str, list[Any]] = {}
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found[metric.name] = list(metric.data.data_points)
        return found


@pytest.fixture
def otel() -> Iterator[Recorded]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    telemetry = Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)
    yield Recorded(spans, reader, telemetry, tracer_provider.get_tracer("test"))
    tracer_provider.shutdown()
    meter_provider.shutdown()


def parent_of(span: ReadableSpan, spans: Sequence[ReadableSpan]) -> ReadableSpan | None:
    if span.parent is None:
        return None
    found = [s for s in spans if s.context.span_id == span.parent.span_id]
    return found[0] if found else None


def lineage(span: ReadableSpan, spans: Sequence[ReadableSpan]) -> list[str]:
    """Names of ``span`` and its ancestors, nearest first."""
    chain = [span.name]
    current = parent_of(span, spans)
    while current is not None:
        chain.append(current.name)
        current = parent_of(current, spans)
    return chain


def child_of(child: ReadableSpan, parent: ReadableSpan) -> bool:
    return child.parent is not None and child.parent.span_id == parent.context.span_id


def attribute_text(value: AttributeValue | None) -> str:
    """An attribute that holds a name (a channel, an agent): a string."""
    assert isinstance(value, str), value
    return value


# -- agents ------------------------------------------------------------------------------------


class Relay(Agent[AgentState]):
    """Passes each message to the next agent, if it has one."""

    def __init__(self, name: str, to: str | None = None) -> None:
        super().__init__(name)
        self.to = to
        self.handled: list[str] = []

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.handled.append(message.id)
        if self.to is not None:
            ctx.send(self.to, message.payload, kind="relayed")


class Critic(Agent[AgentState]):
    """Rejects ``target``'s work the first ``rejections`` times it is asked for a verdict."""

    def __init__(self, name: str, target: str, rejections: int = 1) -> None:
        super().__init__(name)
        self.target = target
        self.rejections = rejections

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        if self.rejections:
            self.rejections -= 1
            ctx.reject(self.target, "not good enough")


class Failing(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        raise ValueError("bad input")


class Asking(Agent[AgentState]):
    """Asks a person, who never answers: the deadline gives the default."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.state.memory["answer"] = await ctx.ask(
            "ok?", who="ops", deadline=0.02, on_deadline="default", default="yes"
        )


PAID: list[int] = []


@tool(side_effect=True, name="otel_pay")
async def pay(amount: int) -> int:
    PAID.append(amount)
    return len(PAID)


@tool(name="otel_lookup")
def look_up(city: str) -> str:
    if not city:
        raise LookupError("no city")
    return city.upper()


class Cashier(Agent[AgentState]):
    """Pays under the key in the message, then looks the city up."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        order = message.payload_as(dict[str, str])
        await pay(ctx, key=order["key"], amount=5)
        try:
            await look_up(ctx, city=order["city"])
        except ToolFailed:
            self.state.memory["failed"] = True


# -- spans ------------------------------------------------------------------------------------


async def test_handling_a_message_is_a_child_of_the_span_that_sent_it(otel: Recorded) -> None:
    async with Runtime(telemetry=otel.telemetry) as runtime:
        runtime.add(Relay("alice", to="bob"))
        runtime.add(Relay("bob"))
        runtime.send("alice", {"n": 1})
        await within(runtime.run_until_idle())

    spans = otel.finished()
    invoke_alice = otel.one("invoke_agent alice")
    send_bob = otel.one("send bob")
    deliver_bob = otel.one("deliver bob")
    invoke_bob = otel.one("invoke_agent bob")
    # alice's handler sends to bob: bob's handling descends from alice's send, in one trace.
    assert child_of(send_bob, invoke_alice)
    assert child_of(deliver_bob, send_bob)
    assert child_of(invoke_bob, deliver_bob)
    assert lineage(invoke_bob, spans) == [
        "invoke_agent bob",
        "deliver bob",
        "send bob",
        "invoke_agent alice",
        "deliver alice",
        "send alice",
    ]
    assert len({span.context.trace_id for span in spans if "snapshot" not in span.name}) == 1

    assert (send_bob.kind, deliver_bob.kind, invoke_bob.kind) == (
        SpanKind.PRODUCER,
        SpanKind.CONSUMER,
        SpanKind.INTERNAL,
    )
    assert dict(invoke_bob.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "bob",
        "gen_ai.agent.id": "bob",
        "gen_ai.conversation.id": runtime.run_id,
    }
    assert dict(send_bob.attributes or {}) == {
        "messaging.system": "agentsnap",
        "messaging.destination.name": "bob",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.message.id": "alice>bob#1",
        "agentsnap.message.kind": "relayed",
    }
    assert dict(deliver_bob.attributes or {}) == {
        "messaging.system": "agentsnap",
        "messaging.destination.name": "bob",
        "messaging.operation.type": "process",
        "messaging.operation.name": "deliver",
        "messaging.message.id": "alice>bob#1",
        "agentsnap.message.kind": "relayed",
        "gen_ai.conversation.id": runtime.run_id,
    }


async def test_the_trace_context_travels_in_the_message_headers(otel: Recorded) -> None:
    async with Runtime(telemetry=otel.telemetry) as runtime:
        runtime.add(Relay("alice"))
        sent = runtime.send("alice", "hi", headers={"x-user": "ann"})
        await within(runtime.run_until_idle())

    assert sent.headers["x-user"] == "ann"
    version, trace_id, span_id, _flags = sent.headers["traceparent"].split("-")
    send = otel.one("send alice")
    assert version == "00"
    assert int(trace_id, 16) == send.context.trace_id
    assert int(span_id, 16) == send.context.span_id
    with pytest.raises(TypeError):
        sent.headers["traceparent"] = "changed"  # type: ignore[index]


async def test_the_programs_span_is_the_parent_of_the_work_it_sends(otel: Recorded) -> None:
    async with Runtime(telemetry=otel.telemetry) as runtime:
        runtime.add(Relay("alice", to="bob"))
        runtime.add(Relay("bob"))
        with otel.tracer.start_as_current_span("program"):
            runtime.send("alice", 1)
        await within(runtime.run_until_idle())

    assert lineage(otel.one("invoke_agent bob"), otel.finished())[-1] == "program"


async def test_a_deterministic_scheduler_keeps_the_same_lineage(otel: Recorded) -> None:
    # The sequential schedulers deliver in the caller's task, not in one task per agent.
    scheduler = SeededScheduler(3)
    async with Runtime(telemetry=otel.telemetry, scheduler=scheduler) as runtime:
        runtime.add(Relay("alice", to="bob"))
        runtime.add(Relay("bob"))
        for n in range(3):
            runtime.send("alice", n)
        await within(runtime.run_until_idle())

    spans = otel.finished()
    for invoke in otel.named("invoke_agent bob"):
        deliver = parent_of(invoke, spans)
        assert deliver is not None
        send = parent_of(deliver, spans)
        assert send is not None
        assert deliver.attributes is not None
        assert send.attributes is not None
        assert deliver.attributes["messaging.message.id"] == send.attributes["messaging.message.id"]
        assert lineage(invoke, spans)[3] == "invoke_agent alice"


async def test_a_failing_handler_marks_its_spans(otel: Recorded) -> None:
    async with Runtime(telemetry=otel.telemetry) as runtime:
        runtime.add(Failing("broken"))
        runtime.send("broken", None)
        with pytest.raises(HandlerFailed):
            await within(runtime.run_until_idle())

    invoke = otel.one("invoke_agent broken")
    deliver = otel.one("deliver broken")
    for span in (invoke, deliver):
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes is not None
        assert span.attributes["error.type"] == "ValueError"
    assert [event.name for event in invoke.events] == ["exception"]


# -- snapshots and rollbacks -----------------------------------------------------------------------


async def test_a_snapshot_span_holds_its_markers_and_its_size(otel: Recorded) -> None:
    async with Runtime(telemetry=otel.telemetry) as runtime:
        runtime.add(Relay("alice", to="bob"))
        runtime.add(Relay("bob"))
        runtime.send("alice", {"text": "x" * 100})
        handle = runtime.snapshot()
        await within(runtime.run_until_idle())
        snapshot = await within(handle)

    (span,) = [
        s
        for s in otel.named("agentsnap.snapshot")
        if (s.attributes or {}).get("agentsnap.snapshot.id") == snapshot.id
    ]
    attributes = dict(span.attributes or {})
    duration = attributes.pop("agentsnap.snapshot.duration")
    assert isinstance(duration, float)
    assert duration > 0
    in_flight = sum(len(channel.messages) for channel in snapshot.channels)
    assert in_flight == 1  # alice's message to bob crossed the cut
    assert attributes == {
        "agentsnap.snapshot.id": snapshot.id,
        "agentsnap.snapshot.seq": 2,
        "agentsnap.snapshot.initiator": "$env",
        "agentsnap.snapshot.status": "complete",
        "agentsnap.snapshot.agents": 2,
        "agentsnap.snapshot.channels": 3,  # $env>alice, $env>bob, alice>bob
        "agentsnap.snapshot.in_flight_messages": in_flight,
        "agentsnap.snapshot.bytes": attributes["agentsnap.snapshot.bytes"],
        "gen_ai.conversation.id": runtime.run_id,
    }
    assert isinstance(attributes["agentsnap.snapshot.bytes"], int)
    assert attributes["agentsnap.snapshot.bytes"] > 100
    markers = [
        attribute_text((event.attributes or {})["agentsnap.channel"])
        for event in span.events
        if event.name == "agentsnap.snapshot.marker"
    ]
    recorded = [
        attribute_text((event.attributes or {})["agentsnap.process"])
        for event in span.events
        if event.name == "agentsnap.snapshot.recorded"
    ]
    assert sorted(markers) == ["$env>alice", "$env>bob", "alice>bob"]
    assert sorted(recorded) == ["$env", "alice", "bob"]
    assert recorded[0] == "$env"  # the environment records as the snapshot starts
    # The message in flight keeps its trace context in the cut.
    (channel,) = snapshot.channels
    assert "traceparent" in channel.messages[0].headers


async def test_a_failed_snapshot_span_says_why(otel: Recorded) -> None:
    runtime = Runtime(telemetry=otel.telemetry)
    async with runtime:
        runtime.add(Relay("alice"))
        runtime.add(Relay("bob"))
        handle = runtime.snapshot(initiator="alice")
        # alice has not recorded yet when the runtime closes.
    with pytest.raises(Exception, match="closed"):
        await within(handle)

    (span,) = [
        s
        for s in otel.named("agentsnap.snapshot")
        if (s.attributes or {}).get("agentsnap.snapshot.id") == handle.id
    ]
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description is not None
    assert "closed" in span.status.description
    assert (span.attributes or {})["agentsnap.snapshot.status"] == "failed"


async def rejected_run(otel: Recorded) -> tuple[Runtime, str, Relay]:
    """alice's message to bob is in flight at a snapshot; then a critic rejects bob's work.

    No snapshot is taken as the run goes idle, so the rollback goes back to that one.
    """
    runtime = Runtime(telemetry=otel.telemetry, snapshot_policy=SnapshotPolicy(at_end=False))
    async with runtime:
        runtime.add(Relay("alice", to="bob"))
        bob = Relay("bob")
        runtime.add(bob)
        runtime.add(Critic("critic", target="bob"))
        runtime.send("alice", "work")
        handle = runtime.snapshot()
        await within(runtime.run_until_idle())
        snapshot = await within(handle)
        assert [m.id for c in snapshot.channels for m in c.messages] == ["alice>bob#1"]
        runtime.send("critic", "verdict")
        await within(runtime.run_until_idle())
    return runtime, snapshot.id, bob


async def test_messages_put_back_by_a_rollback_keep_their_links(otel: Recorded) -> None:
    runtime, _, bob = await rejected_run(otel)

    assert bob.handled == ["alice>bob#1", "alice>bob#1"]  # delivered again after the rollback
    spans = otel.finished()
    (send,) = [
        s
        for s in otel.named("send bob")
        if (s.attributes or {})["messaging.message.id"] == "alice>bob#1"
    ]
    deliveries = otel.named("deliver bob")
    assert len(deliveries) == 2
    for deliver in deliveries:
        assert child_of(deliver, send)
        assert deliver.context.trace_id == send.context.trace_id
    # The input replayed after the rollback hangs off its original send span too.
    (send_verdict,) = otel.named("send critic")
    verdicts = otel.named("deliver critic")
    assert len(verdicts) == 2
    assert all(child_of(deliver, send_verdict) for deliver in verdicts)
    assert lineage(deliveries[1], spans)[-1] == "send alice"
    assert runtime.rollbacks[0].discarded == 0


async def test_a_resumed_run_delivers_its_cut_under_the_original_send(
    otel: Recorded, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    store = SqlStore(url)
    async with Runtime(store=store, telemetry=otel.telemetry) as first:
        first.add(Relay("alice", to="bob"))
        first.add(Relay("bob"))
        first.send("alice", "work")
        handle = first.snapshot()
        await within(first.run_until_idle())
        snapshot = await within(handle)
    await store.close()
    assert [m.id for c in snapshot.channels for m in c.messages] == ["alice>bob#1"]

    store = SqlStore(url)  # as a new process would: the cut comes back from the database
    async with Runtime(store=store, telemetry=otel.telemetry) as second:
        second.add(Relay("alice", to="bob"))
        bob = second.add(Relay("bob"))
        await within(second.fork_from(snapshot.id))
        await within(second.run_until_idle())
    await store.close()

    assert isinstance(bob, Relay)
    assert bob.handled == ["alice>bob#1"]
    (send,) = otel.named("send bob")
    deliveries = otel.named("deliver bob")
    assert len(deliveries) == 2
    assert all(child_of(deliver, send) for deliver in deliveries)


async def test_a_rollback_span_is_a_child_of_the_rejection(otel: Recorded) -> None:
    runtime, snapshot_id, _ = await rejected_run(otel)

    (info,) = runtime.rollbacks
    rollback = otel.one("agentsnap.rollback")
    assert dict(rollback.attributes or {}) == {
        "gen_ai.conversation.id": runtime.run_id,
        "agentsnap.rollback.id": info.id,
        "agentsnap.rollback.reason": "not good enough",
        "agentsnap.rollback.agent": "bob",
        "agentsnap.rollback.source": "critic",
        "agentsnap.rollback.attempt": 1,
        "agentsnap.rollback.snapshot.id": snapshot_id,
        "agentsnap.rollback.messages_discarded": 0,
        "agentsnap.rollback.outcome": "rolled_back",
    }
    rejecting = [s for s in otel.named("invoke_agent critic") if s.events]
    (critic,) = rejecting
    assert child_of(rollback, critic)
    (event,) = critic.events
    assert event.name == "agentsnap.output_rejected"
    assert dict(event.attributes or {}) == {
        "agentsnap.rollback.agent": "bob",
        "agentsnap.rollback.reason": "not good enough",
        "agentsnap.rollback.source": "critic",
    }
    assert critic.status.status_code is StatusCode.UNSET  # a signal, not a failure
    # The rollback links to the span of the snapshot it restored.
    (snapshot_span,) = [
        s
        for s in otel.named("agentsnap.snapshot")
        if (s.attributes or {})["agentsnap.snapshot.id"] == snapshot_id
    ]
    assert [link.context.span_id for link in rollback.links] == [snapshot_span.context.span_id]


async def test_a_rollback_on_request_is_traced_where_it_was_asked(otel: Recorded) -> None:
    async with Runtime(telemetry=otel.telemetry) as runtime:
        runtime.add(Relay("alice"))
        runtime.send("alice", 1)
        await within(runtime.run_until_idle())
        with otel.tracer.start_as_current_span("operator") as operator:
            await within(runtime.rollback(reason="undo"))

    rollback = otel.one("agentsnap.rollback")
    assert rollback.parent is not None
    assert rollback.parent.span_id == operator.get_span_context().span_id
    attributes = rollback.attributes or {}
    assert attributes["agentsnap.rollback.source"] == "manual"
    assert attributes["agentsnap.rollback.reason"] == "undo"
    assert "agentsnap.rollback.agent" not in attributes


async def test_a_rollback_the_retry_policy_refuses_is_an_error(otel: Recorded) -> None:
    async with Runtime(telemetry=otel.telemetry, retry=RetryPolicy.attempts(1)) as runtime:
        runtime.add(Relay("bob"))
        runtime.add(Critic("critic", target="bob"))
        runtime.send("critic", "verdict")
        with pytest.raises(RollbackExhausted):
            await within(runtime.run_until_idle())

    rollback = otel.one("agentsnap.rollback")
    assert rollback.status.status_code is StatusCode.ERROR
    assert (rollback.attributes or {})["agentsnap.rollback.outcome"] == "exhausted"
    assert "agentsnap.rollbacks" not in otel.metrics()


async def test_tool_calls_are_spans_of_the_handler_and_deduplication_is_counted(
    otel: Recorded,
) -> None:
    PAID.clear()
    async with Runtime(telemetry=otel.telemetry) as runtime:
        runtime.add(Cashier("cashier"))
        runtime.send("cashier", {"key": "order-1", "city": "lyon"})
        runtime.send("cashier", {"key": "order-1", "city": ""})  # the same payment again
        await within(runtime.run_until_idle())
    assert PAID == [5]  # the second call was answered from the ledger

    payments = otel.named("execute_tool otel_pay")
    lookups = otel.named("execute_tool otel_lookup")
    assert len(payments) == 2
    assert len(lookups) == 2
    invokes = otel.named("invoke_agent cashier")
    for first, handler in zip(payments, invokes, strict=True):
        assert child_of(first, handler)
    assert [dict(span.attributes or {}) for span in payments] == [
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "otel_pay",
            "gen_ai.tool.call.id": "order-1",
            "agentsnap.tool.side_effect": True,
            "agentsnap.tool.deduplicated": deduplicated,
            "gen_ai.conversation.id": runtime.run_id,
            "gen_ai.agent.name": "cashier",
        }
        for deduplicated in (False, True)
    ]
    ok, failed = lookups
    assert "gen_ai.tool.call.id" not in (ok.attributes or {})
    assert ok.status.status_code is StatusCode.UNSET
    assert failed.status.status_code is StatusCode.ERROR
    assert (failed.attributes or {})["error.type"] == "LookupError"

    found = otel.metrics()
    calls = {
        (p.attributes["gen_ai.tool.name"], p.attributes["agentsnap.tool.deduplicated"]): p.value
        for p in found["agentsnap.tool.calls"]
        if "error.type" not in p.attributes
    }
    assert calls == {("otel_pay", False): 1, ("otel_pay", True): 1, ("otel_lookup", False): 1}
    (errors,) = [p for p in found["agentsnap.tool.calls"] if "error.type" in p.attributes]
    assert (errors.attributes["error.type"], errors.value) == ("LookupError", 1)
    (deduplicated,) = found["agentsnap.tool.deduplicated_calls"]
    assert (deduplicated.attributes, deduplicated.value) == ({"gen_ai.tool.name": "otel_pay"}, 1)


# -- metrics --------------------------------------------------------------------------------------


async def test_snapshot_and_rollback_metrics_are_recorded(otel: Recorded) -> None:
    runtime, _, _ = await rejected_run(otel)

    found = otel.metrics()
    snapshots = list(otel.named("agentsnap.snapshot"))
    complete = [
        s for s in snapshots if (s.attributes or {})["agentsnap.snapshot.status"] == "complete"
    ]
    (durations,) = [
        point
        for point in found["agentsnap.snapshot.duration"]
        if point.attributes == {"agentsnap.snapshot.status": "complete"}
    ]
    assert durations.count == len(complete)
    (sizes,) = found["agentsnap.snapshot.size"]
    assert sizes.count == len(complete)
    assert sizes.sum == sum((s.attributes or {})["agentsnap.snapshot.bytes"] for s in complete)  # type: ignore[misc]
    (in_flight,) = found["agentsnap.snapshot.in_flight_messages"]
    assert in_flight.count == len(complete)
    assert in_flight.sum == sum(
        (s.attributes or {})["agentsnap.snapshot.in_flight_messages"]  # type: ignore[misc]
        for s in complete
    )
    counted = {
        point.attributes["agentsnap.snapshot.status"]: point.value
        for point in found["agentsnap.snapshots"]
    }
    assert counted["complete"] == len(complete)
    assert counted.get("failed", 0) == len(snapshots) - len(complete)
    (rollbacks,) = found["agentsnap.rollbacks"]
    assert (rollbacks.attributes, rollbacks.value) == ({"agentsnap.rollback.source": "critic"}, 1)
    assert len(runtime.rollbacks) == 1


async def test_queue_depth_is_observed_per_receiving_agent(otel: Recorded) -> None:
    async with Runtime(telemetry=otel.telemetry) as runtime:
        runtime.add(Relay("alice"))
        runtime.add(Relay("bob"))
        for n in range(3):
            runtime.send("alice", n)
        runtime.send("bob", 0)
        # Nothing has been delivered yet: no await since the sends.
        queued = {p.attributes["messaging.destination.name"]: p.value for p in _depth(otel)}
        assert queued == {"alice": 3, "bob": 1}
        await within(runtime.run_until_idle())
        drained = {p.attributes["messaging.destination.name"]: p.value for p in _depth(otel)}
        assert drained == {"alice": 0, "bob": 0}
    # A closed runtime is no longer observed.
    assert _depth(otel) == []


def _depth(otel: Recorded) -> list[Any]:
    return otel.metrics().get("agentsnap.bus.queue_depth", [])


# -- nothing without an SDK ---------------------------------------------------------------------


async def test_without_an_sdk_nothing_is_recorded_and_headers_stay_empty() -> None:
    # This process never installs a global SDK: the API's proxy providers are in place.
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert resolve(None) is None
    async with Runtime() as runtime:
        runtime.add(Relay("alice", to="bob"))
        bob = runtime.add(Relay("bob"))
        sent = runtime.send("alice", 1)
        await within(runtime.run_until_idle())
        assert runtime.telemetry is None
    assert dict(sent.headers) == {}
    assert isinstance(bob, Relay)
    assert bob.handled == ["alice>bob#1"]


async def test_tracing_forced_through_the_api_alone_adds_no_headers() -> None:
    async with Runtime(telemetry=True) as runtime:
        runtime.add(Relay("alice"))
        sent = runtime.send("alice", 1)
        await within(runtime.run_until_idle())
        assert runtime.telemetry is not None
        assert runtime.telemetry.tracing
    assert dict(sent.headers) == {}


async def test_telemetry_false_records_nothing_even_with_providers(otel: Recorded) -> None:
    async with Runtime(telemetry=False) as runtime:
        runtime.add(Relay("alice"))
        sent = runtime.send("alice", 1)
        await within(runtime.run_until_idle())
    assert dict(sent.headers) == {}
    assert otel.finished() == []


def test_a_bad_telemetry_option_is_refused() -> None:
    with pytest.raises(Exception, match="telemetry= takes"):
        Runtime(telemetry="yes")  # type: ignore[arg-type]


GLOBAL_SDK = """
import asyncio, os
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from agentsnap import Agent, AgentState, Runtime

class Echo(Agent[AgentState]):
    async def handle(self, message, ctx):
        pass

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

async def main():
    async with Runtime() as runtime:
        runtime.add(Echo("echo"))
        sent = runtime.send("echo", 1)
        await runtime.run_until_idle()
    print(sorted({s.name for s in exporter.get_finished_spans()}), "traceparent" in sent.headers)

asyncio.run(main())
"""


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, "['agentsnap.snapshot', 'deliver echo', 'invoke_agent echo', 'send echo'] True"),
        ({"OTEL_SDK_DISABLED": "true"}, "[] False"),
    ],
    ids=["sdk", "sdk-disabled"],
)
def test_a_global_sdk_is_picked_up(
    environment: dict[str, str], expected: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", GLOBAL_SDK],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**_environment(), **environment},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected


def _environment() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


# -- the names -------------------------------------------------------------------------------------


def test_names_are_unique_and_every_constant_is_in_the_table() -> None:
    keys = [(entry.kind, entry.name) for entry in NAMES]
    assert len(keys) == len(set(keys))
    declared = [key for key in names.__annotations__ if key.isupper()]
    constants = {getattr(names, key) for key in declared if key not in {"NAMES", "SCOPE"}}
    constants = {value for value in constants if isinstance(value, str)}
    assert constants == {entry.name for entry in NAMES}


async def test_everything_recorded_is_named_in_the_table(otel: Recorded) -> None:
    await rejected_run(otel)
    async with Runtime(telemetry=otel.telemetry) as runtime:
        runtime.add(Failing("broken"))
        runtime.add(Cashier("cashier"))
        runtime.add(Asking("asking"))
        runtime.send("broken", None)
        runtime.send("cashier", {"key": "names-1", "city": ""})
        runtime.send("asking", None)
        await within(runtime.run_until_idle(raise_failures=False))

    spans = {e.name for e in NAMES if e.kind == "span"}
    attributes = {e.name for e in NAMES if e.kind == "attribute"}
    events = {e.name for e in NAMES if e.kind == "event"} | {"exception"}  # the SDK's own
    metrics = {e.name for e in NAMES if e.kind == "metric"}
    seen_spans: set[str] = set()
    for span in otel.finished():
        entry = next(e for e in NAMES if e.kind == "span" and span.name.startswith(e.name))
        seen_spans.add(entry.name)
        if entry.suffix:
            assert (
                span.name == f"{entry.name} {attribute_text((span.attributes or {})[entry.suffix])}"
            )
        assert set(span.attributes or {}) <= attributes, span.name
        for event in span.events:
            assert event.name in events
            if event.name != "exception":
                assert set(event.attributes or {}) <= attributes
    assert seen_spans == spans
    for name, points in otel.metrics().items():
        assert name in metrics
        for point in points:
            assert set(point.attributes) <= attributes


async def test_asking_a_person_is_two_spans_with_the_wait_between(otel: Recorded) -> None:
    async with Runtime(telemetry=otel.telemetry) as runtime:
        runtime.add(Asking("asking"))
        runtime.send("asking", None)
        await within(runtime.run_until_idle())
    asked = otel.one("agentsnap.request question")
    answered = otel.one("agentsnap.answer question")
    invoke = otel.one("invoke_agent asking")
    for span in (asked, answered):
        assert span.parent is not None
        assert span.parent.span_id == invoke.context.span_id
        assert span.status.status_code is StatusCode.UNSET  # a deadline is not an error
    assert asked.attributes is not None
    assert answered.attributes is not None
    assert asked.attributes["agentsnap.request.who"] == "ops"
    assert asked.attributes["agentsnap.request.status"] == "pending"
    assert answered.attributes["agentsnap.request.status"] == "expired"
    assert answered.attributes["agentsnap.request.id"] == asked.attributes["agentsnap.request.id"]
    assert float(answered.attributes["agentsnap.request.waited"]) >= 0.01  # type: ignore[arg-type]
    assert asked.end_time is not None
    assert answered.start_time is not None
    assert answered.start_time > asked.end_time  # the wait is the gap between them
    (pending,) = otel.metrics()["agentsnap.requests.pending"]
    assert pending.value == 0  # up while it waited, down once it got the outcome
    assert pending.attributes == {"agentsnap.request.kind": "question"}


def test_the_documentation_lists_the_names() -> None:
    page = (ROOT / "docs" / "concepts" / "observability.md").read_text()
    match = re.search(r"<!-- names -->\n(.*?)<!-- /names -->", page, re.S)
    assert match is not None, "docs/concepts/observability.md lost its names table markers"
    assert match.group(1) == markdown_table(), (
        "the names table in docs/concepts/observability.md is out of date; paste the output of "
        "python -c 'from agentsnap.semconv import markdown_table; print(markdown_table())'"
    )


# -- the command line ------------------------------------------------------------------------------


def _agentsnap(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", "from agentsnap.cli import main; main()", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**_environment(), **env},
    )


def test_the_demo_prints_its_spans_with_trace_console(tmp_path: Path) -> None:
    done = _agentsnap(
        "demo", "--trace", "console", "--db", f"sqlite:///{tmp_path}/demo.db", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    decoder = json.JSONDecoder()
    documents: list[Any] = []
    text = done.stdout
    index = 0
    while True:
        start = text.find("{", index)
        if start < 0:
            break
        document, index = decoder.raw_decode(text, start)
        documents.append(document)
    spans = [d for d in documents if "context" in d and "name" in d]
    names_seen = {span["name"] for span in spans}
    assert {"invoke_agent planner", "send writer", "agentsnap.rollback"} <= names_seen
    resources = {span["resource"]["attributes"]["service.name"] for span in spans}
    assert resources == {"agentsnap"}
    metric_documents = [d for d in documents if "resource_metrics" in d]
    assert metric_documents, "no metrics were printed"
    assert "rolled back" in text or "rollback" in text


def test_the_service_name_comes_from_the_environment(tmp_path: Path) -> None:
    done = _agentsnap(
        "demo",
        "--trace",
        "console",
        "--db",
        f"sqlite:///{tmp_path}/demo.db",
        cwd=tmp_path,
        OTEL_SERVICE_NAME="research-team",
    )
    assert done.returncode == 0, done.stderr
    assert '"service.name": "research-team"' in done.stdout


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.skipif(
    _installed("opentelemetry.exporter.otlp.proto.http"), reason="the OTLP exporter is installed"
)
def test_trace_otlp_without_the_exporter_names_the_package(tmp_path: Path) -> None:
    done = _agentsnap(
        "demo", "--trace", "otlp", "--db", f"sqlite:///{tmp_path}/demo.db", cwd=tmp_path
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "Error: --trace otlp needs the OTLP exporter: pip install opentelemetry-exporter-otlp"
    ]
    assert not (tmp_path / "demo.db").exists()


def test_the_module_example_runs(tmp_path: Path) -> None:
    doc = agentsnap.telemetry.__doc__ or ""
    (code,) = re.findall(r"```python\n(.*?)```", doc, re.S)
    script = tmp_path / "example.py"
    script.write_text(textwrap.dedent(code))
    done = subprocess.run(
        [sys.executable, "-W", "error", str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=_environment(),
    )
    assert done.returncode == 0, done.stderr
    # Two snapshots: at the first input, and as the run went idle.
    assert done.stdout.strip() == (
        "['agentsnap.snapshot', 'agentsnap.snapshot', 'deliver echo', 'invoke_agent echo', "
        "'send echo']"
    )
