"""The local spool of writes a sick database refused, and ``agentsnap db recover``."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from ledger_entries import claim_of

from agentsnap import (
    ConfigurationError,
    JournalSegment,
    MemoryStore,
    NotFoundError,
    ReplaySegment,
    RollbackInfo,
    RunInfo,
    RunStatus,
    Snapshot,
    SnapshotStatus,
    StoreError,
)
from agentsnap.cli import main
from agentsnap.ledger import Change, LedgerEntry, ToolCallStatus
from agentsnap.records import utcnow
from agentsnap.store import Store
from agentsnap.store.ledger import MemoryLedger
from agentsnap.store.spool import (
    AppendJournal,
    AppendReplay,
    FinishRun,
    LedgerChange,
    Outcome,
    ReleaseLease,
    SaveRollback,
    Spool,
    SpoolError,
    SpoolOp,
    UpdateLedger,
)
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger

RUN = "a" * 32
OTHER = "b" * 32
AT = datetime(2025, 3, 1, 12, 30, 15, 123456, tzinfo=UTC)


def segment(n: int) -> JournalSegment:
    return JournalSegment("$env", "w", "send", n, n, json.dumps({"seq": n, "at": [n]}))


def rollback(run_id: str = RUN, snapshot_id: str = "s" * 32, n: int = 1) -> RollbackInfo:
    return RollbackInfo(
        id=f"{n:032x}",
        run_id=run_id,
        snapshot_id=snapshot_id,
        agent="writer",
        reason="too short",
        source="length",
        attempt=n,
        discarded=2,
        at=AT,
    )


def snapshot(run_id: str = RUN, snapshot_id: str = "s" * 32) -> Snapshot:
    return Snapshot(
        id=snapshot_id,
        run_id=run_id,
        seq=1,
        initiator="$env",
        status=SnapshotStatus.COMPLETE,
        started_at=AT,
        completed_at=AT,
    )


def claim(key: str, run_id: str = RUN, owner: str = "host:1:abc") -> LedgerEntry:
    return claim_of(key, run_id, owner=owner, at=AT)


SUCCEEDED: Change = {
    "status": ToolCallStatus.SUCCEEDED,
    "owner": None,
    "lease_until": None,
    "result": {"charged": 5, "big": 2**70, "ratio": 0.1, "list": [1, "a", None]},
    "updated_at": AT + timedelta(seconds=1),
}


def every_op(run_id: str = RUN, token: int = 1) -> list[SpoolOp]:
    """One of each operation, as a closing runtime would spool them, in order."""
    return [
        AppendJournal(run_id=run_id, segments=[segment(1), segment(2)]),
        AppendReplay.of(run_id, ReplaySegment.of(0, [("w", "$env", 1)])),
        AppendReplay.of(run_id, ReplaySegment.of(0, [("w", "$env", 2)])),
        SaveRollback(info=rollback(run_id)),
        UpdateLedger.of(
            run_id,
            "k1",
            SUCCEEDED,
            statuses=[ToolCallStatus.IN_PROGRESS],
            owner="host:1:abc",
            attempts=1,
        ),
        AppendJournal(run_id=run_id, segments=[segment(3)]),
        FinishRun(run_id=run_id, status=RunStatus.SUCCEEDED, finished_at=AT, token=token),
        ReleaseLease(run_id=run_id, token=token),
    ]


async def make_run(store: Store, ledger: MemoryLedger | SqlLedger, run_id: str = RUN) -> int:
    """A run as a runtime left it when the database went away at close; its lease token."""
    await store.create_run(RunInfo(id=run_id, created_at=AT))
    await store.save_snapshot(snapshot(run_id))
    lease = await store.take_lease(
        run_id, "host:1:abc", utcnow() + timedelta(minutes=5), replacing=None
    )
    assert lease is not None
    assert await ledger.claim(claim("k1", run_id)) is None
    return lease.token


async def state_of(store: Store, ledger: MemoryLedger | SqlLedger, run_id: str = RUN) -> Any:
    """Everything the spooled operations change, to compare two stores by."""
    run = await store.get_run(run_id)
    lease = await store.get_lease(run_id)
    entry = await ledger.get("k1")
    assert entry is not None
    return (
        run.status,
        run.finished_at,
        await store.load_journal(run_id),
        await store.load_replay(run_id),
        [r.id for r in await store.list_rollbacks(run_id)],
        lease is not None and lease.expires_at <= utcnow(),
        (entry.status, entry.owner, entry.result, entry.updated_at),
    )


# -- the operations as JSON -----------------------------------------------------------------


def test_every_operation_round_trips_through_the_file(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    ops = every_op()
    for op in ops:
        spool.add(op)
    assert spool.runs() == [RUN]
    back = spool.pending(RUN)
    assert back == ops
    assert [type(op) for op in back] == [type(op) for op in ops]
    # Enums, times (with their zone) and journal segments come back as they were.
    journal, replay, _, rolled, update, _, finish, release = back
    assert isinstance(journal, AppendJournal)
    assert all(type(s) is JournalSegment for s in journal.segments)
    assert isinstance(replay, AppendReplay)
    assert replay.segment == ReplaySegment.of(0, [("w", "$env", 1)])
    assert isinstance(rolled, SaveRollback)
    assert rolled.info == rollback()
    assert rolled.info.at.tzinfo is UTC
    assert isinstance(finish, FinishRun)
    assert finish.status is RunStatus.SUCCEEDED
    assert finish.finished_at == AT
    assert finish.finished_at.tzinfo is UTC
    assert isinstance(update, UpdateLedger)
    assert update.statuses == [ToolCallStatus.IN_PROGRESS]
    change = update.change.as_change()
    assert change == SUCCEEDED
    assert set(change) == set(SUCCEEDED)  # absent columns stay absent, None stays None
    assert change["status"] is ToolCallStatus.SUCCEEDED
    assert change["updated_at"].tzinfo is UTC
    assert isinstance(release, ReleaseLease)
    assert release.token == 1
    # One JSON object a line, with its kind first; no pickle anywhere.
    lines = spool.file(RUN).read_text().splitlines()
    assert [json.loads(line)["op"] for line in lines] == [op.op for op in ops]


def test_a_change_keeps_other_zones_and_naive_times() -> None:
    paris = timezone(timedelta(hours=1))
    change: Change = {"lease_until": datetime(2025, 1, 1, 12, tzinfo=paris), "attempts": 2}
    op = UpdateLedger.of(RUN, "k", change, statuses=(ToolCallStatus.RETRYABLE,))
    back = UpdateLedger.model_validate_json(op.model_dump_json())
    assert back.change.as_change() == change
    lease_until = back.change.as_change()["lease_until"]
    assert lease_until is not None
    assert lease_until.utcoffset() == timedelta(hours=1)
    naive = FinishRun(run_id=RUN, status=RunStatus.FAILED, finished_at=datetime(2025, 1, 1))
    assert FinishRun.model_validate_json(naive.model_dump_json()) == naive


def test_a_change_cannot_null_a_required_column() -> None:
    with pytest.raises(ValueError, match="cannot set status to null"):
        LedgerChange.model_validate({"status": None})


def test_add_appends_one_fsynced_line_per_operation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[tuple[int, int]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        found = os.fstat(fd)
        synced.append((found.st_dev, found.st_ino))
        real_fsync(fd)

    def identity(path: Path) -> tuple[int, int]:
        found = path.stat()
        return found.st_dev, found.st_ino

    monkeypatch.setattr(os, "fsync", fsync)
    spool = Spool(tmp_path / "deep" / "spool")  # created as needed
    first, second = every_op()[:2]
    spool.add(first)
    assert spool.file(RUN).read_text().count("\n") == 1
    assert identity(spool.file(RUN)) in synced  # the data
    assert identity(spool.directory) in synced  # the new file's name
    synced.clear()
    spool.add(second)
    assert synced == [identity(spool.file(RUN))]
    assert spool.pending(RUN) == [first, second]


def test_each_run_has_its_own_file_and_odd_ids_are_safe_file_names(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    odd = "../x/y:z%"
    spool.add(ReleaseLease(run_id=odd, token=1))
    spool.add(ReleaseLease(run_id=OTHER, token=2))
    assert spool.file(odd).parent == tmp_path
    assert spool.runs() == sorted([odd, OTHER])
    assert [op.token for op in spool.pending(odd)] == [1]  # type: ignore[union-attr]
    assert spool.pending("nothing") == []
    assert Spool(tmp_path / "missing").runs() == []


# -- where a database's spool is ------------------------------------------------------------


def test_the_spool_of_an_sqlite_file_is_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert Spool.for_url(f"sqlite:///{tmp_path}/runs.db").directory == tmp_path / "runs.db.spool"
    monkeypatch.chdir(tmp_path)
    assert Spool.for_url("sqlite:///agentsnap.db").directory == tmp_path / "agentsnap.db.spool"
    assert Spool.for_url("sqlite+aiosqlite:///a.db").directory == tmp_path / "a.db.spool"
    assert Spool.for_url("sqlite:///a.db", tmp_path / "mine").directory == tmp_path / "mine"


def test_other_databases_spool_under_the_state_home_one_directory_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    base = tmp_path / "state" / "agentsnap" / "spool"
    one = Spool.for_url("postgresql://me:secret@db.example:5432/runs").directory
    assert one.parent == base
    assert one.name.startswith("postgresql-db.example-5432-runs-")
    assert "secret" not in str(one)
    # The same database by another driver or user is the same spool; another database not.
    assert Spool.for_url("postgresql+psycopg://you@db.example:5432/runs").directory == one
    assert Spool.for_url("postgresql://db.example:5432/other").directory != one
    assert Spool.for_url("sqlite://").directory.parent == base  # in memory: no file to sit by
    monkeypatch.delenv("XDG_STATE_HOME")
    home = Path.home() / ".local" / "state" / "agentsnap" / "spool"
    assert Spool.for_url("postgresql://db.example/runs").directory.parent == home
    with pytest.raises(ConfigurationError, match="not a database URL"):
        Spool.for_url("not a url")


# -- replay ---------------------------------------------------------------------------------


async def test_replay_applies_every_operation_in_order_and_empties_the_spool(
    tmp_path: Path,
) -> None:
    store, ledger = MemoryStore(), MemoryLedger()
    token = await make_run(store, ledger)
    spool = Spool(tmp_path)
    ops = every_op(token=token)
    for op in ops:
        spool.add(op)

    report = await spool.replay(store, ledger)

    assert report.complete
    assert [(done.op, done.outcome) for done in report.applied] == [
        (op, Outcome.APPLIED) for op in ops
    ]
    assert spool.runs() == []
    assert not spool.file(RUN).exists()
    status, finished_at, journal, replay, rollbacks, released, entry = await state_of(store, ledger)
    assert (status, finished_at) == (RunStatus.SUCCEEDED, AT)
    assert journal == [segment(1), segment(2), segment(3)]
    assert replay == [o.segment for o in ops if isinstance(o, AppendReplay)]
    assert rollbacks == [rollback().id]
    assert released
    assert entry == (ToolCallStatus.SUCCEEDED, None, SUCCEEDED["result"], SUCCEEDED["updated_at"])
    # Nothing left: a second replay does nothing.
    assert (await spool.replay(store, ledger)).applied == []


class Crash(BaseException):
    """The process dies: nothing after it runs."""


class Sick:
    """A store or ledger that passes calls on, and fails once ``budget`` writes are made."""

    WRITES = frozenset(
        {
            "finish_run",
            "append_journal",
            "append_replay",
            "save_rollback",
            "release_lease",
            "update",
        }
    )

    def __init__(self, inner: Any, budget: list[int], error: BaseException | None = None) -> None:
        self.inner = inner
        self.budget = budget
        self.error = error or Crash()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)
        if name not in self.WRITES:
            return method

        async def write(*args: Any, **kwargs: Any) -> Any:
            if self.budget[0] <= 0:
                raise self.error
            self.budget[0] -= 1
            return await method(*args, **kwargs)

        return write


@pytest.mark.parametrize("crash_after", range(len(every_op()) + 1))
async def test_replay_after_a_crash_between_applying_and_removing_is_idempotent(
    tmp_path: Path, crash_after: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reference: a replay that runs through.
    clean_store, clean_ledger = MemoryStore(), MemoryLedger()
    token = await make_run(clean_store, clean_ledger)
    clean = Spool(tmp_path / "clean")
    for op in every_op(token=token):
        clean.add(op)
    await clean.replay(clean_store, clean_ledger)

    store, ledger = MemoryStore(), MemoryLedger()
    await make_run(store, ledger)
    spool = Spool(tmp_path / "crashing")
    ops = every_op(token=token)
    for op in ops:
        spool.add(op)
    before = spool.file(RUN).read_bytes()

    # The process dies after `crash_after` writes (all of them: once every operation is
    # applied), before the replay removed any of them from the file.
    def die(self: Spool, path: Path, ids: set[str]) -> int:
        raise Crash

    budget = [crash_after]
    with monkeypatch.context() as patched:
        patched.setattr(Spool, "_remove", die)
        with pytest.raises(Crash):
            await spool.replay(Sick(store, budget), Sick(ledger, budget))
    assert spool.file(RUN).read_bytes() == before

    report = await spool.replay(store, ledger)

    assert report.complete
    assert len(report.applied) == len(ops)
    assert await state_of(store, ledger) == await state_of(clean_store, clean_ledger)
    assert spool.runs() == []


async def test_replay_skips_what_is_stored_already(tmp_path: Path) -> None:
    store, ledger = MemoryStore(), MemoryLedger()
    token = await make_run(store, ledger)
    ops = every_op(token=token)
    spool = Spool(tmp_path)
    for op in ops:
        spool.add(op)
    first = await spool.replay(store, ledger)
    for op in ops:  # as if none had been removed
        spool.add(op)

    again = await spool.replay(store, ledger)

    assert [done.outcome for done in again.applied] == [
        Outcome.ALREADY_STORED,  # journal segments
        Outcome.ALREADY_STORED,  # replay segment 1: the log ends with both
        Outcome.ALREADY_STORED,
        Outcome.ALREADY_STORED,  # rollback, by id
        Outcome.NO_CHANGE,  # the ledger's compare-and-set
        Outcome.ALREADY_STORED,
        Outcome.ALREADY_STORED,  # the run's end
        Outcome.NO_CHANGE,  # the lease's release: it has ended already
    ]
    assert len(first.applied) == len(ops)
    assert len(await store.load_journal(RUN)) == 3
    assert len(await store.load_replay(RUN)) == 2
    assert len(await store.list_rollbacks(RUN)) == 1


async def test_a_replay_segment_stored_earlier_but_not_last_is_appended(tmp_path: Path) -> None:
    store = MemoryStore()
    await store.create_run(RunInfo(id=RUN))
    one, two = ReplaySegment.of(0, [("w", "$env", 1)]), ReplaySegment.of(0, [("w", "$env", 2)])
    await store.append_replay(RUN, one)
    await store.append_replay(RUN, two)
    spool = Spool(tmp_path)
    spool.add(AppendReplay.of(RUN, one))  # the log does not end with it: not a leftover

    report = await spool.replay(store)

    assert [done.outcome for done in report.applied] == [Outcome.APPLIED]
    assert await store.load_replay(RUN) == [one, two, one]


async def test_replay_stops_at_a_store_error_and_keeps_the_rest(tmp_path: Path) -> None:
    store, ledger = MemoryStore(), MemoryLedger()
    token = await make_run(store, ledger)
    await store.create_run(RunInfo(id=OTHER))
    spool = Spool(tmp_path)
    ops = every_op(token=token)
    for op in ops:
        spool.add(op)
    spool.add(FinishRun(run_id=OTHER, status=RunStatus.FAILED, finished_at=AT))
    down = StoreError("cannot reach the database: connection refused")

    report = await spool.replay(Sick(store, [2], down), ledger)

    assert [done.op for done in report.applied] == ops[:2]
    assert report.errors == {RUN: down, OTHER: down}  # the other run was not tried
    assert report.kept == {RUN: len(ops) - 2, OTHER: 1}
    assert not report.complete
    assert spool.pending(RUN) == ops[2:]
    assert len(spool.pending(OTHER)) == 1
    assert (await store.get_run(OTHER)).finished_at is None

    # The database is back.
    report = await spool.replay(store, ledger)
    assert report.complete
    assert [done.op for done in report.applied][: len(ops) - 2] == ops[2:]
    assert (await store.get_run(RUN)).status is RunStatus.SUCCEEDED
    assert (await store.get_run(OTHER)).status is RunStatus.FAILED
    assert spool.runs() == []


async def test_a_run_not_in_the_store_is_kept_and_the_others_replayed(tmp_path: Path) -> None:
    store = MemoryStore()
    await store.create_run(RunInfo(id=OTHER))
    spool = Spool(tmp_path)
    spool.add(FinishRun(run_id=RUN, status=RunStatus.SUCCEEDED, finished_at=AT))
    spool.add(FinishRun(run_id=OTHER, status=RunStatus.SUCCEEDED, finished_at=AT))

    report = await spool.replay(store)

    assert [done.op.run_id for done in report.applied] == [OTHER]
    assert isinstance(report.errors[RUN], NotFoundError)
    assert report.kept == {RUN: 1}
    assert spool.runs() == [RUN]


async def test_a_malformed_line_is_reported_with_its_file_and_line_and_kept(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    await store.create_run(RunInfo(id=RUN))
    spool = Spool(tmp_path)
    good = FinishRun(run_id=RUN, status=RunStatus.SUCCEEDED, finished_at=AT)
    later = ReleaseLease(run_id=RUN, token=1)
    spool.add(good)
    with spool.file(RUN).open("a") as handle:
        handle.write(json.dumps({"op": "finish_run", "run_id": RUN, "status": "weird"}) + "\n")
    spool.add(later)
    where = f"{spool.file(RUN)}:2"

    with pytest.raises(SpoolError, match="status") as raised:
        spool.pending(RUN)
    assert str(raised.value).startswith(where)
    assert raised.value.line == 2

    report = await spool.replay(store)

    assert [done.op for done in report.applied] == [good]  # what comes before it
    error = report.errors[RUN]
    assert isinstance(error, SpoolError)
    assert str(error).startswith(where)
    assert report.kept == {RUN: 2}
    lines = spool.file(RUN).read_text().splitlines()
    assert json.loads(lines[0])["status"] == "weird"
    assert json.loads(lines[1])["id"] == later.id


async def test_a_torn_last_line_does_not_swallow_the_next_operation(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    first = ReleaseLease(run_id=RUN, token=1)
    spool.add(first)
    with spool.file(RUN).open("a") as handle:
        handle.write('{"op": "finish_ru')  # the process died in the middle of a write
    second = ReleaseLease(run_id=RUN, token=2)
    spool.add(second)

    with pytest.raises(SpoolError, match=":2: not a spooled operation"):
        spool.pending(RUN)
    lines = spool.file(RUN).read_text().splitlines()
    assert len(lines) == 3
    assert json.loads(lines[2])["id"] == second.id


async def test_a_line_of_another_run_is_reported(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.file(RUN).write_text(ReleaseLease(run_id=OTHER, token=1).model_dump_json() + "\n")
    with pytest.raises(SpoolError, match=f":1: an operation of run {OTHER}"):
        spool.pending(RUN)


async def test_a_ledger_update_without_a_ledger_is_kept(tmp_path: Path) -> None:
    store, ledger = MemoryStore(), MemoryLedger()
    await make_run(store, ledger)
    spool = Spool(tmp_path)
    update = every_op()[4]
    spool.add(update)

    report = await spool.replay(store)

    assert report.applied == []
    assert isinstance(report.errors[RUN], ConfigurationError)
    assert "pass ledger=" in str(report.errors[RUN])
    assert spool.pending(RUN) == [update]


async def test_the_end_of_a_run_taken_over_since_is_stale(tmp_path: Path) -> None:
    store, ledger = MemoryStore(), MemoryLedger()
    token = await make_run(store, ledger)
    # Another runtime took the run over after this one's lease expired.
    taken = await store.take_lease(
        RUN, "host:2:def", utcnow() + timedelta(minutes=1), replacing=token
    )
    assert taken is not None
    spool = Spool(tmp_path)
    spool.add(FinishRun(run_id=RUN, status=RunStatus.SUCCEEDED, finished_at=AT, token=token))
    spool.add(ReleaseLease(run_id=RUN, token=token))

    report = await spool.replay(store)

    assert [done.outcome for done in report.applied] == [Outcome.STALE, Outcome.NO_CHANGE]
    assert report.complete
    assert (await store.get_run(RUN)).status is RunStatus.RUNNING
    assert await store.get_lease(RUN) == taken


async def test_replay_of_one_run_leaves_the_others(tmp_path: Path) -> None:
    store = MemoryStore()
    for run in (RUN, OTHER):
        await store.create_run(RunInfo(id=run))
    spool = Spool(tmp_path)
    for run in (RUN, OTHER):
        spool.add(FinishRun(run_id=run, status=RunStatus.SUCCEEDED, finished_at=AT))

    report = await spool.replay(store, run_id=OTHER)

    assert [done.op.run_id for done in report.applied] == [OTHER]
    assert spool.runs() == [RUN]
    assert (await spool.replay(store, run_id="nothing")).applied == []


async def test_two_replays_of_a_run_at_once_apply_each_operation_once(tmp_path: Path) -> None:
    class Slow(MemoryStore):
        async def append_journal(self, run_id: str, segments: Sequence[JournalSegment]) -> None:
            await asyncio.sleep(0.05)
            await super().append_journal(run_id, segments)

    store = Slow()
    await store.create_run(RunInfo(id=RUN))
    spool = Spool(tmp_path)
    for n in range(3):
        spool.add(AppendJournal(run_id=RUN, segments=[segment(n)]))
    # Each replay opens its own files, like two processes would.
    one, two = await asyncio.gather(Spool(tmp_path).replay(store), Spool(tmp_path).replay(store))

    assert sorted([len(one.applied), len(two.applied)]) == [0, 3]
    assert await store.load_journal(RUN) == [segment(0), segment(1), segment(2)]


async def test_operations_spooled_during_a_replay_stay_for_the_next(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    late = ReleaseLease(run_id=RUN, token=9)

    class Spooling(MemoryStore):
        async def finish_run(
            self,
            run_id: str,
            status: RunStatus,
            finished_at: datetime | None,
            reason: str | None = None,
        ) -> None:
            spool.add(late)  # the runtime spools more while the replay runs
            await super().finish_run(run_id, status, finished_at, reason)

    store = Spooling()
    await store.create_run(RunInfo(id=RUN))
    spool.add(FinishRun(run_id=RUN, status=RunStatus.SUCCEEDED, finished_at=AT))

    report = await spool.replay(store)

    assert len(report.applied) == 1
    assert report.kept == {RUN: 1}
    assert spool.pending(RUN) == [late]


async def test_appends_from_other_threads_during_replays_are_never_lost(tmp_path: Path) -> None:
    store = MemoryStore()
    await store.create_run(RunInfo(id=RUN))
    spool = Spool(tmp_path)

    def spool_some(start: int) -> None:
        writer = Spool(tmp_path)  # its own files, like another process
        for n in range(start, start + 40):
            writer.add(AppendJournal(run_id=RUN, segments=[segment(n)]))

    threads = [threading.Thread(target=spool_some, args=(i * 1000,)) for i in range(4)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        await spool.replay(store)
        await asyncio.sleep(0.001)
    for thread in threads:
        thread.join()
    await spool.replay(store)

    journal = await store.load_journal(RUN)
    expected = {segment(i * 1000 + n) for i in range(4) for n in range(40)}
    assert len(journal) == len(expected)
    assert set(journal) == expected
    assert spool.runs() == []


async def test_a_file_of_blank_lines_is_cleared(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.file(RUN).write_text("\n\n")
    assert spool.runs() == [RUN]
    report = await spool.replay(MemoryStore())
    assert report.complete
    assert spool.runs() == []


# -- agentsnap db recover -------------------------------------------------------------------


async def spool_a_real_run(db: str, spool: Spool) -> list[SpoolOp]:
    """A run in the database whose closing writes the database refused, spooled."""
    store = SqlStore(db)
    ledger = SqlLedger(db)
    try:
        token = await make_run(store, ledger)
    finally:
        await ledger.close()
        await store.close()
    ops = every_op(token=token)
    for op in ops:
        spool.add(op)
    return ops


async def read_back(db: str) -> Any:
    store = SqlStore(db, create=False)
    ledger = SqlLedger(db, create=False)
    try:
        return await state_of(store, ledger)
    finally:
        await ledger.close()
        await store.close()


async def create_run(db: str, run_id: str) -> None:
    store = SqlStore(db)
    try:
        await store.create_run(RunInfo(id=run_id))
    finally:
        await store.close()


def recover(db: str, *args: str) -> Any:
    return CliRunner().invoke(main, ["db", "recover", "--db", db, *args])


def test_recover_writes_a_runs_spooled_operations(
    empty_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    spool = Spool.for_url(empty_db)  # the default place: recover finds it without --spool
    ops = asyncio.run(spool_a_real_run(empty_db, spool))

    result = recover(empty_db)

    assert result.exit_code == 0, result.output
    *lines, summary = result.output.splitlines()
    assert len(lines) == len(ops)
    assert all(line.split()[:2] == ["applied", RUN] for line in lines)
    assert "finish run: succeeded" in lines[6]
    assert summary == f"recovered {len(ops)} spooled writes of 1 run from {spool.directory}"
    assert spool.runs() == []
    status, finished_at, journal, replay, rollbacks, released, entry = asyncio.run(
        read_back(empty_db)
    )
    assert (status, finished_at) == (RunStatus.SUCCEEDED, AT)
    assert journal == [segment(1), segment(2), segment(3)]
    assert replay == [o.segment for o in ops if isinstance(o, AppendReplay)]
    assert rollbacks == [rollback().id]
    assert released
    assert entry == (ToolCallStatus.SUCCEEDED, None, SUCCEEDED["result"], SUCCEEDED["updated_at"])

    again = recover(empty_db)
    assert again.exit_code == 0
    assert again.output == f"nothing to recover: no spooled writes in {spool.directory}\n"


def test_recover_replays_a_crashed_recovery_idempotently(empty_db: str, tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    asyncio.run(spool_a_real_run(empty_db, spool))
    before = spool.file(RUN).read_bytes()
    assert recover(empty_db, "--spool", str(spool.directory)).exit_code == 0
    first = asyncio.run(read_back(empty_db))
    spool.file(RUN).write_bytes(before)  # as if it died before removing them

    result = recover(empty_db, "--spool", str(spool.directory), "--run", RUN[:6])

    assert result.exit_code == 0, result.output
    outcomes = [line.split("  ")[0].strip() for line in result.output.splitlines()[:-1]]
    assert outcomes == [
        "already stored",
        "already stored",
        "already stored",
        "already stored",
        "no change",
        "already stored",
        "already stored",
        "no change",  # the lease was released the first time
    ]
    assert asyncio.run(read_back(empty_db)) == first


def test_recover_keeps_what_the_database_refuses_and_fails(empty_db: str, tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    # A run this database does not hold (it was written to another one).
    spool.add(FinishRun(run_id=OTHER, status=RunStatus.SUCCEEDED, finished_at=AT))
    asyncio.run(spool_a_real_run(empty_db, spool))

    result = recover(empty_db, "--spool", str(spool.directory))

    assert result.exit_code == 1
    assert f"kept 1 spooled write of run {OTHER} in {spool.file(OTHER)}: " in result.output
    assert "no run" in result.output or "not" in result.output
    assert "Error: 1 spooled write not recovered" in result.output
    assert "check" in result.output or "--db" in result.output
    assert spool.runs() == [OTHER]  # the other one was recovered
    assert asyncio.run(read_back(empty_db))[0] is RunStatus.SUCCEEDED


def test_recover_from_a_database_that_is_not_there_keeps_everything(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'gone.db'}"
    spool = Spool.for_url(db)
    spool.add(FinishRun(run_id=RUN, status=RunStatus.SUCCEEDED, finished_at=AT))
    spool.add(ReleaseLease(run_id=RUN, token=1))

    result = recover(db)

    assert result.exit_code == 1
    assert "there is no database" in result.output
    assert "Error: 2 spooled writes not recovered" in result.output
    assert "once it is back" in result.output
    assert len(spool.pending(RUN)) == 2
    assert not (tmp_path / "gone.db").exists()  # recover creates no database


def test_recover_names_an_unknown_or_ambiguous_run(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    spool = Spool.for_url(db)
    spool.add(ReleaseLease(run_id="ab1", token=1))
    spool.add(ReleaseLease(run_id="ab2", token=1))

    nothing = recover(db, "--run", "zz")
    assert nothing.exit_code == 0
    assert nothing.output.startswith("nothing to recover: no spooled writes of run zz in ")

    both = recover(db, "--run", "ab")
    assert both.exit_code == 1
    assert "matches several spooled runs: ab1, ab2" in both.output
    assert len(spool.runs()) == 2


def test_recover_reports_a_malformed_line(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    asyncio.run(create_run(db, RUN))
    spool = Spool.for_url(db)
    spool.directory.mkdir()
    spool.file(RUN).write_text("not json\n")

    result = recover(db)

    assert result.exit_code == 1
    assert f"{spool.file(RUN)}:1: not a spooled operation" in result.output
    assert "malformed: fix or remove it by hand" in result.output
    assert spool.file(RUN).read_text() == "not json\n"
