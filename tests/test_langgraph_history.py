"""The LangGraph saver manages its history: copy, prune, delete by run, and agentsnap runs' threads.

Run on SQLite and PostgreSQL against real compiled graphs, so that "the thread still loads"
means what LangGraph itself reads back.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
import sqlalchemy
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from langgraph_graphs import notes_graph
from postgres_db import postgres_url_or_skip

from agentsnap import ConfigurationError, Runtime
from agentsnap.exceptions import StoreError
from agentsnap.integrations.langgraph import AgentsnapSaver, GraphAgent, delete_run_threads
from agentsnap.integrations.langgraph import _saver as saver_module
from agentsnap.store import _graph_history as history
from agentsnap.store import migrate
from agentsnap.store.migrate import sync_url


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agentsnap.db'}"
    return postgres_url_or_skip()


@pytest.fixture
def saver(url: str) -> Iterator[AgentsnapSaver]:
    made = AgentsnapSaver(url)
    try:
        yield made
    finally:
        made.close()


def _engine(url: str) -> sqlalchemy.Engine:
    return sqlalchemy.create_engine(sync_url(url))


def _query(url: str, sql: str, **values: Any) -> list[tuple[Any, ...]]:
    engine = _engine(url)
    try:
        with engine.begin() as connection:
            result = connection.execute(sqlalchemy.text(sql), values)
            return [tuple(row) for row in result.all()] if result.returns_rows else []
    finally:
        engine.dispose()


def _thread(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


def _rows_of(url: str, thread_id: str) -> dict[str, int]:
    """How many rows each of the saver's tables holds for a thread."""
    return {
        table: _query(url, f"SELECT count(*) FROM {table} WHERE thread_id = :t", t=thread_id)[0][0]
        for table in ("agentsnap_lg_checkpoints", "agentsnap_lg_blobs", "agentsnap_lg_task_writes")
    }


def _history_of(saver: AgentsnapSaver, thread_id: str) -> list[tuple[Any, ...]]:
    """A thread's checkpoints as LangGraph reads them back, newest first."""
    return [
        (
            found.config["configurable"]["checkpoint_ns"],
            found.checkpoint["id"],
            found.checkpoint["channel_values"],
            dict(found.metadata),
            found.parent_config["configurable"]["checkpoint_id"] if found.parent_config else None,
            found.pending_writes,
        )
        for found in saver.list(_thread(thread_id))
    ]


def _orphan_values(url: str, saver: AgentsnapSaver) -> set[tuple[str, ...]]:
    """Stored channel values that no stored checkpoint refers to."""
    referenced: set[tuple[str, ...]] = set()
    for found in saver.list(None):
        configurable = found.config["configurable"]
        referenced |= {
            (configurable["thread_id"], configurable["checkpoint_ns"], channel, str(version))
            for channel, version in found.checkpoint["channel_versions"].items()
        }
    stored = _query(
        url, "SELECT thread_id, checkpoint_ns, channel, version FROM agentsnap_lg_blobs"
    )
    return {tuple(row) for row in stored} - referenced


# copy_thread


def test_a_copied_thread_reads_back_as_the_source_and_goes_on_alone(
    saver: AgentsnapSaver, url: str
) -> None:
    graph = notes_graph(saver)
    graph.invoke({"notes": ["a"]}, _thread("source"))
    graph.invoke({"notes": ["b"]}, _thread("source"))
    newest = saver.get_tuple(_thread("source"))
    assert newest is not None
    # A subgraph's namespace and a pending write, which a plain run leaves none of.
    child: Any = {"configurable": {"thread_id": "source", "checkpoint_ns": "child:1"}}
    saved = saver.put(child, {**newest.checkpoint, "id": "child-1"}, {"step": 0}, {})
    saver.put_writes(saved, [("notes", ["pending"])], task_id="task")
    before = _history_of(saver, "source")

    saver.copy_thread("source", "copy")

    assert _history_of(saver, "copy") == before
    assert _rows_of(url, "copy") == _rows_of(url, "source")
    graph.invoke({"notes": ["c"]}, _thread("copy"))
    assert graph.get_state(_thread("copy")).values == {"notes": ["a", "b", "c"], "count": 3}
    assert graph.get_state(_thread("source")).values == {"notes": ["a", "b"], "count": 2}
    assert _history_of(saver, "source") == before


def test_copying_a_thread_that_holds_nothing_copies_nothing(saver: AgentsnapSaver) -> None:
    notes_graph(saver).invoke({"notes": ["a"]}, _thread("kept"))
    saver.copy_thread("nothing-here", "kept")
    saver.copy_thread("kept", "kept")  # onto itself: unchanged
    assert len(_history_of(saver, "kept")) == 3
    assert saver.get_tuple(_thread("nothing-here")) is None


