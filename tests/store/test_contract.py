"""The store contract: what every backend must do, run against each one (see conftest.py)."""

from __future__ import annotations

import random
import re
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from owners import dead_owner
from payloads import get
from pydantic import Field

import agentsnap
from agentsnap import (
    Agent,
    AgentCut,
    AgentState,
    AgentVersion,
    ChannelRecord,
    ConfigurationError,
    Context,
    JournalSegment,
    Message,
    NotFoundError,
    RecordedMessage,
    RunError,
    RunInfo,
    RunStatus,
    Runtime,
    Snapshot,
    SnapshotHandle,
    SnapshotStatus,
    Store,
)
from agentsnap.ledger import owner_id
from agentsnap.messages import JsonValue
from agentsnap.records import RunLease, SnapshotSummary, utcnow
from agentsnap.state import canonical_json, content_hash
from agentsnap.testing import SeededScheduler, assert_consistent

# -- builders -------------------------------------------------------------------------------

T0 = datetime(2024, 5, 17, 12, 30, 45, 123456, tzinfo=UTC)

NESTED_PAYLOAD: JsonValue = {
    "amount": 2**53 + 1,
    "negative": -(2**62),
    "ratio": 0.1,
    "tiny": 1e-7,
    "whole_float": 3.0,
    "flags": [True, False, None],
    "text": "naïve café — 日本語 — emoji 🚀",
    "escapes": 'quote " backslash \\ newline \n tab \t',
    "empty": {"list": [], "object": {}, "string": ""},
    "deep": {"a": {"b": {"c": [1, [2, [3, {"d": None}]]]}}},
}

# JSON values that are easy to change on the way through a database, each tested as a whole
# payload, inside metadata and inside a state: floats a column may turn into integers (a
# SQLite column of NUMERIC affinity stores the text 3.0 as the integer 3; PostgreSQL's JSONB
# prints 1e16 as 10000000000000000), integers beyond 64 bits, and characters some databases
# refuse (JSONB cannot hold \u0000).
EDGE_VALUES: dict[str, JsonValue] = {
    "float_whole": 3.0,
    "float_1e16": 1e16,
    "float_1.5e300": 1.5e300,
    "float_smallest": 5e-324,
    "float_0.1+0.2": 0.1 + 0.2,
    "int_2**63": 2**63,
    "int_-(2**63)-1": -(2**63) - 1,
    "string_with_nul": "before \x00 after",
    "string_with_line_separator": "a \u2028 b \u2029 c",
    "bool_true": True,
    "empty_string": "",
}


def new_id() -> str:
    """A fresh 32-hex-digit id, like the runtime makes."""
    return uuid.uuid4().hex


def make_run(
    run_id: str | None = None,
    *,
    created_at: datetime = T0,
    parent_run_id: str | None = None,
    parent_snapshot_id: str | None = None,
    metadata: dict[str, JsonValue] | None = None,
) -> RunInfo:
    return RunInfo(
        id=run_id or new_id(),
        created_at=created_at,
        parent_run_id=parent_run_id,
        parent_snapshot_id=parent_snapshot_id,
        metadata=metadata or {},
    )


def make_cut(
    state: dict[str, JsonValue],
    *,
    sent: dict[str, int] | None = None,
    received: dict[str, int] | None = None,
) -> AgentCut:
    text = canonical_json(state)
    return AgentCut(
        state_json=text, state_hash=content_hash(text), sent=sent or {}, received=received or {}
    )


def default_agents() -> dict[str, AgentCut]:
    """Three processes, $env included, whose counters match ``default_channels()``."""
    return {
        "$env": make_cut({}, sent={"alice": 3, "bob": 1}),
        "alice": make_cut(
            {"balance": 950, "notes": ["ünïcødé ✓", "日本語"], "ratio": 0.25, "big": 2**53 + 1},
            sent={"bob": 4},
            received={"$env": 2, "bob": 1},
        ),
        "bob": make_cut(
            {"balance": 1050, "history": [{"from": "alice", "amount": 50}], "last": None},
            sent={"alice": 1},
            received={"$env": 1, "alice": 1},
        ),
    }


def default_channels() -> list[ChannelRecord]:
    """In-flight messages on two channels, ordered by ``(src, dst)`` as the runtime does."""
    return [
        ChannelRecord(
            src="$env",
            dst="alice",
            messages=[RecordedMessage(id="$env>alice#3", seq=3, kind="go", payload=None)],
        ),
        ChannelRecord(
            src="alice",
            dst="bob",
            messages=[
                RecordedMessage(
                    id="alice>bob#2",
                    seq=2,
                    kind="transfer",
                    payload=NESTED_PAYLOAD,
                    headers={"trace-id": "4bf92f3577b34da6", "ünï": "çødé ✓"},
                    epoch=1,
                ),
                RecordedMessage(
                    id="alice>bob#3", seq=3, kind="note", payload="just a string: ☃ ∑ 𝄞"
                ),
                RecordedMessage(id="alice>bob#4", seq=4, kind="floats", payload=[0.5, -2.5e-8]),
            ],
        ),
    ]


def make_snapshot(
    run_id: str,
    seq: int = 1,
    *,
    snapshot_id: str | None = None,
    status: SnapshotStatus = SnapshotStatus.COMPLETE,
    initiator: str = "$env",
    agents: dict[str, AgentCut] | None = None,
    channels: list[ChannelRecord] | None = None,
    error: str | None = None,
    started_at: datetime | None = None,
) -> Snapshot:
    """A snapshot of ``run_id``: by default complete, with agents and in-flight messages.

    A failed snapshot has no agents, channels or completion time unless given.
    """
    started = started_at or T0 + timedelta(seconds=seq)
    failed = status is SnapshotStatus.FAILED
    return Snapshot(
        id=snapshot_id or new_id(),
        run_id=run_id,
        seq=seq,
        initiator=initiator,
        status=status,
        started_at=started,
        completed_at=None if failed else started + timedelta(microseconds=654321),
        error=error,
        agents=agents if agents is not None else ({} if failed else default_agents()),
        channels=channels if channels is not None else ([] if failed else default_channels()),
    )


