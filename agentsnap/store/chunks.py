"""Agent states in storage: whole, or with their long lists in shared, content-addressed chunks.

An agent's tool-call history, or a conversation it keeps in ``memory``, only grows; stored
whole in every snapshot, a run of ``N`` tool calls with a snapshot after each would write
``O(N²)`` bytes. So a state is stored in one of two ways, both under the SHA-256 of its full
canonical JSON text (``agentsnap_state_blobs.hash``, the key snapshots refer to):

* **whole**: a state shorter than [`WHOLE_BELOW`][agentsnap.store.chunks.WHOLE_BELOW]
  characters is its text in ``state``, and ``lists`` and ``roots`` are ``NULL`` (every state
  stored before revision 0009 is this way);
* **chunked**: in a longer state, each JSON array that is the value of an object member (at
  any depth, not inside another array) and at least
  [`LIST_MIN`][agentsnap.store.chunks.LIST_MIN] characters long is cut into *leaves*: runs of
  consecutive items, cut greedily from the start of the array as soon as a run reaches
  [`LEAF_MIN`][agentsnap.store.chunks.LEAF_MIN] characters. The items after the last leaf
  (the *tail*) stay in ``state``, which is the state's text with each such array's leaves
  taken out: still a JSON object, with those arrays cut down to their tails.

Leaves and the nodes of a tree over them are rows of ``agentsnap_state_chunks``, keyed by
the SHA-256 of their ``body``: a leaf's body is its items' text as it is in the state (items
separated by commas); a node of ``height`` *h* covers
[`FANOUT`][agentsnap.store.chunks.FANOUT] complete subtrees of height *h - 1*, and its body
is their hashes, 64 hex digits each, one after the other. Only complete nodes exist, so a
node never changes once written: an array of *n* leaves is covered by the complete subtrees
that the digits of *n* in base ``FANOUT`` count, largest first (its *roots*). ``lists``
is the JSON array ``[[offset, leaves], ...]``, one entry per chunked array, in order, where
``offset`` is where (in characters) the array's leaves go back into ``state``, just after
its ``[`` (followed by a comma when a tail follows them), and
``roots`` is the roots' hashes of every chunked array, in order, one after the other.

Appending an item to a long array therefore writes the new tail in ``state``, at most one
new leaf, the nodes that leaf completes (one per leaf on average) and the roots: bytes that
grow with what changed and with the logarithm of the history, never with the history
itself. A rollback or a fork that appends other items shares every leaf and node of the
common prefix. Reading a state fetches its chunks level by level (a batch per tree level,
shared by all the states read together), checks every chunk against its hash and rebuilds
the exact text, which readers check against the state's hash as for a whole state.

The invariant that makes the in-memory caches and garbage collection safe: a chunk in the
table has its whole subtree in the table. A snapshot write sends the chunks its store does
not know to be stored and, in the same transaction, checks that the ones it relies on
(the known roots and the known children of new nodes) are still there, writing every chunk
of its states again if one is not; and
[`delete_unreferenced_states`][agentsnap.store.chunks.delete_unreferenced_states] deletes
whole unreachable subtrees, in one transaction. A store also remembers the leaves of the
arrays it split lately ([`SplitMemo`][agentsnap.store.chunks.SplitMemo]), so that the part
of an array an earlier version had is found by comparing text, not parsed and hashed again.

Example:
    ```python
    from agentsnap.state import canonical_json
    from agentsnap.store.chunks import join_state, split_state

    calls = [{"tool": "search", "arguments": {"day": day}, "result": "ok " * 60}
             for day in range(200)]
    text = canonical_json({"memory": {}, "plan": [], "tool_calls": calls})
    stored = split_state(text)
    assert stored is not None and stored.lists is not None and stored.roots is not None
    print(len(text), len(stored.state), len(stored.chunks))  # 46728 39 78
    assert join_state(stored.state, stored.lists, stored.roots, stored.chunks) == text
    ```
"""

from __future__ import annotations

