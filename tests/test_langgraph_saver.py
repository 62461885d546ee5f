"""AgentsnapSaver passes LangGraph's checkpointer conformance suite on SQLite and PostgreSQL."""

from __future__ import annotations

import builtins
import importlib
import json
import operator
import sys
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
import sqlalchemy
from postgres_db import postgres_url_or_skip

pytest.importorskip("langgraph.checkpoint.conformance")

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import Capability

from agentsnap.exceptions import StoreError
from agentsnap.integrations import MissingExtraError
from agentsnap.integrations.langgraph import AgentsnapSaver
from agentsnap.store import migrate
from agentsnap.store.migrate import sync_url


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'agentsnap.db'}"


def postgres_url(tmp_path: Path) -> str:
    return postgres_url_or_skip()


URLS = [
    pytest.param(sqlite_url, id="sqlite"),
    pytest.param(postgres_url, id="postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(params=URLS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    make: Callable[[Path], str] = request.param
    return make(tmp_path)


async def test_the_saver_passes_langgraph_conformance_suite(url: str) -> None:
    @checkpointer_test(name=f"AgentsnapSaver[{url.split(':', maxsplit=1)[0]}]")
    async def make_saver() -> AsyncIterator[AgentsnapSaver]:
        saver = AgentsnapSaver(url)
        try:
            yield saver
        finally:
            await saver.aclose()

    report = await validate(make_saver)
    report.print_report()
    # Every capability the suite knows, the extended ones (copy_thread, delete_for_runs,
    # prune) included: none may be missing, and each must pass.
    missing = sorted(name for name, result in report.results.items() if not result.detected)
    assert not missing, f"the saver does not implement {missing}"
    assert set(report.results) == {capability.value for capability in Capability}
    assert report.passed_all(), "the saver fails LangGraph's conformance suite"


def test_the_sync_methods_round_trip_a_checkpoint(url: str) -> None:
    saver = AgentsnapSaver(url)
    try:
        config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        version = saver.get_next_version(None, None)
        assert saver.get_next_version(version, None) > version
        checkpoint: Checkpoint = {
            "v": 4,
            "id": "1",
            "ts": "2026-11-22T00:00:00+00:00",
            "channel_values": {"a": [1, 2], "b": ["x"], "n": 7},
            "channel_versions": {"a": version, "b": version, "n": version},
            "versions_seen": {},
            "updated_channels": None,
        }
        saved = saver.put(config, checkpoint, {"source": "input", "step": -1}, {"a": version})
        saver.put(saved, {**checkpoint, "id": "2"}, {"source": "loop", "step": 0}, {})
        saver.put_writes(saved, [("a", {"k": 1})], task_id="task")
        newest = saver.get_tuple(config)
        assert newest is not None
        assert newest.checkpoint["id"] == "2"
        # b was never stored (not in new_versions); the small scalar n rides in the row.
        assert newest.checkpoint["channel_values"] == {"a": [1, 2], "n": 7}
        first = saver.get_tuple(saved)
        assert first is not None
        assert first.pending_writes == [("task", "a", {"k": 1})]
        assert [t.checkpoint["id"] for t in saver.list(config, filter={"source": "loop"})] == ["2"]
        saver.delete_thread("t")
        assert saver.get_tuple(config) is None
    finally:
        saver.close()


def _checkpoint(checkpoint_id: str) -> Any:
    return {
        "v": 4,
        "id": checkpoint_id,
        "ts": "2026-11-22T00:00:00+00:00",
        "channel_values": {},
        "channel_versions": {},
        "versions_seen": {},
        "updated_channels": None,
    }


def _stored_metadata(url: str) -> dict[str, tuple[str, bytes]]:
    engine = sqlalchemy.create_engine(sync_url(url))
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                sqlalchemy.text(
                    "SELECT checkpoint_id, meta_type, meta FROM agentsnap_lg_checkpoints"
                )
            ).all()
    finally:
        engine.dispose()
    return {row[0]: (row[1], bytes(row[2])) for row in rows}


def test_plain_metadata_is_stored_as_json(url: str) -> None:
    saver = AgentsnapSaver(url)
    try:
        config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        metadata: Any = {"source": "loop", "step": 3, "parents": {}, "note": "é", "ratio": 0.5}
        saver.put(config, _checkpoint("1"), metadata, {})
        saved = saver.get_tuple(config)
        assert saved is not None
        assert saved.metadata == metadata
    finally:
        saver.close()
    meta_type, meta = _stored_metadata(url)["1"]
    assert meta_type == "json"
    assert json.loads(meta) == metadata


def test_other_metadata_round_trips_through_the_serializer(url: str) -> None:
    # Not plain JSON (a datetime), or JSON that LangGraph's reviver would read as an object.
    when = datetime(2026, 11, 22, tzinfo=UTC)
    lc_like = {"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages"]}
    cases: Any = {
        "1": {"source": "loop", "step": 1, "when": when},
        "2": {"source": "loop", "step": 2, "payload": lc_like},
        "3": {"source": "loop", "step": 3, "nan": float("nan")},  # JSON has no NaN
    }
    saver = AgentsnapSaver(url)
    try:
        config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        for checkpoint_id, metadata in cases.items():
            saver.put(config, _checkpoint(checkpoint_id), metadata, {})
        for checkpoint_id, metadata in cases.items():
            saved = saver.get_tuple(
                {"configurable": {**config["configurable"], "checkpoint_id": checkpoint_id}}
            )
            assert saved is not None
            got: Any = saved.metadata
            if checkpoint_id == "3":
                assert got["nan"] != got["nan"]
            else:
                assert got == metadata
    finally:
        saver.close()
    assert {meta_type for meta_type, _ in _stored_metadata(url).values()} == {"msgpack"}