async def stored_run(store: Store, **fields: Any) -> RunInfo:
    """A run, stored, and owned by this process (so it reads back as running)."""
    run = make_run(**fields)
    await store.create_run(run)
    await hold(store, run.id)
    return run


async def hold(store: Store, run_id: str) -> RunLease:
    """Take the run's first lease for this process, for a day."""
    lease = await store.take_lease(run_id, owner_id(), utcnow() + timedelta(days=1), replacing=None)
    assert lease is not None
    return lease


def store_error_class() -> type[Exception]:
    """``agentsnap.StoreError``, imported late so the other tests run while it is missing."""
    from agentsnap.exceptions import StoreError

    return StoreError


# -- checks ---------------------------------------------------------------------------------


def assert_same_json(loaded: object, saved: object, where: str = "value") -> None:
    """Equal, and of the same JSON types all the way down (``==`` takes ``1 == 1.0 == True``)."""
    assert type(loaded) is type(saved), f"{where}: {loaded!r} came back for {saved!r}"
    if isinstance(saved, dict):
        assert isinstance(loaded, dict)
        assert loaded.keys() == saved.keys(), f"{where}: keys {loaded.keys()} != {saved.keys()}"
        for key, value in saved.items():
            assert_same_json(loaded[key], value, f"{where}[{key!r}]")
    elif isinstance(saved, list):
        assert isinstance(loaded, list)
        assert len(loaded) == len(saved), f"{where}: {loaded!r} came back for {saved!r}"
        for i, (got, want) in enumerate(zip(loaded, saved, strict=True)):
            assert_same_json(got, want, f"{where}[{i}]")
    else:
        assert loaded == saved, f"{where}: {loaded!r} came back for {saved!r}"


def assert_aware_equal(loaded: datetime | None, saved: datetime | None, what: str) -> None:
    if saved is None:
        assert loaded is None, f"{what}: {loaded!r} came back for None"
        return
    assert loaded is not None, f"{what}: None came back for {saved!r}"
    assert loaded.utcoffset() is not None, f"{what} came back naive: {loaded!r}"
    assert loaded == saved, f"{what}: {loaded.isoformat()} came back for {saved.isoformat()}"


def cut_of(version: AgentVersion) -> AgentCut:
    """The agent's cut in one version of its history, which an undamaged snapshot always has."""
    assert version.cut is not None, version.damaged
    return version.cut


def channel_layout(snapshot: Snapshot) -> list[tuple[str, str, list[str]]]:
    return [(c.src, c.dst, [m.id for m in c.messages]) for c in snapshot.channels]


def assert_same_snapshot(loaded: Snapshot, saved: Snapshot) -> None:
    """``loaded == saved``, aware datetimes, and payloads of the same JSON types."""
    assert_aware_equal(loaded.started_at, saved.started_at, "started_at")
    assert_aware_equal(loaded.completed_at, saved.completed_at, "completed_at")
    assert loaded.status is saved.status
    assert channel_layout(loaded) == channel_layout(saved)
    for got, want in zip(loaded.channels, saved.channels, strict=True):
        for got_message, want_message in zip(got.messages, want.messages, strict=True):
            assert_same_json(got_message.payload, want_message.payload, f"{want_message.id}")
            assert_same_json(got_message.headers, want_message.headers, f"{want_message.id}")
    assert loaded == saved


def assert_not_found(error: pytest.ExceptionInfo[NotFoundError], what: str, ident: str) -> None:
    assert error.value.what == what
    assert error.value.ident == ident
    assert ident in str(error.value)


# -- runs -----------------------------------------------------------------------------------


@pytest.mark.store_roles("runs", "leases")
async def test_created_run_reads_back_equal(store: Store) -> None:
    parent = await stored_run(store, metadata={"example": "parent"})
    run = make_run(
        created_at=datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC),
        parent_run_id=parent.id,
        parent_snapshot_id=new_id(),
        metadata={"example": "bank", "tags": ["a", "ü"], "n": 2**53 + 1, "x": 0.5, "ok": True},
    )
    await store.create_run(run)
    await hold(store, run.id)

    loaded = await store.get_run(run.id)

    assert loaded == run
    assert loaded.created_at.utcoffset() == timedelta(0), loaded.created_at
    assert loaded.created_at == run.created_at
    assert_same_json(loaded.metadata, run.metadata, "metadata")
    assert await store.get_run(parent.id) == parent


@pytest.mark.store_roles("runs", "leases")
async def test_run_without_parent_or_metadata_reads_back_equal(store: Store) -> None:
    run = await stored_run(store)
    loaded = await store.get_run(run.id)
    assert loaded == run
    assert loaded.parent_run_id is None
    assert loaded.parent_snapshot_id is None
    assert loaded.metadata == {}


@pytest.mark.store_roles("runs", "leases", "queries")
async def test_creating_a_run_twice_keeps_the_first(store: Store) -> None:
    first = await stored_run(store, metadata={"version": 1})
    second = make_run(first.id, created_at=T0 + timedelta(hours=1), metadata={"version": 2})

    await store.create_run(second)

    assert await store.get_run(first.id) == first
    assert await store.list_runs() == [first]


@pytest.mark.store_roles("runs", "leases", "queries")
async def test_list_runs_returns_every_run_oldest_first(store: Store) -> None:
    assert await store.list_runs() == []
    middle = await stored_run(store, created_at=T0 + timedelta(seconds=2))
    oldest = await stored_run(store, created_at=T0)
    newest = await stored_run(store, created_at=T0 + timedelta(days=1))

    assert await store.list_runs() == [oldest, middle, newest]


# -- finding runs: list_runs's filters ----------------------------------------------------


