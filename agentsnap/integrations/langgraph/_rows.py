"""How the LangGraph saver lays checkpoints, channel values and task writes out in rows."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import ormsgpack
from langchain_core.runnables import RunnableConfig

from agentsnap.exceptions import StoreError
from agentsnap.store.graph import EMPTY

__all__ = [
    "EMPTY",
    "JSON",
    "WriteEntry",
    "checkpoint_config",
    "inline",
    "merge_writes",
    "pack_writes",
    "plain_json",
    "unpack_writes",
]

JSON = "json"
"""The type tag of metadata stored as plain JSON (``orjson.dumps``)."""

INLINE_STR = 256
"""The longest string kept in the checkpoint row rather than as a value of its own."""

WriteEntry = tuple[int, str, str, bytes]
"""One pending write as stored: index, channel, and the value as the serializer typed it."""


def inline(value: Any) -> bool:
    """Whether a channel value is a small scalar that rides in the checkpoint's own row."""
    kind = type(value)
    if value is None or kind is bool or kind is float:
        return True
    if kind is int:
        return bool(-(2**63) <= value < 2**63)
    return kind is str and len(value) <= INLINE_STR


_JSON_SCALARS = (str, int, bool, type(None))


def plain_json(value: Any) -> bool:
    """Whether ``value`` reads back from JSON as it is.

    That is: dicts with string keys (none of them ``"lc"``, which LangGraph's reviver would
    read as an object), lists, strings, integers, finite floats, booleans and ``None``, of
    those exact types.
    """
    kind = type(value)
    if kind in _JSON_SCALARS:
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is dict:
        return all(
            type(key) is str and key != "lc" and plain_json(item) for key, item in value.items()
        )
    if kind is list:
        return all(plain_json(item) for item in value)
    return False


def merge_writes(existing: Iterable[WriteEntry], new: Iterable[WriteEntry]) -> list[WriteEntry]:
    """A task's writes once ``new`` is recorded after ``existing``, one per index.

    A regular write (index 0 and up, its position in the task's output) is kept as first
    recorded, so recording the same writes again changes nothing; a write to one of
    LangGraph's special channels (errors, interrupts…, negative indexes) replaces the one
    recorded before it.
    """
    merged = {entry[0]: entry for entry in existing}
    for entry in new:
        if entry[0] < 0 or entry[0] not in merged:
            merged[entry[0]] = entry
    return list(merged.values())


def pack_writes(entries: Sequence[WriteEntry]) -> bytes:
    """A task's writes as one value: a msgpack array of ``[idx, channel, type, value]``."""
    return ormsgpack.packb([list(entry) for entry in entries])


def unpack_writes(data: bytes) -> list[WriteEntry]:
    """The writes [`pack_writes`][agentsnap.integrations.langgraph._rows.pack_writes] packed.

    Plain msgpack (no extension types), so reading it never builds an object of any class.

    Raises:
        StoreError: The value is not a list of writes (the row was changed by something
            other than the saver).
    """
    try:
        items = ormsgpack.unpackb(data)
        entries: list[WriteEntry] = []
        for idx, channel, value_type, value in items:
            if not (
                type(idx) is int
                and type(channel) is str
                and type(value_type) is str
                and type(value) is bytes
            ):
                raise TypeError(f"unexpected entry {[idx, channel, value_type]!r}")
            entries.append((idx, channel, value_type, value))
    except (TypeError, ValueError) as exc:  # msgpack's decode errors are ValueErrors
        raise StoreError(
            "a row of agentsnap_lg_task_writes does not hold a task's writes "
            f"({exc}); was it changed outside agentsnap? Delete the row or restore the database"
        ) from exc
    return entries


def checkpoint_config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    """The config that names one checkpoint."""
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }
