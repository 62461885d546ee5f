"""Exactly once: the state machine of one side-effecting call against a ledger, and reconcile.

[`agentsnap.ledger`][agentsnap.ledger] says what a ledger holds and what it decides for a key
it already holds; this module follows those rules with the ledger's public protocol only.
[`run_once`][agentsnap.once.run_once] claims a key, runs the call, records its outcome, and
for a key the ledger already holds replays the recorded outcome, waits for a call in progress
elsewhere, takes over a retryable (or, when allowed, an unknown) claim, or refuses. Tools
declared ``side_effect=True`` call it; so can code that guards its own effects.

[`reconcile`][agentsnap.once.reconcile] runs when a run ends: effects that no agent's final
state holds were abandoned by a rollback, and the tools that declare a compensating action
have it run once for each. [`KnownTools`][agentsnap.once.KnownTools] is how a runtime knows
its tools by name, and what ``reconcile`` looks compensations up in.

Example:
    ```python
    import asyncio

    from agentsnap.once import Outcome, run_once
    from agentsnap.store.ledger import MemoryLedger

    SENT: list[str] = []

    async def send(attempt: int) -> Outcome:
        SENT.append("hello")
        return Outcome(value="queued", result="queued", attempts=1)

    async def main() -> None:
        ledger = MemoryLedger()
        for _ in range(2):
            outcome = await run_once(
                ledger, "greeting-1", tool="send", arguments={"text": "hello"}, call=send
            )
            print(outcome.value, outcome.replayed)
        assert SENT == ["hello"]

    asyncio.run(main())
    ```
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import typing
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from agentsnap import liveness
from agentsnap.exceptions import (
    ConfigurationError,
    IdempotencyConflict,
    NotFoundError,
    StoreError,
    ToolFailed,
    ToolInProgress,
    ToolOutcomeUnknown,
)
from agentsnap.ledger import (
    Change,
    Ledger,
    LedgerEntry,
    ToolCallStatus,
    check_key,
    mark_orphaned,
    owner_id,
)
from agentsnap.ledger import fingerprint as fingerprint_of
from agentsnap.records import utcnow
from agentsnap.state import canonical_json

if TYPE_CHECKING:
    from agentsnap.messages import JsonValue
    from agentsnap.state import AgentState
    from agentsnap.store import RunLeases

__all__ = [
    "Compensable",
    "Diverged",
    "KnownTools",
    "Outcome",
    "PendingOutcomes",
    "Unrecorded",
    "compensate",
    "effects_done",
    "reconcile",
    "run_once",
]

logger = logging.getLogger("agentsnap")

_POLL_FIRST = 0.002
_POLL_MAX = 0.1

# A recorded outcome is final: later calls of the key get it back without running anything.
_OUTCOME_KNOWN = frozenset(
    {ToolCallStatus.SUCCEEDED, ToolCallStatus.FAILED, ToolCallStatus.ABANDONED}
)


class Outcome(typing.NamedTuple):
    """What a call under a key produced, run now or replayed from the ledger."""

    value: Any
    """What the call returned (for a replay: the recorded result, as ``load`` made it)."""
    result: JsonValue
    """The result as JSON, as the ledger records it."""
    attempts: int
    """How many times the call ran under the key, retries included, as the ledger counts
    them (for a replay, the count recorded when it ran)."""
    replayed: bool = False
    """The outcome was recorded before, and nothing ran."""


Call = Callable[[int], Awaitable[Outcome]]
"""The effect: takes the number of its first attempt under the key, returns its outcome.

It raises [`ToolFailed`][agentsnap.ToolFailed] to say how it failed (``transient=True`` for a
failure that the next call may run again); any other exception is recorded as a final failure
and raised as ``ToolFailed``.
"""


# -- outcomes not in the ledger yet ---------------------------------------------------------


class Unrecorded(typing.NamedTuple):
    """The outcome of a call whose effect happened but which the ledger could not record.

    Kept in a [`PendingOutcomes`][agentsnap.once.PendingOutcomes] until it is written: by the
    next call of that ledger in this process, or by the runtime at close (spooled when the
    database is still away).
    """

    run_id: str | None
    """The run that made the call."""
    key: str
    """Idempotency key."""
    tool: str
    """Name of the tool."""
    fingerprint: str
    """Fingerprint of the arguments."""
    attempt: int
    """The attempt whose claim the outcome belongs to."""
    change: Change
    """The ledger update that records the outcome."""
    outcome: Outcome | None
    """The outcome, when the call succeeded."""
    failure: ToolFailed | None
    """The failure, when it failed."""
    ledger: Ledger
    """The ledger it belongs in."""

    async def record(self, ledger: Ledger) -> bool:
        """Write the outcome, if the entry is still this process's attempt; True if it was."""
        return await ledger.update(
            self.key,
            self.change,
            statuses=(ToolCallStatus.IN_PROGRESS, ToolCallStatus.UNKNOWN),
            owner=owner_id(),
            attempts=self.attempt,
        )