async def labelled_run(
    store: Store,
    *,
    minutes: int = 0,
    name: str | None = None,
    tags: dict[str, str] | None = None,
    status: RunStatus = RunStatus.SUCCEEDED,
    reason: str | None = None,
) -> RunInfo:
    """A run created ``minutes`` after T0, stored with these labels and this status."""
    run = RunInfo(
        id=new_id(),
        created_at=T0 + timedelta(minutes=minutes),
        name=name,
        tags=tags or {},
        status=status,
        status_reason=reason,
    )
    await store.create_run(run)
    return run


def ids(runs: list[RunInfo]) -> list[str]:
    return [run.id for run in runs]


@pytest.mark.store_roles("runs", "queries")
async def test_list_runs_filters_by_recorded_status(store: Store) -> None:
    done = await labelled_run(store, minutes=1)
    failed = await labelled_run(store, minutes=2, status=RunStatus.FAILED, reason="boom")
    cancelled = await labelled_run(store, minutes=3, status=RunStatus.CANCELLED)
    created = await labelled_run(store, minutes=4, status=RunStatus.CREATED)

    assert await store.list_runs(status=RunStatus.FAILED) == [failed]
    assert await store.list_runs(status="cancelled") == [cancelled]
    assert ids(await store.list_runs(status=[RunStatus.SUCCEEDED, "created"])) == ids(
        [done, created]
    )
    assert await store.list_runs(status=[]) == []
    (listed,) = await store.list_runs(status="failed")
    assert listed.status_reason == "boom"


@pytest.mark.store_roles("runs", "leases", "queries")
async def test_list_runs_filters_on_the_status_as_reported_not_as_recorded(
    store: Store,
) -> None:
    """``running`` is a run with a live owner; one recorded running without is interrupted."""
    live = await labelled_run(store, minutes=1, status=RunStatus.RUNNING)
    await hold(store, live.id)
    never_owned = await labelled_run(store, minutes=2, status=RunStatus.RUNNING)
    expired = await labelled_run(store, minutes=3, status=RunStatus.RUNNING)
    await store.take_lease(expired.id, "elsewhere:1:a", utcnow() - timedelta(1), replacing=None)
    gone = await labelled_run(store, minutes=4, status=RunStatus.RUNNING)
    # Unexpired, but its process (of this host) has exited: only Python can tell.
    await store.take_lease(gone.id, dead_owner(), utcnow() + timedelta(1), replacing=None)
    recorded = await labelled_run(store, minutes=5, status=RunStatus.INTERRUPTED)
    other_host = await labelled_run(store, minutes=6, status=RunStatus.RUNNING)
    await store.take_lease(other_host.id, "elsewhere:1:b", utcnow() + timedelta(1), replacing=None)
    await labelled_run(store, minutes=7)

    running = await store.list_runs(status=RunStatus.RUNNING)
    assert ids(running) == [live.id, other_host.id]
    assert {run.status for run in running} == {RunStatus.RUNNING}
    interrupted = await store.list_runs(status="interrupted")
    assert ids(interrupted) == [never_owned.id, expired.id, gone.id, recorded.id]
    assert all(run.status_reason for run in interrupted[:3])
    both = await store.list_runs(status=["running", "interrupted"])
    assert ids(both) == [live.id, never_owned.id, expired.id, gone.id, recorded.id, other_host.id]
    # The limit counts runs as reported: the newest interrupted ones, not the newest rows.
    assert ids(await store.list_runs(status="interrupted", limit=2)) == [gone.id, recorded.id]
    assert ids(await store.list_runs(status="running", limit=1)) == [other_host.id]


@pytest.mark.store_roles("runs", "queries")
async def test_list_runs_filters_by_exact_name_or_a_pattern(store: Store) -> None:
    nightly = await labelled_run(store, minutes=1, name="nightly")
    first = await labelled_run(store, minutes=2, name="nightly-2026-11-24")
    second = await labelled_run(store, minutes=3, name="nightly-2026-11-25")
    shouting = await labelled_run(store, minutes=4, name="NIGHTLY-2026")
    await labelled_run(store, minutes=5)  # no name: never matches a name
    odd = await labelled_run(store, minutes=6, name="50%_off?[x]")

    assert await store.list_runs(name="nightly") == [nightly]
    assert ids(await store.list_runs(name="nightly-*")) == [first.id, second.id]
    assert ids(await store.list_runs(name="*")) == ids([nightly, first, second, shouting, odd])
    assert ids(await store.list_runs(name="*-2026-*-25")) == [second.id]
    assert await store.list_runs(name="NIGHTLY-*") == [shouting]  # case counts
    # %, _, ? and [ are the name's own characters, not wildcards.
    assert await store.list_runs(name="50%_off?[x]") == [odd]
    assert await store.list_runs(name="50%*") == [odd]
    assert await store.list_runs(name="5_%*") == []
    assert await store.list_runs(name="50%_off?[*") == [odd]
    assert await store.list_runs(name="?0*") == []


@pytest.mark.store_roles("runs", "queries")
async def test_list_runs_filters_by_every_tag_given(store: Store) -> None:
    billing = await labelled_run(store, minutes=1, tags={"team": "billing", "env": "prod"})
    staging = await labelled_run(store, minutes=2, tags={"team": "billing", "env": "staging"})
    await labelled_run(store, minutes=3, tags={"team": "search", "env": "prod"})
    await labelled_run(store, minutes=4)

    assert ids(await store.list_runs(tags={"team": "billing"})) == [billing.id, staging.id]
    assert await store.list_runs(tags={"team": "billing", "env": "prod"}) == [billing]
    assert await store.list_runs(tags={"team": "billing", "owner": "ann"}) == []
    assert await store.list_runs(tags={"team": "Billing"}) == []
    (listed,) = await store.list_runs(tags={"env": "staging"})
    assert listed.tags == {"team": "billing", "env": "staging"}  # every tag, not the matched


