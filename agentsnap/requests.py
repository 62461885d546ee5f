"""Requests to people: a question or an approval, a durable step a handler waits on.

A handler asks a person through its context (``await ctx.ask(question)``), and a
side-effecting tool declared ``approval=`` asks for an approval before its call is claimed
in the ledger. Either way a [`HumanRequest`][agentsnap.requests.HumanRequest] is written to
the store before the handler waits, keyed by the step's identity, as a model call is (see
[`agentsnap.model_calls`][agentsnap.model_calls]):

* the run, the agent and the message being handled;
* its **position** among the recorded steps of that handler execution (model calls and
  requests share the count);
* the run's **timeline**.

The request's id is derived from that identity, so a handler re-executed after a crash and
``resume()`` asks at the same place and finds its request, answered or not, instead of
asking again. The answer is given from any process (``agentsnap answer``, the
[`agentsnap.inspect`][agentsnap.inspect] functions, the inspector's HTTP API), written to
the same row; the waiting handler reads it by polling the store with a growing interval,
and at once when the answer was given in its own process.

A rollback starts a new timeline and withdraws the requests of the timeline it discarded
that are still pending: answering one raises
[`RequestNotPending`][agentsnap.RequestNotPending]. The redone handler asks again, under a
new id.

A [`RequestLog`][agentsnap.requests.RequestLog] keeps the requests; the ledgers
([`MemoryLedger`][agentsnap.store.ledger.MemoryLedger] and
[`SqlLedger`][agentsnap.store.sql_ledger.SqlLedger]) are request logs too, so a run's
requests live in the database of its tool calls and model calls.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, TypedDict, Unpack

from agentsnap.exceptions import (
    AnswerInvalid,
    ConfigurationError,
    NotFoundError,
    RequestNotPending,
    StoreError,
)
from agentsnap.messages import JsonValue
from agentsnap.records import Snapshot, utcnow

__all__ = [
    "APPROVAL",
    "QUESTION",
    "Approval",
    "ApprovalPolicy",
    "HumanRequest",
    "OnDeadline",
    "RequestLog",
    "RequestStatus",
    "answer_request",
    "approval_of",
    "approval_question",
    "approval_rules",
    "carry_requests",
    "check_answer",
    "deadline_of",
    "request_id",
    "wait_for_answer",
    "wake",
    "withdraw_discarded",
]

logger = logging.getLogger("agentsnap")

RequestStatus = Literal["pending", "answered", "rejected", "expired", "withdrawn"]
"""What became of a request: waiting (``pending``), ``answered``, turned down
(``rejected``), past its deadline with its declared outcome applied (``expired``), or
discarded by a rollback (``withdrawn``)."""

OnDeadline = Literal["default", "reject", "fail"]
"""What happens when a request's deadline passes unanswered: the handler gets the request's
``default`` answer (``"default"``; for an approval, its ``default`` says whether the call is
approved), the request is turned down (``"reject"``: ``RequestRejected`` from ``ask``,
``ApprovalDenied`` from a tool), or the handler fails with ``RequestExpired`` and so the run
fails (``"fail"``)."""

QUESTION = "question"
"""The kind of a request made with ``ctx.ask``: any JSON answer."""
APPROVAL = "approval"
"""The kind of a request for an approval: approve or deny, with a reason."""


@dataclass(frozen=True, slots=True)
class Approval:
    """When a side-effecting call needs a person's approval, and how it is asked.

    ``@tool(side_effect=True, approval=...)`` and ``Runtime(approvals={tool: ...})`` take
    one, or just its ``when``: ``True``, or a predicate.
    """

    when: bool | Callable[[dict[str, Any]], bool] = True
    """Always (``True``), never (``False``), or when a predicate on the call's arguments (as
    JSON) returns true."""
    who: str | None = None
    """Who may approve, a free label shown with the request."""
    deadline: float | timedelta | None = None
    """Seconds (or a ``timedelta``) after the request is asked when ``on_deadline`` applies."""
    on_deadline: OnDeadline = "reject"
    """What an unanswered deadline does: ``"reject"`` (a denial, the default), ``"default"``
    (``default`` decides), or ``"fail"`` (the handler fails, and so the run)."""
    default: bool = False
    """Whether the call is approved when the deadline passes with ``on_deadline="default"``."""

    def needed(self, arguments: dict[str, Any]) -> bool:
        """Whether a call with ``arguments`` needs approval."""
        when = self.when
        return bool(when(arguments)) if callable(when) else bool(when)


ApprovalPolicy = bool | Callable[[dict[str, Any]], bool] | Approval
"""Whether a side-effecting call needs approval: ``True``, ``False``, a predicate on the
call's arguments (as JSON), or an [`Approval`][agentsnap.requests.Approval]."""


