"""The workload the fault tests run while the database fails, and what it reports.

Eight token chains run round a ring of four agents: each token is delivered ``hops`` times,
each delivery calls two side-effecting tools, one with an explicit idempotency key and one
with a key the runtime derives (as in ``tests/guarantees/crash_workflow.py``, whose effects
go to a service in another process; here the run is in-process, so the outside world is a
counter in memory), then passes the token on. Snapshots are taken every 50 ms and the
journal is on, so every kind of write the runtime makes (ledger claims and outcomes, replay
log, snapshots, journal, lease renewals) is in flight when the fault strikes.

[`run_under_fault`][] starts the run, injects the fault once a quarter of the hops are done,
clears it after its duration and lets the run finish, then reads back what the store holds
and returns a [`FaultReport`][]. ``FaultReport.problems()`` lists every broken guarantee.

The tools are declared without ``rerun_if_unknown``: a tool body that runs twice is an effect
that happened twice, whatever the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import resource
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import Field

from agentsnap import (
    ENVIRONMENT,
    Agent,
    AgentState,
    Context,
    Message,
    Runtime,
    SnapshotPolicy,
    SnapshotStatus,
    ToolCall,
    tool,
)
from agentsnap.integrity import cut_problems
from agentsnap.records import JournalSegment, Snapshot
from agentsnap.store.sql import SqlStore
from agentsnap.testing import bus_of

__all__ = [
    "MAX_RSS_GROWTH",
    "Fault",
    "FaultReport",
    "RetryLayerMissing",
    "Workload",
    "open_store",
    "run_under_fault",
]

MAX_RSS_GROWTH = 100 << 20
"""Resident memory the process may gain during an outage (generous: it should stay flat)."""
EXPLICIT = "fault_explicit_effect"
DERIVED = "fault_derived_effect"


@dataclass(frozen=True)
class Workload:
    """The shape of the run, and the retry policy its store gets.

    Attributes:
        chains: Tokens passed round the ring at once.
        agents: Agents in the ring.
        hops: Deliveries of each token.
        pace: Seconds a handler sleeps between its two tool calls.
        snapshot_every: Seconds between policy snapshots.
        fault_after: Fraction of all hops done when the fault is injected.
        timeout: ``StoreRetry.timeout``: seconds per database attempt.
        deadline: ``StoreRetry.deadline``: seconds an operation keeps retrying.
        retry: Give the store ``StoreRetry(timeout, deadline)``; ``False`` makes it as
            ``SqlStore(url)``, with the library's defaults.
        lease: The runtime's lease on its run, in seconds.
        hang: Seconds after which a run that has not finished is given up on.
    """

    chains: int = 8
    agents: int = 4
    hops: int = 40
    pace: float = 0.003
    snapshot_every: float = 0.05
    fault_after: float = 0.25
    timeout: float = 1.0
    deadline: float = 60.0
    retry: bool = True
    lease: float = 15.0
    hang: float = 90.0

    @property
    def expected_hops(self) -> int:
        """Deliveries of a complete run."""
        return self.chains * self.hops

    def agent_names(self) -> list[str]:
        """The ring, in order."""
        return [f"a{i}" for i in range(self.agents)]

    def expected_effects(self) -> set[str]:
        """Every effect of a complete run."""
        return {
            effect_id(name, chain, hop)
            for name in (EXPLICIT, DERIVED)
            for chain in range(self.chains)
            for hop in range(self.hops)
        }


@dataclass(frozen=True)
class Fault:
    """A fault to inject: how to start it, how to clear it, how long it lasts.

    ``inject`` and ``clear`` are plain blocking calls (stopping a server takes a while); the
    workload runs them in a thread so that the run's event loop goes on meanwhile.

    Attributes:
        name: What the fault is, for reports.
        inject: Starts the fault.
        clear: Ends it; returns once the database is reachable again.
        duration: Seconds between the end of ``inject`` and the start of ``clear``.
    """

    name: str
    inject: Callable[[], object]
    clear: Callable[[], object]
    duration: float


class RetryLayerMissing(Exception):
    """``agentsnap.store.faults.StoreRetry`` or ``SqlStore(retry=...)`` is not there."""


def open_store(url: str, workload: Workload) -> SqlStore:
    """An ``SqlStore`` on ``url`` with the workload's retry policy.

    Raises:
        RetryLayerMissing: The retry layer has not landed yet.
    """
    if not workload.retry:
        return SqlStore(url)
    try:
        from agentsnap.store.faults import StoreRetry  # type: ignore[import-not-found, unused-ignore]
    except ImportError as exc:
        raise RetryLayerMissing(
            f"agentsnap.store.faults.StoreRetry cannot be imported: {exc}"
        ) from exc
    policy = StoreRetry(timeout=workload.timeout, deadline=workload.deadline)
    try:
        store: SqlStore = SqlStore(url, retry=policy)  # type: ignore[call-arg, unused-ignore]
    except TypeError as exc:
        raise RetryLayerMissing(f"SqlStore does not take retry= yet: {exc}") from exc
    return store


# -- the outside world ------------------------------------------------------------------------


def effect_id(tool_name: str, chain: int, hop: int) -> str:
    """The name of one logical effect."""
    return f"{tool_name}:{chain}:{hop}"


@dataclass
class World:
    """What the run did outside the database, as it happened.

    Attributes:
        effects: Executions of each effect's tool body.
        keys: The idempotency keys each effect was executed under.
        progress: ``time.monotonic()`` of every hop completed (both effects done).
        completed: Completions of each ``chain:hop`` (more than one when a rollback made
            a handler run again).
    """

    effects: Counter[str] = field(default_factory=Counter)
    keys: dict[str, set[str]] = field(default_factory=dict)
    progress: list[float] = field(default_factory=list)
    completed: Counter[str] = field(default_factory=Counter)
    _waiting: tuple[int, asyncio.Event] | None = None

    def hop_done(self, chain: int, hop: int) -> None:
        """A hop completed (both effects done, the token passed on)."""
        self.completed[f"{chain}:{hop}"] += 1
        self.progress.append(time.monotonic())
        if self._waiting is not None and len(self.progress) >= self._waiting[0]:
            self._waiting[1].set()

    async def reached(self, hops: int) -> None:
        """Return once ``hops`` hops are done."""
        event = asyncio.Event()
        self._waiting = (hops, event)
        if len(self.progress) < hops:
            await event.wait()
        self._waiting = None

    def record(self, call: ToolCall, chain: int, hop: int) -> str:
        effect = effect_id(call.tool, chain, hop)
        self.effects[effect] += 1
        self.keys.setdefault(effect, set()).add(str(call.key))
        return effect


_worlds: dict[str, World] = {}
"""The world of each run in progress, by run id (the tools find theirs from the call)."""


def _world(call: ToolCall) -> World:
    world = _worlds.get(call.run_id or "")
    if world is None:
        raise RuntimeError(f"no workload is running for run {call.run_id}")
    return world


@tool(side_effect=True, name=EXPLICIT)
async def explicit_effect(call: ToolCall, chain: int, hop: int) -> str:
    """An effect the caller names with ``key=``."""
    return _world(call).record(call, chain, hop)


@tool(side_effect=True, name=DERIVED)
async def derived_effect(call: ToolCall, chain: int, hop: int) -> str:
    """An effect whose key the runtime derives from the run, agent, message and call."""
    return _world(call).record(call, chain, hop)


class RelayState(AgentState):
    handled: list[str] = Field(default_factory=list)
    """``chain:hop`` of every delivery handled, in order."""


class Relay(Agent[RelayState]):
    """Handles one hop of a token: two effects, then the token goes to the next agent."""

    def __init__(self, name: str, after: str, workload: Workload, world: World) -> None:
        super().__init__(name)
        self.after = after
        self.workload = workload
        self.world = world

    async def handle(self, message: Message, ctx: Context[RelayState]) -> None:
        payload = message.payload
        assert isinstance(payload, dict)
        chain, hop = int(str(payload["chain"])), int(str(payload["hop"]))
        self.state.handled.append(f"{chain}:{hop}")
        await explicit_effect(ctx, key=f"{ctx.run_id}:{chain}:{hop}", chain=chain, hop=hop)
        await asyncio.sleep(self.workload.pace)
        await derived_effect(ctx, chain=chain, hop=hop)
        if hop + 1 < self.workload.hops:
            ctx.send(self.after, {"chain": chain, "hop": hop + 1}, kind="token")
        self.world.hop_done(chain, hop)


# -- measuring ----------------------------------------------------------------------------


def rss_bytes() -> int:
    """The process's resident set size now (Linux ``/proc``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * resource.getpagesize()


