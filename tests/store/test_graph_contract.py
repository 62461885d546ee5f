"""The LangGraph storage contract: what a ``GraphCheckpointStore`` does, on each database.

``AgentsnapSaver`` encodes checkpoints and hands the rows to its storage; these tests hold the
storage alone to what the saver relies on, in memory, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from postgres_db import postgres_url_or_skip

from agentsnap import MemoryStore, Store
from agentsnap.exceptions import ConfigurationError
from agentsnap.store.graph import (
    EMPTY,
    CheckpointFilter,
    GraphCheckpointIndex,
    GraphCheckpointStore,
    Load,
    StoredCheckpoint,
    StoredValue,
    pack_writes,
)
from agentsnap.store.memory_graph import MemoryGraphStore
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_graph import SqlGraphStore


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def graphs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GraphCheckpointStore]:
    """A graph checkpoint store in memory and on each database, empty."""
    if request.param == "memory":
        yield MemoryGraphStore()
        return
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
        ids = [(c.thread_id, c.checkpoint_id) for c in reader.checkpoints(CheckpointFilter())]
        assert ids == [("t", "3"), ("u", "3"), ("t", "2"), ("u", "2"), ("t", "1"), ("u", "1")]
        assert [
            c.checkpoint_id for c in reader.checkpoints(CheckpointFilter(thread_id="u", before="3"))
        ] == [
            "2",
            "1",
        ]
        assert len(list(reader.checkpoints(CheckpointFilter(thread_id="t", limit=2)))) == 2
        assert [
            c.checkpoint_id for c in reader.checkpoints(CheckpointFilter(checkpoint_id="2"))
        ] == ["2", "2"]
        assert list(reader.checkpoints(CheckpointFilter(checkpoint_ns="sub"))) == []


def test_an_empty_id_or_bound_is_no_filter_and_a_negative_limit_lists_nothing(
    graphs: GraphCheckpointStore,
) -> None:
    for number in "12":
        graphs.put_checkpoint(_checkpoint(number, thread="t"), [])
    with graphs.reading() as reader:
        everything = CheckpointFilter(checkpoint_id="", before="")
        assert [c.checkpoint_id for c in reader.checkpoints(everything)] == ["2", "1"]
        assert list(reader.checkpoints(CheckpointFilter(limit=-1))) == []
        assert list(reader.checkpoints(CheckpointFilter(limit=0))) == []
        assert reader.checkpoint("t", "", "") == _checkpoint("2")


@pytest.mark.parametrize("limit", ["3", 2.5, True])
def test_a_limit_that_is_not_a_whole_number_is_refused(limit: object) -> None:
    with pytest.raises(ConfigurationError, match="whole number or None, not"):
        CheckpointFilter(limit=limit)  # type: ignore[arg-type]


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
        assert [c.checkpoint_id for c in reader.checkpoints(CheckpointFilter(thread_id="t"))] == [
            "2"
        ]
        assert reader.values("t", "", {"a": "v1"}) == []
        assert reader.values("t", "", {"a": "v2"}) == [("a", "bytes", b"two")]


def test_listing_graph_checkpoints_is_an_optional_part_of_a_store(tmp_path: Path) -> None:
    assert not hasattr(Store, "list_graph_checkpoints")
    assert isinstance(MemoryStore(), GraphCheckpointIndex)
    assert isinstance(SqlStore(f"sqlite:///{tmp_path / 'runs.db'}"), GraphCheckpointIndex)


# A channel value stored once: a reference to the task write that holds it.


def _written(value: bytes, *, idx: int = 0, channel: str = "a") -> bytes:
    return pack_writes([(-3, "__interrupt__", "bytes", b"special"), (idx, channel, "bytes", value)])


def _reference(
    channel: str, version: str, checkpoint_id: str, task_id: str, idx: int = 0
) -> StoredValue:
    return StoredValue("t", "", channel, version, "bytes", None, checkpoint_id, task_id, idx)


def _load_versions(versions: dict[str, dict[str, str]]) -> Load:
    def load(value_type: str, value: bytes) -> dict[str, object]:
        return {"channel_values": {}, "channel_versions": versions[value.decode()]}

    return load


def _referring_history(graphs: GraphCheckpointStore, *, run: str | None = None) -> None:
    """Checkpoint 1, a task's write of ``a`` against it, and checkpoint 2 whose ``a`` is it."""
    graphs.put_checkpoint(_checkpoint("1"), [_value("a", "v1", b"one")])
    assert graphs.put_task_writes(("t", "", "1", "task"), "", _written(b"two"), _no_merge)
    graphs.put_checkpoint(
        _checkpoint("2", "1")._replace(run_id=run), [_reference("a", "v2", "1", "task")]
    )