def approval_of(policy: ApprovalPolicy | None) -> Approval | None:
    """``policy`` as an [`Approval`][agentsnap.requests.Approval] (``None`` or ``False``: none).

    Raises:
        ConfigurationError: ``policy`` is none of the accepted forms.
    """
    if policy is None or policy is False:
        return None
    if isinstance(policy, Approval):
        return policy
    if policy is True or callable(policy):
        return Approval(when=policy)
    raise ConfigurationError(
        f"approval= takes True, a predicate on the call's arguments, or an Approval, got {policy!r}"
    )


def approval_rules(policy: Mapping[str, ApprovalPolicy] | None) -> dict[str, Approval]:
    """A run's approval policy (by tool name), each tool's rule as an ``Approval``.

    Raises:
        ConfigurationError: A rule is none of the forms ``approval_of`` takes.
    """
    rules: dict[str, Approval] = {}
    for tool, rule in (policy or {}).items():
        approval = approval_of(rule)
        if approval is not None:
            rules[tool] = approval
    return rules


_STEP_ID_CHARS = 24
_DEADLINE_BY = "deadline"
"""``answered_by`` of an outcome the deadline applied."""


def request_id(run_id: str, agent: str, message_id: str, position: int, timeline: int) -> str:
    """The id of the request asked at this identity: 24 hex digits of its SHA-256.

    The same handler asking at the same place on the same timeline gets the same id, in any
    process, so a re-executed handler finds its request.
    """
    text = "\x1f".join((run_id, agent, message_id, str(position), str(timeline)))
    return hashlib.sha256(text.encode()).hexdigest()[:_STEP_ID_CHARS]


def deadline_of(deadline: float | timedelta | datetime | None, now: datetime) -> datetime | None:
    """An absolute deadline: ``deadline`` seconds (or a ``timedelta``) after ``now``, or as given.

    Raises:
        ConfigurationError: A negative duration, or a datetime without a time zone.
    """
    if deadline is None:
        return None
    if isinstance(deadline, datetime):
        if deadline.tzinfo is None:
            raise ConfigurationError(
                "a request's deadline is a datetime with a time zone (datetime.now(UTC) + ...), "
                "or seconds from now"
            )
        return deadline
    span = deadline if isinstance(deadline, timedelta) else timedelta(seconds=float(deadline))
    if span < timedelta(0):
        raise ConfigurationError(f"a request's deadline is in the future, got {deadline!r}")
    return now + span


@dataclass(frozen=True, slots=True)
class HumanRequest:
    """A request to a person, as the store keeps it.

    ``(run_id, agent, message_id, position, timeline)`` is its identity, and ``id`` is
    derived from it ([`request_id`][agentsnap.requests.request_id]).
    """

    id: str
    """The request's id, what ``agentsnap answer`` takes."""
    run_id: str
    """The run."""
    agent: str
    """The agent whose handler asked."""
    message_id: str
    """The message the handler was handling."""
    position: int
    """How many recorded steps (model calls, requests) the handler made before this one."""
    timeline: int
    """The run's timeline when it was asked (a rollback starts a new one)."""
    kind: str
    """``"question"`` (``ctx.ask``) or ``"approval"`` (a side-effecting call waiting)."""
    question: JsonValue
    """What is asked: text, or any JSON; for an approval, ``{"tool", "arguments", "key"}``."""
    asked_at: datetime
    """When it was asked."""
    schema: dict[str, JsonValue] | None = None
    """JSON Schema an answer must fit (``None``: any JSON)."""
    who: str | None = None
    """Who may answer, a free label (a team, a role, a person)."""
    deadline: datetime | None = None
    """When ``on_deadline`` applies if nobody answered."""
    on_deadline: OnDeadline = "fail"
    """What the deadline does (see [`OnDeadline`][agentsnap.requests.OnDeadline])."""
    default: JsonValue = None
    """The answer the deadline gives, with ``on_deadline="default"``."""
    status: RequestStatus = "pending"
    """What became of it."""
    answer: JsonValue = None
    """The answer; for an approval ``{"approved": bool, "reason": text or null}``."""
    reason: str | None = None
    """Why it was rejected or withdrawn, or the reason given with an approval."""
    answered_by: str | None = None
    """Who answered (as they said), ``"deadline"``, or the rollback that withdrew it."""
    answered_at: datetime | None = None
    """When it stopped pending."""

    @property
    def pending(self) -> bool:
        """Whether it waits for an answer."""
        return self.status == "pending"

    @property
    def approved(self) -> bool:
        """For an answered approval: whether the call was approved."""
        answer = self.answer
        return isinstance(answer, dict) and answer.get("approved") is True

    def to_json(self) -> dict[str, JsonValue]:
        """The request as JSON (what ``agentsnap requests --json`` prints)."""
        return {
            "id": self.id,
            "run_id": self.run_id,
            "agent": self.agent,
            "message_id": self.message_id,
            "position": self.position,
            "timeline": self.timeline,
            "kind": self.kind,
            "question": self.question,
            "schema": self.schema,
            "who": self.who,
            "deadline": None if self.deadline is None else self.deadline.isoformat(),
            "on_deadline": self.on_deadline,
            "default": self.default,
            "status": self.status,
            "answer": self.answer,
            "reason": self.reason,
            "answered_by": self.answered_by,
            "asked_at": self.asked_at.isoformat(),
            "answered_at": None if self.answered_at is None else self.answered_at.isoformat(),
        }


