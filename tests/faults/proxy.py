"""A TCP proxy on 127.0.0.1 that fails on command, between a client and its database.

The proxy forwards bytes both ways; a test switches its mode at run time to break the
network the way a real one breaks:

* ``heal()``: forward (the mode it starts in, and the way back from any other);
* ``drop()``: close every open connection at once; new ones are accepted and forwarded.
  ``drop(persist=True)`` also closes every new connection right after accepting it, until
  ``heal()``: the server is "there" but resets every connection;
* ``refuse()``: close every connection and stop listening, so new ones are refused
  (``ECONNREFUSED``) until ``heal()`` listens again on the same port;
* ``delay(seconds)``: forward each chunk ``seconds`` after it arrived (latency, not a
  throughput limit);
* ``blackhole()``: accept connections and keep them open, but forward nothing in either
  direction, not even a close, as in a network partition. ``heal()`` lets what was held back
  through, as TCP does when a partition ends.

It runs an asyncio loop in a background thread, so a test drives it from plain code or from
its own event loop (each call returns once the change is in force)::

    with FaultProxy(("127.0.0.1", 5432)) as proxy:
        url = proxy.url("postgresql://postgres@127.0.0.1:5432/test")
        proxy.blackhole()
        ...
        proxy.heal()
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType
from typing import Any, Self, TypeVar

from sqlalchemy.engine import make_url

__all__ = ["FaultProxy", "Mode", "ProxyStats"]

T = TypeVar("T")

_CHUNK = 65536
_QUEUED_CHUNKS = 64
"""Chunks one direction of a connection holds back (delay, blackhole) before it stops
reading: then TCP's own flow control pushes back on the sender."""
_CALL_TIMEOUT = 10.0


class Mode(StrEnum):
    """What the proxy does with traffic."""

    PASS = "pass"
    DROP = "drop"
    """Every new connection is closed as soon as it is accepted (``drop(persist=True)``)."""
    REFUSE = "refuse"
    BLACKHOLE = "blackhole"


@dataclass(frozen=True)
class ProxyStats:
    """What the proxy has seen so far.

    Attributes:
        accepted: Connections accepted since the proxy started.
        open: Connections open now (held or forwarding).
        dropped: Connections the proxy closed on purpose (drop, refuse, or accepted while
            dropping).
        forwarded: Bytes forwarded, both directions together.
    """

    accepted: int
    open: int
    dropped: int
    forwarded: int


