"""Read-only views of what runs left in a store, shared by Python code and the CLI.

One function writes: ``fork_run`` adds a run that starts from a
snapshot of another (``agentsnap fork``). ``bisect_run`` finds the first snapshot of a run
where a condition on the agents' states stopped holding (``agentsnap bisect``).

Example:
    ```python
    import asyncio
    import json

    from agentsnap import MemoryStore, Runtime
    from agentsnap.inspect import export_run

    async def main() -> None:
        store = MemoryStore()
        async with Runtime(store=store) as runtime:
            await runtime.snapshot()
        document = await export_run(store, runtime.run_id)
        print(json.dumps(document, indent=2))

    asyncio.run(main())
    ```

The export document is described, key by key, in ``docs/reference/export.md``.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import json
from collections.abc import AsyncIterator, Sequence
from datetime import UTC
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Unpack

from agentsnap._views import (
    AgentChange,
    AgentDiff,
    AgentPart,
    AgentShown,
    CallSummary,
    CallTotals,
    ChannelCut,
    CheckpointRow,
    EventRow,
    HandlerModelCall,
    HandlerToolCall,
    HistoryEntry,
    InFlightMessage,
    MappingDiff,
    ModelCall,
    ModelCallRow,
    ModelCallsTable,
    ModelCallTotals,
    OwnerRow,
    PlanChange,
    PreviousSnapshot,
    RollbackRow,
    RunRow,
    RunStanding,
    SentMessage,
    SnapshotDiff,
    SnapshotDocument,
    SnapshotRow,
    SnapshotView,
    StateDiff,
    StoredStates,
    ToolCall,
    ToolCallRow,
    ValueChange,
    attributes,
    picked,
)
from agentsnap.exceptions import ConfigurationError, NotFoundError, StateNotReadable
from agentsnap.fork import MessageEdits, ToolsMode, fork_snapshot
from agentsnap.journal import JournalReader, read_journal
from agentsnap.ledger import ToolCallStatus, is_orphaned
from agentsnap.limits import check_run_id
from agentsnap.messages import ENVIRONMENT
from agentsnap.model_calls import ModelCallLog
from agentsnap.records import RunInfo, RunStatus, SnapshotStatus, utcnow
from agentsnap.requests import HumanRequest, RequestLog, answer_request, carry_requests
from agentsnap.store import KeptInDatabase
from agentsnap.store._run_filter import RunFilter
from agentsnap.store.graph import GraphCheckpointIndex
from agentsnap.store.ledger import ledger_for
from agentsnap.versions import check_state, read_state_json, state_version

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping
    from datetime import datetime

    from pydantic import BaseModel

    from agentsnap.distributed.app import App
    from agentsnap.ledger import Ledger, LedgerEntry
    from agentsnap.messages import JsonInput, JsonValue
    from agentsnap.model_calls import ModelCallRecord
    from agentsnap.records import (
        AgentCut,
        JournalMessage,
        RunLease,
        Snapshot,
        SnapshotSummary,
    )
    from agentsnap.runtime import Runtime
    from agentsnap.store import InspectedStore, OneProcessStore, RunStore
    from agentsnap.store._run_filter import RunFilters

__all__ = [
    "EXPORT_FORMAT",
    "AgentChange",
    "AgentDiff",
    "AgentPart",
    "AgentShown",
    "BisectResult",
    "CallSummary",
    "CallTotals",
    "ChannelCut",
    "CheckpointRow",
    "EventRow",
    "HandlerModelCall",
    "HandlerToolCall",
    "HistoryEntry",
    "InFlightMessage",
    "MappingDiff",
    "ModelCall",
    "ModelCallRow",
    "ModelCallTotals",
    "ModelCallsTable",
    "OwnerRow",
    "PlanChange",
    "PreviousSnapshot",
    "RollbackRow",
    "RunRow",
    "RunStanding",
    "SentMessage",
    "SnapshotDiff",
    "SnapshotDocument",
    "SnapshotRow",
    "SnapshotView",
    "StateDiff",
    "StoredStates",
    "ToolCall",
    "ToolCallRow",
    "ValueChange",
    "agent_history_table",
    "answer",
    "answer_line",
    "approve",
    "bisect_run",
    "call_summary",
    "cancel_run",
    "check_stored_states",
    "deny",
    "diff_snapshots",
    "diff_states",
    "discarded_calls",
    "events_table",
    "export_run",
    "following_snapshots",
    "fork_run",
    "graph_checkpoints_table",
    "is_empty_diff",
    "ledger_calls",
    "ledger_calls_table",
    "list_requests",
    "model_call_totals",
    "model_calls",
    "model_calls_table",
    "owners_table",
    "previous_snapshot",
    "read_cut",
    "resolve_run",
    "resolve_snapshot",
    "resume_app",
    "rollbacks_table",
    "run_app",
    "runs_table",
    "show_snapshot",
    "snapshots_table",
    "tool_calls_table",
    "write_export",
]

T = TypeVar("T")

EXPORT_FORMAT = 1
"""Version of the export document's layout, in its ``"format"`` key."""


async def export_run(
    store: InspectedStore, run_id: str, ledger: Ledger | None = None
) -> dict[str, Any]:
    """Everything a store holds about a run, as one JSON-ready document.

    The ``"messages"`` key is present only when the run kept a journal. ``"tool_calls"``
    lists the run's side-effecting tool calls from ``ledger``, and ``"model_calls"`` its
    model calls (see [`model_calls`][agentsnap.inspect.model_calls]): by default the ledger
    in the store's database (an ``SqlStore``'s), none for other stores.

    Raises:
        NotFoundError: The store holds no such run.
    """
    run = await store.get_run(run_id)
    snapshots = await store.list_snapshots(run_id)
    document: dict[str, Any] = {
        "format": EXPORT_FORMAT,
        "run": _run(run),
        "snapshots": [_dumped(SnapshotDocument.whole(snapshot)) for snapshot in snapshots],
        "rollbacks": [_dumped(RollbackRow.of(r)) for r in await store.list_rollbacks(run_id)],
        "owners": await _owners(store, run_id),
    }
    document["tool_calls"] = [
        _dumped(ToolCall.of(entry)) for entry in await _ledger_calls(store, run_id, ledger)
    ]
    document["model_calls"] = [
        _dumped(ModelCall.of(record)) for record in await model_calls(store, run_id, ledger=ledger)
    ]
    segments = await store.load_journal(run_id)
    if segments:
        document["messages"] = [_message(m) for m in read_journal(segments)]
    return document


async def write_export(
    store: InspectedStore,
    run_id: str,
    write: Callable[[str], object],
    *,
    indent: int | None = None,
    ledger: Ledger | None = None,
    page: int = 20,
) -> None:
    """Write ``export_run``'s document as JSON text, reading the run a page at a time.

    ``write`` is given the text piece by piece; put together, it is exactly what
    ``json.dump(await export_run(store, run_id, ledger), file, indent=indent,
    ensure_ascii=False)`` writes. Snapshots are read ``page`` at a time and the journal a
    few segments at a time (see [`JournalReader`][agentsnap.journal.JournalReader]), so
    what is held does not grow with the run, bar 16 bytes a journaled message. The journal
    is read through, and checked, before anything is written. The run's model calls are
    read in one list (the model call log has no paged read), each written as it is encoded.

    Raises:
        NotFoundError: The store holds no such run.
        ValueError: A journal segment is not in the journal's format.
    """
    run = await store.get_run(run_id)
    journal = JournalReader(store, run_id)
    await journal.index()
    rollbacks = [_dumped(RollbackRow.of(r)) for r in await store.list_rollbacks(run_id)]
    tool_calls = [
        _dumped(ToolCall.of(entry)) for entry in await _ledger_calls(store, run_id, ledger)
    ]
    owners = await _owners(store, run_id)

    async def snapshots() -> AsyncIterator[dict[str, Any]]:
        after = 0
        while True:
            found = await store.list_snapshots_page(run_id, after_seq=after, limit=page)
            for snapshot in found:
                yield _dumped(SnapshotDocument.whole(snapshot))
            if len(found) < page:
                return
            after = found[-1].seq

    async def messages() -> AsyncIterator[dict[str, Any]]:
        async for message in journal.messages():
            yield _message(message)

    records = await model_calls(store, run_id, ledger=ledger)
    records.reverse()

    async def calls() -> AsyncIterator[dict[str, Any]]:
        while records:  # each record let go once written
            yield _dumped(ModelCall.of(records.pop()))

    parts: list[tuple[str, Any]] = [
        ("format", EXPORT_FORMAT),
        ("run", _run(run)),
        ("snapshots", snapshots()),
        ("rollbacks", rollbacks),
        ("owners", owners),
        ("tool_calls", tool_calls),
        ("model_calls", calls()),
    ]
    if journal.segments:
        parts.append(("messages", messages()))
    await _write_object(write, parts, indent)