class Settlement(TypedDict):
    """How a request is closed: the keywords of
    [`RequestLog.settle_request`][agentsnap.requests.RequestLog.settle_request] after the
    status.
    """  # noqa: D205

    answer: JsonValue
    """The answer (``None`` for none)."""
    reason: str | None
    """Why it was rejected or withdrawn, or the reason given with an approval."""
    by: str | None
    """Who closed it."""
    at: datetime
    """When."""


def settled_fields(status: RequestStatus, settlement: Settlement) -> dict[str, Any]:
    """The fields of a [`HumanRequest`][agentsnap.requests.HumanRequest] that closing it
    with ``status`` and ``settlement`` sets, by name.
    """  # noqa: D205
    return {
        "status": status,
        "answer": settlement["answer"],
        "reason": settlement["reason"],
        "answered_by": settlement["by"],
        "answered_at": settlement["at"],
    }


@typing.runtime_checkable
class RequestLog(Protocol):
    """Where a run's requests to people are kept.

    Implementations: [`MemoryLedger`][agentsnap.store.ledger.MemoryLedger] and
    [`SqlLedger`][agentsnap.store.sql_ledger.SqlLedger].
    """

    async def add_request(self, request: HumanRequest) -> HumanRequest:
        """Store ``request`` unless one with its id is stored; return the stored one.

        A re-executed handler asking at the same identity gets the request as it stands
        (perhaps answered), not its own copy.
        """

    async def find_request(self, request_id: str) -> HumanRequest | None:
        """The request with this id, or ``None``."""

    async def settle_request(
        self, request_id: str, status: RequestStatus, **settlement: Unpack[Settlement]
    ) -> bool:
        """Close a pending request: set its status, answer, reason, who and when.

        The keywords are those of [`Settlement`][agentsnap.requests.Settlement], all
        required; an implementation may spell them out: ``*, answer, reason, by, at``.

        Returns:
            Whether it was pending (and is now closed); ``False`` changes nothing.
        """

    async def withdraw_requests(
        self, run_id: str, before_timeline: int, *, by: str, at: datetime
    ) -> list[str]:
        """Withdraw the run's pending requests asked on a timeline before ``before_timeline``.

        Returns:
            The ids withdrawn.
        """

    async def list_requests(
        self, run_id: str | None = None, *, pending: bool = False
    ) -> list[HumanRequest]:
        """The requests of a run (of every run, with ``None``), oldest first; only the
        pending ones with ``pending``.
        """  # noqa: D205


WITHDRAWN = "a rollback discarded the timeline it was asked on"
"""The reason of a request that ``withdraw_requests`` closed."""


# -- waking waiters in this process ----------------------------------------------------------