import json
import json.decoder
import sqlite3
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Column, Connection, Select, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from agentsnap.state import content_hash
from agentsnap.store.tables import SnapshotAgentRow, StateBlobRow, StateChunkRow, table_of

__all__ = [
    "FANOUT",
    "HASH_LENGTH",
    "LEAF_MIN",
    "LIST_MIN",
    "WHOLE_BELOW",
    "ChunkWrites",
    "LoadedStates",
    "SplitMemo",
    "StateLoader",
    "StoredState",
    "delete_unreferenced_states",
    "join_state",
    "split_state",
]

WHOLE_BELOW = 16_384
"""States shorter than this (in characters of canonical JSON) are stored whole."""
LIST_MIN = 4_096
"""Arrays at least this long (in characters, brackets included) are stored in chunks."""
LEAF_MIN = 1_024
"""A leaf closes after the item that brings it to at least this many characters."""
FANOUT = 2
"""Children of a tree node."""
HASH_LENGTH = 64
"""Hex digits of a chunk's hash (SHA-256)."""

_BATCH = 500
_blobs = table_of(StateBlobRow)
_chunks = table_of(StateChunkRow)
_agents = table_of(SnapshotAgentRow)

# The standard library's C scanner: one value from an index, and the index after it.
_scan: Callable[[str, int], tuple[Any, int]] = json.decoder.JSONDecoder().scan_once  # type: ignore[attr-defined]
_scan_string: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


class _NotCompact(Exception):
    """The text is not compact JSON (whitespace, or not JSON at all): store it whole."""


# -- splitting -----------------------------------------------------------------------------


class StoredState(NamedTuple):
    """A state as stored: the columns of its ``agentsnap_state_blobs`` row, and its chunks."""

    state: str
    """The ``state`` column: the whole text, or the text without its arrays' leaves."""
    lists: str | None
    """The ``lists`` column: ``[[offset, leaves], ...]`` as JSON, ``None`` when whole."""
    roots: str | None
    """The ``roots`` column: the roots' hashes, concatenated; ``None`` when whole."""
    chunks: dict[str, tuple[int, str]]
    """Every chunk the state refers to: hash -> (height, body)."""
    parents: dict[str, tuple[str, ...]]
    """The children of every node of ``chunks``: hash -> child hashes."""
    root_hashes: tuple[str, ...]
    """The roots, in order."""


class _Prefix(NamedTuple):
    """The leaves of an array split before, with the tree over them."""

    leaves: list[str]
    """The leaves' texts."""
    levels: list[list[str]]
    """The hashes of the leaves (``levels[0]``) and of the complete nodes of each height."""
    size: int
    """Characters of the leaves' texts."""


class _Found(NamedTuple):
    """A long array found in a state's text."""

    opening: int
    """Where its ``[`` is."""
    prefix: _Prefix | None
    """An array split before whose first ``matched`` leaves begin this one."""
    matched: int
    items: list[tuple[int, int]]
    """Where each item after the matched leaves starts and ends."""
    end: int
    """Where its ``]`` is."""


