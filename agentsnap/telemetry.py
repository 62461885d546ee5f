"""OpenTelemetry traces and metrics: a run's trace reads like its space-time diagram.

agentsnap uses only the OpenTelemetry API. Nothing is recorded or exported unless the
application installs an SDK (``pip install 'agentsnap[otel]'``, then a ``TracerProvider``
and/or a ``MeterProvider`` with exporters), and the SDK honours the standard ``OTEL_*``
environment variables. Whether a runtime traces is decided once, when it is created: with no
SDK configured, each send and each delivery pays one ``None`` check and message headers stay
empty.

With tracing on, each message carries the W3C trace context (``traceparent``, ``tracestate``,
or whatever propagators the application configured) in its headers, so that an agent's
handling of a message is a child of the span that sent it, across agents:

```
invoke_agent planner ── send researcher ── deliver researcher ── invoke_agent researcher ─ ...
```

Messages put back on their channels by a rollback keep their headers, so their new
deliveries hang off the same send spans. Snapshots and rollbacks get spans of their own, and
metrics follow Flink's checkpoint metrics. Every span, attribute, event and metric name is
defined once, in [`NAMES`][agentsnap.semconv.NAMES] (in
[`agentsnap.semconv`][agentsnap.semconv], and re-exported here with ``Name`` and
``markdown_table``); the documentation's table is generated from it
([`markdown_table`][agentsnap.semconv.markdown_table]).

Example:
    ```python
    import asyncio

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agentsnap import Agent, AgentState, Context, Message, Runtime
    from agentsnap.telemetry import Telemetry

    class Echo(Agent[AgentState]):
        async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
            pass

    async def main() -> None:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        async with Runtime(telemetry=Telemetry(tracer_provider=provider)) as runtime:
            runtime.add(Echo("echo"))
            runtime.send("echo", "hello")
            await runtime.run_until_idle()
        print(sorted(span.name for span in exporter.get_finished_spans()))

    asyncio.run(main())
    ```
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import MappingProxyType
from typing import IO, TYPE_CHECKING, Final, Literal, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import NonRecordingSpan, SpanKind, Status, StatusCode

from agentsnap.bus import BusObserver
from agentsnap.exceptions import ConfigurationError, OutputRejected, ToolFailed
from agentsnap.messages import EMPTY_HEADERS, ENVIRONMENT
from agentsnap.semconv import (
    AGENT_ID,
    AGENT_NAME,
    CHANNEL,
    CONVERSATION_ID,
    DESTINATION_NAME,
    ERROR_TYPE,
    EVENT_MARKER,
    EVENT_RECORDED,
    EVENT_REJECTED,
    MESSAGE_ID,
    MESSAGE_KIND,
    MESSAGING_OPERATION_NAME,
    MESSAGING_SYSTEM,
    METRIC_DEDUPLICATED,
    METRIC_IN_FLIGHT,
    METRIC_PENDING_REQUESTS,
    METRIC_QUEUE_DEPTH,
    METRIC_ROLLBACKS,
    METRIC_SNAPSHOT_DURATION,
    METRIC_SNAPSHOT_SIZE,
    METRIC_SNAPSHOTS,
    METRIC_TOOL_CALLS,
    NAMES,
    OPERATION_NAME,
    OPERATION_TYPE,
    PROCESS,
    REQUEST_ID,
    REQUEST_KIND,
    REQUEST_REPLAYED,
    REQUEST_STATUS,
    REQUEST_WAITED,
    REQUEST_WHO,
    ROLLBACK_AGENT,
    ROLLBACK_ATTEMPT,
    ROLLBACK_DISCARDED,
    ROLLBACK_ID,
    ROLLBACK_OUTCOME,
    ROLLBACK_REASON,
    ROLLBACK_SNAPSHOT,
    ROLLBACK_SOURCE,
    SCOPE,
    SNAPSHOT_AGENTS,
    SNAPSHOT_BYTES,
    SNAPSHOT_CHANNELS,
    SNAPSHOT_DURATION,
    SNAPSHOT_ID,
    SNAPSHOT_IN_FLIGHT,
    SNAPSHOT_INITIATOR,
    SNAPSHOT_SEQ,
    SNAPSHOT_STATUS,
    SPAN_ANSWER,
    SPAN_DELIVER,
    SPAN_EXECUTE_TOOL,
    SPAN_INVOKE_AGENT,
    SPAN_REQUEST,
    SPAN_ROLLBACK,
    SPAN_SEND,
    SPAN_SNAPSHOT,
    TOOL_CALL_ID,
    TOOL_DEDUPLICATED,
    TOOL_NAME,
    TOOL_SIDE_EFFECT,
    Name,
    markdown_table,
)

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context as OtelContext
    from opentelemetry.sdk.metrics.export import MetricExporter
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, SpanContext
    from opentelemetry.util.types import AttributeValue

    from agentsnap.bus import Bus, Channel
    from agentsnap.handles import SnapshotHandle
    from agentsnap.messages import Message
    from agentsnap.records import RollbackInfo, Snapshot

__all__ = [
    "NAMES",
    "Name",
    "Telemetry",
    "ToolCallSpan",
    "install_sdk",
    "markdown_table",
    "resolve",
    "tool_call",
]


# Bucket boundaries in seconds for snapshot durations (the SDK's default ones suit
# milliseconds).
_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_SIZE_BUCKETS = tuple(float(2**k) for k in range(10, 31, 2))  # 1 KiB .. 1 GiB
_COUNT_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)

_Info = TypeVar("_Info", bound="RollbackInfo | None")
_ROOT = otel_context.Context()
_RECENT_SNAPSHOTS = 128  # span contexts kept so that rollback spans can link to them


def _version() -> str:
    try:
        return importlib.metadata.version("agentsnap")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a source checkout
        return "0"


def _tracer_is_sdk(tracer: trace.Tracer) -> bool:
    # The API's own tracers record nothing: the proxy (no SDK installed yet) and the no-op
    # one (also what an SDK returns when OTEL_SDK_DISABLED is set).
    return not isinstance(tracer, trace.ProxyTracer | trace.NoOpTracer)


def _meter_is_sdk(meter: metrics.Meter) -> bool:
    # Same for meters; the API's proxy meter class is private, so it is told by its module.
    return not (
        isinstance(meter, metrics.NoOpMeter)
        or type(meter).__module__.startswith("opentelemetry.metrics")
    )


# -- the recorder ----------------------------------------------------------------------------


class Telemetry(BusObserver):
    """Where a runtime's spans and metrics go: a tracer and a meter, and what to record.

    Give one to [`Runtime`][agentsnap.Runtime] (``Runtime(telemetry=...)``) to use providers
    of your own, as tests do; by default a runtime uses the global providers when an SDK is
    installed there, and records nothing otherwise (see [`resolve`][agentsnap.telemetry.resolve]).

    Args:
        tracer_provider: Makes the spans (default: the global one).
        meter_provider: Makes the metrics (default: the global one).
        tracing: Make spans and put the trace context in message headers. By default, when
            the tracer comes from an SDK (not the API's no-op or proxy tracer).

    Attributes:
        tracer: The tracer.
        meter: The meter.
        tracing: Whether spans are made and the trace context travels in message headers.
        measuring: Whether the meter comes from an SDK.
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        tracing: bool | None = None,
    ) -> None:
        version = _version()
        self.tracer = trace.get_tracer(SCOPE, version, tracer_provider=tracer_provider)
        self.meter = metrics.get_meter(SCOPE, version, meter_provider=meter_provider)
        self.tracing = _tracer_is_sdk(self.tracer) if tracing is None else tracing
        self.measuring = _meter_is_sdk(self.meter)
        self._open: dict[str, tuple[Span, float]] = {}
        self._recent: dict[str, SpanContext] = {}
        self._rejections: dict[int, SpanContext] = {}
        self._buses: weakref.WeakSet[Bus] = weakref.WeakSet()
        meter = self.meter
        histogram, counter = meter.create_histogram, meter.create_counter
        self._snapshot_duration = histogram(
            *_metric_names(METRIC_SNAPSHOT_DURATION),
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self._snapshot_size = histogram(
            *_metric_names(METRIC_SNAPSHOT_SIZE), explicit_bucket_boundaries_advisory=_SIZE_BUCKETS
        )
        self._in_flight = histogram(
            *_metric_names(METRIC_IN_FLIGHT), explicit_bucket_boundaries_advisory=_COUNT_BUCKETS
        )
        self._snapshots = counter(*_metric_names(METRIC_SNAPSHOTS))
        self._rollbacks = counter(*_metric_names(METRIC_ROLLBACKS))
        self._tool_calls = counter(*_metric_names(METRIC_TOOL_CALLS))
        self._deduplicated = counter(*_metric_names(METRIC_DEDUPLICATED))
        self._pending_requests = meter.create_up_down_counter(
            *_metric_names(METRIC_PENDING_REQUESTS)
        )
        name, unit, description = _metric_names(METRIC_QUEUE_DEPTH)
        meter.create_observable_gauge(
            name, [self._observe_queues], unit=unit, description=description
        )

    @property
    def live(self) -> bool:
        """Whether anything is recorded at all (spans, or metrics)."""
        return self.tracing or self.measuring

    def __repr__(self) -> str:
        return f"<Telemetry tracing={self.tracing} measuring={self.measuring}>"

    # -- the bus ----------------------------------------------------------------------------

    def watch(self, bus: Bus) -> None:
        """Report ``bus``'s queue depth until [`unwatch`][agentsnap.telemetry.Telemetry.unwatch]."""
        self._buses.add(bus)

    def unwatch(self, bus: Bus) -> None:
        """Stop reporting ``bus``'s queue depth."""
        self._buses.discard(bus)

    def _observe_queues(self, options: CallbackOptions) -> Iterable[Observation]:
        # Runs on the metric reader's thread: copy before iterating (a copy of a dict's
        # values is made under the GIL), and give up this round if a set changed meanwhile.
        depth: dict[str, int] = {}
        try:
            for bus in list(self._buses):
                for channel in list(bus.channels.values()):
                    depth[channel.dst] = depth.get(channel.dst, 0) + len(channel)
        except RuntimeError:
            return []
        return [Observation(count, {DESTINATION_NAME: dst}) for dst, count in depth.items()]

    def sent(
        self, src: str, dst: str, seq: int, kind: str, headers: Mapping[str, str]
    ) -> Mapping[str, str]:
        """A message is being sent: make its send span; return its headers with the context."""
        span = self.tracer.start_span(
            f"{SPAN_SEND} {dst}",
            kind=SpanKind.PRODUCER,
            attributes=_messaging(dst, "send", "send", f"{src}>{dst}#{seq}", kind),
        )
        carrier = dict(headers)
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        span.end()
        return MappingProxyType(carrier) if carrier else EMPTY_HEADERS

    def on_send(self, channel: Channel, message: Message) -> Message:
        """As a bus observer (when tracing): the message's send span and trace context.

        The runtime opens the spans of deliveries and handlers itself.
        """
        headers = self.sent(message.src, message.dst, message.seq, message.kind, message.headers)
        return message._replace(headers=headers)

    def handling(self, run_id: str, agent: str, message: Message) -> Handling:
        """Spans around ``agent`` handling ``message``: ``deliver``, and ``invoke_agent`` in it.

        Use it as a context manager around the handler; the handler runs in the
        ``invoke_agent`` span's context, so what it sends and the tools it calls are its
        children.
        """
        return Handling(self, run_id, agent, message)

    # -- snapshots --------------------------------------------------------------------------

    def snapshot_started(self, handle: SnapshotHandle, run_id: str) -> None:
        """A snapshot started (in the current context)."""
        span = self.tracer.start_span(
            SPAN_SNAPSHOT,
            attributes={
                SNAPSHOT_ID: handle.id,
                SNAPSHOT_SEQ: handle.seq,
                SNAPSHOT_INITIATOR: handle.initiator,
                CONVERSATION_ID: run_id,
            },
        )
        self._open[handle.id] = (span, time.perf_counter())

    def snapshot_marker(self, snapshot_id: str, src: str, dst: str) -> None:
        """A marker of the snapshot was taken off the channel ``src -> dst``."""
        found = self._open.get(snapshot_id)
        if found is not None:
            found[0].add_event(EVENT_MARKER, {CHANNEL: f"{src}>{dst}"})

    def snapshot_recorded(self, snapshot_id: str, process: str) -> None:
        """``process`` recorded its state for the snapshot."""
        found = self._open.get(snapshot_id)
        if found is not None:
            found[0].add_event(EVENT_RECORDED, {PROCESS: process})

    async def snapshot_written(
        self, snapshot: Snapshot, handle: SnapshotHandle, write: Awaitable[None]
    ) -> None:
        """Await ``write`` (which resolves ``handle``), then end the span and record metrics."""
        try:
            await write
        finally:
            self._snapshot_done(snapshot, handle)

    def _snapshot_done(self, snapshot: Snapshot, handle: SnapshotHandle) -> None:
        found = self._open.pop(snapshot.id, None)
        if found is None:
            return
        span, started = found
        duration = time.perf_counter() - started
        error: str | None = None
        if not handle.done():
            error = "not written"
        else:
            try:
                handle.result()
            except Exception as exc:  # SnapshotFailed: the protocol or the store failed it
                error = str(exc)
        status = "failed" if error is not None else "complete"
        attributes: dict[str, AttributeValue] = {
            SNAPSHOT_STATUS: status,
            SNAPSHOT_DURATION: duration,
        }
        if error is None:
            agents = [name for name in snapshot.agents if name != ENVIRONMENT]
            in_flight = sum(len(record.messages) for record in snapshot.channels)
            size = sum(len(cut.state_json.encode()) for cut in snapshot.agents.values()) + sum(
                len(message.model_dump_json().encode())
                for record in snapshot.channels
                for message in record.messages
            )
            attributes[SNAPSHOT_AGENTS] = len(agents)
            attributes[SNAPSHOT_CHANNELS] = sum(len(cut.sent) for cut in snapshot.agents.values())
            attributes[SNAPSHOT_IN_FLIGHT] = in_flight
            attributes[SNAPSHOT_BYTES] = size
            self._snapshot_size.record(size)
            self._in_flight.record(in_flight)
            self._recent[snapshot.id] = span.get_span_context()
            while len(self._recent) > _RECENT_SNAPSHOTS:
                del self._recent[next(iter(self._recent))]
        span.set_attributes(attributes)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()
        self._snapshot_duration.record(duration, {SNAPSHOT_STATUS: status})
        self._snapshots.add(1, {SNAPSHOT_STATUS: status})

    # -- rollbacks --------------------------------------------------------------------------

    def rejected(self, rejection: OutputRejected, span: SpanContext) -> None:
        """``rejection`` was raised in the handler whose span is ``span``."""
        self._rejections[id(rejection)] = span

    async def rolling_back(
        self,
        work: Awaitable[_Info],
        run_id: str,
        *,
        rejection: OutputRejected | None = None,
        reason: str = "",
        redact: Callable[[str], str] | None = None,
    ) -> _Info:
        """Await the rollback ``work`` inside an ``agentsnap.rollback`` span.

        Args:
            work: The rollback; ``None`` as its result means the retry policy gave up.
            run_id: The run.
            rejection: The rejected output it answers (a child of the handler that rejected
                it), or ``None`` for a rollback on request (in the current context).
            reason: The reason of a rollback on request.
            redact: Applied to the reason before it is an attribute (the run's redaction
                patterns; see [`agentsnap.redaction`][agentsnap.redaction]).
        """
        parent: otel_context.Context | None = None
        attributes: dict[str, AttributeValue] = {CONVERSATION_ID: run_id}
        if rejection is not None:
            found = self._rejections.pop(id(rejection), None)
            if found is not None:
                parent = trace.set_span_in_context(NonRecordingSpan(found))
            reason = rejection.reason
            attributes[ROLLBACK_AGENT] = rejection.agent
            attributes[ROLLBACK_SOURCE] = rejection.source
        else:
            attributes[ROLLBACK_SOURCE] = "manual"
        attributes[ROLLBACK_REASON] = reason if redact is None else redact(reason)
        span = self.tracer.start_span(SPAN_ROLLBACK, context=parent, attributes=attributes)
        try:
            with trace.use_span(span, record_exception=True, set_status_on_exception=True):
                info = await work
            if info is None:
                span.set_attribute(ROLLBACK_OUTCOME, "exhausted")
                span.set_status(Status(StatusCode.ERROR, "the retry policy gave up"))
                return info
            span.set_attributes(
                {
                    ROLLBACK_OUTCOME: "rolled_back",
                    ROLLBACK_ID: info.id,
                    ROLLBACK_SNAPSHOT: info.snapshot_id,
                    ROLLBACK_ATTEMPT: info.attempt,
                    ROLLBACK_DISCARDED: info.discarded,
                }
            )
            restored = self._recent.get(info.snapshot_id)
            if restored is not None:
                span.add_link(restored)
            self._rollbacks.add(1, {ROLLBACK_SOURCE: info.source})
            return info
        finally:
            span.end()

    # -- requests to people -----------------------------------------------------------------

    def request_asked(  # noqa: PLR0917
        self,
        run_id: str,
        agent: str,
        request_id: str,
        kind: str,
        who: str | None,
        status: str,
        replayed: bool,
    ) -> None:
        """A handler's request is stored: its ``agentsnap.request`` span, already ended."""
        if not self.tracing:
            return
        attributes: dict[str, AttributeValue] = {
            CONVERSATION_ID: run_id,
            AGENT_NAME: agent,
            REQUEST_ID: request_id,
            REQUEST_KIND: kind,
            REQUEST_STATUS: status,
            REQUEST_REPLAYED: replayed,
        }
        if who is not None:
            attributes[REQUEST_WHO] = who
        self.tracer.start_span(f"{SPAN_REQUEST} {kind}", attributes=attributes).end()

    def request_waiting(self, kind: str, count: int) -> None:
        """``count`` more (or, negative, fewer) handlers wait on a request of ``kind``."""
        self._pending_requests.add(count, {REQUEST_KIND: kind})

    def request_answered(  # noqa: PLR0917
        self,
        run_id: str,
        agent: str,
        request_id: str,
        kind: str,
        status: str,
        waited: float,
    ) -> None:
        """A handler got what became of its request: its ``agentsnap.answer`` span.

        A rejection or a deadline is an outcome the handler acts on, not an error of the span.
        """
        if not self.tracing:
            return
        self.tracer.start_span(
            f"{SPAN_ANSWER} {kind}",
            attributes={
                CONVERSATION_ID: run_id,
                AGENT_NAME: agent,
                REQUEST_ID: request_id,
                REQUEST_KIND: kind,
                REQUEST_STATUS: status,
                REQUEST_WAITED: waited,
            },
        ).end()

    # -- tools ------------------------------------------------------------------------------

    def tool_call(
        self,
        tool: str,
        key: str | None,
        *,
        side_effect: bool,
        run_id: str | None,
        agent: str | None,
    ) -> ToolCallSpan:
        """The ``execute_tool`` span of one call (see the module function ``tool_call``)."""
        return _ToolCall(self, tool, key, side_effect, run_id, agent)


def _messaging(
    destination: str, operation: str, name: str, message_id: str, kind: str
) -> dict[str, AttributeValue]:
    """A send's or a delivery's span attributes, after OpenTelemetry's messaging conventions.

    Args:
        destination: The receiving agent.
        operation: The operation's type (``"send"``, ``"process"``).
        name: The operation's name (``"send"``, ``"deliver"``).
        message_id: The message's id.
        kind: The message's kind.
    """
    return {
        MESSAGING_SYSTEM: SCOPE,
        DESTINATION_NAME: destination,
        OPERATION_TYPE: operation,
        MESSAGING_OPERATION_NAME: name,
        MESSAGE_ID: message_id,
        MESSAGE_KIND: kind,
    }


def _metric_names(metric: str) -> tuple[str, str, str]:
    """Name, unit and description of a metric, from the table."""
    entry = next(n for n in NAMES if n.kind == "metric" and n.name == metric)
    return entry.name, entry.unit, entry.description


class _Current:
    """Spans made current for a ``with`` block, ended with what the block raised.

    Leaving the block makes the outer context current again before the spans end.
    """

    __slots__ = ("_token",)

    _token: Token[OtelContext]
    """What ``__enter__`` attached."""

    def __exit__(self, *exc_info: object) -> None:
        otel_context.detach(self._token)
        exc = exc_info[1]  # (type, exception, traceback), as a with statement passes them
        self._end(exc if isinstance(exc, BaseException) else None)

    def _end(self, exc: BaseException | None) -> None:
        raise NotImplementedError


class Handling(_Current):
    """The spans of one delivery, made by ``Telemetry.handling``."""

    __slots__ = ("_agent", "_deliver", "_invoke", "_message", "_run_id", "_telemetry")

    def __init__(self, telemetry: Telemetry, run_id: str, agent: str, message: Message) -> None:
        self._telemetry = telemetry
        self._run_id = run_id
        self._agent = agent
        self._message = message

    def __enter__(self) -> Span:
        message = self._message
        agent = self._agent
        tracer = self._telemetry.tracer
        headers = message.headers
        # The sender's context, from the headers; a message without one starts a trace.
        parent = propagate.extract(headers, context=_ROOT) if headers else _ROOT
        self._deliver = deliver = tracer.start_span(
            f"{SPAN_DELIVER} {agent}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                **_messaging(agent, "process", "deliver", message.id, message.kind),
                CONVERSATION_ID: self._run_id,
            },
        )
        self._invoke = invoke = tracer.start_span(
            f"{SPAN_INVOKE_AGENT} {agent}",
            context=trace.set_span_in_context(deliver, parent),
            attributes={
                OPERATION_NAME: "invoke_agent",
                AGENT_NAME: agent,
                AGENT_ID: agent,
                CONVERSATION_ID: self._run_id,
            },
        )
        self._token = otel_context.attach(trace.set_span_in_context(invoke, parent))
        return invoke

    def _end(self, exc: BaseException | None) -> None:
        invoke = self._invoke
        deliver = self._deliver
        if isinstance(exc, OutputRejected):
            # A control-flow signal, not a failure of this handler: the rollback span that
            # follows is this span's child.
            invoke.add_event(
                EVENT_REJECTED,
                {
                    ROLLBACK_AGENT: exc.agent,
                    ROLLBACK_REASON: exc.reason,
                    ROLLBACK_SOURCE: exc.source,
                },
            )
            self._telemetry.rejected(exc, invoke.get_span_context())
        elif isinstance(exc, Exception):
            error = type(exc).__qualname__
            invoke.record_exception(exc)
            for span in (invoke, deliver):
                span.set_attribute(ERROR_TYPE, error)
                span.set_status(Status(StatusCode.ERROR, f"{error}: {exc}"))
        invoke.end()
        deliver.end()


