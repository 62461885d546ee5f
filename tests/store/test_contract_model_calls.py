"""The model call log: every ledger keeps a handler's model calls by their identity.

Run against each ledger: the in-memory one, SQLite and PostgreSQL. A call is recorded once
per identity (run, agent, message, position, timeline), read back exactly as written, its
replays counted, and a run's calls listed in the order they were made. The SQL ledger stores
each distinct message of a run once however many requests hold it, and keeps the timeline of
a tool call's claim.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from ledger_entries import claim_of
from postgres_db import postgres_url_or_skip

from agentsnap import OwnershipLost, RunInfo, ToolCallStatus
from agentsnap.model_calls import ModelCallLog, ModelCallRecord, recorded_call
from agentsnap.models import (
    ChatMessage,
    ModelRequest,
    ModelResponse,
    ModelToolCall,
    ToolSpec,
    Usage,
)
from agentsnap.records import utcnow
from agentsnap.state import canonical_json
from agentsnap.store.ledger import MemoryLedger
from agentsnap.store.migrate import sync_url
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger

from .test_faults import FAST, answer_lost_once

RUN = "a" * 32
OTHER_RUN = "b" * 32
T0 = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)

Ledger = MemoryLedger | SqlLedger


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


BACKENDS = [
    pytest.param(lambda tmp_path: MemoryLedger(), id="memory"),
    pytest.param(lambda tmp_path: SqlLedger(sqlite_url(tmp_path), retry=FAST), id="sqlite"),
    pytest.param(
        lambda tmp_path: SqlLedger(postgres_url_or_skip(), retry=FAST),
        id="postgres",
        marks=pytest.mark.postgres,
    ),
]


@pytest.fixture(params=BACKENDS)
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Ledger]:
    """A fresh, empty ledger of each backend; closed after the test."""
    factory: Callable[[Path], Ledger] = request.param
    made = factory(tmp_path)
    try:
        yield made
    finally:
        await made.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty SQLite or PostgreSQL database."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    return postgres_url_or_skip()


def call_of(
    request: ModelRequest,
    *,
    run_id: str = RUN,
    agent: str = "writer",
    message_id: str = "$env>writer#1",
    position: int = 0,
    timeline: int = 0,
    answer: str = "done",
    at: float = 0.0,
) -> ModelCallRecord:
    """The record of asking ``request`` and getting ``answer``, ``at`` seconds after T0."""
    response = ModelResponse(
        text=answer,
        model="scripted-1",
        usage=Usage(input_tokens=10 * len(request.messages), output_tokens=len(answer)),
    )
    return ModelCallRecord(
        run_id=run_id,
        agent=agent,
        message_id=message_id,
        position=position,
        timeline=timeline,
        request=request.model_dump(mode="json", exclude_defaults=True),
        response=response.model_dump(mode="json", exclude_defaults=True),
        model=response.model,
        input_tokens=response.usage.input_tokens,
        output_tokens=response.usage.output_tokens,
        started_at=T0 + timedelta(seconds=at),
        latency_ms=812.25,
    )


SYSTEM = ChatMessage(role="system", content="You write short, exact answers. Ünïcödé ✓")
TOOLS = (
    ToolSpec(
        name="lookup",
        description="Find an order",
        parameters={"type": "object", "properties": {"order": {"type": "string"}}},
    ),
)


def conversation(turns: int, first: str = "Where is order 17?") -> list[ModelRequest]:
    """The requests of a handler that talks with a model for ``turns`` calls.

    Each request holds the whole conversation so far: every message of the one before, the
    model's answer (a tool call) and the tool's result. The values are the awkward ones: a
    float that is a whole number, one written with an exponent, a NUL character (which
    PostgreSQL's text holds only escaped), letters outside ASCII.
    """
    messages = [SYSTEM, ChatMessage(role="user", content=first)]
    requests = []
    for turn in range(turns):
        requests.append(
            ModelRequest(
                messages=tuple(messages),
                tools=TOOLS,
                output_schema={"type": "object"},
                settings={"temperature": 0.0, "top_p": 1e-7, "seed": 3},
            )
        )
        call = ModelToolCall(
            name="lookup",
            arguments={"order": "17", "weight": 2.0, "tolerance": 1e-7},
            id=f"c{turn}",
        )
        messages += [
            ChatMessage(role="assistant", content="", tool_calls=(call,)),
            ChatMessage(
                role="tool", content=f"in transit, leg {turn}\x00", tool_call_id=f"c{turn}"
            ),
        ]
    return requests


def same_json(found: Any, written: Any) -> bool:
    """Equal, and written the same: ``2.0`` did not come back as ``2``."""
    return bool(found == written and canonical_json(found) == canonical_json(written))


def database_rows(url: str, query: str) -> list[Any]:
    engine = sqlalchemy.create_engine(sync_url(url))
    try:
        with engine.connect() as conn:
            return list(conn.execute(sqlalchemy.text(query)).all())
    finally:
        engine.dispose()


# -- the contract, on every ledger ----------------------------------------------------------


async def test_a_recorded_call_is_found_as_it_was_written(ledger: Ledger) -> None:
    assert isinstance(ledger, ModelCallLog)
    request = conversation(2)[1]
    call = call_of(request)

    assert await ledger.record_model_call(call)

    found = await ledger.find_model_call(RUN, "writer", "$env>writer#1", 0, 0)
    assert found == call
    assert found is not None
    assert same_json(found.request, request.model_dump(mode="json", exclude_defaults=True))
    assert same_json(found.response, call.response)
    assert found.asked() == request
    assert found.answer().text == "done"
    assert found.finished_at == T0 + timedelta(milliseconds=812.25)
    assert await ledger.find_model_call(RUN, "writer", "$env>writer#1", 1, 0) is None
    assert await ledger.find_model_call(OTHER_RUN, "writer", "$env>writer#1", 0, 0) is None


async def test_an_identity_is_recorded_once_and_the_first_answer_stays(ledger: Ledger) -> None:
    request = conversation(1)[0]
    first = call_of(request, answer="first")

    assert await ledger.record_model_call(first)
    assert not await ledger.record_model_call(call_of(request, answer="second", at=5))

    assert await ledger.find_model_call(RUN, "writer", "$env>writer#1", 0, 0) == first
    assert await ledger.list_model_calls(RUN) == [first]


async def test_replays_are_counted(ledger: Ledger) -> None:
    call = call_of(conversation(1)[0])
    await ledger.record_model_call(call)

    await ledger.replayed_model_call(RUN, "writer", "$env>writer#1", 0, 0)
    await ledger.replayed_model_call(RUN, "writer", "$env>writer#1", 0, 0)
    await ledger.replayed_model_call(RUN, "writer", "$env>writer#1", 0, 1)  # never recorded

    found = await ledger.find_model_call(RUN, "writer", "$env>writer#1", 0, 0)
    assert found == dataclasses.replace(call, replays=2)
    assert await ledger.find_model_call(RUN, "writer", "$env>writer#1", 0, 1) is None


async def test_the_timeline_tells_identities_apart(ledger: Ledger) -> None:
    request = conversation(1)[0]
    before = call_of(request, timeline=0, answer="before the rollback")
    after = call_of(request, timeline=1, answer="after the rollback", at=60)

    assert await ledger.record_model_call(before)
    assert await ledger.record_model_call(after)

    assert await ledger.find_model_call(RUN, "writer", "$env>writer#1", 0, 0) == before
    assert await ledger.find_model_call(RUN, "writer", "$env>writer#1", 0, 1) == after
    assert await ledger.list_model_calls(RUN) == [before, after]


async def test_calls_are_listed_by_run_and_by_agent_in_the_order_they_were_made(
    ledger: Ledger,
) -> None:
    writer = conversation(3)
    critic = conversation(2, first="Is the answer about order 17 right?")
    made = [
        call_of(writer[0], at=0),
        call_of(critic[0], agent="critic", message_id="writer>critic#1", at=1),
        call_of(writer[1], position=1, at=2),
        call_of(critic[1], agent="critic", message_id="writer>critic#1", position=1, at=3),
        call_of(writer[2], position=2, at=4),
    ]
    elsewhere = call_of(writer[0], run_id=OTHER_RUN, at=0.5)
    for call in [elsewhere, *reversed(made)]:  # the order of recording does not matter
        assert await ledger.record_model_call(call)

    assert await ledger.list_model_calls(RUN) == made
    assert await ledger.list_model_calls(RUN, "critic") == [made[1], made[3]]
    assert await ledger.list_model_calls(RUN, "writer") == [made[0], made[2], made[4]]
    assert await ledger.list_model_calls(RUN, "nobody") == []
    assert await ledger.list_model_calls(OTHER_RUN) == [elsewhere]
    assert await ledger.list_model_calls("c" * 32) == []


async def test_a_growing_conversation_reads_back_whole_call_by_call(ledger: Ledger) -> None:
    requests = conversation(4)
    made = [call_of(request, position=i, at=i) for i, request in enumerate(requests)]
    for call in made:
        assert await ledger.record_model_call(call)

    listed = await ledger.list_model_calls(RUN)
    assert listed == made
    for found, request in zip(listed, requests, strict=True):
        assert same_json(found.request, request.model_dump(mode="json", exclude_defaults=True))
        assert found.asked() == request
    assert len(listed[-1].asked().messages) == 8


async def test_a_recorded_call_replays_through_recorded_call(ledger: Ledger) -> None:
    request = conversation(1)[0]
    asked: list[ModelRequest] = []

    async def model(request: ModelRequest) -> ModelResponse:
        asked.append(request)
        return ModelResponse(text="17 is in transit", model="scripted-1")

    identity: dict[str, Any] = {
        "run_id": RUN,
        "agent": "writer",
        "message_id": "$env>writer#1",
        "position": 0,
        "timeline": 0,
    }
    first, replayed = await recorded_call(ledger, request, model, **identity)
    assert (first.text, replayed) == ("17 is in transit", False)
    again, replayed = await recorded_call(ledger, request, model, **identity)
    assert (again, replayed) == (first, True)

    assert asked == [request]  # the model was asked once
    found = await ledger.find_model_call(RUN, "writer", "$env>writer#1", 0, 0)
    assert found is not None
    assert found.replays == 1
    assert found.asked() == request


async def test_a_claim_keeps_the_timeline_of_its_run(ledger: Ledger) -> None:
    claimed = dataclasses.replace(claim_of("charge-1", RUN), timeline=3)
    outside = claim_of("charge-2", RUN)  # no timeline: a call outside a rollback's reach

    assert await ledger.claim(claimed) is None
    assert await ledger.claim(outside) is None
    done = await ledger.update(
        "charge-1",
        {"status": ToolCallStatus.SUCCEEDED, "result": 5, "updated_at": utcnow()},
        statuses=(ToolCallStatus.IN_PROGRESS,),
    )

    assert done
    found = await ledger.get("charge-1")
    assert found is not None
    assert found.timeline == 3
    assert found.status is ToolCallStatus.SUCCEEDED
    taken = await ledger.claim(dataclasses.replace(claim_of("charge-1", RUN), timeline=4))
    assert taken is not None
    assert taken.timeline == 3  # the first claim's
    assert {entry.key: entry.timeline for entry in await ledger.list_calls(RUN)} == {
        "charge-1": 3,
        "charge-2": None,
    }


# -- how the SQL ledger stores them ---------------------------------------------------------


@pytest.fixture
async def sql_ledger(db_url: str) -> AsyncIterator[SqlLedger]:
    made = SqlLedger(db_url, retry=FAST)
    try:
        yield made
    finally:
        await made.close()


async def test_each_distinct_message_of_a_run_is_stored_once(sql_ledger: SqlLedger) -> None:
    writer = conversation(4)
    critic = conversation(1, first="Is the answer about order 17 right?")
    made = [call_of(request, position=i, at=i) for i, request in enumerate(writer)]
    made.append(call_of(critic[0], agent="critic", message_id="writer>critic#1", at=9))
    made.append(call_of(writer[3], run_id=OTHER_RUN, at=10))
    for call in made:
        assert await sql_ledger.record_model_call(call)

    bodies = database_rows(sql_ledger.url, "SELECT run_id, hash, body FROM agentsnap_model_bodies")
    messages = {
        run_id: {
            canonical_json(message)
            for call in made
            if call.run_id == run_id
            for message in call.request["messages"]  # type: ignore[union-attr]
        }
        for run_id in (RUN, OTHER_RUN)
    }
    # The system message, the writer's question, three answers with their tool results, and
    # the critic's question: 9 in RUN, however many requests repeat them.
    assert len(messages[RUN]) == 9
    assert sorted(body for run_id, _, body in bodies if run_id == RUN) == sorted(messages[RUN])
    assert sorted(body for run_id, _, body in bodies if run_id == OTHER_RUN) == sorted(
        messages[OTHER_RUN]
    )
    for _, digest, body in bodies:
        assert digest == hashlib.sha256(body.encode()).hexdigest()
    # The requests name their messages: none is held whole in a call's row.
    for (request,) in database_rows(sql_ledger.url, "SELECT request FROM agentsnap_model_calls"):
        assert "in transit" not in request
        assert "Ünïcödé" not in request
    assert await sql_ledger.list_model_calls(RUN) == made[:5]
    assert await sql_ledger.list_model_calls(OTHER_RUN) == made[5:]


async def test_a_call_already_recorded_adds_no_bodies(sql_ledger: SqlLedger) -> None:
    request = conversation(1)[0]
    assert await sql_ledger.record_model_call(call_of(request))
    other = ModelRequest(messages=(ChatMessage(role="user", content="something else"),))

    # Its identity is taken: neither the call nor the messages of its request are written.
    assert not await sql_ledger.record_model_call(call_of(other))

    assert len(database_rows(sql_ledger.url, "SELECT hash FROM agentsnap_model_bodies")) == 2


async def test_a_record_whose_answer_was_lost_is_recognised(sql_ledger: SqlLedger) -> None:
    attempts = answer_lost_once(sql_ledger, "_record_once")
    call = call_of(conversation(2)[1])

    # Committed, then the answer was lost: the retry finds the row and knows it as its own.
    assert await sql_ledger.record_model_call(call)

    assert len(attempts) >= 2
    assert await sql_ledger.find_model_call(RUN, "writer", "$env>writer#1", 0, 0) == call
    assert not await sql_ledger.record_model_call(call_of(conversation(2)[1], answer="other"))


async def test_a_fenced_ledger_records_only_while_the_lease_is_its_own(db_url: str) -> None:
    store = SqlStore(db_url)
    ledger = SqlLedger(db_url, retry=FAST)
    try:
        await store.create_run(RunInfo(id=RUN))
        day = utcnow() + timedelta(days=1)
        lease = await store.take_lease(RUN, "here.example:1:0123456789ab", day, replacing=None)
        assert lease is not None
        ledger.fence(RUN, lease.token)
        first = call_of(conversation(1)[0])
        assert await ledger.record_model_call(first)

        taken = await store.take_lease(
            RUN, "elsewhere.example:1:0123456789ab", day, replacing=lease.token
        )
        assert taken is not None
        second = call_of(conversation(2)[1], position=1, at=1)
        with pytest.raises(OwnershipLost) as refused:
            await ledger.record_model_call(second)

        assert "elsewhere.example" in str(refused.value)
        assert await ledger.list_model_calls(RUN) == [first]  # nothing of it was written
        assert len(database_rows(db_url, "SELECT hash FROM agentsnap_model_bodies")) == 2
    finally:
        await ledger.close()
        await store.close()


async def test_a_record_waits_out_another_writer_off_the_event_loop(tmp_path: Path) -> None:
    ledger = SqlLedger(sqlite_url(tmp_path))
    try:
        first = call_of(conversation(1)[0])
        assert await ledger.record_model_call(first)  # schema and connections ready
        other = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another writer holds the lock
        second = call_of(conversation(2)[1], position=1, at=1)
        recording = asyncio.create_task(ledger.record_model_call(second))
        await asyncio.sleep(0.05)
        assert not recording.done(), "the record waits for the lock, in the ledger's thread"
        other.execute("COMMIT")
        other.close()

        assert await recording
        assert await ledger.list_model_calls(RUN) == [first, second]
    finally:
        await ledger.close()


def test_the_stored_request_keeps_its_fields_in_order(tmp_path: Path) -> None:
    async def recorded() -> ModelCallRecord | None:
        ledger = SqlLedger(sqlite_url(tmp_path))
        try:
            await ledger.record_model_call(call_of(conversation(2)[1]))
            return await ledger.find_model_call(RUN, "writer", "$env>writer#1", 0, 0)
        finally:
            await ledger.close()

    found = asyncio.run(recorded())
    assert found is not None
    assert list(found.request) == ["messages", "tools", "output_schema", "settings"]
    (stored,) = database_rows(sqlite_url(tmp_path), "SELECT request FROM agentsnap_model_calls")
    assert list(json.loads(stored[0])) == ["message_hashes", "tools", "output_schema", "settings"]
