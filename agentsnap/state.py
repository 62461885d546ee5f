"""Agent state: the pydantic base users subclass, and its canonical JSON form.

Every agent's state is a pydantic model deriving from [`AgentState`][agentsnap.AgentState].
Snapshots store it as canonical JSON (sorted keys, no whitespace) with a SHA-256 content hash,
so an unchanged state is recognised and stored once. States are encoded with orjson, which
writes the same bytes as the standard library's canonical form (see
[`plain_canonical_json`][agentsnap.state.plain_canonical_json]), so content hashes do not
depend on which of the two encoded a state.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal, Protocol

import orjson
from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticSerializationError

from agentsnap.exceptions import StateNotSerializable
from agentsnap.messages import JsonInput, JsonValue

__all__ = [
    "AgentState",
    "HasState",
    "PlanStep",
    "StateBlob",
    "ToolCallRecord",
    "canonical_json",
    "check_round_trip",
    "compact_json",
    "content_hash",
    "encode_checked",
    "encode_state",
    "plain_canonical_json",
]


class PlanStep(BaseModel):
    """One step of an agent's plan."""

    description: str
    """What the step is meant to achieve."""
    status: Literal["pending", "in_progress", "done", "failed", "skipped"] = "pending"
    """Where the step stands."""
    note: str | None = None
    """Free-form detail (an outcome, a reason for failure)."""


class ToolCallRecord(BaseModel):
    """One tool call in an agent's history (see [`agentsnap.tools`][agentsnap.tools])."""

    tool: str
    """Name of the tool."""
    arguments: dict[str, JsonValue] = Field(default_factory=dict)
    """Arguments as JSON."""
    key: str | None = None
    """Idempotency key of a side-effecting call."""
    status: str = "ok"
    """Outcome of the call: ``"ok"`` (the tool ran), ``"replayed"`` (the ledger's recorded
    outcome was returned and the tool did not run), ``"error"``, or ``"running"`` while the
    call is under way."""
    result: JsonValue = None
    """Result, or a summary of it when its JSON is long."""
    message_id: str | None = None
    """Id of the message whose handler made the call (``None`` outside a handler)."""
    fingerprint: str | None = None
    """SHA-256 of the canonical JSON of the arguments."""
    attempts: int = 1
    """How many times the tool ran for this call (retries included; 0 when replayed)."""
    error: str | None = None
    """What went wrong, when ``status`` is ``"error"``."""


class AgentState(BaseModel):
    """Base class of every agent's state.

    Subclass it with your own fields; every field must hold JSON (directly or through pydantic
    models), since snapshots store state as JSON.

    Example:
        ```python
        from agentsnap import AgentState

        class TellerState(AgentState):
            balance: int = 0
        ```
    """

    model_config = ConfigDict(extra="forbid")

    memory: dict[str, JsonValue] = Field(default_factory=dict)
    """What the agent knows: named facts, notes, conversation, as JSON."""
    plan: list[PlanStep] = Field(default_factory=list)
    """The steps the agent intends to take."""
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    """Every tool call the agent made, in order."""


class HasState(Protocol):
    """What snapshots and rollbacks need of an agent: its state, and the state's type.

    [`Agent`][agentsnap.Agent] satisfies it; the snapshot and rollback layers depend on this
    protocol rather than on the agents layer above them.
    """

    @property
    def state(self) -> BaseModel:
        """The agent's current state."""

    @state.setter
    def state(self, value: Any) -> None:
        """Replace the state (a restore)."""

    @property
    def state_type(self) -> type[BaseModel]:
        """The pydantic model of the state, to rebuild it from JSON."""


class StateBlob:
    """A state frozen as canonical JSON with its content hash."""

    __slots__ = ("hash", "json")

    def __init__(self, text: str) -> None:
        self.json = text
        """Canonical JSON text."""
        self.hash = content_hash(text)
        """SHA-256 of the text, hex."""

    def value(self) -> dict[str, JsonValue]:
        """A fresh copy of the state as a JSON object."""
        loaded: dict[str, JsonValue] = json.loads(self.json)
        return loaded


def canonical_json(value: JsonInput) -> str:
    """Serialize ``value`` as canonical JSON: sorted keys, compact, UTF-8, no NaN.

    Raises:
        ValueError: ``value`` holds a non-finite float.
        TypeError: ``value`` holds something that is not JSON.
    """
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


# orjson writes floats below 1e-4 in magnitude differently from ``repr`` (``1e-7`` for
# ``1e-07``, ``0.00001`` for ``1e-05``); output holding either pattern, even inside a string,
# is encoded again by the standard library. Larger and smaller floats come out the same.
_FLOAT_MARKS = (b"e-", b"0.0000")
_SORTED = orjson.OPT_SORT_KEYS


