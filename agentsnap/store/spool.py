"""The local spool: writes of a run that its database refused, kept until it is back.

A store retries a failing database for a while (its ``StoreRetry`` policy); when a run
closes and the database is still unavailable after that, what could not be written (how the
run ended, the rest of its journal, its last replay-log segments and rollbacks, the outcomes
of its tool calls, the release of its lease) is **spooled**: appended, one JSON line per
operation, to a file of the run in a local directory, and forced to disk (``fsync``) before
[`Spool.add`][agentsnap.store.spool.Spool.add] returns. The next open of the run
(``Runtime.resume()``), a runtime closing once the database is back, or
``agentsnap db recover`` [replays][agentsnap.store.spool.Spool.replay] the spool into the
database and removes what it applied.

Example:
    ```python
    import asyncio
    import tempfile

    from agentsnap import MemoryStore, RunInfo, RunStatus
    from agentsnap.records import utcnow
    from agentsnap.store.spool import FinishRun, Spool


    async def main(folder: str) -> None:
        store = MemoryStore()
        await store.create_run(RunInfo(id="run-1"))
        spool = Spool(folder)
        # The database refused this write at close: keep it on disk.
        spool.add(FinishRun(run_id="run-1", status=RunStatus.SUCCEEDED, finished_at=utcnow()))
        print(spool.runs())  # ['run-1']
        report = await spool.replay(store)  # the database is back
        print([(r.op.op, r.outcome.value) for r in report.applied])  # [('finish_run', 'applied')]
        print((await store.get_run("run-1")).status, spool.runs())  # succeeded []


    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(main(folder))
    ```

**Where.** [`Spool.for_url`][agentsnap.store.spool.Spool.for_url] picks the directory of a
database: ``<file>.spool`` beside an SQLite file (``agentsnap.db.spool`` for
``sqlite:///agentsnap.db``), else one directory per database under
``$XDG_STATE_HOME/agentsnap/spool`` (``~/.local/state/agentsnap/spool`` by default), so
that each database's spool holds its own runs only. In the directory each run with
spooled operations has a file ``<run id>.jsonl`` (the id percent-encoded when it holds
characters unsafe in a file name).

**Format.** JSON only, never pickle: each line is one operation, a pydantic model whose
``op`` field says which ([`FinishRun`][agentsnap.store.spool.FinishRun],
[`AppendJournal`][agentsnap.store.spool.AppendJournal],
[`AppendReplay`][agentsnap.store.spool.AppendReplay],
[`SaveRollback`][agentsnap.store.spool.SaveRollback],
[`UpdateLedger`][agentsnap.store.spool.UpdateLedger],
[`ReleaseLease`][agentsnap.store.spool.ReleaseLease]), with an ``id`` that the replay
removes it by and the time it was spooled.

**Replay** applies a run's operations in the order they were spooled and is idempotent,
also after a replay that crashed between applying an operation and removing it from the
file: journal segments and rollbacks already stored are not written again, replay-log
segments already at the end of the run's log are not appended again, and the other
operations are idempotent by nature (a ledger update is a compare-and-set). It stops a run
at the first operation that fails and keeps that one and the rest; a database error
([`StoreError`][agentsnap.StoreError]) stops the whole replay. A line that cannot be read is
never dropped: it is reported with its file and line number, and it and the lines after it
stay in the file for a person to look at.

**Concurrency.** Appends and rewrites of a spool directory hold an exclusive lock on the
file ``.spool.lock`` in it, and a replay of a run holds a lock of that run (under
``.replaying/``) for as long as it runs, so that two processes (a resuming runtime and
``agentsnap db recover``, say) never replay a run at the same time: the second waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, cast
from urllib.parse import quote, unquote

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_serializer,
    model_validator,
)

from agentsnap.exceptions import AgentsnapError, ConfigurationError, StoreError
from agentsnap.ledger import Change, Ledger, ToolCallStatus
from agentsnap.messages import JsonValue
from agentsnap.records import JournalSegment, ReplaySegment, RollbackInfo, RunStatus, utcnow

if TYPE_CHECKING:
    from agentsnap.store import OneProcessStore

__all__ = [
    "AppendJournal",
    "AppendReplay",
    "FinishRun",
    "LedgerChange",
    "Outcome",
    "ReleaseLease",
    "ReplayReport",
    "Replayed",
    "SaveRollback",
    "Spool",
    "SpoolError",
    "SpoolOp",
    "UpdateLedger",
]

SUFFIX = ".jsonl"
"""The file name suffix of a run's spool file."""

