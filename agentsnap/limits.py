"""How long the names a program gives agentsnap may be, on every store.

Agent names, message kinds, check names, tool names, run ids and idempotency keys end up in
length-limited columns of the SQL schema (``agentsnap.store.tables``). PostgreSQL enforces
those lengths and refuses the NUL character; SQLite does neither. So that a program behaves
the same whatever store it runs on, agentsnap checks each name where the program gives it
(``Runtime.add``, ``Runtime(run_id=)``, ``send(kind=)``, ``Runtime.check(name=)``,
``@tool(name=)``, ``key=``) against the strictest backend, and raises a
[`ConfigurationError`][agentsnap.ConfigurationError] (an
[`InvalidAgentName`][agentsnap.InvalidAgentName] for an agent) that says what is wrong, the
limit, and what to do, instead of failing half-way through a run on PostgreSQL only.

Lengths count characters (Unicode code points), as PostgreSQL's ``VARCHAR(n)`` does. The
schema's columns are declared with these lengths; ``COLUMNS`` lists which limit guards which
column, and the test suite checks both against the tables and the migrations.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from agentsnap.exceptions import ConfigurationError

__all__ = [
    "COLUMNS",
    "MAX_AGENT_NAME",
    "MAX_CHECK_NAME",
    "MAX_IDEMPOTENCY_KEY",
    "MAX_MESSAGE_KIND",
    "MAX_RUN_ID",
    "MAX_RUN_NAME",
    "MAX_TAG_KEY",
    "MAX_TAG_VALUE",
    "MAX_TOOL_NAME",
    "MAX_WORKER_NAME",
    "check_run_id",
    "check_run_labels",
    "check_text",
    "preview",
]

MAX_AGENT_NAME: Final = 128
"""Longest agent name (``Runtime.add``, ``Agent(name)``)."""
MAX_MESSAGE_KIND: Final = 128
"""Longest message kind (``send(..., kind=)``, ``Runtime.check(kind=)``)."""
MAX_CHECK_NAME: Final = 128
"""Longest check name (``Runtime.check(name=)``): it is recorded as a rollback's source."""
MAX_TOOL_NAME: Final = 128
"""Longest tool name (``@tool(name=)``, or the function's name)."""
MAX_RUN_ID: Final = 64
"""Longest run id (``Runtime(run_id=)``, ``fork_run(run_id=)``)."""
MAX_IDEMPOTENCY_KEY: Final = 255
"""Longest idempotency key (``key=`` of a side-effecting tool call)."""
MAX_RUN_NAME: Final = 128
"""Longest run name (``Runtime(name=)``)."""
MAX_TAG_KEY: Final = 128
"""Longest tag key (``Runtime(tags=)``)."""
MAX_TAG_VALUE: Final = 255
"""Longest tag value (``Runtime(tags=)``)."""
MAX_WORKER_NAME: Final = 255
"""Longest name of a worker of a run spread over processes (``Worker(name=)``)."""

COLUMNS: Final[Mapping[str, int]] = {
    "agentsnap_runs.id": MAX_RUN_ID,
    "agentsnap_runs.parent_run_id": MAX_RUN_ID,
    "agentsnap_runs.name": MAX_RUN_NAME,
    "agentsnap_run_tags.run_id": MAX_RUN_ID,
    "agentsnap_run_tags.key": MAX_TAG_KEY,
    "agentsnap_run_tags.value": MAX_TAG_VALUE,
    "agentsnap_snapshots.run_id": MAX_RUN_ID,
    "agentsnap_snapshots.initiator": MAX_AGENT_NAME,
    "agentsnap_snapshot_agents.agent": MAX_AGENT_NAME,
    "agentsnap_snapshot_messages.src": MAX_AGENT_NAME,
    "agentsnap_snapshot_messages.dst": MAX_AGENT_NAME,
    "agentsnap_snapshot_messages.kind": MAX_MESSAGE_KIND,
    "agentsnap_journal.run_id": MAX_RUN_ID,
    "agentsnap_journal.src": MAX_AGENT_NAME,
    "agentsnap_journal.dst": MAX_AGENT_NAME,
    "agentsnap_rollbacks.run_id": MAX_RUN_ID,
    "agentsnap_rollbacks.agent": MAX_AGENT_NAME,
    "agentsnap_rollbacks.source": MAX_CHECK_NAME,
    "agentsnap_run_leases.run_id": MAX_RUN_ID,
    "agentsnap_run_owners.run_id": MAX_RUN_ID,
    "agentsnap_replay.run_id": MAX_RUN_ID,
    "agentsnap_state_schemas.run_id": MAX_RUN_ID,
    "agentsnap_state_schemas.agent": MAX_AGENT_NAME,
    "agentsnap_tool_calls.key": MAX_IDEMPOTENCY_KEY,
    "agentsnap_tool_calls.run_id": MAX_RUN_ID,
    "agentsnap_tool_calls.agent": MAX_AGENT_NAME,
    "agentsnap_tool_calls.tool": MAX_TOOL_NAME,
    "agentsnap_model_calls.run_id": MAX_RUN_ID,
    "agentsnap_model_calls.agent": MAX_AGENT_NAME,
    "agentsnap_model_bodies.run_id": MAX_RUN_ID,
    "agentsnap_requests.run_id": MAX_RUN_ID,
    "agentsnap_requests.agent": MAX_AGENT_NAME,
    "agentsnap_snapshot_parts.run_id": MAX_RUN_ID,
    "agentsnap_snapshot_parts.worker": MAX_WORKER_NAME,
    "agentsnap_agent_leases.run_id": MAX_RUN_ID,
    "agentsnap_agent_leases.agent": MAX_AGENT_NAME,
    "agentsnap_agent_leases.owner": MAX_WORKER_NAME,
}
"""Each ``table.column`` that holds a name a program gives, and the limit that guards it.

A rollback's source is a check's name, a critic agent's name, or one of agentsnap's own
(``schema``, ``self-evaluation``, ``manual``), so ``MAX_CHECK_NAME`` is never below
``MAX_AGENT_NAME``. Every other length-limited column holds what agentsnap makes itself
(ids, hashes, statuses, ``src>dst#seq`` message ids, ``host:pid:token`` owners).
"""

