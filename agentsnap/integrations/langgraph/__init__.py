"""LangGraph integration: compiled graphs as agents, and a checkpointer on agentsnap's tables.

Install it with ``pip install 'agentsnap[langgraph]'``. Importing ``agentsnap`` alone never
imports LangGraph; importing this module does, and raises
[`MissingExtraError`][agentsnap.integrations.MissingExtraError] when LangGraph is missing.

- [`GraphAgent`][agentsnap.integrations.langgraph.GraphAgent] runs a compiled graph as an
  agent: each message invokes it, its result becomes messages, its checkpoint is part of the
  agent's snapshots, and a rollback sends the graph back with the other agents.
- [`langchain_tool`][agentsnap.integrations.langgraph.langchain_tool] hands an agentsnap tool
  to a tool-calling model or a ``ToolNode``, keeping idempotency keys and the ledger.
- [`AgentsnapSaver`][agentsnap.integrations.langgraph.AgentsnapSaver] is a LangGraph
  ``BaseCheckpointSaver`` that keeps checkpoints in agentsnap's SQLite or PostgreSQL
  database, each channel value stored once per version; a graph agent needs a persistent
  checkpointer like it to be resumed or forked in another process.
- [`delete_run_threads`][agentsnap.store.langgraph.delete_run_threads] removes the graph
  checkpoints of agentsnap runs from the saver's tables (importable without LangGraph from
  [`agentsnap.store.langgraph`][agentsnap.store.langgraph]).

Example:
    ```python
    import tempfile

    from agentsnap.integrations.langgraph import AgentsnapSaver

    with tempfile.TemporaryDirectory() as folder:
        saver = AgentsnapSaver(f"sqlite:///{folder}/agentsnap.db")
        try:
            config = {"configurable": {"thread_id": "t1"}}
            print(saver.get_tuple(config))  # None: nothing saved on this thread yet
        finally:
            saver.close()
    ```
"""

from __future__ import annotations

from agentsnap.integrations import needs_extra

with needs_extra("langgraph", "langgraph"):
    import langchain_core  # noqa: F401
    import langgraph  # noqa: F401

from agentsnap.integrations.langgraph._agent import (
    CheckpointMissing,
    GraphAgent,
    GraphState,
    Outgoing,
    as_json,
    current_context,
)
from agentsnap.integrations.langgraph._saver import AgentsnapSaver
from agentsnap.integrations.langgraph._tools import langchain_tool
from agentsnap.store.langgraph import delete_run_threads

__all__ = [
    "AgentsnapSaver",
    "CheckpointMissing",
    "GraphAgent",
    "GraphState",
    "Outgoing",
    "as_json",
    "current_context",
    "delete_run_threads",
    "langchain_tool",
]