# delete_for_runs


def test_deleting_a_langgraph_run_keeps_the_other_runs_checkpoints_whole(
    saver: AgentsnapSaver, url: str
) -> None:
    graph = notes_graph(saver)
    graph.invoke({"notes": ["a"]}, {**_thread("t"), "metadata": {"run_id": "run-1"}})
    graph.invoke({"notes": ["b"]}, {**_thread("t"), "metadata": {"run_id": "run-2"}})
    graph.invoke({"notes": ["x"]}, {**_thread("other"), "metadata": {"run_id": "run-2"}})
    graph.invoke({"notes": ["y"]}, {**_thread("other"), "metadata": {"run_id": "run-3"}})
    first_run = [entry for entry in _history_of(saver, "t") if entry[3]["run_id"] == "run-1"]
    assert len(first_run) == 3

    saver.delete_for_runs(["run-2", "no-such-run"])

    assert _history_of(saver, "t") == first_run
    assert graph.get_state(_thread("t")).values == {"notes": ["a"], "count": 1}
    assert {entry[3]["run_id"] for entry in _history_of(saver, "other")} == {"run-3"}
    assert _orphan_values(url, saver) == set()
    saver.delete_for_runs([])  # nothing to do


def test_a_run_is_found_whatever_its_metadata_is_stored_as(saver: AgentsnapSaver, url: str) -> None:
    checkpoint: Any = {
        "v": 4,
        "id": "1",
        "ts": "2026-11-22T00:00:00+00:00",
        "channel_values": {},
        "channel_versions": {},
        "versions_seen": {},
        "updated_channels": None,
    }
    when = datetime(2026, 11, 22, tzinfo=UTC)  # not JSON: the metadata goes through msgpack
    metadata: dict[str, Any] = {
        "msgpack": {"run_id": "r_%", "when": when},
        "json": {"run_id": "r_%"},
        "like-lookalike": {"run_id": "rx1"},
        "not-a-string": {"run_id": 7},
    }
    for thread, meta in metadata.items():
        saver.put(_thread(thread), checkpoint, meta, {})
    assert {row[0] for row in _query(url, "SELECT meta_type FROM agentsnap_lg_checkpoints")} == {
        "json",
        "msgpack",
    }

    saver.delete_for_runs(["r_%", "7"])

    remaining = _query(url, "SELECT thread_id FROM agentsnap_lg_checkpoints")
    assert sorted(row[0] for row in remaining) == ["like-lookalike", "not-a-string"]


# prune


def test_keep_latest_keeps_each_namespaces_newest_checkpoint_as_it_was(
    saver: AgentsnapSaver, url: str
) -> None:
    graph = notes_graph(saver)
    for note in "abc":
        graph.invoke({"notes": [note]}, _thread("t"))
    graph.invoke({"notes": ["z"]}, _thread("untouched"))
    newest = saver.get_tuple(_thread("t"))
    assert newest is not None
    child: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": "child:1"}}
    first = saver.put(child, {**newest.checkpoint, "id": "child-1"}, {"step": 0}, {})
    saver.put_writes(first, [("notes", ["old"])], task_id="task")
    last = saver.put(first, {**newest.checkpoint, "id": "child-2"}, {"step": 1}, {})
    saver.put_writes(last, [("notes", ["pending"])], task_id="task")
    # Task writes of a namespace that has no checkpoint.
    stray: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": "gone", "checkpoint_id": "x"}}
    saver.put_writes(stray, [("notes", ["stray"])], task_id="task")
    latest = {entry[0]: entry for entry in reversed(_history_of(saver, "t"))}
    untouched = _history_of(saver, "untouched")
    blobs_before = _rows_of(url, "t")["agentsnap_lg_blobs"]

    saver.prune(["t", "no-such-thread"])

    assert _history_of(saver, "t") == sorted(latest.values(), key=lambda entry: entry[1])[::-1]
    assert [entry[1] for entry in _history_of(saver, "t")] == ["child-2", newest.checkpoint["id"]]
    assert _rows_of(url, "t")["agentsnap_lg_task_writes"] == 1
    assert _rows_of(url, "t")["agentsnap_lg_blobs"] < blobs_before
    assert _orphan_values(url, saver) == set()
    assert _history_of(saver, "untouched") == untouched
    graph.invoke({"notes": ["d"]}, _thread("t"))
    assert graph.get_state(_thread("t")).values == {"notes": ["a", "b", "c", "d"], "count": 4}


