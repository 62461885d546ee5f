"""Names a program gives are checked where it gives them, the same on SQLite and PostgreSQL.

PostgreSQL enforces VARCHAR lengths and refuses NUL characters, SQLite does neither; without
checks up front, a long message kind worked on SQLite and failed half-way through a run on
PostgreSQL. Every limit lives in ``agentsnap.limits``, checked here against the tables and
the migrated schema.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy
from pydantic import BaseModel

from agentsnap import (
    Agent,
    AgentState,
    ConfigurationError,
    Context,
    InvalidAgentName,
    Message,
    Runtime,
    tool,
)
from agentsnap.inspect import fork_run
from agentsnap.limits import (
    COLUMNS,
    MAX_AGENT_NAME,
    MAX_CHECK_NAME,
    MAX_IDEMPOTENCY_KEY,
    MAX_MESSAGE_KIND,
    MAX_RUN_ID,
    MAX_TOOL_NAME,
    check_text,
    preview,
)
from agentsnap.store import migrate
from agentsnap.store.sql import SqlStore
from agentsnap.store.tables import Base
from agentsnap.testing import bus_of

# Length-limited columns that hold only what agentsnap makes itself.
INTERNAL = {
    "agentsnap_runs.parent_snapshot_id",  # a snapshot id: 32 hex digits
    "agentsnap_runs.status",
    "agentsnap_snapshots.id",
    "agentsnap_snapshots.base_id",  # a snapshot id
    "agentsnap_snapshots.status",
    "agentsnap_state_blobs.hash",
    "agentsnap_state_chunks.hash",  # a SHA-256: 64 hex digits
    "agentsnap_snapshot_agents.snapshot_id",
    "agentsnap_snapshot_agents.state_hash",
    "agentsnap_snapshot_messages.snapshot_id",
    "agentsnap_journal.event",
    "agentsnap_rollbacks.id",
    "agentsnap_rollbacks.snapshot_id",
    "agentsnap_run_leases.owner",  # host:pid:token
    "agentsnap_run_owners.owner",  # host:pid:token, as for the lease
    "agentsnap_run_owners.ended",  # released or taken_over
    "agentsnap_tool_calls.message_id",  # src>dst#seq of two agent names
    "agentsnap_tool_calls.fingerprint",
    "agentsnap_tool_calls.status",
    "agentsnap_tool_calls.owner",
    "agentsnap_model_calls.message_id",  # src>dst#seq, as for the tool calls
    "agentsnap_model_bodies.hash",  # a SHA-256
    "agentsnap_requests.id",  # a hash of the request's identity
    "agentsnap_requests.message_id",  # src>dst#seq, as for the tool calls
    "agentsnap_requests.kind",  # question or approval
    "agentsnap_requests.on_deadline",  # default, reject or fail
    "agentsnap_requests.status",
    "agentsnap_lg_checkpoints.checkpoint_type",
    "agentsnap_lg_checkpoints.meta_type",
    "agentsnap_lg_blobs.value_type",
}


def declared_lengths() -> dict[str, int]:
    """``table.column`` -> length, for every length-limited string column of the schema."""
    found = {}
    for table in Base.metadata.tables.values():
        for column in table.columns:
            length = getattr(column.type, "length", None)
            if isinstance(column.type, sqlalchemy.String) and length is not None:
                found[f"{table.name}.{column.name}"] = length
    return found


def test_every_limited_column_is_guarded_by_a_limit_that_matches_the_schema() -> None:
    declared = declared_lengths()
    assert {name: declared.get(name) for name in COLUMNS} == dict(COLUMNS)
    unguarded = set(declared) - set(COLUMNS) - INTERNAL
    assert not unguarded, f"new length-limited columns: add them to limits.COLUMNS: {unguarded}"
    assert not INTERNAL - set(declared), "INTERNAL names columns that no longer exist"
    # The message id column holds src>dst#seq: two agent names, two separators, a number.
    assert declared["agentsnap_tool_calls.message_id"] >= 2 * MAX_AGENT_NAME + 2 + 20
    assert MAX_CHECK_NAME >= MAX_AGENT_NAME  # a critic agent's name is a rollback's source


def test_the_migrated_schema_has_the_same_lengths(empty_db: str) -> None:
    migrate.upgrade(empty_db)
    engine = sqlalchemy.create_engine(migrate.sync_url(empty_db))
    try:
        with engine.connect() as connection:
            inspector = sqlalchemy.inspect(connection)
            migrated = {
                f"{table}.{column['name']}": getattr(column["type"], "length", None)
                for table in inspector.get_table_names()
                for column in inspector.get_columns(table)
            }
    finally:
        engine.dispose()
    assert {name: migrated.get(name) for name in COLUMNS} == dict(COLUMNS)


# -- the checks, where the program gives each name ---------------------------------------------


class CountState(AgentState):
    count: int = 0


class Relay(Agent[CountState]):
    """Counts what it handles; forwards to ``payload["to"]`` with ``payload["kind"]``."""

    async def handle(self, message: Message, ctx: Context[CountState]) -> None:
        self.state.count += 1
        if isinstance(message.payload, dict) and "to" in message.payload:
            order = message.payload_as(dict[str, str])
            ctx.send(order["to"], {"n": 1}, kind=order["kind"])


class Caught(Agent[CountState]):
    """Sends with the kind it is told, and keeps the error the send raised."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.errors: list[ConfigurationError] = []

    async def handle(self, message: Message, ctx: Context[CountState]) -> None:
        self.state.count += 1
        order = message.payload_as(dict[str, str])
        try:
            ctx.send(order["to"], None, kind=order["kind"])
        except ConfigurationError as exc:
            self.errors.append(exc)


