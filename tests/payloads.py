"""Reading JSON payloads and recorded states in tests, narrowed to what the test expects."""

from __future__ import annotations

from typing import TypeVar

from agentsnap import JsonValue

T = TypeVar("T")


def get(value: JsonValue, key: str, kind: type[T]) -> T:
    """``value[key]``, checked to be a ``kind``; ``value`` must be a JSON object."""
    assert isinstance(value, dict), f"expected a JSON object, got {value!r}"
    item = value[key]
    assert isinstance(item, kind), f"expected {key!r} to be a {kind.__name__}, got {item!r}"
    return item
