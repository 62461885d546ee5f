"""Model calls as recorded steps: what a handler asked a model, and what it answered.

A handler that asks a model through its context (``await ctx.chat(model, ...)``,
``await ctx.complete(model, prompt)``, or a model kept on the agent) makes a *model call*.
Each is recorded before its answer reaches the handler, keyed by the call's identity:

* the run, the agent and the message being handled;
* its **position** among the model calls of that handler execution (0, 1, ...);
* the **timeline**: a rollback starts a new one; a resume goes on with the one the run was on.

Not by the prompt: a re-executed handler whose prompt differs in a detail (a timestamp, an
order) still finds its answer. The rules:

* **Resume** (same timeline): the handler is re-executed and each call gets the recorded
  answer, in order, without asking the model, so the arguments downstream are the same, the
  derived keys are the same, and the model is not paid twice.
* **Rollback** (new timeline): the model is asked again, with the agent's feedback, and may
  answer differently; the discarded timeline's calls stay in the store, to be inspected.
* A call whose answer was never recorded (the process died mid-call) is asked again: a model
  call has no effect outside, so that is safe.

A [`ModelCallLog`][agentsnap.model_calls.ModelCallLog] keeps the records; the ledgers
([`MemoryLedger`][agentsnap.store.ledger.MemoryLedger] and
[`SqlLedger`][agentsnap.store.sql_ledger.SqlLedger]) are model call logs too, so a run's
model calls live in the same database as its side-effecting tool calls.
"""

from __future__ import annotations

import logging
import time
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from agentsnap._uninterrupted import uninterrupted
from agentsnap.exceptions import StoreError
from agentsnap.messages import JsonValue
from agentsnap.models import ModelRequest, ModelResponse
from agentsnap.records import utcnow
from agentsnap.redaction import Redaction, unredact

__all__ = ["ModelCallLog", "ModelCallRecord", "recorded_call"]

RECORD_LEASE = 60.0
"""Seconds the write of an answer may go on after a rollback cancelled its handler."""

logger = logging.getLogger("agentsnap")


@dataclass(frozen=True, slots=True)
class ModelCallRecord:
    """One model call of a handler, as the store keeps it.

    ``(run_id, agent, message_id, position, timeline)`` is its identity (the primary key).
    """

    run_id: str
    """The run."""
    agent: str
    """The agent whose handler made the call."""
    message_id: str
    """The message the handler was handling."""
    position: int
    """How many model calls the same handler execution made before this one."""
    timeline: int
    """The run's timeline when the call was made (a rollback starts a new one)."""
    request: dict[str, JsonValue]
    """The request: messages, tools offered, output schema, settings (a ``ModelRequest``
    dumped as JSON)."""
    response: dict[str, JsonValue]
    """The answer: text, tool calls, structured output, model, usage (a ``ModelResponse``
    dumped as JSON)."""
    model: str | None
    """Name of the model that answered, when it said."""
    input_tokens: int
    """Tokens of the request."""
    output_tokens: int
    """Tokens of the answer."""
    started_at: datetime
    """When the model was asked."""
    latency_ms: float
    """How long the model took to answer, in milliseconds."""
    replays: int = 0
    """How many times a re-executed handler got this answer instead of asking again."""

    @property
    def finished_at(self) -> datetime:
        """When the answer came."""
        return self.started_at + timedelta(milliseconds=self.latency_ms)

    def answer(self) -> ModelResponse:
        """The recorded answer."""
        return ModelResponse.model_validate(self.response)

    def asked(self) -> ModelRequest:
        """The recorded request."""
        return ModelRequest.model_validate(self.request)


