"""Which agent rows a snapshot writes: one per process, or only those changed since its base.

A complete snapshot of a run is stored *full*, one ``agentsnap_snapshot_agents`` row per
process, or as a *delta*: its row in ``agentsnap_snapshots`` names a full snapshot of the same
run, its ``base_id``, and it holds rows only for the processes whose part (state hash, sent
and received counters, as the text stored) differs from the base's, and for those the base
does not have. Its ``agent_rows`` says how many rows it holds itself, so that a reader finds
a lost row instead of taking the base's row in its place. A reader overlays a delta's own
rows on its base's: a snapshot is at most two snapshots' rows, never a chain.

The store decides per snapshot, from what it wrote itself (nothing is read back): it
remembers, per run, the last full snapshot it wrote and committed, with each process's
``(state hash, sent, received)``. A snapshot is written as a delta over that base when

* it is complete (a failed snapshot holds no rows, and is never a base),
* it holds every process the base holds,
* fewer than half of its processes need a row of their own (past that, a full snapshot costs
  about as much, and starts a base that later snapshots differ less from), and
* fewer than ``DELTAS_PER_BASE`` (100) deltas were written over the base, so that a
  damaged base row damages a bounded number of snapshots.

Otherwise it is written full and, once committed, becomes the run's base. A store that
starts (a new process, a resumed run) remembers no base: its first snapshot of a run is full.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

from agentsnap.records import Snapshot, SnapshotStatus

__all__ = ["DELTAS_PER_BASE", "AgentRow", "Bases", "RowPlan"]

DELTAS_PER_BASE = 100
"""Most snapshots written as deltas over one full snapshot; the next one is full."""

REMEMBERED_PARTS = 100_000
"""Most processes' parts remembered over every run's base; the runs written to longest ago
are forgotten first (their next snapshot is full)."""

AgentRow = tuple[str, str, str, str, str, int]
"""``(snapshot id, process, state hash, sent, received, state version)``: one
``agentsnap_snapshot_agents`` row, counters as JSON text."""


class RowPlan(NamedTuple):
    """The agent rows of one snapshot, and how its snapshot row refers to its base."""

    run_id: str
    snapshot_id: str
    rows: list[AgentRow]
    """The rows to write."""
    base_id: str | None = None
    """The full snapshot the rows extend (``None``: the snapshot is full)."""
    agent_rows: int | None = None
    """For a delta, how many rows it holds itself (``len(rows)``)."""
    parts: dict[str, AgentRow] | None = None
    """For a full complete snapshot, its rows by process: the run's base once committed."""


class _Base:
    __slots__ = ("deltas", "id", "parts")

    def __init__(self, snapshot_id: str, parts: dict[str, AgentRow]) -> None:
        self.id = snapshot_id
        self.parts = parts
        self.deltas = 0


class Bases:
    """The base of each run a store writes to, and the choice of each snapshot's rows."""

    def __init__(self) -> None:
        self._runs: OrderedDict[str, _Base] = OrderedDict()
        self._parts = 0

    def plan(self, snapshot: Snapshot, rows: list[AgentRow]) -> RowPlan:
        """The rows to write of ``rows``, the snapshot's full rows in its agents' order."""
        run_id, snapshot_id = snapshot.run_id, snapshot.id
        if snapshot.status is not SnapshotStatus.COMPLETE:
            return RowPlan(run_id, snapshot_id, rows)
        base = self._runs.get(run_id)
        if base is not None and base.deltas < DELTAS_PER_BASE and len(base.parts) <= len(rows):
            parts = base.parts
            own: list[AgentRow] = []
            shared = 0
            most = (len(rows) - 1) // 2  # fewer than half
            # No object is made per process: at 10,000 of them, allocations would bring the
            # garbage collector's full passes over everything the run holds.
            for row in rows:
                held = parts.get(row[1])
                if held is not None:
                    shared += 1
                    if (
                        held[2] == row[2]
                        and held[3] == row[3]
                        and held[4] == row[4]
                        and held[5] == row[5]
                    ):
                        continue
                own.append(row)
                if len(own) > most:
                    break
            else:
                if shared == len(parts):
                    return RowPlan(run_id, snapshot_id, own, base.id, len(own))
        return RowPlan(run_id, snapshot_id, rows, parts={row[1]: row for row in rows})

    def committed(self, plan: RowPlan) -> None:
        """``plan`` is written: a full snapshot becomes its run's base."""
        runs = self._runs
        if plan.base_id is not None:
            base = runs.get(plan.run_id)
            if base is not None and base.id == plan.base_id:
                base.deltas += 1
                runs.move_to_end(plan.run_id)
            return
        if plan.parts is None:
            return
        self.forget(plan.run_id)
        runs[plan.run_id] = _Base(plan.snapshot_id, plan.parts)
        self._parts += len(plan.parts)
        while self._parts > REMEMBERED_PARTS and len(runs) > 1:
            _, oldest = runs.popitem(last=False)
            self._parts -= len(oldest.parts)

    def forget(self, run_id: str) -> None:
        """Forget the run's base: its next snapshot is written full."""
        base = self._runs.pop(run_id, None)
        if base is not None:
            self._parts -= len(base.parts)

    def clear(self) -> None:
        """Forget every run's base."""
        self._runs.clear()
        self._parts = 0

    def __contains__(self, run_id: str) -> bool:
        return run_id in self._runs