WAIT_FOR_REPLAY = 60.0
"""Seconds a replay waits for another process's replay of the same run to end."""


class SpoolError(AgentsnapError):
    """The spool cannot be read or used: a malformed line, or a run busy being replayed.

    Attributes:
        path: The file concerned.
        line: The line number (from 1) of a malformed line, else ``None``.
    """

    def __init__(self, path: Path, line: int | None, detail: str) -> None:
        self.path = path
        self.line = line
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {detail}")


# -- the operations -------------------------------------------------------------------------


def _as_utc(moment: datetime) -> datetime:
    """An aware time with a zero offset, read back from JSON, as ``datetime.UTC`` again."""
    offset = moment.utcoffset()
    if offset is not None and not offset and moment.tzinfo is not UTC:
        return moment.replace(tzinfo=UTC)
    return moment


Moment = Annotated[datetime, AfterValidator(_as_utc)]
"""A time as the spool keeps it: ISO 8601, the offset included when it has one."""

RunId = Annotated[str, Field(min_length=1)]


def _new_id() -> str:
    return uuid.uuid4().hex


class _Op(BaseModel):
    """What every spooled operation has."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: str
    """Which operation this is (the discriminator of [`SpoolOp`][agentsnap.store.spool.SpoolOp])."""
    id: str = Field(default_factory=_new_id, min_length=1)
    """Identifies the operation in its file: the replay removes it by this id."""
    spooled_at: Moment = Field(default_factory=utcnow)
    """When it was spooled."""


class FinishRun(_Op):
    """[`Store.finish_run`][agentsnap.store.RunStore.finish_run]: how and when the run ended."""

    op: Literal["finish_run"] = "finish_run"
    run_id: RunId
    """The run."""
    status: RunStatus
    """How it ended."""
    finished_at: Moment
    """When it ended."""
    reason: str | None = None
    """Why it ended so, in one line (a [`status_reason`][agentsnap.RunInfo.status_reason])."""
    token: int | None = None
    """The fencing token of the run's lease that the writer held, if it held one. Given, the
    replay records the end only while the run's lease still has this token, as a fenced
    store would: a run another owner has taken over since is left to that owner (the
    operation is then reported [`stale`][agentsnap.store.spool.Outcome.STALE] and removed)."""

    def describe(self) -> str:
        """One line saying what the operation does."""
        return f"finish run: {self.status.value} at {self.finished_at.isoformat()}"


class AppendJournal(_Op):
    """[`Store.append_journal`][agentsnap.store.RunLog.append_journal]: journal segments."""

    op: Literal["append_journal"] = "append_journal"
    run_id: RunId
    """The run."""
    segments: list[JournalSegment]
    """The segments, in the order they are appended (each kept as a JSON array of its fields)."""

    def describe(self) -> str:
        """One line saying what the operation does."""
        return f"append {len(self.segments)} journal segment(s)"


class AppendReplay(_Op):
    """[`Store.append_replay`][agentsnap.store.RunLog.append_replay]: a replay-log segment."""

    op: Literal["append_replay"] = "append_replay"
    run_id: RunId
    """The run."""
    timeline: int
    """The segment's [`timeline`][agentsnap.ReplaySegment.timeline]."""
    body: str
    """The segment's [`body`][agentsnap.ReplaySegment.body], the JSON text as it is."""

    @classmethod
    def of(cls, run_id: str, segment: ReplaySegment) -> AppendReplay:
        """The operation appending ``segment`` to run ``run_id``'s replay log."""
        return cls(run_id=run_id, timeline=segment.timeline, body=segment.body)

    @property
    def segment(self) -> ReplaySegment:
        """The segment to append."""
        return ReplaySegment(self.timeline, self.body)

    def describe(self) -> str:
        """One line saying what the operation does."""
        return f"append replay-log segment (timeline {self.timeline})"