async def test_list_runs_filters_by_creation_time_and_keeps_the_newest(store: Store) -> None:
    runs = [await labelled_run(store, minutes=m, name="job") for m in range(5)]
    await labelled_run(store, minutes=10, name="other")

    since = await store.list_runs(since=T0 + timedelta(minutes=3))  # at or after
    assert ids(since) == [runs[3].id, runs[4].id, *ids((await store.list_runs())[-1:])]
    assert ids(await store.list_runs(name="job", limit=2)) == [runs[3].id, runs[4].id]
    assert ids(await store.list_runs(name="job", limit=50)) == ids(runs)
    later = T0.astimezone(timezone(timedelta(hours=5))) + timedelta(minutes=4)
    assert ids(await store.list_runs(name="job", since=later)) == [runs[4].id]
    assert ids(await store.list_runs(limit=1)) == ids((await store.list_runs())[-1:])


@pytest.mark.store_roles("queries")
@pytest.mark.parametrize(
    ("filters", "message"),
    [
        ({"status": "paused"}, "'paused' is not a run status: use one of running, succeeded"),
        ({"status": ["failed", "nope"]}, "'nope' is not a run status"),
        ({"name": ""}, "name= must be a run's name"),
        ({"tags": {"team": 1}}, "tags= must map strings to strings"),
        ({"since": datetime(2026, 1, 1)}, "has no time zone"),
        ({"limit": 0}, "limit= must be a whole number of at least 1, got 0"),
        ({"limit": True}, "limit= must be a whole number"),
    ],
)
async def test_list_runs_refuses_filters_that_mean_nothing(
    store: Store, filters: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        await store.list_runs(**filters)


@pytest.mark.store_roles("queries")
async def test_list_runs_names_a_keyword_that_is_not_a_filter(store: Store) -> None:
    with pytest.raises(TypeError, match=r"list_runs\(\) got an unexpected keyword argument 'tag'"):
        await store.list_runs(tag={"team": "billing"})  # type: ignore[call-arg]
    assert await store.list_runs(status=None, name=None, tags=None, since=None, limit=None) == []


@pytest.mark.store_roles("runs", "leases")
async def test_unknown_run_is_not_found(store: Store) -> None:
    await stored_run(store)
    missing = new_id()
    with pytest.raises(NotFoundError) as error:
        await store.get_run(missing)
    assert_not_found(error, "run", missing)


@pytest.mark.store_roles("runs", "leases")
@pytest.mark.parametrize("value", list(EDGE_VALUES.values()), ids=list(EDGE_VALUES))
async def test_json_edge_values_read_back_identical(store: Store, value: JsonValue) -> None:
    run = await stored_run(store, metadata={"value": value, "in_list": [value]})
    message = RecordedMessage(
        id="alice>bob#1", seq=1, kind="edge", payload=value, headers={"h": "x"}
    )
    snapshot = make_snapshot(
        run.id,
        agents={
            "$env": make_cut({}),
            "alice": make_cut({"value": value}, sent={"bob": 1}),
            "bob": make_cut({}),
        },
        channels=[ChannelRecord(src="alice", dst="bob", messages=[message])],
    )
    await store.save_snapshot(snapshot)

    assert_same_json((await store.get_run(run.id)).metadata, run.metadata, "metadata")
    loaded = await store.load_snapshot(snapshot.id)
    assert_same_snapshot(loaded, snapshot)
    assert_same_json(loaded.agents["alice"].state, {"value": value}, "state")


# -- snapshots ------------------------------------------------------------------------------


@pytest.mark.store_roles("runs", "leases")
async def test_complete_snapshot_reads_back_equal(store: Store) -> None:
    run = await stored_run(store)
    snapshot = make_snapshot(run.id, initiator="alice")
    assert snapshot.agents["$env"].state_json == "{}"

    await store.save_snapshot(snapshot)
    loaded = await store.load_snapshot(snapshot.id)

    assert_same_snapshot(loaded, snapshot)
    assert loaded.agents["$env"].state_json == "{}"
    assert loaded.agents["$env"].state == {}
    assert loaded.agents["alice"].state == snapshot.agents["alice"].state
    assert loaded.in_flight("alice", "bob") == snapshot.in_flight("alice", "bob")


@pytest.mark.store_roles("runs", "leases")
async def test_failed_snapshot_reads_back_equal(store: Store) -> None:
    run = await stored_run(store)
    snapshot = make_snapshot(
        run.id,
        status=SnapshotStatus.FAILED,
        error="agent 'bob' state is not JSON: field 'when' holds a datetime — ünïcødé\nline 2",
    )

    await store.save_snapshot(snapshot)
    loaded = await store.load_snapshot(snapshot.id)

    assert_same_snapshot(loaded, snapshot)
    assert loaded.status is SnapshotStatus.FAILED
    assert loaded.error == snapshot.error
    assert loaded.agents == {}
    assert loaded.channels == []
    assert loaded.completed_at is None


@pytest.mark.store_roles("runs", "leases")
async def test_snapshot_with_nothing_in_flight_reads_back_equal(store: Store) -> None:
    run = await stored_run(store)
    snapshot = make_snapshot(run.id, agents={"$env": make_cut({})}, channels=[])

    await store.save_snapshot(snapshot)

    assert_same_snapshot(await store.load_snapshot(snapshot.id), snapshot)


@pytest.mark.store_roles("runs", "leases")
async def test_list_snapshots_orders_by_seq_and_keeps_runs_apart(store: Store) -> None:
    run = await stored_run(store)
    other = await stored_run(store)
    snapshots = {seq: make_snapshot(run.id, seq) for seq in (1, 2, 3, 4)}
    snapshots[3] = make_snapshot(run.id, 3, status=SnapshotStatus.FAILED, error="closed")
    for seq in (3, 1, 4, 2):
        await store.save_snapshot(snapshots[seq])
    others = [make_snapshot(other.id, seq) for seq in (2, 1)]
    for snapshot in others:
        await store.save_snapshot(snapshot)

    listed = await store.list_snapshots(run.id)

    assert [s.seq for s in listed] == [1, 2, 3, 4]
    for loaded, saved in zip(listed, [snapshots[seq] for seq in (1, 2, 3, 4)], strict=True):
        assert_same_snapshot(loaded, saved)
    assert await store.list_snapshots(other.id) == [others[1], others[0]]


@pytest.mark.store_roles("runs", "leases", "queries")
async def test_list_snapshots_page_walks_a_run_in_pages(store: Store) -> None:
    run = await stored_run(store)
    other = await stored_run(store)
    snapshots = {seq: make_snapshot(run.id, seq) for seq in (1, 2, 3, 5, 8)}
    snapshots[3] = make_snapshot(run.id, 3, status=SnapshotStatus.FAILED, error="closed")
    for seq in (8, 3, 1, 5, 2):
        await store.save_snapshot(snapshots[seq])
    await store.save_snapshot(make_snapshot(other.id, 4))

    pages: list[list[int]] = []
    after = 0
    while page := await store.list_snapshots_page(run.id, after_seq=after, limit=2):
        pages.append([s.seq for s in page])
        for loaded in page:
            assert_same_snapshot(loaded, snapshots[loaded.seq])
        after = page[-1].seq
    assert pages == [[1, 2], [3, 5], [8]]
    assert [s.seq for s in await store.list_snapshots_page(run.id)] == [1, 2, 3, 5, 8]
    assert [s.seq for s in await store.list_snapshots_page(run.id, after_seq=4)] == [5, 8]
    assert await store.list_snapshots_page(run.id, after_seq=8) == []
    assert await store.list_snapshots_page(run.id, limit=5) == await store.list_snapshots(run.id)


@pytest.mark.store_roles("runs", "leases", "queries")
async def test_list_snapshots_page_of_an_unknown_run_or_an_empty_page_is_refused(
    store: Store,
) -> None:
    run = await stored_run(store)
    assert await store.list_snapshots_page(run.id) == []
    with pytest.raises(NotFoundError) as error:
        await store.list_snapshots_page("no-such-run")
    assert_not_found(error, "run", "no-such-run")
    with pytest.raises(ConfigurationError):
        await store.list_snapshots_page(run.id, limit=0)


@pytest.mark.store_roles("runs", "leases", "queries")
async def test_snapshot_summaries_say_what_the_snapshots_hold(store: Store) -> None:
    run = await stored_run(store)
    other = await stored_run(store)
    complete = make_snapshot(run.id, 1, initiator="alice")
    failed = make_snapshot(run.id, 2, status=SnapshotStatus.FAILED, error="agent 'bob' failed")
    empty = make_snapshot(run.id, 3, agents={"$env": make_cut({})}, channels=[])
    for snapshot in (empty, complete, failed):
        await store.save_snapshot(snapshot)
    await store.save_snapshot(make_snapshot(other.id, 1))

    summaries = await store.list_snapshot_summaries(run.id)

    assert [s.seq for s in summaries] == [1, 2, 3]
    first, second, third = summaries
    assert isinstance(first, SnapshotSummary)
    assert (first.id, first.run_id, first.initiator) == (complete.id, run.id, "alice")
    assert first.status is SnapshotStatus.COMPLETE
    assert first.agents == sorted(complete.agents)
    assert first.in_flight == sum(len(c.messages) for c in complete.channels) > 0
    assert (first.error, first.damaged_agents) == (None, [])
    assert_aware_equal(first.started_at, complete.started_at, "started_at")
    assert_aware_equal(first.completed_at, complete.completed_at, "completed_at")
    assert (second.status, second.error, second.agents, second.in_flight) == (
        SnapshotStatus.FAILED,
        "agent 'bob' failed",
        [],
        0,
    )
    assert (third.agents, third.in_flight) == (["$env"], 0)
    # The same as summing up the whole snapshots.
    assert summaries == [SnapshotSummary.of(s) for s in await store.list_snapshots(run.id)]
    assert await store.list_snapshot_summaries((await stored_run(store)).id) == []
    with pytest.raises(NotFoundError) as error:
        await store.list_snapshot_summaries("no-such-run")
    assert_not_found(error, "run", "no-such-run")


@pytest.mark.store_roles("runs", "leases", "queries")
async def test_snapshot_counts_count_every_snapshot_of_each_run(store: Store) -> None:
    assert await store.snapshot_counts() == {}
    run = await stored_run(store)
    other = await stored_run(store)
    empty = await stored_run(store)
    await store.save_snapshot(make_snapshot(run.id, 1))
    await store.save_snapshot(make_snapshot(run.id, 2, status=SnapshotStatus.FAILED, error="x"))
    await store.save_snapshot(make_snapshot(other.id, 1))

    assert await store.snapshot_counts() == {run.id: 2, other.id: 1}
    assert empty.id not in await store.snapshot_counts()


@pytest.mark.store_roles("runs", "leases")
async def test_list_snapshots_of_a_run_without_snapshots_is_empty(store: Store) -> None:
    run = await stored_run(store)
    assert await store.list_snapshots(run.id) == []


@pytest.mark.store_roles("runs", "leases")
async def test_list_snapshots_of_an_unknown_run_is_not_found(store: Store) -> None:
    run = await stored_run(store)
    await store.save_snapshot(make_snapshot(run.id))
    missing = new_id()
    with pytest.raises(NotFoundError) as error:
        await store.list_snapshots(missing)
    assert_not_found(error, "run", missing)


@pytest.mark.store_roles("runs", "leases")
async def test_find_ids_matches_run_ids_by_prefix(store: Store) -> None:
    ids = ["ab12" + "0" * 28, "ab34" + "0" * 28, "cd56" + "0" * 28, "a%_b" + "0" * 28]
    for run_id in ids:
        await stored_run(store, run_id=run_id)

    assert await store.find_ids("run", "ab") == [ids[0], ids[1]]
    assert await store.find_ids("run", "ab3") == [ids[1]]
    assert await store.find_ids("run", ids[2]) == [ids[2]]
    assert await store.find_ids("run", "ab", limit=1) == [ids[0]]
    assert await store.find_ids("run", "ef") == []
    assert await store.find_ids("run", "a%") == [ids[3]]  # no wildcards
    assert await store.find_ids("run", "a_") == []
    assert sorted(await store.find_ids("run", "")) == sorted(ids)
    assert await store.find_ids("snapshot", "ab") == []


@pytest.mark.store_roles("runs", "leases")
async def test_find_ids_matches_snapshot_ids_of_every_run(store: Store) -> None:
    first = await stored_run(store)
    second = await stored_run(store)
    a = "ff01" + "0" * 28
    b = "ff02" + "0" * 28
    await store.save_snapshot(make_snapshot(first.id, snapshot_id=a))
    await store.save_snapshot(make_snapshot(second.id, snapshot_id=b))

    assert await store.find_ids("snapshot", "ff0") == [a, b]
    assert await store.find_ids("snapshot", "ff02") == [b]
    assert await store.find_ids("run", "ff0") == []


@pytest.mark.store_roles("runs", "leases")
async def test_unknown_snapshot_is_not_found(store: Store) -> None:
    run = await stored_run(store)
    await store.save_snapshot(make_snapshot(run.id))
    missing = new_id()
    with pytest.raises(NotFoundError) as error:
        await store.load_snapshot(missing)
    assert_not_found(error, "snapshot", missing)


@pytest.mark.store_roles("runs")
async def test_snapshot_of_an_unknown_run_is_not_saved(store: Store) -> None:
    missing = new_id()
    snapshot = make_snapshot(missing)

    with pytest.raises(NotFoundError) as error:
        await store.save_snapshot(snapshot)

    assert_not_found(error, "run", missing)
    with pytest.raises(NotFoundError):
        await store.load_snapshot(snapshot.id)


@pytest.mark.store_roles("runs", "leases")
async def test_saving_a_snapshot_id_twice_fails_and_keeps_the_first(store: Store) -> None:
    store_error = store_error_class()
    run = await stored_run(store)
    first = make_snapshot(run.id, 1)
    await store.save_snapshot(first)
    duplicate = make_snapshot(
        run.id,
        2,
        snapshot_id=first.id,
        agents={"$env": make_cut({}), "carol": make_cut({"balance": 1})},
        channels=[],
    )

    with pytest.raises(store_error, match=re.escape(first.id)):
        await store.save_snapshot(duplicate)

    assert_same_snapshot(await store.load_snapshot(first.id), first)
    assert await store.list_snapshots(run.id) == [first]
    # The store is still usable after the rejected write.
    third = make_snapshot(run.id, 3)
    await store.save_snapshot(third)
    assert await store.list_snapshots(run.id) == [first, third]


def test_store_error_is_a_run_error_exported_by_agentsnap() -> None:
    store_error = store_error_class()
    assert issubclass(store_error, RunError)
    assert getattr(agentsnap, "StoreError", None) is store_error


@pytest.mark.store_roles("runs", "leases")
async def test_identical_states_share_their_content(store: Store) -> None:
    run = await stored_run(store)
    other = await stored_run(store)
    same: dict[str, JsonValue] = {"balance": 1000, "notes": ["ü", 0.5, None]}
    first = make_snapshot(
        run.id,
        1,
        agents={"$env": make_cut({}), "alice": make_cut(same), "bob": make_cut(same)},
        channels=[],
    )
    second = make_snapshot(
        run.id,
        2,
        agents={"$env": make_cut({}), "alice": make_cut(same), "bob": make_cut({"balance": 7})},
        channels=[],
    )
    elsewhere = make_snapshot(
        other.id, 1, agents={"$env": make_cut({}), "carol": make_cut(same)}, channels=[]
    )
    for snapshot in (first, second, elsewhere):
        await store.save_snapshot(snapshot)

    one = await store.load_snapshot(first.id)
    two = await store.load_snapshot(second.id)
    three = await store.load_snapshot(elsewhere.id)

    shared = [one.agents["alice"], one.agents["bob"], two.agents["alice"], three.agents["carol"]]
    assert {cut.state_hash for cut in shared} == {content_hash(canonical_json(same))}
    assert all(cut.state == same for cut in shared)
    assert all(cut.state_json == canonical_json(same) for cut in shared)
    assert one.agents["$env"].state_hash == two.agents["$env"].state_hash
    assert two.agents["bob"].state == {"balance": 7}
    assert two.agents["bob"].state_hash != two.agents["alice"].state_hash
    for loaded, saved in ((one, first), (two, second), (three, elsewhere)):
        assert_same_snapshot(loaded, saved)


# -- agent history --------------------------------------------------------------------------


@pytest.mark.store_roles("runs", "leases", "queries")
async def test_agent_history_lists_complete_snapshots_in_order(store: Store) -> None:
    run = await stored_run(store)
    other = await stored_run(store)
    states: list[dict[str, JsonValue]] = [{"balance": 1}, {"balance": 1}, {"balance": 2}]
    saved = []
    for seq, state in enumerate(states, start=1):
        snapshot = make_snapshot(
            run.id,
            seq,
            agents={
                "$env": make_cut({}, sent={"alice": seq}),
                "alice": make_cut(state, received={"$env": seq}),
            },
            channels=[],
        )
        await store.save_snapshot(snapshot)
        saved.append(snapshot)
    # A failed snapshot between them and another run's snapshot are left out.
    await store.save_snapshot(
        make_snapshot(run.id, 4, status=SnapshotStatus.FAILED, error="store was down")
    )
    await store.save_snapshot(
        make_snapshot(other.id, 1, agents={"alice": make_cut({"balance": 99})}, channels=[])
    )

    history = await store.agent_history(run.id, "alice")

    assert [v.snapshot_id for v in history] == [s.id for s in saved]
    assert [v.snapshot_seq for v in history] == [1, 2, 3]
    assert [cut_of(v).state for v in history] == states
    assert [cut_of(v).received for v in history] == [{"$env": 1}, {"$env": 2}, {"$env": 3}]
    for version, snapshot in zip(history, saved, strict=True):
        assert version.cut == snapshot.agents["alice"]
        assert_aware_equal(version.completed_at, snapshot.completed_at, "completed_at")
    assert (
        cut_of(history[0]).state_hash
        == cut_of(history[1]).state_hash
        != cut_of(history[2]).state_hash
    )
    assert [v.damaged for v in history] == [None, None, None]


@pytest.mark.store_roles("runs", "leases", "queries")
async def test_agent_history_of_an_unknown_agent_is_not_found(store: Store) -> None:
    run = await stored_run(store)
    await store.save_snapshot(make_snapshot(run.id, 1))
    with pytest.raises(NotFoundError) as error:
        await store.agent_history(run.id, "mallory")
    assert_not_found(error, "agent", "mallory")
    assert run.id in str(error.value)


@pytest.mark.store_roles("queries")
async def test_agent_history_of_an_unknown_run_is_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError) as error:
        await store.agent_history("no-such-run", "alice")
    assert_not_found(error, "run", "no-such-run")