class SplitMemo:
    """The leaves of the long arrays split lately, for recognising an array's unchanged part.

    A leaf whose text is found again at the start of an array (or right after the leaves
    before it), followed by a comma or the closing bracket, holds the same items as before,
    so the same leaf: greedy cuts depend only on the items' lengths. The part of an array
    that an earlier version had is thus matched by comparing text, without parsing or
    hashing it again; only the items after it are read.

    Args:
        keys: How many array beginnings to remember before forgetting them all.
        characters: How many characters of leaves to hold before forgetting them all.
    """

    _KEY = 64
    _PER_KEY = 4

    def __init__(self, keys: int = 1_024, characters: int = 16_000_000) -> None:
        self._keys = keys
        self._characters = characters
        self._held = 0
        self._prefixes: dict[str, list[_Prefix]] = {}

    def match(self, text: str, start: int) -> tuple[_Prefix | None, int, int]:
        """The remembered array whose leaves begin the array at ``start`` the longest way.

        Returns:
            That array (``None`` if none), how many of its leaves match, and where the comma
            or bracket after the last of them is.
        """
        best: _Prefix | None = None
        matched, after = 0, start
        for prefix in self._prefixes.get(text[start : start + self._KEY], ()):
            count, at, separator = 0, start, start
            for leaf in prefix.leaves:
                following = at + len(leaf)
                mark = text[following : following + 1]
                if mark not in {",", "]"} or not text.startswith(leaf, at):
                    break
                count += 1
                separator = following
                if mark == "]":
                    break
                at = following + 1
            if count > matched:
                best, matched, after = prefix, count, separator
        return best, matched, after

    def remember(self, key: str, prefix: _Prefix, replacing: _Prefix | None) -> None:
        """Remember the leaves of an array that begins with ``key``.

        ``replacing`` (the array it was matched with, which it extends) is forgotten.
        """
        if len(self._prefixes) >= self._keys or self._held + prefix.size > self._characters:
            self._prefixes.clear()
            self._held = 0
        kept = self._prefixes.get(key, [])
        for index, held in enumerate(kept):
            if held is replacing:
                del kept[index]
                self._held -= held.size
                break
        while len(kept) >= self._PER_KEY:
            self._held -= kept.pop().size
        self._prefixes[key] = [prefix, *kept]
        self._held += prefix.size


def split_state(text: str, memo: SplitMemo | None = None) -> StoredState | None:
    """How ``text`` is stored: ``None`` when whole (short, no long array, or not compact).

    Args:
        text: A state's JSON text (canonical JSON, as the runtime encodes states).
        memo: Arrays split before, to recognise the unchanged part of an array by its text.
    """
    if len(text) < WHOLE_BELOW or not text.startswith("{"):
        return None
    found: list[_Found] = []
    try:
        end = _walk_object(text, 0, found, memo)
    except (_NotCompact, StopIteration, ValueError, IndexError, RecursionError):
        return None
    if end != len(text) or not found:
        return None
    pieces: list[str] = []
    entries: list[list[int]] = []
    chunks: dict[str, tuple[int, str]] = {}
    parents: dict[str, tuple[str, ...]] = {}
    roots: list[str] = []
    inserts: list[str] = []
    position = 0  # in text
    removed = 0
    for array in found:
        opening = array.opening
        leaves, tail_start = _leaves(text, array)
        # Take out the leaves and, when a tail follows, the comma after them.
        cut_end = array.end if tail_start is None else tail_start
        pieces.append(text[position : opening + 1])
        entries.append([opening + 1 - removed, len(leaves)])
        removed += cut_end - (opening + 1)
        position = cut_end
        levels = _tree(leaves, array, chunks, parents)
        roots.extend(_roots(levels))
        inserts.append(",".join(leaves))
        if memo is not None:
            key = text[opening + 1 : opening + 1 + SplitMemo._KEY]
            memo.remember(key, _Prefix(leaves, levels, len(inserts[-1])), array.prefix)
    pieces.append(text[position:])
    body = "".join(pieces)
    lists = json.dumps(entries, separators=(",", ":"))
    # The stored form must give the text back exactly; anything else is stored whole.
    joined = _join(
        body, [(offset, leaves) for (offset, _), leaves in zip(entries, inserts, strict=True)]
    )
    if joined != text:
        return None
    return StoredState(body, lists, "".join(roots), chunks, parents, tuple(roots))


def _walk_object(text: str, at: int, found: list[_Found], memo: SplitMemo | None) -> int:
    """Walk the object at ``at``, noting its long arrays; the index just after it."""
    i = at + 1
    if text[i] == "}":
        return i + 1
    while True:
        if text[i] != '"':
            raise _NotCompact
        _, i = _scan_string(text, i + 1)
        if text[i] != ":":
            raise _NotCompact
        i += 1
        first = text[i]
        if first == "{":
            i = _walk_object(text, i, found, memo)
        elif first == "[":
            i = _walk_array(text, i, found, memo)
        else:
            _, i = _scan(text, i)
        separator = text[i]
        if separator == "}":
            return i + 1
        if separator != ",":
            raise _NotCompact
        i += 1


