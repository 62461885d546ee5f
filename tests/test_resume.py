"""What a resumed run does: where a rejection takes it back to, which run it takes over, when.

A run resumed from a cut in which an output was in flight still rolls back to an older cut of
its timeline when that output is rejected; a timed snapshot policy waits for the resume; an
id the store does not hold is refused, writing nothing; and an owner whose process is a
zombie is gone. The same cases across killed processes are in
``tests/guarantees/test_resume_crashes.py``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from guarantees.review_workflow import TOPICS, Critic, CriticState, SlowStore, Writer

from agentsnap import (
    ConfigurationError,
    NotFoundError,
    RunLease,
    RunOwnedError,
    RunStatus,
    Runtime,
    SnapshotPolicy,
    SnapshotStatus,
)
from agentsnap.bus import AsyncioScheduler, Scheduler
from agentsnap.liveness import owner_is_gone
from agentsnap.records import utcnow
from agentsnap.store import MemoryStore, Store
from agentsnap.store.sql import SqlStore
from agentsnap.testing import ScriptedScheduler

RUN = "f2eca079" + "0" * 24


def add_team(runtime: Runtime, *, strict: bool) -> None:
    runtime.add(Writer("writer"))
    runtime.add(Critic(strict, None))


def accepted(runtime: Runtime) -> list[str]:
    state = runtime.agents["critic"].state
    assert isinstance(state, CriticState)
    return state.accepted


async def stop_with_a_draft_in_flight(store: Store) -> None:
    """Run ``RUN`` until the writer's draft waits for the critic, and close it there.

    Closing takes a last snapshot, whose cut has the draft in flight; the run is left
    interrupted, as a killed one is shown.
    """
    scheduler = ScriptedScheduler()
    async with Runtime(store=store, run_id=RUN, scheduler=scheduler) as runtime:
        add_team(runtime, strict=True)
        runtime.send("critic", "be brief", kind="rubric")
        runtime.send("writer", TOPICS[0], kind="topic")
        await scheduler.deliver("$env", "critic")
        await scheduler.deliver("$env", "writer")
    snapshots = await store.list_snapshots(RUN)
    assert [s.seq for s in snapshots] == [1, 2]
    (in_flight,) = snapshots[-1].channels
    assert (in_flight.src, in_flight.dst, len(in_flight.messages)) == ("writer", "critic", 1)


@pytest.mark.parametrize("scheduler", [ScriptedScheduler, AsyncioScheduler])
async def test_an_output_in_flight_in_the_resumed_cut_is_redone_from_an_older_cut(
    scheduler: type[Scheduler],
) -> None:
    store = MemoryStore()
    await stop_with_a_draft_in_flight(store)
    first, cut = await store.list_snapshots(RUN)

    async with Runtime(store=store, run_id=RUN, scheduler=scheduler()) as runtime:
        add_team(runtime, strict=True)
        assert (await runtime.resume()).id == cut.id
        await runtime.run_until_idle()  # the critic rejects the draft in flight
        # The writer had sent the draft before the resumed cut: it is redone from the first.
        assert [r.snapshot_id for r in runtime.rollbacks] == [first.id]
        assert accepted(runtime) == [TOPICS[0]]
    run = await store.get_run(RUN)
    assert run.status is RunStatus.SUCCEEDED, run.status_reason


async def test_a_rejection_that_cannot_roll_back_fails_the_run_even_when_caught() -> None:
    store = MemoryStore()
    policy = SnapshotPolicy(at_start=False)  # no cut precedes the draft
    async with Runtime(store=store, snapshot_policy=policy) as runtime:
        add_team(runtime, strict=True)
        runtime.send("writer", TOPICS[0], kind="topic")
        with pytest.raises(ConfigurationError, match="no complete snapshot precedes it"):
            await runtime.run_until_idle()
    run = await store.get_run(runtime.run_id)
    assert run.status is RunStatus.FAILED
    assert "no complete snapshot precedes it" in (run.status_reason or "")


async def crashed_run(url: str) -> None:
    """A run left running with drafts still to write, as a killed process leaves it."""
    store = SqlStore(url)
    try:
        async with Runtime(store=store, run_id=RUN) as runtime:
            add_team(runtime, strict=False)
            runtime.send("critic", "be brief", kind="rubric")
            for topic in TOPICS:
                runtime.send("writer", topic, kind="topic")
        assert (await store.get_run(RUN)).status is RunStatus.INTERRUPTED
    finally:
        await store.close()


async def test_a_timed_snapshot_waits_for_a_slow_resume(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    await crashed_run(url)
    # Taking the run over takes longer than a period of the policy.
    store = SlowStore(url, 0.1)
    try:
        policy = SnapshotPolicy(every_seconds=0.05)
        async with Runtime(store=store, run_id=RUN, snapshot_policy=policy) as runtime:
            add_team(runtime, strict=False)
            await runtime.resume()
            await runtime.run_until_idle()
            assert sorted(accepted(runtime)) == sorted(TOPICS)
        assert (await store.get_run(RUN)).status is RunStatus.SUCCEEDED
    finally:
        await store.close()


async def test_of_two_slow_resumes_at_once_one_finishes_the_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    await crashed_run(url)
    stores = [SlowStore(url, 0.1), SlowStore(url, 0.1)]
    policy = SnapshotPolicy(every_seconds=0.05)

    decided: list[Store] = []
    both_decided = asyncio.Event()

    async def resume(store: Store) -> list[str]:
        async with Runtime(store=store, run_id=RUN, snapshot_policy=policy) as runtime:
            add_team(runtime, strict=False)
            try:
                await runtime.resume(wait=0)
            finally:
                decided.append(store)
                if len(decided) == len(stores):
                    both_decided.set()
            await both_decided.wait()  # the winner holds the run until the other is refused
            await runtime.run_until_idle()
            return accepted(runtime)

    try:
        outcomes = await asyncio.gather(*(resume(s) for s in stores), return_exceptions=True)
        refused = [o for o in outcomes if isinstance(o, BaseException)]
        finished = [o for o in outcomes if not isinstance(o, BaseException)]
        assert len(refused) == 1, outcomes
        assert isinstance(refused[0], RunOwnedError), outcomes
        assert [sorted(o) for o in finished] == [sorted(TOPICS)]
        assert (await stores[0].get_run(RUN)).status is RunStatus.SUCCEEDED
    finally:
        for store in stores:
            await store.close()


class HeldStore(SqlStore):
    """An SqlStore whose look-ups of a lease wait until ``go`` is set (``asked`` once one
    waits)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.asked = asyncio.Event()
        self.go = asyncio.Event()

    async def get_lease(self, run_id: str) -> RunLease | None:
        self.asked.set()
        await self.go.wait()
        return await super().get_lease(run_id)