# -- journal --------------------------------------------------------------------------------


def segment(src: str, dst: str, event: str, first: int, last: int, note: str) -> JournalSegment:
    return JournalSegment(src, dst, event, first, last, f'{{"note":"{note}"}}')


@pytest.mark.store_roles("runs", "log", "leases")
async def test_journal_segments_read_back_in_append_order(store: Store) -> None:
    run = await stored_run(store)
    other = await stored_run(store)
    first = [
        segment("$env", "alice", "send", 1, 3, "ünï ✓"),
        segment("alice", "bob", "send", 1, 1, "b"),
    ]
    second = [
        segment("$env", "alice", "deliver", 1, 3, "c"),
        segment("$env", "alice", "send", 4, 4, "d"),
    ]
    await store.append_journal(run.id, first)
    await store.append_journal(other.id, [segment("x", "y", "send", 1, 1, "elsewhere")])
    await store.append_journal(run.id, [])
    await store.append_journal(run.id, second)

    assert await store.load_journal(run.id) == first + second
    assert await store.load_journal(other.id) == [segment("x", "y", "send", 1, 1, "elsewhere")]


@pytest.mark.store_roles("runs", "log", "leases")
async def test_journal_pages_read_back_in_append_order(store: Store) -> None:
    run = await stored_run(store)
    other = await stored_run(store)
    written = [segment("$env", "alice", "send", i, i, f"n{i}") for i in range(1, 8)]
    await store.append_journal(run.id, written[:3])
    await store.append_journal(other.id, [segment("x", "y", "send", 1, 1, "elsewhere")])
    await store.append_journal(run.id, written[3:])

    pages: list[list[JournalSegment]] = []
    after = 0
    while page := await store.load_journal_page(run.id, after=after, limit=3):
        positions = [position for position, _ in page]
        assert positions == sorted(set(positions))
        assert positions[0] > after
        pages.append([found for _, found in page])
        after = positions[-1]
    assert pages == [written[:3], written[3:6], written[6:]]
    assert [found for _, found in await store.load_journal_page(run.id)] == written
    assert await store.load_journal_page(run.id, after=after) == []
    # A segment appended later comes after the last position read.
    await store.append_journal(run.id, [segment("alice", "bob", "send", 1, 1, "late")])
    assert [found for _, found in await store.load_journal_page(run.id, after=after)] == [
        segment("alice", "bob", "send", 1, 1, "late")
    ]


