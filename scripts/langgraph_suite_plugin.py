"""A pytest plug-in that adds ``AgentsnapSaver`` to the checkpointers of LangGraph's own tests.

LangGraph's test suite (the ``tests/`` of its source distribution) runs most graph tests once
per checkpointer, through two fixtures of its ``tests/conftest.py``: ``sync_checkpointer``
and ``async_checkpointer``. Loaded with ``-p langgraph_suite_plugin``, this plug-in gives
both fixtures one more parameter, ``agentsnap``: an ``AgentsnapSaver`` on a fresh SQLite
file, so that ``-k agentsnap`` selects every checkpointer case on agentsnap's saver. Their
files are not changed: the fixtures are replaced on the conftest module when pytest
registers it, before it reads its fixtures. ``scripts/langgraph_suite.py`` runs it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentsnap.integrations.langgraph import AgentsnapSaver

AGENTSNAP = "agentsnap"
"""The fixtures' parameter (and test id) for agentsnap's saver."""

ALLOWED_MSGPACK_MODULES: list[tuple[str, ...]] = [
    # Classes that LangGraph's tests keep in graph state, defined in the tests themselves;
    # an application lists its own types the same way.
    ("tests.agents", "AgentAction"),
    ("tests.agents", "AgentFinish"),
    ("tests.test_pydantic", "FunctionalState"),
    # A LangChain class a test keeps in state, which is not among LangGraph's safe types.
    ("langchain_core.agents", "AgentAction"),
    ("langchain_core.agents", "AgentFinish"),
]
"""Test-only types the saver may rebuild from msgpack, besides LangGraph's safe types.

The suite's own classes, and for this suite only: the saver's default stays strict.
"""


def _saver(folder: Path) -> AgentsnapSaver:
    saver = AgentsnapSaver(
        f"sqlite:///{folder / 'agentsnap.db'}", allowed_msgpack_modules=ALLOWED_MSGPACK_MODULES
    )
    # Create agentsnap's schema now, as a deployed database has it: a few tests time how
    # soon a graph streams, and would count the first use's migrations in.
    saver.get_tuple({"configurable": {"thread_id": "schema"}})
    return saver


def _params(original: Any) -> list[Any]:
    marker = getattr(original, "_fixture_function_marker", None)
    return [*(getattr(marker, "params", None) or ()), AGENTSNAP]


def _function(original: Any) -> Callable[..., Any]:
    unwrap = getattr(original, "_get_wrapped_function", None)
    return unwrap() if unwrap is not None else original  # type: ignore[no-any-return]


def _sync_checkpointer(original: Any) -> Any:
    function = _function(original)

    @pytest.fixture(params=_params(original))
    def sync_checkpointer(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
        if request.param != AGENTSNAP:
            yield from function(request)
            return
        saver = _saver(tmp_path)
        try:
            yield saver
        finally:
            saver.close()

    return sync_checkpointer


def _async_checkpointer(original: Any) -> Any:
    function = _function(original)

    @pytest.fixture(params=_params(original))
    async def async_checkpointer(
        request: pytest.FixtureRequest, tmp_path: Path
    ) -> AsyncIterator[Any]:
        if request.param != AGENTSNAP:
            async for checkpointer in function(request):
                yield checkpointer
            return
        saver = _saver(tmp_path)
        try:
            yield saver
        finally:
            await saver.aclose()

    return async_checkpointer


def pytest_plugin_registered(plugin: Any, manager: pytest.PytestPluginManager) -> None:
    """Replace the checkpointer fixtures of LangGraph's ``tests/conftest.py`` when it loads."""
    path = Path(getattr(plugin, "__file__", None) or "-")
    if path.name != "conftest.py" or path.parent.name != "tests":
        return
    for name, extend in (
        ("sync_checkpointer", _sync_checkpointer),
        ("async_checkpointer", _async_checkpointer),
    ):
        original = getattr(plugin, name, None)
        if original is not None:
            setattr(plugin, name, extend(original))