class RssSampler:
    """Samples the RSS every ``every`` seconds in a thread; ``peak`` is the highest seen."""

    def __init__(self, every: float = 0.01) -> None:
        self.every = every
        self.baseline = rss_bytes()
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, rss_bytes())

    @contextlib.contextmanager
    def running(self) -> Iterator[RssSampler]:
        """Sample while the block runs."""
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, rss_bytes())


# -- the report ---------------------------------------------------------------------------


@dataclass
class FaultReport:
    """What a run under a fault did, and what the store holds of it afterwards.

    Attributes:
        fault: The fault's name (``"none"`` without one).
        url: The database (with the proxy's port where there is one).
        hops_done: Hops completed (both effects done), each counted once.
        hops_redone: Completions of hops beyond the first (handlers a rollback re-ran).
        rollbacks: Rollbacks of the run in the store (a run that outlasts the retry deadline
            rolls back to its last cut and redoes the work).
        hops_expected: Deliveries of a complete run.
        hops_at_fault: Deliveries completed when the fault was injected.
        hops_at_heal: Deliveries completed when the fault was cleared.
        effects_twice: Effects whose tool body ran more than once.
        effects_missing: Effects of a complete run that never ran.
        chains_incomplete: Tokens whose hops the agents' final states do not hold exactly once.
        status: The run's status in the store after the runtime closed.
        snapshots_stored: Snapshots of the run in the store (complete or failed).
        snapshots_complete: Complete snapshots among them.
        snapshots_after_heal: Complete snapshots started after the fault was cleared.
        snapshot_problems: What is wrong with complete snapshots (not whole, or not a
            consistent cut).
        journal_problems: Sends or deliveries the journal lacks, or holds twice when the run
            never rolled back (after a rollback the journal holds both timelines).
        journal_repeats: Channels and events (send, deliver) with numbers the journal holds
            more than once.
        rss_before: Resident memory when the fault was injected, in bytes.
        rss_peak: The highest resident memory seen until the fault was cleared.
        fault_seconds: From the start of injecting to the end of clearing.
        recovery_seconds: From the end of clearing to the next completed hop.
        elapsed: Seconds the whole run took.
        handler_failures: Handler failures the runtime recorded.
        unraisable: Exceptions raised where nobody could catch them (in ``__del__``, say: a
            connection deleted while still open) while the workload ran.
        error: What went wrong in the workload itself (not a broken guarantee), if anything.
    """

    fault: str
    url: str
    hops_expected: int
    hops_done: int = 0
    hops_redone: int = 0
    rollbacks: int = 0
    hops_at_fault: int | None = None
    hops_at_heal: int | None = None
    effects_twice: int = 0
    effects_missing: int = 0
    chains_incomplete: int = 0
    status: str = "unknown"
    snapshots_stored: int = 0
    snapshots_complete: int = 0
    snapshots_after_heal: int = 0
    snapshot_problems: list[str] = field(default_factory=list)
    journal_problems: list[str] = field(default_factory=list)
    journal_repeats: int = 0
    rss_before: int = 0
    rss_peak: int = 0
    fault_seconds: float | None = None
    recovery_seconds: float | None = None
    elapsed: float = 0.0
    handler_failures: list[str] = field(default_factory=list)
    unraisable: list[str] = field(default_factory=list)
    error: str | None = None
    details: list[str] = field(default_factory=list)
    """Examples behind the figures (which effects ran twice, ...)."""

    @property
    def rss_growth(self) -> int:
        """How much resident memory grew during the outage, in bytes."""
        return max(0, self.rss_peak - self.rss_before)

    def problems(self, *, max_rss_growth: int = MAX_RSS_GROWTH) -> list[str]:
        """Every guarantee the run broke, one line each (empty when none)."""
        found: list[str] = []
        if self.error is not None:
            found.append(f"the workload failed: {self.error}")
        if self.hops_at_fault is None and self.fault != "none" and self.error is None:
            found.append("the fault was never injected (the run ended first)")
        elif self.hops_at_heal is not None and self.hops_at_heal >= self.hops_expected:
            found.append("the run finished before the fault was cleared: nothing was recovered")
        if self.status != "succeeded":
            found.append(f"the run is stored as {self.status}, not succeeded")
        if self.hops_done != self.hops_expected:
            found.append(f"{self.hops_done} of {self.hops_expected} hops done")
        if self.chains_incomplete:
            found.append(f"{self.chains_incomplete} chains incomplete in the final states")
        if self.effects_twice:
            found.append(f"{self.effects_twice} effects happened more than once")
        if self.effects_missing:
            found.append(f"{self.effects_missing} effects never happened")
        if self.snapshots_complete == 0:
            found.append("no complete snapshot was stored")
        found.extend(self.snapshot_problems[:10])
        found.extend(self.journal_problems[:10])
        if self.handler_failures:
            found.append(
                f"{len(self.handler_failures)} handler failures, first: {self.handler_failures[0]}"
            )
        if self.unraisable:
            found.append(
                f"{len(self.unraisable)} exceptions nobody could catch (objects deleted in a "
                f"bad state), first: {self.unraisable[0]}"
            )
        if self.rss_growth > max_rss_growth:
            found.append(
                f"memory grew by {self.rss_growth / 2**20:.0f} MB during the outage "
                f"(bound {max_rss_growth / 2**20:.0f} MB)"
            )
        return found

    def describe(self) -> str:
        """The report as text, for a failing assertion."""
        figures = {k: v for k, v in self.row().items() if k != "fault"}
        lines = [
            f"{self.fault} ({self.url}):",
            "  " + ", ".join(f"{k}={v}" for k, v in figures.items()),
        ]
        problems = self.problems()
        if problems:
            lines.append("problems:")
            lines.extend(f"  - {problem}" for problem in problems)
        if self.details:
            lines.append("details:")
            lines.extend(f"  {line}" for line in self.details[:20])
        return "\n".join(lines)

    def row(self) -> dict[str, str]:
        """The figures as table cells."""

        def seconds(value: float | None) -> str:
            return "-" if value is None else f"{value:.2f}"

        return {
            "fault": self.fault,
            "status": self.status,
            "hops": f"{self.hops_done}/{self.hops_expected}",
            "redone": str(self.hops_redone),
            "rollbacks": str(self.rollbacks),
            "at fault / heal": f"{self.hops_at_fault}/{self.hops_at_heal}",
            "twice": str(self.effects_twice),
            "missing": str(self.effects_missing),
            "snapshots (complete)": f"{self.snapshots_stored} ({self.snapshots_complete})",
            "after heal": str(self.snapshots_after_heal),
            "cuts ok": _yes_or_count(self.snapshot_problems),
            "journal ok": _yes_or_count(self.journal_problems),
            "journal repeats": str(self.journal_repeats),
            "rss +MB": f"{self.rss_growth / 2**20:.1f}",
            "fault s": seconds(self.fault_seconds),
            "recovery s": seconds(self.recovery_seconds),
            "elapsed s": f"{self.elapsed:.1f}",
            "failures": str(len(self.handler_failures)),
            "unraisable": str(len(self.unraisable)),
            "error": (self.error or "")[:120],
        }


