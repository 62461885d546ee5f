"""The LangGraph storage contract: what a ``GraphCheckpointStore`` does, on each database.

``AgentsnapSaver`` encodes checkpoints and hands the rows to its storage; these tests hold the
storage alone to what the saver relies on, on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from postgres_db import postgres_url_or_skip

from agentsnap import MemoryStore, Store
from agentsnap.store.graph import (
    EMPTY,
    GraphCheckpointIndex,
    GraphCheckpointStore,
    StoredCheckpoint,
    StoredValue,
)
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_graph import SqlGraphStore


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def graphs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GraphCheckpointStore]:
    """A graph checkpoint store on each database, empty."""
    url = (
        f"sqlite:///{tmp_path / 'graphs.db'}"
        if request.param == "sqlite"
        else postgres_url_or_skip()
    )
    store = SqlGraphStore(url)
    try:
        yield store
    finally:
        store.close()


def _checkpoint(
    checkpoint_id: str, parent: str | None = None, *, thread: str = "t", ns: str = ""
) -> StoredCheckpoint:
    return StoredCheckpoint(
        thread, ns, checkpoint_id, parent, "msgpack", checkpoint_id.encode(), "json", b"{}", None
    )


def _value(channel: str, version: str, data: bytes | None, *, thread: str = "t") -> StoredValue:
    return StoredValue(thread, "", channel, version, EMPTY if data is None else "bytes", data)


def test_a_checkpoint_reads_back_with_the_values_of_its_versions(
    graphs: GraphCheckpointStore,
) -> None:
    graphs.put_checkpoint(_checkpoint("1"), [_value("a", "v1", b"one"), _value("b", "v1", None)])
    graphs.put_checkpoint(_checkpoint("2", "1"), [_value("a", "v2", b"two")])
    with graphs.reading() as reader:
        assert reader.checkpoint("t", "", None) == _checkpoint("2", "1")  # the newest
        assert reader.checkpoint("t", "", "1") == _checkpoint("1")
        assert reader.checkpoint("t", "other", None) is None
        # Only the versions asked for, and no value for a channel that had none.
        assert sorted(reader.values("t", "", {"a": "v1", "b": "v1"})) == [("a", "bytes", b"one")]
        assert reader.values("t", "", {"a": "v2"}) == [("a", "bytes", b"two")]
        assert reader.values("t", "", {}) == []


def test_a_value_is_stored_once_and_a_checkpoint_is_replaced(
    graphs: GraphCheckpointStore,
) -> None:
    graphs.put_checkpoint(_checkpoint("1"), [_value("a", "v1", b"first")])
    replaced = _checkpoint("1")._replace(meta=b'{"step": 1}')
    graphs.put_checkpoint(replaced, [_value("a", "v1", b"second")])
    with graphs.reading() as reader:
        assert reader.checkpoint("t", "", "1") == replaced
        assert reader.values("t", "", {"a": "v1"}) == [("a", "bytes", b"first")]


def test_checkpoints_are_listed_newest_first_with_their_filters(
    graphs: GraphCheckpointStore,
) -> None:
    for thread in ("t", "u"):
        for number in "123":
            graphs.put_checkpoint(_checkpoint(number, thread=thread), [])
    with graphs.reading() as reader:
        ids = [(c.thread_id, c.checkpoint_id) for c in reader.checkpoints()]
        assert ids == [("t", "3"), ("u", "3"), ("t", "2"), ("u", "2"), ("t", "1"), ("u", "1")]
        assert [c.checkpoint_id for c in reader.checkpoints(thread_id="u", before="3")] == [
            "2",
            "1",
        ]
        assert len(list(reader.checkpoints(thread_id="t", limit=2))) == 2
        assert [c.checkpoint_id for c in reader.checkpoints(checkpoint_id="2")] == ["2", "2"]
        assert list(reader.checkpoints(checkpoint_ns="sub")) == []


def test_task_writes_are_stored_then_merged_by_the_caller(graphs: GraphCheckpointStore) -> None:
    key = ("t", "", "1", "task")
    merged: list[tuple[str, bytes]] = []

    def merge(path: str, stored: bytes) -> tuple[str, bytes]:
        merged.append((path, stored))
        return path, stored + b"+more"

    graphs.put_task_writes(key, "path", b"writes", merge)
    assert merged == []  # the first writes of a task go in as they are
    graphs.put_task_writes(key, "", b"more", merge)
    assert merged == [("path", b"writes")]
    with graphs.reading() as reader:
        (found,) = reader.task_writes("t", "", "1")
        assert found == ("task", "path", b"writes+more")
        assert reader.task_writes("t", "", "2") == []


def test_a_thread_is_copied_and_deleted_whole(graphs: GraphCheckpointStore) -> None:
    graphs.put_checkpoint(_checkpoint("1"), [_value("a", "v1", b"one")])
    graphs.put_task_writes(("t", "", "1", "task"), "", b"w", lambda p, s: (p, s))
    graphs.copy_thread("t", "copy")
    graphs.delete_thread("t")
    with graphs.reading() as reader:
        assert reader.checkpoint("t", "", None) is None
        assert reader.values("t", "", {"a": "v1"}) == []
        assert reader.checkpoint("copy", "", "1") == _checkpoint("1", thread="copy")
        assert reader.values("copy", "", {"a": "v1"}) == [("a", "bytes", b"one")]
        assert reader.task_writes("copy", "", "1") == [("task", "", b"w")]


def test_pruning_keeps_the_newest_checkpoint_and_the_values_it_uses(
    graphs: GraphCheckpointStore,
) -> None:
    graphs.put_checkpoint(_checkpoint("1"), [_value("a", "v1", b"one")])
    graphs.put_checkpoint(_checkpoint("2", "1"), [_value("a", "v2", b"two")])
    versions = {"1": {"a": "v1"}, "2": {"a": "v2"}}

    def load(value_type: str, value: bytes) -> dict[str, object]:
        return {"channel_values": {}, "channel_versions": versions[value.decode()]}

    graphs.prune(["t"], "keep_latest", load, lambda meta_type, meta: {})
    with graphs.reading() as reader:
        assert [c.checkpoint_id for c in reader.checkpoints(thread_id="t")] == ["2"]
        assert reader.values("t", "", {"a": "v1"}) == []
        assert reader.values("t", "", {"a": "v2"}) == [("a", "bytes", b"two")]


def test_listing_graph_checkpoints_is_an_optional_part_of_a_store(tmp_path: Path) -> None:
    assert not hasattr(Store, "list_graph_checkpoints")
    assert isinstance(MemoryStore(), GraphCheckpointIndex)
    assert isinstance(SqlStore(f"sqlite:///{tmp_path / 'runs.db'}"), GraphCheckpointIndex)