class _Waiter:
    """One handler waiting on a request: the future its next wait ends with."""

    __slots__ = ("future", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] | None = None

    def ring(self) -> None:
        future = self.future
        if future is not None and not future.done():
            future.set_result(None)

    async def sleep(self, seconds: float) -> None:
        """Until ``seconds`` pass or ``ring`` is called, whichever comes first."""
        self.future = future = self.loop.create_future()
        # No asyncio.wait_for: before 3.12 it can swallow a cancellation that comes as the
        # wait ends, and a handler cancelled by a rollback or a close must stop.
        timer = self.loop.call_later(max(seconds, 0.0), self.ring)
        try:
            await future
        finally:
            timer.cancel()
            self.future = None


_waiting: dict[str, list[_Waiter]] = {}


def wake(request_id: str) -> None:
    """Tell the handlers of this process waiting on ``request_id`` that it changed.

    Safe from any thread; a handler in another process finds the change when it next polls.
    """
    for waiter in list(_waiting.get(request_id, ())):
        try:
            waiter.loop.call_soon_threadsafe(waiter.ring)
        except RuntimeError:  # its loop closed: nobody waits there any more
            continue


async def wait_for_answer(
    log: RequestLog,
    request: HumanRequest,
    *,
    first_poll: float = 0.05,
    max_poll: float = 2.0,
) -> HumanRequest:
    """Wait until ``request`` is no longer pending, and return it as it then stands.

    Polls the log, from ``first_poll`` seconds apart, doubling up to ``max_poll``, and wakes
    at once when [`wake`][agentsnap.requests.wake] is called for it in this process. When its
    deadline passes, this applies the request's ``on_deadline`` in the log (unless an answer
    got there first) and returns what the log then holds.

    Raises:
        StoreError: The log cannot be read (the handler fails and is redone from the last
            cut once the database answers; the request stays as it is).
        NotFoundError: The request is no longer stored (its run was deleted).
    """
    waiter = _Waiter(asyncio.get_running_loop())
    _waiting.setdefault(request.id, []).append(waiter)
    delay = first_poll
    try:
        current = request
        while current.pending:
            now = utcnow()
            deadline = current.deadline
            if deadline is not None and now >= deadline:
                await _apply_deadline(log, current, now)
            else:
                wait = delay if deadline is None else min(delay, (deadline - now).total_seconds())
                await waiter.sleep(wait)
                delay = min(delay * 2, max_poll)
            found = await log.find_request(current.id)
            if found is None:
                raise NotFoundError("request", current.id)
            current = found
        return current
    finally:
        waiters = _waiting.get(request.id)
        if waiters is not None:
            waiters.remove(waiter)
            if not waiters:
                del _waiting[request.id]


async def _apply_deadline(log: RequestLog, request: HumanRequest, now: datetime) -> None:
    outcome = request.on_deadline
    if outcome == "default":
        answer: JsonValue = request.default
        if request.kind == APPROVAL:
            answer = {"approved": request.default is True, "reason": "the deadline passed"}
        await log.settle_request(
            request.id, "expired", answer=answer, reason=None, by=_DEADLINE_BY, at=now
        )
    elif outcome == "reject":
        await log.settle_request(
            request.id,
            "rejected",
            answer=None,
            reason="the deadline passed unanswered",
            by=_DEADLINE_BY,
            at=now,
        )
    else:
        await log.settle_request(
            request.id, "expired", answer=None, reason=None, by=_DEADLINE_BY, at=now
        )


async def withdraw_discarded(log: object, run_id: str, timeline: int, rollback: str) -> list[str]:
    """After a rollback to ``timeline``: withdraw the run's requests of earlier timelines.

    ``log`` is the run's ledger; one that keeps no requests has none to withdraw. A database
    that does not answer leaves them pending (logged): nothing waits on them any more, and
    the redone handler asks again under a new id.

    Returns:
        The ids withdrawn.
    """
    if not isinstance(log, RequestLog):
        return []
    try:
        return await log.withdraw_requests(run_id, timeline, by=f"rollback {rollback}", at=utcnow())
    except StoreError as exc:
        logger.warning(
            "run %s: the requests of the timelines a rollback left could not be withdrawn: %s",
            run_id,
            exc,
        )
        return []