async def _write_object(
    write: Callable[[str], object], parts: list[tuple[str, Any]], indent: int | None
) -> None:
    """Write an object as ``json.dump`` would, its async iterators as arrays."""
    # What opens each level's first item, and what comes between two items.
    if indent is None:
        first = [""] * 3
        between = [", "] * 3
    else:
        first = ["\n" + " " * (indent * level) for level in range(3)]
        between = ["," + lead for lead in first]

    def encode(value: object, level: int) -> str:
        text = json.dumps(value, indent=indent, ensure_ascii=False)
        # JSON text holds no raw newline but those indenting adds: shift them to the level.
        return text.replace("\n", first[level]) if indent else text

    write("{")
    for number, (key, value) in enumerate(parts):
        write((between[1] if number else first[1]) + json.dumps(key, ensure_ascii=False) + ": ")
        if not isinstance(value, AsyncIterator):
            write(encode(value, 1))
            continue
        count = 0
        async for element in value:
            write(between[2] if count else "[" + first[2])
            write(encode(element, 2))
            count += 1
        write(first[1] + "]" if count else "[]")
    write(first[0] + "}" if parts else "}")


async def _on_ledger(
    store: InspectedStore,
    ledger: Ledger | None,
    use: Callable[[Ledger], Awaitable[list[T]]],
) -> list[T]:
    """``use`` ``ledger``, else the ledger in the store's database (nothing without one)."""
    if ledger is not None:
        return await use(ledger)
    opened = ledger_for(store, create=False)
    if opened is None:
        return []
    try:
        return await use(opened)
    finally:
        await opened.close()


async def _ledger_calls(
    store: InspectedStore, run_id: str | None, ledger: Ledger | None
) -> list[LedgerEntry]:
    return await _on_ledger(store, ledger, lambda found: found.list_calls(run_id))


def _dumped(view: BaseModel) -> dict[str, Any]:
    """A result as the export document holds it."""
    return view.model_dump(mode="json")


async def model_calls(
    store: InspectedStore, run_id: str, agent: str | None = None, ledger: Ledger | None = None
) -> list[ModelCallRecord]:
    """A run's model calls (of ``agent``, when given), in the order they were made.

    Args:
        store: The store holding the run.
        run_id: The run's full id.
        agent: Only this agent's calls.
        ledger: Where the calls are recorded (a ledger that is a
            [`ModelCallLog`][agentsnap.model_calls.ModelCallLog]); by default the ledger in
            the store's database (an ``SqlStore``'s), none for other stores.
    """

    async def listed(found: Ledger) -> list[ModelCallRecord]:
        if not isinstance(found, ModelCallLog):
            return []
        return await found.list_model_calls(run_id, agent)

    return await _on_ledger(store, ledger, listed)


def discarded_calls(records: Sequence[ModelCallRecord]) -> list[bool]:
    """For each call, whether it was made on a timeline a rollback discarded.

    A rollback starts a new timeline and the handlers it sends back are executed again, so
    a call whose agent, message and position have a call on a later timeline belongs to a
    discarded one (its answer reached no state that stands).
    """
    latest: dict[tuple[str, str, int], int] = {}
    for r in records:
        place = (r.agent, r.message_id, r.position)
        latest[place] = max(latest.get(place, r.timeline), r.timeline)
    return [r.timeline < latest[(r.agent, r.message_id, r.position)] for r in records]


def answer_line(response: dict[str, Any]) -> str:
    """The first line of a recorded answer's text, else what it holds instead."""
    text = response.get("text")
    if isinstance(text, str):
        for line in text.splitlines():
            if line.strip():
                return line.strip()
    calls = response.get("tool_calls")
    if isinstance(calls, list) and calls:
        names = [c.get("name", "?") if isinstance(c, dict) else "?" for c in calls]
        return "tool calls: " + ", ".join(str(n) for n in names)
    output = response.get("output")
    if output is not None:
        return json.dumps(output, ensure_ascii=False, sort_keys=True)
    return ""


def call_summary(record: ModelCallRecord, discarded: bool) -> CallSummary:
    """A model call as a listing shows it: without its request and answer.

    As in the export document, without ``"request"`` and ``"response"``, plus
    ``"discarded"`` (see [`discarded_calls`][agentsnap.inspect.discarded_calls]) and
    ``"answer"``, the answer's first line (see [`answer_line`][agentsnap.inspect.answer_line]).
    """
    return CallSummary.of(record, discarded=discarded, answer=answer_line(record.response))


def model_call_totals(records: Sequence[ModelCallRecord]) -> ModelCallTotals:
    """How many ``records`` and their tokens, in all and by agent.

    Returns:
        ``calls``, ``input_tokens``, ``output_tokens`` and the same by agent, in ``agents``
        (sorted by name).
    """
    agents: dict[str, list[int]] = {}
    for r in records:
        mine = agents.setdefault(r.agent, [0, 0, 0])
        mine[0] += 1
        mine[1] += r.input_tokens
        mine[2] += r.output_tokens
    return ModelCallTotals(
        calls=len(records),
        input_tokens=sum(r.input_tokens for r in records),
        output_tokens=sum(r.output_tokens for r in records),
        agents={
            name: CallTotals(calls=calls, input_tokens=tokens_in, output_tokens=tokens_out)
            for name, (calls, tokens_in, tokens_out) in sorted(agents.items())
        },
    )


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def following_snapshots(
    records: Sequence[ModelCallRecord], snapshots: Sequence[SnapshotSummary]
) -> list[SnapshotSummary | None]:
    """For each call, the first of ``snapshots`` started when or after the call started.

    That is the cut a call leads to: the calls "made since the previous cut" of a snapshot
    are those that started after the snapshot before it started (the run's start for the
    first) and before it started itself. ``None`` for a call that started after every one.
    """
    ordered = sorted(snapshots, key=lambda s: (_utc(s.started_at), s.seq))
    starts = [_utc(s.started_at) for s in ordered]
    found: list[SnapshotSummary | None] = []
    for record in records:
        at = bisect.bisect_left(starts, _utc(record.started_at))
        found.append(ordered[at] if at < len(ordered) else None)
    return found


