"""A run stored by version 1 of a state class resumes, rolls back, forks and shows under version 2.

Version 2 renames a field (``count`` to ``total``), retypes one (``limit``, a string, becomes
an integer) and adds one (``seen``); its upcaster from version 1 does the three. Version 3
declares no upcaster from version 1: a state stored by version 1 is then a clear error, and
``agentsnap states check`` finds it. Each runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner
from pydantic import Field

from agentsnap import (
    Agent,
    AgentState,
    ConfigurationError,
    Context,
    Message,
    Runtime,
    StateInvalid,
    StateNotReadable,
    upcaster,
)
from agentsnap.cli import main
from agentsnap.inspect import check_stored_states, diff_snapshots, fork_run, show_snapshot
from agentsnap.store import migrate
from agentsnap.store.sql import SqlStore
from agentsnap.versions import VERSION_KEY, read_state, state_version, upcast

# -- the state class, in three versions --------------------------------------------------------


class TallyV1(AgentState):
    count: int = 0
    limit: str = "100"


class TallyV2(AgentState):
    version: ClassVar[int] = 2

    total: int = 0  # was count
    limit: int = 100  # was a string
    seen: list[int] = Field(default_factory=list)  # new

    @upcaster(from_version=1)
    def from_1(self: dict[str, Any]) -> dict[str, Any]:
        self["total"] = self.pop("count")
        self["limit"] = int(self["limit"])
        return self


class TallyV3(AgentState):
    version: ClassVar[int] = 3

    total: int = 0

    @upcaster(from_version=2)
    def from_2(self: dict[str, Any]) -> dict[str, Any]:
        del self["limit"], self["seen"]
        return self


class Stopped(Exception):
    pass


class AdderV1(Agent[TallyV1]):
    async def handle(self, message: Message, ctx: Context[TallyV1]) -> None:
        amount = message.payload
        assert isinstance(amount, int)
        self.state.count += amount


class AdderV2(Agent[TallyV2]):
    async def handle(self, message: Message, ctx: Context[TallyV2]) -> None:
        amount = message.payload
        assert isinstance(amount, int)
        self.state.total += amount
        self.state.seen.append(amount)


class AdderV3(Agent[TallyV3]):
    async def handle(self, message: Message, ctx: Context[TallyV3]) -> None:
        amount = message.payload
        assert isinstance(amount, int)
        self.state.total += amount


def app_v2() -> list[Agent[Any]]:
    return [AdderV2("adder")]


def app_v3() -> list[Agent[Any]]:
    return [AdderV3("adder")]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'versions.db'}"
    from postgres_db import postgres_url_or_skip

    return postgres_url_or_skip()


async def stored_by_v1(store: SqlStore) -> tuple[str, str]:
    """A run of version 1 that stopped (failed) at 5; its run id, and its cut at 5."""
    with contextlib.suppress(Stopped):
        async with Runtime(store=store) as runtime:
            adder = runtime.add(AdderV1("adder", TallyV1(limit="50")))
            runtime.send("adder", 5)
            await runtime.run_until_idle()
            kept = await runtime.snapshot()
            raise Stopped  # the process stops: the run is left to resume
    assert adder.state.count == 5
    assert kept.agents["adder"].state_version == 1
    assert kept.agents["adder"].state == {
        "count": 5,
        "limit": "50",
        "memory": {},
        "plan": [],
        "tool_calls": [],
    }
    schemas = await store.load_state_schemas(runtime.run_id)
    assert schemas["adder"][VERSION_KEY] == 1
    return runtime.run_id, kept.id


# -- the upcaster and the chain, alone ---------------------------------------------------------


def test_the_upcaster_is_a_pure_function_callable_alone() -> None:
    old = {"count": 3, "limit": "7", "memory": {}}
    assert TallyV2.from_1(dict(old)) == {"total": 3, "limit": 7, "memory": {}}
    assert state_version(TallyV1) == 1
    assert state_version(TallyV2) == 2
    # The chain works on a copy: what it was given is left as it was.
    assert upcast("adder", TallyV2, old, 1) == {"total": 3, "limit": 7, "memory": {}}
    assert old == {"count": 3, "limit": "7", "memory": {}}
    state = read_state("adder", TallyV2, json.dumps(old), 1)
    assert state == TallyV2(total=3, limit=7)


def test_an_unreadable_state_names_the_agent_both_versions_and_the_missing_step() -> None:
    with pytest.raises(StateNotReadable) as caught:
        read_state("adder", TallyV3, '{"count": 1, "limit": "2"}', 1)
    error = caught.value
    assert (error.agent, error.stored_version, error.current_version, error.step) == (
        "adder",
        1,
        3,
        1,
    )
    assert "agent 'adder'" in str(error)
    assert "version 1" in str(error)
    assert "TallyV3 version 3" in str(error)
    assert "no upcaster from version 1 to 2" in str(error)
    assert "@upcaster(from_version=1)" in str(error)
    with pytest.raises(StateNotReadable, match="newer version of TallyV2"):
        read_state("adder", TallyV2, "{}", 3)
    with pytest.raises(StateNotReadable, match=r"raised KeyError"):
        read_state("adder", TallyV2, '{"limit": "1"}', 1)  # no count to rename
    with pytest.raises(StateNotReadable, match="does not validate as stored"):
        read_state("adder", TallyV2, '{"limit": "many"}', 2)


def test_versions_and_upcasters_are_checked_as_the_class_is_defined() -> None:
    with pytest.raises(ConfigurationError, match="never runs"):

        class Ahead(AgentState):
            version: ClassVar[int] = 2

            @upcaster(from_version=2)
            def from_2(self: dict[str, Any]) -> dict[str, Any]:
                return self

    with pytest.raises(ConfigurationError, match="whole number"):

        class Zero(AgentState):
            version: ClassVar[int] = 0

    with pytest.raises(ConfigurationError, match="whole number"):
        upcaster(from_version=0)


# -- resume, rollback, fork, show: a stored version-1 run under version 2 ----------------------


def test_a_version_1_run_resumes_and_rolls_back_under_version_2(db: str) -> None:
    async def go() -> None:
        store = SqlStore(db)
        try:
            run_id, kept = await stored_by_v1(store)
            runtime = Runtime(store=store, run_id=run_id)
            adder = runtime.add(AdderV2("adder"))
            await runtime.resume()
            assert adder.state == TallyV2(total=5, limit=50, seen=[])
            runtime.send("adder", 7)
            await runtime.run_until_idle()
            assert adder.state == TallyV2(total=12, limit=50, seen=[7])
            now = await runtime.snapshot()
            assert now.agents["adder"].state_version == 2
            # Back to the cut version 1 stored: read through the upcaster again.
            await runtime.rollback(kept, reason="back to 5")
            assert adder.state == TallyV2(total=5, limit=50, seen=[])
            await runtime.close()
            snapshots = await store.list_snapshots(run_id)
            assert [s.agents["adder"].state_version for s in snapshots][:2] == [1, 1]
            assert snapshots[-1].agents["adder"].state_version == 2
            schemas = await store.load_state_schemas(run_id)
            assert schemas["adder"][VERSION_KEY] == 2  # the code that ran it last
        finally:
            await store.close()

    asyncio.run(go())


def test_a_version_1_snapshot_forks_under_version_2(db: str) -> None:
    async def go() -> None:
        store = SqlStore(db)
        try:
            _, kept = await stored_by_v1(store)
            async with Runtime(store=store) as fork:
                adder = fork.add(AdderV2("adder"))
                await fork.fork_from(kept)
                fork.send("adder", 1)
                await fork.run_until_idle()
            assert adder.state == TallyV2(total=6, limit=50, seen=[1])

            models = {"adder": TallyV2}
            # An edited state is one of the current version: a version-1 one is refused.
            with pytest.raises(StateInvalid) as refused:
                await fork_run(store, kept, states={"adder": {"count": 1}}, models=models)
            assert {p["path"] for p in refused.value.problems} == {"$.count"}
            made = await fork_run(
                store, kept, states={"adder": {"total": 40, "limit": 3}}, models=models
            )
            (first,) = await store.list_snapshots(made.id)
            assert first.agents["adder"].state_version == 2
            assert (await store.load_state_schemas(made.id))["adder"][VERSION_KEY] == 2
            resumed = Runtime(store=store, run_id=made.id)
            again = resumed.add(AdderV2("adder"))
            await resumed.resume()
            await resumed.run_until_idle()
            await resumed.close()
            assert again.state == TallyV2(total=40, limit=3)
        finally:
            await store.close()

    asyncio.run(go())


def test_a_version_1_snapshot_shows_and_diffs_under_version_2(db: str) -> None:
    async def go() -> None:
        store = SqlStore(db)
        try:
            run_id, kept = await stored_by_v1(store)
            runtime = Runtime(store=store, run_id=run_id)
            runtime.add(AdderV2("adder"))
            await runtime.resume()
            runtime.send("adder", 7)
            await runtime.run_until_idle()
            later = await runtime.snapshot()
            await runtime.close()

            models = {"adder": TallyV2}
            raw = await show_snapshot(store, kept)
            assert raw.agents["adder"].state_version == 1
            assert raw.agents["adder"].state["count"] == 5
            assert "read_as" not in raw.model_dump(mode="json")["agents"]["adder"]
            shown = await show_snapshot(store, kept, models=models)
            entry = shown.agents["adder"]
            assert (entry.state_version, entry.read_as) == (1, 2)
            assert entry.state["total"] == 5
            assert entry.state["limit"] == 50

            diffed = await diff_snapshots(store, kept, later.id, models=models)
            (adder,) = [a for a in diffed.agents if a.agent == "adder"]
            assert (adder.a_version, adder.b_version, adder.change) == (1, 2, "changed")
            fields = adder.fields  # not count, nor limit: both read as version 2
            assert (fields.added, fields.removed) == ({}, {})
            assert fields.model_dump()["changed"] == {
                "total": {"old": 5, "new": 12},
                "seen": {"old": [], "new": [7]},
            }
        finally:
            await store.close()

    asyncio.run(go())


def test_an_unreadable_stored_state_stops_a_resume_with_the_clear_error(db: str) -> None:
    async def go() -> None:
        store = SqlStore(db)
        try:
            run_id, _ = await stored_by_v1(store)
            runtime = Runtime(store=store, run_id=run_id)
            adder = runtime.add(AdderV3("adder", TallyV3(total=99)))
            with pytest.raises(StateNotReadable) as caught:
                await runtime.resume()
            await runtime.close()
            assert (caught.value.agent, caught.value.step) == ("adder", 1)
            assert adder.state.total == 99  # left as it was
            rows = await check_stored_states(store, {"adder": TallyV3}, run_id)
            # Two states: the one the run started with, and the one at 5.
            assert [(r.stored_version, r.unreadable) for r in rows] == [(1, 2)]
            assert "no upcaster from version 1 to 2" in (rows[0].error or "")
        finally:
            await store.close()

    asyncio.run(go())


def test_states_check_reports_what_the_code_can_read(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def stored() -> str:
        store = SqlStore(db)
        try:
            run_id, _ = await stored_by_v1(store)
            return run_id
        finally:
            await store.close()

    run_id = asyncio.run(stored())
    monkeypatch.chdir(Path(__file__).parent)
    runner = CliRunner()
    good = runner.invoke(
        main, ["states", "check", run_id[:8], "--db", db, "--app", "test_state_versions:app_v2"]
    )
    assert good.exit_code == 0, good.output
    assert "every stored state is readable" in good.output

    bad = runner.invoke(
        main, ["states", "check", "--db", db, "--app", "test_state_versions:app_v3"]
    )
    assert bad.exit_code == 1, bad.output
    assert "no upcaster from version 1 to 2" in bad.output

    as_json = runner.invoke(
        main, ["states", "check", "--db", db, "--app", "test_state_versions:app_v3", "--json"]
    )
    assert as_json.exit_code == 1
    (row,) = json.loads(as_json.output)
    assert row["run_id"] == run_id
    assert (row["agent"], row["stored_version"], row["current_version"]) == ("adder", 1, 3)
    assert row["snapshots"][0] == 1
    assert (row["readable"], row["unreadable"]) == (0, 2)

    shown = runner.invoke(
        main, ["show", "--db", db, "--app", "test_state_versions:app_v3", "--json", run_id[:4]]
    )
    assert shown.exit_code != 0  # a run id is not a snapshot id
    snapshots = runner.invoke(main, ["snapshots", run_id, "--db", db, "--json"])
    first = json.loads(snapshots.output)[1]["id"]
    shown = runner.invoke(
        main, ["show", first, "--db", db, "--app", "test_state_versions:app_v2", "--json"]
    )
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["agents"]["adder"]["state"]["total"] == 5
    text = runner.invoke(main, ["show", first, "--db", db, "--app", "test_state_versions:app_v3"])
    assert text.exit_code == 0, text.output
    assert "version 1" in text.output
    assert "no upcaster from version 1 to 2" in text.output


# -- rows stored before versions were recorded -------------------------------------------------


def test_rows_stored_before_the_column_read_as_version_1(db: str) -> None:
    async def write() -> tuple[str, str]:
        store = SqlStore(db)
        try:
            async with Runtime(store=store) as runtime:
                runtime.add(AdderV2("adder"))
                cut = await runtime.snapshot()
            assert cut.agents["adder"].state_version == 2
            return runtime.run_id, cut.id
        finally:
            await store.close()

    async def read(snapshot_id: str) -> int:
        store = SqlStore(db)
        try:
            return (await store.load_snapshot(snapshot_id)).agents["adder"].state_version
        finally:
            await store.close()

    _, snapshot_id = asyncio.run(write())
    migrate.downgrade(db, "0016")
    migrate.upgrade(db)
    assert asyncio.run(read(snapshot_id)) == 1