def _walk_array(text: str, at: int, found: list[_Found], memo: SplitMemo | None) -> int:
    """Walk the array at ``at`` item by item; note it when it is long; the index after it.

    The leaves of an earlier version of the array that ``memo`` finds at its start are
    stepped over without reading their items.
    """
    i = at + 1
    if text[i] == "]":
        return i + 1
    prefix, matched, end = memo.match(text, i) if memo is not None else (None, 0, i)
    items: list[tuple[int, int]] = []
    if not matched or text[end] == ",":
        if matched:
            i = end + 1
        while True:
            _, end = _scan(text, i)
            items.append((i, end))
            separator = text[end]
            if separator == "]":
                break
            if separator != ",":
                raise _NotCompact
            i = end + 1
    if end + 1 - at >= LIST_MIN:
        found.append(_Found(at, prefix, matched, items, end))
    return end + 1


def _leaves(text: str, array: _Found) -> tuple[list[str], int | None]:
    """The leaves of an array, and where its tail starts (``None``: no tail)."""
    leaves: list[str] = array.prefix.leaves[: array.matched] if array.prefix else []
    items = array.items
    if not items:
        return leaves, None
    start = items[0][0]
    for index, (_, end) in enumerate(items):
        if end - start >= LEAF_MIN:
            leaves.append(text[start:end])
            if index + 1 == len(items):
                return leaves, None
            start = items[index + 1][0]
    return leaves, start


def _tree(
    leaves: list[str],
    array: _Found,
    chunks: dict[str, tuple[int, str]],
    parents: dict[str, tuple[str, ...]],
) -> list[list[str]]:
    """Add the leaves and the complete nodes over them to ``chunks``; the tree's levels.

    The hashes of the leaves and nodes an earlier version of the array had are taken from
    it, not computed again.
    """
    known = array.prefix.levels if array.prefix is not None else []
    reused = array.matched
    level = known[0][:reused] if known else []
    level += [content_hash(leaf) for leaf in leaves[reused:]]
    for leaf_hash, leaf in zip(level, leaves, strict=True):
        chunks[leaf_hash] = (0, leaf)
    levels = [level]
    height = 0
    while len(level) >= FANOUT:
        height += 1
        reused //= FANOUT
        above = known[height][:reused] if height < len(known) else []
        for start in range(0, len(level) - FANOUT + 1, FANOUT):
            children = tuple(level[start : start + FANOUT])
            body = "".join(children)
            index = start // FANOUT
            node = above[index] if index < len(above) else content_hash(body)
            if index >= len(above):
                above.append(node)
            chunks[node] = (height, body)
            parents[node] = children
        levels.append(above)
        level = above
    return levels


def _roots(levels: list[list[str]]) -> list[str]:
    """The roots of a tree's levels: its complete subtrees under no other, largest first."""
    roots: list[str] = []
    for depth in range(len(levels) - 1, -1, -1):
        covered = FANOUT * len(levels[depth + 1]) if depth + 1 < len(levels) else 0
        roots.extend(levels[depth][covered:])
    return roots


def _root_heights(leaves: int) -> list[int]:
    """The heights of the roots of an array of ``leaves`` leaves, in order (largest first)."""
    digits = []
    while leaves:
        leaves, digit = divmod(leaves, FANOUT)
        digits.append(digit)
    return [height for height in range(len(digits) - 1, -1, -1) for _ in range(digits[height])]


