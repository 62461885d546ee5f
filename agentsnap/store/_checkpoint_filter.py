"""The filters of ``GraphReader.checkpoints``, read the same way by every graph store.

A thread or namespace given as ``None`` is no filter; a checkpoint id or ``before`` bound
that is ``None`` or empty is none either (LangGraph passes ``""`` for "no checkpoint"); a
negative limit lists nothing. The stores build their queries from one
[`CheckpointFilter`][agentsnap.store._checkpoint_filter.CheckpointFilter], so these rules
are written once.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentsnap.store.graph import StoredCheckpoint

__all__ = ["CheckpointFilter"]


@dataclass(frozen=True)
class CheckpointFilter:
    """Which checkpoints ``GraphReader.checkpoints`` lists, newest first."""

    thread_id: str | None = None
    """Only this thread's."""
    checkpoint_ns: str | None = None
    """Only this namespace's."""
    checkpoint_id: str | None = None
    """Only the checkpoint with this id (``None`` once normalised when empty)."""
    before: str | None = None
    """Only checkpoints with a smaller id (``None`` once normalised when empty)."""
    limit: int | None = None
    """At most this many (never below 0)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "checkpoint_id", self.checkpoint_id or None)
        object.__setattr__(self, "before", self.before or None)
        if self.limit is not None:
            object.__setattr__(self, "limit", max(self.limit, 0))

    def equal(self) -> dict[str, str]:
        """The columns that must equal a value, by column name."""
        given = {
            "thread_id": self.thread_id,
            "checkpoint_ns": self.checkpoint_ns,
            "checkpoint_id": self.checkpoint_id,
        }
        return {column: value for column, value in given.items() if value is not None}

    def matches(self, row: StoredCheckpoint) -> bool:
        """Whether ``row`` passes every filter (the limit aside)."""
        if any(getattr(row, column) != value for column, value in self.equal().items()):
            return False
        return self.before is None or row.checkpoint_id < self.before
