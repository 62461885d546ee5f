"""One process's connection to NATS JetStream: streams, retention, and the ordered publisher."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import nats
import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

from agentsnap.exceptions import ConfigurationError, TransportError
from agentsnap.jetstream.codec import channel_subject, run_subjects, stream_name

if TYPE_CHECKING:
    from nats.js import JetStreamContext
    from nats.js.manager import JetStreamManager

__all__ = ["JetStreamLink", "Published"]

log = logging.getLogger("agentsnap.jetstream")

_SCHEMES = frozenset({"nats", "tls", "ws", "wss"})
_NO_RESPONDERS = "503"


def redacted(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{netloc}"))


class Published:
    """What an outgoing channel's publishing has reached.

    Attributes:
        pending: Items handed to the publisher whose storage the server has not confirmed.
        acked: Stream sequence of the newest item the server confirmed storing (0 for none).
        duplicates: Publishes the server recognised as copies of an item it had stored.
    """

    __slots__ = ("acked", "duplicates", "pending")

    def __init__(self) -> None:
        self.pending = 0
        self.acked = 0
        self.duplicates = 0


@dataclass(eq=False, slots=True)
class _Entry:
    """One item on its way to the stream; retried as the same bytes until acknowledged."""

    subject: str
    headers: dict[str, str]
    body: bytes
    progress: Published
    """The publishing of the channel it was appended to."""
    order: int
    """Its place among the link's items, in the order appended."""
    sent_at: float = 0.0
    """When (the event loop's clock) it was last published; 0 before."""