class PendingOutcomes:
    """Outcomes of calls that happened and that their ledger could not record yet, by key.

    Whoever runs calls holds one and hands it to [`run_once`][agentsnap.once.run_once]: a
    runtime holds one for its run's calls and writes what is left in it as the run closes.
    Keys are unique across runs, so one object may hold the outcomes of several runs.
    """

    __slots__ = ("_by_key",)

    def __init__(self) -> None:
        self._by_key: dict[str, Unrecorded] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def of_run(self, run_id: str) -> list[Unrecorded]:
        """The outcomes of ``run_id``'s calls that happened and are not in the ledger yet."""
        return [entry for entry in self._by_key.values() if entry.run_id == run_id]

    def get(self, key: str) -> Unrecorded | None:
        """The outcome kept for ``key``, if any."""
        return self._by_key.get(key)

    def keep(self, entry: Unrecorded) -> None:
        """Keep ``entry`` until it is written."""
        self._by_key[entry.key] = entry

    def recorded(self, key: str) -> None:
        """The outcome of ``key`` is in the ledger now (written from elsewhere, say a spool)."""
        self._by_key.pop(key, None)

    async def record_for(self, ledger: Ledger) -> None:
        """Write the outcomes kept for ``ledger``, now that a call of it goes ahead.

        Raises:
            StoreError: The ledger still fails (the outcomes are kept).
        """
        for key, pending in list(self._by_key.items()):
            if pending.ledger is ledger:
                await pending.record(ledger)  # False: taken over meanwhile, nothing to keep
                self._by_key.pop(key, None)


# What run_once keeps when its caller hands it nothing to keep outcomes in: code calling
# run_once (or Tool.invoke) on its own, outside a runtime. Only this module reads it.
_UNOWNED = PendingOutcomes()


# -- one call -------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Once:
    """One call of ``run_once``: what it needs at every step of the state machine."""

    ledger: Ledger
    key: str
    tool: str
    fingerprint: str
    call: Call
    load: Callable[[JsonValue], Any] | None
    run_id: str | None
    lease: float
    wait: float
    rerun_if_unknown: bool
    pending: PendingOutcomes
    diverged: Diverged | None = None


Diverged = Callable[[LedgerEntry], Awaitable[None]]
"""Decides for a key bound to a call (not to its arguments) that the ledger holds with other
arguments: returns to have the recorded outcome stand for this call, or raises."""