def _yes_or_count(problems: list[str]) -> str:
    return f"no ({len(problems)})" if problems else "yes"


# -- running ------------------------------------------------------------------------------


@dataclass
class _Timeline:
    cleared_at: float | None = None
    cleared_wall: datetime | None = None
    started_at: float | None = None
    hops_at_fault: int | None = None
    hops_at_heal: int | None = None
    rss: RssSampler | None = None


async def _drive_fault(fault: Fault, world: World, workload: Workload, timeline: _Timeline) -> None:
    """Inject ``fault`` once enough hops are done; clear it after its duration."""
    threshold = max(1, int(workload.expected_hops * workload.fault_after))
    await world.reached(threshold)
    sampler = RssSampler()
    timeline.rss = sampler
    with sampler.running():
        timeline.started_at = time.monotonic()
        try:
            await asyncio.to_thread(fault.inject)
            timeline.hops_at_fault = len(world.completed)  # the fault is in force from here
            await asyncio.sleep(fault.duration)
        finally:
            # Cleared whatever happens (even if this task is cancelled), or the next test
            # would find the database broken.
            await asyncio.shield(asyncio.to_thread(fault.clear))
            timeline.cleared_at = time.monotonic()
            timeline.cleared_wall = datetime.now(UTC)
            timeline.hops_at_heal = len(world.completed)


