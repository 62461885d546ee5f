"""Where ``ctx.snapshot()`` in a handler puts the cut: at the call, whatever sent the input.

The planner below plans (changes its state), sends the plan to the executor, calls
``ctx.snapshot()``, then changes its state again and sends ``done``. The cut holds the state
as it was at the call, with the planner's input consumed and the plan in flight; ``done``
and the change after the call come after the cut. Going back to the cut does not plan again.
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
    def __init__(self, name: str, *, wait_for_cut: bool = False) -> None:
        super().__init__(name)
        self.handles: list[SnapshotHandle] = []
        self.runs = 0  # outside the state: a rollback does not reset it
        self.wait_for_cut = wait_for_cut

    async def handle(self, message: Message, ctx: Context[PlanState]) -> None:
        self.runs += 1
        self.state.planned += 1
        ctx.send("executor", {"step": 1}, kind="plan")
        self.handles.append(ctx.snapshot())  # the cut after planning
        if self.wait_for_cut:
            await self.handles[-1]
        self.state.log.append("after the call")
        ctx.send("executor", kind="done", headers={"told": str(len(ctx.feedback))})


class Boss(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        ctx.send("planner", message.payload, kind="task")


class Executor(Agent[PlanState]):
    async def handle(self, message: Message, ctx: Context[PlanState]) -> None:
        self.state.log.append(message.kind)
        if message.kind == "plan":
            ctx.send("checker", kind="result")


class Checker(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        pass


def team(runtime: Runtime, planner: Planner | None = None) -> tuple[Planner, Executor]:
    planner = runtime.add(planner or Planner("planner"))
    runtime.add(Boss("boss"))
    executor = runtime.add(Executor("executor"))
    runtime.add(Checker("checker"))
    return planner, executor


def make_runtime(scheduler: str, **options: Any) -> Runtime:
    if scheduler == "scripted":
        return Runtime(scheduler=ScriptedScheduler(), **options)
    return Runtime(scheduler=AsyncioScheduler(), **options)


def check_cut_at_the_call(snapshot: Snapshot, source: str) -> None:
    assert snapshot.initiator == "planner"
    cut = snapshot.agents["planner"]
    # The change made before the call is in; the one after it is not.
    assert (cut.state["planned"], cut.state["log"]) == (1, [])
    # The input is consumed: counted as received, not in flight.
    assert cut.received[source] == 1
    assert snapshot.in_flight(source, "planner") == []
    # The plan, sent before the call, is in flight; "done", sent after it, is not in the cut.
    assert cut.sent == {"executor": 1}
    assert [m.kind for m in snapshot.in_flight("planner", "executor")] == ["plan"]
    assert snapshot.agents["executor"].received.get("planner", 0) == 0
    assert snapshot.agents["executor"].state["log"] == []
    assert_consistent(snapshot)


@pytest.mark.parametrize("scheduler", ["asyncio", "scripted"])
@pytest.mark.parametrize("source", ["$env", "boss"])
async def test_ctx_snapshot_records_the_handler_as_it_is_at_the_call(
    scheduler: str, source: str
) -> None:
    async with make_runtime(scheduler) as runtime:
        planner, executor = team(runtime)
        runtime.send("boss" if source == "boss" else "planner", "write the report")
        async with asyncio.timeout(5):
            await runtime.run_until_idle()
            cut = await planner.handles[0]
        assert planner.state.log == ["after the call"]
        assert executor.state.log == ["plan", "done"]
        check_cut_at_the_call(cut, source)

        # Going back to the cut after planning does not plan again: the plan is delivered
        # again from the cut, and "done", sent after the call, is not redone.
        await runtime.rollback(cut.id, reason="the execution went wrong")
        async with asyncio.timeout(5):
            await runtime.run_until_idle()
        assert planner.runs == 1
        assert (planner.state.planned, planner.state.log) == (1, [])
        assert executor.state.log == ["plan"]


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
    assert executor.state.log == ["plan"]


async def test_an_output_sent_after_the_call_and_rejected_is_redone_from_before_the_handler() -> (
    None
):
    # The cut at the call is complete and written before "done" is sent and rejected; going
    # back to it would not run the planner again, so the rollback goes further back.
    async with Runtime(
        retry=RetryPolicy.attempts(2), snapshot_policy=SnapshotPolicy(at_end=False)
    ) as runtime:
        planner, executor = team(runtime, Planner("planner", wait_for_cut=True))
        runtime.check(
            "planner",
            kind="done",
            check=lambda message: None if message.headers["told"] != "0" else "too early",
        )
        runtime.send("planner", "write the report")
        async with asyncio.timeout(5):
            await runtime.run_until_idle()
        first, *_ = await runtime.list_snapshots()

    (rollback,) = runtime.rollbacks
    assert rollback.agent == "planner"
    assert rollback.snapshot_id == first.id != planner.handles[0].id
    assert planner.runs == 2
    assert (planner.state.planned, planner.state.log) == (1, ["after the call"])
    assert executor.state.log == ["plan", "done"]


class CarefulPlanner(Planner):
    async def evaluate(self, outputs: Sequence[Message], ctx: Context[PlanState]) -> bool:
        return True


async def test_messages_held_for_self_evaluation_come_after_the_cut() -> None:
    async with Runtime() as runtime:
        planner, executor = team(runtime, CarefulPlanner("planner"))
        runtime.send("planner", "write the report")
        async with asyncio.timeout(5):
            await runtime.run_until_idle()
            cut = await planner.handles[0]

    # The plan was held back until the evaluation passed, after the call: not sent in the cut.
    assert cut.agents["planner"].state["planned"] == 1
    assert cut.agents["planner"].sent.get("executor", 0) == 0
    assert cut.channels == []
    assert_consistent(cut)
    assert executor.state.log == ["plan", "done"]
