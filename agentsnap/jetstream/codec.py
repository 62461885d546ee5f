"""Names, subjects and the wire form of channel items on NATS JetStream.

**Subjects.** The channel ``src -> dst`` of run ``run`` is the subject
``agentsnap.<run>.<dst>.<src>``, so that one wildcard, ``agentsnap.<run>.<dst>.*``, is
everything ``dst`` receives, and ``agentsnap.<run>.>`` is the whole run (its stream).

**Token encoding.** A NATS subject token may not hold ``.``, ``*``, ``>`` or white space, and
agent names may hold ``.``; run ids may hold anything but NUL. Each name is written as a token
by keeping ``A-Z a-z 0-9 _ -`` and writing every other character as ``%XX`` per UTF-8 byte
(upper-case hex): ``planner.v2`` is ``planner%2Ev2``, the environment ``$env`` is ``%24env``.
``%`` never stands for itself, so the encoding is reversible
([`decode_token`][agentsnap.jetstream.codec.decode_token]).

**Items.** A message's JSON payload is the NATS message's body; everything else travels in
two headers, as few as the server and the client need to read (the client parses headers in
Python, character by character: each further header costs every message):

| header | value |
|---|---|
| ``Nats-Msg-Id`` | the item's id (below): the server drops a second publish of it |
| ``Agentsnap`` | the item's place, fields separated by spaces (below) |
| ``Agentsnap-H-<key>`` | a message header, key and value percent-encoded (only when set) |

The ``Agentsnap`` header of a message is ``m <generation> <seq> <epoch> <json> <src> <dst>
<prev> <kind>``; of a marker, ``k <generation> <after> <snapshot> <src> <dst> <prev>``:

- ``generation``: the rollback generation the sender was in;
- ``seq``, ``epoch``: the message's sequence number and epoch; ``after``, ``snapshot``: the
  sequence number of the last message sent before the marker, and its snapshot;
- ``json``: ``o``, or ``s`` when the body holds an integer beyond 64 bits (read it with
  ``json``, not ``orjson``);
- ``src``, ``dst``: the channel (agent names, which hold no space);
- ``prev``: the id of the item the sender published before on the channel, or ``-``;
- ``kind``: the message's kind, percent-encoded (last, left out when empty).

**Ids.** An item's id is ``<run>/<src>><dst>#<seq>@<generation>`` for a message and
``<run>/<src>><dst>#<after>!<snapshot>@<generation>`` for a marker (names as tokens): the same
item published again, after a reconnect or by a process resumed after a crash, has the same
id, and the server keeps one copy within the stream's duplicate window.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple
from urllib.parse import quote, unquote

import orjson

from agentsnap.bus import Item
from agentsnap.exceptions import PayloadNotSerializable
from agentsnap.messages import EMPTY_HEADERS, Marker, Message

__all__ = [
    "ROOT",
    "Envelope",
    "channel_subject",
    "cuts_subject",
    "decode",
    "decode_token",
    "encode",
    "encode_token",
    "inbox_subject",
    "item_id",
    "order_subject",
    "order_subjects",
    "run_subjects",
    "stream_name",
]

ROOT = "agentsnap"
"""First token of every subject agentsnap publishes to."""

H_ID = "Nats-Msg-Id"
H_ITEM = "Agentsnap"
H_USER = "Agentsnap-H-"
_NONE = "-"

_PLAIN = re.compile(r"[A-Za-z0-9_-]+")
_STREAM_RUN = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def encode_token(text: str) -> str:
    """``text`` as one subject token: ``A-Z a-z 0-9 _ -`` kept, anything else ``%XX``."""
    if _PLAIN.fullmatch(text):
        return text
    return "".join(
        char if char in _SAFE else "".join(f"%{byte:02X}" for byte in char.encode())
        for char in text
    )


def decode_token(token: str) -> str:
    """The text [`encode_token`][agentsnap.jetstream.codec.encode_token] wrote as ``token``."""
    return unquote(token, errors="strict") if "%" in token else token


def channel_subject(run: str, src: str, dst: str) -> str:
    """The subject of the channel ``src -> dst`` of ``run``."""
    return f"{ROOT}.{encode_token(run)}.{encode_token(dst)}.{encode_token(src)}"


def inbox_subject(run: str, dst: str) -> str:
    """The subjects of every channel into ``dst``, as one wildcard."""
    return f"{ROOT}.{encode_token(run)}.{encode_token(dst)}.*"


def cuts_subject(run: str) -> str:
    """The plain NATS subject (outside the run's stream) on which the processes of ``run``
    tell each other how many messages their agents had sent at each recording.
    """  # noqa: D205
    return f"{ROOT}-cuts.{encode_token(run)}"


def order_subject(run: str, worker: str) -> str:
    """The subject, in ``run``'s stream, on which ``worker`` secures its agents' delivery
    order (see [`agentsnap.replay`][agentsnap.replay]).

    It has five tokens: no channel's subject (four) and no receiver's wildcard matches it.
    """  # noqa: D205
    return f"{ROOT}.{encode_token(run)}.%24order.{encode_token(worker)}.log"


def order_subjects(run: str) -> str:
    """The subjects of every worker's delivery order in ``run``'s stream, as one wildcard."""
    return f"{ROOT}.{encode_token(run)}.%24order.*.log"


def run_subjects(run: str) -> str:
    """Every subject of ``run``: what its stream captures."""
    return f"{ROOT}.{encode_token(run)}.>"


def stream_name(run: str) -> str:
    """The name of ``run``'s stream.

    ``AGENTSNAP-<run>`` for a run id of letters, digits, ``_`` and ``-`` (the generated ones);
    otherwise ``AGENTSNAP_`` and a hash of the id, as stream names are file names on the
    server and may not hold ``.``, ``/`` or white space.
    """
    if _STREAM_RUN.fullmatch(run):
        return f"AGENTSNAP-{run}"
    return "AGENTSNAP_" + hashlib.blake2b(run.encode(), digest_size=16).hexdigest()


def item_id(run: str, item: Item, generation: int, after: int) -> str:
    """The de-duplication id of ``item`` sent in ``generation``.

    Args:
        run: The run.
        item: The message or marker.
        generation: The sender's rollback generation.
        after: For a marker, the sequence number of the message sent before it on the
            channel (0 for none); ignored for a message.
    """
    head = f"{encode_token(run)}/{encode_token(item.src)}>{encode_token(item.dst)}#"
    if type(item) is Message:
        return f"{head}{item.seq}@{generation}"
    assert type(item) is Marker
    return f"{head}{after}!{item.snapshot}@{generation}"


class Envelope(NamedTuple):
    """An item read off the wire, with what the channel needs to place it.

    Attributes:
        item: The message or marker.
        generation: The rollback generation its sender was in.
        id: Its de-duplication id.
        prev: The id of the item its sender published before it on the channel; ``None``
            for the first item a sender published (after it started).
        key: ``(generation, seq, 0)`` for a message, ``(generation, after, snapshot)`` for a
            marker: increasing along a channel, so a smaller or equal key is a duplicate.
    """

    item: Item
    generation: int
    id: str
    prev: str | None
    key: tuple[int, int, int]


def encode(
    run: str, item: Item, generation: int, after: int, prev: str | None
) -> tuple[str, dict[str, str], bytes, str]:
    """The subject, headers and body that carry ``item``, and its id.

    Args:
        run: The run.
        item: The message or marker.
        generation: The sender's rollback generation.
        after: The sequence number of the last message sent before ``item`` on the channel
            (used by markers).
        prev: The id of the item published before on the channel, if any.

    Raises:
        PayloadNotSerializable: The payload, kind or a header holds text that is not UTF-8
            (a lone surrogate).
    """
    msg_id = item_id(run, item, generation, after)
    link = prev if prev is not None else _NONE
    try:
        if type(item) is Marker:
            place = f"k {generation} {after} {item.snapshot} {item.src} {item.dst} {link}"
            headers = {H_ID: msg_id, H_ITEM: place}
            body = b""
        else:
            assert type(item) is Message
            try:
                body = orjson.dumps(item.payload)
                reader = "o"
            except TypeError:
                # orjson writes integers of at most 64 bits; the standard library any.
                body = json.dumps(item.payload, separators=(",", ":")).encode()
                reader = "s"
            place = f"m {generation} {item.seq} {item.epoch} {reader} {item.src} {item.dst} {link}"
            if item.kind:
                place += " " + quote(item.kind, safe="")
            headers = {H_ID: msg_id, H_ITEM: place}
            for key, value in item.headers.items():
                headers[H_USER + quote(key, safe="")] = quote(value, safe="")
    except (UnicodeEncodeError, ValueError, TypeError) as exc:
        raise PayloadNotSerializable(item.src, item.dst, f"it cannot be sent: {exc}") from exc
    return channel_subject(run, item.src, item.dst), headers, body, msg_id


def decode(headers: Mapping[str, str], body: bytes) -> Envelope:
    """Read back what [`encode`][agentsnap.jetstream.codec.encode] wrote.

    Raises:
        ValueError: The message was not written by ``encode`` (a header is missing or
            malformed).
    """
    try:
        msg_id = headers[H_ID]
        fields = headers[H_ITEM].split(" ")
        generation = int(fields[1])
        if fields[0] == "k":
            after, snapshot = int(fields[2]), int(fields[3])
            prev = fields[6]
            return Envelope(
                Marker(fields[4], fields[5], snapshot),
                generation,
                msg_id,
                None if prev == _NONE else prev,
                (generation, after, snapshot),
            )
        seq = int(fields[2])
        prev = fields[7]
        user = (
            {
                unquote(key[len(H_USER) :], errors="strict"): unquote(value, errors="strict")
                for key, value in headers.items()
                if key.startswith(H_USER)
            }
            if len(headers) > 2
            else None
        )
        payload = json.loads(body) if fields[4] == "s" else orjson.loads(body)
        message = Message(
            fields[5],
            fields[6],
            seq,
            unquote(fields[8], errors="strict") if len(fields) > 8 else "",
            payload,
            MappingProxyType(user) if user else EMPTY_HEADERS,
            int(fields[3]),
        )
    except (KeyError, IndexError, ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not an agentsnap channel item: {exc!r}") from exc
    return Envelope(
        message, generation, msg_id, None if prev == _NONE else prev, (generation, seq, 0)
    )
