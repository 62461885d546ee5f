"""The JetStream transport on a real NATS server: every channel in order, each item once.

Two links in one process stand for two processes (each with its own bus, scheduler and
connection); one test runs a real second OS process. The tests that stop and restart a
server start their own (see ``nats_server.py``); the others share the server at
``AGENTSNAP_TEST_NATS_URL`` under names of their own, and delete what they create.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import random
import sys
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats_server import SHARED_URL, OwnServer, free_port, reachable, server_binary, unavailable

from agentsnap.bus import AsyncioScheduler, Bus, Channel, Item
from agentsnap.exceptions import ConfigurationError, PayloadNotSerializable, TransportError
from agentsnap.jetstream import (
    ChannelOffset,
    IncomingChannel,
    JetStreamLink,
    JetStreamTransport,
    OutgoingChannel,
    Published,
)
from agentsnap.jetstream.codec import (
    channel_subject,
    decode,
    decode_token,
    encode,
    encode_token,
    item_id,
    stream_name,
)
from agentsnap.messages import ENVIRONMENT, JsonValue, Marker, Message

HERE = Path(__file__).resolve().parent
PATIENCE = 60.0
"""Seconds a test waits for items before it reports them missing (never reached when green)."""


@pytest.fixture
async def nats_url(tmp_path: Path) -> AsyncIterator[str]:
    """The shared server's URL, or one of this test's own when there is none."""
    if reachable(SHARED_URL):
        yield SHARED_URL
        return
    binary = server_binary()
    if binary is None:
        unavailable(f"no NATS server at {SHARED_URL} and no nats-server binary")
        return
    server = OwnServer(binary, tmp_path / "jetstream")
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterable[OwnServer]:
    """A nats-server of this test's own, which it may stop and start again."""
    binary = server_binary()
    if binary is None:
        unavailable("the nats-server binary is not installed")
        return
    server = OwnServer(binary, tmp_path / "jetstream")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def new_run() -> str:
    return f"test-{uuid.uuid4().hex[:16]}"


class Node:
    """One process of a run: a bus, its scheduler and transport, and what it received."""

    def __init__(
        self,
        link: JetStreamLink,
        run: str,
        local: Collection[str],
        everyone: Iterable[str],
        **options: float,
    ) -> None:
        self.transport = JetStreamTransport(link, run, local, **options)  # type: ignore[arg-type]
        self.scheduler = AsyncioScheduler()
        self.bus = Bus(self.scheduler, self.transport)
        self.received: dict[tuple[str, str], list[Item]] = defaultdict(list)
        self.scheduler.bind(self.bus, self._deliver)
        for name in everyone:
            self.bus.add(name, 0)

    async def _deliver(self, channel: Channel) -> None:
        item = channel.take()
        if type(item) is Message:
            self.bus.delivered(channel, item)
        self.received[item.src, item.dst].append(item)
        if random.random() < 0.1:
            await asyncio.sleep(0)  # a handler that awaits now and then

    async def start(self) -> None:
        self.scheduler.start()
        await self.transport.start()

    def send(self, src: str, dst: str, payload: JsonValue) -> Message:
        return self.bus.send(self.bus.endpoints[src], dst, payload, "message", None)

    def marker(self, src: str, dst: str, snapshot: int) -> None:
        self.bus.post_marker(self.bus.channel(self.bus.endpoints[src], dst), snapshot)

    def count(self) -> int:
        return sum(len(items) for items in self.received.values())

    async def close(self) -> None:
        await self.scheduler.close()
        await self.transport.close()


async def eventually(condition: Callable[[], bool], what: str) -> None:
    """Wait until ``condition()`` holds; fail saying ``what`` was missing after PATIENCE."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    while not condition():
        if loop.time() > deadline:
            pytest.fail(f"{what} never happened")
        await asyncio.sleep(0.01)


def shape(items: Iterable[Item]) -> list[tuple[str, object]]:
    """Items as ``("m", payload)`` and ``("k", snapshot)``: what a channel must keep in order."""
    return [
        ("m", item.payload) if type(item) is Message else ("k", item.snapshot)  # type: ignore[union-attr]
        for item in items
    ]


class Links:
    """Makes links to one server; the test's fixture closes them and deletes the runs' streams."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.made: list[JetStreamLink] = []
        self.runs: list[str] = []

    async def connect(self) -> JetStreamLink:
        link = await JetStreamLink.connect(self.url)
        self.made.append(link)
        return link