def join_state(body: str, lists: str, roots: str, chunks: dict[str, tuple[int, str]]) -> str:
    """The whole text of a chunked state from its columns and its chunks.

    Raises:
        ValueError: The columns do not describe a chunked state, or a chunk is missing, of
            the wrong height, or not a node; the message says which, in a phrase that
            follows "the state ".
    """
    try:
        entries = json.loads(lists)
    except ValueError:
        raise ValueError("is damaged (its column lists is not JSON)") from None
    if not isinstance(entries, list) or not all(
        isinstance(entry, list)
        and len(entry) == 2
        and all(type(number) is int and number >= 0 for number in entry)
        for entry in entries
    ):
        raise ValueError("is damaged (its column lists is not a list of [offset, leaves])")
    heights = [height for _, leaves in entries for height in _root_heights(leaves)]
    if len(roots) != HASH_LENGTH * len(heights):
        raise ValueError(
            f"is damaged (its column roots holds {len(roots) / HASH_LENGTH:g} hashes where "
            f"its lists need {len(heights)})"
        )
    inserts: list[tuple[int, str]] = []
    at = 0
    previous = -1
    for offset, leaves in entries:
        if offset <= previous or offset > len(body):
            raise ValueError("is damaged (its column lists has an offset out of order)")
        previous = offset
        texts: list[str] = []
        for height in _root_heights(leaves):
            _expand(roots[at : at + HASH_LENGTH], height, chunks, texts)
            at += HASH_LENGTH
        inserts.append((offset, ",".join(texts)))
    return _join(body, inserts)


def _join(body: str, inserts: list[tuple[int, str]]) -> str:
    pieces: list[str] = []
    position = 0
    for offset, leaves in inserts:
        pieces.append(body[position:offset])
        pieces.append(leaves)
        if body[offset : offset + 1] != "]":
            pieces.append(",")
        position = offset
    pieces.append(body[position:])
    return "".join(pieces)


def _expand(
    chunk_hash: str, height: int, chunks: dict[str, tuple[int, str]], texts: list[str]
) -> None:
    found = chunks.get(chunk_hash)
    if found is None:
        raise ValueError(f"is incomplete (the store holds no state chunk {chunk_hash[:12]})")
    stored_height, body = found
    if stored_height != height:
        raise ValueError(
            f"is damaged (its state chunk {chunk_hash[:12]} has height {stored_height} where "
            f"{height} belongs)"
        )
    if height == 0:
        texts.append(body)
        return
    for start in range(0, FANOUT * HASH_LENGTH, HASH_LENGTH):
        _expand(body[start : start + HASH_LENGTH], height - 1, chunks, texts)


# -- writing -------------------------------------------------------------------------------


