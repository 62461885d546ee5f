"""Agent state: the pydantic base users subclass, and its canonical JSON form.

Every agent's state is a pydantic model deriving from [`AgentState`][agentsnap.AgentState].
A recorded state must restore: its JSON, validated again, must give a state equal to it. For
a class made only of what JSON carries exactly (no validators, serializers, aliases or
constraints; see [`round_trip_is_identity`][agentsnap.state.round_trip_is_identity]) that is
shown once from the class's schema, and each encoding only checks, at little cost, that the
values are of their declared types; states of other classes are validated again from their
JSON at each change.
Snapshots store it as canonical JSON (sorted keys, no whitespace) with a SHA-256 content hash,
so an unchanged state is recognised and stored once. States are encoded with orjson, which
writes the same bytes as the standard library's canonical form (see
[`plain_canonical_json`][agentsnap.state.plain_canonical_json]), so content hashes do not
depend on which of the two encoded a state.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

import orjson
from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticSerializationError

from agentsnap.exceptions import StateNotSerializable
from agentsnap.messages import JsonInput, JsonValue
from agentsnap.versions import versions_of

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
    "round_trip_is_identity",
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
    """How many times the tool ran for this call, retries included: for a side-effecting
    call, the ledger's count under its key (a replayed call has the count recorded when the
    tool ran)."""
    error: str | None = None
    """What went wrong, when ``status`` is ``"error"``."""
    replayed: bool = False
    """The ledger's recorded outcome (a result, or a final error) was returned and the tool
    did not run (``status`` is then ``"replayed"`` or ``"error"``). False in states stored
    before the field existed."""


class AgentState(BaseModel):
    """Base class of every agent's state.

    Subclass it with your own fields; every field must hold JSON (directly or through pydantic
    models), since snapshots store state as JSON.

    A subclass may declare a version, ``version: ClassVar[int] = 2`` (1 when it declares
    none), and upcasters from its older versions
    ([`@upcaster(from_version=1)`][agentsnap.upcaster]): states stored by an older version
    of the class are read through them (see [`agentsnap.versions`][agentsnap.versions]).
    Both are checked as the class is defined.

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

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """Check the subclass's version and upcasters as it is defined.

        Raises:
            ConfigurationError: The version or an upcaster is not valid (see
                [`versions_of`][agentsnap.versions.versions_of]).
        """
        super().__pydantic_init_subclass__(**kwargs)
        versions_of(cls)


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

    def __init__(self, text: str, data: bytes | None = None) -> None:
        """Freeze ``text``; ``data`` is its UTF-8 bytes, when at hand (spares encoding it)."""
        self.json = text
        """Canonical JSON text."""
        self.hash = hashlib.sha256(text.encode() if data is None else data).hexdigest()
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

    What ``check_round_trip(agent, state)`` does, for less. For a class whose round trip
    is the identity by its schema (see
    [`round_trip_is_identity`][agentsnap.state.round_trip_is_identity]) the state's own
    values are checked against its schema, once each: every value must be of exactly its
    field's type (a ``str`` for a string, a ``list`` for a list, a nested model of exactly
    its class, not a subclass, holding its fields and nothing else), free-form JSON exact
    JSON (no tuple, enum member, UUID, model or NaN in it: each of exactly a JSON type),
    floats finite (a NaN or an infinity would be written as ``null``) and literals among
    their values; orjson then writes the models' fields directly (the text ``model_dump``
    and orjson would make, without building the dump), refusing subclasses, dates and
    dataclasses. A state that passes comes back equal from its text, so the text is neither
    read back nor validated again; one that does not is checked in full, as any state of
    another class.

    That full check is skipped when the text's hash is ``verified`` (a text shown to survive
    it before), and otherwise it is what rules out a non-finite float written by orjson as
    ``null`` (such a state never comes back equal), so the text is not read back for that as
    ``plain_canonical_json`` does. A text that is the verified one is read back when it
    holds ``null``.

    Args:
        agent: Name of the agent (for the error message).
        state: The state to encode.
        verified: Hash of a text of this agent's state shown to survive a round trip.

    Raises:
        StateNotSerializable: The state is not JSON, or a field does not survive the trip.
    """
    plan = _plan(type(state))
    if plan.check is not None:
        blob = _encode_plain(state, plan.check)
        if blob is not None:
            return blob
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


# -- states whose JSON round trip is the identity by their schema -------------------------------

_Check = Callable[[Any], bool]
"""``check(live)``: whether ``live`` (the state's own value at some place) comes back equal from
the JSON text orjson writes of it, validated again as its place's schema says."""

# Core-schema keys that change nothing about what a value validates or serializes to.
_INERT_KEYS = frozenset({"type", "metadata", "ref"})
_MODEL_KEYS = frozenset(
    {"type", "cls", "schema", "config", "custom_init", "root_model", "metadata", "ref", "post_init"}
)
_CONFIG_KEYS = frozenset(
    {
        "title",
        "extra_fields_behavior",
        "validate_assignment",
        "revalidate_instances",
        "frozen",
        "ser_json_inf_nan",
    }
)
_FIELD_KEYS = frozenset({"type", "schema", "metadata", "frozen"})
_FIELDS_KEYS = frozenset(
    {"type", "fields", "computed_fields", "model_name", "metadata", "extra_behavior", "ref"}
)
_LITERALS = (str, int, bool, type(None))


class _NotPlain(Exception):
    """The schema has a part whose JSON round trip is not known to be the identity."""


class _Plan:
    """Per state class: whether its round trip is the identity, and the checks that remain."""

    __slots__ = ("check", "plain")

    def __init__(self, plain: bool, check: _Check | None) -> None:
        # Plain classes have a check (of every value's type); other classes none.
        self.plain = plain
        self.check = check


_plans: dict[type[BaseModel], _Plan] = {}


def round_trip_is_identity(model: type[BaseModel]) -> bool:
    """Whether every state of ``model`` that encodes cleanly comes back equal from its JSON.

    Decided once per class from its pydantic core schema. True when the class (and every
    model it holds) is made only of fields that JSON carries exactly: ``str``, ``int``,
    ``float``, ``bool``, ``None``, literals of those, lists, dicts with string keys, nested
    models of the same kind and free-form JSON (``Any``, ``JsonValue``); with no validator,
    serializer, alias, constraint (lengths, bounds, patterns), computed or excluded field,
    private attribute, custom ``__init__`` or ``model_post_init``, and no ``extra="allow"``.
    Validating the JSON of such a state rebuilds the same values, provided each value is of
    its declared type, which the encoding checks on every snapshot at little cost (see
    [`encode_checked`][agentsnap.state.encode_checked]). Other classes have their round trip
    checked in full.
    """
    return _plan(model).plain


def _plan(model: type[BaseModel]) -> _Plan:
    plan = _plans.get(model)
    if plan is None:
        try:
            check = _SchemaWalk().node(model.__pydantic_core_schema__)
        except (_NotPlain, KeyError, TypeError, AttributeError):
            plan = _Plan(False, None)
        else:
            plan = _Plan(True, check)
        _plans[model] = plan
    return plan


class _SchemaWalk:
    """Compiles a core schema into the per-snapshot check of a state, or refuses it."""

    def __init__(self) -> None:
        self.definitions: dict[str, Any] = {}
        # Per reference being compiled: a cell the finished check goes into (recursion).
        self.compiled: dict[str, list[_Check | None]] = {}

    def node(self, schema: Mapping[str, Any]) -> _Check:
        kind = schema["type"]
        if "serialization" in schema:
            raise _NotPlain
        if kind == "definitions":
            for definition in schema["definitions"]:
                self.definitions[definition["ref"]] = definition
            return self.node(schema["schema"])
        if kind == "definition-ref":
            return self._reference(schema["schema_ref"])
        if kind == "model":
            return self._model(schema)
        if kind in _TYPE_CHECKS:
            _only(schema, _INERT_KEYS)
            return _TYPE_CHECKS[kind]  # of exactly its type, JSON carries it exactly
        if kind == "float":
            _only(schema, _INERT_KEYS | {"allow_inf_nan"})
            return _exact  # a NaN or an infinity would come back as None
        if kind == "any":
            _only(schema, _INERT_KEYS)
            return _exact  # a tuple, a model, an enum... would not come back the same
        if kind == "literal":
            _only(schema, _INERT_KEYS | {"expected"})
            expected = schema["expected"]
            if not all(type(value) in _LITERALS for value in expected):
                raise _NotPlain
            allowed = frozenset((type(value), value) for value in expected)
            return lambda live: (type(live), live) in allowed
        if kind == "nullable":
            _only(schema, _INERT_KEYS | {"schema"})
            inner = self.node(schema["schema"])
            if inner is _exact:
                return inner
            scalar = _OR_NONE.get(inner)
            if scalar is not None:
                return scalar
            return lambda live: live is None or inner(live)
        if kind == "default":
            _only(
                schema,
                _INERT_KEYS
                | {"schema", "default", "default_factory", "default_factory_takes_data"},
            )
            return self.node(schema["schema"])
        if kind == "list":
            _only(schema, _INERT_KEYS | {"items_schema"})
            items = self.node(schema.get("items_schema", {"type": "any"}))
            if items is _exact:
                return _exact  # a list of exact JSON is exact JSON
            return lambda live: type(live) is list and all(map(items, live))
        if kind == "dict":
            _only(schema, _INERT_KEYS | {"keys_schema", "values_schema"})
            keys = schema.get("keys_schema", {"type": "any"})
            if keys["type"] != "str":
                raise _NotPlain
            _only(keys, _INERT_KEYS)
            values = self.node(schema.get("values_schema", {"type": "any"}))
            if values is _exact:
                return _exact  # a dict of exact JSON with string keys is exact JSON
            return lambda live: type(live) is dict and all(map(values, live.values()))
        raise _NotPlain

    def _reference(self, ref: str) -> _Check:
        known = self.compiled.get(ref)
        if known is not None:  # compiled, or being compiled (recursion): look it up when used
            return lambda live: _deferred(known, live)
        cell: list[_Check | None] = [None]
        self.compiled[ref] = cell
        check = self.node(self.definitions[ref])
        cell[0] = check
        return check

    def _model(self, schema: Mapping[str, Any]) -> _Check:
        _only(schema, _MODEL_KEYS)
        cls: type[BaseModel] = schema["cls"]
        config = schema.get("config", {})
        _only(config, _CONFIG_KEYS)
        if (
            schema.get("custom_init")
            or schema.get("root_model")
            or schema.get("post_init")
            or config.get("extra_fields_behavior") == "allow"
            or cls.__private_attributes__
        ):
            raise _NotPlain
        ref = schema.get("ref")
        cell: list[_Check | None] | None = None
        if ref is not None:
            cell = self.compiled.setdefault(ref, [None])
        fields = schema["schema"]
        if fields["type"] != "model-fields" or fields.get("computed_fields"):
            raise _NotPlain
        _only(fields, _FIELDS_KEYS)
        exact: list[str] = []  # free-form JSON: the common case, kept in one loop
        # Scalar fields, checked in the loop rather than by a call each: name, the type its
        # value must have exactly, and whether ``None`` may stand instead.
        typed: list[tuple[str, type, bool]] = []
        checks: list[tuple[str, _Check]] = []
        for name, field in fields["fields"].items():
            if field["type"] != "model-field":
                raise _NotPlain
            _only(field, _FIELD_KEYS)
            check = self.node(field["schema"])
            scalar = _SCALARS.get(check)
            if check is _exact:
                exact.append(name)
            elif scalar is not None:
                typed.append((name, *scalar))
            else:
                checks.append((name, check))
        count = len(fields["fields"])

        def model(live: Any) -> bool:
            # A subclass, or another model, would come back as this class.
            if type(live) is not cls:
                return False
            attributes = live.__dict__
            # The fields and nothing else (a cached property keeps its value there too): the
            # encoding writes this dictionary.
            if len(attributes) != count:
                return False
            for name in exact:
                if not _exact(attributes[name]):
                    return False
            for name, kind, nullable in typed:
                value = attributes[name]
                if type(value) is not kind and not (nullable and value is None):
                    return False
            for name, check in checks:  # noqa: SIM110 (no generator made per model)
                if not check(attributes[name]):
                    return False
            return True

        if cell is not None:
            cell[0] = model
        return model


def _only(schema: Mapping[str, Any], keys: frozenset[str]) -> None:
    if not keys.issuperset(schema):
        raise _NotPlain


def _deferred(cell: list[_Check | None], live: Any) -> bool:
    check = cell[0]
    return check is None or check(live)


def _is_str(live: Any) -> bool:
    return type(live) is str


def _is_int(live: Any) -> bool:
    return type(live) is int


def _is_bool(live: Any) -> bool:
    return type(live) is bool


def _is_none(live: Any) -> bool:
    return live is None


def _is_str_or_none(live: Any) -> bool:
    return live is None or type(live) is str


def _is_int_or_none(live: Any) -> bool:
    return live is None or type(live) is int


def _is_bool_or_none(live: Any) -> bool:
    return live is None or type(live) is bool


# Per core-schema type of a scalar field: whether a value is exactly of it.
_TYPE_CHECKS: dict[str, _Check] = {
    "str": _is_str,
    "int": _is_int,
    "bool": _is_bool,
    "none": _is_none,
}
# The same, or None.
_OR_NONE: dict[_Check, _Check] = {
    _is_str: _is_str_or_none,
    _is_int: _is_int_or_none,
    _is_bool: _is_bool_or_none,
    _is_none: _is_none,
}
# What each scalar check asks: the exact type, and whether None passes too.
_SCALARS: dict[_Check, tuple[type, bool]] = {
    _is_str: (str, False),
    _is_int: (int, False),
    _is_bool: (bool, False),
    _is_none: (type(None), False),
    _is_str_or_none: (str, True),
    _is_int_or_none: (int, True),
    _is_bool_or_none: (bool, True),
}


def _exact(live: Any) -> bool:
    """Whether ``live`` is exact JSON: it comes back equal from the JSON orjson writes of it.

    That is a string, an integer, a boolean, ``None``, a finite float, or a list or a dict
    with string keys made of those, each of exactly its type (``type(x) is str``: orjson,
    told to, refuses subclasses). Anything else (a tuple, a set, an enum member, a UUID, a
    model, a NaN) either does not come back equal or is refused by orjson: it is checked in
    full instead. An integer orjson cannot write (beyond 64 bits) makes it refuse the state.
    """
    kind = type(live)
    if kind is str or kind is int or kind is bool or live is None:
        return True
    if kind is float:
        return bool(live - live == 0.0)  # NaN - NaN and inf - inf are NaN
    if kind is list:
        for item in live:  # noqa: SIM110 (no generator made per list)
            if type(item) is not str and not _exact(item):
                return False
        return True
    if kind is dict:
        for key, item in live.items():
            if type(key) is not str or (type(item) is not str and not _exact(item)):
                return False
        return True
    return False


# Subclasses of str, int, dict and list, dates, times and dataclasses are refused rather than
# written by value: they would not come back as they are.
_PLAIN_ONLY = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
)