class SaveRollback(_Op):
    """[`Store.save_rollback`][agentsnap.store.RunStore.save_rollback]: a rollback of a run."""

    op: Literal["save_rollback"] = "save_rollback"
    info: RollbackInfo
    """The rollback."""

    @model_validator(mode="after")
    def _utc(self) -> SaveRollback:
        at = _as_utc(self.info.at)
        if at is not self.info.at:
            object.__setattr__(self, "info", self.info.model_copy(update={"at": at}))
        return self

    @property
    def run_id(self) -> str:
        """The run rolled back."""
        return self.info.run_id

    def describe(self) -> str:
        """One line saying what the operation does."""
        return f"save rollback {self.info.id} to snapshot {self.info.snapshot_id}"


class LedgerChange(BaseModel):
    """A ledger [`Change`][agentsnap.ledger.Change] as JSON: the columns an update sets.

    Only the columns given are set (a column given as ``None`` is set to ``None``; a column
    not given is left as it is); enums and times come back as they were.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: ToolCallStatus | None = None
    owner: str | None = None
    lease_until: Moment | None = None
    attempts: int | None = None
    result: JsonValue = None
    error: str | None = None
    compensation: JsonValue = None
    note: JsonValue = None
    updated_at: Moment | None = None

    @model_validator(mode="after")
    def _not_null(self) -> LedgerChange:
        for name in ("status", "attempts", "updated_at"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"a ledger change cannot set {name} to null")
        return self

    @classmethod
    def of(cls, change: Change) -> LedgerChange:
        """The change as a model (its keys, and only those, are set)."""
        return cls.model_validate(dict(change))

    def as_change(self) -> Change:
        """The change as [`Ledger.update`][agentsnap.ledger.Ledger.update] takes it."""
        return cast("Change", {name: getattr(self, name) for name in self.model_fields_set})


class UpdateLedger(_Op):
    """[`Ledger.update`][agentsnap.ledger.Ledger.update]: a compare-and-set of a tool call."""

    op: Literal["update_ledger"] = "update_ledger"
    run_id: RunId
    """The run that made the call (the spool is kept per run)."""
    key: str
    """The call's idempotency key."""
    change: LedgerChange
    """The columns to set."""
    statuses: list[ToolCallStatus]
    """The statuses the entry may be in."""
    owner: str | None = None
    """When given, the entry's owner must be this."""
    attempts: int | None = None
    """When given, the entry's attempts must be this."""

    @field_serializer("change")
    def _only_set(self, change: LedgerChange) -> dict[str, Any]:
        dumped: dict[str, Any] = change.model_dump(mode="json", exclude_unset=True)
        return dumped

    @classmethod
    def of(  # noqa: PLR0917
        cls,
        run_id: str,
        key: str,
        change: Change,
        statuses: Iterable[ToolCallStatus],
        owner: str | None = None,
        attempts: int | None = None,
    ) -> UpdateLedger:
        """The operation making ``ledger.update(key, change, statuses=..., owner=...,
        attempts=...)`` for a call of run ``run_id``.
        """  # noqa: D205
        return cls(
            run_id=run_id,
            key=key,
            change=LedgerChange.of(change),
            statuses=list(statuses),
            owner=owner,
            attempts=attempts,
        )

    def describe(self) -> str:
        """One line saying what the operation does."""
        status = self.change.status
        what = f"status {status.value}" if status is not None else "update"
        return f"tool call {self.key}: {what}"


class ReleaseLease(_Op):
    """[`Store.release_lease`][agentsnap.store.RunLeases.release_lease]: the run's lease ends."""

    op: Literal["release_lease"] = "release_lease"
    run_id: RunId
    """The run."""
    token: int
    """The token of the lease to end (another lease is left as it is)."""

    def describe(self) -> str:
        """One line saying what the operation does."""
        return f"release lease (token {self.token})"


