"""A run in one process on a store that implements only the roles such a run needs.

``OneProcessDouble`` (tests/one_process_store.py) is built from the role protocols alone: no
queries for listings, no distributed parts. A runtime takes snapshots on it, rolls back to one
of them when a check rejects an output, and resumes an interrupted run from its last cut.
"""

from __future__ import annotations

from guarantees.review_workflow import TOPICS, Critic, CriticState, Writer
from one_process_store import OneProcessDouble

from agentsnap import RunStatus, Runtime, SnapshotStatus
from agentsnap.store import (
    DistributedParts,
    OneProcessStore,
    RunLeases,
    RunLog,
    RunQueries,
    RunStore,
    Store,
)
from agentsnap.testing import ScriptedScheduler

RUN = "0e9f1d2c" + "0" * 24


def add_team(runtime: Runtime, *, strict: bool) -> None:
    runtime.add(Writer("writer"))
    runtime.add(Critic(strict, None))


def accepted(runtime: Runtime) -> list[str]:
    state = runtime.agents["critic"].state
    assert isinstance(state, CriticState)
    return state.accepted


def test_the_double_claims_the_one_process_roles_and_no_others() -> None:
    double = OneProcessDouble()
    claimed: list[type] = [RunStore, RunLog, RunLeases, OneProcessStore]
    unclaimed: list[type] = [RunQueries, DistributedParts, Store]
    assert [isinstance(double, role) for role in claimed] == [True] * len(claimed)
    assert [isinstance(double, role) for role in unclaimed] == [False] * len(unclaimed)


async def test_a_run_on_the_double_snapshots_rolls_back_and_resumes() -> None:
    store = OneProcessDouble()
    # A run closed with the writer's draft in flight to the strict critic: left interrupted.
    scheduler = ScriptedScheduler()
    async with Runtime(store=store, run_id=RUN, scheduler=scheduler) as runtime:
        add_team(runtime, strict=True)
        runtime.send("critic", "be brief", kind="rubric")
        runtime.send("writer", TOPICS[0], kind="topic")
        await scheduler.deliver("$env", "critic")
        await scheduler.deliver("$env", "writer")
    first, cut = await store.list_snapshots(RUN)
    assert [s.status for s in (first, cut)] == [SnapshotStatus.COMPLETE] * 2
    (in_flight,) = cut.channels
    assert (in_flight.src, in_flight.dst, len(in_flight.messages)) == ("writer", "critic", 1)
    assert (await store.get_run(RUN)).status is RunStatus.INTERRUPTED

    # Resumed from the last cut: the critic rejects the draft in flight, and the run goes back
    # to the first cut, where the writer had not written it yet.
    async with Runtime(store=store, run_id=RUN, scheduler=ScriptedScheduler()) as runtime:
        add_team(runtime, strict=True)
        assert (await runtime.resume()).id == cut.id
        await runtime.run_until_idle()
        assert [r.snapshot_id for r in runtime.rollbacks] == [first.id]
        assert accepted(runtime) == [TOPICS[0]]
    run = await store.get_run(RUN)
    assert run.status is RunStatus.SUCCEEDED, run.status_reason
    assert [r.snapshot_id for r in await store.list_rollbacks(RUN)] == [first.id]
    assert await store.load_replay(RUN)