LONG_KIND = "k" * (MAX_MESSAGE_KIND + 1)


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        (LONG_KIND, f"is {MAX_MESSAGE_KIND + 1} characters long; every store holds at most 128"),
        ("bad\x00kind", "contains the NUL character, which PostgreSQL cannot store"),
        ("\ud800", "lone surrogate"),
        (42, "must be a string, got int"),
        (["a"], "must be a string, got list"),
    ],
    ids=["too-long", "nul", "surrogate", "int", "unhashable"],
)
async def test_a_bad_kind_is_refused_at_the_send(kind: Any, says: str) -> None:
    async with Runtime() as runtime:
        runtime.add(Relay("alice"))
        with pytest.raises(ConfigurationError) as info:
            runtime.send("alice", kind=kind)
        assert says in str(info.value)
        assert "message kind" in str(info.value)
        assert "use a shorter kind" in str(info.value) or "string" in str(info.value)
        # Nothing was sent: the channel's counter did not move.
        assert bus_of(runtime).channels["$env", "alice"].sent == 0


def test_the_error_shows_a_long_value_shortened() -> None:
    with pytest.raises(ConfigurationError) as info:
        check_text("x" * 10_000, "message kind", 128, "fix it")
    text = str(info.value)
    assert len(text) < 300
    assert f"{'x' * 40!r}… is 10000 characters long" in text
    with pytest.raises(ConfigurationError) as info:
        check_text("x\x00" * 5_000, "message kind", 20_000, "fix it")
    assert preview("x\x00" * 5_000) in str(info.value)
    assert "(10000 characters)" in str(info.value)


async def test_a_handler_sending_a_bad_kind_gets_the_error_and_the_run_goes_on() -> None:
    async with Runtime() as runtime:
        sender = runtime.add(Caught("alice"))
        runtime.add(Relay("bob"))
        runtime.send("alice", {"to": "bob", "kind": LONG_KIND})
        runtime.send("alice", {"to": "bob", "kind": "k" * MAX_MESSAGE_KIND})
        await runtime.run_until_idle()
        assert isinstance(sender, Caught)
        (error,) = sender.errors
        assert "128" in str(error)
        assert runtime.agents["bob"].state.count == 1


def test_agent_names_say_how_long_they_were() -> None:
    with pytest.raises(InvalidAgentName) as info:
        Relay("a" * (MAX_AGENT_NAME + 1))
    assert f"it is {MAX_AGENT_NAME + 1} characters long" in str(info.value)
    assert "use 1 to 128 characters" in str(info.value)


