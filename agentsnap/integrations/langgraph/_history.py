"""The history a LangGraph ``DeltaChannel`` is rebuilt from, read from the saver's rows."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

from langgraph.checkpoint.base import DeltaChannelHistory, PendingWrite, writes_sort_key

from agentsnap.store.graph import StoredCheckpoint, TaskWrites, unpack_writes

__all__ = ["DeltaWalk", "achunks", "chunks"]

Decode = Callable[[StoredCheckpoint], tuple[Mapping[str, Any], Mapping[str, str]]]
"""A stored checkpoint's values kept in its row, and the versions of its values kept apart."""

_LARGEST_CHUNK = 256
"""Ancestors whose stored values are read in one query, at most."""


class DeltaWalk:
    """The walk up a checkpoint's ancestors that ``get_delta_channel_history`` makes.

    For each channel asked for, the walk goes parent by parent, nearest first, and stops
    at the first ancestor that holds a value of the channel (in the checkpoint's row or
    a value row of its version): that value is the seed. The writes to replay are those
    of the ancestors walked, the seed's own included (they made its child); the target's
    writes are pending, not history. Ancestors are visited in chunks, each one query for
    the values of every channel still walking.
    """

    def __init__(self, channels: Sequence[str], decode: Decode) -> None:
        self.channels = list(dict.fromkeys(channels))
        self._decode = decode
        self._walking = list(self.channels)
        self._walked: dict[str, list[str]] = {channel: [] for channel in self.channels}
        self._inline_seeds: dict[str, Any] = {}
        self._stored_seeds: dict[str, tuple[str, bytes]] = {}
        self._chunk: list[tuple[str, Mapping[str, Any], Mapping[str, str]]] = []

    @property
    def done(self) -> bool:
        """Whether every channel has found its seed."""
        return not self._walking

    def wanted(self, ancestors: Sequence[StoredCheckpoint]) -> set[tuple[str, str]]:
        """Decode a chunk of ancestors; the ``(channel, version)`` values to read for it."""
        self._chunk = []
        wanted: set[tuple[str, str]] = set()
        for ancestor in ancestors:
            inline, versions = self._decode(ancestor)
            self._chunk.append((ancestor.checkpoint_id, inline, versions))
            wanted.update(
                (channel, versions[channel]) for channel in self._walking if channel in versions
            )
        return wanted

    def visit(self, stored: Mapping[tuple[str, str], tuple[str, bytes]]) -> None:
        """Walk the chunk ``wanted`` decoded, given the values found of those it wanted."""
        for checkpoint_id, inline, versions in self._chunk:
            for channel in list(self._walking):
                self._walked[channel].append(checkpoint_id)
                found = stored.get((channel, versions[channel])) if channel in versions else None
                if channel in inline:
                    self._inline_seeds[channel] = inline[channel]
                elif found is not None:
                    self._stored_seeds[channel] = found
                else:
                    continue
                self._walking.remove(channel)
            if not self._walking:
                break
        self._chunk = []

    def walked(self) -> set[str]:
        """The ancestors whose writes are part of some channel's history."""
        return {checkpoint_id for walked in self._walked.values() for checkpoint_id in walked}

    def histories(
        self,
        writes: Mapping[str, Sequence[TaskWrites]],
        load: Callable[[str, bytes], Any],
    ) -> dict[str, DeltaChannelHistory]:
        """Each channel's writes, oldest first, and its seed, given the walked ancestors' writes.

        Within one checkpoint the writes are in LangGraph's ``writes_sort_key`` order (task
        path, task id, index), the order in which a super-step applies them.
        """
        wanted = set(self.channels)
        by_checkpoint: dict[str, dict[str, list[tuple[tuple[str, str, int], str, str, bytes]]]]
        by_checkpoint = {}
        for checkpoint_id, tasks in writes.items():
            found = by_checkpoint.setdefault(checkpoint_id, {})
            for task_id, task_path, packed in tasks:
                for idx, channel, value_type, value in unpack_writes(packed):
                    if channel in wanted:
                        key = writes_sort_key(task_path, task_id, idx)
                        found.setdefault(channel, []).append((key, task_id, value_type, value))
        result: dict[str, DeltaChannelHistory] = {}
        for channel in self.channels:
            replayed: list[PendingWrite] = []
            for checkpoint_id in reversed(self._walked[channel]):
                entries = by_checkpoint.get(checkpoint_id, {}).get(channel, [])
                replayed.extend(
                    (task_id, channel, load(value_type, value))
                    for _, task_id, value_type, value in sorted(entries, key=lambda e: e[0])
                )
            history: DeltaChannelHistory = {"writes": replayed}
            if channel in self._inline_seeds:
                history["seed"] = self._inline_seeds[channel]
            elif channel in self._stored_seeds:
                history["seed"] = load(*self._stored_seeds[channel])
            result[channel] = history
        return result


def _sizes() -> Iterator[int]:
    """1, 2, 4… up to ``_LARGEST_CHUNK``, then that for ever: a short walk reads little."""
    size = 1
    while True:
        yield size
        size = min(size * 2, _LARGEST_CHUNK)


def chunks(rows: Iterator[StoredCheckpoint]) -> Iterator[list[StoredCheckpoint]]:
    """``rows`` in chunks of 1, 2, 4… up to ``_LARGEST_CHUNK``: a short walk reads little."""
    for size in _sizes():
        chunk = list(itertools.islice(rows, size))
        if not chunk:
            return
        yield chunk


async def achunks(rows: AsyncIterator[StoredCheckpoint]) -> AsyncIterator[list[StoredCheckpoint]]:
    """``chunks`` of an asynchronous iterator."""
    sizes = _sizes()
    size = next(sizes)
    chunk: list[StoredCheckpoint] = []
    async for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk, size = [], next(sizes)
    if chunk:
        yield chunk
