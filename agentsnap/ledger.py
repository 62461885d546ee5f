"""The ledger of side-effecting tool calls: its entries, its contract and idempotency keys.

A tool declared ``side_effect=True`` touches the outside world (charges a card, sends an
email), so it must not run twice for the same call, whatever happens to the run: a retry, a
rollback that re-executes the handler, a crash and a resume. Each such call has an
**idempotency key**, given by the caller (``key=``) or derived from the call's identity
([`call_key`][agentsnap.ledger.call_key]): the run, the agent, the message being handled,
the tool's name and the call's place among that tool's calls in the handler (or the
arguments the tool names with ``key_from``). A derived key names the call, not its
arguments: a handler re-executed with a model that words the call differently names the
same effect. The ledger records the fingerprint of the arguments (the SHA-256 of their
canonical JSON) beside the key, and the run's timeline. A **ledger** keyed by it decides
what happens, following Stripe's idempotency keys and the IETF Idempotency-Key draft:

* the key is claimed before the tool runs (status ``in_progress``, an owner, a lease) and the
  outcome is recorded after;
* a key whose outcome is recorded returns the recorded result (or raises the recorded final
  error, as [`ToolFailed`][agentsnap.ToolFailed]) without running the tool;
* an explicit key reused with other arguments is an
  [`IdempotencyConflict`][agentsnap.IdempotencyConflict]; a derived key met again with other
  arguments is a redo (after a rollback: the recorded outcome stands, unless the tool
  declares ``on_redo``) or a divergence (after a resume, on the same timeline:
  [`EffectDiverged`][agentsnap.EffectDiverged], unless the tool declares
  ``on_divergence="recorded"``); the effect never runs a second time implicitly;
* a key in progress elsewhere is waited for, up to the tool's ``wait``, then
  [`ToolInProgress`][agentsnap.ToolInProgress];
* a key claimed by an owner that stopped before recording an outcome has an unknown outcome:
  it is run again only when the tool declares ``rerun_if_unknown=True`` (it hands its key to
  the service, which deduplicates), otherwise
  [`ToolOutcomeUnknown`][agentsnap.ToolOutcomeUnknown] asks a person to
  [`resolve`][agentsnap.ledger.resolve] it;
* errors the tool declares ``transient`` are retried with tenacity under the same key and
  are never cached; successes and other (final) errors are.

The ledger is never rolled back. A handler re-executed after a rollback derives the same
keys for the calls it makes at the same places and gets their recorded results; the calls the
new path does not repeat are marked ``abandoned`` by
[`reconcile`][agentsnap.once.reconcile] when the run ends, and a tool's ``compensate`` action
runs once for each of them.

This module holds what the ledger records ([`LedgerEntry`][agentsnap.ledger.LedgerEntry],
[`ToolCallStatus`][agentsnap.ledger.ToolCallStatus]), the [`Ledger`][agentsnap.ledger.Ledger]
protocol every ledger follows, who owns a claim, how keys are made, and
[`resolve`][agentsnap.ledger.resolve]. The state machine that follows these rules for one
call is [`run_once`][agentsnap.once.run_once], in [`agentsnap.once`][agentsnap.once] with
[`reconcile`][agentsnap.once.reconcile]; the tools that use it are in
[`agentsnap.tools`][agentsnap.tools].
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import typing
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, Required, TypedDict, Unpack

from agentsnap import liveness
from agentsnap.exceptions import ConfigurationError, NotFoundError
from agentsnap.limits import MAX_IDEMPOTENCY_KEY, check_text
from agentsnap.records import utcnow
from agentsnap.state import canonical_json

if TYPE_CHECKING:
    from agentsnap.messages import JsonValue
    from agentsnap.records import RunLease
    from agentsnap.store import RunLeases

__all__ = [
    "Change",
    "Ledger",
    "LedgerEntry",
    "ToolCallStatus",
    "call_key",
    "check_key",
    "fingerprint",
    "is_orphaned",
    "mark_orphaned",
    "orphaned",
    "owner_id",
    "resolve",
]

MAX_KEY_LENGTH = MAX_IDEMPOTENCY_KEY
"""Longest idempotency key the ledger holds (``agentsnap.limits.MAX_IDEMPOTENCY_KEY``)."""


# -- the ledger's data ----------------------------------------------------------------------


class ToolCallStatus(enum.StrEnum):
    """Where a ledger entry stands."""

    IN_PROGRESS = "in_progress"
    """Claimed; the tool is running (or its owner stopped: see ``lease_until``)."""
    SUCCEEDED = "succeeded"
    """The tool returned; ``result`` holds what it returned."""
    FAILED = "failed"
    """The tool raised a final error; ``error`` says what it was."""
    RETRYABLE = "retryable"
    """The tool kept raising a declared transient error; the next call runs it again."""
    UNKNOWN = "unknown"
    """Claimed, and its owner stopped before recording an outcome: a person must resolve it."""
    ABANDONED = "abandoned"
    """Succeeded on a path of the run that a rollback discarded."""
    COMPENSATING = "compensating"
    """Abandoned, and the tool's compensating action is running."""
    COMPENSATED = "compensated"
    """Abandoned, and the compensating action returned; ``compensation`` holds its result."""
    COMPENSATION_FAILED = "compensation_failed"
    """Abandoned, and the compensating action raised; ``compensation`` holds the error."""
    DRY = "dry"
    """A call of a run whose tools are dry (a what-if fork): recorded with its arguments,
    the tool did not run; ``result`` holds the stand-in the call returned."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One side-effecting tool call in the ledger."""

    key: str
    """Idempotency key (the primary key)."""
    tool: str
    """Name of the tool."""
    fingerprint: str
    """SHA-256 of the canonical JSON of the arguments."""
    arguments: dict[str, JsonValue]
    """Arguments as JSON."""
    status: ToolCallStatus
    """Where the call stands."""
    created_at: datetime
    """When the key was first claimed."""
    updated_at: datetime
    """When the entry last changed."""
    run_id: str | None = None
    """The run that made the call (``None`` for a call made outside a run)."""
    agent: str | None = None
    """The agent that made the call."""
    message_id: str | None = None
    """The message whose handler made the call."""
    owner: str | None = None
    """Who claimed it last (``host:pid:token``)."""
    lease_until: datetime | None = None
    """Until when the owner's claim holds; after that, without an outcome, it is unknown."""
    attempts: int = 1
    """How many times the tool ran under this key, retries included."""
    result: JsonValue = None
    """The tool's result as JSON, once it succeeded."""
    error: str | None = None
    """The last error, as ``"TypeName: message"``."""
    compensation: JsonValue = None
    """``{"result": …}`` or ``{"error": …}`` of the compensating action, once it ran."""
    timeline: int | None = None
    """The run's timeline when the key was first claimed (a rollback starts a new one):
    a re-executed call at the same key tells a redo after a rollback (an earlier timeline)
    from a re-execution after a crash (the same timeline)."""
    note: JsonValue = None
    """A progress note the running call kept with its claim
    ([`ToolCall.note`][agentsnap.ToolCall.note]): what a call taken over after its owner
    stopped needs to go on instead of starting the effect again (a remote job's id)."""