async def test_a_branch_from_an_older_checkpoint_keeps_its_own_values(url: str) -> None:
    # Two branches of one thread give a channel different values at the same step.
    from langgraph.graph import END, START, StateGraph

    class Notes(TypedDict):
        notes: Annotated[list[str], operator.add]

    builder = StateGraph(Notes)
    builder.add_node("noop", lambda state: {})
    builder.add_edge(START, "noop")
    builder.add_edge("noop", END)
    saver = AgentsnapSaver(url)
    try:
        graph = builder.compile(checkpointer=saver)
        thread: RunnableConfig = {"configurable": {"thread_id": "branching"}}
        await graph.ainvoke({"notes": ["a"]}, thread)
        older = (await graph.aget_state(thread)).config
        await graph.ainvoke({"notes": ["b"]}, thread)
        await graph.ainvoke({"notes": ["x"]}, older)
        assert (await graph.aget_state(thread)).values == {"notes": ["a", "x"]}
        abandoned = [s.values async for s in graph.aget_state_history(thread)]
        assert {"notes": ["a", "b"]} in abandoned
    finally:
        await saver.aclose()


def _execute(url: str, sql: str, rows: list[dict[str, Any]] | None = None) -> list[Any]:
    engine = sqlalchemy.create_engine(sync_url(url))
    try:
        with engine.begin() as connection:
            result = connection.execute(sqlalchemy.text(sql), rows or {})
            return list(result.all()) if result.returns_rows else []
    finally:
        engine.dispose()