@pytest.mark.store_roles("runs", "log", "leases")
async def test_journal_page_of_an_unknown_run_or_an_empty_page_is_refused(store: Store) -> None:
    run = await stored_run(store)
    assert await store.load_journal_page(run.id) == []
    with pytest.raises(NotFoundError) as error:
        await store.load_journal_page("no-such-run")
    assert_not_found(error, "run", "no-such-run")
    with pytest.raises(ConfigurationError):
        await store.load_journal_page(run.id, limit=0)


@pytest.mark.store_roles("runs", "log", "leases")
async def test_journal_of_a_run_without_one_is_empty(store: Store) -> None:
    run = await stored_run(store)
    assert await store.load_journal(run.id) == []


@pytest.mark.store_roles("log")
async def test_journal_of_an_unknown_run_is_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError) as error:
        await store.append_journal("no-such-run", [segment("a", "b", "send", 1, 1, "x")])
    assert_not_found(error, "run", "no-such-run")
    with pytest.raises(NotFoundError) as error:
        await store.load_journal("no-such-run")
    assert_not_found(error, "run", "no-such-run")


# -- end to end -----------------------------------------------------------------------------


class TellerState(AgentState):
    balance: int
    transfers_out: int = 0


class Teller(Agent[TellerState]):
    """On ``go``, passes some of its balance to the next teller in the ring."""

    def __init__(self, name: str, balance: int, next_teller: str, rng: random.Random) -> None:
        super().__init__(name, TellerState(balance=balance))
        self.next_teller = next_teller
        self.rng = rng

    async def handle(self, message: Message, ctx: Context[TellerState]) -> None:
        if message.kind == "transfer":
            self.state.balance += get(message.payload, "amount", int)
        elif message.kind == "go" and self.state.balance > 0:
            amount = self.rng.randint(1, min(self.state.balance, 50))
            self.state.balance -= amount
            self.state.transfers_out += 1
            ctx.send(self.next_teller, {"amount": amount, "note": "→ ring"}, kind="transfer")


