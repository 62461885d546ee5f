"""The run's coordinator: the environment process, which numbers and completes snapshots.

The program that creates a run spread over processes is its coordinator
([`DistributedRun`][agentsnap.distributed.DistributedRun]). It hosts the environment
(``$env``): it sends the run's input, and begins every snapshot (by its
[`SnapshotPolicy`][agentsnap.snapshot.SnapshotPolicy]'s ``every_seconds``, on
[`snapshot()`][agentsnap.distributed.DistributedRun.snapshot], or when a worker asks on the
run's control subject), so that snapshot numbers are one total order. Beginning snapshot
``k`` records the environment and sends marker ``k`` to every agent; each worker then writes
its part. The coordinator watches the parts (a worker's notice on the control subject, and a
look at the store a few times a second): once every process of the run has its part, it joins
them into one [`Snapshot`][agentsnap.Snapshot], checks it with
[`cut_problems`][agentsnap.integrity.cut_problems] (and each channel's stream range against
the messages recorded on it), and stores it as complete, in one transaction. Until then
nothing of it is visible to ``agentsnap runs/show/export``. A part with an error, an
inconsistent cut, or a part missing after ``part_timeout`` seconds (its worker died) stores
the snapshot as failed, with the reason; the run goes on.

It is also the one authority on rollbacks
([`RollbackAuthority`][agentsnap.distributed.RollbackAuthority]): a worker reports a rejected
output on the control subject, and the coordinator rolls every process back to the last
complete snapshot before it, in two phases; it watches the agents' leases, and rolls the run
back to its last complete snapshot when the agents of a worker that stopped are hosted again.

**Takeover.** The coordinator owns the run through its lease (see
[`agentsnap.ownership`][agentsnap.ownership]), renewed while it runs. When it dies, another
coordinator takes the run over
([`DistributedRun.take_over`][agentsnap.distributed.DistributedRun.take_over]): it takes the
lease (at once when the dead one ran on the same host, else once its lease expired), which
fences the dead coordinator's store out; it reads the run back (the complete snapshots, the
rollbacks and the timelines they left, the snapshot numbering, and from the run's stream every
message the environment sent); it stores the snapshots the dead one began and never
completed as failed; and it rolls every process back to the last complete snapshot of the
run's timeline, in a generation above any the dead one could have ordered, staying on that
timeline (the newest one the run's replay log marks): every worker redoes its agents' work
after the cut in the order it logged, with its recorded model answers, so that keys derived
for side-effecting calls name the same calls. The workers never stopped serving: they
carry out that rollback and go on. Whatever they reported while no coordinator listened (a
rejected output, a rollback carried out, work lost to the database) belongs to a generation
the takeover leaves, and is done again from the cut if it still happens there. A
coordinator that was replaced while it was away (suspended, or cut off from the database)
finds out at its next write or renewal: the store refuses its writes, its workers ignore its
orders (of an older generation), and it stops
([`fenced`][agentsnap.distributed.DistributedRun.fenced]).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from agentsnap.distributed._takeover import EnvironmentLog, StoredTimeline, generation_floor
from agentsnap.distributed.app import PROCESSES, App, check_run
from agentsnap.distributed.host import Host
from agentsnap.distributed.orders import broadcast_subject, control_subject
from agentsnap.distributed.recovery import RollbackAuthority
from agentsnap.distributed.retention import Retainer, StreamRetention
from agentsnap.exceptions import (
    ConfigurationError,
    OwnershipLost,
    RunCancelled,
    SnapshotFailed,
    TransportError,
)
from agentsnap.integrity import cut_problems
from agentsnap.messages import ENVIRONMENT
from agentsnap.ownership import RunOwnership
from agentsnap.records import (
    AgentCut,
    ChannelRecord,
    RollbackInfo,
    RunInfo,
    RunStatus,
    Snapshot,
    SnapshotPart,
    SnapshotStatus,
    utcnow,
)
from agentsnap.snapshot import SnapshotPolicy
from agentsnap.state import StateBlob, encode_state
from agentsnap.versions import state_version

if TYPE_CHECKING:
    from datetime import datetime

    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription

    from agentsnap.exceptions import RunError
    from agentsnap.handles import SnapshotHandle
    from agentsnap.jetstream import JetStreamLink
    from agentsnap.messages import JsonInput, Message
    from agentsnap.store import DistributedStore

__all__ = ["DistributedRun", "join_parts"]

logger = logging.getLogger("agentsnap.distributed")

_T = TypeVar("_T")

COORDINATOR = "coordinator"
"""The name the coordinator's own part (the environment's) is stored under."""

_MOVE_CUT = 20.0
"""Seconds a move waits at most for the snapshot it happens at."""

_NOTHING = StateBlob("{}")
"""The environment's state in every cut."""


