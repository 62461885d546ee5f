"""Retry budgets fit long runs: each rejected output has its own budget, reset once it passes.

On the default ``AsyncioScheduler`` with every task sent at once (so handlers run concurrently
and rejections arrive while others are handled): unrelated rejected outputs, however many,
each get the whole budget; one output that keeps failing stops the run; ``per_run`` bounds the
whole run; a rollback goes back to the newest cut before the rejected output, not to the start.
The three ways an output is rejected (a check, a critic, self-evaluation) count alike.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Literal

import pytest
from payloads import get
from pydantic import BaseModel

from agentsnap import (
    Agent,
    AgentState,
    ConfigurationError,
    Context,
    MemoryStore,
    Message,
    RetryPolicy,
    RollbackExhausted,
    RunStatus,
    Runtime,
)
from agentsnap.checks import CheckResult

How = Literal["check", "critic", "self-evaluation"]
HOWS: tuple[How, ...] = ("check", "critic", "self-evaluation")


def flawed(task: str, feedback: Sequence[object], stubborn: set[str]) -> bool:
    """A task's first draft is flawed; redone after feedback about it, it is fine."""
    return task in stubborn or not any(task in str(f) for f in feedback)


class Draft(BaseModel):
    task: str
    ok: bool


def read_draft(message: Message) -> Draft:
    return message.payload_as(Draft)


class Writer(Agent[AgentState]):
    """Drafts one answer per task, for the reviewer."""

    def __init__(self, name: str, how: How, stubborn: set[str]) -> None:
        super().__init__(name)
        self.how = how
        self.stubborn = stubborn

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        task = message.payload_as(dict[str, str])["task"]
        await asyncio.sleep(0)  # let other handlers interleave
        bad = flawed(task, ctx.feedback, self.stubborn)
        ctx.send("reviewer", {"task": task, "ok": not bad}, kind="draft")

    async def evaluate(self, outputs: Sequence[Message], ctx: Context[AgentState]) -> CheckResult:
        if self.how != "self-evaluation":
            return True
        flaws = [draft.task for draft in map(read_draft, outputs) if not draft.ok]
        return f"the draft for {flaws[0]} is flawed" if flaws else True


class Reviewer(Agent[AgentState]):
    """Keeps every draft that reaches it; as a critic, rejects flawed ones."""

    def __init__(self, name: str, critic: bool) -> None:
        super().__init__(name)
        self.critic = critic

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        draft = read_draft(message)
        if self.critic and not draft.ok:
            ctx.reject("writer", f"the draft for {draft.task} is flawed")
        accepted = self.state.memory.setdefault("accepted", [])
        assert isinstance(accepted, list)
        accepted.append(draft.task)


def check_draft(message: Message) -> str | None:
    draft = read_draft(message)
    return None if draft.ok else f"the draft for {draft.task} is flawed"


async def run(
    how: How,
    tasks: list[str],
    *,
    retry: RetryPolicy | None = None,
    stubborn: frozenset[str] = frozenset(),
) -> Runtime:
    runtime = Runtime(store=MemoryStore(), retry=retry)
    async with asyncio.timeout(30):
        async with runtime:
            runtime.add(Writer("writer", how, set(stubborn)))
            runtime.add(Reviewer("reviewer", critic=how == "critic"))
            if how == "check":
                runtime.check("writer", kind="draft", check=check_draft, name="draft-check")
            for task in tasks:
                runtime.send("writer", {"task": task})
            with contextlib.suppress(RollbackExhausted):
                await runtime.run_until_idle()
    return runtime


@pytest.mark.parametrize("how", HOWS)
async def test_five_unrelated_rejected_outputs_pass_under_the_default_policy(how: How) -> None:
    tasks = [f"task-{i}" for i in range(5)]
    runtime = await run(how, tasks)

    run_info = await runtime.store.get_run(runtime.run_id)
    assert run_info.status is RunStatus.SUCCEEDED, run_info.status_reason
    accepted = runtime.agents["reviewer"].state.memory["accepted"]
    assert sorted(accepted) == tasks
    assert len(runtime.rollbacks) == 5
    assert {r.attempt for r in runtime.rollbacks} == {1}  # each output failed once