def test_prune_with_delete_removes_the_threads(saver: AgentsnapSaver, url: str) -> None:
    graph = notes_graph(saver)
    graph.invoke({"notes": ["a"]}, _thread("t1"))
    graph.invoke({"notes": ["a"]}, _thread("t2"))
    graph.invoke({"notes": ["a"]}, _thread("kept"))
    saver.prune(["t1", "t2"], strategy="delete")
    assert _rows_of(url, "t1") == _rows_of(url, "t2") == _rows_of(url, "nothing")
    assert len(_history_of(saver, "kept")) == 3


def test_an_unknown_prune_strategy_is_refused(saver: AgentsnapSaver) -> None:
    notes_graph(saver).invoke({"notes": ["a"]}, _thread("t"))
    with pytest.raises(ConfigurationError, match="unknown prune strategy 'oldest'") as caught:
        saver.prune(["t"], strategy="oldest")
    assert "\n" not in str(caught.value)
    assert len(_history_of(saver, "t")) == 3


def test_one_string_is_refused_where_a_list_of_ids_is_expected(
    saver: AgentsnapSaver, url: str
) -> None:
    notes_graph(saver).invoke({"notes": ["a"]}, {**_thread("t"), "metadata": {"run_id": "t"}})
    engine = _engine(url)
    try:
        with engine.begin() as connection:
            calls: list[Callable[[], object]] = [
                lambda: saver.prune("t"),
                lambda: saver.delete_for_runs("t"),
                lambda: delete_run_threads(connection, "t"),
            ]
            for call in calls:
                with pytest.raises(ConfigurationError, match=r"not one string: pass \['t'\]"):
                    call()
    finally:
        engine.dispose()
    assert len(_history_of(saver, "t")) == 3


def _append(state: list[str], batches: list[list[str]]) -> list[str]:
    return [*state, *(item for batch in batches for item in batch)]


class Log(TypedDict, total=False):
    log: Annotated[list[str], DeltaChannel(_append, snapshot_frequency=3)]
    size: int


def _delta_graph(saver: AgentsnapSaver) -> Any:
    builder = StateGraph(Log)
    builder.add_node("measure", lambda state: {"size": len(state.get("log", []))})
    builder.add_edge(START, "measure")
    builder.add_edge("measure", END)
    return builder.compile(checkpointer=saver)


def test_keep_latest_keeps_what_a_delta_channel_is_rebuilt_from(saver: AgentsnapSaver) -> None:
    graph = _delta_graph(saver)
    for index in range(7):
        graph.invoke({"log": [f"entry {index}"]}, _thread("t"))
    before = graph.get_state(_thread("t")).values
    assert before["log"] == [f"entry {index}" for index in range(7)]
    total = len(_history_of(saver, "t"))

    saver.prune(["t"])

    # The newest checkpoint does not hold the log itself: its ancestors back to the last
    # one that does are kept, with the writes the log is rebuilt from.
    kept = len(_history_of(saver, "t"))
    assert 1 < kept < total
    assert graph.get_state(_thread("t")).values == before
    graph.invoke({"log": ["after"]}, _thread("t"))
    assert graph.get_state(_thread("t")).values["log"] == [*before["log"], "after"]


@pytest.mark.postgres
def test_a_checkpoint_saved_while_a_prune_runs_is_left_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = postgres_url_or_skip()
    saver, writer = AgentsnapSaver(url), AgentsnapSaver(url)
    try:
        graph = notes_graph(saver)
        graph.invoke({"notes": ["a"]}, _thread("t"))
        graph.invoke({"notes": ["b"]}, _thread("t"))
        keep_only: Callable[..., None] = history._keep_only

        def write_meanwhile(*args: Any) -> None:
            # The prune has read the thread; another connection commits a new step now.
            notes_graph(writer).invoke({"notes": ["c"]}, _thread("t"))
            keep_only(*args)

        monkeypatch.setattr(history, "_keep_only", write_meanwhile)
        saver.prune(["t"])
        monkeypatch.undo()
        assert graph.get_state(_thread("t")).values == {"notes": ["a", "b", "c"], "count": 3}
        assert _orphan_values(url, saver) == set()
    finally:
        saver.close()
        writer.close()