def _environment_snapshot(
    run_id: str,
    seq: int,
    at: datetime,
    *,
    agents: dict[str, AgentCut] | None = None,
    error: str | None = None,
) -> Snapshot:
    """Snapshot ``seq`` of the run, begun by the environment at ``at`` under a new id: failed
    with ``error`` when one is given, else complete at once with the cuts ``agents``.
    """  # noqa: D205
    failed = error is not None
    return Snapshot(
        id=uuid.uuid4().hex,
        run_id=run_id,
        seq=seq,
        initiator=ENVIRONMENT,
        status=SnapshotStatus.FAILED if failed else SnapshotStatus.COMPLETE,
        started_at=at,
        completed_at=None if failed else at,
        error=error,
        agents=agents or {},
    )


@dataclass
class _Pending:
    handle: SnapshotHandle
    started_at: datetime
    deadline: float
    error: str | None = None
    """Why it fails at once (its markers could not be sent)."""


def join_parts(  # noqa: PLR0917 - a snapshot's fields
    snapshot_id: str,
    run_id: str,
    seq: int,
    parts: list[SnapshotPart],
    started_at: datetime,
    initiator: str = ENVIRONMENT,
) -> tuple[Snapshot, list[str]]:
    """The whole snapshot made of its parts, and what is wrong with it (empty when nothing).

    Besides [`cut_problems`][agentsnap.integrity.cut_problems], each channel between
    processes must hold as many messages as its stream range says were in flight.
    """
    agents: dict[str, AgentCut] = {}
    channels: list[ChannelRecord] = []
    problems: list[str] = []
    for part in parts:
        problems.extend(
            f"{name} is in two parts (worker {part.worker} and another)"
            for name in part.agents
            if name in agents
        )
        agents.update(part.agents)
        channels.extend(part.channels)
        held = {(ch.src, ch.dst): len(ch.messages) for ch in part.channels}
        for offsets in part.offsets:
            count = held.get((offsets.src, offsets.dst), 0)
            if offsets.count != count or not offsets.first_seq <= offsets.end_seq:
                problems.append(
                    f"{offsets.src}>{offsets.dst}: stream range {offsets.first_seq}.."
                    f"{offsets.end_seq} of {offsets.count} messages, {count} recorded"
                )
    snapshot = Snapshot(
        id=snapshot_id,
        run_id=run_id,
        seq=seq,
        initiator=initiator,
        status=SnapshotStatus.COMPLETE,
        started_at=started_at,
        completed_at=utcnow(),
        agents=dict(sorted(agents.items())),
        channels=sorted(channels, key=lambda ch: (ch.src, ch.dst)),
    )
    return snapshot, problems + cut_problems(snapshot)


