"""Rollbacks and recovery of a run spread over processes, ordered by its coordinator.

The run's coordinator is the one authority on rollbacks: the retry policy's accounts, the
generation, and which cut the run stands on are kept here alone, so that rejections reported
by several workers at once become one rollback (a report from a generation already left is
dropped). A rollback goes in two phases:

1. the coordinator picks the last complete snapshot before the rejected output, checks the
   retry policy, raises the generation, fails the snapshots in progress, and orders every
   process (on the run's broadcast subject) to go back to the cut; each process stops
   delivering, restores its agents and channels, and says so;
2. once every agent of the run is restored, the coordinator sends again the environment's
   input sent after the cut, records the rollback in the store, and tells every process to
   resume: the rejected agent gets the reason as feedback, and delivery goes on.

A rollback before the run's first complete snapshot goes back to the run's start: every
agent's initial state, nothing sent. One process records a rollback against the cut it went
back to, and its first cut is the start of the run; so the coordinator stores the start as a
complete snapshot (numbered next, as no snapshot begins with that number) as every process
stands on it, and records the rollback against it. That snapshot is then the timeline's cut
to go back to, like any other.

So no message of the new generation reaches a process that has not restored yet. When the
retry policy gives up, the run stops: every process stops delivering, and the coordinator
records the run as failed when it closes.

**Recovery.** The coordinator watches the agents' leases. A worker whose leases expired has
stopped: the snapshots in progress fail (its part will never come), and none begins until
its agents are hosted again. A worker that starts asks the coordinator (``hello``) for the
run's generation and snapshot number; when its agents were hosted before (a restarted
worker, or another one given the agents of a stopped one), the whole run rolls back to the
last complete snapshot as above, the new worker restoring its agents from it. A worker that
let some of its agents go to another (a move) and rejoins with the others waits for the
recovery the other worker's ``hello`` begins: a move costs one rollback.

**Timelines.** A rollback for a rejected output starts a new timeline, numbered by its
generation; a recovery, a rollback for work lost to the database, and a takeover stay on the
run's timeline. Before it orders a rollback that starts one, the coordinator marks the new
timeline in the run's replay log (waiting for the database if it must), so the store always
knows the timeline the workers are on.

**Takeover.** A coordinator that takes the run over from one that stopped starts from what
the store holds (``taken_over``): the rollbacks recorded, the timelines they left, the
agents some worker hosted, the run's timeline (the newest marked); and a generation above
every one its predecessor could have ordered, even one whose rollback it never recorded. It
then rolls every process back to the last complete snapshot of the run's timeline
(``take_over``), as for a restarted worker, and on that timeline: every worker redoes its
agents' deliveries after the cut in the order it logged, with the answers their model calls
recorded, so derived keys name the same calls. A coordinator that learns it was replaced is
``fence``d: it orders nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Collection, Coroutine
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from agentsnap._team import lost_to_database, until_answers
from agentsnap.distributed.orders import (
    MessageKey,
    RollbackOrder,
    broadcast_subject,
    rejection_of,
)
from agentsnap.exceptions import OwnershipLost, RunCancelled, StoreError
from agentsnap.records import RollbackInfo, Snapshot, utcnow
from agentsnap.requests import withdraw_discarded
from agentsnap.rollback import RetryBudget, RetryPolicy

if TYPE_CHECKING:
    from agentsnap.distributed.host import Host
    from agentsnap.exceptions import RunError
    from agentsnap.jetstream import JetStreamLink
    from agentsnap.store import RunStore

__all__ = ["RollbackAuthority"]

logger = logging.getLogger("agentsnap.distributed")

_REPEAT = 2.0
"""Seconds between repeats of a rollback order some process has not carried out yet."""


_Deciding = Callable[[], Coroutine[Any, Any, None]]
"""What decides on a worker's report: starts the rollback or the retry it calls for."""

_SAME_TIMELINE = frozenset({"recovery", "database"})
"""Rollbacks that keep the run on its timeline: nothing was rejected, so the work they throw
away is redone as it was (the same deliveries in the order the workers logged, the answers
the model calls recorded, the same derived keys); a rejected output's rollback starts a new
timeline, on which the agent is told why and its model is asked again."""