@pytest.mark.postgres
@pytest.mark.parametrize("aborted", [1, 3], ids=["once", "every-time"])
def test_a_prune_that_a_concurrent_write_aborts_is_run_again(
    monkeypatch: pytest.MonkeyPatch, aborted: int
) -> None:
    url = postgres_url_or_skip()
    saver, writer = AgentsnapSaver(url), AgentsnapSaver(url)
    try:
        graph = notes_graph(saver)
        graph.invoke({"notes": ["a"]}, _thread("t"))
        graph.invoke({"notes": ["b"]}, _thread("t"))
        oldest = list(saver.list(_thread("t")))[-1]
        keep_only: Callable[..., None] = history._keep_only
        calls = []

        def rewrite_meanwhile(*args: Any) -> None:
            calls.append(args)
            if len(calls) <= aborted:
                # Another connection rewrites a checkpoint the prune is about to delete:
                # PostgreSQL aborts the prune's repeatable-read transaction.
                writer.put(oldest.config, oldest.checkpoint, oldest.metadata, {})
            keep_only(*args)

        monkeypatch.setattr(history, "_keep_only", rewrite_meanwhile)
        if aborted == 3:  # as often as the saver tries: it gives up, saying what to do
            with pytest.raises(StoreError, match=r"prune was aborted 3 times .* run it again"):
                saver.prune(["t"])
            assert len(calls) == 3
            assert len(_history_of(saver, "t")) == 6  # nothing was deleted
            return
        saver.prune(["t"])
        assert len(calls) == 2
        assert len(_history_of(saver, "t")) == 1
        assert graph.get_state(_thread("t")).values == {"notes": ["a", "b"], "count": 2}
    finally:
        saver.close()
        writer.close()


# delete_run_threads (agentsnap runs)


def test_an_agentsnap_runs_graph_threads_are_deleted_exactly(
    saver: AgentsnapSaver, url: str
) -> None:
    graph = notes_graph(saver)
    runs = ["r_1", "r%", "R_1", "rX1", "r_1x", "r"]
    for run in runs:
        for thread in (f"{run}:graph", f"{run}:graph:2"):
            graph.invoke({"notes": ["a"]}, _thread(thread))
            saver.put_writes(
                saver.list(_thread(thread), limit=1).__next__().config, [("notes", ["w"])], "task"
            )
    graph.invoke({"notes": ["a"]}, _thread("r_1"))  # not a graph agent's thread
    counts = {thread: _rows_of(url, thread) for thread in ("r_1:graph", "r_1:graph:2")}
    expected = sum(sum(count.values()) for count in counts.values())
    counts_r = {thread: _rows_of(url, thread) for thread in ("r%:graph", "r%:graph:2")}
    expected += sum(sum(count.values()) for count in counts_r.values())

    engine = _engine(url)
    try:
        with engine.connect() as connection:  # the caller's transaction: rolled back
            assert delete_run_threads(connection, ["r_1"]) > 0
            connection.rollback()
        assert _rows_of(url, "r_1:graph") == counts["r_1:graph"]
        with engine.begin() as connection:
            assert delete_run_threads(connection, ["r_1", "r%", "r_1", "never-ran"]) == expected
        with engine.begin() as connection:
            assert delete_run_threads(connection, []) == 0
    finally:
        engine.dispose()

    left = {row[0] for row in _query(url, "SELECT thread_id FROM agentsnap_lg_checkpoints")}
    assert left == {
        "r_1",
        *(f"{run}:graph{suffix}" for run in ("R_1", "rX1", "r_1x", "r") for suffix in ("", ":2")),
    }
    for table in ("agentsnap_lg_blobs", "agentsnap_lg_task_writes"):
        threads = {row[0] for row in _query(url, f"SELECT thread_id FROM {table}")}
        assert not threads & {"r_1:graph", "r_1:graph:2", "r%:graph", "r%:graph:2"}


async def test_a_graph_agents_checkpoints_go_with_its_run(saver: AgentsnapSaver, url: str) -> None:
    run_ids = []
    for _ in range(2):
        async with Runtime() as runtime:
            agent = runtime.add(GraphAgent("graph", notes_graph(), checkpointer=saver))
            runtime.send("graph", {"notes": ["a"]})
            await runtime.run_until_idle()
            assert isinstance(agent, GraphAgent)
            assert agent.state.thread_id == f"{runtime.run_id}:graph"
            run_ids.append(runtime.run_id)
    engine = _engine(url)
    try:
        with engine.begin() as connection:
            assert delete_run_threads(connection, run_ids[:1]) > 0
    finally:
        engine.dispose()
    assert saver.get_tuple(_thread(f"{run_ids[0]}:graph")) is None
    assert saver.get_tuple(_thread(f"{run_ids[1]}:graph")) is not None


