"""The store contract, continued: replay log, run leases, fencing and interrupted runs.

Every test runs on each backend (memory, SQLite, PostgreSQL; see conftest.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest
from owners import dead_owner

from agentsnap import (
    NotFoundError,
    OwnershipLost,
    ReplaySegment,
    RollbackInfo,
    RunInfo,
    RunLease,
    RunStatus,
    Store,
)
from agentsnap.ledger import owner_id
from agentsnap.records import utcnow

from .test_contract import (
    EDGE_VALUES,
    NESTED_PAYLOAD,
    T0,
    make_run,
    make_snapshot,
    new_id,
    segment,
)

DAY = timedelta(days=1)


async def new_run(store: Store) -> RunInfo:
    run = make_run()
    await store.create_run(run)
    return run


async def owned_run(store: Store, owner: str | None = None) -> tuple[RunInfo, RunLease]:
    run = await new_run(store)
    lease = await store.take_lease(run.id, owner or owner_id(), utcnow() + DAY, replacing=None)
    assert lease is not None
    return run, lease


def replay_segment(timeline: int, *deliveries: tuple[str, str, int]) -> ReplaySegment:
    return ReplaySegment.of(timeline, list(deliveries))


# -- replay log -----------------------------------------------------------------------------


@pytest.mark.store_roles("runs", "log")
async def test_replay_segments_read_back_in_append_order(store: Store) -> None:
    run = await new_run(store)
    other = await new_run(store)
    inputs = [
        ("alice", 1, "go", NESTED_PAYLOAD, None, 0),
        ("bob", 1, "note", "ünï ✓", {"trace": "ünï ✓"}, 0),
        ("alice", 2, "edges", dict(EDGE_VALUES), {"trace": "x"}, 3),
    ]
    first = ReplaySegment.of(0, [("alice", "$env", 1), ("bob", "alice", 1)], inputs)
    second = replay_segment(0, ("alice", "$env", 2))
    third = replay_segment(1, ("bob", "alice", 1), ("alice", "bob", 1))
    await store.append_replay(run.id, first)
    await store.append_replay(other.id, replay_segment(0, ("x", "y", 9)))
    await store.append_replay(run.id, second)
    await store.append_replay(run.id, replay_segment(1))
    await store.append_replay(run.id, third)

    loaded = await store.load_replay(run.id)

    assert loaded == [first, second, replay_segment(1), third]
    deliveries, read_inputs = loaded[0].decode()
    assert deliveries == [("alice", "$env", 1), ("bob", "alice", 1)]
    assert read_inputs == inputs
    payload = read_inputs[2][3]
    assert isinstance(payload, dict)
    for name, value in EDGE_VALUES.items():
        assert type(payload[name]) is type(value), name
        assert payload[name] == value, name
    assert await store.load_replay(other.id) == [replay_segment(0, ("x", "y", 9))]


@pytest.mark.store_roles("runs", "log")
async def test_replay_of_a_run_without_one_is_empty(store: Store) -> None:
    run = await new_run(store)
    assert await store.load_replay(run.id) == []


@pytest.mark.store_roles("log")
async def test_replay_of_an_unknown_run_is_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError) as error:
        await store.append_replay("no-such-run", replay_segment(0, ("a", "b", 1)))
    assert (error.value.what, error.value.ident) == ("run", "no-such-run")
    with pytest.raises(NotFoundError) as error:
        await store.load_replay("no-such-run")
    assert (error.value.what, error.value.ident) == ("run", "no-such-run")


# -- leases ---------------------------------------------------------------------------------


@pytest.mark.store_roles("runs", "leases")
async def test_a_run_without_a_lease_has_none(store: Store) -> None:
    run = await new_run(store)
    assert await store.get_lease(run.id) is None
    assert await store.get_lease("no-such-run") is None


@pytest.mark.store_roles("runs", "leases")
async def test_the_first_lease_has_token_1_and_only_one_caller_gets_it(store: Store) -> None:
    run = await new_run(store)
    until = T0 + DAY

    first = await store.take_lease(run.id, "host:1:a", until, replacing=None)
    again = await store.take_lease(run.id, "host:2:b", until + DAY, replacing=None)

    assert first == RunLease(run_id=run.id, owner="host:1:a", token=1, expires_at=until)
    assert again is None
    assert await store.get_lease(run.id) == first


@pytest.mark.store_roles("runs", "leases")
async def test_a_takeover_replaces_only_the_lease_it_names(store: Store) -> None:
    run = await new_run(store)
    await store.take_lease(run.id, "host:1:a", T0, replacing=None)

    taken = await store.take_lease(run.id, "host:2:b", T0 + DAY, replacing=1)
    stale = await store.take_lease(run.id, "host:3:c", T0 + DAY, replacing=1)
    wrong = await store.take_lease(run.id, "host:3:c", T0 + DAY, replacing=7)

    assert taken == RunLease(run_id=run.id, owner="host:2:b", token=2, expires_at=T0 + DAY)
    assert stale is None
    assert wrong is None
    assert await store.get_lease(run.id) == taken


@pytest.mark.store_roles("leases")
async def test_taking_the_lease_of_an_unknown_run_is_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError):
        await store.take_lease("no-such-run", "host:1:a", T0, replacing=None)


@pytest.mark.store_roles("runs", "leases")
async def test_renewal_extends_the_lease_of_the_current_token_only(store: Store) -> None:
    run, lease = await owned_run(store)
    later = lease.expires_at + DAY

    assert await store.renew_lease(run.id, lease.token, later) is True
    assert (await store.get_lease(run.id)) == lease.model_copy(update={"expires_at": later})

    taken = await store.take_lease(run.id, "host:2:b", later, replacing=lease.token)
    assert taken is not None
    assert await store.renew_lease(run.id, lease.token, later + DAY) is False
    assert await store.get_lease(run.id) == taken
    assert await store.renew_lease("no-such-run", 1, later) is False


@pytest.mark.store_roles("runs", "leases")
async def test_release_ends_the_lease_and_keeps_its_token(store: Store) -> None:
    run, lease = await owned_run(store)

    await store.release_lease(run.id, lease.token + 1)  # not the current token: ignored
    assert await store.get_lease(run.id) == lease

    await store.release_lease(run.id, lease.token)
    released = await store.get_lease(run.id)
    assert released is not None
    assert released.token == lease.token
    assert released.expires_at <= utcnow()

    # Nobody holds it now, and the next owner's token is still higher.
    assert await store.take_lease(run.id, "host:2:b", T0, replacing=None) is None
    taken = await store.take_lease(run.id, "host:2:b", T0, replacing=lease.token)
    assert taken is not None
    assert taken.token == lease.token + 1


# -- interrupted runs -----------------------------------------------------------------------


async def status_seen(store: Store, run_id: str) -> RunStatus:
    status = (await store.get_run(run_id)).status
    (listed,) = [run.status for run in await store.list_runs() if run.id == run_id]
    assert listed is status, "get_run and list_runs agree"
    return status


async def test_a_running_run_with_a_live_owner_is_running(store: Store) -> None:
    run, _ = await owned_run(store)
    assert await status_seen(store, run.id) is RunStatus.RUNNING


async def test_a_running_run_without_a_lease_is_interrupted(store: Store) -> None:
    run = await new_run(store)
    assert await status_seen(store, run.id) is RunStatus.INTERRUPTED


async def test_a_running_run_whose_lease_expired_is_interrupted(store: Store) -> None:
    run = await new_run(store)
    await store.take_lease(run.id, owner_id(), utcnow() - timedelta(seconds=1), replacing=None)
    assert await status_seen(store, run.id) is RunStatus.INTERRUPTED


async def test_a_running_run_whose_owner_process_is_gone_is_interrupted_at_once(
    store: Store,
) -> None:
    run, _ = await owned_run(store, owner=dead_owner())
    assert await status_seen(store, run.id) is RunStatus.INTERRUPTED


async def test_a_running_run_owned_on_another_host_is_running_while_its_lease_holds(
    store: Store,
) -> None:
    run, _ = await owned_run(store, owner="elsewhere.example:1:0123456789ab")
    assert await status_seen(store, run.id) is RunStatus.RUNNING


async def test_a_released_run_still_running_is_interrupted(store: Store) -> None:
    run, lease = await owned_run(store)
    await store.release_lease(run.id, lease.token)
    assert await status_seen(store, run.id) is RunStatus.INTERRUPTED


@pytest.mark.parametrize("status", [RunStatus.SUCCEEDED, RunStatus.FAILED])
async def test_a_finished_run_keeps_its_status_without_an_owner(
    store: Store, status: RunStatus
) -> None:
    run = await new_run(store)
    await store.finish_run(run.id, status, utcnow())
    assert await status_seen(store, run.id) is status


# -- fencing --------------------------------------------------------------------------------

Write = Callable[[Store, RunInfo], Awaitable[None]]


async def write_snapshot(store: Store, run: RunInfo) -> None:
    await store.save_snapshot(make_snapshot(run.id, seq=9))


async def write_rollback(store: Store, run: RunInfo) -> None:
    (snapshot,) = [s for s in await store.list_snapshots(run.id) if s.seq == 1]
    await store.save_rollback(
        RollbackInfo(
            id=new_id(),
            run_id=run.id,
            snapshot_id=snapshot.id,
            agent="alice",
            reason="fenced",
            source="test",
            attempt=1,
            discarded=0,
            at=T0,
        )
    )


async def write_finish(store: Store, run: RunInfo) -> None:
    await store.finish_run(run.id, RunStatus.SUCCEEDED, T0)


async def write_parent(store: Store, run: RunInfo) -> None:
    await store.set_parent(run.id, "parent-run", "parent-snapshot")


async def write_journal(store: Store, run: RunInfo) -> None:
    await store.append_journal(run.id, [segment("a", "b", "send", 1, 1, "fenced")])


async def write_replay(store: Store, run: RunInfo) -> None:
    await store.append_replay(run.id, replay_segment(0, ("a", "b", 1)))


async def everything(store: Store, run_id: str) -> tuple[object, ...]:
    """What the store holds of a run (its status as recorded, not as seen)."""
    run = await store.get_run(run_id)
    return (
        run.status,
        run.finished_at,
        run.parent_run_id,
        [s.id for s in await store.list_snapshots(run_id)],
        await store.list_rollbacks(run_id),
        await store.load_journal(run_id),
        await store.load_replay(run_id),
    )


WRITES = [
    pytest.param(write_snapshot, id="snapshot"),
    pytest.param(write_rollback, id="rollback"),
    pytest.param(write_finish, id="finish_run"),
    pytest.param(write_parent, id="set_parent"),
    pytest.param(write_journal, id="journal"),
    pytest.param(write_replay, id="replay"),
]


async def fenced_run(store: Store) -> tuple[RunInfo, RunLease]:
    """A run owned by this process with a snapshot (number 1), its store fenced."""
    run, lease = await owned_run(store)
    await store.save_snapshot(make_snapshot(run.id, seq=1))
    store.fence(run.id, lease.token)
    return run, lease


@pytest.mark.parametrize("write", WRITES)
async def test_a_fenced_write_goes_through_while_the_token_is_current(
    store: Store, write: Write
) -> None:
    run, _ = await fenced_run(store)
    before = await everything(store, run.id)
    await write(store, run)
    assert await everything(store, run.id) != before


@pytest.mark.parametrize("write", WRITES)
async def test_a_fenced_write_after_a_takeover_is_refused_and_writes_nothing(
    store: Store, write: Write
) -> None:
    run, lease = await fenced_run(store)
    taken = await store.take_lease(run.id, "host:2:b", utcnow() + DAY, replacing=lease.token)
    assert taken is not None
    before = await everything(store, run.id)

    with pytest.raises(OwnershipLost) as lost:
        await write(store, run)

    assert (lost.value.run_id, lost.value.token) == (run.id, lease.token)
    assert "host:2:b" in str(lost.value)
    assert await everything(store, run.id) == before


@pytest.mark.parametrize("write", WRITES)
async def test_writes_for_runs_not_fenced_are_made_as_before(store: Store, write: Write) -> None:
    fenced, lease = await fenced_run(store)
    await store.take_lease(fenced.id, "host:2:b", utcnow() + DAY, replacing=lease.token)
    run = await new_run(store)  # no lease at all, not fenced
    await store.save_snapshot(make_snapshot(run.id, seq=1))
    before = await everything(store, run.id)
    await write(store, run)
    assert await everything(store, run.id) != before


@pytest.mark.store_roles("runs", "leases")
async def test_the_lease_is_kept_when_a_fenced_write_is_refused(store: Store) -> None:
    run, lease = await fenced_run(store)
    taken = await store.take_lease(run.id, "host:2:b", utcnow() + DAY, replacing=lease.token)
    with pytest.raises(OwnershipLost):
        await write_finish(store, run)
    assert await store.get_lease(run.id) == taken
    # The new owner, fencing with its token, writes.
    store.fence(run.id, 2)
    await write_finish(store, run)
    assert (await store.get_run(run.id)).status is RunStatus.SUCCEEDED
