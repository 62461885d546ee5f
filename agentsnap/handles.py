"""Handles to work in progress: a snapshot being taken, to await for its outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from agentsnap.exceptions import SnapshotInProgress

if TYPE_CHECKING:
    from agentsnap.exceptions import SnapshotFailed
    from agentsnap.records import Snapshot

__all__ = ["SnapshotHandle"]


class SnapshotHandle:
    """A snapshot in progress; await it for the completed [`Snapshot`][agentsnap.Snapshot].

    Awaiting raises [`SnapshotFailed`][agentsnap.SnapshotFailed] if the snapshot could not be
    completed.
    """

    __slots__ = ("_done", "_error", "_result", "id", "initiator", "seq")

    def __init__(self, snapshot_id: str, seq: int, initiator: str) -> None:
        self.id = snapshot_id
        """Snapshot id."""
        self.seq = seq
        """Number of the snapshot within the run."""
        self.initiator = initiator
        """Who started it."""
        self._done = asyncio.Event()
        self._result: Snapshot | None = None
        self._error: SnapshotFailed | None = None

    def done(self) -> bool:
        """Whether the snapshot completed or failed."""
        return self._done.is_set()

    def result(self) -> Snapshot:
        """The completed snapshot.

        Raises:
            SnapshotFailed: The snapshot failed.
            SnapshotInProgress: It is still in progress (await the handle first); also a
                ``RuntimeError``.
        """
        if self._error is not None:
            raise self._error
        if self._result is None:
            raise SnapshotInProgress(self.seq)
        return self._result

    async def wait(self) -> Snapshot:
        """Wait for the snapshot to complete and be written, and return it.

        This waits as long as the store keeps retrying a failing write (its retry policy's
        deadline), then raises ``SnapshotFailed``; to wait less, wrap it in
        ``asyncio.timeout()`` (the snapshot goes on).

        Raises:
            SnapshotFailed: The snapshot failed, or could not be written.
        """
        await self._done.wait()
        return self.result()

    async def settled(self) -> None:
        """Wait until the snapshot is written or has failed; never raise."""
        await self._done.wait()

    def __await__(self) -> Generator[Any, None, Snapshot]:
        return self.wait().__await__()

    def resolve(self, snapshot: Snapshot | None, error: SnapshotFailed | None) -> None:
        """Settle the handle: the coordinator calls it once, with the outcome."""
        self._result = snapshot
        self._error = error
        self._done.set()

    def __repr__(self) -> str:
        state = "failed" if self._error else "complete" if self._result else "in progress"
        return f"<SnapshotHandle {self.seq} {self.id[:8]} {state}>"