class ChunkWrites:
    """The chunks a snapshot's write sends, and the ones it relies on being stored.

    Build it before the write with [`add`][agentsnap.store.chunks.ChunkWrites.add] for each
    new state; the write calls [`write`][agentsnap.store.chunks.ChunkWrites.write] (or
    [`write_async`][agentsnap.store.chunks.ChunkWrites.write_async]) after it has inserted
    the snapshot's agent rows, in the same transaction; once that transaction has committed,
    [`committed`][agentsnap.store.chunks.ChunkWrites.committed] adds what it wrote to
    ``known``.

    Args:
        known: Hashes of chunks known to be stored (committed); not sent again.
        mark: The driver's placeholder (``?`` or ``%s``).
        memo: Arrays split before (see [`SplitMemo`][agentsnap.store.chunks.SplitMemo]).
    """

    def __init__(self, known: set[str], mark: str, memo: SplitMemo | None = None) -> None:
        self._known = known
        self._mark = mark
        self._memo = memo
        self.rows: list[tuple[str, int, str]] = []
        """Chunks to insert: (hash, height, body)."""
        self._sent: set[str] = set()
        self._relied: set[str] = set()
        self._states: list[StoredState] = []
        self.rewritten = False
        """Whether a chunk relied on was gone, so that every chunk was written again."""

    def add(self, text: str) -> tuple[str, str | None, str | None]:
        """Note a state to store; its row's ``(state, lists, roots)``."""
        stored = split_state(text, self._memo)
        if stored is None:
            return text, None, None
        self._states.append(stored)
        known, sent = self._known, self._sent
        for chunk_hash, (height, body) in stored.chunks.items():
            if chunk_hash not in known and chunk_hash not in sent:
                sent.add(chunk_hash)
                self.rows.append((chunk_hash, height, body))
        # A chunk known to be stored has its subtree stored: check it, not its subtree.
        relied = self._relied
        relied.update(root for root in stored.root_hashes if root not in sent)
        for node, children in stored.parents.items():
            if node in sent:
                relied.update(child for child in children if child not in sent)
        return stored.state, stored.lists, stored.roots

    def __bool__(self) -> bool:
        return bool(self._states)

    def _insert(self) -> str:
        marks = ", ".join([self._mark] * 3)
        return (
            f"INSERT INTO {_chunks.name} (hash, height, body) VALUES ({marks}) "  # noqa: S608
            "ON CONFLICT (hash) DO NOTHING"
        )

    def _query(self, count: int) -> str:
        marks = ", ".join([self._mark] * count)
        return f"SELECT hash FROM {_chunks.name} WHERE hash IN ({marks})"  # noqa: S608

    @property
    def relied(self) -> list[str]:
        """Hashes of chunks known stored that the new states refer to: checked, not sent."""
        return sorted(self._relied)

    def _relied_batches(self) -> list[tuple[str, ...]]:
        relied = sorted(self._relied)
        return [tuple(relied[i : i + _BATCH]) for i in range(0, len(relied), _BATCH)]

    def _everything(self) -> list[tuple[str, int, str]]:
        rows: dict[str, tuple[str, int, str]] = {}
        for stored in self._states:
            for chunk_hash, (height, body) in stored.chunks.items():
                rows[chunk_hash] = (chunk_hash, height, body)
        return list(rows.values())

    def write(self, connection: sqlite3.Connection) -> None:
        """Insert the chunks, check the ones relied on, all again if one is gone (sqlite3)."""
        insert = self._insert()
        if self.rows:
            connection.executemany(insert, self.rows)
        found = 0
        for batch in self._relied_batches():
            found += len(connection.execute(self._query(len(batch)), batch).fetchall())
        if found < len(self._relied):
            self.rewritten = True
            connection.executemany(insert, self._everything())

    async def write_async(self, connection: AsyncConnection) -> None:
        """As [`write`][agentsnap.store.chunks.ChunkWrites.write], on SQLAlchemy's driver."""
        insert = self._insert()
        if self.rows:
            await connection.exec_driver_sql(insert, self.rows)
        found = 0
        for batch in self._relied_batches():
            found += len((await connection.exec_driver_sql(self._query(len(batch)), batch)).all())
        if found < len(self._relied):
            self.rewritten = True
            await connection.exec_driver_sql(insert, self._everything())

    def committed(self, limit: int) -> None:
        """The write committed: its chunks are stored (``known`` is emptied past ``limit``)."""
        known = self._known
        if self.rewritten:
            known.clear()
        if len(known) > limit:
            known.clear()
        known.update(self._sent)
        known.update(self._relied)
        if self.rewritten:
            known.update(chunk for chunk, _, _ in self._everything())


# -- reading -------------------------------------------------------------------------------


class LoadedStates(NamedTuple):
    """States read back: their texts, and what is wrong with the ones that cannot be read."""

    texts: dict[str, str]
    """State hash -> the state's whole text (not yet checked against the hash)."""
    problems: dict[str, str]
    """State hash -> why it cannot be rebuilt, as a phrase that follows "the state "."""