def _time(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _run(run: RunInfo) -> dict[str, Any]:
    return {
        "id": run.id,
        "status": run.status.value,
        "created_at": _time(run.created_at),
        "finished_at": _time(run.finished_at),
        "parent_run_id": run.parent_run_id,
        "parent_snapshot_id": run.parent_snapshot_id,
        "metadata": run.metadata,
        "name": run.name,
        "tags": run.tags,
        "status_reason": run.status_reason,
        "traceback": run.traceback,
    }


def previous_snapshot(
    summaries: Sequence[SnapshotSummary], snapshot_id: str
) -> SnapshotSummary | None:
    """The snapshot of ``summaries`` started before snapshot ``snapshot_id`` (``None`` for
    the first, or one not among them): the cut whose start bounds the calls "made since the
    previous cut" (see [`following_snapshots`][agentsnap.inspect.following_snapshots]).
    """  # noqa: D205
    ordered = sorted(summaries, key=lambda s: (_utc(s.started_at), s.seq))
    mine = next((i for i, s in enumerate(ordered) if s.id == snapshot_id), None)
    return ordered[mine - 1] if mine else None


async def _owners(store: InspectedStore, run_id: str) -> list[dict[str, Any]]:
    return [_dumped(OwnerRow.of(owner)) for owner in await store.list_run_owners(run_id)]


def _message(message: JournalMessage) -> dict[str, Any]:
    return {
        **attributes(message, "src", "dst", "seq", "kind", "payload", "headers", "epoch"),
        "sent_at": _time(message.sent_at),
        "delivered_at": _time(message.delivered_at),
    }


# --- Inspection: listings, one snapshot, diffs and histories (behind the CLI's commands) ---


async def resolve_run(store: RunStore, prefix: str) -> RunInfo:
    """The run whose id is ``prefix`` or starts with it.

    Raises:
        NotFoundError: No run's id starts with ``prefix``, or several do (the message
            lists them).
    """
    return await store.get_run(await _one(store, "run", prefix))


async def resolve_snapshot(store: RunStore, prefix: str) -> Snapshot:
    """The snapshot whose id is ``prefix`` or starts with it (in any run).

    Raises:
        NotFoundError: No snapshot's id starts with ``prefix``, or several do.
    """
    return await store.load_snapshot(await _one(store, "snapshot", prefix))


_CANDIDATES = 10
"""How many ids an ambiguous prefix's error names."""


async def _one(store: RunStore, kind: Literal["run", "snapshot"], prefix: str) -> str:
    matches = await store.find_ids(kind, prefix, limit=_CANDIDATES + 1) if prefix else []
    if prefix in matches:
        return prefix
    if not matches:
        raise NotFoundError(kind, prefix)
    if len(matches) > 1:
        names = ", ".join(matches[:_CANDIDATES])
        more = " and more" if len(matches) > _CANDIDATES else ""
        raise NotFoundError(
            kind, prefix, f"{kind} id prefix {prefix!r} is ambiguous: {names}{more}"
        )
    return matches[0]


async def runs_table(store: InspectedStore, **filters: Unpack[RunFilters]) -> list[RunRow]:
    """The runs the filters select (every run without one), oldest first.

    Each row ([`RunRow`][agentsnap.inspect.RunRow]) has the run's ``id``, ``name``,
    ``status`` and ``status_reason`` (why it ended so, in one line), ``traceback`` (a failed
    run's tracebacks, see [`RunInfo.traceback`][agentsnap.RunInfo.traceback]),
    ``cancel_requested``, ``tags``, ``created_at``, ``finished_at``, how many ``snapshots``
    it has, the run and snapshot it was forked from (``parent_run_id``,
    ``parent_snapshot_id``) and its ``metadata``; ``row.model_dump(mode="json")`` is what
    ``agentsnap runs --json`` prints. The filters are those of
    [`Store.list_runs`][agentsnap.store.RunQueries.list_runs].

    Raises:
        ConfigurationError: A filter is invalid.
        TypeError: A keyword is not one of the filters.
    """
    RunFilter.of("runs_table", filters)  # a wrong keyword is named as this function's
    runs = await store.list_runs(**filters)
    counts = await store.snapshot_counts() if runs else {}
    return [RunRow.of(run, counts.get(run.id, 0)) for run in runs]


async def snapshots_table(store: InspectedStore, run_prefix: str) -> list[SnapshotRow]:
    """The snapshots of a run (id or unique prefix), in the order they were started.

    Each is a [`SnapshotRow`][agentsnap.inspect.SnapshotRow].

    A snapshot found damaged in the store has status ``"damaged"``, ``"error"`` saying what
    is wrong and ``"damaged_agents"`` the processes whose part is missing or unreadable.
    Read from the store's summaries (``list_snapshot_summaries``): no snapshot is built.

    Raises:
        NotFoundError: No such run, or the prefix is ambiguous.
    """
    run = await resolve_run(store, run_prefix)
    return [SnapshotRow.of(s) for s in await store.list_snapshot_summaries(run.id)]


async def rollbacks_table(store: InspectedStore, run_prefix: str) -> list[RollbackRow]:
    """The rollbacks of a run (id or unique prefix), oldest first.

    Each is a [`RollbackRow`][agentsnap.inspect.RollbackRow].

    Raises:
        NotFoundError: No such run, or the prefix is ambiguous.
    """
    run = await resolve_run(store, run_prefix)
    return [RollbackRow.of(r) for r in await store.list_rollbacks(run.id)]


async def owners_table(store: InspectedStore, run_prefix: str) -> list[OwnerRow]:
    """Who owned a run (id or unique prefix), and when: each process that took its lease,
    by fencing token, oldest first.

    Each row ([`OwnerRow`][agentsnap.inspect.OwnerRow]) says how the owner ended:
    ``released`` (it stopped cleanly), ``crashed`` (the next owner took the run over) or
    ``holds``. A run that took its lease before the store kept this history lacks those
    owners (see [`list_run_owners`][agentsnap.store.RunQueries.list_run_owners]).

    Raises:
        NotFoundError: No such run, or the prefix is ambiguous.
    """  # noqa: D205
    run = await resolve_run(store, run_prefix)
    return [OwnerRow.of(owner) for owner in await store.list_run_owners(run.id)]


async def tool_calls_table(
    store: InspectedStore, run_prefix: str, ledger: Ledger | None = None
) -> list[ToolCallRow]:
    """The side-effecting tool calls of a run (id or unique prefix), oldest first.

    Each row ([`ToolCallRow`][agentsnap.inspect.ToolCallRow]) is the export document's tool
    call plus ``"unknown"``: whether the call's
    outcome is unknown (it may or may not have happened; settle it with
    ``agentsnap tools resolve``): recorded as unknown, or still in progress although its
    owner stopped (see [`is_orphaned`][agentsnap.ledger.is_orphaned]). The calls come from
    ``ledger``, by default the ledger in the store's database (an ``SqlStore``'s), none for
    other stores.

    Raises:
        NotFoundError: No such run, or the prefix is ambiguous.
    """
    run = await resolve_run(store, run_prefix)
    entries = await _ledger_calls(store, run.id, ledger)
    reported = await _as_reported(store, entries)
    return [
        ToolCallRow.of(entry, unknown=shown.status is ToolCallStatus.UNKNOWN)
        for entry, shown in zip(entries, reported, strict=True)
    ]


async def ledger_calls(
    store: InspectedStore, run_id: str | None = None, ledger: Ledger | None = None
) -> list[LedgerEntry]:
    """The ledger's tool calls (of one run, when ``run_id`` is given), oldest first, with
    the status to report.

    A call still ``in_progress`` whose owner stopped (its process is gone, or its run's
    lease expired or passed to another owner; see
    [`is_orphaned`][agentsnap.ledger.is_orphaned]) is reported ``unknown``, as the ledger
    will record it when a tool or ``reconcile`` next looks at it. Nothing is written.

    Args:
        store: The store holding the runs (and their leases).
        run_id: Only the calls of this run (its full id).
        ledger: The ledger; by default the one in the store's database (an ``SqlStore``'s),
            none for other stores.
    """  # noqa: D205
    return await _as_reported(store, await _ledger_calls(store, run_id, ledger))


async def ledger_calls_table(
    store: InspectedStore, run_id: str | None = None, ledger: Ledger | None = None
) -> list[ToolCallRow]:
    """``ledger_calls`` as rows: each call as in the export document, status as reported,
    plus ``"unknown"``: whether the call's outcome is unknown (settle it with
    ``agentsnap tools resolve``).

    What ``agentsnap tools --json`` prints.
    """  # noqa: D205
    return [
        ToolCallRow.of(entry, unknown=entry.status is ToolCallStatus.UNKNOWN)
        for entry in await ledger_calls(store, run_id, ledger)
    ]


async def model_calls_table(
    store: InspectedStore, run_prefix: str, agent: str | None = None, ledger: Ledger | None = None
) -> ModelCallsTable:
    """A run's model calls (id or unique prefix; of ``agent``, when given), with totals.

    Returns:
        ``run_id``, ``timeline``, ``calls`` and ``totals``. ``calls`` lists the calls in the
        order they were made, each as in the export document plus ``"discarded"``: whether
        the call was made on a timeline a rollback discarded (the same agent, message and
        position have a call on a later timeline: the handler was executed again).
        ``timeline`` is the latest timeline a call of the run was made on. ``totals``
        counts the calls listed and their tokens, in all and by agent (see
        [`model_call_totals`][agentsnap.inspect.model_call_totals]); a discarded call counts
        (the model was asked), a replay does not (it was not).

    Raises:
        NotFoundError: No such run, or the prefix is ambiguous, or the run knows no agent
            ``agent`` (none of its calls or snapshots names it).
    """
    run = await resolve_run(store, run_prefix)
    records = await model_calls(store, run.id, ledger=ledger)
    rows = [
        (r, ModelCallRow.of(r, discarded=discarded))
        for r, discarded in zip(records, discarded_calls(records), strict=True)
    ]
    timeline = max((r.timeline for r in records), default=0)
    if agent is not None:
        if not any(r.agent == agent for r in records):
            summaries = await store.list_snapshot_summaries(run.id)
            if not any(agent in s.agents for s in summaries):
                raise NotFoundError("agent", agent, f"run {run.id} has no agent {agent!r}")
        rows = [(r, row) for r, row in rows if r.agent == agent]
    return ModelCallsTable(
        run_id=run.id,
        timeline=timeline,
        calls=[row for _, row in rows],
        totals=model_call_totals([r for r, _ in rows]),
    )


async def _as_reported(store: InspectedStore, entries: list[LedgerEntry]) -> list[LedgerEntry]:
    """``entries``, those whose owner stopped shown as unknown."""
    leases: dict[str, RunLease | None] = {}
    now = utcnow()
    reported = []
    for entry in entries:
        lease = None
        if entry.status is ToolCallStatus.IN_PROGRESS and entry.run_id is not None:
            if entry.run_id not in leases:
                leases[entry.run_id] = await store.get_lease(entry.run_id)
            lease = leases[entry.run_id]
        if is_orphaned(entry, lease, now):
            entry = dataclasses.replace(entry, status=ToolCallStatus.UNKNOWN)  # noqa: PLW2901
        reported.append(entry)
    return reported


async def show_snapshot(
    store: InspectedStore,
    snapshot_prefix: str,
    agent: str | None = None,
    ledger: Ledger | None = None,
    *,
    models: Mapping[str, type[BaseModel]] | None = None,
) -> SnapshotView:
    """One snapshot: its agents' states, counters and model calls, the messages in flight.

    A [`SnapshotView`][agentsnap.inspect.SnapshotView].

    Each agent's entry has ``"state_version"``, the version of its state class the state was
    stored with. With ``models`` (the current state classes, by agent name: see
    [`read_cut`][agentsnap.inspect.read_cut]) the state of each agent they name is shown as
    that class reads it now, through its upcasters.

    With ``agent``, only that agent's part and the channels into or out of it. A damaged
    snapshot is shown with what could be read, ``"status": "damaged"``, the reason in
    ``"error"`` and the processes whose part is missing or unreadable in
    ``"damaged_agents"`` (such a process, asked for with ``agent``, has no entry in
    ``"agents"``).

    Each agent's entry has ``"model_calls"``: the calls of that agent that started after
    the run's previous snapshot started (``"previous"``: its ``id``, ``seq`` and
    ``started_at``, or ``None`` for the first snapshot, whose calls are those since the
    run began) and before this one started (see
    [`following_snapshots`][agentsnap.inspect.following_snapshots]), from ``ledger``
    (by default the ledger in the store's database, none for other stores). Each call is
    as in the export document without its request and answer, plus ``"discarded"`` (as in
    [`model_calls_table`][agentsnap.inspect.model_calls_table]) and ``"answer"``: the
    first line of the answer's text.

    ``"run"`` says where the snapshot's run stands: its ``status``, ``status_reason`` and
    ``traceback``.

    Raises:
        NotFoundError: No such snapshot (or the prefix is ambiguous), or the snapshot did
            not record ``agent``.
    """
    snapshot = await resolve_snapshot(store, snapshot_prefix)
    run = await store.get_run(snapshot.run_id)
    cuts = snapshot.agents
    damaged = list(snapshot.damaged_agents)
    channels = snapshot.channels
    if agent is not None:
        if agent in snapshot.damaged_agents:
            cuts, damaged = {}, [agent]
        elif agent in snapshot.agents:
            cuts, damaged = {agent: snapshot.agents[agent]}, []
        else:
            raise NotFoundError(
                "agent", agent, f"snapshot {snapshot.id} recorded no agent {agent!r}"
            )
        channels = [c for c in channels if agent in (c.src, c.dst)]
    summaries = await store.list_snapshot_summaries(snapshot.run_id)
    previous = previous_snapshot(summaries, snapshot.id)
    # An agent's own calls tell which of them a rollback discarded: read no other's.
    records = await model_calls(store, snapshot.run_id, agent, ledger) if cuts else []
    calls: dict[str, list[CallSummary]] = {name: [] for name in cuts}
    leads_to = following_snapshots(records, summaries)
    for record, later, discarded in zip(records, leads_to, discarded_calls(records), strict=True):
        if later is not None and later.id == snapshot.id and record.agent in calls:
            calls[record.agent].append(call_summary(record, discarded))
    agents = {}
    for name, cut in cuts.items():
        read = read_cut(name, cut, models) if models else {}
        agents[name] = picked(
            AgentShown,
            cut,
            state=read.get("state", cut.state),
            read_as=read.get("read_as"),
            unreadable=read.get("unreadable"),
            model_calls=calls[name],
        )
    return picked(
        SnapshotView,
        snapshot,
        channels=[ChannelCut.recorded(channel) for channel in channels],
        damaged_agents=damaged,
        agents=agents,
        run=picked(RunStanding, run),
        previous=None if previous is None else picked(PreviousSnapshot, previous),
    )


async def diff_snapshots(
    store: InspectedStore,
    a_prefix: str,
    b_prefix: str,
    agent: str | None = None,
    *,
    models: Mapping[str, type[BaseModel]] | None = None,
) -> SnapshotDiff:
    """What changed in each agent's state from snapshot A to snapshot B.

    A [`SnapshotDiff`][agentsnap.inspect.SnapshotDiff].

    With ``models`` (the current state classes, by agent name) the states of the agents they
    name are compared as those classes read them now (see
    [`read_cut`][agentsnap.inspect.read_cut]): a state stored with an older version is
    upcast first, so a renamed field is not shown as changed.

    Each agent's entry says whether it was ``"added"``, ``"removed"``, ``"changed"`` or
    ``"unchanged"`` and, field by field, what differs (see ``diff_states``). An agent whose
    part of a damaged snapshot is missing or unreadable is ``"damaged"`` (compared as if it
    had no state there); ``"a_damaged"`` and ``"b_damaged"`` say what is wrong with a
    damaged snapshot (``None`` for an intact one). The snapshots may be of two runs (a fork
    and its parent, say): ``"a_run_id"`` and ``"b_run_id"`` name the run of each.

    Raises:
        NotFoundError: No such snapshot (or a prefix is ambiguous), or neither snapshot
            recorded ``agent``.
    """
    a = await resolve_snapshot(store, a_prefix)
    b = await resolve_snapshot(store, b_prefix)
    lost = set(a.damaged_agents) | set(b.damaged_agents)
    names = sorted(set(a.agents) | set(b.agents) | lost)
    if agent is not None:
        if agent not in names:
            raise NotFoundError(
                "agent", agent, f"snapshots {a.id} and {b.id} recorded no agent {agent!r}"
            )
        names = [agent]
    agents = []
    for name in names:
        old = a.agents.get(name)
        new = b.agents.get(name)
        change: AgentChange
        if name in lost and (old is None or new is None):
            change = "damaged"
        elif old is None:
            change = "added"
        elif new is None:
            change = "removed"
        elif old.state_hash == new.state_hash and old.state_version == new.state_version:
            change = "unchanged"
        else:
            change = "changed"
        before = None if old is None else _read_state(name, old, models)
        after = None if new is None else _read_state(name, new, models)
        if change == "changed" and before == after:
            change = "unchanged"  # the same state, once both are read as the code reads them
        agents.append(
            AgentDiff.of(
                diff_states(before, after),
                agent=name,
                change=change,
                a_version=None if old is None else old.state_version,
                b_version=None if new is None else new.state_version,
            )
        )
    return SnapshotDiff(
        a=a.id,
        b=b.id,
        a_run_id=a.run_id,
        b_run_id=b.run_id,
        a_damaged=_damage(a),
        b_damaged=_damage(b),
        agents=agents,
    )


def read_cut(agent: str, cut: AgentCut, models: Mapping[str, type[BaseModel]]) -> dict[str, Any]:
    """An agent's stored state as the current code reads it, for an inspector's views.

    ``models`` are the current state classes, by agent name (an app's:
    [`App.state_models`][agentsnap.distributed.App.state_models]). For an agent they name,
    the state is read through its class's upcasters (see
    [`agentsnap.versions`][agentsnap.versions]).

    Returns:
        ``{}`` for an agent ``models`` does not name (and the environment). Else
        ``"read_as"``, the version the class is at now, and either ``"state"``, the state as
        the class reads it, as JSON, or ``"unreadable"``, why the class cannot read it (the
        stored state is then left as it is).
    """
    model = models.get(agent)
    if model is None or agent == ENVIRONMENT:
        return {}
    current = state_version(model)
    try:
        return {
            "state": read_state_json(agent, model, cut.state_json, cut.state_version),
            "read_as": current,
        }
    except StateNotReadable as exc:
        return {"read_as": current, "unreadable": str(exc)}


def _read_state(
    agent: str, cut: AgentCut, models: Mapping[str, type[BaseModel]] | None
) -> dict[str, Any]:
    """The state to compare: as the code reads it, when it can; else as stored."""
    if models:
        read = read_cut(agent, cut, models)
        if "state" in read:
            state: dict[str, Any] = read["state"]
            return state
    return cut.state


async def check_stored_states(
    store: InspectedStore, models: Mapping[str, type[BaseModel]], run_prefix: str | None = None
) -> list[StoredStates]:
    """Which stored states of a run (or of every run) the current state classes can read.

    Every agent's state in every complete snapshot is read as a resume, rollback or fork
    would read it (see [`read_state`][agentsnap.versions.read_state]); a state stored in
    several snapshots is read once.

    Args:
        store: Where the runs are.
        models: The current state classes, by agent name (an app's:
            [`App.state_models`][agentsnap.distributed.App.state_models]).
        run_prefix: The run (an id or a unique prefix); every run when omitted.

    Returns:
        One row per run, agent and stored version, in the runs' order
        ([`StoredStates`][agentsnap.inspect.StoredStates]): ``"run_id"``,
        ``"agent"``, ``"stored_version"``, ``"current_version"`` (``None`` for an agent
        ``models`` does not name), ``"snapshots"`` (the numbers of the snapshots holding
        such states), ``"readable"`` (how many distinct states the code reads),
        ``"unreadable"`` (how many it cannot) and ``"error"`` (why, for the first state it
        cannot read; ``None`` when it reads them all).

    Raises:
        NotFoundError: No such run, or the prefix is ambiguous.
    """
    if run_prefix is None:
        runs = await store.list_runs()
    else:
        runs = [await resolve_run(store, run_prefix)]
    seen: dict[tuple[str, str, int], StateNotReadable | None] = {}
    rows: list[StoredStates] = []
    for run in runs:
        groups: dict[tuple[str, int], dict[str, Any]] = {}
        for snapshot in await store.list_snapshots(run.id):
            if snapshot.status is not SnapshotStatus.COMPLETE:
                continue
            for name, cut in snapshot.agents.items():
                if name == ENVIRONMENT:
                    continue
                model = models.get(name)
                row = groups.get((name, cut.state_version))
                if row is None:
                    row = groups[name, cut.state_version] = {
                        "run_id": run.id,
                        "agent": name,
                        "stored_version": cut.state_version,
                        "current_version": None if model is None else state_version(model),
                        "snapshots": [],
                        "readable": 0,
                        "unreadable": 0,
                        "error": None,
                        "_hashes": set(),
                    }
                row["snapshots"].append(snapshot.seq)
                if cut.state_hash in row["_hashes"]:
                    continue
                row["_hashes"].add(cut.state_hash)
                if model is None:
                    problem: str | None = (
                        f"the code has no agent {name!r}: a resume of run {run.id} needs it "
                        "registered"
                    )
                else:
                    read = (name, cut.state_hash, cut.state_version)
                    if read not in seen:
                        seen[read] = check_state(name, model, cut.state_json, cut.state_version)
                    found = seen[read]
                    problem = None if found is None else str(found)
                if problem is None:
                    row["readable"] += 1
                else:
                    row["unreadable"] += 1
                    row["error"] = row["error"] or problem
        for group in sorted(groups):
            row = groups[group]
            del row["_hashes"]
            rows.append(StoredStates.model_validate(row))
    return rows


def _damage(snapshot: Snapshot) -> str | None:
    return snapshot.error if snapshot.status is SnapshotStatus.DAMAGED else None


async def agent_history_table(
    store: InspectedStore, run_prefix: str, agent: str
) -> list[HistoryEntry]:
    """One agent's state in each complete snapshot of a run, with what changed each time.

    Each entry is a [`HistoryEntry`][agentsnap.inspect.HistoryEntry].

    ``"changes"`` is ``None`` for the first entry, else the ``diff_states`` from the
    previous entry with a state. An entry from a snapshot found damaged has ``"damaged"``
    set to what is wrong (else ``None``); when the agent's own part is missing or unreadable
    its ``"state"``, ``"state_hash"``, ``"sent"``, ``"received"`` and ``"changes"`` are
    ``None``.

    Raises:
        NotFoundError: No such run (or the prefix is ambiguous), or no snapshot of the run
            recorded the agent.
    """
    run = await resolve_run(store, run_prefix)
    rows = []
    previous: dict[str, Any] | None = None
    for version in await store.agent_history(run.id, agent):
        cut = version.cut
        state = None if cut is None else cut.state
        rows.append(
            HistoryEntry(
                snapshot_id=version.snapshot_id,
                seq=version.snapshot_seq,
                completed_at=version.completed_at,
                damaged=version.damaged,
                state_hash=None if cut is None else cut.state_hash,
                state=state,
                sent=None if cut is None else cut.sent,
                received=None if cut is None else cut.received,
                changes=None if state is None or previous is None else diff_states(previous, state),
            )
        )
        previous = previous if state is None else state
    return rows


async def graph_checkpoints_table(
    store: InspectedStore, run_prefix: str, agent: str | None = None
) -> list[CheckpointRow]:
    """The LangGraph checkpoints of a run's graph agents (or of ``agent``), oldest first.

    Each row ([`CheckpointRow`][agentsnap.inspect.CheckpointRow]) is a checkpoint
    (``agent, thread_id, checkpoint_id, parent_id, step, source, created_at, metadata``)
    and ``"snapshots"``: the numbers of the run's complete snapshots
    whose state of that agent names that checkpoint, the checkpoint a rollback to them
    restores. The checkpoints are found when the graph agents' checkpointer is an
    ``AgentsnapSaver`` on the store's database (see ``GraphCheckpointIndex``; a store that
    does not implement it holds no graph checkpoints, and the table is empty); a
    snapshot names a checkpoint by its id, which a fork's copy of a checkpoint keeps.

    Raises:
        NotFoundError: No such run, or the prefix is ambiguous.
    """
    run = await resolve_run(store, run_prefix)
    if not isinstance(store, GraphCheckpointIndex):
        return []
    checkpoints = await store.list_graph_checkpoints(run.id, agent)
    held: dict[tuple[str, str], list[int]] = {}
    for name in dict.fromkeys(c.agent for c in checkpoints):
        try:
            versions = await store.agent_history(run.id, name)
        except NotFoundError:  # no complete snapshot recorded this agent
            continue
        for version in versions:
            if version.cut is None:  # damaged: the snapshot holds no readable state of it
                continue
            checkpoint_id = version.cut.state.get("checkpoint_id")
            if isinstance(checkpoint_id, str):
                held.setdefault((name, checkpoint_id), []).append(version.snapshot_seq)
    return [
        picked(CheckpointRow, c, snapshots=held.get((c.agent, c.checkpoint_id), []))
        for c in checkpoints
    ]


# --- Forking: a new run from a snapshot, for a program to continue ---


async def fork_run(
    store: InspectedStore,
    snapshot_prefix: str,
    *,
    run_id: str | None = None,
    metadata: Mapping[str, JsonInput] | None = None,
    states: Mapping[str, JsonInput] | None = None,
    name: str | None = None,
    models: Mapping[str, type[BaseModel]] | None = None,
    messages: MessageEdits | None = None,
    tools: ToolsMode = "live",
) -> RunInfo:
    """Add a run that starts from a complete snapshot (id or unique prefix) of another run.

    The new run records its parent run and snapshot, and gets a copy of the snapshot as
    its snapshot 1: the same agent states, counters and messages in flight, under a new id.
    Nothing runs: a program continues the run by creating
    ``Runtime(store=store, run_id=run.id)``, registering the same agents and calling
    ``resume()``. The original run is not touched. ``Runtime.fork_from`` records a fork the
    same way (see [`agentsnap.fork`][agentsnap.fork]), and resumes it at once.

    Args:
        store: The store holding the snapshot; the new run goes there too.
        snapshot_prefix: The snapshot to start from.
        run_id: Id of the new run (32 hex digits are generated when omitted).
        metadata: JSON recorded with the new run.
        states: New states of some agents, by agent name, replacing their recorded states
            in the new run's snapshot 1 (each a JSON object the agent's state model loads).
        name: The new run's name.
        models: The current state classes, by agent name: an edited state of an agent they
            name is validated against its class and recorded with its version (see
            [`fork_snapshot`][agentsnap.fork.fork_snapshot]).
        messages: Messages in flight to drop, edit or add in the new run's snapshot 1 (see
            [`MessageEdits`][agentsnap.fork.MessageEdits]).
        tools: ``"live"`` (the default): the fork's side-effecting tools run for real when
            it is continued, under new keys; ``"dry"``: a what-if fork, whose calls are
            recorded as ``dry`` with their arguments and return the tools' stand-ins (see
            [`ToolsMode`][agentsnap.fork.ToolsMode]).

    Returns:
        The new run.

    Raises:
        NotFoundError: No such snapshot, or the prefix is ambiguous.
        SnapshotDamaged: The snapshot is damaged in the store.
        ConfigurationError: The snapshot failed, or ``run_id`` is taken or longer than 64
            characters, or ``states`` names an agent the snapshot does not hold or gives a
            state that is not a JSON object.
    """
    if run_id is not None:
        check_run_id(run_id)
    snapshot = await resolve_snapshot(store, snapshot_prefix)
    run = await fork_snapshot(
        store,
        snapshot,
        run_id=run_id,
        metadata=metadata,
        states=states,
        name=name,
        models=models,
        messages=messages,
        tools=tools,
    )
    opened = ledger_for(store, create=False)
    if opened is not None:
        try:
            await carry_requests(opened, snapshot, run.id)
        finally:
            await opened.close()
    return run


# --- Requests to people: listing and answering them, from any process ---


async def _request_log(
    store: RunStore, ledger: Ledger | None, use: Callable[[RequestLog], Awaitable[T]]
) -> T:
    """``use`` the request log: ``ledger``, or the ledger in the store's database."""
    if ledger is not None:
        if not isinstance(ledger, RequestLog):
            raise ConfigurationError(f"{ledger!r} keeps no requests to people")
        return await use(ledger)
    opened = ledger_for(store, create=False)
    if opened is None:
        raise ConfigurationError(
            "this store keeps no requests to people of its own: pass the runtime's ledger "
            "(runtime.ledger) to answer from the run's process, or use an SqlStore"
        )
    try:
        assert isinstance(opened, RequestLog)
        return await use(opened)
    finally:
        await opened.close()


def _keeps_requests(store: RunStore) -> bool:
    """Whether the store's database keeps requests (an ``SqlStore``: its ledger does)."""
    return isinstance(store, KeptInDatabase)


async def list_requests(
    store: RunStore,
    run_id: str | None = None,
    *,
    pending: bool = False,
    ledger: Ledger | None = None,
) -> list[HumanRequest]:
    """The requests to people of a run (of every run, with ``None``), oldest first.

    Args:
        store: The store holding the runs.
        run_id: The run's full id, or ``None`` for every run.
        pending: Only the requests that wait for an answer.
        ledger: Where the requests are kept; by default the ledger in the store's database
            (an ``SqlStore``'s). A run on a store in memory has its runtime's ledger
            (``runtime.ledger``).
    """
    if ledger is None and not _keeps_requests(store):
        return []
    return await _request_log(store, ledger, lambda log: log.list_requests(run_id, pending=pending))


async def answer(
    store: RunStore,
    request_id: str,
    value: JsonValue = None,
    *,
    approve: bool | None = None,
    reason: str | None = None,
    by: str | None = None,
    ledger: Ledger | None = None,
) -> HumanRequest:
    """Answer a pending request to a person, from any process (``agentsnap answer``).

    The answer is written to the store; the handler waiting on it gets it when it next
    looks (at once in this process, within a couple of seconds in another), or, when no
    process runs the run, when it is resumed. A question takes ``value``, checked against
    the request's schema; an approval takes ``approve`` (``True``, or ``False`` with a
    ``reason`` the agent can act on).

    Args:
        store: The store holding the run.
        request_id: The request's id (``agentsnap requests`` lists them).
        value: The answer to a question, as JSON.
        approve: For an approval: approve or deny; for a question, ``False`` turns it down
            (the handler's ``ask`` raises ``RequestRejected``).
        reason: Why (a denial's reason reaches the agent).
        by: Who answers, recorded with the answer.
        ledger: Where the request is kept (see [`list_requests`][agentsnap.inspect.list_requests]).

    Returns:
        The request, answered.

    Raises:
        NotFoundError: No request has this id.
        RequestNotPending: It was answered already, expired, or withdrawn by a rollback.
        AnswerInvalid: The answer does not fit the request's schema, or its kind.
    """
    return await _request_log(
        store,
        ledger,
        lambda log: answer_request(
            log, request_id, answer=value, approve=approve, reason=reason, by=by
        ),
    )


async def approve(
    store: RunStore,
    request_id: str,
    *,
    reason: str | None = None,
    by: str | None = None,
    ledger: Ledger | None = None,
) -> HumanRequest:
    """Approve a pending approval request: the waiting call goes on to the ledger and runs.

    See [`answer`][agentsnap.inspect.answer].
    """
    return await answer(store, request_id, approve=True, reason=reason, by=by, ledger=ledger)


async def deny(
    store: RunStore,
    request_id: str,
    reason: str,
    *,
    by: str | None = None,
    ledger: Ledger | None = None,
) -> HumanRequest:
    """Deny a pending approval request (or turn a question down) with a reason.

    The waiting call raises [`ApprovalDenied`][agentsnap.ApprovalDenied] with ``reason``
    (a question's ``ask`` raises [`RequestRejected`][agentsnap.RequestRejected]). See
    [`answer`][agentsnap.inspect.answer].
    """
    return await answer(store, request_id, approve=False, reason=reason, by=by, ledger=ledger)


_STATE_PARTS = ("memory", "plan", "tool_calls")


def diff_states(old: dict[str, Any] | None, new: dict[str, Any] | None) -> StateDiff:
    """A structured diff of two agent states (``None`` for a missing one).

    Returns:
        ``memory``, ``tool_calls`` and ``fields`` (every other state field), each a
        [`MappingDiff`][agentsnap.inspect.MappingDiff] (``added``, ``removed``, ``changed``;
        tool calls keyed by their idempotency key, else ``#index``), and ``plan``, the steps
        that differ ([`PlanChange`][agentsnap.inspect.PlanChange]).
    """
    old = old or {}
    new = new or {}
    others = sorted((set(old) | set(new)) - set(_STATE_PARTS))
    old_plan = _as_list(old.get("plan"))
    new_plan = _as_list(new.get("plan"))
    plan: list[PlanChange] = []
    for index in range(max(len(old_plan), len(new_plan))):
        before = old_plan[index] if index < len(old_plan) else None
        after = new_plan[index] if index < len(new_plan) else None
        if before == after:
            continue
        change: Literal["added", "removed", "changed"] = (
            "added"
            if index >= len(old_plan)
            else "removed"
            if index >= len(new_plan)
            else "changed"
        )
        plan.append(PlanChange(index=index, change=change, old=before, new=after))
    return StateDiff(
        memory=MappingDiff.between(_as_dict(old.get("memory")), _as_dict(new.get("memory"))),
        plan=plan,
        tool_calls=MappingDiff.between(
            _by_key(_as_list(old.get("tool_calls"))), _by_key(_as_list(new.get("tool_calls")))
        ),
        fields=MappingDiff.between(
            {k: old[k] for k in others if k in old}, {k: new[k] for k in others if k in new}
        ),
    )


def is_empty_diff(diff: StateDiff) -> bool:
    """Whether a ``diff_states`` result records no change at all (``diff.empty``)."""
    return diff.empty


def _as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _as_dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _by_key(calls: list[Any]) -> dict[str, Any]:
    keyed: dict[str, Any] = {}
    for index, call in enumerate(calls):
        key = call.get("key") if isinstance(call, dict) else None
        keyed[key if isinstance(key, str) and key not in keyed else f"#{index}"] = call
    return keyed


# --- Bisecting: where a run went wrong ---


@dataclasses.dataclass
class BisectResult:
    """What [`bisect_run`][agentsnap.inspect.bisect_run] found.

    Attributes:
        first_bad: The first complete snapshot where the predicate is false (``None`` when
            it holds at every one).
        last_good: The last complete snapshot before it where the predicate holds (``None``
            when it is false already at the first snapshot, or the run has none).
        diff: ``diff_snapshots`` from ``last_good`` to ``first_bad`` (``None`` without both).
        checked: How many snapshots the predicate was evaluated on.
        holds_at_first: Whether the predicate holds at the first complete snapshot: when it
            does not, the search assumption is broken and ``first_bad`` is that first one.
        snapshots: How many complete snapshots the run has.
    """

    first_bad: Snapshot | None
    last_good: Snapshot | None
    diff: SnapshotDiff | None
    checked: int
    holds_at_first: bool
    snapshots: int


async def bisect_run(
    store: InspectedStore, run_prefix: str, predicate: Callable[[dict[str, Any]], bool]
) -> BisectResult:
    """Find, by binary search, the first complete snapshot of a run where ``predicate`` is false.

    ``predicate`` is given ``{agent: state}`` (each state as the JSON object stored; the
    environment ``$env`` left out) and says whether the run is still good there. The search
    assumes the predicate holds at the first complete snapshot and, once false, stays false
    at every later one, as ``git bisect`` does; it evaluates it on about log2(n) of the n
    snapshots. The first snapshot is always checked: when the predicate is false there, the
    result says so (``holds_at_first`` is ``False``, ``first_bad`` is that snapshot and
    nothing is searched). When the predicate holds at the last snapshot, nothing went bad:
    ``first_bad`` is ``None`` and ``last_good`` the last snapshot. If the predicate flips
    back and forth, the snapshot found is one where it is false right after one where it
    holds, not necessarily the first such.

    Args:
        store: The store holding the run.
        run_prefix: The run (id or unique prefix).
        predicate: True where the states are good.

    Raises:
        NotFoundError: No such run, or the prefix is ambiguous.
    """
    run = await resolve_run(store, run_prefix)
    ids = [
        s.id
        for s in await store.list_snapshot_summaries(run.id)
        if s.status is SnapshotStatus.COMPLETE
    ]
    checked = 0
    loaded: dict[str, Snapshot] = {}

    async def good(position: int) -> bool:
        nonlocal checked
        snapshot = loaded[ids[position]] = await store.load_snapshot(ids[position])
        checked += 1
        states = {name: cut.state for name, cut in snapshot.agents.items() if name != ENVIRONMENT}
        return bool(predicate(states))

    if not ids:
        return BisectResult(None, None, None, 0, True, 0)
    if not await good(0):
        return BisectResult(loaded[ids[0]], None, None, checked, False, len(ids))
    last = len(ids) - 1
    if last == 0 or await good(last):
        return BisectResult(None, loaded[ids[last]], None, checked, True, len(ids))
    low, high = 0, last  # good at low, bad at high
    while high - low > 1:
        middle = (low + high) // 2
        if await good(middle):
            low = middle
        else:
            high = middle
    last_good, first_bad = loaded[ids[low]], loaded[ids[high]]
    diff = await diff_snapshots(store, last_good.id, first_bad.id)
    return BisectResult(first_bad, last_good, diff, checked, True, len(ids))


# --- Acting on runs: run an app, resume or cancel a run; its history of handlers -------------


async def run_app(
    store: OneProcessStore,
    app: App,
    payload: JsonInput,
    *,
    to: str | None = None,
    run_id: str | None = None,
    name: str | None = None,
    started: Callable[[str], None] | None = None,
) -> RunInfo:
    """Start a run of ``app`` in this process, ``payload`` sent to agent ``to`` (by default
    the app's first agent), and run it until it has nothing left to do.

    What ``agentsnap run --app MODULE:FACTORY --input JSON`` does. The app is an
    [`App`][agentsnap.distributed.App], as a run spread over processes takes it: its
    agents, checks, retry policy, redaction and approvals make a
    [`Runtime`][agentsnap.Runtime] on ``store``. ``started`` is called with the run's id
    once the run is recorded, before anything is delivered: a process that dies after it
    leaves a run that [`resume_app`][agentsnap.inspect.resume_app] finishes.

    Returns:
        The run as the store holds it once its runtime closed: ``succeeded``; ``failed``,
        with its ``status_reason`` and ``traceback``; ``cancelled`` (see
        [`cancel_run`][agentsnap.inspect.cancel_run]); or ``interrupted``.

    Raises:
        ConfigurationError: ``to`` is not an agent of the app, or the store already holds
            run ``run_id``.
    """  # noqa: D205
    from agentsnap._running import run_to_end  # noqa: PLC0415 (imports the runtime)

    if run_id is not None:
        try:
            await store.get_run(check_run_id(run_id))
        except NotFoundError:
            pass
        else:
            raise ConfigurationError(
                f"the store already holds run {run_id}: resume it (`agentsnap resume "
                f"{run_id}`), or leave the run id out to start a new run"
            )
    target = to if to is not None else app.names[0] if app.names else None
    if target is None or target not in app.names:
        known = ", ".join(repr(n) for n in app.names) or "none"
        raise ConfigurationError(
            f"the input goes to agent {target!r}, which is not an agent of the app (its "
            f"agents: {known}); pass one of them (--to)"
        )

    async def begin(runtime: Runtime) -> str:
        runtime.send(target, payload)
        await runtime.start()
        return runtime.run_id

    return await run_to_end(app, store, begin, started, run_id=run_id, name=name)


async def resume_app(
    store: OneProcessStore,
    app: App,
    run_prefix: str,
    *,
    wait: float | None = None,
    resumed: Callable[[str], None] | None = None,
) -> RunInfo:
    """Resume a run of ``app`` (its id or a unique prefix) in this process, and run it to
    its end: what ``agentsnap resume RUN --app MODULE:FACTORY`` does.

    The run is taken over as [`Runtime.resume`][agentsnap.Runtime.resume] takes it: back
    to its last complete snapshot, its handlers re-executed in the order logged, recorded
    model answers and tool results given back, so each effect happens once. ``resumed`` is
    called with the id of the snapshot it continues from.

    Args:
        store: The store holding the run.
        app: The app the run was started with (the same agents, by name).
        run_prefix: The run's id, or a unique prefix of it.
        wait: Seconds to wait for a silent owner elsewhere to lose its lease (see
            ``Runtime.resume``); a live process of this host is refused at once.
        resumed: Called with the id of the snapshot the run continues from.

    Returns:
        The run as the store holds it once its runtime closed.

    Raises:
        NotFoundError: No run's id starts with ``run_prefix``, or several do.
        RunOwnedError: A live process owns the run.
        ConfigurationError: The run succeeded, and has nothing left to do; or it has
            agents the app does not have.
    """  # noqa: D205
    from agentsnap._running import run_to_end  # noqa: PLC0415 (imports the runtime)

    run = await resolve_run(store, run_prefix)
    if run.status is RunStatus.SUCCEEDED:
        finished = _time(run.finished_at) or "?"
        raise ConfigurationError(
            f"run {run.id} already finished (succeeded, at {finished}): there is nothing to "
            "resume; fork a new run from one of its snapshots (`agentsnap fork`)"
        )
    snapshots = await store.list_snapshots(run.id)
    recorded = next((s for s in reversed(snapshots) if s.status is SnapshotStatus.COMPLETE), None)
    if recorded is not None:
        unknown = sorted(set(recorded.agents) - {ENVIRONMENT, *app.names})
        if unknown:
            raise ConfigurationError(
                f"run {run.id} has agents the app does not have ({', '.join(unknown)}): "
                "resume it with the app it was started with (--app)"
            )

    async def begin(runtime: Runtime) -> str:
        return (await runtime.resume(wait=wait)).id

    return await run_to_end(app, store, begin, resumed, run_id=run.id)


async def cancel_run(
    store: InspectedStore,
    run_prefix: str,
    reason: str = "cancelled on request",
    *,
    wait: float = 0.0,
) -> RunInfo:
    """Ask a run (its id or a unique prefix) to stop: what ``agentsnap cancel RUN`` does.

    A run that a live runtime owns gets the request in the store; its runtime sees it at
    its next lease renewal (within a third of its lease, 5 seconds by default), delivers
    nothing more (the handlers under way finish), raises
    [`RunCancelled`][agentsnap.RunCancelled] from ``run_until_idle`` and is recorded
    ``cancelled`` when it closes. A run no process runs (``interrupted``, or ``created``) is
    recorded ``cancelled`` at once. Either way ``resume()`` (``agentsnap resume``) continues
    it later, and withdraws the request.

    Args:
        store: The store holding the run.
        run_prefix: The run's id, or a unique prefix of it.
        reason: Why, recorded as the run's ``status_reason``.
        wait: Seconds to wait for the owner to stop the run; ``0`` returns once the request
            is recorded.

    Returns:
        The run as the store holds it then (``running`` with ``cancel_requested`` set while
        its owner has not stopped yet).

    Raises:
        NotFoundError: No run's id starts with ``run_prefix``, or several do.
        ConfigurationError: The run has ended (succeeded, failed or cancelled already),
            or it is spread over processes (only one-process runs are cancelled so).
    """
    from agentsnap.distributed.app import PROCESSES  # noqa: PLC0415 (a metadata key only)

    run = await resolve_run(store, run_prefix)
    if run.status in {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}:
        raise ConfigurationError(
            f"run {run.id} has ended ({run.status.value}): nothing runs to cancel"
        )
    if PROCESSES in run.metadata:
        raise ConfigurationError(
            f"run {run.id} is spread over processes, whose coordinator does not look for "
            "cancel requests: stop the program running its DistributedRun instead"
        )
    await store.request_cancel(run.id, reason)
    if run.status is not RunStatus.RUNNING:  # nobody owns it to see the request
        await store.finish_run(
            run.id, RunStatus.CANCELLED, utcnow(), f"{reason} (while no process ran it)"
        )
        return await store.get_run(run.id)
    deadline = utcnow().timestamp() + wait
    while True:
        run = await store.get_run(run.id)
        if run.status is not RunStatus.RUNNING or utcnow().timestamp() >= deadline:
            return run
        await asyncio.sleep(0.1)


async def events_table(
    store: InspectedStore,
    run_prefix: str,
    *,
    agent: str | None = None,
    kind: str | None = None,
    grep: str | None = None,
    ledger: Ledger | None = None,
) -> list[EventRow]:
    """A run's handler executions (its id or a unique prefix), in the order they began.

    Each is an [`EventRow`][agentsnap.inspect.EventRow].

    Each time an agent takes a message its handler runs once; each row says what that
    execution did, from what the store keeps (the journal, the replay log, the ledger and
    the recorded model calls):

    - ``index``: its place in the run's history; ``agent``; ``message``: the id of the
      message taken (``src>dst#seq``), its ``kind`` and ``payload``;
    - ``started_at``: when the agent took it; ``duration_ms``: from then to the last act
      recorded for it (a message sent, a model's answer, a tool call claimed), ``None``
      when it did none; ``timeline``: how many rollbacks came before it;
    - ``sent``: the messages it sent (``to``, ``seq``, ``kind``, ``payload``);
    - ``tool_calls``: its side-effecting tool calls (``tool``, ``key``, ``status``,
      ``arguments``, ``attempts``);
    - ``model_calls``: its model calls (``position``, ``model``, ``latency_ms``, tokens,
      ``replays``: how often a re-execution got the recorded answer).

    A run that kept no journal (``Runtime(journal=False)``) is read from its replay log:
    the messages each agent took, in order, with ``kind``, ``payload``, ``started_at`` and
    ``duration_ms`` ``None`` and nothing in ``sent``. A message handled again after a
    rollback, or re-executed after a resume, is an execution each time.

    Args:
        store: The store holding the run.
        run_prefix: The run's id, or a unique prefix of it.
        agent: Only this agent's executions.
        kind: Only executions of messages of this kind.
        grep: Only executions whose row holds this text, whatever its case.
        ledger: Where tool and model calls are recorded (by default the ledger in the
            store's database, none for other stores).

    Raises:
        NotFoundError: No run's id starts with ``run_prefix``, or several do.
    """
    from agentsnap._events import executions, matches  # noqa: PLC0415

    run = await resolve_run(store, run_prefix)
    segments = await store.load_journal(run.id)
    found = executions(
        messages=read_journal(segments) if segments else None,
        replay=[] if segments else await store.load_replay(run.id),
        rollbacks=await store.list_rollbacks(run.id),
        tool_calls=await _ledger_calls(store, run.id, ledger),
        model_calls=await model_calls(store, run.id, None, ledger),
    )
    rows = [execution.row(index) for index, execution in enumerate(found, 1)]
    return [row for row in rows if matches(row, agent=agent, kind=kind, grep=grep)]