@pytest.mark.parametrize("how", HOWS)
async def test_one_output_that_keeps_failing_stops_the_run(how: How) -> None:
    tasks = ["task-0", "task-1", "stubborn"]
    runtime = await run(how, tasks, stubborn=frozenset({"stubborn"}))

    run_info = await runtime.store.get_run(runtime.run_id)
    assert run_info.status is RunStatus.FAILED
    assert run_info.status_reason is not None
    assert run_info.status_reason.startswith("RollbackExhausted: ")
    assert "3 time(s) in a row" in run_info.status_reason
    stubborn = [r for r in runtime.rollbacks if "stubborn" in r.reason]
    assert [r.attempt for r in stubborn] == [1, 2]  # the third failure stopped the run


async def test_a_run_budget_bounds_the_rollbacks_of_the_whole_run() -> None:
    tasks = [f"task-{i}" for i in range(4)]
    runtime = await run("check", tasks, retry=RetryPolicy(per_run=2))

    run_info = await runtime.store.get_run(runtime.run_id)
    assert run_info.status is RunStatus.FAILED
    assert len(runtime.rollbacks) == 2
    assert run_info.status_reason is not None
    assert "rolled back 2 time(s), the most the retry policy allows for a whole run" in (
        run_info.status_reason
    )


async def test_a_later_rollback_goes_back_to_a_cut_after_the_outputs_that_passed() -> None:
    """Input fed one task at a time: each rejection goes back to the run's newest cut."""
    runtime = Runtime(store=MemoryStore())
    async with asyncio.timeout(30), runtime:
        runtime.add(Writer("writer", "check", set()))
        runtime.add(Reviewer("reviewer", critic=False))
        runtime.check("writer", kind="draft", check=check_draft, name="draft-check")
        for task in ["task-0", "task-1", "task-2"]:
            before = await runtime.list_snapshots()
            runtime.send("writer", {"task": task})
            await runtime.run_until_idle()
            (rollback,) = runtime.rollbacks[-1:]
            # Back to the newest cut before the rejected draft: the one the run stood on
            # when the task came in (the first one is taken as the first task comes in).
            stood_on = max(before, key=lambda s: s.seq) if before else None
            target = await runtime.store.load_snapshot(rollback.snapshot_id)
            assert target.seq == (1 if stood_on is None else stood_on.seq)

    seqs = {s.id: s.seq for s in await runtime.store.list_snapshots(runtime.run_id)}
    targets = [seqs[r.snapshot_id] for r in runtime.rollbacks]
    assert len(targets) == 3
    assert targets == sorted(set(targets)), targets  # never the same cut twice
    assert runtime.agents["reviewer"].state.memory["accepted"] == ["task-0", "task-1", "task-2"]


def test_the_run_budget_must_not_be_negative() -> None:
    with pytest.raises(ConfigurationError, match=r"per_run=-1\) must be 0 or more"):
        RetryPolicy(per_run=-1)


class Drafter(Agent[AgentState]):
    """Writes a draft for each request; after feedback, a better one."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        version = "better" if ctx.feedback else "first"
        self.state.memory["draft"] = version
        ctx.send("editor", {"draft": version})


class Editor(Agent[AgentState]):
    """Files drafts; asked for a review later, rejects the drafter's first draft."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        if message.kind == "review":
            if self.state.memory.get("filed") == "first":
                ctx.reject("drafter", "the first draft misses the point")
            return
        self.state.memory["filed"] = get(message.payload, "draft", str)


async def test_a_critic_asked_later_undoes_the_work_it_rejects() -> None:
    """Run, go idle (a snapshot at the end), then ask for a review: the rejected work is
    redone, although the newest cut was taken after it."""
    async with asyncio.timeout(30), Runtime(store=MemoryStore()) as runtime:
        runtime.add(Drafter("drafter"))
        runtime.add(Editor("editor"))
        runtime.send("drafter", "write")
        await runtime.run_until_idle()  # the end snapshot holds the first draft
        runtime.send("editor", None, kind="review")
        await runtime.run_until_idle()
        (rollback,) = runtime.rollbacks
        target = await runtime.store.load_snapshot(rollback.snapshot_id)
        assert target.seq == 1  # before the drafter's output, not the end snapshot
        assert runtime.agents["drafter"].state.memory["draft"] == "better"
        assert runtime.agents["editor"].state.memory["filed"] == "better"