class StateLoader:
    """Reads states by hash, whole or chunked, sharing the chunks among all it reads.

    A state the store does not hold is in neither part of the result. Chunks are read a tree
    level at a time, each level in batches, and each chunk's body is checked against its
    hash once.
    """

    def __init__(self) -> None:
        # hash -> (height, body) of chunks read and intact
        self._chunks: dict[str, tuple[int, str]] = {}
        self._bad: dict[str, str] = {}

    async def load(self, connection: AsyncConnection, hashes: Sequence[str]) -> LoadedStates:
        """The states of ``hashes`` (each at most once)."""
        reading = self._reading(hashes)
        try:
            query = next(reading)
            while True:
                query = reading.send(list(await connection.execute(query)))
        except StopIteration as done:
            loaded: LoadedStates = done.value
            return loaded

    def load_sync(self, connection: Connection, hashes: Sequence[str]) -> LoadedStates:
        """As [`load`][agentsnap.store.chunks.StateLoader.load], on a synchronous connection."""
        reading = self._reading(hashes)
        try:
            query = next(reading)
            while True:
                query = reading.send(list(connection.execute(query)))
        except StopIteration as done:
            loaded: LoadedStates = done.value
            return loaded

    def _reading(self, hashes: Sequence[str]) -> Generator[Select[Any], list[Any], LoadedStates]:
        """The reads of ``load``, without the connection: yields each query to run, is sent
        its rows, and returns the states.
        """  # noqa: D205
        rows = yield from _batched(_STATE_QUERY, _blobs.c.hash, hashes)
        wanted = self._roots(rows)
        while wanted:
            wanted = self._level((yield from _batched(_CHUNK_QUERY, _chunks.c.hash, wanted)))
        return self._result(rows)

    def _roots(self, rows: Iterable[Any]) -> list[str]:
        wanted: set[str] = set()
        for row in rows:
            if row.roots is not None:
                roots: str = row.roots
                for start in range(0, len(roots), HASH_LENGTH):
                    wanted.add(roots[start : start + HASH_LENGTH])
        return sorted(wanted - self._chunks.keys() - self._bad.keys())

    def _level(self, rows: Iterable[Any]) -> list[str]:
        """Take in one level's chunks; the hashes of the next level down not yet read."""
        below: set[str] = set()
        for row in rows:
            chunk_hash, height, body = row.hash, row.height, row.body
            if content_hash(body) != chunk_hash:
                self._bad[chunk_hash] = (
                    f"is damaged (its state chunk {chunk_hash[:12]} does not match its hash: "
                    "it was changed after it was written)"
                )
                continue
            if height > 0:
                if len(body) != FANOUT * HASH_LENGTH:
                    self._bad[chunk_hash] = (
                        f"is damaged (its state chunk {chunk_hash[:12]} is not a tree node)"
                    )
                    continue
                below.update(
                    body[start : start + HASH_LENGTH] for start in range(0, len(body), HASH_LENGTH)
                )
            self._chunks[chunk_hash] = (height, body)
        return sorted(below - self._chunks.keys() - self._bad.keys())

    def _result(self, rows: Iterable[Any]) -> LoadedStates:
        texts: dict[str, str] = {}
        problems: dict[str, str] = {}
        for row in rows:
            if row.lists is None and row.roots is None:
                texts[row.hash] = row.state
                continue
            try:
                if row.lists is None or row.roots is None:
                    raise ValueError("is damaged (only one of its columns lists and roots is set)")
                texts[row.hash] = join_state(row.state, row.lists, row.roots, self._chunks)
            except ValueError as exc:
                problems[row.hash] = self._bad_reason(row.roots) or str(exc)
        return LoadedStates(texts, problems)

    def _bad_reason(self, roots: str | None) -> str | None:
        """Why a chunk under these roots is damaged, if one is (a better reason than missing)."""
        if not self._bad or roots is None:
            return None
        pending = [roots[i : i + HASH_LENGTH] for i in range(0, len(roots), HASH_LENGTH)]
        while pending:
            chunk_hash = pending.pop()
            if chunk_hash in self._bad:
                return self._bad[chunk_hash]
            found = self._chunks.get(chunk_hash)
            if found is not None and found[0] > 0:
                body = found[1]
                pending.extend(body[i : i + HASH_LENGTH] for i in range(0, len(body), HASH_LENGTH))
        return None