async def run_once(
    ledger: Ledger,
    key: str,
    *,
    tool: str,
    arguments: dict[str, JsonValue],
    call: Call,
    fingerprint: str | None = None,
    load: Callable[[JsonValue], Any] | None = None,
    run_id: str | None = None,
    agent: str | None = None,
    message_id: str | None = None,
    lease: float = 60.0,
    wait: float = 10.0,
    rerun_if_unknown: bool = False,
    timeline: int | None = None,
    diverged: Diverged | None = None,
    pending: PendingOutcomes | None = None,
) -> Outcome:
    """Run ``call`` at most once under ``key``, or give back the outcome recorded for it.

    The key is claimed in the ledger before ``call`` runs and its outcome recorded after, as
    [`agentsnap.ledger`][agentsnap.ledger] describes: a recorded outcome is returned (or its
    final error raised) without running anything; a claim in progress elsewhere is waited
    for; a retryable one is taken over under the next attempt number; an unknown one only
    with ``rerun_if_unknown``. An outcome the ledger cannot record (the database is away) is
    kept in this process and written later, so the effect is never run again for it.

    Args:
        ledger: The ledger.
        key: Idempotency key, 1 to 255 characters.
        tool: Name of the effect, recorded with the key; a key used by another name is a
            conflict.
        arguments: The call's arguments as JSON, recorded with the key.
        call: The effect (see ``Call``); it runs at most once per claim it wins. A call
            taken over that raises ``ToolOutcomeUnknown`` (it cannot tell what the attempt
            before it did: no [`note`][agentsnap.ToolCall.note] to go on) leaves the key
            ``unknown``.
        fingerprint: The arguments' fingerprint (default:
            [`fingerprint(arguments)`][agentsnap.ledger.fingerprint]).
        load: Turns a recorded result back into the value the caller gets (default: the
            JSON itself).
        run_id: Run to file the call under, if any.
        agent: Agent to file the call under, if any.
        message_id: Message whose handler made the call, if any.
        lease: Seconds the claim holds before another caller may find its outcome unknown.
        wait: Seconds to wait for the same key in progress elsewhere.
        rerun_if_unknown: Run ``call`` again when the key's outcome is unknown (its owner
            stopped mid-call), because the effect deduplicates by key on its own.
        timeline: The run's timeline, recorded with a new claim.
        diverged: For a key that names the call rather than its arguments: called when the
            ledger holds the key with other arguments; it returns to let the recorded
            outcome stand for this call, or raises. Without it that is a conflict.
        pending: Where an outcome the ledger cannot record is kept until it is written (a
            runtime's, which writes it as the run closes); without it, a store private to
            this module, written by the next call of the same ledger in this process.

    Returns:
        The outcome: run now, or replayed (``replayed=True``, with the recorded attempts).

    Raises:
        ConfigurationError: ``key`` is empty, too long or holds the NUL character; or
            ``lease`` is not positive or ``wait`` negative.
        IdempotencyConflict: ``key`` was used for another tool or other arguments, or its
            effect was abandoned by a rollback and compensated.
        ToolFailed: The call failed, now or as recorded for this key.
        ToolInProgress: The key is in progress elsewhere beyond ``wait``.
        ToolOutcomeUnknown: The key's outcome is unknown and ``rerun_if_unknown`` is not set.
    """
    check_key(key)
    if lease <= 0 or wait < 0:
        raise ConfigurationError(
            f"run_once() needs lease > 0 and wait >= 0 (seconds), got lease={lease!r}, "
            f"wait={wait!r}"
        )
    printed = fingerprint if fingerprint is not None else fingerprint_of(arguments)
    kept = _UNOWNED if pending is None else pending
    once = _Once(
        ledger,
        key,
        tool,
        printed,
        call,
        load,
        run_id,
        lease,
        wait,
        rerun_if_unknown,
        kept,
        diverged,
    )
    if kept:
        known = kept.get(key)
        if known is not None and (known.tool, known.fingerprint) == (tool, printed):
            return await _known(ledger, known, kept)
        await kept.record_for(ledger)
    me = owner_id()
    now = utcnow()
    entry = LedgerEntry(
        key=key,
        tool=tool,
        fingerprint=printed,
        arguments=arguments,
        status=ToolCallStatus.IN_PROGRESS,
        created_at=now,
        updated_at=now,
        run_id=run_id,
        agent=agent,
        message_id=message_id,
        owner=me,
        lease_until=now + timedelta(seconds=lease),
        attempts=1,
        timeline=timeline,
    )
    found = await ledger.claim(entry)
    if found is None:
        return await _run_claimed(once, 1)
    return await _settle(once, found, me)


