"""The store contract, continued: each run's history of owners.

Taking a run's lease appends its owner, a takeover ends the replaced owner's entry as taken
over (a crash) and a release ends the owner's own as released. Every test runs on each
backend that keeps leases and answers queries (memory, SQLite, PostgreSQL; see conftest.py).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from agentsnap import NotFoundError, RunOwner, Store
from agentsnap.records import utcnow

from .test_contract import make_run

DAY = timedelta(days=1)

pytestmark = pytest.mark.store_roles("runs", "leases", "queries")


async def new_run_id(store: Store) -> str:
    run = make_run()
    await store.create_run(run)
    return run.id


async def test_each_lease_taken_appends_its_owner_and_ends_the_one_it_replaces(
    store: Store,
) -> None:
    run_id = await new_run_id(store)
    other = await new_run_id(store)
    assert await store.list_run_owners(run_id) == []
    before = utcnow()
    first = await store.take_lease(run_id, "h:1:a", utcnow() + DAY, replacing=None)
    assert first is not None
    await store.take_lease(other, "h:9:z", utcnow() + DAY, replacing=None)
    assert await store.renew_lease(run_id, 1, utcnow() + DAY)
    second = await store.take_lease(run_id, "h:2:b", utcnow() + DAY, replacing=1)
    assert second is not None
    after = utcnow()

    one, two = await store.list_run_owners(run_id)

    assert isinstance(one, RunOwner)
    assert (one.run_id, one.token, one.owner) == (run_id, 1, "h:1:a")
    assert (two.run_id, two.token, two.owner) == (run_id, 2, "h:2:b")
    assert before <= one.acquired_at <= two.acquired_at <= after
    assert one.ended == "taken_over"
    assert one.crashed
    assert one.ended_at == two.acquired_at, "ended by the takeover, at the same moment"
    assert one.last_renewed_at is not None
    assert one.acquired_at <= one.last_renewed_at <= two.acquired_at
    assert (two.ended, two.ended_at, two.last_renewed_at) == (None, None, None)
    assert [o.owner for o in await store.list_run_owners(other)] == ["h:9:z"]


async def test_a_release_ends_the_owner_cleanly_and_the_next_take_keeps_it_so(
    store: Store,
) -> None:
    run_id = await new_run_id(store)
    assert await store.take_lease(run_id, "h:1:a", utcnow() + DAY, replacing=None) is not None
    await store.release_lease(run_id, 1)
    await store.release_lease(run_id, 1)  # again: the entry keeps its first end
    (released,) = await store.list_run_owners(run_id)
    assert released.ended == "released"
    assert not released.crashed
    assert released.ended_at is not None
    assert released.last_renewed_at is not None
    assert released.acquired_at <= released.last_renewed_at <= released.ended_at
    assert await store.take_lease(run_id, "h:2:b", utcnow() + DAY, replacing=1) is not None

    first, second = await store.list_run_owners(run_id)

    assert first == released, "a resume after a clean stop is no takeover of a crashed owner"
    assert (second.token, second.owner, second.ended) == (2, "h:2:b", None)


async def test_a_stale_release_leaves_the_new_owner_holding(store: Store) -> None:
    run_id = await new_run_id(store)
    assert await store.take_lease(run_id, "h:1:a", utcnow() + DAY, replacing=None) is not None
    assert await store.take_lease(run_id, "h:2:b", utcnow() + DAY, replacing=1) is not None
    await store.release_lease(run_id, 1)  # the old owner wakes up and lets go
    first, second = await store.list_run_owners(run_id)
    assert first.ended == "taken_over"
    assert second.ended is None


async def test_a_lost_race_for_the_lease_appends_nothing(store: Store) -> None:
    run_id = await new_run_id(store)
    assert await store.take_lease(run_id, "h:1:a", utcnow() + DAY, replacing=None) is not None
    assert await store.take_lease(run_id, "h:x:x", utcnow() + DAY, replacing=None) is None
    assert await store.take_lease(run_id, "h:2:b", utcnow() + DAY, replacing=1) is not None
    assert await store.take_lease(run_id, "h:3:c", utcnow() + DAY, replacing=1) is None

    owners = await store.list_run_owners(run_id)

    assert [(o.token, o.owner) for o in owners] == [(1, "h:1:a"), (2, "h:2:b")]
    assert owners[0].ended == "taken_over", "ended once, by the winner"
    assert owners[1].ended is None, "the loser ended nobody"


async def test_racing_takeovers_append_one_owner(store: Store) -> None:
    run_id = await new_run_id(store)
    assert await store.take_lease(run_id, "h:1:a", utcnow() + DAY, replacing=None) is not None

    taken = await asyncio.gather(
        *(store.take_lease(run_id, f"h:{n}:r", utcnow() + DAY, replacing=1) for n in range(2, 7))
    )

    winners = [lease for lease in taken if lease is not None]
    assert len(winners) == 1
    owners = await store.list_run_owners(run_id)
    assert [(o.token, o.owner) for o in owners] == [(1, "h:1:a"), (2, winners[0].owner)]


async def test_owners_of_an_unknown_run_are_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError):
        await store.list_run_owners("no-such-run")