class ToolCallSpan:
    """What a tool call tells its span; this base class records nothing."""

    __slots__ = ()

    def __enter__(self) -> ToolCallSpan:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def deduplicated(self, replayed: bool) -> None:
        """Say whether the ledger answered the call without running the tool."""


_NO_TOOL_CALL: Final = ToolCallSpan()


class _ToolCall(_Current, ToolCallSpan):
    __slots__ = ("_agent", "_attributes", "_replayed", "_span", "_telemetry", "_tool")

    def __init__(  # noqa: PLR0917
        self,
        telemetry: Telemetry,
        tool: str,
        key: str | None,
        side_effect: bool,
        run_id: str | None,
        agent: str | None,
    ) -> None:
        self._telemetry = telemetry
        self._tool = tool
        self._replayed = False
        attributes: dict[str, AttributeValue] = {
            OPERATION_NAME: "execute_tool",
            TOOL_NAME: tool,
            TOOL_SIDE_EFFECT: side_effect,
        }
        if key is not None:
            attributes[TOOL_CALL_ID] = key
        if run_id is not None:
            attributes[CONVERSATION_ID] = run_id
        if agent is not None:
            attributes[AGENT_NAME] = agent
        self._attributes = attributes

    def __enter__(self) -> ToolCallSpan:
        self._span = self._telemetry.tracer.start_span(
            f"{SPAN_EXECUTE_TOOL} {self._tool}", attributes=self._attributes
        )
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self

    def deduplicated(self, replayed: bool) -> None:
        self._replayed = replayed

    def _end(self, exc: BaseException | None) -> None:
        span = self._span
        telemetry = self._telemetry
        replayed = self._replayed or (isinstance(exc, ToolFailed) and exc.replayed)
        span.set_attribute(TOOL_DEDUPLICATED, replayed)
        counted: dict[str, AttributeValue] = {TOOL_NAME: self._tool, TOOL_DEDUPLICATED: replayed}
        if isinstance(exc, Exception):
            error = exc.error_type if isinstance(exc, ToolFailed) else type(exc).__qualname__
            span.record_exception(exc)
            span.set_attribute(ERROR_TYPE, error)
            span.set_status(Status(StatusCode.ERROR, str(exc)))
            counted[ERROR_TYPE] = error
        span.end()
        telemetry._tool_calls.add(1, counted)
        if replayed:
            telemetry._deduplicated.add(1, {TOOL_NAME: self._tool})


