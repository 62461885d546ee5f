"""Wire types: messages, markers and channel ids, and the error reading a payload raises.

A [`Message`][agentsnap.Message] is an immutable envelope. Its id is derived from its place in
the run, ``src>dst#seq``: the message that takes the same place on the same channel after a
rollback or a crash recovery gets the same id. That is what keeps idempotency keys derived from
message ids stable across re-executions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from agentsnap._errors import ConfigurationError

__all__ = [
    "ENVIRONMENT",
    "ChannelId",
    "JsonInput",
    "JsonValue",
    "Marker",
    "Message",
    "PayloadInvalid",
    "is_json",
    "json_problem",
]

if TYPE_CHECKING:
    JsonValue: TypeAlias = (
        dict[str, "JsonValue"] | list["JsonValue"] | str | int | float | bool | None
    )
    """A JSON value: ``dict`` with ``str`` keys, ``list``, ``str``, ``int``, finite ``float``,
    ``bool`` or ``None``.

    To a type checker it is that recursive union (the same as ``pydantic.JsonValue``), so code
    that reads a value must narrow it first (``isinstance``), or read a payload with
    [`Message.payload_as`][agentsnap.Message.payload_as]. Parameters that only take JSON in
    (a payload to send, run metadata) are typed with its read-only form,
    [`JsonInput`][agentsnap.JsonInput], so a ``dict[str, int]`` fits them too.

    At run time it is ``typing.Any``: a pydantic field annotated with it is not validated, nor
    given a serializer of its own, which keeps states and records as fast to dump as plain data.
    agentsnap checks JSON where it enters instead (a send, a state's round trip). Annotate a
    field with ``pydantic.JsonValue`` where pydantic should validate it: type checkers treat the
    two alike."""
else:
    JsonValue = Any


if TYPE_CHECKING:
    JsonInput: TypeAlias = (
        Mapping[str, "JsonInput"] | Sequence["JsonInput"] | str | int | float | bool | None
    )
    """What a parameter that takes JSON accepts, such as a payload to send: a
    [`JsonValue`][agentsnap.JsonValue] seen read-only.

    Read-only containers are covariant, so a ``dict[str, int]`` or a ``list[str]`` is one, where
    it is not a ``JsonValue`` (``dict`` and ``list`` are invariant: a function may add any JSON
    value to a ``dict[str, JsonValue]``). What is sent must still be built of plain ``dict`` and
    ``list``: a ``tuple`` passes the type checker but not the check at the send."""
else:
    JsonInput = Any


ENVIRONMENT = "$env"
"""Name of the environment process: the sender of every message the program injects with
[`Runtime.send`][agentsnap.Runtime.send]. It takes part in every snapshot like an agent."""

EMPTY_HEADERS: Mapping[str, str] = MappingProxyType({})

_T = TypeVar("_T")

_ADAPTERS: dict[object, TypeAdapter[Any]] = {}
"""A pydantic adapter per type read with ``Message.payload_as``: building one costs far more
than validating with it."""


def _adapter(kind: type[_T]) -> TypeAdapter[_T]:
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        adapter = _ADAPTERS[kind] = TypeAdapter(kind)
    return adapter


class ChannelId(NamedTuple):
    """The FIFO channel from ``src`` to ``dst``."""

    src: str
    dst: str

    def __str__(self) -> str:
        return f"{self.src}>{self.dst}"


class Message(NamedTuple):
    """An immutable message envelope.

    Attributes:
        src: Sending agent (or [`ENVIRONMENT`][agentsnap.ENVIRONMENT]).
        dst: Receiving agent.
        seq: Position on the channel ``(src, dst)``, starting at 1.
        kind: What the message is, chosen by the sender (``"message"`` by default).
        payload: JSON value carried by the message. Treat it as read-only.
        headers: String headers (trace context and the like).
        epoch: Highest snapshot number the sender had recorded when it sent the message.
            A message whose epoch is ahead of its receiver acts as a snapshot marker.
    """

    src: str
    dst: str
    seq: int
    kind: str
    payload: JsonValue
    headers: Mapping[str, str]
    epoch: int

    @property
    def id(self) -> str:
        """Id of the message, ``src>dst#seq``; unique within a run's line of history."""
        return f"{self.src}>{self.dst}#{self.seq}"

    @property
    def channel(self) -> ChannelId:
        """The channel the message travels on."""
        return ChannelId(self.src, self.dst)

    def payload_as(self, kind: type[_T]) -> _T:
        """The payload, validated as ``kind``: the typed way to read it.

        ``kind`` is anything pydantic validates: a model, a ``TypedDict``, a dataclass, or a
        type such as ``dict[str, int]``. The payload itself is left as it is.

        Example:
            ```python
            from pydantic import BaseModel

            from agentsnap import Message


            class Transfer(BaseModel):
                amount: int
                to: str


            message = Message("bank", "alice", 1, "transfer", {"amount": 5, "to": "bob"}, {}, 0)
            assert message.payload_as(Transfer).amount == 5
            assert message.payload_as(dict[str, int | str])["to"] == "bob"
            ```

        Args:
            kind: The type to read the payload as.

        Raises:
            PayloadInvalid: The payload does not fit ``kind``; the pydantic
                ``ValidationError`` is the ``__cause__``.
        """
        try:
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                return kind.model_validate(self.payload)
            return _adapter(kind).validate_python(self.payload)
        except ValidationError as exc:
            raise PayloadInvalid(self, _type_name(kind), _first_error(exc)) from exc

    def to_json(self) -> dict[str, JsonValue]:
        """The message as a JSON object (what stores persist)."""
        return {
            "id": self.id,
            "src": self.src,
            "dst": self.dst,
            "seq": self.seq,
            "kind": self.kind,
            "payload": self.payload,
            "headers": dict(self.headers),
            "epoch": self.epoch,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, JsonValue]) -> Message:
        """Rebuild a message from [`to_json`][agentsnap.Message.to_json] output."""
        headers = data.get("headers")
        return cls(
            src=str(data["src"]),
            dst=str(data["dst"]),
            seq=_int(data["seq"]),
            kind=str(data["kind"]),
            payload=data.get("payload"),
            headers=(
                MappingProxyType({key: str(value) for key, value in headers.items()})
                if isinstance(headers, dict) and headers
                else EMPTY_HEADERS
            ),
            epoch=_int(data.get("epoch", 0)),
        )