class JetStreamLink:
    """A connection to a NATS server with JetStream, shared by the channels of one process.

    Make one with [`connect`][agentsnap.jetstream.JetStreamLink.connect]. It creates and
    purges the streams of runs, and owns the *publisher*: every item an outgoing channel
    appends is published in the order appended, up to ``window`` at a time without waiting,
    and each is published again, as the same bytes and the same ``Nats-Msg-Id``, until the
    server acknowledges storing it (after a timeout, a disconnect, a server restart). The
    server drops the copies of what it had stored; receivers put back in order what a retry
    may have stored out of order (see [`IncomingChannel`][agentsnap.jetstream.IncomingChannel]).

    Attributes:
        url: The server's URL (password hidden).
        reconnects: How many times the connection was re-established.
        disconnected_at: When (the event loop's clock) the connection was lost, or
            ``None`` while connected.
    """

    def __init__(
        self, nc: Client, url: str, *, ack_timeout: float, window: int, max_payload: int
    ) -> None:
        self._nc = nc
        self.url = url
        self._js: JetStreamContext = nc.jetstream()
        self._jsm: JetStreamManager = self._js
        self._ack_timeout = ack_timeout
        self._window = window
        self.max_payload = max_payload
        self.reconnects = 0
        self._reconnect_listeners: list[Callable[[], None]] = []
        self.disconnected_at: float | None = None
        self._queue: deque[_Entry] = deque()
        self._in_flight: dict[str, _Entry] = {}
        self._order = 0
        self._token = 0
        self._wake = asyncio.Event()
        self._idle: list[asyncio.Future[None]] = []
        self._failed: TransportError | None = None
        self._closing = False
        # Retrying: no publish before _resume_at; the next retry waits _backoff seconds.
        self._resume_at = 0.0
        self._backoff = 0.0
        self._reply_prefix = nc.new_inbox() + "."
        self._replies: Subscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._closers: list[Callable[[], object]] = []
        self.before_publish: Callable[[], Awaitable[None]] | None = None
        """Awaited before the items queued by then are published; it does not raise. A
        worker makes its agents' delivery order durable there: what other processes
        receive depends on it."""

    @classmethod
    async def connect(
        cls,
        url: str = "nats://127.0.0.1:4222",
        *,
        connect_timeout: float = 2.0,
        ack_timeout: float = 5.0,
        window: int = 1024,
        name: str | None = None,
    ) -> JetStreamLink:
        """Connect to the NATS server at ``url`` and check it runs JetStream.

        Once connected, the link reconnects on its own for as long as it is open: publishing
        resumes where it stopped and every consumer goes on from the item it last took.

        Args:
            url: ``nats://host:port`` (also ``tls://``, ``ws://``, ``wss://``; several
                servers separated by commas).
            connect_timeout: Seconds to wait for the first connection.
            ack_timeout: Seconds to wait for the server to confirm a publish before
                publishing it again.
            window: Publishes awaiting confirmation at most.
            name: The connection's name, as the server's monitoring shows it.

        Raises:
            ConfigurationError: ``url`` is not a NATS URL, or a number is out of range.
            TransportError: No server answers at ``url``, or it has no JetStream.
        """
        servers = [server.strip() for server in url.split(",") if server.strip()]
        shown = ", ".join(redacted(server) for server in servers)
        for server in servers or [url]:
            scheme = urlsplit(server).scheme
            if scheme not in _SCHEMES:
                raise ConfigurationError(
                    f"{redacted(server)!r} is not a NATS URL: write it as nats://host:4222 "
                    f"(or tls://, ws://, wss://)"
                )
        if connect_timeout <= 0 or ack_timeout <= 0 or window < 1:
            raise ConfigurationError(
                "JetStreamLink.connect needs connect_timeout and ack_timeout above 0 seconds "
                f"and a window of at least 1 (got {connect_timeout}, {ack_timeout}, {window})"
            )
        holder: list[JetStreamLink] = []

        async def reconnected() -> None:
            if holder:
                holder[0]._reconnected()

        async def disconnected() -> None:
            if holder and holder[0].disconnected_at is None:
                holder[0].disconnected_at = asyncio.get_running_loop().time()

        async def quiet(exc: Exception) -> None:
            log.debug("NATS connection to %s: %r", shown, exc)

        try:
            nc = await nats.connect(
                servers=servers,
                connect_timeout=connect_timeout,
                allow_reconnect=True,
                # Give up on a server that never answered after a second try; once
                # connected, reconnect for as long as the link is open (set below).
                max_reconnect_attempts=1,
                reconnect_time_wait=0.25,
                reconnected_cb=reconnected,
                disconnected_cb=disconnected,
                error_cb=quiet,
                name=name,
            )
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            raise TransportError(
                f"cannot reach a NATS server at {shown} ({type(exc).__name__}: {exc}): start "
                "one with JetStream (`nats-server -js`) or pass the URL of a running one"
            ) from exc
        nc.options["max_reconnect_attempts"] = -1
        try:
            await nc.jetstream().account_info()
        except (TimeoutError, nats.errors.Error, nats.js.errors.Error) as exc:
            await nc.close()
            raise TransportError(
                f"the NATS server at {shown} has no JetStream ({type(exc).__name__}): "
                "start it with JetStream enabled (`nats-server -js`)"
            ) from exc
        link = cls(nc, shown, ack_timeout=ack_timeout, window=window, max_payload=nc.max_payload)
        holder.append(link)
        link._replies = await nc.subscribe(link._reply_prefix + "*", cb=link._on_reply)
        link._task = asyncio.get_running_loop().create_task(
            link._publish_loop(), name="agentsnap:jetstream-publisher"
        )
        return link

    @property
    def nc(self) -> Client:
        """The NATS client."""
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        """The JetStream context of the client."""
        return self._js

    # -- streams ----------------------------------------------------------------------------

    async def ensure_stream(
        self,
        run: str,
        *,
        duplicate_window: float = 120.0,
        max_bytes: int | None = None,
        max_msgs: int | None = None,
        max_age: float | None = None,
    ) -> str:
        """Create ``run``'s stream unless it exists, and return its name.

        The stream keeps every subject of the run (``agentsnap.<run>.>``) in files, until
        [`purge_below`][agentsnap.jetstream.JetStreamLink.purge_below] drops what no retained
        snapshot needs. With a limit set, a full stream refuses new items rather than dropping
        old ones a snapshot may still need to replay.

        Args:
            run: The run.
            duplicate_window: Seconds within which a publish with an id already stored is
                dropped: at least the longest a process may be gone and publish again.
            max_bytes: Bytes the stream may hold, if limited.
            max_msgs: Items the stream may hold, if limited.
            max_age: Seconds an item is kept at most, if limited.
        """
        name = stream_name(run)
        limited = max_bytes is not None or max_msgs is not None or max_age is not None
        config = StreamConfig(
            name=name,
            subjects=[run_subjects(run)],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            discard=DiscardPolicy.NEW if limited else DiscardPolicy.OLD,
            duplicate_window=duplicate_window,
            max_bytes=max_bytes if max_bytes is not None else -1,
            max_msgs=max_msgs if max_msgs is not None else -1,
            max_age=max_age if max_age is not None else 0,
        )
        try:
            try:
                await self._jsm.add_stream(config)
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code != 10058:  # name already in use with another configuration
                    raise TransportError(f"cannot create the stream {name}: {exc}") from exc
                await self._jsm.update_stream(config)
        except (TimeoutError, nats.errors.Error) as exc:
            raise TransportError(
                f"the NATS server at {self.url} did not create the stream {name} "
                f"({type(exc).__name__}: {exc}): check that it runs, with JetStream"
            ) from exc
        return name

    async def purge_below(
        self, run: str, seq: int, *, channel: tuple[str, str] | None = None
    ) -> None:
        """Drop the items of ``run`` below stream sequence ``seq`` (keep ``seq`` onwards).

        Call it with the lowest sequence the oldest snapshot still retained needs to replay
        (per channel, the start of its range in flight); nothing at or above it is touched.

        Args:
            run: The run.
            seq: The first stream sequence to keep.
            channel: ``(src, dst)`` to purge that channel's subject only.
        """
        subject = channel_subject(run, *channel) if channel is not None else None
        await self._jsm.purge_stream(stream_name(run), seq=seq, subject=subject)

    async def keep_last(self, run: str, count: int, *, channel: tuple[str, str]) -> None:
        """Drop all but the newest ``count`` items of one channel of ``run``.

        Args:
            run: The run.
            count: Items to keep (at least 1).
            channel: ``(src, dst)``: whose subject to trim.
        """
        if count < 1:
            raise ConfigurationError(f"keep_last keeps at least 1 item, not {count}")
        await self._jsm.purge_stream(
            stream_name(run), subject=channel_subject(run, *channel), keep=count
        )

    async def delete_stream(self, run: str) -> bool:
        """Delete ``run``'s stream and everything in it; ``False`` when there was none."""
        try:
            return await self._jsm.delete_stream(stream_name(run))
        except nats.js.errors.NotFoundError:
            return False

    async def consumer_floor(self, run: str) -> int | None:
        """The lowest stream sequence a consumer of ``run`` has not acknowledged yet.

        That is one above the lowest acknowledgement floor among the stream's consumers;
        ``None`` when the stream has no consumer.
        """
        name = stream_name(run)
        floors: list[int] = []
        offset = 0
        while True:
            infos = await self._jsm.consumers_info(name, offset=offset or None)
            floors.extend(
                info.ack_floor.stream_seq + 1
                for info in infos
                if info.ack_floor is not None and info.ack_floor.stream_seq is not None
            )
            offset += len(infos)
            if len(infos) < 256:  # the server lists 256 consumers at a time
                return min(floors) if floors else None

    async def has_stream(self, run: str) -> bool:
        """Whether ``run`` has a stream on the server."""
        try:
            await self._jsm.stream_info(stream_name(run))
        except nats.js.errors.NotFoundError:
            return False
        return True

    async def first_sequence(self, run: str) -> int:
        """The stream sequence of the oldest item ``run``'s stream still holds."""
        info = await self._jsm.stream_info(stream_name(run))
        return info.state.first_seq

    async def last_sequence(self, run: str) -> int:
        """The stream sequence of the newest item of ``run`` (0 when none)."""
        info = await self._jsm.stream_info(stream_name(run))
        return info.state.last_seq

    async def read(self, run: str, subject: str) -> list[tuple[int, bytes]]:
        """Every item ``run``'s stream holds on ``subject`` (a wildcard may name several),
        oldest first, as ``(stream sequence, body)``: one round trip to the server each.

        Raises:
            TransportError: The server did not answer.
        """  # noqa: D205
        name = stream_name(run)
        found: list[tuple[int, bytes]] = []
        seq = 1
        try:
            while True:
                try:
                    msg = await self._jsm.get_msg(name, seq=seq, subject=subject, next=True)
                except nats.js.errors.NotFoundError:
                    return found
                at = msg.seq if msg.seq is not None else seq
                found.append((at, msg.data or b""))
                seq = at + 1
        except (TimeoutError, nats.errors.Error) as exc:
            raise TransportError(
                f"the NATS server at {self.url} did not give back the items of {name} on "
                f"{subject} ({type(exc).__name__}: {exc})"
            ) from exc

    async def purge_subject(self, run: str, subject: str, below: int) -> None:
        """Drop the items of ``run``'s stream on ``subject`` (a wildcard may name several)
        below stream sequence ``below``.
        """  # noqa: D205
        await self._jsm.purge_stream(stream_name(run), seq=below, subject=subject)

    # -- publishing -------------------------------------------------------------------------

    async def append(self, subject: str, body: bytes, *, item_id: str, patience: float) -> int:
        """Publish one item at once, beside the ordered publisher, and wait until the server
        stored it.

        What is published once it returned is stored after it. A worker's
        ``before_publish`` secures its agents' delivery order this way.

        Args:
            subject: Where to publish it.
            body: The item.
            item_id: Its ``Nats-Msg-Id``: the server stores one copy of an id.
            patience: Seconds to wait for the server's acknowledgement.

        Returns:
            The stream sequence it was stored at.

        Raises:
            TransportError: The server did not acknowledge it in time, or refused it.
        """  # noqa: D205
        try:
            ack = await self._js.publish(
                subject, body, timeout=patience, headers={"Nats-Msg-Id": item_id}
            )
        except (TimeoutError, nats.errors.Error) as exc:
            raise TransportError(
                f"the NATS server at {self.url} did not store an item on {subject} "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        return ack.seq

    def publish(
        self, subject: str, headers: dict[str, str], body: bytes, progress: Published
    ) -> None:
        """Queue an item for the stream, after every item queued before it.

        Raises:
            TransportError: The publisher stopped on an error it cannot retry, or the link
                is closed.
        """
        if self._failed is not None:
            raise self._failed
        if self._closing:
            raise TransportError(f"the link to {self.url} is closed: no item can be sent")
        self._order += 1
        self._queue.append(_Entry(subject, headers, body, progress, self._order))
        progress.pending += 1
        if not self._wake.is_set():
            self._wake.set()

    async def flush(self) -> None:
        """Wait until the server has confirmed storing every item queued so far.

        Raises:
            TransportError: The publisher stopped on an error it cannot retry.
        """
        if self._failed is not None:
            raise self._failed
        if not self._queue and not self._in_flight:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._idle.append(waiter)
        await waiter

    def _settled(self) -> None:
        if self._queue or self._in_flight:
            return
        idle, self._idle = self._idle, []
        for waiter in idle:
            if not waiter.done():
                if self._failed is not None:
                    waiter.set_exception(self._failed)
                else:
                    waiter.set_result(None)

    async def _publish_loop(self) -> None:
        loop = asyncio.get_running_loop()
        queue, in_flight, nc = self._queue, self._in_flight, self._nc
        while not self._closing:
            ready = len(queue)
            gate = self.before_publish
            if gate is not None and ready:
                await gate()
            while (
                ready
                and queue
                and len(in_flight) < self._window
                and nc.is_connected
                and loop.time() >= self._resume_at
            ):
                entry = queue.popleft()
                ready -= 1
                self._token += 1
                token = str(self._token)
                in_flight[token] = entry
                entry.sent_at = loop.time()
                try:
                    await nc.publish(
                        entry.subject,
                        entry.body,
                        reply=self._reply_prefix + token,
                        headers=entry.headers,
                    )
                except (nats.errors.Error, OSError) as exc:
                    log.debug("publish to %s failed (%r); retrying", entry.subject, exc)
                    self._retry_all()
                    break
            self._wake.clear()
            if (
                not ready
                and queue
                and len(in_flight) < self._window
                and nc.is_connected
                and loop.time() >= self._resume_at
            ):
                continue  # queued while the gate was awaited: through the gate with them
            now = loop.time()
            if in_flight:
                # In the order published: the first is the oldest still unconfirmed.
                oldest = next(iter(in_flight.values())).sent_at
                wait: float | None = max(0.0, oldest + self._ack_timeout - now)
            elif queue:
                wait = max(0.05 if not nc.is_connected else 0.0, self._resume_at - now)
            else:
                wait = None
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except TimeoutError:
                if in_flight:
                    oldest = next(iter(in_flight.values())).sent_at
                    if oldest + self._ack_timeout <= loop.time():
                        log.debug("publishes unconfirmed for %ss: again", self._ack_timeout)
                        self._retry_all()

    def _retry_all(self) -> None:
        """Queue every unconfirmed publish again, in the order first queued, ahead of the rest.

        Replies still on their way for the old attempts are ignored; the new attempts of what
        the server had stored are recognised as duplicates and confirmed with the first copy's
        sequence. Retries without a confirmation in between wait longer each time (up to a
        second), so a server that answers at once that it cannot store yet is not flooded.
        """
        if not self._in_flight:
            return
        retry = sorted(self._in_flight.values(), key=lambda entry: entry.order)
        self._in_flight.clear()
        self._queue.extendleft(reversed(retry))
        self._resume_at = asyncio.get_running_loop().time() + self._backoff
        self._backoff = min(max(self._backoff * 2, 0.02), 1.0)
        self._wake.set()

    def away_for(self) -> float:
        """Seconds since the connection was lost (0.0 while connected)."""
        if self.disconnected_at is None:
            return 0.0
        return asyncio.get_running_loop().time() - self.disconnected_at

    def _reconnected(self) -> None:
        self.reconnects += 1
        self.disconnected_at = None
        # What was in flight when the connection broke may never be answered: send again now.
        self._retry_all()
        for listener in list(self._reconnect_listeners):
            listener()

    def on_reconnect(self, listener: Callable[[], None]) -> None:
        """Have ``listener`` called each time the connection is re-established."""
        self._reconnect_listeners.append(listener)

    async def _on_reply(self, msg: Msg) -> None:
        token = msg.subject[len(self._reply_prefix) :]
        entry = self._in_flight.get(token)
        if entry is None:
            return  # an earlier attempt's late reply
        if msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
            # No stream yet or the server is restarting: publish it again.
            self._retry_all()
            return
        try:
            reply = orjson.loads(msg.data)
        except orjson.JSONDecodeError:
            reply = {"error": {"description": msg.data.decode(errors="replace")}}
        error = reply.get("error") if isinstance(reply, dict) else None
        if error is not None:
            description = error.get("description", error) if isinstance(error, dict) else error
            code = error.get("code") if isinstance(error, dict) else None
            if code == 503:
                self._retry_all()
                return
            self._fail(
                TransportError(
                    f"the NATS server refused to store an item on {entry.subject}: "
                    f"{description}; raise the stream's limits or purge it"
                )
            )
            return
        del self._in_flight[token]
        self._backoff = 0.0
        progress = entry.progress
        progress.pending -= 1
        seq = reply.get("seq", 0)
        if reply.get("duplicate"):
            progress.duplicates += 1
        if isinstance(seq, int) and seq > progress.acked:
            progress.acked = seq
        if len(self._in_flight) < self._window and self._queue and not self._wake.is_set():
            self._wake.set()
        self._settled()

    def _fail(self, error: TransportError) -> None:
        log.error("%s", error)
        self._failed = error
        self._closing = True
        self._queue.clear()
        self._in_flight.clear()
        self._wake.set()
        self._settled()

    # -- closing ----------------------------------------------------------------------------

    def on_close(self, closer: Callable[[], object]) -> None:
        """Have ``closer`` (a transport's ``close``) awaited first when the link closes."""
        self._closers.append(closer)

    async def close(self, drain: float = 10.0) -> None:
        """Publish what is queued (for up to ``drain`` seconds), stop, and drain the connection.

        Transports on the link are closed first. Nothing the link started keeps running.
        """
        for closer in reversed(self._closers):
            result = closer()
            if asyncio.iscoroutine(result):
                await result
        self._closers.clear()
        if self._failed is None and (self._queue or self._in_flight):
            with contextlib.suppress(TimeoutError, TransportError):
                await asyncio.wait_for(self.flush(), drain)
        self._closing = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for waiter in self._idle:
            if not waiter.done():
                waiter.set_exception(TransportError(f"the link to {self.url} closed"))
        self._idle.clear()
        if not self._nc.is_closed:
            with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
                await self._nc.drain()
            if not self._nc.is_closed:
                # A connection lost to a server that went away: closed all the same.
                with contextlib.suppress(OSError):
                    await self._nc.close()