def _no_merge(path: str, stored: bytes) -> tuple[str, bytes]:
    return path, stored


def test_a_value_that_refers_to_a_write_reads_back_as_the_written_value(
    graphs: GraphCheckpointStore,
) -> None:
    _referring_history(graphs)
    with graphs.reading() as reader:
        assert reader.values("t", "", {"a": "v2"}) == [("a", "bytes", b"two")]
        assert reader.values("t", "", {"a": "v1"}) == [("a", "bytes", b"one")]
        # The write is still the first checkpoint's pending write.
        assert reader.task_writes("t", "", "1") == [("task", "", _written(b"two"))]


def test_writes_merged_into_stored_ones_are_not_reported_as_stored_as_given(
    graphs: GraphCheckpointStore,
) -> None:
    key = ("t", "", "1", "task")
    assert graphs.put_task_writes(key, "", _written(b"two"), _no_merge) is True
    assert graphs.put_task_writes(key, "", _written(b"other"), _no_merge) is False


def test_a_referred_write_outlives_a_merge_of_the_task_s_writes(
    graphs: GraphCheckpointStore,
) -> None:
    _referring_history(graphs)

    def merge(path: str, stored: bytes) -> tuple[str, bytes]:
        # What the saver does: a regular write keeps its first value; a special one is replaced.
        return path, pack_writes(
            [(-3, "__interrupt__", "bytes", b"new"), (0, "a", "bytes", b"two")]
        )

    graphs.put_task_writes(("t", "", "1", "task"), "", _written(b"ignored"), merge)
    with graphs.reading() as reader:
        assert reader.values("t", "", {"a": "v2"}) == [("a", "bytes", b"two")]


def test_pruning_the_write_a_kept_value_refers_to_keeps_the_value(
    graphs: GraphCheckpointStore,
) -> None:
    _referring_history(graphs)
    load = _load_versions({"1": {"a": "v1"}, "2": {"a": "v2"}})
    graphs.prune(["t"], "keep_latest", load, lambda meta_type, meta: {})
    with graphs.reading() as reader:
        assert [c.checkpoint_id for c in reader.checkpoints(CheckpointFilter(thread_id="t"))] == [
            "2"
        ]
        assert reader.task_writes("t", "", "1") == []  # the write went with its checkpoint
        assert reader.values("t", "", {"a": "v2"}) == [("a", "bytes", b"two")]
        assert reader.values("t", "", {"a": "v1"}) == []


def test_deleting_the_run_of_a_referred_write_keeps_the_value(
    graphs: GraphCheckpointStore,
) -> None:
    _referring_history(graphs, run="second")
    graphs.put_checkpoint(_checkpoint("1")._replace(run_id="first"), [])
    load = _load_versions({"1": {"a": "v1"}, "2": {"a": "v2"}})
    graphs.delete_for_runs(["first"], load)
    with graphs.reading() as reader:
        assert [c.checkpoint_id for c in reader.checkpoints(CheckpointFilter(thread_id="t"))] == [
            "2"
        ]
        assert reader.task_writes("t", "", "1") == []
        assert reader.values("t", "", {"a": "v2"}) == [("a", "bytes", b"two")]
        assert reader.values("t", "", {"a": "v1"}) == []
    # Deleting the run of the checkpoint that refers to it leaves nothing behind.
    graphs.delete_for_runs(["second"], load)
    with graphs.reading() as reader:
        assert list(reader.checkpoints(CheckpointFilter(thread_id="t"))) == []
        assert reader.values("t", "", {"a": "v2"}) == []


