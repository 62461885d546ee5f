"""What the commands print with ``--json`` that no query of ``agentsnap.inspect`` returns.

Each is a pydantic model, built from the library's records and printed whole with
``model_dump(mode="json")`` (``_format.print_json``): the keys and their order are the
fields'. The listings of ``agentsnap.inspect`` have their own types
([`RunRow`][agentsnap.inspect.RunRow]).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

# pydantic reads the annotations at run time
from agentsnap._views import IsoTime, Picked, SnapshotDiff, picked
from agentsnap.ledger import ToolCallStatus
from agentsnap.records import RunStatus

if TYPE_CHECKING:
    from agentsnap.records import Snapshot
    from agentsnap.store.retention import DeleteReport
    from agentsnap.store.spool import ReplayReport, Spool


class SchemaUpgraded(BaseModel):
    """``db upgrade --json``: where the schema is now."""

    revision: str | None
    newest: str | None
    up_to_date: bool


class SchemaState(BaseModel):
    """``db current --json``: whether there is a database, and its schema's revision."""

    exists: bool
    revision: str | None
    newest: str | None
    up_to_date: bool


class AppliedWrite(BaseModel):
    """A spooled write ``db recover`` dealt with."""

    run_id: str
    op: str
    outcome: str
    description: str


class KeptWrites(BaseModel):
    """The writes of one run ``db recover`` left in the spool, and why."""

    run_id: str
    count: int
    file: str
    error: str | None


class Recovery(BaseModel):
    """``db recover --json``: each write dealt with, what is left and why."""

    spool: str
    applied: list[AppliedWrite]
    kept: list[KeptWrites]
    complete: bool

    @classmethod
    def of(cls, report: ReplayReport, spool: Spool) -> Recovery:
        """The document of a replay of ``spool``."""
        return cls(
            spool=str(spool.directory),
            applied=[
                AppliedWrite(
                    run_id=done.op.run_id,
                    op=done.op.op,
                    outcome=done.outcome.value,
                    description=done.op.describe(),
                )
                for done in report.applied
            ],
            kept=[
                KeptWrites(
                    run_id=run,
                    count=count,
                    file=str(spool.file(run)),
                    error=None if report.errors.get(run) is None else str(report.errors[run]),
                )
                for run, count in sorted(report.kept.items())
            ],
            complete=report.complete,
        )


class ResolvedCall(Picked):
    """``tools resolve --json``: the call's outcome as now recorded."""

    key: str
    status: ToolCallStatus
    result: Any
    error: str | None


class Removal(BaseModel):
    """``runs delete --json`` and ``runs prune --json``: what went (or, dry, would go)."""

    dry_run: bool
    run_ids: list[str]
    rows: dict[str, int]
    total_rows: int
    skipped: dict[str, str]
    reclaimed_bytes: int | None
    streams: list[str] | None = None
    """The runs' NATS streams deleted: only with ``--nats`` (the key is left out without)."""

    @classmethod
    def of(cls, report: DeleteReport, streams: list[str] | None) -> Removal:
        """The document of a delete report, with the streams ``--nats`` found."""
        return picked(cls, report, streams=streams)

    def document(self) -> dict[str, Any]:
        """The JSON printed: without ``streams`` when ``--nats`` was not given."""
        return self.model_dump(mode="json", exclude={"streams"} if self.streams is None else None)


class Forked(Picked):
    """``fork --json``: the new run."""

    id: str
    name: str | None
    parent_run_id: str | None
    parent_snapshot_id: str | None


class SnapshotRef(BaseModel):
    """A snapshot named in ``bisect --json``."""

    id: str
    seq: int
    completed_at: IsoTime | None

    @classmethod
    def of(cls, snapshot: Snapshot | None) -> SnapshotRef | None:
        """The reference to ``snapshot`` (``None`` for none)."""
        if snapshot is None:
            return None
        return picked(cls, snapshot)


class Bisection(BaseModel):
    """``bisect --json``: the first bad snapshot, the last good one, and how to fork there."""

    run_id: str
    first_bad: SnapshotRef | None
    last_good: SnapshotRef | None
    holds_at_first: bool
    checked: int
    snapshots: int
    diff: SnapshotDiff | None
    fork_command: str | None


class Outcome(Picked):
    """``run --json`` and ``resume --json``: how the run ended."""

    id: str
    status: RunStatus
    status_reason: str | None
    traceback: str | None
    finished_at: IsoTime | None


class Cancelled(Picked):
    """``cancel --json``: where the run stands after the request."""

    id: str
    status: RunStatus
    status_reason: str | None
