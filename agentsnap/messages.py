"""Wire types: messages, markers and channel ids.

A [`Message`][agentsnap.Message] is an immutable envelope. Its id is derived from its place in
the run, ``src>dst#seq``: the message that takes the same place on the same channel after a
rollback or a crash recovery gets the same id. That is what keeps idempotency keys derived from
message ids stable across re-executions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, TypeAlias

__all__ = [
    "ENVIRONMENT",
    "ChannelId",
    "JsonValue",
    "Marker",
    "Message",
    "is_json",
    "json_problem",
]

JsonValue: TypeAlias = Any
"""A JSON value: ``dict`` with ``str`` keys, ``list``, ``str``, ``int``, finite ``float``,
``bool`` or ``None``."""

ENVIRONMENT = "$env"
"""Name of the environment process: the sender of every message the program injects with
[`Runtime.send`][agentsnap.Runtime.send]. It takes part in every snapshot like an agent."""

EMPTY_HEADERS: Mapping[str, str] = MappingProxyType({})


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
        headers = data.get("headers") or {}
        return cls(
            src=str(data["src"]),
            dst=str(data["dst"]),
            seq=int(data["seq"]),
            kind=str(data["kind"]),
            payload=data.get("payload"),
            headers=MappingProxyType(dict(headers)) if headers else EMPTY_HEADERS,
            epoch=int(data.get("epoch", 0)),
        )


class Marker(NamedTuple):
    """Control message of the snapshot protocol, carried on the same FIFO channels.

    A marker for snapshot ``k`` tells the receiver that the sender recorded every snapshot up
    to ``k`` before sending it: nothing behind it on the channel belongs to those cuts.
    """

    src: str
    dst: str
    snapshot: int


_SCALARS = (str, int, bool, type(None))


def is_json(value: object) -> bool:
    """Whether ``value`` is a JSON value built of plain ``dict``, ``list`` and scalars.

    The fast check on the send path; [`json_problem`][agentsnap.messages.json_problem] says
    what is wrong, and accepts subclasses (an ``IntEnum``, an ``OrderedDict``) too.
    """
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return math.isfinite(value)  # type: ignore[arg-type]
    # Plain loops: faster than all() over a generator on this hot path; scalar items are
    # checked in place, without a call each.
    if kind is dict:
        for key, item in value.items():  # type: ignore[attr-defined]
            if type(key) is not str:
                return False
            kind = type(item)
            if kind is str or kind is int or kind is bool or item is None:
                continue
            if not is_json(item):
                return False
        return True
    if kind is list:
        for item in value:  # type: ignore[attr-defined]
            kind = type(item)
            if kind is str or kind is int or kind is bool or item is None:
                continue
            if not is_json(item):
                return False
        return True
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
    return f"{path} is a {kind.__name__}"