async def _settle(once: _Once, found: LedgerEntry, me: str) -> Outcome:
    """Decide for a key the ledger already holds, until there is an outcome or an error."""
    ledger, key, tool = once.ledger, once.key, once.tool
    deadline: float | None = None
    pause = _POLL_FIRST
    loop = asyncio.get_running_loop()
    while True:
        if (
            found.tool == tool
            and found.fingerprint != once.fingerprint
            and once.diverged is not None
        ):
            await once.diverged(found)  # raises, or lets the recorded outcome stand
            once.fingerprint = found.fingerprint
        if found.tool != tool or found.fingerprint != once.fingerprint:
            what = (
                f"it was used for tool {found.tool!r}"
                if found.tool != tool
                else "it was used with other arguments"
            )
            raise IdempotencyConflict(key, tool, f"{what} ({_short_json(found.arguments)})")
        status = found.status
        if status in _OUTCOME_KNOWN:
            if status == ToolCallStatus.ABANDONED:
                # A path that repeats the call again: the effect is live once more.
                await ledger.update(
                    key,
                    {"status": ToolCallStatus.SUCCEEDED, "updated_at": utcnow()},
                    statuses=(ToolCallStatus.ABANDONED,),
                )
            return _replay(once, found)
        takeover = False
        if status == ToolCallStatus.RETRYABLE:
            takeover = True
        elif status == ToolCallStatus.IN_PROGRESS:
            expired = found.lease_until is None or found.lease_until <= utcnow()
            if expired or liveness.owner_is_gone(found.owner):
                if once.rerun_if_unknown:
                    takeover = True
                else:
                    marked = await ledger.update(
                        key,
                        {"status": ToolCallStatus.UNKNOWN, "updated_at": utcnow()},
                        statuses=(ToolCallStatus.IN_PROGRESS,),
                        owner=found.owner,
                        attempts=found.attempts,
                    )
                    if marked:
                        raise ToolOutcomeUnknown(key, tool, found.owner)
            else:
                if deadline is None:
                    deadline = loop.time() + once.wait
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise ToolInProgress(key, tool, found.owner, once.wait)
                await asyncio.sleep(min(pause, remaining))
                pause = min(pause * 2, _POLL_MAX)
        elif status == ToolCallStatus.UNKNOWN:
            if not once.rerun_if_unknown:
                raise ToolOutcomeUnknown(key, tool, found.owner)
            takeover = True
        else:  # compensating, compensated, compensation_failed
            raise IdempotencyConflict(
                key,
                tool,
                "its effect was abandoned by a rollback and is " + status.value.replace("_", " "),
            )
        if takeover:
            attempt = found.attempts + 1
            now = utcnow()
            won = await ledger.update(
                key,
                {
                    "status": ToolCallStatus.IN_PROGRESS,
                    "owner": me,
                    "lease_until": now + timedelta(seconds=once.lease),
                    "attempts": attempt,
                    "updated_at": now,
                },
                statuses=(status,),
                owner=found.owner,
                attempts=found.attempts,
            )
            if won:
                if status != ToolCallStatus.RETRYABLE:
                    logger.warning(
                        "tool %r: running key %s again after an unknown outcome (the tool "
                        "declares rerun_if_unknown)",
                        tool,
                        key,
                    )
                return await _run_claimed(once, attempt)
        again = await ledger.get(key)
        if again is None:  # nothing deletes entries; only a hand-edited ledger gets here
            raise NotFoundError("ledger entry", key)
        found = again


async def _known(ledger: Ledger, pending: Unrecorded, kept: PendingOutcomes) -> Outcome:
    """Repeat a call whose outcome this process knows and the ledger does not yet."""
    try:
        await pending.record(ledger)
    except StoreError as exc:
        logger.warning("tool %r: key %s still not recorded: %s", pending.tool, pending.key, exc)
    else:
        kept.recorded(pending.key)
    if pending.failure is not None:
        failure = pending.failure
        raise ToolFailed(
            pending.tool,
            pending.key,
            failure.error_type,
            failure.detail,
            replayed=True,
            attempts=failure.attempts,
        )
    assert pending.outcome is not None
    return pending.outcome._replace(replayed=True)


def _replay(once: _Once, entry: LedgerEntry) -> Outcome:
    if entry.status == ToolCallStatus.FAILED:
        error_type, _, detail = (entry.error or "Error: unknown").partition(": ")
        raise ToolFailed(
            once.tool, entry.key, error_type, detail, replayed=True, attempts=entry.attempts
        )
    value = once.load(entry.result) if once.load is not None else entry.result
    return Outcome(value, entry.result, entry.attempts, replayed=True)


async def _run_claimed(once: _Once, attempt: int) -> Outcome:
    """Run the call under a claim this process won, and record its outcome."""
    try:
        try:
            outcome = await once.call(attempt)
        except (ToolFailed, ToolOutcomeUnknown):
            raise
        except Exception as exc:
            raise ToolFailed(once.tool, once.key, type(exc).__name__, str(exc)) from exc
    except ToolFailed as failed:
        # The ledger's count, the attempts of earlier claims included, as a success reports.
        failed.attempts = attempt - 1 + failed.attempts
        status = ToolCallStatus.RETRYABLE if failed.transient else ToolCallStatus.FAILED
        await _record(
            once,
            attempt,
            {
                "status": status,
                "error": f"{failed.error_type}: {failed.detail}",
                "attempts": failed.attempts,
                "owner": None,
                "lease_until": None,
            },
            failure=failed,
        )
        raise
    except BaseException:
        # Cancelled (or interrupted) while the call ran, or the call itself found it cannot
        # tell what an earlier attempt did (ToolOutcomeUnknown): whether the effect happened
        # is unknown, and saying so at once spares other callers the wait for the lease.
        await _shielded(
            once.ledger.update(
                once.key,
                {"status": ToolCallStatus.UNKNOWN, "updated_at": utcnow()},
                statuses=(ToolCallStatus.IN_PROGRESS,),
                owner=owner_id(),
                attempts=attempt,
            )
        )
        raise
    ran = attempt - 1 + outcome.attempts
    outcome = outcome._replace(attempts=ran, replayed=False)
    await _record(
        once,
        attempt,
        {
            "status": ToolCallStatus.SUCCEEDED,
            "result": outcome.result,
            "attempts": ran,
            "owner": None,
            "lease_until": None,
        },
        outcome=outcome,
    )
    return outcome