def money_in(snapshot: Snapshot) -> int:
    total = sum(
        get(cut.state, "balance", int) for name, cut in snapshot.agents.items() if name != "$env"
    )
    for channel in snapshot.channels:
        total += sum(
            get(m.payload, "amount", int) for m in channel.messages if m.kind == "transfer"
        )
    return total


@pytest.mark.store_roles("runs", "log", "leases")
@pytest.mark.parametrize("seed", [3, 11])
async def test_bank_ring_snapshots_are_stored_as_taken(store: Store, seed: int) -> None:
    tellers = 4
    rng = random.Random(seed)
    names = [f"teller-{i}" for i in range(tellers)]
    scheduler = SeededScheduler(seed)
    handles: list[SnapshotHandle] = []
    async with Runtime(
        store=store, scheduler=scheduler, metadata={"example": "bank ring", "seed": seed}
    ) as runtime:
        added = [
            runtime.add(Teller(name, 1_000, names[(i + 1) % tellers], random.Random(rng.random())))
            for i, name in enumerate(names)
        ]
        for i in range(120):
            runtime.send(rng.choice(names), kind="go")
            if i % 20 == 0:
                initiators = [rng.choice([None, *names]) for _ in range(rng.choice((1, 2)))]
                handles.extend(runtime.snapshot(initiator=who) for who in initiators)
            for _ in range(rng.randint(0, 6)):
                if not await scheduler.step():
                    break
        await runtime.run_until_idle()
        run_id = runtime.run_id

    taken = [await handle for handle in handles]
    assert len(taken) >= 6
    assert (await store.get_run(run_id)).metadata == {"example": "bank ring", "seed": seed}
    start, *listed, end = await store.list_snapshots(run_id)
    assert [s.id for s in listed] == [s.id for s in sorted(taken, key=lambda s: s.seq)]
    # The first input took the start snapshot: every teller as registered, nothing sent yet.
    assert (start.seq, start.initiator, start.status) == (1, "$env", SnapshotStatus.COMPLETE)
    assert_consistent(start)
    balances = {name: cut.state["balance"] for name, cut in start.agents.items() if name != "$env"}
    assert balances == dict.fromkeys(names, 1_000)
    assert start.channels == []
    assert_same_snapshot(await store.load_snapshot(start.id), start)
    for snapshot in taken:
        loaded = await store.load_snapshot(snapshot.id)
        assert_consistent(loaded)
        assert_same_snapshot(loaded, snapshot)
        assert money_in(loaded) == 1_000 * tellers
    # Going idle took the end snapshot: where the run stands, with nothing left in flight.
    assert (end.seq, end.initiator, end.status) == (
        listed[-1].seq + 1,
        "$env",
        SnapshotStatus.COMPLETE,
    )
    assert_consistent(end)
    assert end.channels == []
    assert money_in(end) == 1_000 * tellers
    assert {name: cut.state for name, cut in end.agents.items() if name != "$env"} == {
        teller.name: teller.state.model_dump(mode="json") for teller in added
    }