async def run_under_fault(url: str, fault: Fault | None, workload: Workload) -> FaultReport:
    """Run the workload on ``url``, inject ``fault`` on the way, and report.

    Never raises for what the run does; a failure of the workload itself (the store cannot be
    made, the run hangs) is in ``FaultReport.error``.
    """
    report = FaultReport(
        fault=fault.name if fault is not None else "none",
        url=url,
        hops_expected=workload.expected_hops,
    )
    try:
        store = open_store(url, workload)
    except RetryLayerMissing as exc:
        report.error = str(exc)
        return report
    with _unraisable(report.unraisable):
        await _run_and_check(store, fault, workload, report)
    return report


@contextlib.contextmanager
def _unraisable(found: list[str]) -> Iterator[None]:
    """Collect the exceptions ``sys.unraisablehook`` is given while the block runs.

    A GC pass ends the block, so that what the block leaked is found here, and not in
    whatever runs next.
    """

    def hook(unraisable: Any) -> None:
        error = unraisable.exc_value
        found.append(f"{type(error).__name__}: {error}" if error else str(unraisable.err_msg))

    previous = sys.unraisablehook
    sys.unraisablehook = hook
    try:
        yield
    finally:
        gc.collect()
        sys.unraisablehook = previous


async def _run_and_check(
    store: SqlStore, fault: Fault | None, workload: Workload, report: FaultReport
) -> None:
    started = time.monotonic()
    world = World()
    timeline = _Timeline()
    run_id = uuid.uuid4().hex
    _worlds[run_id] = world
    try:
        runtime = Runtime(
            store=store,
            run_id=run_id,
            snapshot_policy=SnapshotPolicy(every_seconds=workload.snapshot_every),
            journal=True,
            lease=workload.lease,
        )
        await _run(runtime, fault, world, workload, timeline, report)
        report.hops_done = len(world.completed)
        report.hops_redone = sum(world.completed.values()) - len(world.completed)
        _check_world(runtime, world, workload, report)
        async with asyncio.timeout(workload.hang):
            await _check_store(store, runtime, timeline, report)
    except Exception as exc:
        report.error = report.error or _summary(exc)
        report.details.extend(traceback.format_exception(exc)[-6:])
    finally:
        _worlds.pop(run_id, None)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(30):
                await store.close()
    report.elapsed = time.monotonic() - started
    report.hops_at_fault = timeline.hops_at_fault
    report.hops_at_heal = timeline.hops_at_heal
    if timeline.rss is not None:
        report.rss_before, report.rss_peak = timeline.rss.baseline, timeline.rss.peak
    if timeline.started_at is not None and timeline.cleared_at is not None:
        report.fault_seconds = timeline.cleared_at - timeline.started_at
        after = [t for t in world.progress if t >= timeline.cleared_at]
        report.recovery_seconds = after[0] - timeline.cleared_at if after else None


