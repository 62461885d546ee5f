"""AgentsnapSaver passes LangGraph's checkpointer conformance suite on SQLite and PostgreSQL."""

from __future__ import annotations

import builtins
import importlib
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from postgres_db import postgres_url_or_skip

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate

from agentsnap.integrations import MissingExtraError
from agentsnap.integrations.langgraph import AgentsnapSaver


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
    assert report.passed_all_base(), "the saver fails LangGraph's conformance suite"


def test_the_sync_methods_round_trip_a_checkpoint(url: str) -> None:
    saver = AgentsnapSaver(url)
    try:
        config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        version = saver.get_next_version(None, None)
        assert saver.get_next_version(version, None) > version
        checkpoint: Any = {
            "v": 4,
            "id": "1",
            "ts": "2026-11-22T00:00:00+00:00",
            "channel_values": {"a": [1, 2], "b": "x"},
            "channel_versions": {"a": version, "b": version},
            "versions_seen": {},
            "updated_channels": None,
        }
        saved = saver.put(config, checkpoint, {"source": "input", "step": -1}, {"a": version})
        saver.put(saved, {**checkpoint, "id": "2"}, {"source": "loop", "step": 0}, {})
        saver.put_writes(saved, [("a", {"k": 1})], task_id="task")
        newest = saver.get_tuple(config)
        assert newest is not None
        assert newest.checkpoint["id"] == "2"
        assert newest.checkpoint["channel_values"] == {"a": [1, 2]}  # b was never stored
        first = saver.get_tuple(saved)
        assert first is not None
        assert first.pending_writes == [("task", "a", {"k": 1})]
        assert [t.checkpoint["id"] for t in saver.list(config, filter={"source": "loop"})] == ["2"]
        saver.delete_thread("t")
        assert saver.get_tuple(config) is None
    finally:
        saver.close()


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