@dataclass(eq=False, repr=False)
class PayloadInvalid(ConfigurationError, ValueError):
    """A message payload does not have the shape its reader expects.

    Raised by [`Message.payload_as`][agentsnap.Message.payload_as]; the pydantic
    ``ValidationError`` that says what does not fit is the ``__cause__``. Inside a handler it
    fails the handler like any other exception (see [`HandlerFailed`][agentsnap.HandlerFailed]).

    Attributes:
        message: The message whose payload was read.
        expected: Name of the type the payload was read as.
    """

    message: Message
    expected: str
    detail: InitVar[str]

    def __post_init__(self, detail: str) -> None:
        super().__init__(
            f"the payload of message {self.message.id} (kind {self.message.kind!r}) does not "
            f"fit {self.expected}: {detail}; make the sender and the reader agree on its shape"
        )


def _int(value: JsonValue) -> int:
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"expected a number, got {type(value).__name__}")


def _type_name(kind: object) -> str:
    name = getattr(kind, "__name__", None)
    return name if isinstance(name, str) and not getattr(kind, "__args__", None) else repr(kind)


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    if not errors:
        return str(exc)
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"])
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where + ': ' if where else ''}{first['msg']}{more}"


class Marker(NamedTuple):
    """Control message of the snapshot protocol, carried on the same FIFO channels.

    A marker for snapshot ``k`` tells the receiver that the sender recorded every snapshot up
    to ``k`` before sending it: nothing behind it on the channel belongs to those cuts.
    """

    src: str
    dst: str
    snapshot: int


_SCALARS = (str, int, bool, type(None))
JSON_SCALAR_TYPES = frozenset(_SCALARS)
"""The types of the JSON scalars, as a set: checking a value's type is one lookup."""


def is_json(value: object) -> bool:
    """Whether ``value`` is a JSON value built of plain ``dict``, ``list`` and scalars.

    The fast check on the send path; [`json_problem`][agentsnap.messages.json_problem] says
    what is wrong, and accepts subclasses (an ``IntEnum``, an ``OrderedDict``) too.
    """
    kind = type(value)
    # A payload is most often a dict: it is tested first. Plain loops are faster than all()
    # over a generator on this hot path; scalar items are checked in place, one set lookup
    # each, without a call.
    if kind is dict:
        for key, item in value.items():  # type: ignore[attr-defined]
            if type(key) is not str:
                return False
            if type(item) not in JSON_SCALAR_TYPES and not is_json(item):
                return False
        return True
    if kind in JSON_SCALAR_TYPES:
        return True
    if kind is list:
        for item in value:  # type: ignore[attr-defined]
            if type(item) not in JSON_SCALAR_TYPES and not is_json(item):
                return False
        return True
    if kind is float:
        return math.isfinite(value)  # type: ignore[arg-type]
    return False