async def test_a_resume_that_takes_over_a_run_finished_meanwhile_leaves_it(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    await crashed_run(url)
    late, store = HeldStore(url), SqlStore(url)
    try:
        waiting = Runtime(store=late, run_id=RUN)
        add_team(waiting, strict=False)
        async with waiting:
            # It found the run interrupted, and waits to look at the lease ...
            refused = asyncio.ensure_future(waiting.resume(wait=0))
            await late.asked.wait()
            # ... while another resume finishes the run.
            async with Runtime(store=store, run_id=RUN) as first:
                add_team(first, strict=False)
                await first.resume(wait=0)
                await first.run_until_idle()
            late.go.set()
            with pytest.raises(ConfigurationError, match="already finished"):
                await refused
        assert (await store.get_run(RUN)).status is RunStatus.SUCCEEDED
    finally:
        await late.close()
        await store.close()


@pytest.mark.parametrize("run_id", [RUN[:8], "0" * 32], ids=["prefix", "unknown"])
async def test_resuming_an_id_the_store_does_not_hold_writes_nothing(
    store: Store, run_id: str
) -> None:
    await stop_with_a_draft_in_flight(store)
    before = await store.list_runs()

    runtime = Runtime(store=store, run_id=run_id)
    add_team(runtime, strict=True)
    async with runtime:
        with pytest.raises(NotFoundError, match=f"no run with id '{run_id}'") as refused:
            await runtime.resume()
    # A prefix of a run's id names that run, so that the whole id can be given.
    assert (RUN in str(refused.value)) == RUN.startswith(run_id)
    assert await store.list_runs() == before
    assert await store.find_ids("run", run_id) == ([RUN] if RUN.startswith(run_id) else [])


@pytest.mark.parametrize("policy", [SnapshotPolicy(), SnapshotPolicy(at_start=False)])
async def test_a_named_run_is_recorded_once_it_takes_input(
    store: Store, policy: SnapshotPolicy
) -> None:
    async with Runtime(store=store, run_id="named", snapshot_policy=policy) as runtime:
        add_team(runtime, strict=False)
        assert await store.find_ids("run", "named") == []  # it may yet be resumed
        runtime.send("critic", "be brief", kind="rubric")
        runtime.send("writer", TOPICS[0], kind="topic")
        await runtime.run_until_idle()
        assert (await store.get_run("named")).status is RunStatus.RUNNING
    assert (await store.get_run("named")).status is RunStatus.SUCCEEDED
    assert all(s.status is SnapshotStatus.COMPLETE for s in await store.list_snapshots("named"))


@pytest.fixture
def zombie() -> Iterator[int]:
    """The pid of a child process that was killed and is not reaped yet."""
    if not Path("/proc").is_dir():
        pytest.skip("zombies are told apart through /proc, which this system does not have")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        os.kill(child.pid, signal.SIGKILL)
        stat = Path(f"/proc/{child.pid}/stat")
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
            time.sleep(0.01)
        yield child.pid
    finally:
        child.kill()
        child.wait()


def test_a_running_process_is_not_gone() -> None:
    assert not owner_is_gone(f"{socket.gethostname()}:{os.getppid()}:0123456789ab")


async def test_an_owner_whose_process_is_a_zombie_is_gone(tmp_path: Path, zombie: int) -> None:
    owner = f"{socket.gethostname()}:{zombie}:0123456789ab"
    assert owner_is_gone(owner)

    # The zombie holds the run's lease for an hour more: a resume takes it over at once.
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    await crashed_run(url)
    store = SqlStore(url)
    try:
        lease = await store.get_lease(RUN)
        assert lease is not None
        expires = utcnow() + timedelta(hours=1)
        assert await store.take_lease(RUN, owner, expires, replacing=lease.token)
        async with Runtime(store=store, run_id=RUN) as runtime:
            add_team(runtime, strict=False)
            await runtime.resume(wait=0)
            await runtime.run_until_idle()
            assert sorted(accepted(runtime)) == sorted(TOPICS)
        assert (await store.get_run(RUN)).status is RunStatus.SUCCEEDED
    finally:
        await store.close()