def tool_call(
    telemetry: Telemetry | None,
    tool: str,
    key: str | None,
    *,
    side_effect: bool,
    run_id: str | None = None,
    agent: str | None = None,
) -> ToolCallSpan:
    """The ``execute_tool`` span of one tool call, as a context manager; inert without telemetry.

    Call ``deduplicated(replayed)`` on it once the outcome is known; a
    [`ToolFailed`][agentsnap.ToolFailed] raised through it marks the span failed (and
    deduplicated when the failure was replayed from the ledger).
    """
    if telemetry is None:
        return _NO_TOOL_CALL
    return telemetry.tool_call(tool, key, side_effect=side_effect, run_id=run_id, agent=agent)


# -- choosing a telemetry --------------------------------------------------------------------

_defaults: dict[tuple[int, int, bool | None], Telemetry] = {}


def _default(tracing: bool | None) -> Telemetry:
    """The telemetry on the global providers (one per providers, so instruments are made once)."""
    tracer_provider = trace.get_tracer_provider()
    meter_provider = metrics.get_meter_provider()
    key = (id(tracer_provider), id(meter_provider), tracing)
    found = _defaults.get(key)
    if found is None:
        found = _defaults[key] = Telemetry(
            tracer_provider=tracer_provider, meter_provider=meter_provider, tracing=tracing
        )
    return found