@pytest.mark.parametrize(
    ("run_id", "says"),
    [
        ("r" * (MAX_RUN_ID + 1), "65 characters long; every store holds at most 64"),
        ("run\x00id", "NUL character"),
        (7, "must be a string"),
    ],
)
def test_a_bad_run_id_is_refused_when_the_runtime_is_made(run_id: Any, says: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Runtime(run_id=run_id)
    assert says in str(info.value)
    assert "leave run_id out" in str(info.value)


async def test_fork_run_checks_the_new_run_id_before_anything() -> None:
    store = SqlStore("sqlite://")
    try:
        with pytest.raises(ConfigurationError, match="run id"):
            await fork_run(store, "any", run_id="r" * 65)
    finally:
        await store.close()


class Draft(BaseModel):
    text: str


@pytest.mark.parametrize(
    ("name", "kind", "says"),
    [
        ("c" * (MAX_CHECK_NAME + 1), None, "a check's name"),
        ("length", LONG_KIND, "message kind"),
        ("bad\x00name", None, "NUL character"),
    ],
)
async def test_a_check_with_a_bad_name_or_kind_is_refused_when_declared(
    name: str, kind: str | None, says: str
) -> None:
    async with Runtime() as runtime:
        runtime.add(Relay("alice"))
        with pytest.raises(ConfigurationError) as info:
            runtime.check("alice", kind, schema=Draft, name=name)
        assert says in str(info.value)
        runtime.send("alice")  # nothing was declared: the run goes on
        await runtime.run_until_idle()


def test_a_tool_with_a_bad_name_is_refused_when_declared() -> None:
    with pytest.raises(ConfigurationError) as info:

        @tool(name="t" * (MAX_TOOL_NAME + 1))
        async def lookup(city: str) -> str:
            return city

    assert "a tool's name" in str(info.value)
    assert "pass @tool(name=...) a name of 1 to 128 characters" in str(info.value)


@tool(side_effect=True, name="charge_" + "x" * (MAX_TOOL_NAME - 7))
async def charge(amount: int) -> int:
    return amount


# -- the same behaviour on SQLite and PostgreSQL ------------------------------------------------


class Writer(Agent[CountState]):
    """Charges, then sends a draft of the kind its input names: too short until told why."""

    async def handle(self, message: Message, ctx: Context[CountState]) -> None:
        self.state.count += 1
        kind = message.payload_as(dict[str, str])["kind"]
        await charge(ctx, key="k" * MAX_IDEMPOTENCY_KEY, amount=5)
        text = "long enough" if ctx.feedback else "no"
        ctx.send("editor", {"text": text}, kind=kind)


async def run_at_the_limits(url: str) -> dict[str, Any]:
    """A run using the longest names every store holds; what the store kept of them."""
    store = SqlStore(url)
    kind = "d" * MAX_MESSAGE_KIND
    check = "c" * MAX_CHECK_NAME
    try:
        async with Runtime(store=store, run_id="r" * MAX_RUN_ID) as runtime:
            runtime.add(Writer("w" * MAX_AGENT_NAME))
            runtime.add(Relay("editor"))
            runtime.check(
                "w" * MAX_AGENT_NAME,
                kind,
                check=lambda m: len(m.payload_as(dict[str, str])["text"]) > 3 or "too short",
                name=check,
            )
            runtime.send("w" * MAX_AGENT_NAME, {"kind": kind})
            await runtime.run_until_idle()
            with pytest.raises(ConfigurationError, match="message kind"):
                runtime.send("editor", kind=kind + "!")
            with pytest.raises(ConfigurationError, match="idempotency key"):
                await charge.invoke(runtime.ledger, key="k" * (MAX_IDEMPOTENCY_KEY + 1), amount=1)
            calls = await runtime.ledger.list_calls(runtime.run_id)
        rollbacks = await store.list_rollbacks("r" * MAX_RUN_ID)
        snapshots = await store.list_snapshots("r" * MAX_RUN_ID)
        return {
            "run": (await store.get_run("r" * MAX_RUN_ID)).status.value,
            "sources": [r.source for r in rollbacks],
            "agents": sorted(snapshots[-1].agents),
            "calls": [(c.key, c.tool, c.agent) for c in calls],
        }
    finally:
        await store.close()


async def test_the_longest_names_work_on_every_backend(empty_db: str) -> None:
    kept = await run_at_the_limits(empty_db)
    assert kept == {
        "run": "succeeded",
        "sources": ["c" * MAX_CHECK_NAME],
        "agents": ["$env", "editor", "w" * MAX_AGENT_NAME],
        "calls": [("k" * MAX_IDEMPOTENCY_KEY, charge.name, "w" * MAX_AGENT_NAME)],
    }


async def test_a_kind_one_too_long_fails_alike_on_every_backend(empty_db: str) -> None:
    store = SqlStore(empty_db)
    try:
        async with Runtime(store=store) as runtime:
            runtime.add(Relay("alice"))
            runtime.add(Relay("bob"))
            runtime.send("alice", {"to": "bob", "kind": "k" * MAX_MESSAGE_KIND})
            await runtime.run_until_idle()
            # Refused before the run or the store saw it; the run goes on and ends well.
            with pytest.raises(ConfigurationError, match="every store holds at most 128"):
                runtime.send("bob", kind=LONG_KIND)
            runtime.send("bob")
            await runtime.run_until_idle()
            await runtime.snapshot()
        run = await store.get_run(runtime.run_id)
        assert run.status.value == "succeeded"
        # At the first input, as the run went idle twice, and the one taken last.
        snapshots = await store.list_snapshots(run.id)
        assert [(s.seq, s.status.value) for s in snapshots] == [
            (seq, "complete") for seq in (1, 2, 3, 4)
        ]
    finally:
        await store.close()
