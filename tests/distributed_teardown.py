"""Closing what a test of a run spread over processes opened, whether it passed or not.

Such a test opens NATS connections, a coordinator, workers (hosts in this process, or
``agentsnap worker`` processes), the run's stream and stores, and must close them all, in
order, even when an assertion fails half-way. The ``teardown`` fixture (``conftest.py``)
gives a ``Teardown`` that takes each as the test opens it and closes them after the test:

1. the workers (in-process ones closed, processes killed, and whatever the test handed to
   ``on_close``), in the order given;
2. the coordinators handed to ``run`` (a test that closes its run itself, to check what it
   recorded, hands it to ``stream`` only);
3. the runs' streams (deleted over the first connection);
4. the connections, then the stores.

A test that checks what closing left (a worker process's exit status, the snapshots stored
once every worker stopped) calls ``await teardown.close()`` at that point itself; closing
again does nothing. A helper that runs a run to its end and closes what it opened itself
uses one as an async context manager (``async with Teardown() as opened:``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from agentsnap.distributed import DistributedRun
    from agentsnap.jetstream import JetStreamLink


class _Closes(Protocol):
    async def close(self) -> None: ...


W = TypeVar("W", bound=_Closes)
C = TypeVar("C", bound=_Closes)


class Teardown:
    """What a test opened, closed by ``close`` (see the module's docstring)."""

    def __init__(self) -> None:
        self._workers: list[Callable[[], Awaitable[object]]] = []
        self._runs: list[DistributedRun] = []
        self._streams: list[tuple[str, JetStreamLink | None]] = []
        self._links: list[JetStreamLink] = []
        self._stores: list[_Closes] = []
        self._closed = False

    async def links(self, url: str, count: int) -> list[JetStreamLink]:
        """``count`` new connections to the NATS server at ``url``."""
        from agentsnap.jetstream import JetStreamLink

        return [self.link(await JetStreamLink.connect(url)) for _ in range(count)]

    def link(self, link: JetStreamLink) -> JetStreamLink:
        """A connection, closed after the rest (the first one deletes the streams)."""
        self._links.append(link)
        return link

    def worker(self, worker: W) -> W:
        """A worker in this process (or anything closed with the workers)."""
        self._workers.append(worker.close)
        return worker

    def workers(self, workers: Iterable[W]) -> list[W]:
        """Several workers in this process, closed in this order."""
        return [self.worker(worker) for worker in workers]

    def process(self, process: asyncio.subprocess.Process) -> asyncio.subprocess.Process:
        """A worker (or coordinator) process, killed unless it exited (resumed first, in
        case the test suspended it).
        """
        self._workers.append(lambda: kill(process))
        return process

    def processes(self) -> list[asyncio.subprocess.Process]:
        """A list for the test to put processes in as it starts them: each one is killed
        (as by ``process``) with the workers.
        """
        started: list[asyncio.subprocess.Process] = []

        async def kill_all() -> None:
            for process in started:
                await kill(process)

        self._workers.append(kill_all)
        return started

    def on_close(self, close: Callable[[], Awaitable[object]]) -> None:
        """Something the test made that stops its workers (``close`` is awaited with them)."""
        self._workers.append(close)

    def run(self, run: DistributedRun) -> DistributedRun:
        """A coordinator, closed after the workers; its run's stream is deleted after."""
        self._runs.append(run)
        return self.stream(run)

    def stream(self, run: DistributedRun) -> DistributedRun:
        """A coordinator whose run's stream is deleted after the test (the test closes it)."""
        self._streams.append((run.run_id, None))
        return run

    def stream_of(self, run_id: str, link: JetStreamLink | None = None) -> None:
        """The stream of run ``run_id``, deleted after the test (over ``link``, else over
        the first connection given here).
        """
        self._streams.append((run_id, link))

    def store(self, store: C) -> C:
        """A store, closed last."""
        self._stores.append(store)
        return store

    async def close(self) -> None:
        """Close everything, in order; the first error is raised once all is closed."""
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []

        async def step(work: Callable[[], Awaitable[object]]) -> None:
            try:
                await work()
            except Exception as exc:
                errors.append(exc)

        for close in self._workers:
            await step(close)
        for run in self._runs:
            await step(run.close)
        for run_id, link in self._streams:
            over = link or (self._links[0] if self._links else None)
            if over is not None:
                await step(functools.partial(over.delete_stream, run_id))
        for link in self._links:
            await step(link.close)
        for store in self._stores:
            await step(store.close)
        if errors:
            raise errors[0]

    async def __aenter__(self) -> Teardown:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def kill(process: asyncio.subprocess.Process) -> None:
    """Kill ``process`` unless it exited (resumed first, in case it was suspended)."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGCONT)
            process.kill()
        await process.wait()