async def _run(
    runtime: Runtime,
    fault: Fault | None,
    world: World,
    workload: Workload,
    timeline: _Timeline,
    report: FaultReport,
) -> None:
    names = workload.agent_names()
    driver: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(workload.hang):
            await runtime.start()
        for i, name in enumerate(names):
            runtime.add(Relay(name, names[(i + 1) % len(names)], workload, world))
        for chain in range(workload.chains):
            runtime.send(names[chain % len(names)], {"chain": chain, "hop": 0}, kind="token")
        if fault is not None:
            driver = asyncio.create_task(_drive_fault(fault, world, workload, timeline))
        try:
            async with asyncio.timeout(workload.hang):
                await runtime.run_until_idle(raise_failures=False)
        except TimeoutError:
            report.error = f"the run did not finish within {workload.hang:.0f} s"
    finally:
        if driver is not None:
            if timeline.started_at is None:
                driver.cancel()  # the run ended before the fault could be injected
            # Once injected, the fault runs its course and is cleared before the runtime
            # closes (closing writes to the database).
            (outcome,) = await asyncio.gather(driver, return_exceptions=True)
            if isinstance(outcome, Exception):
                report.error = report.error or f"injecting the fault failed: {_summary(outcome)}"
        report.handler_failures = [_summary(f) for f in runtime.failures]
        try:
            async with asyncio.timeout(workload.hang):
                await runtime.close()
        except Exception as exc:
            report.error = report.error or f"closing the runtime failed: {_summary(exc)}"


def _check_world(runtime: Runtime, world: World, workload: Workload, report: FaultReport) -> None:
    twice = sorted(e for e, n in world.effects.items() if n > 1)
    missing = sorted(workload.expected_effects() - set(world.effects))
    report.effects_twice, report.effects_missing = len(twice), len(missing)
    if twice:
        report.details.append(
            "ran twice: "
            + ", ".join(f"{e} x{world.effects[e]} keys {sorted(world.keys[e])}" for e in twice[:5])
        )
    if missing:
        report.details.append(f"never ran: {missing[:8]}")
    handled: Counter[str] = Counter()
    for agent in runtime.agents.values():
        state = agent.state
        assert isinstance(state, RelayState)
        handled.update(state.handled)
    incomplete = {
        chain
        for chain in range(workload.chains)
        for hop in range(workload.hops)
        if handled[f"{chain}:{hop}"] != 1
    }
    report.chains_incomplete = len(incomplete)