def test_delete_run_threads_needs_no_langgraph(tmp_path: Path) -> None:
    code = f"""
import sys

class NoLangGraph:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {{"langgraph", "langchain_core", "ormsgpack"}}:
            raise ImportError(name)

sys.meta_path.insert(0, NoLangGraph())
from sqlalchemy import create_engine
from agentsnap.store.langgraph import delete_run_threads
from agentsnap.store.migrate import upgrade

url = "sqlite:///{tmp_path / "agentsnap.db"}"
upgrade(url)
engine = create_engine(url)
with engine.begin() as connection:
    assert delete_run_threads(connection, ["run"]) == 0
engine.dispose()
"""
    subprocess.run([sys.executable, "-W", "error", "-c", code], check=True)


# The migration that gives checkpoints their run id column.


def test_upgrading_fills_the_run_id_of_stored_checkpoints(url: str) -> None:
    migrate.upgrade(url, "0009")
    saver = AgentsnapSaver(url)  # for its serializer; it touches no table before the upgrade
    try:
        checkpoint_type, checkpoint = saver.serde.dumps_typed({"id": "x"})
        msgpack = saver.serde.dumps_typed(
            {"run_id": "from-msgpack", "when": datetime(2026, 11, 22, tzinfo=UTC)}
        )
        assert msgpack[0] == "msgpack"
        metas = {
            "json": ("json", b'{"run_id": "from-json", "step": 1}'),
            "msgpack": msgpack,
            "number": ("json", b'{"run_id": 7}'),
            "none": ("json", b'{"step": 1}'),
        }
        for thread, (meta_type, meta) in metas.items():
            _query(
                url,
                "INSERT INTO agentsnap_lg_checkpoints VALUES "
                "(:thread, '', '1', NULL, :ctype, :checkpoint, :meta_type, :meta)",
                thread=thread,
                ctype=checkpoint_type,
                checkpoint=checkpoint,
                meta_type=meta_type,
                meta=meta,
            )
        migrate.upgrade(url)
        stored = _query(url, "SELECT thread_id, run_id FROM agentsnap_lg_checkpoints")
        assert dict(stored) == {
            "json": "from-json",
            "msgpack": "from-msgpack",
            "number": None,
            "none": None,
        }
        saver.delete_for_runs(["from-json", "from-msgpack"])
        remaining = _query(url, "SELECT thread_id FROM agentsnap_lg_checkpoints")
        assert sorted(row[0] for row in remaining) == ["none", "number"]
    finally:
        saver.close()
    migrate.downgrade(url, "0009")
    assert len(_query(url, "SELECT * FROM agentsnap_lg_checkpoints")[0]) == 8


# Values stored once: a value a node wrote refers to the stored write.


class _Draft(TypedDict):
    lines: list[str]
    step: int


def _drafting_graph(saver: AgentsnapSaver, steps: int = 4) -> Any:
    """A node that replaces a list of lines at each of ``steps`` super-steps."""

    def write(state: _Draft) -> dict[str, Any]:
        step = state["step"] + 1
        return {"lines": [*state["lines"], f"line {step} " * 40], "step": step}

    builder = StateGraph(_Draft)
    builder.add_node("write", write)
    builder.add_edge(START, "write")
    builder.add_conditional_edges(
        "write", lambda state: "write" if state["step"] < steps else END, ["write", END]
    )
    return builder.compile(checkpointer=saver)


def _put_by_hand(saver: AgentsnapSaver, thread_id: str, values: list[Any]) -> Any:
    """A checkpoint, then for each value a task's write of it and the checkpoint holding it."""
    config = saver.put(_thread(thread_id), empty_checkpoint(), {"step": -1}, {})
    version = None
    for step, value in enumerate(values):
        saver.put_writes(config, [("lines", value), ("step", step)], task_id=f"task-{step}")
        version = saver.get_next_version(version, None)
        checkpoint: Any = {
            **empty_checkpoint(),
            "channel_values": {"lines": value, "step": step},
            "channel_versions": {"lines": version, "step": version},
        }
        config = saver.put(config, checkpoint, {"step": step}, {"lines": version, "step": version})
    return values[-1]


async def _aput_by_hand(saver: AgentsnapSaver, thread_id: str, values: list[Any]) -> Any:
    """``_put_by_hand`` through the asyncio methods."""
    config = await saver.aput(_thread(thread_id), empty_checkpoint(), {"step": -1}, {})
    version = None
    for step, value in enumerate(values):
        await saver.aput_writes(config, [("lines", value)], task_id=f"task-{step}")
        version = saver.get_next_version(version, None)
        checkpoint: Any = {
            **empty_checkpoint(),
            "channel_values": {"lines": value},
            "channel_versions": {"lines": version},
        }
        config = await saver.aput(config, checkpoint, {"step": step}, {"lines": version})
    return values[-1]