class _Rolling:
    """A rollback under way: its order, and which agents are restored."""

    def __init__(self, order: RollbackOrder, target: Snapshot | None) -> None:
        self.order = order
        self.target = target
        self.restored: set[str] = set()
        self.discarded = 0
        self.epoch = order.epoch
        """The newest snapshot number a process that carried it out saw."""
        self.changed = asyncio.Event()


class RollbackAuthority:
    """Decides and carries out the rollbacks of a run spread over processes.

    The run's [`DistributedRun`][agentsnap.distributed.DistributedRun] owns one and hands
    it what its workers report.

    Args:
        run_id: The run.
        link: The connection to NATS.
        store: The run's store.
        host: The coordinator's own process (the environment).
        names: Every agent of the run.
        policy: The retry policy.
        targets: The complete snapshots so far, in order.
        fail_pending: Fails every snapshot in progress, with a reason.
        start_cut: The run's start as a complete snapshot with this number: every agent's
            initial state, nothing sent.
        completed: Called with that snapshot once it is stored.

    Attributes:
        generation: The run's generation: raised by each rollback.
        history: The rollbacks carried out, oldest first.
        exhausted: Why the run stopped (its retry policy gave up), or ``None``.
        dropped: Rejections dropped: reported from a generation a rollback left, or while
            a rollback was under way (they became that one rollback).
        down: Agents whose worker stopped (its lease expired), by agent: the worker.
    """

    def __init__(
        self,
        run_id: str,
        link: JetStreamLink,
        store: RunStore,
        host: Host,
        names: Collection[str],
        *,
        policy: RetryPolicy,
        targets: Callable[[], list[Snapshot]],
        fail_pending: Callable[[str], Any],
        start_cut: Callable[[int], Snapshot],
        completed: Callable[[Snapshot], None],
    ) -> None:
        self.run_id = run_id
        self.generation = 0
        self.timeline = 0
        """The run's timeline: the generation of the last rollback for a rejected output (a
        recovery, a rollback for work lost to the database, and a takeover redo the
        timeline's work in the order logged, with its recorded model answers)."""
        self._line_stored = 0  # the newest timeline the run's replay log holds a mark of
        self.history: list[RollbackInfo] = []
        self.exhausted: RunError | None = None
        self.fenced: str | None = None
        """Why this coordinator orders nothing more (another took the run over), or ``None``."""
        self.took_over: RollbackInfo | None = None
        """The rollback ordered as this coordinator took the run over, once carried out."""
        self.dropped = 0
        self.down: dict[str, str] = {}
        self.stopped = asyncio.Event()
        """Set when the run stopped: its retry policy gave up."""
        self._link = link
        self._store = store
        self._host = host
        self._names = frozenset(names)
        self._budget = RetryBudget(policy)
        self._targets = targets
        self._fail_pending = fail_pending
        self._start_cut = start_cut
        self._completed = completed
        self._hosted: set[str] = set()  # agents some worker has hosted
        self._live: set[str] = set()  # agents whose lease was live at the last look
        self._owners: dict[str, str] = {}  # agent -> the worker that said hello for it
        self._hello_at: dict[str, float] = {}  # agent -> loop time of that hello
        self._holders: dict[str, str] = {}  # agent -> its lease's holder at the last look
        self._moving: dict[str, str] = {}  # agent moving -> the worker letting it go
        self.restored_by: dict[str, list[str]] = {}
        """Per rollback id, the workers that carried it out (the coordinator not named)."""
        self.replays: dict[str, tuple[int, int]] = {}
        """Per worker, as it last said: how many channels its rollbacks replayed from the
        stream, and how many they put back from the recorded bodies instead."""
        self._left: list[tuple[int, int]] = []  # snapshot numbers of timelines left
        self._rolling: _Rolling | None = None
        self._deciding = False  # a rejection is being turned into a rollback
        self._tasks: set[asyncio.Task[None]] = set()
        self._subject = broadcast_subject(run_id)

    @property
    def busy(self) -> bool:
        """Whether a rollback is being decided or carried out (or the run stopped, or this
        coordinator was replaced).
        """  # noqa: D205
        return (
            self._deciding
            or self._rolling is not None
            or self.exhausted is not None
            or self.fenced is not None
        )

    # -- takeover ---------------------------------------------------------------------------

    def taken_over(
        self,
        *,
        generation: int,
        history: list[RollbackInfo],
        left: list[tuple[int, int]],
        hosted: Collection[str],
        timeline: int,
    ) -> None:
        """Start from where a stopped coordinator left the run, as its store says.

        Args:
            generation: A generation above every one the stopped coordinator could have
                ordered: this coordinator's rollbacks are numbered after it.
            history: The rollbacks recorded, oldest first.
            left: The snapshot numbers ``(lo, hi]`` of each timeline a rollback left.
            hosted: The agents some worker claimed (their workers rejoin with a rollback).
            timeline: The run's timeline: the newest one the run's replay log marks (a
                coordinator marks each timeline it starts there before ordering it).
        """
        self.generation = max(self.generation, generation)
        # The takeover's rollback stays on the stopped coordinator's timeline: the workers
        # redo their work after the cut in the order they logged on it, with the answers
        # their model calls recorded on it, and so derive the same keys.
        self.timeline = max(self.timeline, timeline)
        self._line_stored = max(self._line_stored, timeline)
        self.history[:0] = history
        self._left[:0] = left
        self._hosted.update(name for name in hosted if name in self._names)

    def take_over(self, reason: str) -> None:
        """Roll every process back to the last complete snapshot of the run's timeline.

        Ordered at once and carried out in the background, as every rollback (a worker that
        stopped is waited for until its agents are hosted again); its record is
        ``took_over`` once every process resumed.
        """
        self._deciding = True
        self._spawn(self._recover(reason, takeover=True))

    def fence(self, reason: str) -> None:
        """Another coordinator took the run over: order nothing more, and stop waiting."""
        self.fenced = reason
        self._rolling = None
        self.stopped.set()

    def _spawn(self, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop what is under way (the run's coordinator is closing)."""
        self._rolling = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- what workers report ----------------------------------------------------------------

    def rejected(self, report: dict[str, Any]) -> None:
        """A worker reports a rejected output."""

        def read() -> tuple[str, _Deciding]:
            agent, reason, source, output, handling = rejection_of(report["rejected"])
            return (
                f"rejection of {agent}'s output ({reason})",
                lambda: self._for_rejection(agent, reason, source, output, handling),
            )

        self._decide(report, "rejection report", read)

    def lost(self, report: dict[str, Any]) -> None:
        """A worker reports a handler's work lost to a database that did not answer.

        The run goes back to its last complete cut once the database answers, and redoes
        the work from there; the ledger makes its effects happen once. No retry budget is
        used: a database that is away is no fault of the agent's.
        """

        def read() -> tuple[str, _Deciding]:
            reason = str(report["lost"])
            agent = str(report.get("agent", "?"))
            return f"{agent}'s work lost to the database", lambda: self._for_fault(agent, reason)

        self._decide(report, "report", read)

    def _decide(
        self, report: dict[str, Any], kind: str, read: Callable[[], tuple[str, _Deciding]]
    ) -> None:
        """Start deciding what a worker's ``report`` (a ``kind``) calls for.

        ``read`` reads the report's own fields: it returns what the report tells, for the
        log, and what decides on it; the report's ``generation`` is read here. A report with
        a field missing or of the wrong type is logged and ignored. A report that comes
        during a rollback, or from an older timeline, joins the rollback under way instead:
        it is counted as dropped.
        """
        try:
            what, deciding = read()
            generation = int(report["generation"])
        except (KeyError, TypeError, ValueError) as exc:
            logger.warning("run %s: a malformed %s was ignored: %r", self.run_id, kind, exc)
            return
        if generation != self.generation or self.busy:
            self.dropped += 1
            logger.info("run %s: %s joins the rollback under way", self.run_id, what)
            return
        self._deciding = True
        self._spawn(deciding())

    def restored(self, report: dict[str, Any]) -> None:
        """A worker carried out a rollback order."""
        rolling = self._rolling
        try:
            generation = int(report["restored"])
            agents = [str(name) for name in report.get("agents", [])]
            discarded = int(report.get("discarded", 0))
            epoch = int(report.get("epoch", 0))
        except (KeyError, TypeError, ValueError):
            return
        if rolling is None or generation != rolling.order.generation:
            return
        rolling.epoch = max(rolling.epoch, epoch)
        if not rolling.restored.issuperset(agents):
            rolling.restored.update(agents)
            rolling.discarded += discarded
            workers = self.restored_by.setdefault(rolling.order.id, [])
            worker = str(report.get("worker"))
            workers.append(worker)
            self.replays[worker] = (int(report.get("replayed", 0)), int(report.get("put_back", 0)))
        rolling.changed.set()

    def passed(self, report: dict[str, Any]) -> None:
        """A message redone after a rejection was handled without one: its episode ends."""
        try:
            src, dst, seq = report["passed"]
            self._budget.passed((str(src), str(dst), int(seq)))
        except (KeyError, TypeError, ValueError):
            return

    def hello(self, report: dict[str, Any]) -> dict[str, Any]:
        """A worker starts: what it needs to know, and a rollback if its agents ran before."""
        worker = str(report.get("hello"))
        agents = sorted(str(name) for name in report.get("agents", []))
        # Hosted before: by a worker that said hello, or by one whose lease the store showed
        # (a worker that started while no coordinator answered says no hello).
        again = (
            any(
                name in self._hosted or self._holders.get(name, worker) != worker for name in agents
            )
            or self._rolling is not None
        )
        for name in agents:
            self._moving.pop(name, None)  # hosted again: its move is over
        # A worker that let agents go to another, and rejoins with those it keeps, waits
        # for the recovery the other worker's hello begins: a move costs one rollback.
        # (While one is under way it needs one of its own: the order out already is of
        # the generation it is told, which a worker takes for carried out.)
        deferred = self._rolling is None and worker in self._moving.values()
        self._hosted.update(agents)
        now = asyncio.get_running_loop().time()
        for name in agents:
            self.down.pop(name, None)
            self._owners[name] = worker
            self._hello_at[name] = now
        answer = {
            "generation": self.generation,
            "timeline": self.timeline,
            "epoch": self._host.coordinator.last_seq,
            "restore": again and self.exhausted is None,
        }
        if again and self.exhausted is None and deferred:
            logger.warning(
                "run %s: worker %s goes on with %s once %s are hosted again",
                self.run_id,
                worker,
                ", ".join(agents),
                ", ".join(sorted(self._moving)),
            )
        elif again and self.exhausted is None:
            reason = f"worker {worker} took over {', '.join(agents)}"
            logger.warning(
                "run %s: %s; the run goes back to its last complete cut", self.run_id, reason
            )
            self._deciding = True
            self._spawn(self._recover(reason))
        elif agents:
            # Its agents record no part of the snapshots begun before it started (it takes
            # up the numbering at ``epoch``): those fail now rather than at their timeout.
            self._fail_pending(
                f"worker {worker} started after they began: {', '.join(agents)} record no "
                "part of them"
            )
        return answer

    def hosts_all(self, names: Collection[str]) -> bool:
        """Whether every agent of ``names`` is hosted by a worker that said hello, or holds a
        live lease: until then a snapshot could only fail (an agent's part would not come).
        """  # noqa: D205
        return all(name in self._hosted or name in self._live for name in names)

    def leases(self, live: Collection[str], owners: dict[str, str], read_at: float) -> None:
        """The agents whose leases were live at loop time ``read_at`` (``owners``: the
        holder of every lease).

        An agent hosted before whose lease expired lost its worker: the snapshots in
        progress fail, as its part will never come.
        """  # noqa: D205
        self._live = set(live)
        self._holders = dict(owners)
        for name in [name for name in self.down if name in live]:
            if owners.get(name) == self.down[name]:
                del self.down[name]  # renewed late, by the same worker: it did not stop
        hello = self._hello_at
        gone = sorted(
            name
            for name in self._hosted
            if name not in live and name not in self.down and hello.get(name, 0.0) < read_at
        )
        if not gone:
            return
        for name in gone:
            self.down[name] = owners.get(name, self._owners.get(name, "?"))
        workers = sorted({self.down[name] for name in gone})
        reason = (
            f"worker {', '.join(workers)} stopped (the lease on {', '.join(gone)} expired); "
            "the run goes back to its last complete snapshot once they are hosted again"
        )
        logger.warning("run %s: %s", self.run_id, reason)
        self._fail_pending(reason)

    def moving(self, names: Collection[str], to: str) -> None:
        """Agents move to worker ``to``: their workers are told to let them go.

        A worker that lets some of its agents go and goes on with the others rejoins with
        those (``hello``) before ``to`` says hello for the agents it takes. It is then told
        to wait for a rollback, and none begins for it: the recovery that ``to``'s hello
        begins takes every process back to the cut, so that a move costs one rollback.
        """
        for name in names:
            holder = self._owners.get(name) or self._holders.get(name)
            if holder is not None and holder != to:
                self._moving[name] = holder

    # -- deciding ---------------------------------------------------------------------------

    def targets(self) -> list[Snapshot]:
        """The complete snapshots of the timeline the run is on, oldest first."""
        left = self._left
        return [s for s in self._targets() if not any(lo < s.seq <= hi for lo, hi in left)]

    def target_before(self, output: MessageKey | None) -> Snapshot | None:
        """The newest complete snapshot whose cut precedes ``output`` (or the newest)."""
        for snapshot in reversed(self.targets()):
            if output is None:
                return snapshot
            src, dst, seq = output
            cut = snapshot.agents.get(src)
            if cut is None or cut.sent.get(dst, 0) < seq:
                return snapshot
        return None

    async def _for_rejection(
        self,
        agent: str,
        reason: str,
        source: str,
        output: MessageKey | None,
        handling: MessageKey | None,
    ) -> None:
        try:
            attempt, exhausted, pause = self._budget.spend(agent, source, reason, handling)
            if exhausted is not None:
                await self._stop(exhausted)
                return
            target = self.target_before(output)
            if pause > 0:
                await asyncio.sleep(pause)
            await self._roll_back(target, agent, reason, source, attempt)
        except Exception:
            logger.exception("run %s: the rollback failed", self.run_id)
        finally:
            self._deciding = False

    async def _for_fault(self, agent: str, reason: str) -> None:
        try:
            await until_answers(lambda: self._store.get_run(self.run_id), self.run_id)
            logger.warning(
                "run %s: agent %r could not finish its work (%s); the run goes back to its "
                "last complete cut",
                self.run_id,
                agent,
                reason,
            )
            targets = self.targets()
            await self._roll_back(targets[-1] if targets else None, None, reason, "database", 1)
        except Exception:
            logger.exception("run %s: the rollback for a database fault failed", self.run_id)
        finally:
            self._deciding = False

    async def _recover(self, reason: str, *, takeover: bool = False) -> None:
        try:
            targets = self.targets()
            done = await self._roll_back(
                targets[-1] if targets else None, None, reason, "recovery", 1
            )
            if takeover and done is not None:
                self.took_over = done
        except Exception:
            logger.exception("run %s: the recovery failed", self.run_id)
        finally:
            self._deciding = False

    async def cancel(self, reason: str) -> None:
        """Stop the run on request: every process delivers nothing more, and the run's
        failure (``exhausted``) is a [`RunCancelled`][agentsnap.RunCancelled].
        """  # noqa: D205
        if self.exhausted is not None or self.fenced is not None:
            return
        await self._stop(RunCancelled(self.run_id, reason, resume="DistributedRun.take_over()"))

    async def _stop(self, exhausted: RunError) -> None:
        self.exhausted = exhausted
        if isinstance(exhausted, RunCancelled):
            logger.warning("run %s: %s", self.run_id, exhausted)
        else:
            logger.error("run %s: %s", self.run_id, exhausted)
        self._fail_pending(f"the run stopped: {exhausted}")
        self._host.stop(str(exhausted))
        await self._broadcast(
            {"stop": str(exhausted), "cancelled": isinstance(exhausted, RunCancelled)}
        )
        self.stopped.set()

    # -- carrying out -----------------------------------------------------------------------

    async def _broadcast(self, body: dict[str, Any]) -> None:
        if self.fenced is not None:
            return  # replaced: the workers follow the coordinator that took over
        try:
            await self._link.nc.publish(self._subject, orjson.dumps(body))
        except Exception as exc:  # repeated while the rollback waits; else logged
            logger.warning("run %s: could not tell the workers: %r", self.run_id, exc)

    async def _mark_line(self, timeline: int) -> bool:
        """Mark in the run's replay log that the run is on ``timeline``, before any process
        is told: a coordinator that takes the run over reads the run's timeline there.

        Waits for a database that does not answer (the rollback waits with it); ``False``
        when this coordinator was replaced meanwhile (the store refused the mark).
        """  # noqa: D205
        while self.fenced is None:
            try:
                await self._host.mark_timeline(timeline)
            except OwnershipLost as exc:
                self.fence(str(exc))
                return False
            except StoreError as exc:
                if not lost_to_database(exc):
                    raise
                logger.warning(
                    "run %s: the timeline %d could not be marked yet (%s); the rollback waits "
                    "for the database",
                    self.run_id,
                    timeline,
                    exc,
                )
                await until_answers(
                    lambda: self._store.get_run(self.run_id),
                    self.run_id,
                    lambda: self.fenced is None,
                )
                continue
            self._line_stored = max(self._line_stored, timeline)
            return True
        return False

    async def _roll_back(
        self,
        target: Snapshot | None,
        agent: str | None,
        reason: str,
        source: str,
        attempt: int,
    ) -> RollbackInfo | None:
        """Carry out a rollback; its record, or ``None`` when a later one took its place."""
        self.generation += 1
        generation = self.generation
        if source not in _SAME_TIMELINE:
            self.timeline = generation
        if self.timeline > self._line_stored and not await self._mark_line(self.timeline):
            return None  # replaced meanwhile: the coordinator that took over orders
        if self.generation != generation:
            return None  # a later rollback (a worker restarted meanwhile) took its place
        self._fail_pending("the run rolled back before the snapshot completed")
        epoch = self._host.coordinator.last_seq
        self._left.append((target.seq if target is not None else 0, epoch))
        order = RollbackOrder(
            id=uuid.uuid4().hex,
            generation=generation,
            epoch=epoch,
            snapshot_id=target.id if target is not None else None,
            agent=agent,
            reason=reason,
            source=source,
            attempt=attempt,
            redo=sorted(self._budget.open),
            timeline=self.timeline,
        )
        rolling = self._rolling = _Rolling(order, target)
        self._deciding = False
        logger.warning(
            "run %s: rolling every process back to %s (generation %d): %s",
            self.run_id,
            f"snapshot {target.seq}" if target is not None else "the start",
            generation,
            reason,
        )
        # Phase 1: every process goes back to the cut; the order is repeated until all did.
        body = {"rollback": order.to_json()}
        while not rolling.restored >= self._names:
            if self._rolling is not rolling or self.generation != generation:
                return None  # a later rollback (a worker restarted meanwhile) took its place
            await self._broadcast(body)
            rolling.changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_REPEAT):
                    await rolling.changed.wait()
        if self._rolling is not rolling:
            return None
        # Phase 2: the environment goes back too and sends its input again; then resume.
        # Snapshots are numbered on above any a process saw, so that no part it wrote before
        # going back (for a snapshot begun by a coordinator this one replaced) is taken for
        # a part of a later snapshot.
        coordinator = self._host.coordinator
        coordinator.last_seq = max(coordinator.last_seq, rolling.epoch)
        await self._host.roll_back(order, target)
        if self._rolling is not rolling:
            return None
        self._fail_pending("the run rolled back before the snapshot completed")
        start = None
        if target is None:
            # No process has delivered anything since it went back to the start (the input
            # sent again is after that cut), and none does before it resumes: the start is
            # where the run stands, under the next number, which no snapshot begins with.
            coordinator = self._host.coordinator
            coordinator.last_seq += 1
            start = self._start_cut(coordinator.last_seq)
            order = replace(order, snapshot_id=start.id)
        epoch = self._host.coordinator.last_seq
        info = order.info(self.run_id, rolling.discarded)
        try:
            if start is not None:
                await self._store.save_snapshot(start)
                self._completed(start)
            await self._store.save_rollback(info)
        except Exception:
            logger.exception("run %s: rollback %s was not recorded", self.run_id, info.id)
        # The requests of the generations left wait for nobody: their handlers' work is gone.
        await withdraw_discarded(self._host.ledger, self.run_id, order.line, info.id)
        self.history.append(info)
        await self._host.resume(order, epoch)
        self._rolling = None
        resume: dict[str, Any] = {"resume": generation, "epoch": epoch}
        if start is not None:
            resume["snapshot_id"] = start.id  # what the agents' on_rollback is told
        await self._broadcast(resume)
        logger.warning("run %s: every process resumed in generation %d", self.run_id, generation)
        return info

    def lease_owners(self, leases: list[Any]) -> tuple[set[str], dict[str, str]]:
        """The agents with a live lease, and every lease's holder."""
        now = utcnow()
        live = {lease.agent for lease in leases if lease.expires_at > now}
        return live, {lease.agent: lease.owner for lease in leases}