async def _check_store(
    store: SqlStore, runtime: Runtime, timeline: _Timeline, report: FaultReport
) -> None:
    run_id = runtime.run_id
    report.status = (await store.get_run(run_id)).status.value
    snapshots = await store.list_snapshots(run_id)
    report.snapshots_stored = len(snapshots)
    complete = [s for s in snapshots if s.status is SnapshotStatus.COMPLETE]
    report.snapshots_complete = len(complete)
    if timeline.cleared_wall is not None:
        report.snapshots_after_heal = sum(s.started_at >= timeline.cleared_wall for s in complete)
    expected = {*runtime.agents, ENVIRONMENT}
    for snapshot in complete:
        report.snapshot_problems.extend(
            f"snapshot {snapshot.seq}: {problem}"
            for problem in _snapshot_problems(snapshot, expected)
        )
    report.rollbacks = len(await store.list_rollbacks(run_id))
    segments = await store.load_journal(run_id)
    missing, repeated = journal_problems(segments, runtime)
    report.journal_repeats = len(repeated)
    report.journal_problems = missing if report.rollbacks else missing + repeated
    if report.rollbacks and repeated:
        report.details.append(
            f"journal repeats after {report.rollbacks} rollback(s): {repeated[:4]}"
        )


def _snapshot_problems(snapshot: Snapshot, expected: set[str]) -> list[str]:
    """What keeps a complete snapshot from being whole and a consistent cut."""
    problems = list(cut_problems(snapshot))
    missing = expected - set(snapshot.agents)
    if missing:
        problems.append(f"not whole: no cut of {sorted(missing)}")
    for name, cut in snapshot.agents.items():
        if name == ENVIRONMENT:
            continue
        try:
            RelayState.model_validate_json(cut.state_json)
        except ValueError as exc:
            problems.append(f"not whole: the state of {name} does not load: {exc}")
    return problems


def journal_problems(
    segments: list[JournalSegment], runtime: Runtime
) -> tuple[list[str], list[str]]:
    """Sends and deliveries of the run the journal lacks, and those it holds more than once.

    Compared with the bus's own counters: every channel's messages ``1..sent`` must be
    journaled as sent, and ``1..delivered`` as delivered, once each (a rollback makes a
    channel use its numbers again, so a run that rolled back holds some twice).

    Returns:
        ``(missing, repeated)``: one line per channel and event.
    """
    logged: dict[tuple[str, str, str], Counter[int]] = {}
    for segment in segments:
        columns = json.loads(segment.entries)
        count = len(columns["at"])
        seqs = columns["seq"]
        numbers = list(range(seqs, seqs + count)) if isinstance(seqs, int) else list(seqs)
        logged.setdefault((segment.src, segment.dst, segment.event), Counter()).update(numbers)
    missing: list[str] = []
    repeated: list[str] = []
    for channel in bus_of(runtime).channels.values():
        for event, count in (("send", channel.sent), ("deliver", channel.delivered)):
            seen = logged.pop((channel.src, channel.dst, event), Counter())
            wanted = Counter(range(1, count + 1))
            where = f"journal {channel.src}>{channel.dst} {event}"
            lacking = sorted((wanted - seen).elements())
            extra = sorted((seen - wanted).elements())
            if lacking:
                missing.append(f"{where}: {len(lacking)} missing, e.g. {lacking[:5]}")
            if extra:
                repeated.append(f"{where}: {len(extra)} logged twice or unknown, e.g. {extra[:5]}")
    for (src, dst, event), seen in logged.items():
        missing.append(f"journal {src}>{dst} {event}: {sum(seen.values())} on no known channel")
    return missing, repeated


def _summary(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    first = text[0] if text else ""
    cause = error.__cause__
    if cause is not None and cause is not error:
        said = str(cause).strip().splitlines()
        first += f" <- {type(cause).__name__}: {said[0][:200] if said else ''}"
    return f"{type(error).__name__}: {first}"[:400]


def workdir_url(folder: Path) -> str:
    """The URL of the SQLite database the workload uses in ``folder``."""
    return f"sqlite:///{folder / 'agentsnap.db'}"
