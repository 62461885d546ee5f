"""How the LangGraph saver lays checkpoints, channel values and task writes out in rows."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from langchain_core.runnables import RunnableConfig

from agentsnap.store.graph import EMPTY, WriteEntry, pack_writes, unpack_writes

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


def checkpoint_config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    """The config that names one checkpoint."""
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }
