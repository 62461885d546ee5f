"""A run's history as handler executions, built from what the store already keeps.

Each time an agent takes a message, its handler runs once: that is one execution. The
journal says when each message was taken and sent; an agent handles one message at a time,
so what it sent between taking a message and taking its next one was sent by that
handler. Model calls and side-effecting tool calls name the message their handler was
handling, and are placed in that handler's execution (the one running when they were
made, for a message handled again after a rollback). A run that kept no journal (a store
in memory, or ``journal=False``) still has its replay log: the order in which each agent
took its messages, by timeline, without times or the messages sent.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentsnap._views import EventRow, HandlerModelCall, HandlerToolCall, SentMessage
from agentsnap.messages import ENVIRONMENT

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from agentsnap.ledger import LedgerEntry
    from agentsnap.model_calls import ModelCallRecord
    from agentsnap.records import JournalMessage, ReplaySegment, RollbackInfo

__all__ = ["Execution", "executions", "matches"]


@dataclass
class Execution:
    """One run of a handler: the message an agent took, and what the handler did with it."""

    agent: str
    message: str
    """The id of the message taken, ``src>dst#seq``."""
    kind: str | None
    payload: Any
    started_at: datetime | None
    timeline: int
    sent: list[SentMessage] = field(default_factory=list)
    tool_calls: list[HandlerToolCall] = field(default_factory=list)
    model_calls: list[HandlerModelCall] = field(default_factory=list)
    last_act: datetime | None = None

    def row(self, index: int) -> EventRow:
        """The execution as a row, numbered ``index`` in the run's history."""
        duration = (
            None
            if self.started_at is None or self.last_act is None
            else round((self.last_act - self.started_at).total_seconds() * 1000, 3)
        )
        return EventRow.of(self, index=index, duration_ms=duration)

    def acted(self, at: datetime) -> None:
        """The handler did something recorded at ``at``."""
        if self.last_act is None or at > self.last_act:
            self.last_act = at


def executions(
    *,
    messages: Sequence[JournalMessage] | None,
    replay: Sequence[ReplaySegment],
    rollbacks: Sequence[RollbackInfo],
    tool_calls: Sequence[LedgerEntry],
    model_calls: Sequence[ModelCallRecord],
) -> list[Execution]:
    """Every handler execution of a run, in the order they began (see the module)."""
    found = _from_journal(messages, rollbacks) if messages is not None else _from_replay(replay)
    by_message: dict[tuple[str, str], list[Execution]] = {}
    for execution in found:
        by_message.setdefault((execution.agent, execution.message), []).append(execution)
    for call in model_calls:
        owner = _owner(by_message, call.agent, call.message_id, call.timeline, call.started_at)
        if owner is not None:
            owner.model_calls.append(HandlerModelCall.of(call))
            owner.acted(call.finished_at)
    for entry in tool_calls:
        if entry.agent is None or entry.message_id is None:
            continue  # a call made outside a handler
        owner = _owner(by_message, entry.agent, entry.message_id, entry.timeline, entry.created_at)
        if owner is not None:
            owner.tool_calls.append(HandlerToolCall.of(entry))
            owner.acted(entry.created_at)
    return found


def _from_journal(
    messages: Sequence[JournalMessage], rollbacks: Sequence[RollbackInfo]
) -> list[Execution]:
    """Executions from the journal: one per message taken, with what its agent sent."""
    rolled = sorted(rollback.at for rollback in rollbacks)
    found: list[Execution] = []
    for m in sorted(messages, key=lambda m: m.delivered_at or m.sent_at):
        taken = m.delivered_at
        if taken is not None and m.dst != ENVIRONMENT:
            found.append(
                Execution(
                    agent=m.dst,
                    message=f"{m.src}>{m.dst}#{m.seq}",
                    kind=m.kind,
                    payload=m.payload,
                    started_at=taken,
                    timeline=bisect_right(rolled, taken),
                )
            )
    by_agent: dict[str, list[Execution]] = {}
    for execution in found:
        by_agent.setdefault(execution.agent, []).append(execution)
    starts = {
        agent: [e.started_at for e in runs if e.started_at is not None]
        for agent, runs in by_agent.items()
    }
    for m in messages:
        runs = by_agent.get(m.src)
        if not runs:
            continue  # sent by the environment, or by an agent outside any handler seen
        at = bisect_right(starts[m.src], m.sent_at) - 1
        if at < 0:
            continue
        execution = runs[at]
        execution.sent.append(SentMessage(to=m.dst, seq=m.seq, kind=m.kind, payload=m.payload))
        execution.acted(m.sent_at)
    return found


def _from_replay(replay: Sequence[ReplaySegment]) -> list[Execution]:
    """Executions from the replay log: the order each agent took its messages, no times."""
    found: list[Execution] = []
    for segment in replay:
        body = json.loads(segment.body)
        for agent, src, first, count in body.get("deliveries", ()):
            found.extend(
                Execution(
                    agent=str(agent),
                    message=f"{src}>{agent}#{seq}",
                    kind=None,
                    payload=None,
                    started_at=None,
                    timeline=segment.timeline,
                )
                for seq in range(int(first), int(first) + int(count))
            )
    return found


def _owner(
    by_message: dict[tuple[str, str], list[Execution]],
    agent: str,
    message: str,
    timeline: int | None,
    at: datetime,
) -> Execution | None:
    """The execution a call of ``agent`` handling ``message`` made at ``at`` belongs to."""
    candidates = by_message.get((agent, message))
    if not candidates:
        return None
    timed = [e for e in candidates if e.started_at is not None and e.started_at <= at]
    if timed:
        return timed[-1]  # the latest execution of that message begun before the call
    if timeline is not None:
        same = [e for e in candidates if e.timeline == timeline]
        if same:
            return same[-1]
    return candidates[-1]


def matches(row: EventRow, *, agent: str | None, kind: str | None, grep: str | None) -> bool:
    """Whether an execution's row passes the filters (``grep``: any text of the row's JSON,
    without regard to case).
    """  # noqa: D205
    if agent is not None and row.agent != agent:
        return False
    if kind is not None and row.kind != kind:
        return False
    if grep is not None:
        text = json.dumps(row.model_dump(mode="json"), ensure_ascii=False).lower()
        return grep.lower() in text
    return True