def json_problem(value: object, path: str = "payload") -> str | None:
    """Say why ``value`` is not a JSON value, or return ``None`` when it is one.

    Args:
        value: The value to check.
        path: How to name the value in the answer.

    Returns:
        ``None`` for a JSON value, else a short description naming the offending path.
    """
    kind = type(value)
    if kind in _SCALARS:
        return None
    if kind is float:
        return None if math.isfinite(value) else f"{path} is {value!r}, not a finite number"  # type: ignore[arg-type]
    if kind is dict:
        for key, item in value.items():  # type: ignore[attr-defined]
            if type(key) is not str:
                return f"{path} has a key {key!r} that is not a string"
            problem = json_problem(item, f"{path}[{key!r}]")
            if problem is not None:
                return problem
        return None
    if kind is list:
        for index, item in enumerate(value):  # type: ignore[arg-type]
            problem = json_problem(item, f"{path}[{index}]")
            if problem is not None:
                return problem
        return None
    if isinstance(value, str | int | float | dict | list):
        # Subclasses (an IntEnum, a str Enum, an OrderedDict) are JSON all the same.
        if isinstance(value, dict):
            return json_problem(dict(value), path)
        if isinstance(value, list):
            return json_problem(list(value), path)
        if isinstance(value, float):
            return json_problem(float(value), path)
        return None
    return f"{path} is {type_name(kind)}"


def type_name(kind: type) -> str:
    """The name of ``kind`` with its indefinite article, as a message says it: "an object"."""
    name = kind.__name__
    # By the letter, except the "u" said "you" (a UUID, a unicode…).
    vowel = name[:1].lower() in set("aeio") or (
        name[:1].lower() == "u" and not name.lower().startswith(("uu", "uni", "use", "usa"))
    )
    return f"{'an' if vowel else 'a'} {name}"


# Core schema types whose JSON form is a string, an integer, a boolean, null, or a container
# of values of the schemas inside them: what a model built of them dumps needs no check.
_EXACT_SCHEMAS = frozenset({
    "bool", "bytes", "chain", "complex", "computed-field", "custom-error", "dataclass",
    "dataclass-args", "dataclass-field", "date", "datetime", "decimal", "default",
    "definition-ref", "definitions", "dict", "frozenset", "function-after", "function-before",
    "int", "json-or-python", "lax-or-strict", "list", "literal", "model", "model-field",
    "model-fields", "multi-host-url", "none", "nullable", "set", "str", "tagged-union", "time",
    "timedelta", "tuple", "typed-dict", "typed-dict-field", "union", "url", "uuid",
})  # fmt: skip
# Keys of a core schema that hold values or functions, not schemas.
_NOT_SCHEMAS = frozenset({"default", "expected", "function", "metadata", "serialization_exclude"})
_DUMPS_JSON_MAX = 4096
_dumps_json: dict[type[BaseModel], bool] = {}


def dumps_json(model: type[BaseModel]) -> bool:
    """Whether what ``model.model_dump(mode="json")`` returns is always a JSON value.

    Pydantic's JSON mode turns every value into a string, a number, a boolean, null, a list
    or a dict with string keys, except a float that is not finite: a NaN stays a NaN. So the
    dump of a model none of whose fields can hold a float (nor an untyped value, an extra
    field, or a value a function of the model's serializes) needs no check, provided every
    value fits its field (pydantic warns when one does not). Decided once per model class,
    from its core schema; ``False`` whenever in doubt.
    """
    known = _dumps_json.get(model)
    if known is None:
        try:
            schema = model.__pydantic_core_schema__
            known = model.model_dump is BaseModel.model_dump and _exact(schema)
        except Exception:  # a model pydantic cannot build yet: no promise
            known = False
        if len(_dumps_json) < _DUMPS_JSON_MAX:
            _dumps_json[model] = known
    return known


def _exact(schema: object) -> bool:
    """Whether the core schema ``schema`` (or part of one) dumps exact JSON, as above."""
    if isinstance(schema, list | tuple):
        return all(_exact(part) for part in schema)
    if not isinstance(schema, Mapping):
        return True  # a class, a name, a flag: not a schema
    kind = schema.get("type")
    if isinstance(kind, str):
        if kind == "enum":
            members = schema.get("members", ())
            if not all(type(member.value) in JSON_SCALAR_TYPES for member in members):
                return False
        elif kind not in _EXACT_SCHEMAS:
            return False
    if "allow" in (schema.get("extra_behavior"), schema.get("extra_fields_behavior")):
        return False  # extra fields are dumped as they are
    return all(_exact(part) for key, part in schema.items() if key not in _NOT_SCHEMAS)
