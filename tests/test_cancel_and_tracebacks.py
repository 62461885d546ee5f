"""Cancelling a run through the store, and the tracebacks a failed run keeps, on every store.

A cancel request is seen by the run's owner at a renewal of its lease: the runtime delivers
nothing more, cancels the handlers under way, raises ``RunCancelled`` from
``run_until_idle`` and closes the run as cancelled; ``resume()`` withdraws the request and
finishes the run. A failed run keeps its handler failures' and its own tracebacks, chains
included and bounded in size, until it is resumed.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import httpx
import pytest

from agentsnap import (
    Agent,
    AgentState,
    ConfigurationError,
    Context,
    Message,
    RunCancelled,
    RunInfo,
    RunStatus,
    Runtime,
)
from agentsnap.inspect import cancel_run, events_table
from agentsnap.records import TRACEBACK_LIMIT, bounded_traceback
from agentsnap.store import Store
from agentsnap.ui.server import create_app

RUNS_VIEW_JS = (
    Path(__file__).resolve().parents[1] / "agentsnap" / "ui" / "static" / "views" / "runs.js"
)


class WorkState(AgentState):
    done: int = 0
    interrupted: int = 0


class Worker(Agent[WorkState]):
    """Works a random while on each job; a job is held while ``hold`` is set."""

    def __init__(self, name: str, hold: asyncio.Event | None = None) -> None:
        super().__init__(name, WorkState())
        self.hold = hold
        self.started = asyncio.Event()
        self.interrupted = 0

    async def handle(self, message: Message, ctx: Context[WorkState]) -> None:
        self.started.set()
        try:
            await asyncio.sleep(random.uniform(0, 0.005))
            if self.hold is not None and self.hold.is_set():
                await asyncio.Event().wait()  # a model that never answers
        except asyncio.CancelledError:
            self.interrupted += 1
            raise
        self.state.done += 1
        if isinstance(message.payload, int) and message.payload > 0:
            ctx.send(self.name, message.payload - 1, kind="job")


class Failing(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        try:
            raise KeyError("missing")
        except KeyError as exc:
            raise RuntimeError(f"could not handle {message.payload}") from exc


async def test_a_cancel_request_stops_the_running_owner_and_resume_finishes(store: Store) -> None:
    hold = asyncio.Event()
    hold.set()
    runtime = Runtime(store=store, lease=6.0)  # renewed, and the request seen, every 2 s
    worker = runtime.add(Worker("worker", hold))

    async def run_and_cancel() -> None:
        async with runtime:  # RunCancelled leaves the block: the run is still cancelled
            runtime.send("worker", 5, kind="job")
            running = asyncio.ensure_future(runtime.run_until_idle())
            await worker.started.wait()
            requested = await cancel_run(store, runtime.run_id[:8], "the customer left")
            assert requested.status is RunStatus.RUNNING
            assert requested.cancel_requested == "the customer left"
            await running

    with pytest.raises(RunCancelled) as raised:
        await run_and_cancel()
    assert raised.value.reason == "the customer left"
    assert worker.interrupted == 1  # the handler under way was cancelled where it waited
    run = await store.get_run(runtime.run_id)
    assert run.status is RunStatus.CANCELLED
    assert run.status_reason is not None
    assert "the customer left" in run.status_reason
    assert run.traceback is None

    with pytest.raises(ConfigurationError, match=r"has ended \(cancelled\)"):
        await cancel_run(store, runtime.run_id)

    async with Runtime(store=store, run_id=runtime.run_id) as again:
        resumed = again.add(Worker("worker"))
        await again.resume()
        await again.run_until_idle()
        assert resumed.state.done == 6  # the held job, then the five it led to
    run = await store.get_run(runtime.run_id)
    assert (run.status, run.cancel_requested) == (RunStatus.SUCCEEDED, None)


async def test_a_run_nobody_runs_is_cancelled_at_once(store: Store) -> None:
    await store.create_run(RunInfo(id="orphan-run"))  # running, but with no owner
    cancelled = await cancel_run(store, "orphan", "no longer needed")
    assert cancelled.status is RunStatus.CANCELLED
    assert cancelled.status_reason == "no longer needed (while no process ran it)"
    assert cancelled.finished_at is not None
    with pytest.raises(ConfigurationError, match="nothing runs to cancel"):
        await cancel_run(store, "orphan-run")


@pytest.mark.store_roles("runs", "log", "leases")
async def test_a_failed_run_keeps_its_tracebacks_until_it_is_resumed(store: Store) -> None:
    async with Runtime(store=store) as runtime:
        runtime.add(Failing("failing"))
        runtime.send("failing", "order-7")
        await runtime.run_until_idle(raise_failures=False)
    run = await store.get_run(runtime.run_id)
    assert run.status is RunStatus.FAILED
    text = run.traceback
    assert text is not None
    assert text.index("KeyError: 'missing'") < text.index("RuntimeError: could not handle order-7")
    assert "The above exception was the direct cause of the following exception" in text
    assert "HandlerFailed: agent 'failing' failed while handling message $env>failing#1" in text

    async with Runtime(store=store, run_id=runtime.run_id) as again:
        again.add(Failing("failing"))
        await again.resume()
        assert (await store.get_run(runtime.run_id)).traceback is None
        await again.run_until_idle(raise_failures=False)
    assert "KeyError" in ((await store.get_run(runtime.run_id)).traceback or "")


def test_a_long_traceback_keeps_its_beginning_and_its_end() -> None:
    errors: list[BaseException] = []
    for i in range(100):
        try:
            try:
                raise KeyError(f"cause {i} " + "k" * 100)
            except KeyError as exc:
                raise ValueError(f"failure {i} " + "v" * 100) from exc
        except ValueError as error:
            errors.append(error)
    whole = bounded_traceback(errors, limit=10**9)
    cut = bounded_traceback(errors)
    assert len(whole) > TRACEBACK_LIMIT
    assert len(cut) <= TRACEBACK_LIMIT
    assert cut.startswith("Traceback (most recent call last):")
    assert "KeyError: 'cause 0 " in cut  # the first failure's chain
    assert cut.endswith("ValueError: failure 99 " + "v" * 100 + "\n")
    assert "characters left out" in cut
    assert whole.startswith(cut[: TRACEBACK_LIMIT // 4])
    assert bounded_traceback([ValueError("short")]) == "ValueError: short\n"


async def test_events_of_a_run_without_a_journal_come_from_its_replay_log(store: Store) -> None:
    async with Runtime(store=store, journal=False) as runtime:
        runtime.add(Worker("worker"))
        runtime.send("worker", 2, kind="job")
        await runtime.run_until_idle()
    rows = await events_table(store, runtime.run_id)
    assert [r.message for r in rows] == [
        "$env>worker#1",
        "worker>worker#1",
        "worker>worker#2",
    ]
    assert all(r.started_at is None and r.sent == [] for r in rows)


async def test_the_inspector_filters_every_run_status_and_shows_tracebacks(store: Store) -> None:
    offered = RUNS_VIEW_JS.read_text().split('choiceSelect("status", "Status", [')[1]
    listed = offered.split("]")[0]
    assert [s.strip().strip('"') for s in listed.split(",")] == [s.value for s in RunStatus]

    async with Runtime(store=store) as runtime:
        runtime.add(Failing("failing"))
        runtime.send("failing", "x")
        await runtime.run_until_idle(raise_failures=False)
    transport = httpx.ASGITransport(app=create_app(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://inspector") as client:
        for status in RunStatus:
            response = await client.get("/api/runs", params={"status": status.value})
            assert response.status_code == 200, response.text
        failed = (await client.get("/api/runs", params={"status": "failed"})).json()["runs"]
        assert [r["id"] for r in failed] == [runtime.run_id]
        assert "KeyError: 'missing'" in failed[0]["traceback"]