def resolve(option: Telemetry | bool | None) -> Telemetry | None:
    """The telemetry a runtime uses, or ``None`` when it records nothing.

    Args:
        option: ``None`` (the default): the global providers, when an SDK is installed
            there; ``False``: nothing, whatever is installed; ``True``: the global providers,
            tracing even through the API's no-op tracer; a
            [`Telemetry`][agentsnap.telemetry.Telemetry]: that one.

    Raises:
        ConfigurationError: ``option`` is none of these.
    """
    if option is None:
        found = _default(None)
        return found if found.live else None
    if option is False:
        return None
    if option is True:
        return _default(True)
    if isinstance(option, Telemetry):
        return option
    raise ConfigurationError(
        f"telemetry= takes a Telemetry, True, False or None, got {type(option).__name__}"
    )


# -- exporters for programs (the CLI) ---------------------------------------------------------

Exporter = Literal["console", "otlp"]


def install_sdk(exporter: Exporter, out: IO[str] | None = None) -> Callable[[], None]:
    """Install the OpenTelemetry SDK as the global providers, exporting spans and metrics.

    For programs such as ``agentsnap demo --trace``; a library leaves this to the
    application. The SDK reads the ``OTEL_*`` environment variables as usual (service name,
    resource attributes, sampler, batch sizes, OTLP endpoint and headers, export interval).

    Args:
        exporter: ``console`` prints spans and metrics as JSON on ``out``; ``otlp`` sends
            them with the OTLP exporter (``OTEL_EXPORTER_OTLP_PROTOCOL``: ``http/protobuf``
            by default, or ``grpc``).
        out: Where the console exporter writes (default: standard output).

    Returns:
        A function that flushes and shuts the providers down; call it before exiting.

    Raises:
        ConfigurationError: The SDK, or the OTLP exporter, is not installed.
    """
    try:
        from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
        from opentelemetry.sdk.metrics.export import (  # noqa: PLC0415
            ConsoleMetricExporter,
            PeriodicExportingMetricReader,
        )
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
            BatchSpanProcessor,
            ConsoleSpanExporter,
        )
    except ImportError as exc:
        raise ConfigurationError(
            "exporting traces needs the OpenTelemetry SDK: pip install 'agentsnap[otel]'"
        ) from exc
    span_exporter: SpanExporter
    metric_exporter: MetricExporter
    if exporter == "console":
        stream = out if out is not None else sys.stdout
        span_exporter = ConsoleSpanExporter(out=stream)
        metric_exporter = ConsoleMetricExporter(
            out=stream, formatter=lambda data: data.to_json(indent=4) + os.linesep
        )
    elif exporter == "otlp":
        span_exporter, metric_exporter = _otlp_exporters()
    else:
        raise ConfigurationError(f"unknown exporter {exporter!r}; use console or otlp")
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: SCOPE}))
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    meter_provider = MeterProvider(
        resource=resource, metric_readers=[PeriodicExportingMetricReader(metric_exporter)]
    )
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)

    def shutdown() -> None:
        tracer_provider.shutdown()
        meter_provider.shutdown()

    return shutdown


def _otlp_exporters() -> tuple[SpanExporter, MetricExporter]:
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
    )
    package = "opentelemetry.exporter.otlp.proto." + ("grpc" if protocol == "grpc" else "http")
    try:
        traces = importlib.import_module(f"{package}.trace_exporter")
        measures = importlib.import_module(f"{package}.metric_exporter")
    except ImportError as exc:
        raise ConfigurationError(
            "--trace otlp needs the OTLP exporter: pip install opentelemetry-exporter-otlp"
        ) from exc
    span_exporter: SpanExporter = traces.OTLPSpanExporter()
    metric_exporter: MetricExporter = measures.OTLPMetricExporter()
    return span_exporter, metric_exporter