@pytest.fixture
async def links(nats_url: str) -> AsyncIterator[Links]:
    made = Links(nats_url)
    yield made
    admin = await JetStreamLink.connect(nats_url)
    for run in made.runs:
        await admin.delete_stream(run)
    await admin.close()
    for link in made.made:
        await link.close()


async def pair(
    links: Links, a: list[str], b: list[str], **options: float
) -> tuple[str, Node, Node]:
    """A new run split over two processes (two links): ``a`` and the environment, and ``b``."""
    run = new_run()
    links.runs.append(run)
    everyone = [*a, *b]
    first = Node(await links.connect(), run, {ENVIRONMENT, *a}, everyone, **options)
    second = Node(await links.connect(), run, set(b), everyone, **options)
    await first.start()
    await second.start()
    return run, first, second


# -- the codec ------------------------------------------------------------------------------

NAMES = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True)
TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=30)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    run=st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), min_size=1),
    src=NAMES | st.just(ENVIRONMENT),
    dst=NAMES,
    seq=st.integers(1, 2**40),
    kind=TEXT,
    payload=JSON,
    headers=st.dictionaries(TEXT, TEXT, max_size=4),
    epoch=st.integers(0, 2**31),
    generation=st.integers(0, 2**31),
    prev=st.none()
    | st.builds(
        lambda run, src, seq: item_id(run, Message(src, "x", seq, "", None, {}, 0), 0, 0),
        TEXT,
        NAMES,
        st.integers(1, 9),
    ),
)
def test_a_message_comes_back_from_the_wire_exactly(
    run: str,
    src: str,
    dst: str,
    seq: int,
    kind: str,
    payload: JsonValue,
    headers: dict[str, str],
    epoch: int,
    generation: int,
    prev: str | None,
) -> None:
    message = Message(src, dst, seq, kind, payload, headers, epoch)
    subject, wire_headers, body, msg_id = encode(run, message, generation, seq, prev)
    # What a NATS server and client carry: printable ASCII header lines, trimmed.
    for key, value in wire_headers.items():
        assert key.isascii()
        assert key.isprintable()
        assert ":" not in key
        assert key.strip() == key
        if key not in {"Agentsnap-Prev"}:
            assert value.isascii()
            assert value.strip() == value
            assert "\r" not in value
    envelope = decode(wire_headers, body)
    assert envelope.item == message
    assert json.dumps(envelope.item.payload) == json.dumps(payload)  # 1 stays 1, 1.0 stays 1.0
    assert (envelope.generation, envelope.id, envelope.prev) == (generation, msg_id, prev)
    assert subject == channel_subject(run, src, dst)
    tokens = subject.split(".")
    assert len(tokens) == 4
    assert [decode_token(token) for token in tokens[1:]] == [run, dst, src]
    for token in tokens:
        assert token
        assert not set(token) & set("*> \t\r\n")


@given(src=NAMES, dst=NAMES, snapshot=st.integers(1, 2**40), after=st.integers(0, 2**40))
def test_a_marker_comes_back_from_the_wire_exactly(
    src: str, dst: str, snapshot: int, after: int
) -> None:
    marker = Marker(src, dst, snapshot)
    _, headers, body, msg_id = encode("run", marker, 3, after, None)
    envelope = decode(headers, body)
    assert envelope.item == marker
    assert envelope.key == (3, after, snapshot)
    assert envelope.id == msg_id


def test_names_become_tokens_reversibly_and_ids_differ_by_place() -> None:
    assert encode_token("planner.v2") == "planner%2Ev2"
    assert encode_token(ENVIRONMENT) == "%24env"
    assert decode_token("planner%2Ev2") == "planner.v2"
    # Two agents whose names differ only by a '.' do not share a subject.
    assert channel_subject("r", "a.b", "c") != channel_subject("r", "a-b", "c")
    assert stream_name("0123abcd") == "AGENTSNAP-0123abcd"
    assert stream_name("my run/1") != stream_name("my run/2")
    first = Message("a", "b", 1, "message", None, {}, 0)
    ids = {
        encode("r", first, 0, 1, None)[3],
        encode("r", first, 1, 1, None)[3],  # another generation
        encode("r", first._replace(seq=2), 0, 2, None)[3],
        encode("r", Marker("a", "b", 1), 0, 1, None)[3],
    }
    assert len(ids) == 4