async def carry_requests(log: object, snapshot: Snapshot, run_id: str) -> list[HumanRequest]:
    """Copy the requests ``snapshot``'s cut holds into run ``run_id``, forked from it.

    A request is held by a cut when its handler's message is in flight there (a cut taken
    while a handler waits records the agent from before it): the fork's agent handles the
    message again, asks at the same place on the fork's first timeline, and finds the
    request. The copy is pending whatever became of the original after the cut; of several
    timelines' requests at one place, the newest one asked before the cut completed is
    copied. ``log`` is the ledger; one that keeps no requests has none to carry.

    Returns:
        The requests stored in the fork.
    """
    if not isinstance(log, RequestLog):
        return []
    in_flight = {
        (channel.dst, message.id) for channel in snapshot.channels for message in channel.messages
    }
    if not in_flight:
        return []
    until = snapshot.completed_at or snapshot.started_at
    newest: dict[tuple[str, str, int], HumanRequest] = {}
    for found in await log.list_requests(snapshot.run_id):
        place = (found.agent, found.message_id, found.position)
        if (found.agent, found.message_id) not in in_flight or found.asked_at > until:
            continue
        if place not in newest or newest[place].timeline < found.timeline:
            newest[place] = found
    carried = []
    for found in newest.values():
        copy = HumanRequest(
            id=request_id(run_id, found.agent, found.message_id, found.position, 0),
            run_id=run_id,
            agent=found.agent,
            message_id=found.message_id,
            position=found.position,
            timeline=0,
            kind=found.kind,
            question=found.question,
            asked_at=utcnow(),
            schema=found.schema,
            who=found.who,
            deadline=found.deadline,
            on_deadline=found.on_deadline,
            default=found.default,
        )
        carried.append(await log.add_request(copy))
    return carried


# -- answering -------------------------------------------------------------------------------


def check_answer(request: HumanRequest, answer: JsonValue) -> None:
    """Check ``answer`` against ``request``'s schema.

    Raises:
        AnswerInvalid: It does not fit, with the places and what is wrong.
        ConfigurationError: The request has a schema and ``jsonschema`` is not installed
            (``pip install 'agentsnap[ui]'``).
    """
    if request.schema is None:
        return
    try:
        import jsonschema  # noqa: PLC0415  # only answers to requests with a schema need it
    except ImportError:  # pragma: no cover - installed with the ui extra
        raise ConfigurationError(
            "checking an answer against its request's schema needs jsonschema: "
            "pip install 'agentsnap[ui]'"
        ) from None
    validator = jsonschema.Draft202012Validator(dict(request.schema))
    problems = [
        f"at {error.json_path}: {error.message}"
        for error in sorted(validator.iter_errors(answer), key=lambda e: list(e.path))
    ]
    if problems:
        raise AnswerInvalid(request.id, problems)


async def answer_request(
    log: RequestLog,
    request_id: str,
    *,
    answer: JsonValue = None,
    approve: bool | None = None,
    reason: str | None = None,
    by: str | None = None,
) -> HumanRequest:
    """Answer a pending request, from any process; return it as answered.

    A question takes ``answer`` (checked against its schema), or ``approve=False`` with a
    ``reason`` to turn it down. An approval takes ``approve=True`` or ``approve=False`` (a
    denial, best with a ``reason`` the agent can act on).

    Raises:
        NotFoundError: No request has this id.
        RequestNotPending: It was answered, expired, or withdrawn by a rollback.
        AnswerInvalid: The answer does not fit the request.
    """
    found = await log.find_request(request_id)
    if found is None:
        raise NotFoundError("request", request_id)
    if not found.pending:
        raise RequestNotPending(found.id, found.status)
    status: RequestStatus
    value: JsonValue
    if found.kind == APPROVAL:
        if approve is None:
            raise AnswerInvalid(
                found.id, ["an approval is answered with approve (--approve) or deny (--deny)"]
            )
        status, value = "answered", {"approved": approve, "reason": reason}
        if not approve:
            status = "rejected"
    elif approve is False:
        status, value = "rejected", None
    elif approve is True and answer is None:
        raise AnswerInvalid(
            found.id, ["a question is answered with a value (--json), not --approve"]
        )
    else:
        check_answer(found, answer)
        status, value = "answered", answer
    if status == "rejected" and not reason:
        reason = "denied" if found.kind == APPROVAL else "declined"
    settled = await log.settle_request(
        found.id, status, answer=value, reason=reason, by=by, at=utcnow()
    )
    after = await log.find_request(found.id)
    if after is None:
        raise NotFoundError("request", found.id)
    if not settled:
        raise RequestNotPending(after.id, after.status)
    wake(found.id)
    return after


def approval_question(tool: str, arguments: Mapping[str, JsonValue], key: str | None) -> JsonValue:
    """The question of an approval: the tool, its arguments and the call's key."""
    return {"tool": tool, "arguments": dict(arguments), "key": key}