def _fields(model: Any) -> dict[str, Any]:
    """A model's field values, for orjson to write in its place (see ``_encode_plain``)."""
    if isinstance(model, BaseModel):
        return model.__dict__
    raise TypeError(f"{type(model).__name__} is not JSON")


def _encode_plain(state: BaseModel, check: _Check) -> StateBlob | None:
    """``state`` encoded without a round trip, or ``None`` where that cannot be shown safe.

    For a class whose round trip is the identity: ``check`` looks at every value of the
    state, which must be exactly of its field's type (a string field holds a ``str``, a
    nested model is of exactly its class and holds its fields and nothing else, a list field
    a ``list`` of such values...), with free-form JSON, floats and literals each of exactly a
    type JSON carries; then orjson writes the models' fields as they are, refusing what is
    not plain JSON. The text is what ``model_dump`` followed by orjson would write, without
    building the dump, and it need not be read back to show it comes back equal.
    """
    try:
        if not check(state):
            return None
    except (KeyError, IndexError, TypeError, AttributeError, RecursionError):
        return None
    try:
        data = orjson.dumps(state.__dict__, default=_fields, option=_PLAIN_ONLY)
    except (TypeError, ValueError):
        return None
    if _FLOAT_MARKS[0] in data or _FLOAT_MARKS[1] in data:
        return None
    return StateBlob(data.decode(), data)


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