def test_the_module_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in sys.modules if name.startswith("agentsnap.jetstream")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "nats", None)
    with pytest.raises(ImportError, match=r"pip install 'agentsnap\[nats\]'"):
        importlib.import_module("agentsnap.jetstream")


# -- connecting -----------------------------------------------------------------------------


async def test_an_unreachable_server_is_a_clear_error_naming_the_url() -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    with pytest.raises(TransportError, match="nats-server -js") as caught:
        await JetStreamLink.connect(url)
    assert url in str(caught.value)


async def test_a_url_that_is_not_nats_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="not a NATS URL"):
        await JetStreamLink.connect("http://127.0.0.1:4222")


async def test_a_server_without_jetstream_is_a_clear_error(tmp_path: Path) -> None:
    binary = server_binary()
    if binary is None:
        unavailable("the nats-server binary is not installed")
        return
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        binary,
        "-a",
        "127.0.0.1",
        "-p",
        str(port),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await eventually(lambda: reachable(f"nats://127.0.0.1:{port}"), "the server listening")
        with pytest.raises(TransportError, match="no JetStream"):
            await JetStreamLink.connect(f"nats://127.0.0.1:{port}")
    finally:
        process.terminate()
        await process.wait()


# -- order, once ----------------------------------------------------------------------------


async def test_every_channel_keeps_its_order_with_markers_in_band_across_two_links(
    links: Links,
) -> None:
    a_names, b_names = ["a0", "a1", "a2"], ["b0", "b1", "b2"]
    _run, a, b = await pair(links, a_names, b_names)
    expected: dict[tuple[str, str], list[tuple[str, object]]] = defaultdict(list)
    per_channel = 120

    async def sender(node: Node, src: str, dst: str) -> None:
        for i in range(per_channel):
            node.send(src, dst, {"i": i, "from": src})
            expected[src, dst].append(("m", {"i": i, "from": src}))
            if i % 25 == 24:
                node.marker(src, dst, i // 25 + 1)
                expected[src, dst].append(("k", i // 25 + 1))
            if random.random() < 0.3:
                await asyncio.sleep(random.random() / 1000)

    senders = [sender(a, s, d) for s in a_names for d in b_names]
    senders += [sender(b, s, d) for s in b_names for d in a_names]
    senders += [sender(a, "a0", "a1")]  # a local channel alongside
    await asyncio.gather(*senders)
    total = sum(len(items) for items in expected.values())
    await eventually(lambda: a.count() + b.count() == total, "every item arriving")
    received = {**a.received, **b.received}
    assert set(received) == set(expected)
    for channel, items in expected.items():
        assert shape(received[channel]) == items, f"{channel} out of order or not once"
    assert isinstance(a.bus.channels["a0", "b0"], OutgoingChannel)
    assert isinstance(b.bus.channels["a0", "b0"], IncomingChannel)
    assert type(a.bus.channels["a0", "a1"]).__name__ == "LocalChannel"
    await a.transport.flush()
    assert a.bus.channels["a0", "b0"].published.pending == 0
    incoming = b.transport.incoming["a0", "b0"]
    assert incoming.taken > 0
    assert incoming.duplicates == 0
    await a.close()
    await b.close()


async def test_two_os_processes_exchange_every_item_once_in_order(
    links: Links, nats_url: str
) -> None:
    per_channel = 300
    run, parent, _ = await pair(links, ["p0", "p1"], ["c0", "c1"])
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        str(HERE / "jetstream_child.py"),
        nats_url,
        run,
        str(per_channel),
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])},
    )
    expected: dict[tuple[str, str], list[tuple[str, object]]] = defaultdict(list)
    for i in range(per_channel):
        for src in ["p0", "p1"]:
            for dst in ["c0", "c1"]:
                parent.send(src, dst, i)
        if i % 50 == 0:
            await asyncio.sleep(0.001)
    for src in ["c0", "c1"]:
        for dst in ["p0", "p1"]:
            expected[src, dst] = [("m", i) for i in range(per_channel)]
    await eventually(lambda: parent.count() == 4 * per_channel, "the child's items arriving")
    out, _ = await asyncio.wait_for(child.communicate(), PATIENCE)
    assert child.returncode == 0, out.decode()
    report = json.loads(out.decode().strip().splitlines()[-1])
    assert report == {"in_order": True, "received": 4 * per_channel}
    for channel, items in expected.items():
        assert shape(parent.received[channel]) == items
    await parent.close()


