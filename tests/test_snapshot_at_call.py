"""Where ``ctx.snapshot()`` in a handler puts the cut: as the handler returns, whatever sent
the input.

The planner below plans (changes its state), sends the plan to the executor, calls
``ctx.snapshot()``, then changes its state again and sends ``done``. The cut holds all of it:
the state as the handler left it, the planner's input consumed, and the plan and ``done`` in
flight. Going back to the cut does not plan again, and loses nothing the planner did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import Field

from agentsnap import (
    Agent,
    AgentState,
    AsyncioScheduler,
    Context,
    Message,
    RetryPolicy,
    Runtime,
    Snapshot,
    SnapshotHandle,
    SnapshotPolicy,
)
from agentsnap.testing import ScriptedScheduler, assert_consistent


class PlanState(AgentState):
    planned: int = 0
    log: list[str] = Field(default_factory=list)


class Planner(Agent[PlanState]):
    def __init__(self, name: str, *, go: asyncio.Event | None = None) -> None:
        super().__init__(name)
        self.handles: list[SnapshotHandle] = []
        self.runs = 0  # outside the state: a rollback does not reset it
        self.go = go
        self.asked = asyncio.Event()  # set once the handler called ctx.snapshot()

    async def handle(self, message: Message, ctx: Context[PlanState]) -> None:
        self.runs += 1
        self.state.planned += 1
        ctx.send("executor", {"step": 1}, kind="plan")
        self.handles.append(ctx.snapshot())  # the cut after planning
        self.asked.set()
        if self.go is not None:
            await self.go.wait()  # the executor may take the plan meanwhile
        self.state.log.append("after the call")
        ctx.send("executor", kind="done", headers={"told": str(len(ctx.feedback))})


class Boss(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        ctx.send("planner", message.payload, kind="task")


class Executor(Agent[PlanState]):
    def __init__(self, name: str, *, took_plan: asyncio.Event | None = None) -> None:
        super().__init__(name)
        self.took_plan = took_plan

    async def handle(self, message: Message, ctx: Context[PlanState]) -> None:
        self.state.log.append(message.kind)
        if message.kind == "plan":
            ctx.send("checker", kind="result")
            if self.took_plan is not None:
                self.took_plan.set()


class Checker(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        pass


def team(
    runtime: Runtime, planner: Planner | None = None, executor: Executor | None = None
) -> tuple[Planner, Executor]:
    planner = runtime.add(planner or Planner("planner"))
    runtime.add(Boss("boss"))
    executor = runtime.add(executor or Executor("executor"))
    runtime.add(Checker("checker"))
    return planner, executor


def make_runtime(scheduler: str, **options: Any) -> Runtime:
    if scheduler == "scripted":
        return Runtime(scheduler=ScriptedScheduler(), **options)
    return Runtime(scheduler=AsyncioScheduler(), **options)


def check_cut_as_the_handler_returns(snapshot: Snapshot, source: str) -> None:
    assert snapshot.initiator == "planner"
    cut = snapshot.agents["planner"]
    # The changes made before and after the call are both in.
    assert (cut.state["planned"], cut.state["log"]) == (1, ["after the call"])
    # The input is consumed: counted as received, not in flight.
    assert cut.received[source] == 1
    assert snapshot.in_flight(source, "planner") == []
    # The plan, sent before the call, and "done", sent after it, are both in flight.
    assert cut.sent == {"executor": 2}
    assert [m.kind for m in snapshot.in_flight("planner", "executor")] == ["plan", "done"]
    assert snapshot.agents["executor"].received.get("planner", 0) == 0
    assert snapshot.agents["executor"].state["log"] == []
    assert_consistent(snapshot)


async def go_back_to(runtime: Runtime, planner: Planner, executor: Executor, cut: Snapshot) -> None:
    # Going back to the cut after planning does not plan again, and loses nothing of the
    # planner's handler: the plan and "done" are delivered again from the cut.
    await runtime.rollback(cut.id, reason="the execution went wrong")
    async with asyncio.timeout(5):
        await runtime.run_until_idle()
    assert planner.runs == 1
    assert (planner.state.planned, planner.state.log) == (1, ["after the call"])
    assert executor.state.log == ["plan", "done"]


@pytest.mark.parametrize("scheduler", ["asyncio", "scripted"])
@pytest.mark.parametrize("source", ["$env", "boss"])
async def test_ctx_snapshot_records_the_handler_as_it_returns(scheduler: str, source: str) -> None:
    async with make_runtime(scheduler) as runtime:
        planner, executor = team(runtime)
        runtime.send("boss" if source == "boss" else "planner", "write the report")
        async with asyncio.timeout(5):
            await runtime.run_until_idle()
            cut = await planner.handles[0]
        assert planner.state.log == ["after the call"]
        assert executor.state.log == ["plan", "done"]
        check_cut_as_the_handler_returns(cut, source)
        await go_back_to(runtime, planner, executor, cut)


@pytest.mark.parametrize("source", ["$env", "boss"])
async def test_a_message_taken_while_the_handler_runs_is_in_flight_in_its_cut(
    source: str,
) -> None:
    # The planner waits after the call until the executor has taken the plan: the executor
    # records before taking it, so the plan is in flight in the cut all the same.
    go = asyncio.Event()
    async with Runtime(scheduler=AsyncioScheduler()) as runtime:
        planner, executor = team(
            runtime, Planner("planner", go=go), Executor("executor", took_plan=go)
        )
        runtime.send("boss" if source == "boss" else "planner", "write the report")
        async with asyncio.timeout(5):
            await runtime.run_until_idle()
            cut = await planner.handles[0]
        assert executor.state.log == ["plan", "done"]
        check_cut_as_the_handler_returns(cut, source)
        await go_back_to(runtime, planner, executor, cut)


@pytest.mark.parametrize("source", ["$env", "boss"])
async def test_a_message_taken_while_the_handler_runs_is_in_flight_on_the_scripted_scheduler(
    source: str,
) -> None:
    go = asyncio.Event()
    scheduler = ScriptedScheduler()
    async with Runtime(scheduler=scheduler) as runtime:
        planner, executor = team(runtime, Planner("planner", go=go))
        runtime.send("boss" if source == "boss" else "planner", "write the report")
        if source == "boss":
            await scheduler.deliver("$env", "boss")
        planning = asyncio.create_task(scheduler.deliver(source, "planner"))
        async with asyncio.timeout(5):
            await planner.asked.wait()
        # The executor takes the plan while the planner's handler still runs.
        await scheduler.deliver("planner", "executor")
        assert not planner.handles[0].done()
        go.set()
        async with asyncio.timeout(5):
            await planning
            await runtime.run_until_idle()
            cut = await planner.handles[0]
        assert executor.state.log == ["plan", "done"]
        check_cut_as_the_handler_returns(cut, source)
        await go_back_to(runtime, planner, executor, cut)


@pytest.mark.parametrize("source", ["$env", "boss"])
async def test_a_rejected_result_goes_back_to_the_cut_after_planning(source: str) -> None:
    # Deliveries one at a time, so that the cut is written before the executor works.
    results: list[str] = []

    def second_try(message: Message) -> str | None:
        results.append(message.kind)
        return "try again" if len(results) == 1 else None

    scheduler = ScriptedScheduler()
    async with Runtime(scheduler=scheduler, retry=RetryPolicy.attempts(2)) as runtime:
        planner, executor = team(runtime)
        runtime.check("executor", kind="result", check=second_try)
        runtime.send("boss" if source == "boss" else "planner", "write the report")
        if source == "boss":
            await scheduler.deliver("$env", "boss")
        await scheduler.deliver(source, "planner")
        # The agents the planner did not write to record at the environment's marker.
        await scheduler.deliver("$env", "boss")
        await scheduler.deliver("$env", "checker")
        async with asyncio.timeout(5):
            cut = await planner.handles[0]
            await runtime.run_until_idle()

    (rollback,) = runtime.rollbacks
    assert (rollback.agent, rollback.snapshot_id) == ("executor", cut.id)
    assert planner.runs == 1
    assert len(results) == 2
    assert executor.state.log == ["plan", "done"]


async def test_a_rejected_output_of_the_handler_is_redone_from_before_it() -> None:
    # "done" is rejected as the planner sends it: its cut never completes, and the rollback
    # goes back to the cut from before the handler, which runs again with the feedback.
    async with Runtime(
        retry=RetryPolicy.attempts(2), snapshot_policy=SnapshotPolicy(at_end=False)
    ) as runtime:
        planner, executor = team(runtime)
        runtime.check(
            "planner",
            kind="done",
            check=lambda message: None if message.headers["told"] != "0" else "too early",
        )
        runtime.send("planner", "write the report")
        async with asyncio.timeout(5):
            await runtime.run_until_idle()
            second = await planner.handles[1]
        first, *_ = await runtime.list_snapshots()

    (rollback,) = runtime.rollbacks
    assert rollback.agent == "planner"
    assert rollback.snapshot_id == first.id
    assert planner.runs == 2
    assert (planner.state.planned, planner.state.log) == (1, ["after the call"])
    assert executor.state.log == ["plan", "done"]
    assert second.agents["planner"].sent == {"executor": 2}
    assert_consistent(second)


class Critic(Executor):
    async def handle(self, message: Message, ctx: Context[PlanState]) -> None:
        if message.kind == "done" and message.headers["told"] == "0":
            ctx.reject("planner", "the plan is done too early")
        await super().handle(message, ctx)


async def test_a_critic_rejecting_an_output_of_the_handler_goes_back_to_before_it() -> None:
    # The cut after planning is written before "done" is rejected; it holds "done" as sent,
    # so it does not precede that output: the rollback goes back to the cut from before the
    # planner's handler, which runs again with the feedback.
    scheduler = ScriptedScheduler()
    async with Runtime(
        scheduler=scheduler,
        retry=RetryPolicy.attempts(2),
        snapshot_policy=SnapshotPolicy(at_end=False),
    ) as runtime:
        planner, executor = team(runtime, executor=Critic("executor"))
        runtime.send("planner", "write the report")
        await scheduler.deliver("$env", "planner")
        for agent in ("boss", "checker"):
            await scheduler.deliver("$env", agent)
        async with asyncio.timeout(5):
            cut = await planner.handles[0]
            await runtime.run_until_idle()
        first, *_ = await runtime.list_snapshots()

    check_cut_as_the_handler_returns(cut, "$env")
    (rollback,) = runtime.rollbacks
    assert (rollback.agent, rollback.snapshot_id) == ("planner", first.id)
    assert first.id != cut.id
    assert planner.runs == 2
    assert (planner.state.planned, planner.state.log) == (1, ["after the call"])
    assert executor.state.log == ["plan", "done"]


class CarefulPlanner(Planner):
    async def evaluate(self, outputs: Sequence[Message], ctx: Context[PlanState]) -> bool:
        return True


async def test_messages_held_for_self_evaluation_are_in_flight_in_the_cut() -> None:
    async with Runtime() as runtime:
        planner, executor = team(runtime, CarefulPlanner("planner"))
        runtime.send("planner", "write the report")
        async with asyncio.timeout(5):
            await runtime.run_until_idle()
            cut = await planner.handles[0]

    # The handler's messages were released once the evaluation passed, before the planner
    # recorded: both are in flight in the cut.
    check_cut_as_the_handler_returns(cut, "$env")
    assert executor.state.log == ["plan", "done"]