# -- state schemas ---------------------------------------------------------------------------


WRITER_SCHEMA: dict[str, JsonValue] = {
    "type": "object",
    "properties": {"drafts": {"type": "array", "items": {"type": "string"}}, "ratio": 3.0},
    "title": "naïve — 日本語",
}


@pytest.mark.store_roles("runs")
async def test_state_schemas_read_back_equal_and_are_replaced_per_agent(store: Store) -> None:
    await store.create_run(RunInfo(id="run-1", created_at=T0))
    await store.create_run(RunInfo(id="run-2", created_at=T0))
    assert await store.load_state_schemas("run-1") == {}
    await store.save_state_schemas("run-1", {"writer": WRITER_SCHEMA, "critic": {"type": "object"}})
    await store.save_state_schemas("run-2", {"writer": {"type": "object"}})
    found = await store.load_state_schemas("run-1")
    assert found == {"critic": {"type": "object"}, "writer": WRITER_SCHEMA}
    assert list(found) == ["critic", "writer"]
    assert isinstance(get(get(found["writer"], "properties", dict), "ratio", float), float)
    # Saving again replaces the agents named and keeps the others.
    await store.save_state_schemas("run-1", {"critic": {"type": "object", "title": "v2"}})
    again = await store.load_state_schemas("run-1")
    assert again["critic"] == {"type": "object", "title": "v2"}
    assert again["writer"] == WRITER_SCHEMA
    assert await store.load_state_schemas("run-2") == {"writer": {"type": "object"}}
    # What is read is a copy: changing it changes nothing stored.
    again["writer"]["title"] = "changed"
    assert (await store.load_state_schemas("run-1"))["writer"] == WRITER_SCHEMA


@pytest.mark.store_roles("runs")
async def test_state_schemas_of_an_unknown_run_are_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError):
        await store.load_state_schemas("nope")
    with pytest.raises(NotFoundError):
        await store.save_state_schemas("nope", {"a": {"type": "object"}})


class DraftState(AgentState):
    drafts: list[str] = Field(default_factory=list)


class Drafter(Agent[DraftState]):
    async def handle(self, message: Message, ctx: Context[DraftState]) -> None:
        ctx.state.drafts.append(str(message.payload))


@pytest.mark.store_roles("runs", "log", "leases")
async def test_a_runtime_records_its_agents_state_schemas(store: Store) -> None:
    async with Runtime(store=store) as runtime:
        runtime.add(Drafter("early"))
        await runtime.start()
        runtime.add(Drafter("late"))  # registered after the run was written
        runtime.send("early", "x")
        await runtime.run_until_idle()
    schemas = await store.load_state_schemas(runtime.run_id)
    assert set(schemas) == {"early", "late"}
    assert schemas["early"] == {**DraftState.model_json_schema(), "x-state-version": 1}
    drafts = get(get(schemas["late"], "properties", dict), "drafts", dict)
    assert drafts["type"] == "array"
