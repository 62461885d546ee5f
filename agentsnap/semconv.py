"""The names agentsnap gives to what it records: its OpenTelemetry semantic conventions.

Every span, attribute, event and metric name that [`agentsnap.telemetry`][agentsnap.telemetry]
records is defined once, here: each constant below is registered, with where it appears and
what it means, in [`NAMES`][agentsnap.semconv.NAMES], and the documentation's table of names is
generated from that list ([`markdown_table`][agentsnap.semconv.markdown_table]). The
``gen_ai.*``, ``messaging.*`` and ``error.type`` names come from OpenTelemetry's semantic
conventions (generative AI, messaging, errors); the ``agentsnap.*`` names are agentsnap's.

This module is only names: it imports neither OpenTelemetry nor the recorder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "NAMES",
    "SCOPE",
    "Name",
    "markdown_table",
]

SCOPE: Final = "agentsnap"
"""Instrumentation scope of agentsnap's tracer and meter."""


Kind = Literal["span", "attribute", "event", "metric"]


@dataclass(frozen=True, slots=True)
class Name:
    """One name agentsnap gives to what it records.

    Attributes:
        kind: ``span``, ``attribute``, ``event`` or ``metric``.
        name: The name; a span's name is followed by the value of the attribute ``suffix``.
        where: For a span, its kind; for an attribute or an event, the spans (and metrics)
            that carry it; for a metric, its instrument and unit (UCUM).
        description: What it is.
        suffix: For a span, the attribute whose value completes its name.
        unit: For a metric, its unit.
    """

    kind: Kind
    name: str
    where: str
    description: str
    suffix: str = ""
    unit: str = ""

    @property
    def shown(self) -> str:
        """The name as documented (``invoke_agent {gen_ai.agent.name}``)."""
        return f"{self.name} {{{self.suffix}}}" if self.suffix else self.name


NAMES: list[Name] = []
"""Every span, attribute, event and metric name agentsnap records, in documentation order."""


def _span(name: str, suffix: str, kind: str, description: str) -> str:
    NAMES.append(Name("span", name, f"kind {kind}", description, suffix))
    return name


def _attr(name: str, where: str, description: str) -> str:
    NAMES.append(Name("attribute", name, where, description))
    return name


def _event(name: str, where: str, description: str) -> str:
    NAMES.append(Name("event", name, where, description))
    return name


def _metric(name: str, instrument: str, unit: str, description: str) -> str:
    NAMES.append(Name("metric", name, f"{instrument}, `{unit}`", description, unit=unit))
    return name


_MSG = "send, deliver"
_SNAP = "agentsnap.snapshot"
_ROLL = "agentsnap.rollback"
_REQ = "agentsnap.request, agentsnap.answer"

SPAN_INVOKE_AGENT: Final = _span(
    "invoke_agent",
    "gen_ai.agent.name",
    "internal",
    "An agent handles one message; child of `deliver`.",
)
SPAN_EXECUTE_TOOL: Final = _span(
    "execute_tool", "gen_ai.tool.name", "internal", "A tool call from a handler."
)
SPAN_SEND: Final = _span(
    "send",
    "messaging.destination.name",
    "producer",
    "A message is put on its channel; its context travels in the message headers.",
)
SPAN_DELIVER: Final = _span(
    "deliver",
    "messaging.destination.name",
    "consumer",
    "A message is taken off its channel and handled; child of its `send`.",
)
SPAN_SNAPSHOT: Final = _span(
    _SNAP, "", "internal", "A snapshot, from its start until the store wrote it (or it failed)."
)
SPAN_ROLLBACK: Final = _span(
    _ROLL, "", "internal", "A rollback; child of the `invoke_agent` that rejected the output."
)
SPAN_REQUEST: Final = _span(
    "agentsnap.request",
    "agentsnap.request.kind",
    "internal",
    "A handler asks a person (a question, or an approval before a side effect); ends once the "
    "request is stored. The wait for the answer is the gap until its `agentsnap.answer`.",
)
SPAN_ANSWER: Final = _span(
    "agentsnap.answer",
    "agentsnap.request.kind",
    "internal",
    "The handler gets what became of its request: an answer, a rejection, its deadline.",
)