@typing.runtime_checkable
class ModelCallLog(Protocol):
    """Where a run's model calls are recorded, keyed by their identity.

    Implementations: [`MemoryLedger`][agentsnap.store.ledger.MemoryLedger] and
    [`SqlLedger`][agentsnap.store.sql_ledger.SqlLedger].
    """

    async def record_model_call(self, record: ModelCallRecord) -> bool:
        """Write ``record`` unless a call of the same identity is recorded already.

        Returns:
            Whether it was written (``False``: the identity was taken; the first answer stays).
        """

    async def find_model_call(
        self, run_id: str, agent: str, message_id: str, position: int, timeline: int
    ) -> ModelCallRecord | None:
        """The call of this identity, or ``None``."""

    async def find_model_answer(
        self, run_id: str, agent: str, message_id: str, position: int, timeline: int
    ) -> dict[str, JsonValue] | None:
        """The answer recorded for the call of this identity, or ``None``.

        ``ModelCallRecord.response``: what a re-executed handler needs, without its request.
        """

    async def replayed_model_call(
        self, run_id: str, agent: str, message_id: str, position: int, timeline: int
    ) -> None:
        """Count one more replay of the call of this identity."""

    async def list_model_calls(
        self, run_id: str, agent: str | None = None
    ) -> list[ModelCallRecord]:
        """A run's model calls (of one agent, when given), in the order they were made."""


Ask = Callable[[ModelRequest], Awaitable[ModelResponse]]


async def recorded_call(
    log: ModelCallLog,
    request: ModelRequest,
    ask: Ask,
    *,
    run_id: str,
    agent: str,
    message_id: str,
    position: int,
    timeline: int,
    look_up: bool = True,
    redaction: Redaction | None = None,
) -> tuple[ModelResponse, bool]:
    """The answer recorded for this call's identity, or ``ask``'s answer, recorded first.

    The answer is in the log before it is returned, so an effect that depends on it can only
    follow a durable answer: a re-executed handler gets the same answer and makes the same
    call. ``look_up=False`` skips the look for a recorded answer, for a timeline no earlier
    process can have recorded in (a call of a new run, or after a rollback in this process):
    the call is recorded, and its identity being taken meanwhile is still found.

    With a ``redaction``, the request and the answer are recorded redacted (see
    [`agentsnap.redaction`][agentsnap.redaction]); an answer read back that holds markers
    gets their values from its ``secret`` provider, or the call raises.

    Returns:
        The answer, and whether it was replayed from the log (the model was not asked).

    Raises:
        StoreError: The log cannot be read or written now; when the answer cannot be
            written, the handler fails (and is redone once the database answers) rather than
            act on an answer that a crash would lose.
        RedactedValueNeeded: A recorded answer holds a marker no provider gives back.
    """
    if look_up:
        found = await log.find_model_answer(run_id, agent, message_id, position, timeline)
        if found is not None:
            try:
                await log.replayed_model_call(run_id, agent, message_id, position, timeline)
            except StoreError as exc:  # a count for the inspector; the answer is what matters
                logger.debug("could not count a replay of a model call: %s", exc)
            return _answer(found, agent, redaction), True
    started = utcnow()
    clock = time.perf_counter()
    response = await ask(request)
    latency = (time.perf_counter() - clock) * 1000.0
    asked = request.model_dump(mode="json", exclude_defaults=True)
    answer = response.model_dump(mode="json", exclude_defaults=True)
    if redaction is not None:
        asked, answer = redaction.model_call(agent, asked, answer)
    record = ModelCallRecord(
        run_id=run_id,
        agent=agent,
        message_id=message_id,
        position=position,
        timeline=timeline,
        request=asked,
        response=answer,
        model=response.model,
        input_tokens=response.usage.input_tokens,
        output_tokens=response.usage.output_tokens,
        started_at=started,
        latency_ms=latency,
    )
    # The answer is written whole even when a rollback cancels the handler meanwhile: a
    # redo must find it, rather than ask again and find it only when its own write collides.
    if not await uninterrupted(log.record_model_call(record), RECORD_LEASE):
        # Recorded meanwhile by another execution of the same handler (a resumed run racing
        # a process still finishing): the first answer is the one every execution gets.
        first = await log.find_model_answer(run_id, agent, message_id, position, timeline)
        if first is not None:
            return _answer(first, agent, redaction), True
    return response, False


def _answer(found: dict[str, JsonValue], agent: str, redaction: Redaction | None) -> ModelResponse:
    """A recorded answer, its redacted parts given back by the redaction's provider."""
    value = unredact(found, "model_answer", agent, redaction, doing="replay a model answer")
    return ModelResponse.model_validate(value)
