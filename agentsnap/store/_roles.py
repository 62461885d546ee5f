"""The store's contract by role: what each user of a store needs, and nothing more.

Each protocol here is re-exported, and documented, by [`agentsnap.store`][agentsnap.store],
which tells which user needs which role.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

from agentsnap.messages import JsonValue
from agentsnap.records import (
    AgentLease,
    AgentVersion,
    JournalSegment,
    ReplaySegment,
    RollbackInfo,
    RunInfo,
    RunLease,
    RunOwner,
    RunStatus,
    Snapshot,
    SnapshotPart,
    SnapshotSummary,
)

__all__ = [
    "DistributedParts",
    "DistributedStore",
    "InspectedStore",
    "KeptInDatabase",
    "OneProcessStore",
    "RunLeases",
    "RunLog",
    "RunQueries",
    "RunStore",
]


@runtime_checkable
class RunStore(Protocol):
    """Runs, their snapshots and rollbacks: the role every user of a store needs.

    **Interrupted runs.** ``get_run`` reports
    [`RunStatus.INTERRUPTED`][agentsnap.RunStatus.INTERRUPTED] for a run recorded as
    running that has no live owner: it has no lease, or its lease expired, or the owning
    process of this host no longer exists.

    **Fencing.** A store that is also [`RunLeases`][agentsnap.store.RunLeases] checks the
    fence on this role's writes (``save_snapshot``, ``save_rollback``, ``finish_run``,
    ``set_parent``, ``save_state_schemas``).
    """

    async def create_run(self, run: RunInfo) -> None:
        """Record that a run started (a run id already present is left as it is)."""

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        """Write a completed or failed snapshot, all or nothing."""

    async def finish_run(
        self,
        run_id: str,
        status: RunStatus,
        finished_at: datetime | None,
        reason: str | None = None,
    ) -> None:
        """Record where a run stands: how and when it ended, and why (``reason``).

        A run that is resumed is recorded as running again, with no end and no reason.

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def save_traceback(self, run_id: str, traceback: str | None) -> None:
        """Record the tracebacks of what made a run fail (``None``: none, as when it is
        resumed); see [`RunInfo.traceback`][agentsnap.RunInfo.traceback].

        Raises:
            NotFoundError: The store holds no such run.
        """  # noqa: D205

    async def request_cancel(self, run_id: str, reason: str | None) -> None:
        """Ask the run's owner to stop it (``reason``), or withdraw the request (``None``).

        The owner sees the request at its next lease renewal (see
        [`agentsnap.ownership`][agentsnap.ownership]). Not fenced: anyone may ask.

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def set_parent(self, run_id: str, parent_run_id: str, parent_snapshot_id: str) -> None:
        """Record that a run was forked from a snapshot of another run.

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def save_rollback(self, rollback: RollbackInfo) -> None:
        """Record a rollback of a run.

        Raises:
            NotFoundError: The store holds no such run or snapshot.
        """

    async def list_rollbacks(self, run_id: str) -> list[RollbackInfo]:
        """Every rollback of a run, oldest first.

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def get_run(self, run_id: str) -> RunInfo:
        """The run with this id (``interrupted`` when running without a live owner).

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def find_ids(
        self, kind: Literal["run", "snapshot"], prefix: str, limit: int = 10
    ) -> list[str]:
        """Ids of runs (or of snapshots, of any run) that start with ``prefix``.

        Sorted, at most ``limit`` of them; ``prefix`` is matched literally (no wildcards).
        """

    async def list_snapshots(self, run_id: str) -> list[Snapshot]:
        """Every snapshot of a run, in the order they were started.

        A store that can hold rows changed behind its back (an SQL database) checks each
        snapshot as it reads it and reports one that is not whole and consistent any more as
        [`DAMAGED`][agentsnap.SnapshotStatus.DAMAGED], with the reason, never as an error
        (see [`agentsnap.integrity`][agentsnap.integrity]); so does ``load_snapshot``.
        """

    async def load_snapshot(self, snapshot_id: str) -> Snapshot:
        """The snapshot with this id.

        Raises:
            NotFoundError: The store holds no such snapshot.
        """

    async def save_state_schemas(
        self, run_id: str, schemas: Mapping[str, Mapping[str, JsonValue]]
    ) -> None:
        """Record the JSON schema of some agents' state models for a run, by agent name.

        An agent's schema already recorded for the run is replaced; others are kept. The
        inspector checks edited states against them without importing the program's code.

        Raises:
            NotFoundError: The store holds no such run.
            OwnershipLost: The run is fenced and its lease has passed to another owner.
        """

    async def load_state_schemas(self, run_id: str) -> dict[str, dict[str, JsonValue]]:
        """The state schemas recorded for a run's agents, by agent name (maybe none).

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def close(self) -> None:
        """Release connections and files."""


@runtime_checkable
class RunLog(Protocol):
    """A run's log: its journal (what the timeline draws) and its replay log (the order in
    which each agent handled its messages, followed again on resume).

    Appends are fenced as [`RunLeases`][agentsnap.store.RunLeases] says.
    """  # noqa: D205

    async def append_journal(self, run_id: str, segments: Sequence[JournalSegment]) -> None:
        """Append journal segments to a run's journal, all or nothing, in the given order.

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def load_journal(self, run_id: str) -> list[JournalSegment]:
        """Every journal segment of a run, in the order they were appended.

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def load_journal_page(
        self, run_id: str, *, after: int = 0, limit: int = 1000
    ) -> list[tuple[int, JournalSegment]]:
        """A page of a run's journal: at most ``limit`` segments appended after position
        ``after``, in append order, each with its position.

        Positions grow in append order (not necessarily by one); pass the last one read as
        ``after`` for the next page, ``0`` for the first. A page shorter than ``limit`` is
        the last, for now.

        Raises:
            NotFoundError: The store holds no such run.
            ConfigurationError: ``limit`` is less than 1.
        """  # noqa: D205

    async def append_replay(self, run_id: str, segment: ReplaySegment) -> None:
        """Append a segment to a run's replay log, durably, after the ones already there.

        One run's log is appended to by its one owner, one segment at a time.

        Raises:
            NotFoundError: The store holds no such run.
            OwnershipLost: The run is fenced and its lease has passed to another owner.
        """

    async def load_replay(self, run_id: str) -> list[ReplaySegment]:
        """Every segment of a run's replay log, in the order they were appended.

        Raises:
            NotFoundError: The store holds no such run.
        """


@runtime_checkable
class RunLeases(Protocol):
    """Who owns each run: a lease with a heartbeat and a fencing token
    (see [`agentsnap.ownership`][agentsnap.ownership]).

    **Fencing.** After [`fence(run_id, token)`][agentsnap.store.RunLeases.fence], every write
    this store object makes for the run (``save_snapshot``, ``save_rollback``, ``finish_run``,
    ``set_parent``, ``append_journal``, ``append_replay``) checks, atomically with the write,
    that the run's lease still has that token; when it has not, nothing is written and
    [`OwnershipLost`][agentsnap.OwnershipLost] is raised. Writes for runs not fenced are
    made as they are.

    **History of owners.** Each lease taken appends its owner to the run's history, in the
    same transaction as the take; a takeover ends the replaced owner's entry (``taken_over``)
    and a release ends the owner's own (``released``), each with the lease's last renewal.
    [`list_run_owners`][agentsnap.store.RunQueries.list_run_owners] reads it.
    """  # noqa: D205

    async def get_lease(self, run_id: str) -> RunLease | None:
        """The run's lease as it stands (expired or not), or ``None`` if it never had one.

        ``None`` too for a run the store does not hold.
        """

    async def take_lease(
        self, run_id: str, owner: str, expires_at: datetime, *, replacing: int | None
    ) -> RunLease | None:
        """Take the run's lease, if it is as the caller last saw it (compare and set).

        Atomic across processes: of several callers that saw the same lease, one wins.

        Args:
            run_id: The run.
            owner: The new owner, ``host:pid:token``.
            expires_at: Until when the new lease holds unless renewed.
            replacing: ``None`` to take the run's first lease (token 1), only if it has none;
                else the token of the lease to replace, which gets token ``replacing + 1``.

        Returns:
            The new lease, or ``None`` when the lease was not as expected (someone else
            changed it first).

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def renew_lease(self, run_id: str, token: int, expires_at: datetime) -> bool:
        """Extend the lease to ``expires_at``, if ``token`` is still its token.

        Returns:
            Whether the lease was renewed (``False``: another owner took it over).
        """

    async def release_lease(self, run_id: str, token: int) -> None:
        """End the lease now, if ``token`` is still its token (else do nothing).

        The lease is kept, expired, so that the next owner's token is higher still.
        """

    def fence(self, run_id: str, token: int) -> None:
        """Refuse, from now on, this store object's writes for the run unless its lease
        still has ``token`` (see the class's description).
        """  # noqa: D205