_PREVIEW = 40
"""How many characters of a rejected value an error message shows."""


def preview(value: object) -> str:
    """``repr(value)``, shortened for an error message when it is long."""
    if isinstance(value, str) and len(value) > _PREVIEW:
        return f"{value[:_PREVIEW]!r}… ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= 2 * _PREVIEW else text[: 2 * _PREVIEW] + "…"


def check_text(
    value: object,
    what: str,
    limit: int,
    fix: str,
    *,
    empty: bool = False,
    error: type[ConfigurationError] = ConfigurationError,
) -> str:
    """Return ``value`` if every store can hold it as ``what``, else raise ``error``.

    It must be a string of at most ``limit`` characters (at least one unless ``empty``),
    without the NUL character (PostgreSQL cannot store it) and without lone surrogates
    (no database can: they are not text).

    Args:
        value: What the program gave.
        what: What it is, for the message (``"message kind"``).
        limit: The longest value allowed.
        fix: What to do about it, for the message.
        empty: Whether the empty string is allowed.
        error: The exception class to raise.

    Raises:
        ConfigurationError: ``value`` is not such a string (``error``, a subclass).
    """
    if not isinstance(value, str):
        raise error(f"{what} must be a string, got {type(value).__name__} {preview(value)}: {fix}")
    if not value and not empty:
        raise error(f"{what} must not be empty: {fix}")
    if len(value) > limit:
        shown = repr(value) if len(value) <= _PREVIEW else f"{value[:_PREVIEW]!r}…"
        raise error(
            f"{what} {shown} is {len(value)} characters long; every store holds at most "
            f"{limit} (PostgreSQL refuses longer ones, SQLite would not notice): {fix}"
        )
    if "\x00" in value:
        raise error(
            f"{what} {preview(value)} contains the NUL character, which PostgreSQL cannot "
            f"store: {fix}"
        )
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise error(
                f"{what} {preview(value)} holds a lone surrogate, which is not text any "
                f"database can store: {fix}"
            ) from None
    return value


def check_run_id(run_id: object) -> str:
    """Return ``run_id`` if every store can hold it as a run id, else raise.

    Raises:
        ConfigurationError: It is not a string of 1 to 64 characters without the NUL
            character.
    """
    return check_text(
        run_id,
        "run id",
        MAX_RUN_ID,
        f"use at most {MAX_RUN_ID} characters, or leave run_id out to get 32 hex digits",
    )


def check_run_labels(
    name: object, tags: Mapping[str, str] | None
) -> tuple[str | None, dict[str, str]]:
    """Return a run's ``name`` and ``tags`` if every store can hold them, else raise.

    Raises:
        ConfigurationError: The name is empty, longer than 128 characters or not a string;
            a tag key is empty or longer than 128 characters, or a value is longer than 255
            characters or not a string; or either holds the NUL character.
    """
    checked = (
        None
        if name is None
        else check_text(name, "a run's name", MAX_RUN_NAME, "pass a shorter name= to Runtime")
    )
    if tags is None:
        return checked, {}
    if not isinstance(tags, Mapping):
        raise ConfigurationError(
            f"tags must be a mapping of strings to strings, got {type(tags).__name__} "
            f"{preview(tags)}: pass tags={{'team': 'billing'}}"
        )
    labels: dict[str, str] = {}
    for key, value in tags.items():
        fix = f"pass tags as short strings, like tags={{'team': 'billing'}} (tag {preview(key)})"
        labels[check_text(key, "a tag key", MAX_TAG_KEY, fix)] = check_text(
            value, "a tag value", MAX_TAG_VALUE, fix, empty=True
        )
    return checked, labels
