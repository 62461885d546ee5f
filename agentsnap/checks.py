"""Checks on agents' outputs: verdicts, declared checks, and the guard that applies them.

An agent's outgoing messages can be checked against a pydantic **schema** or a **check** (a
callable judging the message), declared with [`Runtime.check`][agentsnap.Runtime.check]; the
agent can also judge its own work in [`Agent.evaluate`][agentsnap.Agent.evaluate]. A failing
output raises [`OutputRejected`][agentsnap.OutputRejected], which the runtime turns into a
rollback (see [`agentsnap.rollback`][agentsnap.rollback]).

This module sits below the agents: it knows messages and the bus's kind check, nothing of
agents, snapshots or rollbacks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, TypedDict, Unpack

from pydantic import BaseModel, ValidationError

from agentsnap.bus import check_kind
from agentsnap.exceptions import ConfigurationError, OutputRejected
from agentsnap.limits import MAX_CHECK_NAME, check_text
from agentsnap.messages import Message

__all__ = [
    "Check",
    "CheckOptions",
    "CheckResult",
    "Guard",
    "OutputCheck",
    "Verdict",
    "declare_check",
    "failure_reason",
]


class Verdict(NamedTuple):
    """The outcome of a check: passed, or failed with a reason."""

    ok: bool
    """Whether the output passed."""
    reason: str = ""
    """Why it failed, in words the agent can act on."""

    @classmethod
    def passed(cls) -> Verdict:
        """A pass."""
        return cls(ok=True)

    @classmethod
    def failed(cls, reason: str) -> Verdict:
        """A failure, with its reason."""
        return cls(ok=False, reason=reason)


CheckResult = Verdict | bool | str | None
"""What a check or ``evaluate`` returns: a [`Verdict`][agentsnap.checks.Verdict]; ``True``
or ``None`` for a pass; ``False`` for a failure without a reason; a string for a failure with
that reason."""

Check = Callable[[Message], CheckResult]
"""A check on one outgoing message."""


def failure_reason(result: CheckResult, what: str) -> str | None:
    """The failure reason a check result stands for, or ``None`` when it passed.

    Raises:
        ConfigurationError: The result is none of the accepted kinds.
    """
    if result is None or result is True:
        return None
    if result is False:
        return f"{what} failed"
    if isinstance(result, str):
        return result or f"{what} failed"
    if isinstance(result, Verdict):
        return None if result.ok else (result.reason or f"{what} failed")
    raise ConfigurationError(
        f"{what} returned {type(result).__name__}; return a Verdict, a bool, a reason string "
        "or None"
    )


@dataclass(frozen=True, slots=True)
class OutputCheck:
    """One declared check on an agent's outgoing messages.

    Attributes:
        kind: The message kind it applies to, or ``None`` for every kind.
        name: How the check is named in feedback and in the store.
        schema: A pydantic model the payload must validate against.
        check: A callable judging the message.
    """

    kind: str | None
    name: str
    schema: type[BaseModel] | None = None
    check: Check | None = None

    def __post_init__(self) -> None:
        """Refuse a name or kind that not every store can hold.

        The name is recorded as the source of the rollbacks the check causes.

        Raises:
            ConfigurationError: The name is empty or longer than 128 characters, or the kind
                is longer than 128 characters (no message could have it), or either holds
                the NUL character.
        """
        check_text(
            self.name,
            "a check's name",
            MAX_CHECK_NAME,
            "pass a shorter name= to Runtime.check() (it is recorded as the source of the "
            "rollbacks the check causes)",
        )
        if self.kind is not None:
            check_kind(self.kind)

    def judge(self, message: Message) -> str | None:
        """The reason ``message`` fails this check, or ``None``."""
        if self.schema is not None:
            try:
                self.schema.model_validate(message.payload)
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(map(str, error['loc'])) or 'payload'}: {error['msg']}"
                    for error in exc.errors()
                )
                model = self.schema.__name__
                return f"the {message.kind!r} payload does not fit {model}: {problems}"
        if self.check is not None:
            return failure_reason(self.check(message), f"check {self.name!r}")
        return None


class CheckOptions(TypedDict, total=False):
    """How a check is declared: the keywords of [`Runtime.check`][agentsnap.Runtime.check]
    and [`App.check`][agentsnap.distributed.App.check] after the agent and the kind.

    At least one of ``schema`` and ``check`` is given.
    """  # noqa: D205

    schema: type[BaseModel] | None
    """A pydantic model the payload must validate against."""
    check: Check | None
    """A callable given the message; returns ``True``/``None`` to pass, or ``False``, a
    reason string or ``Verdict.failed(reason)`` to fail."""
    name: str | None
    """How the check is called in feedback and in the store (default: ``"schema"`` for a
    schema, the callable's name for a check)."""


def declare_check(
    kind: str | None, *, where: str = "Runtime.check()", **options: Unpack[CheckOptions]
) -> OutputCheck:
    """A check declared with a schema, a callable or both (``where`` names the caller).

    Raises:
        TypeError: ``options`` holds a keyword that is not one of
            [`CheckOptions`][agentsnap.checks.CheckOptions].
        ConfigurationError: Neither ``schema`` nor ``check`` is given, ``schema`` is not a
            pydantic model, or the name or kind cannot be stored.
    """
    unknown = sorted(set(options) - CheckOptions.__optional_keys__)
    if unknown:
        known = ", ".join(f"{key}=" for key in sorted(CheckOptions.__optional_keys__))
        raise TypeError(
            f"{where} got an unexpected keyword argument {unknown[0]!r} (it takes {known})"
        )
    schema, check, name = options.get("schema"), options.get("check"), options.get("name")
    if schema is None and check is None:
        raise ConfigurationError(f"{where} needs a schema=, a check=, or both")
    if schema is not None and not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        raise ConfigurationError(
            f"schema= takes a pydantic model class, got {schema!r}; for a function, use check="
        )
    label = name or ("schema" if check is None else str(getattr(check, "__name__", "check")))
    return OutputCheck(kind=kind, name=label, schema=schema, check=check)


class Guard:
    """Checks an agent's outgoing messages as they are sent (see ``Context.send``).

    Raises [`OutputRejected`][agentsnap.OutputRejected] on the first failing check. When the
    agent evaluates itself, ``outputs`` holds what the running handler sent, held back until
    the evaluation passes.
    """

    __slots__ = ("agent", "by_kind", "evaluates", "outputs")

    def __init__(self, agent: str, evaluates: bool) -> None:
        self.agent = agent
        self.by_kind: dict[str | None, list[OutputCheck]] = {}
        self.evaluates = evaluates
        self.outputs: list[Message] = []

    def add(self, check: OutputCheck) -> None:
        """Declare one more check."""
        self.by_kind.setdefault(check.kind, []).append(check)

    def __call__(self, message: Message) -> None:
        """Check ``message`` before it is enqueued; raise ``OutputRejected`` if a check fails it."""
        for checks in (self.by_kind.get(message.kind), self.by_kind.get(None)):
            for check in checks or ():
                reason = check.judge(message)
                if reason is not None:
                    raise OutputRejected(self.agent, reason, check.name, message)
