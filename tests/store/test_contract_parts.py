"""The store contract for runs spread over processes: snapshot parts and agent leases."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from agentsnap import AgentCut, ChannelRecord, NotFoundError, RecordedMessage, RunInfo, Store
from agentsnap.messages import JsonValue
from agentsnap.records import ChannelOffsets, SnapshotPart, utcnow
from agentsnap.state import canonical_json, content_hash

RUN = "parts-run"


def cut(state: JsonValue, sent: dict[str, int], received: dict[str, int]) -> AgentCut:
    text = canonical_json(state)
    return AgentCut(state_json=text, state_hash=content_hash(text), sent=sent, received=received)


def part(worker: str, seq: int = 1, **changes: object) -> SnapshotPart:
    fields: dict[str, object] = {
        "run_id": RUN,
        "seq": seq,
        "worker": worker,
        "agents": {
            "a": cut({"balance": 2**63, "note": "naïve \x00 café"}, {"b": 2}, {"$env": 1}),
        },
        "channels": [
            ChannelRecord(
                src="b",
                dst="a",
                messages=[RecordedMessage(id="m1", seq=1, kind="t", payload={"x": 1.0}, epoch=0)],
            )
        ],
        "offsets": [
            ChannelOffsets(
                src="b", dst="a", subject="agentsnap.r.a.b", first_seq=7, end_seq=9, count=1
            )
        ],
    }
    fields.update(changes)
    return SnapshotPart.model_validate(fields)


@pytest.mark.store_roles("runs", "parts")
async def test_parts_read_back_as_written_by_worker(store: Store) -> None:
    await store.create_run(RunInfo(id=RUN))
    assert await store.load_snapshot_parts(RUN, 1) == []
    second, first = part("w2"), part("w1", agents={}, channels=[], offsets=[], error="why")
    await store.save_snapshot_part(second)
    await store.save_snapshot_part(first)
    await store.save_snapshot_part(part("w1", seq=2))
    assert await store.load_snapshot_parts(RUN, 1) == [first, second]
    assert [p.seq for p in await store.load_snapshot_parts(RUN, 2)] == [2]


@pytest.mark.store_roles("runs", "parts")
async def test_a_part_written_again_replaces_the_first(store: Store) -> None:
    await store.create_run(RunInfo(id=RUN))
    await store.save_snapshot_part(part("w1", error="first try"))
    again = part("w1")
    await store.save_snapshot_part(again)
    assert await store.load_snapshot_parts(RUN, 1) == [again]


@pytest.mark.store_roles("parts")
async def test_parts_of_an_unknown_run_are_refused(store: Store) -> None:
    with pytest.raises(NotFoundError):
        await store.save_snapshot_part(part("w1"))
    with pytest.raises(NotFoundError):
        await store.load_snapshot_parts(RUN, 1)
    with pytest.raises(NotFoundError):
        await store.delete_snapshot_parts(RUN, 1)


@pytest.mark.store_roles("runs", "parts")
async def test_parts_below_a_snapshot_are_deleted_and_no_other(store: Store) -> None:
    await store.create_run(RunInfo(id=RUN))
    await store.create_run(RunInfo(id="other-run"))
    for seq in (1, 2, 3):
        await store.save_snapshot_part(part("w1", seq=seq))
        await store.save_snapshot_part(part("w2", seq=seq))
    kept = part("w1", seq=1, run_id="other-run")
    await store.save_snapshot_part(kept)
    assert await store.delete_snapshot_parts(RUN, 3) == 4
    assert await store.load_snapshot_parts(RUN, 1) == []
    assert await store.load_snapshot_parts(RUN, 2) == []
    assert [p.worker for p in await store.load_snapshot_parts(RUN, 3)] == ["w1", "w2"]
    assert await store.load_snapshot_parts("other-run", 1) == [kept]
    assert await store.delete_snapshot_parts(RUN, 3) == 0


@pytest.mark.store_roles("runs", "parts")
async def test_agents_are_claimed_all_or_none(store: Store) -> None:
    await store.create_run(RunInfo(id=RUN))
    later = utcnow() + timedelta(seconds=30)
    assert await store.claim_agents(RUN, "host:1:a", ["a", "b"], later) == []
    assert await store.claim_agents(RUN, "host:1:a", ["a", "b"], later) == []  # renewed
    held = await store.claim_agents(RUN, "host:2:b", ["b", "c"], later)
    assert [(lease.agent, lease.owner) for lease in held] == [("b", "host:1:a")]
    # Nothing was claimed: c is still free for a third owner.
    assert await store.claim_agents(RUN, "host:3:c", ["c"], later) == []


@pytest.mark.store_roles("runs", "parts")
async def test_released_or_expired_agents_can_be_claimed(store: Store) -> None:
    await store.create_run(RunInfo(id=RUN))
    later = utcnow() + timedelta(seconds=30)
    assert await store.claim_agents(RUN, "host:1:a", ["a"], later) == []
    await store.release_agents(RUN, "host:1:a")
    assert await store.claim_agents(RUN, "host:2:b", ["a"], later) == []
    assert (
        await store.claim_agents(RUN, "host:3:c", ["b"], utcnow() + timedelta(seconds=0.05)) == []
    )
    await asyncio.sleep(0.1)
    assert await store.claim_agents(RUN, "host:2:b", ["b"], later) == []


@pytest.mark.store_roles("parts")
async def test_claims_for_an_unknown_run_are_refused(store: Store) -> None:
    with pytest.raises(NotFoundError):
        await store.claim_agents(RUN, "host:1:a", ["a"], utcnow())


@pytest.mark.store_roles("runs", "parts")
async def test_agent_leases_are_listed_live_or_expired(store: Store) -> None:
    await store.create_run(RunInfo(id=RUN))
    assert await store.list_agent_leases(RUN) == []
    later = utcnow() + timedelta(seconds=30)
    assert await store.claim_agents(RUN, "host:1:a", ["b", "a"], later) == []
    assert await store.claim_agents(RUN, "host:2:b", ["c"], later) == []
    await store.release_agents(RUN, "host:2:b")
    leases = await store.list_agent_leases(RUN)
    assert [(lease.agent, lease.owner) for lease in leases] == [
        ("a", "host:1:a"),
        ("b", "host:1:a"),
        ("c", "host:2:b"),
    ]
    now = utcnow()
    assert [lease.expires_at > now for lease in leases] == [True, True, False]