async def test_a_second_publish_of_an_item_is_stored_once(
    links: Links,
) -> None:
    run, a, b = await pair(links, ["a"], ["b"])
    link = a.transport.link
    message = Message("a", "b", 1, "message", {"x": 1}, {}, 0)
    subject, headers, body, _ = encode(run, message, 0, 1, None)
    progress = Published()
    before = await link.last_sequence(run)
    link.publish(subject, headers, body, progress)
    await link.flush()
    link.publish(subject, dict(headers), body, progress)  # after a reconnect, say
    await link.flush()
    assert progress.duplicates == 1
    assert await link.last_sequence(run) == before + 1
    await eventually(lambda: b.count() == 1, "the item arriving")
    await asyncio.sleep(0.2)  # room for a second copy to show up, if one were stored
    assert shape(b.received["a", "b"]) == [("m", {"x": 1})]
    await a.close()
    await b.close()


async def test_items_stored_out_of_order_or_twice_are_taken_in_order_once(
    links: Links,
) -> None:
    """A retried publish may land after the next one, or after the duplicate window."""
    run, a, b = await pair(links, ["a"], ["b"])
    link = a.transport.link
    wire = []
    prev = None
    for seq in range(1, 5):
        message = Message("a", "b", seq, "message", seq, {}, 0)
        subject, headers, body, msg_id = encode(run, message, 0, seq, prev)
        wire.append((subject, headers, body))
        prev = msg_id
    progress = Published()
    late_copy = dict(wire[0][1], **{"Nats-Msg-Id": "stored again much later"})
    for subject, headers, body in [wire[0], wire[2], wire[1], wire[3]]:
        link.publish(subject, headers, body, progress)
        await link.flush()  # one at a time: the stream holds them in exactly this order
    link.publish(wire[0][0], late_copy, wire[0][2], progress)
    await link.flush()
    await eventually(lambda: b.count() == 4, "every item arriving")
    await asyncio.sleep(0.2)
    assert shape(b.received["a", "b"]) == [("m", 1), ("m", 2), ("m", 3), ("m", 4)]
    assert b.transport.incoming["a", "b"].duplicates == 1
    await a.close()
    await b.close()


async def test_items_the_consumer_never_acknowledged_are_not_taken_twice(
    links: Links,
) -> None:
    """The server delivers again what was not acknowledged; the channel takes nothing twice."""
    _run, a, b = await pair(links, ["a"], ["b"], ack_wait=0.5)
    inbox = b.transport._inboxes["b"]
    inbox.ack = False  # as if every acknowledgement were lost on the way
    for i in range(200):
        a.send("a", "b", i)
    await eventually(lambda: b.count() == 200, "the first items arriving")
    await eventually(lambda: inbox.redelivered > 0, "the server delivering again")
    inbox.ack = True
    for i in range(200, 400):
        a.send("a", "b", i)
    await eventually(lambda: b.count() == 400, "the later items arriving")
    await asyncio.sleep(0.5)
    assert shape(b.received["a", "b"]) == [("m", i) for i in range(400)]
    await a.close()
    await b.close()


async def test_items_sent_before_a_rollback_are_dropped_by_a_receiver_that_applied_it(
    links: Links,
) -> None:
    _run, a, b = await pair(links, ["a"], ["b"])
    b.transport.generation = 1  # the receiver has rolled back
    for i in range(5):
        a.send("a", "b", f"old {i}")  # still in flight from before the rollback
    a.transport.generation = 1
    a.bus.channels["a", "b"].clear()
    a.bus.channels["a", "b"].sent = 2  # the cut the rollback went back to
    for i in range(3):
        a.send("a", "b", f"new {i}")
    await eventually(lambda: b.count() == 3, "the new items arriving")
    await a.transport.flush()
    await asyncio.sleep(0.2)
    assert shape(b.received["a", "b"]) == [("m", f"new {i}") for i in range(3)]
    assert [item.seq for item in b.received["a", "b"]] == [3, 4, 5]  # type: ignore[union-attr]
    assert b.transport.incoming["a", "b"].stale == 5
    with pytest.raises(ConfigurationError):
        a.transport.generation = 0
    await a.close()
    await b.close()