def test_a_value_equal_to_a_write_of_its_parent_refers_to_it(
    saver: AgentsnapSaver, url: str
) -> None:
    values = [["a" * 300], {"text": "b" * 300}, ["a" * 300]]
    _put_by_hand(saver, "t", values)
    assert _referring(url, "t") == 3
    assert [entry[2]["lines"] for entry in _history_of(saver, "t")[:-1]] == values[::-1]
    # A value that is not what the parent's tasks wrote is a copy.
    newest = saver.get_tuple(_thread("t"))
    assert newest is not None
    saver.put_writes(newest.config, [("lines", ["written"])], task_id="task")
    checkpoint: Any = {
        **empty_checkpoint(),
        "channel_values": {"lines": ["written", "and more"]},
        "channel_versions": {"lines": "9"},
    }
    saver.put(newest.config, checkpoint, {"step": 9}, {"lines": "9"})
    assert _referring(url, "t") == 3
    copied = saver.get_tuple(_thread("t"))
    assert copied is not None
    assert copied.checkpoint["channel_values"]["lines"] == ["written", "and more"]


def test_a_checkpoint_put_after_its_thread_was_deleted_holds_its_values(
    saver: AgentsnapSaver, url: str
) -> None:
    first = saver.put(_thread("t"), empty_checkpoint(), {"step": -1}, {})
    saver.put_writes(first, [("lines", ["a" * 300])], task_id="task")
    saver.delete_thread("t")  # the write goes: nothing may refer to it any more
    checkpoint: Any = {
        **empty_checkpoint(),
        "channel_values": {"lines": ["a" * 300]},
        "channel_versions": {"lines": "1"},
    }
    saver.put(first, checkpoint, {"step": 0}, {"lines": "1"})
    assert _referring(url, "t") == 0
    found = saver.get_tuple(_thread("t"))
    assert found is not None
    assert found.checkpoint["channel_values"]["lines"] == ["a" * 300]


async def test_a_value_put_through_the_asyncio_methods_refers_to_its_write(
    saver: AgentsnapSaver, url: str
) -> None:
    values = [["a" * 300], ["b" * 300]]
    await _aput_by_hand(saver, "t", values)
    assert _referring(url, "t") == 2
    newest = await saver.aget_tuple(_thread("t"))
    assert newest is not None
    assert newest.checkpoint["channel_values"]["lines"] == values[-1]
    await saver.aclose()


def _waits_for_writes(url: str) -> bool:
    """Whether the saver's checkpoints wait for the writes their parent's tasks are storing.

    On SQLite, where writes take turns anyway, they do, so a value a node wrote refers to
    the write (unless LangGraph's threads put the checkpoint before the write had begun). On
    PostgreSQL a checkpoint carries the writes offered to it in its own transaction, which
    depends on its coming within the writes' few milliseconds of waiting (see the tests of
    carried writes below).
    """
    return url.startswith("sqlite")


def _referring(url: str, thread_id: str) -> int:
    """How many of a thread's values refer to a task's write instead of holding a copy."""
    return int(
        _query(
            url,
            "SELECT count(*) FROM agentsnap_lg_blobs WHERE thread_id = :t "
            "AND value IS NULL AND write_idx IS NOT NULL",
            t=thread_id,
        )[0][0]
    )


def test_a_value_a_node_wrote_is_stored_once_and_outlives_its_write(
    saver: AgentsnapSaver, url: str
) -> None:
    graph = _drafting_graph(saver)
    final = graph.invoke({"lines": ["start"], "step": 0}, _thread("t"), durability="sync")
    if _waits_for_writes(url):
        assert _referring(url, "t") > 0
    history = _history_of(saver, "t")
    assert history[0][2] == {"lines": final["lines"], "step": 4}

    saver.copy_thread("t", "copy")
    assert _history_of(saver, "copy") == history
    saver.prune(["t"])
    assert _history_of(saver, "t") == history[:1]
    assert _referring(url, "t") == 0  # the kept value was copied out of its pruned write
    saver.delete_thread("t")
    assert _history_of(saver, "copy") == history
    graph.invoke(None, {**_thread("copy"), "recursion_limit": 50}, durability="sync")
    assert graph.get_state(_thread("copy")).values["lines"] == final["lines"]