class Change(TypedDict, total=False):
    """The columns a ledger update sets (absent keys are left as they are)."""

    status: ToolCallStatus
    owner: str | None
    lease_until: datetime | None
    attempts: int
    result: JsonValue
    error: str | None
    compensation: JsonValue
    note: JsonValue
    updated_at: datetime


class Expected(TypedDict, total=False):
    """What a ledger update compares before it sets: the keywords of
    [`Ledger.update`][agentsnap.ledger.Ledger.update] after the change.
    """  # noqa: D205

    statuses: Required[Collection[ToolCallStatus]]
    """The statuses the entry may be in."""
    owner: str | None
    """When given (and not ``None``), the entry's owner must be this."""
    attempts: int | None
    """When given (and not ``None``), the entry's attempts must be this."""


@typing.runtime_checkable
class Ledger(Protocol):
    """Where side-effecting tool calls are recorded, keyed by idempotency key.

    Every method is atomic on its own; the rules (what a status means, who may change it)
    live in this module and in [`agentsnap.once`][agentsnap.once], not in the
    implementations, so every ledger behaves alike. Implementations:
    [`MemoryLedger`][agentsnap.store.ledger.MemoryLedger] and
    [`SqlLedger`][agentsnap.store.sql_ledger.SqlLedger].

    A ledger in the store's database checks the run's lease through ``fence`` (see
    [`SqlLedger.fence`][agentsnap.store.sql_ledger.SqlLedger.fence] and
    [`RunOwnership.fence_ledger`][agentsnap.ownership.RunOwnership.fence_ledger]); one that
    cannot see the lease does nothing there.
    """

    async def claim(self, entry: LedgerEntry) -> LedgerEntry | None:
        """Insert ``entry`` if no entry has its key.

        Returns:
            ``None`` when ``entry`` was inserted (the caller owns the key), else the entry
            already there.
        """

    async def get(self, key: str) -> LedgerEntry | None:
        """The entry with this key, or ``None``."""

    async def update(self, key: str, change: Change, **expected: Unpack[Expected]) -> bool:
        """Apply ``change`` if the entry's status is one of ``statuses`` (compare and set).

        An implementation may spell the keywords of [`Expected`][agentsnap.ledger.Expected]
        out: ``*, statuses, owner=None, attempts=None``.

        Args:
            key: The entry's key.
            change: The columns to set.
            **expected: ``statuses=``, the statuses the entry may be in (required);
                ``owner=``, when given, the entry's owner must be this; ``attempts=``, when
                given, the entry's attempts must be this.

        Returns:
            Whether the entry was changed.
        """

    async def list_calls(self, run_id: str | None = None) -> list[LedgerEntry]:
        """Every entry (of one run, when ``run_id`` is given), oldest first."""

    def fence(self, run_id: str, token: int) -> None:
        """Refuse claims and updates of ``run_id``'s entries once its lease has another token.

        From then on they raise [`OwnershipLost`][agentsnap.OwnershipLost]. A ledger that
        cannot see the run's lease (one outside the store's database) does nothing.
        """

    async def close(self) -> None:
        """Release connections."""