async def test_items_sent_before_the_stream_exists_are_published_again_until_stored(
    links: Links,
) -> None:
    """The server answers that nothing stores the subject; the link retries, in order."""
    run = new_run()
    links.runs.append(run)
    everyone = ["a", "b"]
    a = Node(await links.connect(), run, {ENVIRONMENT, "a"}, everyone)
    b = Node(await links.connect(), run, {"b"}, everyone)
    a.scheduler.start()  # the transport is not started: the run has no stream yet
    for i in range(50):
        a.send("a", "b", i)
    outgoing = a.bus.channels["a", "b"]
    assert isinstance(outgoing, OutgoingChannel)
    await asyncio.sleep(0.3)
    assert outgoing.published.pending == 50, "stored with no stream to store it"
    await b.start()  # creates the stream
    await a.transport.flush()
    await eventually(lambda: b.count() == 50, "every item arriving")
    assert shape(b.received["a", "b"]) == [("m", i) for i in range(50)]
    assert await a.transport.link.last_sequence(run) == 50
    await a.close()
    await b.close()


async def test_a_message_larger_than_the_server_takes_is_refused_at_the_send(
    links: Links,
) -> None:
    _run, a, b = await pair(links, ["a"], ["b"])
    a.send("a", "b", "small")
    limit = a.transport.link.max_payload
    with pytest.raises(PayloadNotSerializable, match="max_payload"):
        a.send("a", "b", "x" * limit)
    assert a.send("a", "b", "next").seq == 2
    await eventually(lambda: b.count() == 2, "the two messages arriving")
    assert shape(b.received["a", "b"]) == [("m", "small"), ("m", "next")]
    await a.close()
    await b.close()


# -- offsets and replay ---------------------------------------------------------------------


async def test_a_channel_replayed_from_a_recorded_offset_holds_exactly_what_it_held(
    links: Links,
) -> None:
    _run, a, b = await pair(links, ["a", "x"], ["b"])
    b.scheduler.pause()  # the receiver takes items by hand here
    for i in range(10):
        a.send("a", "b", i)
        a.send("x", "b", f"x{i}")  # another channel into the same agent, interleaved
    incoming = b.transport.incoming
    await eventually(lambda: len(incoming.get(("a", "b"), ())) == 10, "ten items arriving")
    await eventually(lambda: len(incoming.get(("x", "b"), ())) == 10, "ten others arriving")
    channel = incoming["a", "b"]
    seqs = channel.stream_seqs()
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == 10
    for _ in range(3):
        channel.take()
    assert channel.taken == seqs[2]
    offset = channel.offset
    assert offset.stream_seq == seqs[3]
    assert channel.in_flight() == (seqs[3], seqs[9])
    for i in range(10, 15):
        a.send("a", "b", i)
    await eventually(lambda: len(channel) == 12, "five more arriving")
    other = b.transport.incoming["x", "b"]
    held_elsewhere = shape(other)

    b.scheduler.reset()
    await channel.replay_from(offset)
    await eventually(lambda: len(channel) == 12, "the replay")
    assert shape(channel) == [("m", i) for i in range(3, 15)]
    await asyncio.sleep(0.2)
    assert shape(other) == held_elsewhere, "the other channel took something twice"

    b.scheduler.reset()
    await channel.replay_from(ChannelOffset(seqs[7]))  # a bare stream sequence
    await eventually(lambda: len(channel) == 8, "the second replay")
    assert shape(channel) == [("m", i) for i in range(7, 15)]
    b.scheduler.resume()
    await a.close()
    await b.close()


