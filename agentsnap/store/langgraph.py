"""SQL on the LangGraph saver's tables that needs no LangGraph: removing a run's graph threads.

A graph agent keeps its LangGraph checkpoints on threads named after its run
(``"{run}:{agent}"``, ``"{run}:{agent}:2"``…). When its checkpointer is an
[`AgentsnapSaver`][agentsnap.integrations.langgraph.AgentsnapSaver] on the run's database,
those threads are rows of ``agentsnap_lg_checkpoints``, ``agentsnap_lg_blobs`` and
``agentsnap_lg_task_writes``, which
[`delete_run_threads`][agentsnap.store.langgraph.delete_run_threads] removes with the run.
This module imports SQLAlchemy only, so a program without the ``langgraph`` extra (the
``agentsnap`` command, for one) can call it.

Example:
    ```python
    import tempfile

    from sqlalchemy import create_engine

    from agentsnap.store.langgraph import delete_run_threads
    from agentsnap.store.migrate import upgrade

    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{folder}/agentsnap.db"
        upgrade(url)
        engine = create_engine(url)
        with engine.begin() as connection:  # commits at the end of the block
            print(delete_run_threads(connection, ["run-1", "run-2"]))  # 0: none stored
        engine.dispose()
    ```
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, delete, or_

from agentsnap.exceptions import ConfigurationError
from agentsnap.store.dialect import dialect_of
from agentsnap.store.tables import (
    LangGraphBlobRow,
    LangGraphCheckpointRow,
    LangGraphTaskWritesRow,
    table_of,
)

__all__ = ["delete_run_threads"]

_TABLES = tuple(
    table_of(row) for row in (LangGraphTaskWritesRow, LangGraphBlobRow, LangGraphCheckpointRow)
)
"""The saver's tables, the rows that refer to others first."""

_BATCH = 200
"""Run ids matched by one statement (two bound values each, well under SQLite's limit)."""


def delete_run_threads(connection: Connection, run_ids: Sequence[str]) -> int:
    """Delete the LangGraph checkpoints, channel values and task writes of agentsnap runs.

    A run's graph threads are those named ``"{run_id}:…"`` (as a graph agent names them);
    the match is exact, so ``%`` or ``_`` in a run id match only themselves and other runs'
    threads are never touched. Only the tables of
    [`AgentsnapSaver`][agentsnap.integrations.langgraph.AgentsnapSaver] in the connection's
    database are changed; checkpoints kept elsewhere are not seen.

    The deletes run in the connection's transaction, which the caller commits (or rolls
    back): the run's own rows can be deleted in the same transaction.

    Args:
        connection: A connection to an agentsnap database (SQLite or PostgreSQL) whose schema
            is up to date.
        run_ids: The runs; an empty sequence deletes nothing.

    Returns:
        How many rows were deleted, in the three tables together.

    Raises:
        ConfigurationError: ``run_ids`` is one string rather than a sequence of them.
    """
    if isinstance(run_ids, str):
        raise ConfigurationError(
            f"delete_run_threads takes a list of run ids, not one string: pass [{run_ids!r}]"
        )
    dialect = dialect_of(connection.dialect.name)
    unique = list(dict.fromkeys(run_ids))
    deleted = 0
    for start in range(0, len(unique), _BATCH):
        batch = unique[start : start + _BATCH]
        for table in _TABLES:
            column = table.c.thread_id
            condition = or_(*(dialect.starts_with(column, f"{run_id}:") for run_id in batch))
            deleted += connection.execute(delete(table).where(condition)).rowcount
    return deleted