OPERATION_NAME: Final = _attr(
    "gen_ai.operation.name", "invoke_agent, execute_tool", "`invoke_agent` or `execute_tool`."
)
AGENT_NAME: Final = _attr("gen_ai.agent.name", f"invoke_agent, execute_tool, {_REQ}", "The agent.")
AGENT_ID: Final = _attr("gen_ai.agent.id", "invoke_agent", "The agent's name (unique in a run).")
CONVERSATION_ID: Final = _attr(
    "gen_ai.conversation.id",
    f"invoke_agent, execute_tool, deliver, {_SNAP}, {_ROLL}, {_REQ}",
    "The run id.",
)
TOOL_NAME: Final = _attr("gen_ai.tool.name", "execute_tool; tool metrics", "The tool.")
TOOL_CALL_ID: Final = _attr(
    "gen_ai.tool.call.id", "execute_tool", "The idempotency key (when the call has one)."
)
TOOL_SIDE_EFFECT: Final = _attr(
    "agentsnap.tool.side_effect", "execute_tool", "The tool is declared `side_effect=True`."
)
TOOL_DEDUPLICATED: Final = _attr(
    "agentsnap.tool.deduplicated",
    "execute_tool; agentsnap.tool.calls",
    "The ledger answered with the key's recorded outcome; the tool did not run.",
)
ERROR_TYPE: Final = _attr(
    "error.type",
    "invoke_agent, deliver, execute_tool; agentsnap.tool.calls",
    "Class of the exception a handler or tool raised.",
)
MESSAGING_SYSTEM: Final = _attr("messaging.system", _MSG, "`agentsnap`.")
DESTINATION_NAME: Final = _attr(
    "messaging.destination.name", f"{_MSG}; agentsnap.bus.queue_depth", "The receiving agent."
)
OPERATION_TYPE: Final = _attr("messaging.operation.type", _MSG, "`send`, or `process`.")
MESSAGING_OPERATION_NAME: Final = _attr("messaging.operation.name", _MSG, "`send`, or `deliver`.")
MESSAGE_ID: Final = _attr(
    "messaging.message.id", _MSG, "`src>dst#seq`; a message put back by a rollback keeps it."
)
MESSAGE_KIND: Final = _attr("agentsnap.message.kind", _MSG, "The message's kind.")
SNAPSHOT_ID: Final = _attr("agentsnap.snapshot.id", _SNAP, "The snapshot id.")
SNAPSHOT_SEQ: Final = _attr("agentsnap.snapshot.seq", _SNAP, "Its number within the run.")
SNAPSHOT_INITIATOR: Final = _attr(
    "agentsnap.snapshot.initiator", _SNAP, "The agent that started it, or `$env`."
)
SNAPSHOT_STATUS: Final = _attr(
    "agentsnap.snapshot.status",
    f"{_SNAP}; agentsnap.snapshots, agentsnap.snapshot.duration",
    "`complete` or `failed`.",
)
SNAPSHOT_AGENTS: Final = _attr("agentsnap.snapshot.agents", _SNAP, "Agents in the cut.")
SNAPSHOT_CHANNELS: Final = _attr("agentsnap.snapshot.channels", _SNAP, "Channels in the cut.")
SNAPSHOT_IN_FLIGHT: Final = _attr(
    "agentsnap.snapshot.in_flight_messages", _SNAP, "Messages in flight across the cut."
)
SNAPSHOT_BYTES: Final = _attr(
    "agentsnap.snapshot.bytes",
    _SNAP,
    "Bytes of JSON written: states and in-flight messages (an unchanged state is stored once, "
    "so the store may write less).",
)
SNAPSHOT_DURATION: Final = _attr(
    "agentsnap.snapshot.duration", _SNAP, "Seconds from its start until written (or failed)."
)
CHANNEL: Final = _attr("agentsnap.channel", "agentsnap.snapshot.marker", "A channel, `src>dst`.")
PROCESS: Final = _attr("agentsnap.process", "agentsnap.snapshot.recorded", "An agent, or `$env`.")
ROLLBACK_ID: Final = _attr("agentsnap.rollback.id", _ROLL, "The rollback id.")
ROLLBACK_REASON: Final = _attr(
    "agentsnap.rollback.reason", f"{_ROLL}, agentsnap.output_rejected", "Why."
)
ROLLBACK_AGENT: Final = _attr(
    "agentsnap.rollback.agent",
    f"{_ROLL}, agentsnap.output_rejected",
    "The agent whose output was rejected (none for a rollback on request).",
)
ROLLBACK_SOURCE: Final = _attr(
    "agentsnap.rollback.source",
    f"{_ROLL}, agentsnap.output_rejected; agentsnap.rollbacks",
    "A check's name, `schema`, `self-evaluation`, a critic agent, or `manual`.",
)
ROLLBACK_ATTEMPT: Final = _attr(
    "agentsnap.rollback.attempt", _ROLL, "Failures of this output so far, this one included."
)
ROLLBACK_SNAPSHOT: Final = _attr("agentsnap.rollback.snapshot.id", _ROLL, "The snapshot restored.")
ROLLBACK_DISCARDED: Final = _attr(
    "agentsnap.rollback.messages_discarded", _ROLL, "Queued messages the cut does not hold."
)
ROLLBACK_OUTCOME: Final = _attr(
    "agentsnap.rollback.outcome", _ROLL, "`rolled_back`, or `exhausted`: the run stopped."
)
REQUEST_ID: Final = _attr("agentsnap.request.id", _REQ, "The request's id.")
REQUEST_KIND: Final = _attr(
    "agentsnap.request.kind",
    f"{_REQ}; agentsnap.requests.pending",
    "`question` (`ctx.ask`) or `approval` (a side-effecting call).",
)
REQUEST_WHO: Final = _attr("agentsnap.request.who", _REQ, "Who may answer, as the asker said.")
REQUEST_STATUS: Final = _attr(
    "agentsnap.request.status",
    _REQ,
    "`pending` (asked), then `answered`, `rejected` or `expired`.",
)
REQUEST_REPLAYED: Final = _attr(
    "agentsnap.request.replayed",
    "agentsnap.request",
    "A re-executed handler found its request stored already (perhaps answered).",
)
REQUEST_WAITED: Final = _attr(
    "agentsnap.request.waited", "agentsnap.answer", "Seconds this handler waited for the answer."
)