async def test_values_written_through_the_asyncio_methods_read_back(
    saver: AgentsnapSaver, url: str
) -> None:
    graph = _drafting_graph(saver)
    final = await graph.ainvoke({"lines": ["start"], "step": 0}, _thread("a"), durability="sync")
    if _waits_for_writes(url):
        assert _referring(url, "a") > 0
    newest = await saver.aget_tuple(_thread("a"))
    assert newest is not None
    assert newest.checkpoint["channel_values"]["lines"] == final["lines"]
    await saver.adelete_for_runs([])
    await saver.aclose()


def test_deleting_the_run_that_wrote_a_value_keeps_the_next_run_s_checkpoint_whole(
    saver: AgentsnapSaver, url: str
) -> None:
    graph = _drafting_graph(saver, steps=2)
    config = {**_thread("t"), "metadata": {"run_id": "run-1"}}
    graph.invoke({"lines": ["start"], "step": 0}, config, durability="sync")
    # The second run's first checkpoint holds a value the first run's last task wrote.
    state = graph.get_state(_thread("t"))
    graph.update_state(state.config, {"step": 0})
    graph.invoke(None, {**_thread("t"), "metadata": {"run_id": "run-2"}}, durability="sync")
    kept = [entry for entry in _history_of(saver, "t") if entry[3].get("run_id") != "run-1"]
    if _waits_for_writes(url):
        assert _referring(url, "t") > 0

    saver.delete_for_runs(["run-1"])

    assert [entry[:5] for entry in _history_of(saver, "t")] == [entry[:5] for entry in kept]
    assert _orphan_values(url, saver) == set()


# A task's writes stored in the transaction of the checkpoint that follows.

ERROR = "__error__"
"""LangGraph's channel for a task's error (a special channel: a newer write replaces it)."""


@pytest.fixture
def pg_saver(monkeypatch: pytest.MonkeyPatch, url: str) -> Iterator[AgentsnapSaver]:
    """A saver whose writes wait as long as a test needs for a checkpoint."""
    monkeypatch.setattr(saver_module, "_LINGER", 60.0)
    made = AgentsnapSaver(url)
    try:
        yield made
    finally:
        made.close()


def _offered(saver: AgentsnapSaver) -> threading.Event:
    """An event set once the saver's next task writes are offered to a checkpoint."""
    offered = threading.Event()
    written = saver._written
    offer = written.offer

    def noted(found: Any) -> None:
        offer(found)
        offered.set()

    written.offer = noted  # type: ignore[method-assign,assignment]
    return offered


def _transactions(url: str, thread_id: str) -> set[str]:
    """The transactions that wrote a thread's checkpoints and task writes (``xmin``)."""
    return {
        str(row[0])
        for table in ("agentsnap_lg_checkpoints", "agentsnap_lg_task_writes")
        for row in _query(url, f"SELECT xmin FROM {table} WHERE thread_id = :t", t=thread_id)
    }


def _checkpoint_after(config: Any, value: Any, version: str) -> tuple[Any, ...]:
    checkpoint: Any = {
        **empty_checkpoint(),
        "channel_values": {"lines": value},
        "channel_versions": {"lines": version},
    }
    return config, checkpoint, {"step": 0}, {"lines": version}


def test_a_checkpoint_stores_its_parents_offered_writes_in_its_transaction(
    pg_saver: AgentsnapSaver,
) -> None:
    url = pg_saver.url
    first = pg_saver.put(_thread("t"), empty_checkpoint(), {"step": -1}, {})
    value = ["a" * 300]
    offered = _offered(pg_saver)
    with ThreadPoolExecutor(1) as pool:
        writing = pool.submit(pg_saver.put_writes, first, [("lines", value)], "task")
        assert offered.wait(30)
        pg_saver.put(*_checkpoint_after(first, value, "1"))
        writing.result(timeout=30)  # returns once the checkpoint's transaction committed
    newest = pg_saver.get_tuple(_thread("t"))
    assert newest is not None
    assert newest.checkpoint["channel_values"]["lines"] == value
    parent = pg_saver.get_tuple(first)
    assert parent is not None
    assert parent.pending_writes == [("task", "lines", value)]
    # One copy of the value (the write's), in one transaction with the checkpoint.
    assert _referring(url, "t") == 1
    assert _rows_of(url, "t") == {
        "agentsnap_lg_checkpoints": 2,
        "agentsnap_lg_blobs": 1,
        "agentsnap_lg_task_writes": 1,
    }
    if url.startswith("postgresql"):
        newest_xmin = _query(
            url,
            "SELECT xmin FROM agentsnap_lg_checkpoints WHERE checkpoint_id = :c",
            c=newest.config["configurable"]["checkpoint_id"],
        )
        written_xmin = _query(url, "SELECT xmin FROM agentsnap_lg_task_writes")
        assert newest_xmin == written_xmin
        assert len(_transactions(url, "t")) == 2  # the first checkpoint's, and that one


