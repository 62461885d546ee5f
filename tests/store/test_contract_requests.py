"""The request log: every ledger keeps requests to people by their id.

Run against each ledger: the in-memory one, SQLite and PostgreSQL. A request is stored once
per id (a second ask at the same identity gets the first), read back exactly as written,
closed once (of two answers racing, one wins), withdrawn by timeline, listed per run in the
order asked, and deleted with its run.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from postgres_db import postgres_url_or_skip

from agentsnap import RunInfo
from agentsnap.requests import HumanRequest, RequestLog, request_id
from agentsnap.store.ledger import MemoryLedger
from agentsnap.store.retention import delete_runs
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger

from .test_faults import FAST

RUN = "a" * 32
OTHER_RUN = "b" * 32
T0 = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)

Ledger = MemoryLedger | SqlLedger

BACKENDS = [
    pytest.param(lambda tmp_path: MemoryLedger(), id="memory"),
    pytest.param(
        lambda tmp_path: SqlLedger(f"sqlite:///{tmp_path / 'ledger.db'}", retry=FAST),
        id="sqlite",
    ),
    pytest.param(
        lambda tmp_path: SqlLedger(postgres_url_or_skip(), retry=FAST),
        id="postgres",
        marks=pytest.mark.postgres,
    ),
]


@pytest.fixture(params=BACKENDS)
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Ledger]:
    factory: Callable[[Path], Ledger] = request.param
    made = factory(tmp_path)
    try:
        yield made
    finally:
        await made.close()


def asked(
    position: int = 0, timeline: int = 0, *, run_id: str = RUN, at: int = 0, **fields: object
) -> HumanRequest:
    message = "$env>refunder#1"
    values: dict[str, object] = {
        "id": request_id(run_id, "refunder", message, position, timeline),
        "run_id": run_id,
        "agent": "refunder",
        "message_id": message,
        "position": position,
        "timeline": timeline,
        "kind": "question",
        "question": {"text": "Refund 250 €?", "lines": [1, 2.5, None, "ü"]},
        "asked_at": T0 + timedelta(seconds=at),
    }
    values.update(fields)
    return HumanRequest(**values)  # type: ignore[arg-type]


async def test_a_ledger_is_a_request_log(ledger: Ledger) -> None:
    assert isinstance(ledger, RequestLog)


async def test_a_request_reads_back_as_written(ledger: Ledger) -> None:
    request = asked(
        schema={"type": "object", "required": ["ok"]},
        who="finance",
        deadline=T0 + timedelta(hours=1),
        on_deadline="default",
        default={"ok": False},
    )
    assert await ledger.add_request(request) == request
    assert await ledger.find_request(request.id) == request
    assert await ledger.find_request("0" * 24) is None


async def test_asking_again_at_the_same_identity_gets_the_first_request(ledger: Ledger) -> None:
    first = asked()
    await ledger.add_request(first)
    await ledger.settle_request(
        first.id, "answered", answer={"ok": True}, reason=None, by="ann", at=T0
    )
    again = await ledger.add_request(asked(at=30, question="another wording"))
    assert again.question == first.question
    assert again.status == "answered"
    assert again.answer == {"ok": True}
    assert again.answered_by == "ann"
    assert again.answered_at == T0


async def test_a_request_is_closed_once(ledger: Ledger) -> None:
    request = await ledger.add_request(asked())
    results = await asyncio.gather(
        ledger.settle_request(request.id, "answered", answer=1, reason=None, by="a", at=T0),
        ledger.settle_request(request.id, "rejected", answer=None, reason="no", by="b", at=T0),
    )
    assert sorted(results) == [False, True]
    closed = await ledger.find_request(request.id)
    assert closed is not None
    assert closed.status in {"answered", "rejected"}
    assert not await ledger.settle_request(
        request.id, "answered", answer=2, reason=None, by="c", at=T0
    )
    assert not await ledger.settle_request(
        "0" * 24, "answered", answer=2, reason=None, by="c", at=T0
    )


async def test_a_rollback_withdraws_the_pending_requests_of_earlier_timelines(
    ledger: Ledger,
) -> None:
    old = await ledger.add_request(asked(0, 0))
    answered = await ledger.add_request(asked(1, 0, at=1))
    await ledger.settle_request(answered.id, "answered", answer=1, reason=None, by="a", at=T0)
    current = await ledger.add_request(asked(0, 1, at=2))
    elsewhere = await ledger.add_request(asked(run_id=OTHER_RUN, at=3))
    withdrawn = await ledger.withdraw_requests(RUN, 1, by="rollback r1", at=T0)
    assert withdrawn == [old.id]
    found = {r.id: r for r in await ledger.list_requests(RUN)}
    assert found[old.id].status == "withdrawn"
    assert found[old.id].answered_by == "rollback r1"
    assert found[answered.id].status == "answered"
    assert found[current.id].pending
    assert (await ledger.find_request(elsewhere.id)) == elsewhere


async def test_requests_are_listed_by_run_in_the_order_asked(ledger: Ledger) -> None:
    second = await ledger.add_request(asked(1, at=5))
    first = await ledger.add_request(asked(0, at=1))
    other = await ledger.add_request(asked(run_id=OTHER_RUN, at=3))
    await ledger.settle_request(second.id, "answered", answer=1, reason=None, by=None, at=T0)
    assert [r.id for r in await ledger.list_requests(RUN)] == [first.id, second.id]
    assert [r.id for r in await ledger.list_requests(RUN, pending=True)] == [first.id]
    assert [r.id for r in await ledger.list_requests()] == [first.id, other.id, second.id]


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_deleting_a_run_deletes_its_requests(backend: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}" if backend == "sqlite" else postgres_url_or_skip()
    store = SqlStore(url)
    ledger = SqlLedger(url, retry=FAST)
    try:
        await store.create_run(RunInfo(id=RUN))
        await store.create_run(RunInfo(id=OTHER_RUN))
        mine = await ledger.add_request(asked(run_id=RUN))
        kept = await ledger.add_request(asked(run_id=OTHER_RUN))
        report = await delete_runs(url, [RUN])
        assert report.rows["agentsnap_requests"] == 1
        assert await ledger.find_request(mine.id) is None
        assert await ledger.find_request(kept.id) == kept
    finally:
        await ledger.close()
        await store.close()