async def _record(
    once: _Once,
    attempt: int,
    change: Change,
    *,
    outcome: Outcome | None = None,
    failure: ToolFailed | None = None,
) -> None:
    """Record the outcome of a call that ran; kept in memory if the ledger is away.

    The effect has happened either way: the caller gets its outcome, and the record is
    written later (see ``Unrecorded``) rather than the work being lost.
    """
    key = once.key
    change["updated_at"] = utcnow()
    try:
        done = await once.ledger.update(
            key,
            change,
            statuses=(ToolCallStatus.IN_PROGRESS, ToolCallStatus.UNKNOWN),
            owner=owner_id(),
            attempts=attempt,
        )
    except StoreError as exc:
        logger.error(
            "tool %r: the outcome of key %s happened but is not recorded yet; it is kept "
            "and written later: %s",
            once.tool,
            key,
            exc,
        )
        once.pending.keep(
            Unrecorded(
                once.run_id,
                key,
                once.tool,
                once.fingerprint,
                attempt,
                change,
                outcome,
                failure,
                once.ledger,
            )
        )
        return
    if not done:
        logger.warning(
            "tool %r: the outcome of key %s was not recorded, because another caller took "
            "the key over or a person resolved it meanwhile",
            once.tool,
            key,
        )


async def _shielded(update: Awaitable[bool]) -> None:
    """Run a ledger update even while the caller is being cancelled; never raise."""
    task = asyncio.ensure_future(update)
    try:
        await asyncio.shield(task)
    except BaseException:  # best effort: the lease covers a lost update
        logger.warning("could not mark a cancelled tool call as unknown in the ledger")


def _short_json(value: JsonValue) -> str:
    text = canonical_json(value)
    return text if len(text) <= 120 else f"{text[:117]}..."


# -- the tools a runtime knows --------------------------------------------------------------


class Compensable(Protocol):
    """A tool as [`KnownTools`][agentsnap.once.KnownTools] and ``reconcile`` see it."""

    @property
    def name(self) -> str:
        """Name of the tool, as the ledger records it."""

    @property
    def compensates(self) -> bool:
        """Whether the tool declares a compensating action."""

    async def compensation(self, entry: LedgerEntry) -> JsonValue:
        """Run the compensating action for an abandoned entry; return its result as JSON."""


class KnownTools(Mapping[str, Compensable]):
    """The tools one runtime knows, by name: each added when first called, or declared.

    Two different tools with one name in one runtime are a mistake (their calls would share
    keys and compensations), so adding the second raises; the same tool may be added any
    number of times. Tools of one name in different runtimes are independent.
    """

    __slots__ = ("_tools",)

    def __init__(self, tools: Iterable[Compensable] = ()) -> None:
        self._tools: dict[str, Compensable] = {}
        for tool in tools:
            self.add(tool)

    def add(self, tool: Compensable) -> None:
        """Know ``tool`` under its name.

        Raises:
            ConfigurationError: Another tool of that name is known already.
        """
        found = self._tools.setdefault(tool.name, tool)
        if found is not tool:
            raise ConfigurationError(
                f"two different tools are named {tool.name!r} in one runtime ({found!r} and "
                f"{tool!r}); give one of them another name with @tool(name=...), since the "
                "ledger tells tools apart by name"
            )

    def __getitem__(self, name: str) -> Compensable:
        return self._tools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"KnownTools({sorted(self._tools)!r})"


# -- after the run --------------------------------------------------------------------------