SpoolOp: TypeAlias = Annotated[
    FinishRun | AppendJournal | AppendReplay | SaveRollback | UpdateLedger | ReleaseLease,
    Field(discriminator="op"),
]
"""Any spooled operation; its ``op`` field says which."""

_OPS: TypeAdapter[SpoolOp] = TypeAdapter(SpoolOp)


# -- what a replay did ----------------------------------------------------------------------


class Outcome(StrEnum):
    """What replaying one operation did; each removes the operation from the spool."""

    APPLIED = "applied"
    """Written to the store or the ledger."""
    ALREADY_STORED = "already stored"
    """Already there (an earlier replay wrote it and stopped before removing it)."""
    NO_CHANGE = "no change"
    """A ledger update whose entry is no longer as expected (already updated, or moved on),
    or a lease release whose lease has ended already or has another token: nothing to do."""
    STALE = "stale"
    """A run's end recorded by an owner that has since lost the run to another: a fenced
    store would refuse it, so it is dropped."""


@dataclass(frozen=True, slots=True)
class Replayed:
    """One operation a replay dealt with, and how."""

    op: SpoolOp
    """The operation."""
    outcome: Outcome
    """What the replay did with it."""


@dataclass(slots=True)
class ReplayReport:
    """What [`Spool.replay`][agentsnap.store.spool.Spool.replay] did."""

    applied: list[Replayed] = field(default_factory=list)
    """The operations dealt with and removed from the spool, in the order they were."""
    kept: dict[str, int] = field(default_factory=dict)
    """For each replayed run that still has operations in the spool, how many."""
    errors: dict[str, AgentsnapError] = field(default_factory=dict)
    """For each run whose replay stopped, why: a [`StoreError`][agentsnap.StoreError] (the
    database; the replay stopped there, and the runs it did not get to have the same error),
    a [`NotFoundError`][agentsnap.NotFoundError] (the run is not in this store), a
    [`SpoolError`][agentsnap.store.spool.SpoolError] (a malformed line), ..."""

    @property
    def complete(self) -> bool:
        """Whether nothing is left in the spool for the runs replayed."""
        return not self.kept and not self.errors


@dataclass(slots=True)
class _RunState:
    """What a replay of one run read from the store, read once per run."""

    journal: set[JournalSegment] | None = None
    rollbacks: set[str] | None = None
    replay_done: int | None = None
    """How many of the run's spooled replay-log segments the log already ends with."""
    replay_seen: int = 0


# -- the spool ------------------------------------------------------------------------------