async def test_a_rollback_replays_a_recorded_range_of_an_older_generation_and_nothing_else(
    links: Links,
) -> None:
    _run, a, b = await pair(links, ["a"], ["b"])
    b.scheduler.pause()  # the receiver takes items by hand here
    for i in range(6):
        a.send("a", "b", i)
    await eventually(lambda: len(b.transport.incoming.get(("a", "b"), ())) == 6, "six items")
    channel = b.transport.incoming["a", "b"]
    channel.take()
    # The cut: items 1..5 in flight, recorded as their receiver takes them.
    recorded = []
    for _ in range(5):
        channel.take()
        recorded.append((channel.took, channel.took_after))
    seqs = [seq for seq, _ in recorded]
    for i in range(6, 9):
        a.send("a", "b", i)  # after the cut, before the rollback: to be dropped
    await eventually(lambda: len(channel) == 3, "three more")
    # The rollback: both sides in generation 1; the receiver replays the recorded range.
    a.transport.generation = b.transport.generation = 1
    b.scheduler.reset()
    await channel.replay_from(ChannelOffset(seqs[0], recorded[0][1]), seqs)
    await eventually(lambda: len(channel) == 5, "the range back")
    outgoing = a.bus.channels["a", "b"]
    outgoing.clear()
    outgoing.sent = 6
    for i in range(6, 8):
        a.send("a", "b", f"again {i}")  # sent again after the rollback
    await eventually(lambda: len(channel) == 7, "the new items")
    await a.transport.flush()
    await asyncio.sleep(0.2)
    assert shape(channel) == [("m", i) for i in range(1, 6)] + [("m", "again 6"), ("m", "again 7")]
    assert channel.stale == 3
    assert channel.stream_seqs()[:5] == seqs  # recorded again as they were
    await a.close()
    await b.close()


async def test_purging_below_a_sequence_keeps_what_a_snapshot_needs(
    links: Links,
) -> None:
    run, a, b = await pair(links, ["a"], ["b"])
    for i in range(10):
        a.send("a", "b", i)
    await eventually(lambda: b.count() == 10, "every item arriving")
    channel = b.transport.incoming["a", "b"]
    link = a.transport.link
    keep_from = channel.taken - 4  # the stream holds this channel only: keep the last five
    await link.purge_below(run, keep_from, channel=("a", "b"))
    b.scheduler.pause()
    b.scheduler.reset()
    await channel.replay_from(1)
    await eventually(lambda: len(channel) == 5, "the items kept")
    assert shape(channel) == [("m", i) for i in range(5, 10)]
    await link.keep_last(run, 2, channel=("a", "b"))
    b.scheduler.reset()
    await channel.replay_from(1)
    await eventually(lambda: len(channel) == 2, "the two items kept")
    assert shape(channel) == [("m", 8), ("m", 9)]
    b.scheduler.resume()
    await a.close()
    await b.close()


# -- a server that stops --------------------------------------------------------------------


async def test_items_sent_while_the_server_restarts_arrive_once_in_order(
    own_server: OwnServer,
) -> None:
    link_a = await JetStreamLink.connect(own_server.url, ack_timeout=1.0)
    link_b = await JetStreamLink.connect(own_server.url, ack_timeout=1.0)
    run = new_run()
    a = Node(link_a, run, {ENVIRONMENT, "a0", "a1"}, ["a0", "a1", "b0", "b1"])
    b = Node(link_b, run, {"b0", "b1"}, ["a0", "a1", "b0", "b1"])
    await a.start()
    await b.start()
    total = 600
    channels = [("a0", "b0"), ("a0", "b1"), ("a1", "b0"), ("a1", "b1")]
    try:
        for i in range(total):
            for src, dst in channels:
                a.send(src, dst, i)
            if i == 150:
                await asyncio.to_thread(own_server.stop)
            if i == 300:
                await asyncio.to_thread(own_server.start)
            await asyncio.sleep(0.002)
        await eventually(lambda: b.count() == total * len(channels), "every item arriving")
        await a.transport.flush()
        await asyncio.sleep(0.3)
        for channel in channels:
            assert shape(b.received[channel]) == [("m", i) for i in range(total)], channel
        assert link_a.reconnects >= 1
        assert link_b.reconnects >= 1
    finally:
        await a.close()
        await b.close()
        await link_a.close()
        await link_b.close()


async def test_closing_leaves_nothing_running(links: Links) -> None:
    _run, a, b = await pair(links, ["a"], ["b"])
    for i in range(50):
        a.send("a", "b", i)
    await eventually(lambda: b.count() == 50, "every item arriving")
    link = a.transport.link
    await a.close()
    await b.close()
    await link.close()
    await b.transport.link.close()
    assert link.nc.is_closed
    names = {task.get_name() for task in asyncio.all_tasks()}
    assert not {name for name in names if "jetstream" in name}, names
    with pytest.raises(TransportError, match="closed"):
        a.send("a", "b", "after close")