def plain_canonical_json(value: JsonInput) -> str:
    """The canonical JSON of ``canonical_json`` for a value made of JSON types only, fast.

    For values such as ``model_dump(mode="json")`` returns: dicts, lists, strings, integers,
    finite floats, booleans and ``None``. orjson writes them about ten times faster than the
    standard library and, for these types, byte for byte the same text, so content hashes are
    the same whichever wrote them. The standard library takes over where orjson cannot
    represent a value or would write it differently: integers beyond 64 bits, keys that are
    not strings, strings that are not valid Unicode (lone surrogates), and floats below 1e-4
    in magnitude.

    orjson writes non-finite floats as ``null``, so an output holding ``null`` is read back
    and compared with ``value``: where they differ (a NaN or an infinity became ``null``), the
    standard library writes it again and refuses them, so a NaN is never recorded as
    ``None``. Reading back costs a fraction of the standard library's encoding, which states
    with ``None`` fields (a plan step's note, a tool call's key) would otherwise pay.
    Unlike ``canonical_json``, it does not refuse enum members, UUIDs and dates (orjson
    writes them by value); ``model_dump(mode="json")`` never returns them.

    Raises:
        TypeError: ``value`` holds something neither orjson nor the standard library writes.
        ValueError: the standard library took over and found a non-finite float.
    """
    data = _orjson_canonical(value)
    if data is None or (b"null" in data and orjson.loads(data) != value):
        return canonical_json(value)  # a non-finite float was written as null
    return data.decode()


def _orjson_canonical(value: JsonInput) -> bytes | None:
    """Orjson's canonical JSON of ``value``, or ``None`` where the standard library's differs.

    A non-finite float in it is written as ``null``: the caller rules that out.
    """
    try:
        data = orjson.dumps(value, option=_SORTED)
    except TypeError:
        return None
    if _FLOAT_MARKS[0] in data or _FLOAT_MARKS[1] in data:
        return None
    return data


_stdlib_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def compact_json(value: JsonInput) -> str:
    """Serialize an already checked JSON value compactly, fast (key order kept).

    orjson is about ten times faster than the standard library; the standard library takes
    over for what orjson refuses (integers beyond 64 bits). Only for values known to be JSON:
    unlike ``canonical_json`` it does not reject non-finite floats.
    """
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return _stdlib_compact.encode(value)


def content_hash(text: str) -> str:
    """SHA-256 of ``text`` (UTF-8), as 64 hex digits."""
    return hashlib.sha256(text.encode()).hexdigest()


def encode_state(agent: str, state: BaseModel) -> StateBlob:
    """Freeze ``state`` as canonical JSON.

    Args:
        agent: Name of the agent the state belongs to (for the error message).
        state: The state to encode.

    Raises:
        StateNotSerializable: A field holds a value that is not JSON; the error names it.
    """
    try:
        return StateBlob(plain_canonical_json(state.model_dump(mode="json")))
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        field = _failing_field(state)
        raise StateNotSerializable(agent, field, _short(exc)) from exc


def encode_checked(agent: str, state: BaseModel, verified: str | None = None) -> StateBlob:
    """Freeze ``state`` as canonical JSON, shown to survive a JSON round trip.

    What ``check_round_trip(agent, state)`` does, for less: the round trip is skipped when
    the text's hash is ``verified`` (a text shown to survive it before), and otherwise it is
    what rules out a non-finite float written by orjson as ``null`` (such a state never
    comes back equal), so the text is not read back for that as ``plain_canonical_json``
    does. A text that is the verified one is read back when it holds ``null``.

    Args:
        agent: Name of the agent (for the error message).
        state: The state to encode.
        verified: Hash of a text of this agent's state shown to survive a round trip.

    Raises:
        StateNotSerializable: The state is not JSON, or a field does not survive the trip.
    """
    try:
        value = state.model_dump(mode="json")
        data = _orjson_canonical(value)
        text = canonical_json(value) if data is None else data.decode()
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise StateNotSerializable(agent, _failing_field(state), _short(exc)) from exc
    blob = StateBlob(text)
    if blob.hash != verified:
        return check_round_trip(agent, state, blob)
    if data is not None and b"null" in data and orjson.loads(data) != value:
        return encode_state(agent, state)  # a non-finite float: refused there
    return blob


def check_round_trip(agent: str, state: BaseModel, blob: StateBlob | None = None) -> StateBlob:
    """Check that ``state`` survives JSON and back unchanged, and return its blob.

    Restoring a snapshot rebuilds the state from JSON; a field that comes back different (a
    set or tuple in a loosely typed field turns into a list, say) would make a restored run
    diverge from the recorded one.

    Args:
        agent: Name of the agent (for the error message).
        state: The state to check.
        blob: The state already encoded, if at hand.

    Raises:
        StateNotSerializable: The state is not JSON, or a field does not survive the trip.
    """
    if blob is None:
        blob = encode_state(agent, state)
    try:
        # Parsed as a restore parses it, so a state that passes restores the same.
        again = type(state).model_validate_json(blob.json)
    except ValueError as exc:
        _refuse_non_json(agent, state)
        raise StateNotSerializable(agent, None, f"it does not load back: {_short(exc)}") from exc
    if again != state:
        _refuse_non_json(agent, state)
        for name in type(state).model_fields:
            if getattr(again, name) != getattr(state, name):
                raise StateNotSerializable(
                    agent, name, "its value comes back different after a JSON round trip"
                )
        raise StateNotSerializable(agent, None, "it comes back different after a JSON round trip")
    return blob


def _refuse_non_json(agent: str, state: BaseModel) -> None:
    """Raise what ``encode_state`` raised with the standard library, if it would have.

    orjson writes a non-finite float as ``null``; the state then fails its round trip, and
    this names the field as not JSON, as the standard library's refusal did.
    """
    try:
        canonical_json(state.model_dump(mode="json"))
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise StateNotSerializable(agent, _failing_field(state), _short(exc)) from exc


def _failing_field(state: BaseModel) -> str | None:
    for name in type(state).model_fields:
        try:
            canonical_json(state.model_dump(mode="json", include={name}))
        except (PydanticSerializationError, TypeError, ValueError):
            return name
    return None


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