def test_carried_writes_of_a_task_that_has_writes_already_are_merged_into_them(
    pg_saver: AgentsnapSaver,
) -> None:
    url = pg_saver.url
    first = pg_saver.put(_thread("t"), empty_checkpoint(), {"step": -1}, {})
    stored, later = ["first " * 60], ["second " * 60]
    # Stored alone: no checkpoint comes to claim them (the wait is cut short here).
    offered = _offered(pg_saver)
    with ThreadPoolExecutor(1) as pool:
        writing = pool.submit(pg_saver.put_writes, first, [("lines", stored)], "task")
        assert offered.wait(30)
        offer = pg_saver._written._offers[_parent_key(first)][0]
        assert pg_saver._written.withdraw(offer)
        offer.done.set()
        writing.result(timeout=30)
    assert _rows_of(url, "t")["agentsnap_lg_task_writes"] == 1
    # The task's writes again, carried by a checkpoint whose value is the new write: the
    # task keeps its first write, so the value is stored in its own row.
    offered.clear()
    with ThreadPoolExecutor(1) as pool:
        writing = pool.submit(
            pg_saver.put_writes, first, [("lines", later), (ERROR, "boom")], "task"
        )
        assert offered.wait(30)
        pg_saver.put(*_checkpoint_after(first, later, "1"))
        writing.result(timeout=30)
    newest = pg_saver.get_tuple(_thread("t"))
    assert newest is not None
    assert newest.checkpoint["channel_values"]["lines"] == later
    assert _referring(url, "t") == 0
    parent = pg_saver.get_tuple(first)
    assert parent is not None
    assert sorted(parent.pending_writes or [], key=str) == sorted(
        [("task", "lines", stored), ("task", ERROR, "boom")], key=str
    )


def _parent_key(config: Any) -> tuple[str, str, str]:
    configurable = config["configurable"]
    return configurable["thread_id"], configurable["checkpoint_ns"], configurable["checkpoint_id"]


def test_writes_that_no_checkpoint_claims_are_stored_by_themselves(url: str) -> None:
    saver = AgentsnapSaver(url)  # the writes' usual wait, a few milliseconds
    try:
        first = saver.put(_thread("alone"), empty_checkpoint(), {"step": -1}, {})
        saver.put_writes(first, [("lines", ["kept"])], "task")
        found = saver.get_tuple(first)
        assert found is not None
        assert found.pending_writes == [("task", "lines", ["kept"])]
    finally:
        saver.close()


async def test_an_asyncio_checkpoint_stores_its_parents_offered_writes(
    pg_saver: AgentsnapSaver,
) -> None:
    url = pg_saver.url
    first = await pg_saver.aput(_thread("a"), empty_checkpoint(), {"step": -1}, {})
    value = {"text": "b" * 300}
    offered = _offered(pg_saver)
    writing = asyncio.create_task(pg_saver.aput_writes(first, [("lines", value)], "task"))
    assert await asyncio.to_thread(offered.wait, 30)
    await pg_saver.aput(*_checkpoint_after(first, value, "1"))
    await asyncio.wait_for(writing, 30)
    newest = await pg_saver.aget_tuple(_thread("a"))
    assert newest is not None
    assert newest.checkpoint["channel_values"]["lines"] == value
    assert _referring(url, "a") == 1
    if url.startswith("postgresql"):
        assert len(_transactions(url, "a")) == 2
    await pg_saver.aclose()


# The migration that stores a written value once.


def test_downgrading_copies_referred_values_back_and_upgrading_reads_them(url: str) -> None:
    saver = AgentsnapSaver(url)
    try:
        final = _put_by_hand(saver, "t", ["one " * 80, "two " * 80])
        history = _history_of(saver, "t")
    finally:
        saver.close()
    assert _referring(url, "t") == 2

    migrate.downgrade(url, "0012")
    columns = _query(url, "SELECT * FROM agentsnap_lg_blobs")[0]
    assert len(columns) == 6  # the reference's columns are gone
    assert _query(
        url, "SELECT count(*) FROM agentsnap_lg_blobs WHERE value IS NULL AND value_type <> 'empty'"
    ) == [(0,)]

    migrate.upgrade(url)
    assert _referring(url, "t") == 0  # copies now
    saver = AgentsnapSaver(url)
    try:
        assert _history_of(saver, "t") == history
        assert history[0][2]["lines"] == final
    finally:
        saver.close()