class DistributedRun:
    """Creates a run spread over processes, feeds it, and numbers and completes its snapshots.

    Use it as an async context manager, or call ``start`` and ``close``;
    [`run_until_idle`][agentsnap.distributed.DistributedRun.run_until_idle] waits until the
    run has nothing left to do.

    Args:
        link: The connection to NATS.
        store: The run's store (PostgreSQL, shared with the workers).
        app: The run's agents (only their names are used here).
        run_id: The run's id (32 hex digits are generated when omitted).
        policy: ``every_seconds`` begins snapshots by time, once every agent is hosted by a
            worker and while no rollback is under way; ``max_in_progress`` skips one while
            that many are in progress. Other fields do not apply here.
        part_timeout: Seconds a snapshot waits for its parts before it fails.
        retention: Purge the run's stream, and delete old snapshot parts, below what the
            newest complete snapshots need (see
            [`StreamRetention`][agentsnap.distributed.StreamRetention]); by default both
            are kept whole.
        name: A name for people, stored with the run.
        poll: Seconds between two looks at the store for parts and agent leases.
        lease: Seconds the coordinator's lease on the run holds without renewal (it renews
            it every third of that): a coordinator on another host may take the run over
            that long after this one stopped.
        takeover_wait: With a number of seconds, take over the run ``run_id``, whose
            coordinator stopped, instead of creating it: ``start`` waits that long at most
            for the stopped coordinator's lease (see
            [`take_over`][agentsnap.distributed.DistributedRun.take_over]).

    Attributes:
        run_id: The run.
        complete: The snapshots stored as complete, in order (those of timelines a
            rollback left included).
        failed: The snapshots stored as failed, in order.
        authority: Decides and carries out the run's rollbacks and recoveries.

    A worker started with ``move`` takes agents from the workers hosting them while the run
    goes on: the coordinator takes a snapshot, tells every worker to let those agents go
    (``moves`` lists them), and the run goes back to that cut once the new worker hosts them.
    """

    def __init__(
        self,
        link: JetStreamLink,
        store: DistributedStore,
        app: App,
        *,
        run_id: str | None = None,
        policy: SnapshotPolicy | None = None,
        part_timeout: float = 30.0,
        name: str | None = None,
        poll: float = 0.25,
        retention: StreamRetention | None = None,
        lease: float = 15.0,
        takeover_wait: float | None = None,
    ) -> None:
        if takeover_wait is not None and run_id is None:
            raise ConfigurationError(
                "taking a run over needs its id: pass run_id (the run whose coordinator stopped)"
            )
        self._taking_over = takeover_wait
        self.run_id = run_id or uuid.uuid4().hex
        self.store = store
        self.names = app.names
        self.processes = frozenset([ENVIRONMENT, *self.names])
        self.policy = policy or SnapshotPolicy(at_start=False, at_end=False)
        self.part_timeout = part_timeout
        self.complete: list[Snapshot] = []
        self.failed: list[Snapshot] = []
        self._link = link
        self._app = app
        self._name = name
        self._poll = poll
        part_name = COORDINATOR
        if takeover_wait is not None:
            part_name += f"-{uuid.uuid4().hex[:8]}"
        self._host = Host(
            link,
            store,
            self.run_id,
            self.names,
            {},
            # A coordinator that takes the run over stores its part under a name of its own:
            # a part its predecessor may still write for a number it reuses never mixes in.
            worker=part_name,
            environment=True,
            redaction=app.redact,
        )
        self._pending: dict[int, _Pending] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._subscription: Subscription | None = None
        self._ownership = RunOwnership(store, self.run_id, ttl=lease)
        self.fenced: OwnershipLost | None = None
        """Why this coordinator stopped: another one took the run over (``None`` while it
        owns the run). It then begins no snapshot, answers no worker, and orders nothing;
        ``run_until_idle`` raises it."""
        self.authority = RollbackAuthority(
            self.run_id,
            link,
            store,
            self._host,
            self.names,
            policy=app.retry,
            targets=lambda: self.complete,
            fail_pending=self._fail_all,
            start_cut=self._start_cut,
            completed=self.complete.append,
        )
        self._leases_seen = 0.0
        self._requests = 0
        self._closing = False
        self.retainer = None if retention is None else Retainer(link, store, self.run_id, retention)
        """Applies ``retention`` as snapshots complete (``None`` without one)."""
        self._failing: set[asyncio.Task[None]] = set()
        self.moves: list[tuple[list[str], str]] = []
        """The moves of agents workers asked for, oldest first: the agents, and the worker
        they moved to (see [`Worker`][agentsnap.distributed.Worker]'s ``move``)."""

    @classmethod
    def take_over(
        cls,
        link: JetStreamLink,
        store: DistributedStore,
        app: App,
        run_id: str,
        *,
        wait: float = 30.0,
        policy: SnapshotPolicy | None = None,
        part_timeout: float = 30.0,
        poll: float = 0.25,
        retention: StreamRetention | None = None,
        lease: float = 15.0,
    ) -> DistributedRun:
        """A coordinator for run ``run_id``, whose coordinator stopped, to take it over.

        Start it (``async with``, or ``start``) as a new one; ``start`` then, instead of
        creating the run:

        1. takes the run's lease: at once when its coordinator was a process of this host
           that no longer runs, else once its lease expired (it waits up to ``wait``
           seconds for that: a coordinator that still renews its lease is not replaced).
           From then on the store refuses the stopped coordinator's writes. With a long
           ``wait`` it is a standby coordinator: it takes the run over as soon as its
           coordinator stops renewing;
        2. reads back the run's complete snapshots and rollbacks (which snapshots lie on a
           timeline a rollback left), its snapshot numbering, and every message the
           environment sent (from the run's stream: a message ``send`` queued that never
           reached the stream is lost with the stopped coordinator, see
           [`flush`][agentsnap.distributed.DistributedRun.flush]);
        3. stores every snapshot the stopped coordinator began and never completed as
           failed, saying so (none of them is ever a rollback's target);
        4. rolls every process back to the last complete snapshot of the run's timeline (the
           run's start when there is none), recorded as a rollback whose source is
           ``recovery`` (``took_over``): the workers, which kept serving, carry it out, the
           environment sends again what it had sent after that cut, and the run goes on,
           on the same timeline: each worker's agents take their messages after the cut in
           the order the workers logged, and their model calls get the answers recorded, so
           keys derived for side-effecting calls name the same calls as before.

        The retry policy's accounts start afresh, and the takeover's rollback spends none
        of them. Pass the app, policy and retention the stopped coordinator had.

        Args:
            link: The connection to NATS.
            store: The run's store.
            app: The run's agents, as the stopped coordinator had them.
            run_id: The run to take over.
            wait: Seconds to wait at most for the stopped coordinator's lease to expire.
            policy: As for the constructor.
            part_timeout: As for the constructor.
            poll: As for the constructor.
            retention: As for the constructor.
            lease: As for the constructor.

        Returns:
            The coordinator, not started.
        """
        return cls(
            link,
            store,
            app,
            run_id=run_id,
            policy=policy,
            part_timeout=part_timeout,
            poll=poll,
            retention=retention,
            lease=lease,
            takeover_wait=wait,
        )

    @property
    def took_over(self) -> RollbackInfo | None:
        """The rollback this coordinator ordered as it took the run over, once every process
        carried it out (``None`` before, and for a coordinator that created its run).
        """  # noqa: D205
        return self.authority.took_over

    @property
    def bus(self) -> Any:
        """The coordinator's bus (the environment local, every agent remote)."""
        return self._host.bus

    async def start(self) -> None:
        """Make the run's stream, record the run, own it, and start listening to its workers.

        A coordinator made to take a run over
        ([`take_over`][agentsnap.distributed.DistributedRun.take_over]) takes it over instead.

        Raises:
            TransportError: The NATS server is unreachable (nothing is written to the store).
            RunOwnedError: Taking over: the run's coordinator still held its lease after
                ``wait`` seconds (it renews it).
            NotFoundError: Taking over: the store holds no such run.
            ConfigurationError: Taking over: the run is not one of this app's, or it ended.
            RunError: Taking over: the run has had more coordinators than a run may have
                (2,047).
        """
        away = self._link.away_for()
        if away:
            raise TransportError(
                f"the NATS server at {self._link.url} has been unreachable for {away:.1f} s: "
                "start it again (or pass a link to a running one), then start the run"
            )
        if self._taking_over is not None:
            check_run(await self.store.get_run(self.run_id), self._app)
            if not await self._link.has_stream(self.run_id):
                raise ConfigurationError(
                    f"run {self.run_id} has no stream on the NATS server at {self._link.url}: "
                    "take it over with a link to the server its workers use"
                )
            lease = await self._ownership.acquire(wait=self._taking_over)
            try:
                # It may have ended while this one waited (a standby coordinator).
                check_run(await self.store.get_run(self.run_id), self._app)
                generation_floor(lease.token)
            except BaseException:
                await self._ownership.release()
                raise
        else:
            await self._link.ensure_stream(self.run_id)
            await self.store.create_run(
                RunInfo(
                    id=self.run_id,
                    name=self._name,
                    metadata={**self._app.metadata, PROCESSES: sorted(self.processes)},
                )
            )
            lease = await self._ownership.acquire(refuse_live=True)
        if self._taking_over is not None:
            try:
                await self._read_back(lease.token, lease.owner)
            except BaseException:
                await self._ownership.release()  # another may try again at once
                raise
        self._ownership.start_heartbeat(self._lost, self._cancel_requested)
        await self._host.start()
        self._subscription = await self._link.nc.subscribe(
            control_subject(self.run_id), cb=self._on_control
        )
        try:
            # Once the server has the subscription, a worker started next finds this one.
            await self._link.nc.flush()
        except Exception as exc:  # the workers ask again, or learn of it by their leases
            logger.warning("run %s: the control subscription not confirmed: %r", self.run_id, exc)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._watch(), name="agentsnap:parts-watch"))
        if self.policy.every_seconds is not None:
            self._tasks.append(
                loop.create_task(self._tick(self.policy.every_seconds), name="agentsnap:tick")
            )
        if self._taking_over is not None:
            self.authority.take_over(
                f"coordinator {lease.owner} took the run over (lease token {lease.token}); "
                "the run goes back to its last complete cut"
            )

    async def _read_back(self, token: int, owner: str) -> None:
        """Take up the run where its stopped coordinator left it (see ``take_over``)."""
        timeline = await StoredTimeline.load(self.store, self.run_id)
        log = await EnvironmentLog.read(self._link, self.run_id)
        self.complete.extend(timeline.complete)
        self.failed.extend(timeline.failed)
        epoch = max(timeline.last_seq, log.epoch)
        host = self._host
        host.coordinator.last_seq = epoch
        host.bus.environment.epoch = epoch
        host.inputs.restore(log.messages, log.before)
        leases = await self.store.list_agent_leases(self.run_id)
        self.authority.taken_over(
            generation=generation_floor(token),
            history=timeline.rollbacks,
            left=timeline.left,
            hosted=[lease.agent for lease in leases],
            timeline=timeline.line,
        )
        reason = (
            f"its coordinator stopped before it completed; coordinator {owner} took the run over"
        )
        now = utcnow()
        for seq in timeline.missing(epoch):
            snapshot = _environment_snapshot(self.run_id, seq, now, error=reason)
            await self.store.save_snapshot(snapshot)
            self.failed.append(snapshot)
        logger.warning(
            "run %s: taken over by %s at snapshot %d, %d complete snapshot(s), %d rollback(s), "
            "%d input message(s)",
            self.run_id,
            owner,
            epoch,
            len(timeline.complete),
            len(timeline.rollbacks),
            len(log.messages),
        )

    def _lost(self, lost: OwnershipLost) -> None:
        """Another coordinator took the run over: stop acting for it."""
        if self.fenced is not None:
            return
        self.fenced = lost
        logger.error("run %s: this coordinator stops: %s", self.run_id, lost)
        self.authority.fence(str(lost))
        # Nothing of them can be stored now: they fail here only.
        pending, self._pending = self._pending, {}
        for entry in pending.values():
            entry.handle.resolve(None, SnapshotFailed(entry.handle.id, str(lost)))
        self._wake.set()

    def _cancel_requested(self, reason: str) -> None:
        """Someone asked the run to stop (``agentsnap cancel``): every worker stops delivering
        (a side-effecting tool call under way finishes first), ``run_until_idle`` raises
        [`RunCancelled`][agentsnap.RunCancelled], and ``close`` records the run cancelled.
        """  # noqa: D205
        if self.fenced is not None or self._closing:
            return
        task = asyncio.ensure_future(self.authority.cancel(reason))
        self._tasks.append(task)

    async def flush(self) -> None:
        """Wait until the run's stream holds every message ``send`` queued so far.

        What the environment sent is read back from the stream by a coordinator that takes
        the run over: a message not in the stream yet when this coordinator stops is lost.
        """
        await self._host.transport.flush()

    async def __aenter__(self) -> DistributedRun:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close(RunStatus.FAILED if exc[1] is not None else RunStatus.SUCCEEDED)

    # -- input and snapshots ----------------------------------------------------------------

    def send(
        self,
        to: str,
        payload: JsonInput = None,
        *,
        kind: str = "message",
        headers: Mapping[str, str] | None = None,
    ) -> Message:
        """Send agent ``to`` a message from the environment (on NATS, wherever it runs).

        Kept for replay: after a rollback, what was sent after the cut is sent again.
        """
        bus = self._host.bus
        message = bus.send(bus.environment, to, payload, kind, headers)
        self._host.inputs.buffer.append(message)
        return message

    @property
    def rollbacks(self) -> list[RollbackInfo]:
        """The rollbacks of the run so far (for rejected outputs, and recoveries)."""
        return list(self.authority.history)

    @property
    def exhausted(self) -> RunError | None:
        """Why the run stopped (``RollbackExhausted``: its retry policy gave up), or ``None``."""
        return self.authority.exhausted

    def snapshot(self) -> SnapshotHandle:
        """Begin a snapshot now; await the handle for the complete snapshot.

        A snapshot begun while the NATS server is unreachable fails at once (its markers
        cannot reach the workers): awaiting its handle raises
        [`SnapshotFailed`][agentsnap.SnapshotFailed], saying so.
        """
        handle = self._host.coordinator.begin(None)
        loop = asyncio.get_running_loop()
        pending = _Pending(handle, utcnow(), loop.time() + self.part_timeout)
        self._pending[handle.seq] = pending
        away = self._link.away_for()
        if self.fenced is not None:
            pending.error = f"this coordinator was replaced: {self.fenced}"
            self._wake.set()
        elif away:
            pending.error = (
                f"the NATS server at {self._link.url} was unreachable when it began (for "
                f"{away:.1f} s): its markers could not reach the workers"
            )
            self._wake.set()
        logger.debug("run %s: snapshot %d begun", self.run_id, handle.seq)
        return handle

    async def run_until_idle(self, *, every: float = 1.0) -> Snapshot:
        """Wait until the whole run is idle; return the complete snapshot that shows it.

        The run is idle when no message is on its way on any channel (queued in a worker,
        or in the stream between two processes), no handler runs, no rollback is being
        decided or carried out, and the environment has sent nothing more. No process sees
        all of that: a worker knows its own queues and handlers only, and an item may be in
        the stream between two of them. A consistent cut does see it, so the coordinator
        takes snapshots until one shows the run idle:

        - the cut records no message in flight on any channel (a handler running as its
          agent recorded records the message it handles as in flight, so none was running);
        - the environment had sent then all it has sent by now;
        - no rollback was decided or under way from the snapshot's beginning to its end.

        With no message anywhere and no handler running, no agent can act again until the
        environment sends something: once a cut shows that, the run stays idle, although
        the workers recorded their parts at different moments. A rejected output stops its
        worker's deliveries at once, so no snapshot completes between a rejection and its
        rollback.

        A snapshot is begun once every agent is hosted by a worker, no rollback is under
        way and the NATS server is reachable; one at a time, at once and then less and less
        often, up to one every ``every`` seconds while the run is busy. Each is stored like
        any snapshot of the run: the last one is the run's cut at rest.

        It waits for as long as it takes (a worker that died is waited for until its agents
        are hosted again); bound it with ``asyncio.timeout``, whose ``TimeoutError`` then
        notes what the last look found (messages in flight, agents no worker hosts, a
        rollback under way). A handler that raises is logged by its worker, and the run goes
        on without it.

        Args:
            every: Seconds between two snapshots at most, while the run is busy.

        Returns:
            The complete snapshot that shows the run idle.

        Raises:
            RollbackExhausted: The run failed: its retry policy gave up and every process
                stopped delivering (the run's failure, as in ``exhausted``).
            ConfigurationError: The run was not started, or was closed; or ``every`` is not
                a positive number of seconds.
        """
        if not every > 0:
            raise ConfigurationError(f"run_until_idle(every={every!r}): give a positive number")
        if self._subscription is None or self._closing:
            raise ConfigurationError(
                "run_until_idle() needs a started run: call it inside `async with "
                "DistributedRun(...)`, or after start() and before close()"
            )
        pause = min(self._poll / 5, every)
        why = "no snapshot was taken yet"
        try:
            while True:
                self._raise_failure()
                waiting = self._cannot_look()
                if waiting is not None:
                    why = waiting
                    await self._until_stopped(asyncio.sleep(self._poll))
                    continue
                authority = self.authority
                generation, rollbacks = authority.generation, len(authority.history)
                handle = self.snapshot()
                why = f"snapshot {handle.seq} has not completed"
                try:
                    snapshot = await self._until_stopped(handle.wait())
                except SnapshotFailed as exc:
                    why = f"snapshot {handle.seq} failed: {exc.reason}"
                    snapshot = None
                self._raise_failure()
                if snapshot is not None:
                    busy = self._busy_at(snapshot)
                    if busy is None and (
                        authority.busy
                        or authority.generation != generation
                        or len(authority.history) != rollbacks
                    ):
                        busy = f"the run rolled back while snapshot {snapshot.seq} was taken"
                    if busy is None:
                        return snapshot
                    why = busy
                await self._until_stopped(asyncio.sleep(pause))
                pause = min(pause * 2, every)
        except asyncio.CancelledError as exc:
            exc.add_note(f"run {self.run_id} was not idle yet: {why}")
            raise

    def _raise_failure(self) -> None:
        if self.fenced is not None:
            raise self.fenced
        if self.authority.exhausted is not None:
            raise self.authority.exhausted

    async def _until_stopped(self, work: Awaitable[_T]) -> _T | None:
        """``work``'s result, or ``None`` once the run stopped (its retry policy gave up)."""
        task = asyncio.ensure_future(work)
        stopped = asyncio.ensure_future(self.authority.stopped.wait())
        try:
            done, _ = await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not task.done():
                task.cancel()  # nobody waits for it any more
        return task.result() if task in done else None

    def _cannot_look(self) -> str | None:
        """Why a snapshot begun now could only fail, or ``None``."""
        authority = self.authority
        if authority.busy:
            return "a rollback is under way"
        if authority.down:
            return f"{', '.join(sorted(authority.down))} lost their worker"
        unhosted = [name for name in self.names if not authority.hosts_all([name])]
        if unhosted:
            return f"no worker hosts {', '.join(unhosted)} yet"
        away = self._link.away_for()
        if away:
            return f"the NATS server at {self._link.url} is unreachable (for {away:.1f} s)"
        return None

    def _busy_at(self, snapshot: Snapshot) -> str | None:
        """What ``snapshot`` shows still to do, or ``None`` when it shows the run idle."""
        in_flight = sum(len(channel.messages) for channel in snapshot.channels)
        if in_flight:
            return f"snapshot {snapshot.seq} recorded {in_flight} message(s) in flight"
        recorded = snapshot.agents[ENVIRONMENT].sent
        sent = {dst: ch.sent for dst, ch in self._host.bus.environment.outgoing.items()}
        later = sum(count - recorded.get(dst, 0) for dst, count in sent.items())
        if later:
            return f"the environment sent {later} message(s) after snapshot {snapshot.seq} began"
        return None

    @property
    def in_progress(self) -> int:
        """Snapshots begun and neither complete nor failed yet."""
        return len(self._pending)

    async def _tick(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            authority = self.authority
            if authority.busy or authority.down or not authority.hosts_all(self.names):
                # The snapshot would fail: a rollback, a worker that stopped, or agents
                # whose worker has not started yet.
                continue
            # While the NATS server is away a snapshot could only fail: wait for it.
            if len(self._pending) < self.policy.max_in_progress and not self._link.away_for():
                self.snapshot()

    async def _on_control(self, msg: Msg) -> None:
        if self.fenced is not None:
            return  # the coordinator that replaced this one answers
        try:
            request = orjson.loads(msg.data)
        except orjson.JSONDecodeError:
            logger.warning("run %s: a control message that is not JSON was ignored", self.run_id)
            return
        if not isinstance(request, dict):
            return
        if "snapshot" in request:
            self._requests += 1
            self.snapshot()
        elif "rejected" in request:
            self.authority.rejected(request)
        elif "restored" in request:
            self.authority.restored(request)
        elif "lost" in request:
            self.authority.lost(request)
        elif "passed" in request:
            self.authority.passed(request)
        elif "let_go" in request:
            await self._let_go_again(request)
        elif "move" in request and msg.reply:
            task = asyncio.ensure_future(self._move(request, msg))
            self._failing.add(task)
            task.add_done_callback(self._failing.discard)
        elif "hello" in request and msg.reply:
            answer = self.authority.hello(request)
            try:
                await msg.respond(orjson.dumps(answer))
            except Exception as exc:  # the worker asks again, or starts without an answer
                logger.warning("run %s: hello not answered: %r", self.run_id, exc)
        self._wake.set()

    async def _move(self, request: dict[str, Any], msg: Msg) -> None:
        """A worker takes agents from the workers hosting them: a cut, then ``let_go``."""
        worker = str(request.get("move"))
        wanted = request.get("agents")
        names = sorted({str(n) for n in wanted}) if isinstance(wanted, list) else []
        unknown = sorted(set(names) - set(self.names))
        answer: dict[str, Any]
        if not names or unknown:
            answer = {
                "error": f"run {self.run_id} has no agent {', '.join(map(repr, unknown))}"
                if unknown
                else "name the agents to move"
            }
        elif self.authority.exhausted is not None:
            answer = {"error": f"run {self.run_id} stopped: {self.authority.exhausted}"}
        else:
            # The cut the agents move at: the recovery that follows goes back to it, so the
            # work redone is what happened between it and the new worker's start.
            seq: int | None = None
            if self._cannot_look() is None:
                handle = self.snapshot()
                try:
                    async with asyncio.timeout(min(self.part_timeout, _MOVE_CUT)):
                        snapshot = await handle.wait()
                    seq = snapshot.seq
                except (SnapshotFailed, TimeoutError) as exc:
                    logger.warning("run %s: the cut for a move failed: %r", self.run_id, exc)
            self.moves.append((names, worker))
            self.authority.moving(names, worker)
            logger.warning(
                "run %s: %s move to worker %s at snapshot %s",
                self.run_id,
                ", ".join(names),
                worker,
                seq,
            )
            body = orjson.dumps({"let_go": names, "to": worker})
            await self._link.nc.publish(broadcast_subject(self.run_id), body)
            answer = {"moving": names, "snapshot": seq}
        try:
            await msg.respond(orjson.dumps(answer))
        except Exception as exc:  # the worker gives up, saying so
            logger.warning("run %s: a move was not answered: %r", self.run_id, exc)

    async def _let_go_again(self, request: dict[str, Any]) -> None:
        """A worker moving agents to itself finds them still held: order the let-go again.

        Only the latest move of those agents is ordered again, and only for the worker it
        moves them to; a worker lets an agent go once (it no longer hosts it after).
        """
        worker = str(request.get("to"))
        wanted = request.get("let_go")
        names = {str(n) for n in wanted} if isinstance(wanted, list) else set()
        latest = next((move for move in reversed(self.moves) if names.intersection(move[0])), None)
        if latest is None or latest[1] != worker:
            return  # no such move, or a later one took its place
        body = orjson.dumps({"let_go": latest[0], "to": worker})
        try:
            await self._link.nc.publish(broadcast_subject(self.run_id), body)
        except Exception as exc:  # the worker asks again
            logger.warning("run %s: a let-go was not ordered again: %r", self.run_id, exc)

    # -- completion -------------------------------------------------------------------------

    async def _watch(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll):
                    await self._wake.wait()
            self._wake.clear()
            now = asyncio.get_running_loop().time()
            if now - self._leases_seen >= self._poll * 2:
                self._leases_seen = now
                try:
                    leases = await self.store.list_agent_leases(self.run_id)
                except Exception:  # the store is away: look again later
                    logger.exception("run %s: agent leases not read", self.run_id)
                else:
                    self.authority.leases(*self.authority.lease_owners(leases), now)
            for seq in sorted(self._pending):
                try:
                    await self._check(seq)
                except OwnershipLost as exc:  # another coordinator took the run over
                    self._lost(exc)
                except Exception:  # the store is away: look again later
                    logger.exception("run %s: snapshot %d not checked", self.run_id, seq)

    async def _check(self, seq: int) -> None:
        pending = self._pending.get(seq)
        if pending is None:
            return  # failed meanwhile (a rollback, or a worker that stopped)
        if pending.error is not None:
            await self._fail(seq, pending.error)
            return
        own = self._host.worker
        # The environment's part written by a coordinator this one replaced (for a number
        # both began) is not this snapshot's.
        parts = [
            part
            for part in await self.store.load_snapshot_parts(self.run_id, seq)
            if part.worker == own or ENVIRONMENT not in part.agents
        ]
        if seq not in self._pending:
            return
        errors = [f"{part.worker}: {part.error}" for part in parts if part.error]
        if errors:
            await self._fail(seq, "a worker could not record its part: " + "; ".join(errors))
            return
        covered = set().union(*(part.agents for part in parts))
        missing = sorted(self.processes - covered)
        if not missing:
            handle = pending.handle
            snapshot, problems = join_parts(
                handle.id, self.run_id, seq, parts, pending.started_at, handle.initiator
            )
            if problems:
                await self._fail(
                    seq, "the joined cut is not consistent: " + "; ".join(problems[:5])
                )
                return
            if self._pending.pop(seq, None) is None:
                return  # failed while it was checked
            await self.store.save_snapshot(snapshot)
            self.complete.append(snapshot)
            if self.retainer is not None:
                self.retainer.completed(seq)
            handle.resolve(snapshot, None)
            logger.debug("run %s: snapshot %d complete", self.run_id, seq)
        elif asyncio.get_running_loop().time() > pending.deadline:
            await self._fail(
                seq,
                f"no part from {', '.join(missing)} within {self.part_timeout:g} s "
                "(their worker stopped or is stuck)",
            )

    def _start_cut(self, seq: int) -> Snapshot:
        """The run's start as complete snapshot ``seq``: every agent's initial state."""
        now = utcnow()
        agents = {ENVIRONMENT: AgentCut(state_json=_NOTHING.json, state_hash=_NOTHING.hash)}
        for agent in self._app.agents:
            blob = encode_state(agent.name, agent.state)
            if self._app.redact is not None:
                blob = self._app.redact.state_text(agent.name, blob)
            agents[agent.name] = AgentCut(
                state_json=blob.json,
                state_hash=blob.hash,
                state_version=state_version(type(agent.state)),
            )
        return _environment_snapshot(self.run_id, seq, now, agents=dict(sorted(agents.items())))

    def _fail_all(self, reason: str) -> None:
        """Fail every snapshot in progress now (stored as failed in the background)."""
        for seq in sorted(self._pending):
            task = asyncio.ensure_future(self._fail(seq, reason))
            self._failing.add(task)
            task.add_done_callback(self._failing.discard)

    async def _fail(self, seq: int, reason: str) -> None:
        pending = self._pending.pop(seq, None)
        if pending is None:
            return
        handle = pending.handle
        logger.warning("run %s: snapshot %d failed: %s", self.run_id, seq, reason)
        snapshot = Snapshot(
            id=handle.id,
            run_id=self.run_id,
            seq=seq,
            initiator=handle.initiator,
            status=SnapshotStatus.FAILED,
            started_at=pending.started_at,
            error=reason,
        )
        try:
            await self.store.save_snapshot(snapshot)
        finally:
            self.failed.append(snapshot)
            handle.resolve(None, SnapshotFailed(handle.id, reason))

    async def settle(self) -> None:
        """Wait until every snapshot begun so far is complete or failed (or timed out)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.part_timeout + 5
        while self._pending and loop.time() < deadline:
            self._wake.set()
            await asyncio.sleep(self._poll / 2)

    async def close(self, status: RunStatus = RunStatus.SUCCEEDED) -> None:
        """Stop beginning snapshots, let those in progress settle, and record the run's end.

        A coordinator that was replaced (``fenced``) records nothing: the run goes on under
        the one that took it over.
        """
        for task in self._tasks[1:]:
            task.cancel()
        await self.settle()
        await self.authority.close()
        for seq in sorted(self._pending):
            await self._fail(seq, "the run's coordinator closed before every part came")
        await asyncio.gather(*self._failing, return_exceptions=True)
        if isinstance(self.authority.exhausted, RunCancelled):
            status = RunStatus.CANCELLED
        elif self.authority.exhausted is not None:
            status = RunStatus.FAILED
        # The watch stops at its next turn: a cancellation that met its wake-up could be lost.
        self._closing = True
        self._wake.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._subscription is not None:
            with contextlib.suppress(Exception):
                await self._subscription.unsubscribe()
        if self.retainer is not None:
            await self.retainer.close()
        await self._host.close()
        if self.fenced is not None:
            await self._ownership.release()  # another coordinator runs the run now
            return
        exhausted = self.authority.exhausted
        await self.store.finish_run(
            self.run_id, status, utcnow(), None if exhausted is None else str(exhausted)
        )
        await self._ownership.release()