# -- identity -------------------------------------------------------------------------------


def owner_id() -> str:
    """Who this process is in the ledger: ``host:pid:token``, new in every process."""
    return liveness.owner_id()


# -- keys -----------------------------------------------------------------------------------


def fingerprint(arguments: Mapping[str, JsonValue]) -> str:
    """SHA-256 (hex) of the canonical JSON of a call's arguments."""
    return hashlib.sha256(canonical_json(dict(arguments)).encode()).hexdigest()


def call_key(  # noqa: PLR0917
    run_id: str,
    agent: str,
    message_id: str,
    tool: str,
    place: int | Mapping[str, JsonValue],
    variant: str | None = None,
) -> str:
    """The idempotency key of a side-effecting call made from a handler, when the caller
    gives none: it names the call, not its arguments.

    A re-execution of the handler (after a rollback, or a crash and a resume) that makes
    the call at the same place derives the same key, whatever the wording of its arguments:
    the ledger then holds the effect that happened, with the arguments it ran with, and
    decides (see ``Tool``'s ``on_redo`` and ``on_divergence``).

    Args:
        run_id: Id of the run.
        agent: Name of the calling agent.
        message_id: Id of the message being handled.
        tool: Name of the tool.
        place: The call's place: how many calls of the same tool with side effects the
            handler made for this message before this one, or the values of the arguments
            the tool names as its effect's identity (``key_from``).
        variant: Only for a redo's call that is an effect of its own (``on_redo="new"`` or
            ``"compensate"``): the fingerprint of its arguments, so that the same redo after
            a later rollback names the same effect again.

    Returns:
        32 hex digits.
    """  # noqa: D205
    parts: list[JsonValue] = ["call", run_id, agent, message_id, tool]
    parts.append(place if isinstance(place, int) else dict(place))
    if variant is not None:
        parts.append(variant)
    return hashlib.sha256(canonical_json(parts).encode()).hexdigest()[:32]


def check_key(key: str) -> str:
    """Check an idempotency key given by a caller, and return it.

    Raises:
        ConfigurationError: The key is not a string of 1 to ``MAX_KEY_LENGTH`` characters,
            or holds the NUL character or a lone surrogate.
    """
    return check_text(
        key,
        "the idempotency key",
        MAX_KEY_LENGTH,
        f"pass key= a string of 1 to {MAX_KEY_LENGTH} characters naming this effect (a hash "
        "of a longer one will do)",
    )


# -- after the run --------------------------------------------------------------------------


_UNSET: Any = object()