def test_a_tasks_writes_are_one_row_and_keep_langgraphs_rules(url: str) -> None:
    from langgraph.checkpoint.serde.types import ERROR, INTERRUPT

    saver = AgentsnapSaver(url)
    try:
        saved = saver.put(
            {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, _checkpoint("1"), {}, {}
        )
        saver.put_writes(saved, [("a", 1)], "task", task_path="~p")
        # Sent again with one more (as LangGraph re-sends a task's growing list): the first
        # write stays as recorded, the new index is added.
        saver.put_writes(saved, [("a", "changed"), ("b", 2)], "task")
        saver.put_writes(saved, [(ERROR, "first"), (INTERRUPT, {"why": "ask"})], "task")
        saver.put_writes(saved, [(ERROR, "second")], "task")  # a special channel: replaced
        saver.put_writes(saved, [("a", "other task")], "other")
        found = saver.get_tuple(saved)
    finally:
        saver.close()
    assert found is not None
    assert sorted(found.pending_writes or [], key=repr) == sorted(
        [
            ("task", "a", 1),
            ("task", "b", 2),
            ("task", ERROR, "second"),
            ("task", INTERRUPT, {"why": "ask"}),
            ("other", "a", "other task"),
        ],
        key=repr,
    )
    rows = _execute(url, "SELECT task_id, task_path FROM agentsnap_lg_task_writes")
    assert sorted(tuple(row) for row in rows) == [("other", ""), ("task", "~p")]


def test_a_damaged_writes_row_is_reported_not_decoded(url: str) -> None:
    saver = AgentsnapSaver(url)
    try:
        saved = saver.put({"configurable": {"thread_id": "t"}}, _checkpoint("1"), {}, {})
        saver.put_writes(saved, [("a", 1)], "task")
        _execute(url, "UPDATE agentsnap_lg_task_writes SET writes = :bad", [{"bad": b"\xc1"}])
        with pytest.raises(StoreError, match="agentsnap_lg_task_writes") as caught:
            saver.get_tuple(saved)
    finally:
        saver.close()
    assert "\n" not in str(caught.value)


def test_upgrading_from_one_row_per_write_keeps_the_pending_writes(url: str) -> None:
    from langgraph.checkpoint.serde.types import ERROR

    migrate.upgrade(url, "0005")
    saver = AgentsnapSaver(url)  # for its serializer; it touches no table before the upgrade
    dumps = saver.serde.dumps_typed
    checkpoint_type, checkpoint = dumps(_checkpoint("1"))
    _execute(
        url,
        "INSERT INTO agentsnap_lg_checkpoints VALUES "
        "('t', '', '1', NULL, :checkpoint_type, :checkpoint, 'json', :meta)",
        [{"checkpoint_type": checkpoint_type, "checkpoint": checkpoint, "meta": b"{}"}],
    )
    old_rows = [
        ("task", 0, "a", *dumps({"k": 1}), "~p"),
        ("task", 1, "b", *dumps(None), "~p"),
        ("task", -1, ERROR, *dumps("boom"), "~p"),
        ("other", 0, "a", *dumps([1, 2]), ""),
    ]
    _execute(
        url,
        "INSERT INTO agentsnap_lg_writes VALUES "
        "('t', '', '1', :task, :idx, :channel, :value_type, :value, :task_path)",
        [
            dict(
                zip(
                    ["task", "idx", "channel", "value_type", "value", "task_path"], row, strict=True
                )
            )
            for row in old_rows
        ],
    )
    migrate.upgrade(url)
    try:
        found = saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_id": "1"}})
    finally:
        saver.close()
    assert found is not None
    assert found.pending_writes == [
        ("other", "a", [1, 2]),
        ("task", ERROR, "boom"),
        ("task", "a", {"k": 1}),
        ("task", "b", None),
    ]

    migrate.downgrade(url, "0005")
    back = _execute(
        url,
        "SELECT task_id, idx, channel, value_type, value, task_path FROM agentsnap_lg_writes",
    )
    assert sorted((*row[:4], bytes(row[4]), row[5]) for row in back) == sorted(old_rows)


def test_values_are_never_unpickled(url: str) -> None:
    saver = AgentsnapSaver(url)
    try:
        with pytest.raises(Exception):  # noqa: B017, PT011
            saver.serde.loads_typed(("pickle", b"\x80\x04K\x01."))
    finally:
        saver.close()


def test_without_langgraph_the_module_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_langgraph(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.split(".", maxsplit=1)[0] in {"langgraph", "langchain_core"}:
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_langgraph)
    monkeypatch.delitem(sys.modules, "agentsnap.integrations.langgraph")
    with pytest.raises(MissingExtraError, match=r"agentsnap\[langgraph\]") as caught:
        importlib.import_module("agentsnap.integrations.langgraph")
    assert isinstance(caught.value, ImportError)
    monkeypatch.undo()
    importlib.import_module("agentsnap.integrations.langgraph")


def test_importing_agentsnap_does_not_import_langgraph() -> None:
    import subprocess

    code = "import agentsnap, sys; assert not any(m.startswith('langgraph') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.postgres
async def test_the_async_methods_run_on_postgresqls_asyncio_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saver = AgentsnapSaver(postgres_url(tmp_path))
    saver.get_tuple({"configurable": {"thread_id": "none"}})  # creates the schema (a thread)

    def no_thread(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a native asynchronous method hopped to a thread")

    monkeypatch.setattr("agentsnap.integrations.langgraph._saver.asyncio.to_thread", no_thread)
    import psycopg

    opened: list[Any] = []
    connect = psycopg.AsyncConnection.connect

    async def counted(*args: Any, **kwargs: Any) -> Any:
        opened.append(await connect(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", counted)
    try:
        config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        version = saver.get_next_version(None, None)
        checkpoint: Checkpoint = {
            "v": 4,
            "id": "1",
            "ts": "2026-11-22T00:00:00+00:00",
            "channel_values": {"a": [1, 2], "n": 7},
            "channel_versions": {"a": version, "n": version},
            "versions_seen": {},
            "updated_channels": None,
        }
        assert await saver.aget_tuple(config) is None
        saved = await saver.aput(
            config, checkpoint, {"source": "input", "step": -1}, {"a": version}
        )
        await saver.aput(saved, {**checkpoint, "id": "2"}, {"source": "loop", "step": 0}, {})
        await saver.aput_writes(saved, [("a", {"k": 1})], task_id="task")
        # Sent again: the regular write is kept; a special channel's newest write replaces.
        await saver.aput_writes(saved, [("a", {"k": 2}), ("__error__", "e1")], task_id="task")
        await saver.aput_writes(saved, [("__error__", "e2")], task_id="task")
        newest = await saver.aget_tuple(config)
        assert newest is not None
        assert newest.checkpoint["id"] == "2"
        assert newest.checkpoint["channel_values"] == {"a": [1, 2], "n": 7}
        first = await saver.aget_tuple(saved)
        assert first is not None
        assert sorted(first.pending_writes or []) == [
            ("task", "__error__", "e2"),
            ("task", "a", {"k": 1}),
        ]
        assert [t.checkpoint["id"] async for t in saver.alist(config)] == ["2", "1"]
        assert [t.checkpoint["id"] async for t in saver.alist(config, limit=1)] == ["2"]
        loop = [t.checkpoint["id"] async for t in saver.alist(config, filter={"source": "loop"})]
        assert loop == ["2"]
        # The synchronous methods see what the asynchronous ones wrote.
        assert saver.get_tuple(saved) == first
        # psycopg's own async connection, one for all those calls made one after another.
        assert len(opened) == 1
        assert isinstance(opened[0], psycopg.AsyncConnection)
    finally:
        monkeypatch.undo()
        await saver.aclose()