EVENT_MARKER: Final = _event(
    "agentsnap.snapshot.marker", _SNAP, "A marker of the snapshot came off a channel."
)
EVENT_RECORDED: Final = _event(
    "agentsnap.snapshot.recorded", _SNAP, "A process recorded its state for the snapshot."
)
EVENT_REJECTED: Final = _event(
    "agentsnap.output_rejected",
    "invoke_agent",
    "The handler rejected an output; a rollback follows.",
)

# Metrics, after Flink's checkpoint metrics.
METRIC_SNAPSHOT_DURATION: Final = _metric(
    "agentsnap.snapshot.duration", "histogram", "s", "From a snapshot's start until written."
)
METRIC_SNAPSHOT_SIZE: Final = _metric(
    "agentsnap.snapshot.size", "histogram", "By", "Bytes of JSON a complete snapshot wrote."
)
METRIC_IN_FLIGHT: Final = _metric(
    "agentsnap.snapshot.in_flight_messages",
    "histogram",
    "{message}",
    "Messages in flight across a complete snapshot's cut.",
)
METRIC_SNAPSHOTS: Final = _metric(
    "agentsnap.snapshots", "counter", "{snapshot}", "Snapshots finished, by status."
)
METRIC_ROLLBACKS: Final = _metric(
    "agentsnap.rollbacks", "counter", "{rollback}", "Rollbacks carried out."
)
METRIC_TOOL_CALLS: Final = _metric("agentsnap.tool.calls", "counter", "{call}", "Tool calls.")
METRIC_DEDUPLICATED: Final = _metric(
    "agentsnap.tool.deduplicated_calls",
    "counter",
    "{call}",
    "Tool calls answered from the ledger without running the tool.",
)
METRIC_QUEUE_DEPTH: Final = _metric(
    "agentsnap.bus.queue_depth",
    "gauge",
    "{message}",
    "Items waiting on the channels to each agent, over the live runtimes.",
)

METRIC_PENDING_REQUESTS: Final = _metric(
    "agentsnap.requests.pending",
    "updowncounter",
    "{request}",
    "Requests to people that handlers of the live runtimes wait on.",
)


def markdown_table() -> str:
    """The names as a Markdown table (the documentation holds a copy, checked by a test)."""
    rows = ["| kind | name | where, or instrument and unit | description |", "| --- " * 4 + "|"]
    rows += [f"| {n.kind} | `{n.shown}` | {n.where} | {n.description} |" for n in NAMES]
    return "\n".join(rows) + "\n"