class _Link:
    """One client connection and, once made, its connection to the target."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[Any] | None = None

    def abort(self, *, cancel: bool = True) -> None:
        """Close both sides now, without flushing, as a dropped network does.

        Args:
            cancel: Also cancel the link's task (not when the task itself is closing).
        """
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.transport.abort()
        if cancel and self.task is not None:
            self.task.cancel()


class FaultProxy:
    """A TCP proxy to ``target`` whose failures are switched at run time.

    Args:
        target: ``(host, port)`` to forward to.
        host: Address to listen on.
        port: Port to listen on; ``0`` picks a free one (see ``port``).

    Use it as a context manager, or call ``start()`` and ``close()``.
    """

    def __init__(self, target: tuple[str, int], *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = target
        self.host = host
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._mode = Mode.PASS
        self._delay = 0.0
        self._flowing: asyncio.Event | None = None
        self._accepted = 0
        self._dropped = 0
        self._forwarded = 0

    def __repr__(self) -> str:
        where = f"{self.host}:{self.port} -> {self.target[0]}:{self.target[1]}"
        return f"FaultProxy({where}, {self.mode})"

    # -- life cycle -------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the loop thread and listen; ``port`` is then the port listened on."""
        if self._loop is not None:
            return self
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(
            target=loop.run_forever, name=f"fault-proxy-{self.target[1]}", daemon=True
        )
        self._thread.start()
        self._call(self._setup())
        return self

    def close(self) -> None:
        """Close every connection, stop listening and stop the loop thread."""
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(Exception):
            self._call(self._shutdown())
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(_CALL_TIMEOUT)
        loop.close()
        self._loop = None
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- what a test calls ------------------------------------------------------------------

    @property
    def mode(self) -> Mode:
        """The mode in force."""
        return self._mode

    @property
    def delay_seconds(self) -> float:
        """The latency added to every chunk."""
        return self._delay

    @property
    def stats(self) -> ProxyStats:
        """Connections and bytes seen so far."""
        return ProxyStats(
            accepted=self._accepted,
            open=len(self._links),
            dropped=self._dropped,
            forwarded=self._forwarded,
        )

    def url(self, url: str) -> str:
        """``url`` (a database URL) with its host and port replaced by the proxy's."""
        if self._loop is None:
            raise RuntimeError("start the proxy before asking for its URL")
        parsed = make_url(url).set(host=self.host, port=self.port)
        return parsed.render_as_string(hide_password=False)

    def heal(self) -> None:
        """Forward again: listen if refusing, let held traffic through, no added delay."""
        self._call(self._heal())

    def drop(self, *, persist: bool = False) -> None:
        """Close every open connection at once.

        Args:
            persist: Also close every new connection as soon as it is accepted, until
                ``heal()``. Without it the proxy keeps accepting and forwarding.
        """
        self._call(self._drop(persist))

    def refuse(self) -> None:
        """Close every connection and stop listening, so new ones are refused."""
        self._call(self._refuse())

    def delay(self, seconds: float) -> None:
        """Forward every chunk ``seconds`` after it arrived, both ways."""
        if seconds < 0:
            raise ValueError("a delay is a number of seconds, at least 0")
        self._call(self._set_delay(seconds))

    def blackhole(self) -> None:
        """Accept and keep connections, forward nothing in either direction."""
        self._call(self._blackhole())

    # -- in the loop thread -----------------------------------------------------------------

    def _call(self, work: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        if loop is None:
            work.close()
            raise RuntimeError("the proxy is not running: call start() first")
        return asyncio.run_coroutine_threadsafe(work, loop).result(_CALL_TIMEOUT)

    async def _setup(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        await self._listen()

    async def _listen(self) -> None:
        if self._server is not None:
            return
        self._server = await asyncio.start_server(
            self._accept, self.host, self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop_listening(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    def _abort_all(self) -> None:
        for link in list(self._links):
            link.abort()
            self._dropped += 1
        self._links.clear()

    async def _shutdown(self) -> None:
        await self._stop_listening()
        self._abort_all()
        assert self._flowing is not None
        self._flowing.set()  # wake the held ones, so that they end
        # Every connection's task ends here, in the loop, before the loop stops.
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _heal(self) -> None:
        self._mode = Mode.PASS
        self._delay = 0.0
        await self._listen()
        assert self._flowing is not None
        self._flowing.set()

    async def _drop(self, persist: bool) -> None:
        if persist:
            self._mode = Mode.DROP
        self._abort_all()

    async def _refuse(self) -> None:
        self._mode = Mode.REFUSE
        await self._stop_listening()
        self._abort_all()

    async def _set_delay(self, seconds: float) -> None:
        self._delay = seconds

    async def _blackhole(self) -> None:
        self._mode = Mode.BLACKHOLE
        assert self._flowing is not None
        self._flowing.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._accepted += 1
        if self._mode in {Mode.DROP, Mode.REFUSE}:
            writer.transport.abort()
            self._dropped += 1
            return
        link = _Link(writer)
        link.task = asyncio.current_task()
        self._links.add(link)
        try:
            await self._forward(link, reader)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            link.abort(cancel=False)
            self._links.discard(link)

    async def _forward(self, link: _Link, client: asyncio.StreamReader) -> None:
        flowing = self._flowing
        assert flowing is not None
        await flowing.wait()  # a black hole connects to nobody
        upstream_reader, upstream = await asyncio.open_connection(*self.target)
        link.upstream = upstream
        pipes = [
            asyncio.ensure_future(self._pipe(client, upstream)),
            asyncio.ensure_future(self._pipe(upstream_reader, link.client)),
        ]
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
        # One side closed: close the other after what was written to it.
        for writer in (link.client, upstream):
            writer.close()

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        """Copy ``source`` to ``sink``, holding chunks back while delayed or black-holed."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(_QUEUED_CHUNKS)

        async def take() -> None:
            while True:
                data = await source.read(_CHUNK)
                await queue.put((loop.time(), data))
                if not data:
                    return

        async def give() -> None:
            flowing = self._flowing
            assert flowing is not None
            while True:
                arrived, data = await queue.get()
                await flowing.wait()
                wait = arrived + self._delay - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                    await flowing.wait()  # a black hole may have opened meanwhile
                if not data:
                    return
                sink.write(data)
                await sink.drain()
                self._forwarded += len(data)

        taking = asyncio.ensure_future(take())
        try:
            await give()
        finally:
            taking.cancel()
            await asyncio.gather(taking, return_exceptions=True)
