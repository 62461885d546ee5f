"""`run_once` on its own, against every ledger: what any code guarding an effect relies on.

The tools call it for every side-effecting call; these tests call it directly, with a plain
coroutine as the effect, on the memory, SQLite and PostgreSQL ledgers.
"""

from __future__ import annotations

import asyncio

import pytest

from agentsnap import (
    ConfigurationError,
    IdempotencyConflict,
    JsonValue,
    ToolCallStatus,
    ToolFailed,
    ToolOutcomeUnknown,
)
from agentsnap.ledger import Ledger, fingerprint
from agentsnap.once import Outcome, run_once

ARGUMENTS = {"to": "ada@example.com", "text": "hello"}


class Effect:
    """An effect that counts its runs and the attempt numbers it was given."""

    def __init__(self, *failures: BaseException) -> None:
        self.attempts: list[int] = []
        self.failures = list(failures)

    async def __call__(self, attempt: int) -> Outcome:
        self.attempts.append(attempt)
        if self.failures:
            raise self.failures.pop(0)
        return Outcome(value=f"sent #{len(self.attempts)}", result="sent", attempts=1)


async def send(
    ledger: Ledger, effect: Effect, key: str = "mail-1", *, rerun_if_unknown: bool = False
) -> Outcome:
    return await run_once(
        ledger,
        key,
        tool="send",
        arguments=dict(ARGUMENTS),
        call=effect,
        run_id="run",
        agent="mailer",
        rerun_if_unknown=rerun_if_unknown,
    )


async def test_a_key_runs_once_and_then_replays_its_outcome(ledger: Ledger) -> None:
    effect = Effect()
    first = await send(ledger, effect)
    again = await send(ledger, effect)
    assert first == Outcome("sent #1", "sent", attempts=1, replayed=False)
    # A replay reports the attempts the ledger recorded, and that nothing ran.
    assert again == Outcome("sent", "sent", attempts=1, replayed=True)
    assert effect.attempts == [1]
    entry = await ledger.get("mail-1")
    assert entry is not None
    assert entry.status == ToolCallStatus.SUCCEEDED
    assert (entry.tool, entry.fingerprint, entry.run_id, entry.agent, entry.owner) == (
        "send",
        fingerprint(ARGUMENTS),
        "run",
        "mailer",
        None,
    )


def as_tuple(result: JsonValue) -> tuple[JsonValue, ...]:
    assert isinstance(result, list)
    return tuple(result)


async def test_load_turns_a_recorded_result_into_the_callers_value(ledger: Ledger) -> None:
    async def effect(attempt: int) -> Outcome:
        return Outcome(value=(1, 2), result=[1, 2], attempts=1)

    for _ in range(2):
        outcome = await run_once(
            ledger, "pair", tool="pair", arguments={}, call=effect, load=as_tuple
        )
        assert outcome.value == (1, 2)


async def test_a_final_error_is_recorded_and_raised_again_without_running(
    ledger: Ledger,
) -> None:
    effect = Effect(ValueError("no such mailbox"))
    with pytest.raises(ToolFailed, match="no such mailbox") as first:
        await send(ledger, effect)
    assert (first.value.error_type, first.value.replayed) == ("ValueError", False)
    with pytest.raises(ToolFailed, match="no such mailbox") as again:
        await send(ledger, effect)
    assert again.value.replayed
    assert effect.attempts == [1]
    entry = await ledger.get("mail-1")
    assert entry is not None
    assert (entry.status, entry.error) == (ToolCallStatus.FAILED, "ValueError: no such mailbox")
    # Raised again, the failure reports the attempts the ledger recorded, as the first did.
    assert first.value.attempts == again.value.attempts == entry.attempts == 1


async def test_a_transient_failure_runs_again_under_the_next_attempt(ledger: Ledger) -> None:
    effect = Effect(ToolFailed("send", "mail-1", "Timeout", "the server", transient=True))
    with pytest.raises(ToolFailed, match="the server"):
        await send(ledger, effect)
    entry = await ledger.get("mail-1")
    assert entry is not None
    assert entry.status == ToolCallStatus.RETRYABLE
    done = await send(ledger, effect)
    assert done.value == "sent #2"
    assert effect.attempts == [1, 2]
    entry = await ledger.get("mail-1")
    assert entry is not None
    assert done.attempts == entry.attempts == 2  # the ledger's count: both attempts
    assert (await send(ledger, effect)).attempts == 2  # replayed, with that count


async def test_a_key_used_with_other_arguments_is_a_conflict(ledger: Ledger) -> None:
    effect = Effect()
    await send(ledger, effect)
    with pytest.raises(IdempotencyConflict, match="other arguments"):
        await run_once(
            ledger, "mail-1", tool="send", arguments={**ARGUMENTS, "text": "bye"}, call=effect
        )
    with pytest.raises(IdempotencyConflict, match="used for tool 'send'"):
        await run_once(ledger, "mail-1", tool="post", arguments=dict(ARGUMENTS), call=effect)
    assert effect.attempts == [1]


async def test_a_cancelled_call_is_unknown_and_runs_again_only_if_allowed(
    ledger: Ledger,
) -> None:
    started = asyncio.Event()

    async def hangs(attempt: int) -> Outcome:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("never reached")

    task = asyncio.create_task(
        run_once(ledger, "mail-1", tool="send", arguments=dict(ARGUMENTS), call=hangs)
    )
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    entry = await ledger.get("mail-1")
    assert entry is not None
    assert entry.status == ToolCallStatus.UNKNOWN
    effect = Effect()
    with pytest.raises(ToolOutcomeUnknown):
        await send(ledger, effect)
    assert effect.attempts == []
    assert (await send(ledger, effect, rerun_if_unknown=True)).value == "sent #1"
    assert effect.attempts == [2]


async def test_a_bad_key_or_lease_is_refused_before_anything_is_claimed(ledger: Ledger) -> None:
    effect = Effect()
    with pytest.raises(ConfigurationError, match="idempotency key"):
        await send(ledger, effect, key="")
    with pytest.raises(ConfigurationError, match="lease > 0"):
        await run_once(ledger, "k", tool="send", arguments={}, call=effect, lease=0)
    assert await ledger.list_calls() == []
    assert effect.attempts == []
