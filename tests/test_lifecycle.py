"""A runtime's life: new, started, running, stopped, closed; and what each phase refuses."""

from __future__ import annotations

import asyncio

import pytest

from agentsnap import (
    Agent,
    AgentState,
    ConfigurationError,
    Context,
    MemoryStore,
    Message,
    Runtime,
    RuntimeClosedError,
    Snapshot,
)
from agentsnap._phases import MOVES as _MOVES
from agentsnap._phases import Phase as _Phase


class Sink(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.state.memory["n"] = int(str(self.state.memory.get("n", 0))) + 1


class SlowList(MemoryStore):
    """A store whose ``list_snapshots`` waits until ``go`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = asyncio.Event()
        self.go = asyncio.Event()

    async def list_snapshots(self, run_id: str) -> list[Snapshot]:
        self.waiting.set()
        await self.go.wait()
        return await super().list_snapshots(run_id)


def phase(runtime: Runtime) -> _Phase:
    """Where ``runtime`` is now (a call, so that type checkers do not narrow it)."""
    return runtime._phases.now


def test_every_phase_can_reach_closed() -> None:
    for phase in _Phase:
        seen, todo = {phase}, [phase]
        while todo:
            for after in _MOVES[todo.pop()]:
                if after not in seen:
                    seen.add(after)
                    todo.append(after)
        assert _Phase.CLOSED in seen, phase


async def test_the_phases_of_a_run() -> None:
    runtime = Runtime()
    runtime.add(Sink("sink"))
    assert phase(runtime) is _Phase.NEW
    runtime.send("sink", 1)  # input before start
    assert phase(runtime) is _Phase.PRIMED
    await runtime.start()
    assert phase(runtime) is _Phase.RUNNING
    await runtime.run_until_idle()
    await runtime.close()
    assert phase(runtime) is _Phase.CLOSED
    with pytest.raises(AssertionError, match="cannot go from"):
        runtime._phases.enter(_Phase.RUNNING)

    started = Runtime()
    started.add(Sink("sink"))
    await started.start()
    assert phase(started) is _Phase.STARTED
    started.send("sink", 1)
    assert phase(started) is _Phase.RUNNING
    await started.close()


async def test_a_closed_runtime_refuses_everything() -> None:
    runtime = Runtime()
    runtime.add(Sink("sink"))
    await runtime.close()
    await runtime.close()  # closing twice is fine
    for call in (runtime.start(), runtime.resume(), runtime.fork_from("any")):
        with pytest.raises(RuntimeClosedError, match="this runtime is closed; create a new"):
            await call
    with pytest.raises(RuntimeClosedError, match="create a new Runtime"):
        runtime.send("sink", 1)
    with pytest.raises(RuntimeClosedError, match="create a new Runtime"):
        runtime.add(Sink("other"))


async def test_resume_and_fork_from_come_first() -> None:
    store = MemoryStore()
    async with Runtime(store=store) as original:
        original.add(Sink("sink"))
        original.send("sink", 1)
        await original.run_until_idle()
        cut = await original.snapshot()

    async with Runtime(store=store) as fed:
        fed.add(Sink("sink"))
        fed.send("sink", 1)
        for call, name in ((fed.resume(), "resume"), (fed.fork_from(cut.id), "fork_from")):
            with pytest.raises(ConfigurationError, match=rf"{name}\(\) must come before"):
                await call

    async with Runtime(store=store) as forked:
        forked.add(Sink("sink"))
        await forked.fork_from(cut.id)
        assert phase(forked) is _Phase.RUNNING
        with pytest.raises(ConfigurationError, match=r"fork_from\(\) must come before"):
            await forked.fork_from(cut.id)
        with pytest.raises(ConfigurationError, match=r"resume\(\) must come before"):
            await forked.resume()


async def test_nothing_comes_in_while_a_resume_is_under_way() -> None:
    store = SlowList()
    async with Runtime(store=store) as original:
        original.add(Sink("sink"))
        original.send("sink", 1)
        await original.run_until_idle()
        original.send("sink", 2)

    runtime = Runtime(store=store, run_id=original.run_id)
    runtime.add(Sink("sink"))
    resuming = asyncio.ensure_future(runtime.resume())
    await store.waiting.wait()
    assert phase(runtime) is _Phase.RESTORING
    with pytest.raises(ConfigurationError, match=r"input sent on run .*resume\(\)"):
        runtime.send("sink", 3)
    with pytest.raises(ConfigurationError, match=r"fork_from\(\) called while resume\(\)"):
        await runtime.fork_from("any")
    store.go.set()
    await resuming
    assert phase(runtime) is _Phase.RUNNING
    await runtime.run_until_idle()
    await runtime.close()


async def test_a_failed_resume_leaves_the_runtime_started() -> None:
    store = SlowList()
    async with Runtime(store=store) as original:
        original.add(Sink("sink"))
        original.send("sink", 1)
        await original.run_until_idle()
        original.send("sink", 2)  # left for a resume

    class Broken(Exception):
        pass

    async def refuse(run_id: str) -> list[Snapshot]:
        raise Broken

    runtime = Runtime(store=store, run_id=original.run_id)
    runtime.add(Sink("sink"))
    store.list_snapshots = refuse  # type: ignore[method-assign]
    with pytest.raises(Broken):
        await runtime.resume()
    assert phase(runtime) is _Phase.STARTED
    await runtime.close()
    assert phase(runtime) is _Phase.CLOSED