class Spool:
    """A directory of spooled operations, one file per run.

    Args:
        directory: Where the files are; created when the first operation is added.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        """Where the files are."""

    def __repr__(self) -> str:
        return f"Spool({str(self.directory)!r})"

    @classmethod
    def for_url(cls, url: str, directory: str | Path | None = None) -> Spool:
        """The spool of the database at ``url``.

        Args:
            url: The database URL (SQLite or PostgreSQL).
            directory: Use this directory; when ``None``, the database's own: for an SQLite
                file database, the directory ``<db file>.spool`` beside it; else
                ``$XDG_STATE_HOME/agentsnap/spool/<database>`` (``$XDG_STATE_HOME``
                defaults to ``~/.local/state``), where ``<database>`` names the backend,
                host, port and database name, with a hash of them.

        Raises:
            ConfigurationError: ``url`` is not a database URL.
        """
        if directory is not None:
            return cls(directory)
        return cls(_directory_of(url))

    def file(self, run_id: str) -> Path:
        """The file holding run ``run_id``'s spooled operations (it may not exist)."""
        return self.directory / (quote(run_id, safe="") + SUFFIX)

    def add(self, op: SpoolOp) -> None:
        """Append ``op`` to its run's file, durably: flushed and ``fsync``-ed on return.

        The directory is created as needed. A last line left incomplete by a crash is closed
        first, so that it cannot swallow this one.

        Raises:
            OSError: The file could not be written (the operation is not spooled).
        """
        line = op.model_dump_json().encode() + b"\n"
        created_dir = not self.directory.is_dir()
        self.directory.mkdir(parents=True, exist_ok=True)
        if created_dir:
            _fsync_dir(self.directory.parent)
        path = self.file(op.run_id)
        with self._locked():
            created = not path.exists()
            with path.open("a+b") as handle:
                size = handle.seek(0, os.SEEK_END)
                if size:
                    handle.seek(size - 1)
                    if handle.read(1) != b"\n":
                        line = b"\n" + line
                handle.write(line)
                handle.flush()
                os.fsync(handle.fileno())
            if created:
                _fsync_dir(self.directory)

    def runs(self) -> list[str]:
        """The runs with spooled operations, sorted."""
        if not self.directory.is_dir():
            return []
        found = [
            unquote(path.name[: -len(SUFFIX)])
            for path in self.directory.iterdir()
            if path.name.endswith(SUFFIX) and path.is_file() and path.stat().st_size
        ]
        return sorted(found)

    def pending(self, run_id: str) -> list[SpoolOp]:
        """Run ``run_id``'s spooled operations, oldest first.

        Raises:
            SpoolError: A line is malformed (the error names the file and the line).
        """
        path = self.file(run_id)
        with self._locked():
            lines = _read_lines(path)
        ops, error = _decode(path, run_id, lines)
        if error is not None:
            raise error
        return ops

    async def replay(
        self, store: OneProcessStore, ledger: Ledger | None = None, run_id: str | None = None
    ) -> ReplayReport:
        """Apply the spooled operations (of run ``run_id``, or of every run) and remove them.

        Each run's operations are applied in the order they were spooled, idempotently (see
        the module's description); each one dealt with is removed from the file (rewritten
        through a temporary file and ``os.replace``, and deleted once empty). A run stops at
        the first operation that fails with an agentsnap error, which is kept with the ones
        after it and reported in ``errors``; a [`StoreError`][agentsnap.StoreError] stops
        the replay of every run. Another error (a bug) is raised, once the operations applied
        before it are removed.

        Args:
            store: The store to write to (fenced or not).
            ledger: The ledger of tool calls, needed when ledger updates are spooled (without
                it, a run with one stops there, with a
                [`ConfigurationError`][agentsnap.ConfigurationError]).
            run_id: Only this run.

        Returns:
            What was applied, what is left, and why.
        """
        report = ReplayReport()
        runs = [run_id] if run_id is not None else self.runs()
        for index, run in enumerate(runs):
            if not await self._replay_run(run, store, ledger, report):
                failed = report.errors[run]
                for rest in runs[index + 1 :]:
                    left = self._count(rest)
                    if left:
                        report.kept[rest] = left
                        report.errors[rest] = failed
                break
        return report

    # -- one run

    async def _replay_run(
        self, run_id: str, store: OneProcessStore, ledger: Ledger | None, report: ReplayReport
    ) -> bool:
        """Replay one run into ``report``; ``False`` when the store failed (stop there)."""
        path = self.file(run_id)
        if not path.exists():
            return True
        try:
            claim = await self._claim(run_id)
        except SpoolError as exc:
            report.errors[run_id] = exc
            report.kept[run_id] = self._count(run_id)
            return True
        done: set[str] = set()
        try:
            with self._locked():
                lines = _read_lines(path)
            ops, malformed = _decode(path, run_id, lines)
            state = _RunState()
            for op in ops:
                try:
                    outcome = await _apply(op, ops, store, ledger, state)
                except StoreError as exc:
                    report.errors[run_id] = exc
                    return False
                except AgentsnapError as exc:
                    report.errors[run_id] = exc
                    return True
                done.add(op.id)
                report.applied.append(Replayed(op, outcome))
            if malformed is not None:
                report.errors[run_id] = malformed
            return True
        finally:
            left = None
            try:
                left = self._remove(path, done)
                if left:
                    report.kept[run_id] = left
            finally:
                claim.release(remove=left == 0)

    def _remove(self, path: Path, ids: set[str]) -> int:
        """Remove the operations with these ids (and blank lines) from ``path``; how many
        lines are left.
        """  # noqa: D205
        with self._locked():
            lines = _read_lines(path)
            keep = [line for line in lines if line.strip() and _line_id(line) not in ids]
            if not keep:
                if lines:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                    _fsync_dir(self.directory)
                return 0
            if len(keep) != len(lines):
                temporary = path.with_name(path.name + ".tmp")
                with temporary.open("wb") as handle:
                    handle.write(b"".join(line + b"\n" for line in keep))
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temporary, path)
                _fsync_dir(self.directory)
            return len(keep)

    def _count(self, run_id: str) -> int:
        """How many operations (lines) run ``run_id`` has in the spool."""
        with self._locked():
            return sum(1 for line in _read_lines(self.file(run_id)) if line.strip())

    # -- locks

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the directory's lock (briefly: no await happens under it)."""
        if not self.directory.is_dir():
            yield
            return
        fd = os.open(self.directory / ".spool.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while not _try_lock(fd):
                time.sleep(0.005)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    async def _claim(self, run_id: str) -> _Claim:
        """Hold the lock of run ``run_id``'s replay, waiting for another process's replay.

        Raises:
            SpoolError: Another replay held it for longer than ``WAIT_FOR_REPLAY``.
        """
        folder = self.directory / ".replaying"
        folder.mkdir(exist_ok=True)
        path = folder / quote(run_id, safe="")
        deadline = time.monotonic() + WAIT_FOR_REPLAY
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            if _try_lock(fd):
                # The holder before may have removed the file as it let go: hold the lock
                # of the file that is there, or try again.
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(path).st_ino == os.fstat(fd).st_ino:
                        return _Claim(path, fd)
            os.close(fd)
            if time.monotonic() > deadline:
                raise SpoolError(
                    self.file(run_id),
                    None,
                    f"another process has been replaying run {run_id} for over "
                    f"{WAIT_FOR_REPLAY:g} s; try again once it is done",
                )
            await asyncio.sleep(0.05)


class _Claim:
    """A held replay lock of one run."""

    def __init__(self, path: Path, fd: int) -> None:
        self._path = path
        self._fd = fd

    def release(self, *, remove: bool) -> None:
        """Let go of the lock; ``remove`` its file first (the run has nothing spooled)."""
        try:
            if remove:
                with contextlib.suppress(OSError):
                    self._path.unlink()
        finally:
            os.close(self._fd)


if sys.platform == "win32":  # pragma: no cover
    import msvcrt

    def _try_lock(fd: int) -> bool:
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

else:
    import fcntl

    def _try_lock(fd: int) -> bool:
        """Take an exclusive lock of the open file ``fd`` if it is free."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def _fsync_dir(directory: Path) -> None:
    """Make a directory's entries (a file created, replaced or deleted) durable."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - a platform that cannot open a directory
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


# -- reading files --------------------------------------------------------------------------


def _read_lines(path: Path) -> list[bytes]:
    """The file's lines, as bytes, without their line ends (none for a missing file)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    return lines


def _line_id(line: bytes) -> str | None:
    """The ``id`` of a line's operation, or ``None`` when the line is not one."""
    try:
        found = json.loads(line)
    except ValueError:
        return None
    value = found.get("id") if isinstance(found, dict) else None
    return value if isinstance(value, str) else None


def _decode(path: Path, run_id: str, lines: list[bytes]) -> tuple[list[SpoolOp], SpoolError | None]:
    """The operations of a file up to its first malformed line, and the error of that line."""
    ops: list[SpoolOp] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            op = _OPS.validate_json(line)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "line"
            detail = f"{where}: {first['msg']}"
            return ops, SpoolError(
                path,
                number,
                f"not a spooled operation ({detail}); the line and the ones after it are kept: "
                "fix or remove it, then replay again",
            )
        if op.run_id != run_id:
            return ops, SpoolError(
                path, number, f"an operation of run {op.run_id}, not {run_id}; it is kept"
            )
        ops.append(op)
    return ops, None


# -- applying one operation -----------------------------------------------------------------


async def _apply(
    op: SpoolOp, ops: list[SpoolOp], store: OneProcessStore, ledger: Ledger | None, state: _RunState
) -> Outcome:
    """Apply ``op`` (one of ``ops``, its run's operations) unless it is already stored."""
    if isinstance(op, FinishRun):
        if op.token is not None:
            lease = await store.get_lease(op.run_id)
            if lease is not None and lease.token != op.token:
                await store.get_run(op.run_id)  # a run not in this store is reported as such
                return Outcome.STALE
        run = await store.get_run(op.run_id)
        if run.status is op.status and run.finished_at == op.finished_at:
            return Outcome.ALREADY_STORED
        await store.finish_run(op.run_id, op.status, op.finished_at, op.reason)
        return Outcome.APPLIED
    if isinstance(op, AppendJournal):
        if state.journal is None:
            state.journal = set(await store.load_journal(op.run_id))
        stored = state.journal
        missing = [segment for segment in op.segments if segment not in stored]
        if not missing:
            return Outcome.ALREADY_STORED
        await store.append_journal(op.run_id, missing)
        stored.update(missing)
        return Outcome.APPLIED
    if isinstance(op, AppendReplay):
        if state.replay_done is None:
            spooled = [o.segment for o in ops if isinstance(o, AppendReplay)]
            state.replay_done = _overlap(await store.load_replay(op.run_id), spooled)
        state.replay_seen += 1
        if state.replay_seen <= state.replay_done:
            return Outcome.ALREADY_STORED
        await store.append_replay(op.run_id, op.segment)
        return Outcome.APPLIED
    if isinstance(op, SaveRollback):
        if state.rollbacks is None:
            state.rollbacks = {r.id for r in await store.list_rollbacks(op.run_id)}
        if op.info.id in state.rollbacks:
            return Outcome.ALREADY_STORED
        await store.save_rollback(op.info)
        state.rollbacks.add(op.info.id)
        return Outcome.APPLIED
    if isinstance(op, UpdateLedger):
        if ledger is None:
            raise ConfigurationError(
                f"run {op.run_id} has a spooled update of tool call {op.key!r}, and no ledger "
                "was given to replay it into: pass ledger= to Spool.replay()"
            )
        changed = await ledger.update(
            op.key,
            op.change.as_change(),
            statuses=op.statuses,
            owner=op.owner,
            attempts=op.attempts,
        )
        return Outcome.APPLIED if changed else Outcome.NO_CHANGE
    lease = await store.get_lease(op.run_id)
    if lease is None or lease.token != op.token or lease.expires_at <= utcnow():
        await store.get_run(op.run_id)  # a run not in this store is reported as such
        return Outcome.NO_CHANGE
    await store.release_lease(op.run_id, op.token)
    return Outcome.APPLIED


def _overlap(stored: list[ReplaySegment], spooled: list[ReplaySegment]) -> int:
    """How many of the first ``spooled`` segments the ``stored`` log already ends with."""
    for count in range(min(len(stored), len(spooled)), 0, -1):
        if stored[-count:] == spooled[:count]:
            return count
    return 0


# -- where a database's spool is ------------------------------------------------------------


def _directory_of(url: str) -> Path:
    """The default spool directory of the database at ``url`` (see ``Spool.for_url``)."""
    from sqlalchemy.engine import make_url  # noqa: PLC0415  # SQLAlchemy only when asked

    try:
        parsed = make_url(url)
    except Exception as exc:
        raise ConfigurationError(f"{url!r} is not a database URL: {exc}") from exc
    backend = parsed.get_backend_name()
    database = parsed.database
    if backend == "sqlite" and database and database != ":memory:" and "mode=memory" not in url:
        path = Path(database).expanduser().absolute()
        return path.with_name(path.name + ".spool")
    host = parsed.host or str(parsed.query.get("host") or "")
    identity = json.dumps([backend, host, parsed.port, database])
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    name = "-".join(str(part) for part in (backend, host, parsed.port, database) if part)
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:80]
    return _state_home() / "agentsnap" / "spool" / f"{name}-{digest}"


def _state_home() -> Path:
    """``$XDG_STATE_HOME``, or ``~/.local/state`` when it is unset or not absolute."""
    configured = os.environ.get("XDG_STATE_HOME", "")
    if configured and Path(configured).is_absolute():
        return Path(configured)
    return Path.home() / ".local" / "state"