async def reconcile(
    ledger: Ledger,
    run_id: str,
    states: Iterable[AgentState],
    tools: Mapping[str, Compensable] | None = None,
    *,
    store: RunLeases | None = None,
) -> list[LedgerEntry]:
    """Mark the run's effects that no agent's final state holds as abandoned; compensate them.

    A call that succeeded on a path a rollback discarded, and that the re-executed path did
    not repeat (same key), is no longer part of the run: it becomes ``abandoned``. When its
    tool is in ``tools`` and declares ``compensate``, the compensating action runs once (the
    entry is claimed as ``compensating`` first, so two reconciliations never both run it) and
    the entry ends ``compensated`` or ``compensation_failed`` with the action's result or
    error. An abandoned entry whose tool is not in ``tools`` stays ``abandoned``, to be
    compensated by a later reconciliation that knows its tool. The runtime calls this when
    it closes, with the tools it knows.

    Args:
        ledger: The run's ledger.
        run_id: Id of the run.
        states: The final state of every agent of the run.
        tools: Tools by name (default: none, so nothing is compensated).
        store: The run's store: with it, claims whose owner lost the run (its lease expired
            or passed on) are marked ``unknown`` too, besides those of dead processes.

    Returns:
        The entries this call changed, as they ended (claims found orphaned first).
    """
    changed: list[LedgerEntry] = list(await mark_orphaned(ledger, store, run_id))
    kept = {call.key for state in states for call in state.tool_calls if call.key is not None}
    known: Mapping[str, Compensable] = {} if tools is None else tools
    me = owner_id()
    for entry in await ledger.list_calls(run_id):
        if entry.key in kept:
            continue
        current = entry
        if entry.status == ToolCallStatus.SUCCEEDED:
            now = utcnow()
            change: Change = {"status": ToolCallStatus.ABANDONED, "updated_at": now}
            if not await ledger.update(entry.key, change, statuses=(ToolCallStatus.SUCCEEDED,)):
                continue
            current = dataclasses.replace(entry, status=ToolCallStatus.ABANDONED, updated_at=now)
            logger.info("tool %r: key %s was abandoned by a rollback", entry.tool, entry.key)
        elif entry.status != ToolCallStatus.ABANDONED:
            continue
        found = known.get(entry.tool)
        if found is None or not found.compensates:
            if current is not entry:
                changed.append(current)
            continue
        compensated = await compensate(ledger, current, found, me)
        if compensated is not None:
            changed.append(compensated)
    return changed


async def compensate(
    ledger: Ledger, entry: LedgerEntry, tool: Compensable, me: str | None = None
) -> LedgerEntry | None:
    """Run ``tool``'s compensating action for ``entry`` once, and record how it went.

    The entry (``abandoned``, or ``succeeded`` when a redo replaces its effect) is claimed as
    ``compensating`` first, so that two callers never both run the action.

    Returns:
        The entry as it ended, or ``None`` when another caller claimed it first.
    """
    me = me or owner_id()
    claimed = await ledger.update(
        entry.key,
        {"status": ToolCallStatus.COMPENSATING, "owner": me, "updated_at": utcnow()},
        statuses=(entry.status,),
    )
    if not claimed:
        return None
    try:
        outcome: JsonValue = {"result": await tool.compensation(entry)}
        status = ToolCallStatus.COMPENSATED
    except Exception as exc:
        outcome = {"error": f"{type(exc).__name__}: {exc}"}
        status = ToolCallStatus.COMPENSATION_FAILED
        logger.exception("tool %r: compensating key %s failed", entry.tool, entry.key)
    now = utcnow()
    await ledger.update(
        entry.key,
        {"status": status, "compensation": outcome, "owner": None, "updated_at": now},
        statuses=(ToolCallStatus.COMPENSATING,),
        owner=me,
    )
    return dataclasses.replace(
        entry, status=status, compensation=outcome, owner=None, updated_at=now
    )


async def effects_done(
    ledger: Ledger, run_id: str, agent: str, state: AgentState
) -> list[LedgerEntry]:
    """The effects ``agent`` had in the run that its (restored) ``state`` does not hold.

    After a rollback these are what the discarded path already did: they happened, and a
    redo of the same calls gets their recorded outcomes instead of running them again.
    """
    kept = {call.key for call in state.tool_calls if call.key is not None}
    return [
        entry
        for entry in await ledger.list_calls(run_id)
        if entry.agent == agent
        and entry.key not in kept
        and entry.status in (ToolCallStatus.SUCCEEDED, ToolCallStatus.ABANDONED)
    ]