async def resolve(
    ledger: Ledger,
    key: str,
    *,
    result: JsonValue = _UNSET,
    error: str | None = None,
    retry: bool = False,
) -> LedgerEntry:
    """Record the outcome of a call whose outcome is unknown, once a person has checked it.

    Pass ``result`` when the effect happened (later calls with the key get it back),
    ``error`` when it did not (later calls raise it as a final failure), or ``retry=True``
    when it did not and should be tried again (the next call with the key runs the tool, as
    after a transient error).

    Args:
        ledger: The ledger holding the key.
        key: The idempotency key.
        result: The result the tool would have returned, as JSON.
        error: What went wrong, when the effect did not happen.
        retry: The effect did not happen: run the tool again at the next call.

    Returns:
        The entry as recorded.

    Raises:
        ConfigurationError: Not exactly one of ``result``, ``error`` and ``retry`` given, or
            the entry's outcome is not unknown.
        NotFoundError: The ledger holds no such key.
    """
    if (result is not _UNSET) + (error is not None) + retry != 1:
        raise ConfigurationError("resolve() takes exactly one of result=, error= and retry=True")
    entry = await ledger.get(key)
    if entry is None:
        raise NotFoundError("ledger entry", key, f"the ledger holds no tool call with key {key!r}")
    resolvable = (ToolCallStatus.UNKNOWN, ToolCallStatus.IN_PROGRESS)
    if entry.status not in resolvable:
        raise ConfigurationError(
            f"tool call {key!r} is {entry.status.value}, its outcome is known; only an unknown "
            "(or stuck in-progress) call can be resolved"
        )
    now = utcnow()
    change: Change = {"owner": None, "lease_until": None, "updated_at": now}
    if retry:
        change["status"] = ToolCallStatus.RETRYABLE
        change["error"] = "ResolvedRetry: a person found the effect did not happen"
    elif error is not None:
        change["status"] = ToolCallStatus.FAILED
        change["error"] = f"ResolvedFailure: {error}"
    else:
        canonical_json(result)
        change["status"] = ToolCallStatus.SUCCEEDED
        change["result"] = result
    if not await ledger.update(key, change, statuses=(entry.status,), attempts=entry.attempts):
        raise ConfigurationError(f"tool call {key!r} changed while it was being resolved; retry")
    found = await ledger.get(key)
    assert found is not None
    return found


# -- claims whose owner stopped -------------------------------------------------------------


def is_orphaned(entry: LedgerEntry, lease: RunLease | None, now: datetime) -> bool:
    """Whether a claim is in progress but its owner stopped, so that its outcome is unknown.

    That is an entry ``in_progress`` whose owner is a process of this host that no longer
    runs, or whose own lease (``lease_until``) has expired, or whose run's lease has expired
    or is held by another owner than the claim's (the run was taken over). Claims and run
    leases name their owner alike (``host:pid:token``, from
    [`owner_id`][agentsnap.ledger.owner_id]), which is how a claim is tied to its run's
    owner.

    Args:
        entry: A ledger entry.
        lease: The lease of the entry's run, as it stands; ``None`` when the run has none
            (or the entry belongs to no run): then the claim's own owner and lease decide.
        now: The present, timezone-aware.
    """
    if entry.status is not ToolCallStatus.IN_PROGRESS:
        return False
    if entry.lease_until is None or entry.lease_until <= now:
        return True
    if liveness.owner_is_gone(entry.owner):
        return True
    return lease is not None and (lease.expires_at <= now or lease.owner != entry.owner)


async def orphaned(ledger: Ledger, store: RunLeases | None, run_id: str) -> list[LedgerEntry]:
    """The run's claims in progress whose owner stopped (see
    [`is_orphaned`][agentsnap.ledger.is_orphaned]), oldest first; nothing is changed.

    Args:
        ledger: The run's ledger.
        store: The run's store, which holds its lease; ``None`` to judge each claim by its
            own owner and lease only.
        run_id: The run.
    """  # noqa: D205
    entries = await ledger.list_calls(run_id)
    if not any(entry.status is ToolCallStatus.IN_PROGRESS for entry in entries):
        return []
    lease = None if store is None else await store.get_lease(run_id)
    now = utcnow()
    return [entry for entry in entries if is_orphaned(entry, lease, now)]


async def mark_orphaned(ledger: Ledger, store: RunLeases | None, run_id: str) -> list[LedgerEntry]:
    """Record as ``unknown`` the run's claims whose owner stopped, and return them so.

    Each is changed by compare-and-set (still in progress, same owner, same attempts), so a
    claim whose owner records its outcome meanwhile keeps that outcome. A person settles an
    unknown outcome with [`resolve`][agentsnap.ledger.resolve].

    Args:
        ledger: The run's ledger.
        store: The run's store, which holds its lease (``None``: see
            [`orphaned`][agentsnap.ledger.orphaned]).
        run_id: The run.

    Returns:
        The entries this call marked, as they are now.
    """
    marked: list[LedgerEntry] = []
    for entry in await orphaned(ledger, store, run_id):
        now = utcnow()
        change: Change = {"status": ToolCallStatus.UNKNOWN, "updated_at": now}
        if await ledger.update(
            entry.key,
            change,
            statuses=(ToolCallStatus.IN_PROGRESS,),
            owner=entry.owner,
            attempts=entry.attempts,
        ):
            marked.append(dataclasses.replace(entry, status=ToolCallStatus.UNKNOWN, updated_at=now))
    return marked