_STATE_QUERY = select(_blobs.c.hash, _blobs.c.state, _blobs.c.lists, _blobs.c.roots)
_CHUNK_QUERY = select(_chunks.c.hash, _chunks.c.height, _chunks.c.body)


# -- garbage collection --------------------------------------------------------------------


def delete_unreferenced_states(connection: Connection) -> int:
    """Delete every stored state no snapshot refers to, and every chunk no state reaches.

    Run it in the transaction that deleted snapshots (or on its own after it). It runs two
    set-based statements (no state or chunk is loaded into Python): the states no row of
    ``agentsnap_snapshot_agents`` names, then the chunks not reachable from the roots of
    the states left, found by a recursive query down the chunk trees. On PostgreSQL it first
    takes a ``SHARE`` lock on ``agentsnap_snapshot_agents``, which waits for snapshot writes
    under way and holds new ones off until the transaction ends, so that no snapshot comes
    to rely on a chunk while it is being deleted (SQLite has one writer at a time anyway).

    Args:
        connection: A connection to the store's database, in a transaction.

    Returns:
        How many rows were deleted (states and chunks).
    """
    dialect = connection.dialect.name
    if dialect == "postgresql":
        connection.execute(text(f"LOCK TABLE {_agents.name} IN SHARE MODE"))
    states = connection.execute(
        text(
            f"DELETE FROM {_blobs.name} WHERE NOT EXISTS "  # noqa: S608
            f"(SELECT 1 FROM {_agents.name} a WHERE a.state_hash = {_blobs.name}.hash)"
        )
    ).rowcount
    # Each state's roots are split 64 characters at a time; each node's body likewise.
    children = " UNION ALL ".join(f"SELECT {k} AS n" for k in range(FANOUT))
    reachable = (
        "WITH RECURSIVE "  # noqa: S608 (table names are this module's constants)
        "position(n) AS ("
        "SELECT 0 UNION ALL SELECT n + 1 FROM position "
        f"WHERE n + 1 < (SELECT COALESCE(MAX(LENGTH(roots)), 0) / {HASH_LENGTH} "
        f"FROM {_blobs.name})), "
        "reachable(hash) AS ("
        f"SELECT SUBSTR(b.roots, 1 + {HASH_LENGTH} * p.n, {HASH_LENGTH}) "
        f"FROM {_blobs.name} b JOIN position p ON {HASH_LENGTH} * p.n < LENGTH(b.roots) "
        "UNION "
        f"SELECT SUBSTR(c.body, 1 + {HASH_LENGTH} * k.n, {HASH_LENGTH}) "
        f"FROM reachable r JOIN {_chunks.name} c ON c.hash = r.hash "
        f"JOIN ({children}) k ON c.height > 0) "
    )
    if dialect == "postgresql":
        # An anti-join: NOT IN over a large subquery can degrade to a scan per row.
        sweep = (
            f"{reachable}DELETE FROM {_chunks.name} WHERE NOT EXISTS "  # noqa: S608
            f"(SELECT 1 FROM reachable r WHERE r.hash = {_chunks.name}.hash)"
        )
    else:
        # SQLite evaluates the uncorrelated NOT IN once, into an index; a statement that
        # starts with DELETE (not WITH) gets its row count from the driver.
        sweep = (
            f"DELETE FROM {_chunks.name} WHERE hash NOT IN "  # noqa: S608
            f"({reachable}SELECT hash FROM reachable)"
        )
    chunks = connection.execute(text(sweep)).rowcount
    return int(states) + int(chunks)


def _batched(
    query: Select[Any], column: Column[str], keys: Sequence[str]
) -> Generator[Select[Any], list[Any], list[Any]]:
    """The rows of ``query`` for each of ``keys`` in ``column``, read ``_BATCH`` keys at a time."""
    rows: list[Any] = []
    for start in range(0, len(keys), _BATCH):
        rows.extend((yield query.where(column.in_(keys[start : start + _BATCH]))))
    return rows