@runtime_checkable
class RunQueries(Protocol):
    """What listings read: runs by filter, snapshots a page at a time, summaries that
    assemble no snapshot, counts, and one agent's history.

    A run's status is reported as [`RunStore`][agentsnap.store.RunStore] says
    (``interrupted`` when running without a live owner).
    """  # noqa: D205

    async def list_runs(
        self,
        *,
        status: RunStatus | str | Collection[RunStatus | str] | None = None,
        name: str | None = None,
        tags: Mapping[str, str] | None = None,
        since: datetime | None = None,
        limit: int | None = None,
    ) -> list[RunInfo]:
        """The runs that pass every filter given (every run without one), oldest first.

        A run's status is the one reported (``interrupted`` when it is recorded as running
        and has no live owner), so ``status="running"`` lists only runs a live runtime owns.
        An SQL store filters in the database and reads only the runs it returns.

        Args:
            status: Only runs in this status, or in one of these (an empty collection
                matches no run).
            name: Only runs of this name; each ``*`` in it stands for any characters
                (``"nightly-*"``), and is always a wildcard. Runs without a name never match.
            tags: Only runs that carry every one of these tags, with these values.
            since: Only runs created at or after this moment (timezone-aware).
            limit: Only the newest ``limit`` of the runs that pass the other filters (still
                listed oldest first).

        Raises:
            ConfigurationError: A status is not a [`RunStatus`][agentsnap.RunStatus] or one's
                value, ``name`` is empty, ``tags`` does not map strings to strings, ``since``
                has no time zone, or ``limit`` is less than 1.
        """

    async def list_snapshots_page(
        self, run_id: str, *, after_seq: int = 0, limit: int = 100
    ) -> list[Snapshot]:
        """The run's snapshots numbered after ``after_seq``, at most ``limit``, by number.

        A page of ``list_snapshots``, read alike (damage reported the same way): a reader
        walks a long run from ``after_seq=0``, passing the last number it got, and never
        holds more than a page.

        Raises:
            NotFoundError: The store holds no such run.
            ConfigurationError: ``limit`` is less than 1.
        """

    async def list_snapshot_summaries(self, run_id: str) -> list[SnapshotSummary]:
        """What a listing shows of each snapshot of a run, in the order they were started.

        Each summary has the status, ``error`` and ``damaged_agents`` the whole snapshot
        would have, and counts its agents and messages in flight; no snapshot is assembled
        and no state is kept (an SQL store reads each distinct state once, to check it, and
        lets it go).

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def snapshot_counts(self) -> dict[str, int]:
        """How many snapshots (complete or failed) each run has, by run id.

        Runs without a snapshot are left out. This reads no snapshot, so listing runs costs
        the same whatever the runs hold.
        """

    async def list_run_owners(self, run_id: str) -> list[RunOwner]:
        """Every owner the run's lease has had, by fencing token (oldest first).

        Each lease taken appends one (see [`RunLeases`][agentsnap.store.RunLeases]); an owner
        whose entry ended ``taken_over`` stopped without giving the run back (a crash). A run
        that took its lease before the store kept this history lacks those owners (its first
        entry's token is then above 1), and has none at all if it was not resumed since.

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def agent_history(self, run_id: str, agent: str) -> list[AgentVersion]:
        """An agent's part of every complete snapshot of a run, oldest first.

        A snapshot found damaged is listed with ``damaged`` set when it holds the agent's
        part (intact) or the damage concerns the agent (``cut`` is then ``None``).

        Raises:
            NotFoundError: The store holds no such run, or no snapshot of the run has
                recorded this agent.
        """


@runtime_checkable
class DistributedParts(Protocol):
    """What a run spread over processes adds (see
    [`agentsnap.distributed`][agentsnap.distributed]): per snapshot in progress, each
    worker's part (written in one transaction each), and which worker hosts each agent (a
    lease per agent).
    """  # noqa: D205

    async def save_snapshot_part(self, part: SnapshotPart) -> None:
        """Write one worker's part of a snapshot, atomically.

        A second write of the same ``(run_id, seq, worker)`` replaces the first (a write
        retried after its answer was lost).

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def load_snapshot_parts(self, run_id: str, seq: int) -> list[SnapshotPart]:
        """The parts written for snapshot ``seq`` of a run, ordered by worker (maybe none).

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def delete_snapshot_parts(self, run_id: str, below: int) -> int:
        """Delete the parts of the run's snapshots numbered below ``below``; return how many.

        The snapshots themselves stay; what goes is what only the parts held: the stream
        ranges of their channels (a retention that purged the run's stream below them).

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def claim_agents(
        self, run_id: str, owner: str, agents: Collection[str], expires_at: datetime
    ) -> list[AgentLease]:
        """Take or renew the leases of ``agents`` for ``owner``: all of them, or none.

        An agent's lease is free when it never had one, when it expired, or when ``owner``
        holds it. Atomic across processes: of two owners claiming one agent, one wins.

        Returns:
            The live leases of other owners that kept the claim from succeeding (empty: every
            agent is now ``owner``'s until ``expires_at``).

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def release_agents(self, run_id: str, owner: str) -> None:
        """End now every lease ``owner`` holds on the run's agents (nothing when none)."""

    async def list_agent_leases(self, run_id: str) -> list[AgentLease]:
        """Every agent lease of a run, live or expired, ordered by agent (maybe none)."""


@runtime_checkable
class OneProcessStore(RunStore, RunLog, RunLeases, Protocol):
    """What a [`Runtime`][agentsnap.Runtime] running in one process needs: runs and
    snapshots, the run's log, and its lease.
    """  # noqa: D205


@runtime_checkable
class DistributedStore(OneProcessStore, DistributedParts, Protocol):
    """What the coordinator and the workers of a distributed run need: a one-process store
    that also keeps snapshot parts and agent leases.
    """  # noqa: D205


@runtime_checkable
class InspectedStore(RunStore, RunLog, RunLeases, RunQueries, Protocol):
    """What the inspector (the ``agentsnap`` commands, the web inspector, the functions of
    [`agentsnap.inspect`][agentsnap.inspect]) reads: runs and snapshots, the run's log, its
    lease (who holds the run's tool calls), and the queries of listings.
    """  # noqa: D205


@runtime_checkable
class KeptInDatabase(Protocol):
    """A store kept in a database that other processes can open by URL.

    Such a store keeps the run's journal by default, its database keeps the ledger of
    tool calls and requests to people, and a process started to resume one of its runs can
    open it again (an [`SqlStore`][agentsnap.store.sql.SqlStore] is one).
    """

    @property
    def url(self) -> str:
        """The database's URL, as given to the store."""