def test_a_copied_thread_refers_to_its_own_copy_of_the_write(
    graphs: GraphCheckpointStore,
) -> None:
    _referring_history(graphs)
    graphs.copy_thread("t", "copy")
    graphs.delete_thread("t")
    with graphs.reading() as reader:
        assert reader.values("t", "", {"a": "v2"}) == []
        assert reader.task_writes("t", "", "1") == []
        assert reader.values("copy", "", {"a": "v2"}) == [("a", "bytes", b"two")]
        assert reader.task_writes("copy", "", "1") == [("task", "", _written(b"two"))]
    load = _load_versions({"1": {"a": "v1"}, "2": {"a": "v2"}})
    graphs.prune(["copy"], "keep_latest", load, lambda meta_type, meta: {})
    with graphs.reading() as reader:
        assert reader.values("copy", "", {"a": "v2"}) == [("a", "bytes", b"two")]


def test_deleting_a_thread_deletes_values_and_the_writes_they_refer_to(
    graphs: GraphCheckpointStore,
) -> None:
    _referring_history(graphs)
    load = _load_versions({"1": {"a": "v1"}, "2": {"a": "v2"}})
    graphs.prune(["t"], "delete", load, lambda meta_type, meta: {})
    with graphs.reading() as reader:
        assert list(reader.checkpoints(CheckpointFilter(thread_id="t"))) == []
        assert reader.values("t", "", {"a": "v1"}) == []
        assert reader.values("t", "", {"a": "v2"}) == []
        assert reader.task_writes("t", "", "1") == []


def test_a_lineage_follows_parents_nearest_first(graphs: GraphCheckpointStore) -> None:
    graphs.put_checkpoint(_checkpoint("1"), [])
    graphs.put_checkpoint(_checkpoint("2", "1"), [])
    graphs.put_checkpoint(_checkpoint("3", "2"), [])
    graphs.put_checkpoint(_checkpoint("4", "2"), [])  # a branch beside 3
    graphs.put_checkpoint(_checkpoint("9", "1", ns="sub"), [])
    with graphs.reading() as reader:
        assert [c.checkpoint_id for c in reader.lineage("t", "", "3")] == ["3", "2", "1"]
        assert [c.checkpoint_id for c in reader.lineage("t", "", None)] == ["4", "2", "1"]
        assert next(reader.lineage("t", "", "2")) == _checkpoint("2", "1")
        assert [c.checkpoint_id for c in reader.lineage("t", "sub", None)] == ["9"]
        assert list(reader.lineage("t", "", "8")) == []
        assert list(reader.lineage("u", "", None)) == []
    # Put again under a descendant, a checkpoint's parents make a loop: given once each.
    graphs.put_checkpoint(_checkpoint("1", "3"), [])
    with graphs.reading() as reader:
        assert [c.checkpoint_id for c in reader.lineage("t", "", "3")] == ["3", "2", "1"]


def test_a_long_lineage_is_read_whole(graphs: GraphCheckpointStore) -> None:
    ids = [f"{number:04}" for number in range(1000)]
    for parent, checkpoint_id in zip([None, *ids], ids, strict=False):
        graphs.put_checkpoint(_checkpoint(checkpoint_id, parent), [])
    with graphs.reading() as reader:
        assert [c.checkpoint_id for c in reader.lineage("t", "", None)] == ids[::-1]


def test_values_and_writes_are_read_for_many_versions_and_checkpoints(
    graphs: GraphCheckpointStore,
) -> None:
    _referring_history(graphs)
    graphs.put_checkpoint(
        _checkpoint("3", "2"), [_value("a", "v3", None), _value("b", "v3", b"bee")]
    )
    graphs.put_task_writes(("t", "", "3", "other"), "~p", b"w3", _no_merge)
    with graphs.reading() as reader:
        wanted = {("a", "v1"), ("a", "v2"), ("a", "v3"), ("b", "v3"), ("b", "v1"), ("c", "v9")}
        assert reader.values_at("t", "", wanted) == {
            ("a", "v1"): ("bytes", b"one"),
            ("a", "v2"): ("bytes", b"two"),  # from the write it refers to
            ("b", "v3"): ("bytes", b"bee"),
        }
        assert reader.values_at("t", "", set()) == {}
        assert reader.writes_at("t", "", ["1", "2", "3"]) == {
            "1": [("task", "", _written(b"two"))],
            "3": [("other", "~p", b"w3")],
        }
        assert reader.writes_at("t", "", []) == {}
