"""One process of a run spread over processes: its bus on NATS, its agents, its recording.

Both a worker and the run's coordinator (which hosts the environment) are a ``Host``: every
process of the run is an endpoint of its bus, those hosted here are local, and the
[`JetStreamTransport`][agentsnap.jetstream.JetStreamTransport] carries the channels to and
from the others over NATS.

Handlers run on the same delivery kernel as in a [`Runtime`][agentsnap.Runtime]: inside
their span, their outputs passing the app's checks and the agent's own ``evaluate``, their
side-effecting tools and model calls recorded in the ledger of the run's store, a snapshot
recorded inside a long handler. A rejected output, or work lost to a database that did not
answer, stops this process's deliveries and is reported (``report``, ``report_lost``); the
run's coordinator then orders every process to go back to a cut
([`roll_back`][agentsnap.distributed.Host.roll_back]) and, once all did, to go on
([`resume`][agentsnap.distributed.Host.resume]). A handler that raises is a
[`HandlerFailed`][agentsnap.HandlerFailed] in ``failures``, as in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sys
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from agentsnap._following import Following
from agentsnap._team import Team
from agentsnap.agents import Agent
from agentsnap.bus import AsyncioScheduler, Bus
from agentsnap.distributed.orders import CONTROL, control_subject
from agentsnap.distributed.recording import PartCoordinator
from agentsnap.exceptions import HandlerFailed, OutputRejected, StoreError
from agentsnap.jetstream import ChannelOffset, JetStreamLink, JetStreamTransport
from agentsnap.jetstream.codec import order_subject, order_subjects
from agentsnap.messages import ENVIRONMENT, Message
from agentsnap.once import KnownTools
from agentsnap.records import ReplaySegment, Snapshot, SnapshotStatus, utcnow
from agentsnap.replay import InputLog, ReplayLog, missing, plan_replay
from agentsnap.requests import ApprovalPolicy, approval_rules
from agentsnap.rollback import recorded_messages
from agentsnap.state import check_round_trip
from agentsnap.store.faults import classify
from agentsnap.store.ledger import MemoryLedger, ledger_for
from agentsnap.telemetry import Telemetry, resolve

if TYPE_CHECKING:
    from agentsnap.checks import OutputCheck
    from agentsnap.distributed.orders import RollbackOrder
    from agentsnap.ledger import Ledger
    from agentsnap.records import ChannelOffsets, SnapshotPart
    from agentsnap.redaction import Redaction
    from agentsnap.store import DistributedStore

Report = Callable[[OutputRejected, Message | None, int], None]
"""Tells the run's coordinator of a rejected output: the rejection, the message being
handled, and the generation it happened in."""

ReportLost = Callable[[str, Message, str, int], None]
"""Tells the run's coordinator that a handler's work was lost to a database fault: the
agent, the message it was handling, why, and the generation it happened in."""

__all__ = ["CONTROL", "Host", "Report", "ReportLost", "control_subject"]

logger = logging.getLogger("agentsnap.distributed")


_APPENDS = 12
"""Attempts at appending a segment to the run's replay log when another worker appended
one at the same position at the same moment."""

_ORDER_TIMEOUT = 2.0
"""Seconds the stream has to store a piece of the delivery order before the store is
written instead."""

_TRIM_EVERY = 0.5
"""Seconds between two purges of a worker's delivery order the store holds already from
the run's stream."""


async def _append_shared(store: DistributedStore, run_id: str, segment: ReplaySegment) -> None:
    """Append ``segment`` to the replay log of ``run_id``, which every worker appends to.

    Two workers appending at the same moment may take the same position: the one refused
    writes again after a moment.

    Raises:
        StoreError: The store could not write it.
    """
    for attempt in range(1, _APPENDS + 1):
        try:
            await store.append_replay(run_id, segment)
            return
        except StoreError as exc:
            # A transient fault was retried by the store; one it refused outright, with no
            # fault to name, is the position taken by another worker's segment.
            if attempt == _APPENDS or type(exc) is not StoreError or classify(exc) is not None:
                raise
            logger.debug("run %s: a replay segment collided; written again: %s", run_id, exc)
            await asyncio.sleep(random.uniform(0.0, 0.002 * attempt))


class _Line:
    """A distributed run's timeline, as its coordinator numbers it.

    Kept by the replay log of a process hosting agents; the generation in the process
    hosting only the environment (it makes no model call).
    """

    __slots__ = ("_replay", "_transport")

    def __init__(self, transport: JetStreamTransport, replay: ReplayLog | None) -> None:
        self._transport = transport
        self._replay = replay

    @property
    def timeline(self) -> int:
        replay = self._replay
        return self._transport.generation if replay is None else replay.timeline

    @property
    def resumed(self) -> int:
        # Workers start and restart at any generation: every timeline may hold records.
        return sys.maxsize


class Host:
    """The bus, agents and snapshot recording of one process of a run.

    Args:
        link: The connection to NATS.
        store: Where the parts go.
        run_id: The run.
        names: Every agent of the run.
        agents: The agents hosted here (a subset of ``names``).
        worker: This process's name in the run (its parts are stored under it).
        environment: Whether this process hosts the environment (the run's coordinator).
        checks: The checks on each hosted agent's outputs (see
            [`App.check`][agentsnap.distributed.App.check]).
        ledger: Where side-effecting tool calls are recorded (default: the ledger of the
            store's database; in memory for a store in memory).
        telemetry: Where spans and metrics go, as for a [`Runtime`][agentsnap.Runtime]: by
            default the global OpenTelemetry providers when an SDK is installed there.
        redaction: Applied to each snapshot part before it is written, to the tool and
            model calls the hosted agents record, and to the values a restored cut needs
            (see [`agentsnap.redaction`][agentsnap.redaction]).
        approvals: Tools whose side-effecting calls wait for a person's approval, by tool
            name (the app's ``approvals``), as the kernel applies them in one process.
        replay_patience: Seconds the hosted agents wait, when they redo their work after a
            worker restarted, for the message their logged order names next, before they
            give the order up and take their messages as they come.

    Attributes:
        bus: The bus.
        transport: The transport on NATS.
        coordinator: Records this process's part of each snapshot.
        team: The hosted agents, on the delivery kernel a ``Runtime`` uses.
        failures: Handler failures (a handler, or an ``on_rollback``, that raised), oldest
            first.
        ledger: The tool-call ledger.
        tools: The tools the hosted agents called.
        inputs: What the environment sent (in the process hosting it), sent again after a
            rollback from where the cut stands.
        report: Called with each rejected output (a worker sends it to the coordinator).
        report_lost: Called when a handler's work was lost to a database fault (a worker
            sends it to the coordinator, which rolls the run back once the database answers).
        rollbacks: The rollbacks this process carried out, oldest first.
        replay: The hosted agents' replay log (``None`` in the process hosting only the
            environment): each delivery's order, written to the run's store before any
            side-effecting tool call (see [`agentsnap.replay`][agentsnap.replay]).
        following: Has the hosted agents take their messages in the logged order after a
            recovery (``None`` with no replay log).
        followed: Deliveries the recoveries here planned from the replay log.
        order_in_stream: Whether the hosted agents' delivery order is secured in the run's
            stream before what they sent leaves (one acknowledged publish; the store
            takes it in the background), rather than written to the store first (one
            commit). Both keep the guarantee; the stream's round trip is the shorter.
            Set it before [`start`][agentsnap.distributed.Host.start].
        copied: Pieces of the delivery order the recoveries here copied from the run's
            stream into the store, which lacked them.
    """

    order_in_stream: bool = True

    def __init__(
        self,
        link: JetStreamLink,
        store: DistributedStore,
        run_id: str,
        names: Collection[str],
        agents: Mapping[str, Agent[Any]],
        *,
        worker: str,
        environment: bool = False,
        checks: Mapping[str, Sequence[OutputCheck]] | None = None,
        ledger: Ledger | None = None,
        telemetry: Telemetry | bool | None = None,
        redaction: Redaction | None = None,
        approvals: Mapping[str, ApprovalPolicy] | None = None,
        replay_patience: float = 10.0,
    ) -> None:
        self.link = link
        self.redaction = redaction
        self.store = store
        self.run_id = run_id
        self.worker = worker
        local = set(agents) | ({ENVIRONMENT} if environment else set())
        self.local = frozenset(local)
        self._owns_ledger = ledger is None
        self.ledger: Ledger = ledger or ledger_for(store) or MemoryLedger()
        self.tools = KnownTools()
        self.inputs = InputLog()
        self.report: Report | None = None
        self.report_lost: ReportLost | None = None
        self.rollbacks: list[RollbackOrder] = []
        self.report_passed: Callable[[tuple[str, str, int]], None] | None = None
        """Called when a message being redone after a rejection was handled without one."""
        self._redo: set[tuple[str, str, int]] = set()
        self._reported: int | None = None  # the generation whose rejection was reported
        self.replay_timeout = 10.0
        """Seconds a rollback waits for a channel's range to come back from the stream
        before it puts back the messages the cut recorded instead."""
        self.replayed = 0
        """Channels a rollback put back by replaying their range from the stream."""
        self.put_back = 0
        """Channels from other processes a rollback put back from the recorded bodies
        because the stream did not give the range back."""
        self.transport = JetStreamTransport(link, run_id, local)
        if agents:
            # What the agents here send depends on the order they took their messages in.
            link.before_publish = self._before_publish
        self.scheduler = AsyncioScheduler()
        self.bus = Bus(self.scheduler, self.transport)
        self.coordinator = PartCoordinator(
            self.bus, agents, run_id, worker=worker, local=local, write=self._write_part
        )
        self.transport.on_marker = self.coordinator.marker_arrived
        # Channels idle since their sender's last recording close by count, without a marker.
        self.transport.on_cut = self.coordinator.heard
        self.coordinator.tell = self.transport.tell_cut
        self.telemetry = resolve(telemetry)
        self.coordinator.observer = self.telemetry
        self.failures: list[HandlerFailed] = []
        self._agents = dict(agents)
        self._control = control_subject(run_id)
        self.replay = ReplayLog(self._write_segment, self.inputs) if agents else None
        self.followed = 0
        self.copied = 0
        self._order_subject = order_subject(run_id, worker)
        self._order_ids = f"{run_id}/order/{uuid.uuid4().hex}/"
        self._order_count = 0
        self._trim_below = 0
        self._trimmed = 0
        self._trimming: asyncio.Task[None] | None = None
        self.team = Team(
            self.bus,
            self.coordinator,
            run_id,
            self,
            ledger=self.ledger,
            tools=self.tools,
            line=_Line(self.transport, self.replay),
            replay=self.replay,
            telemetry=self.telemetry,
            redaction=redaction,
            approvals=approval_rules(approvals),
        )
        self.following = (
            None
            if self.replay is None
            else Following(
                run_id,
                self.bus,
                self.team,
                self.replay,
                patience=replay_patience,
                wake=self.scheduler.wake,
            )
        )
        for name, declared in (checks or {}).items():
            for check in declared:
                self.team.check(name, check)
        for name in names:
            endpoint = self.bus.add(name, 0)
            agent = self._agents.get(name)
            if agent is not None:
                blob = check_round_trip(name, agent.state)
                self.team.add(agent, endpoint, blob.json, blob.hash)
        tracing = self.telemetry if self.telemetry and self.telemetry.tracing else None
        if tracing is not None:
            self.bus.observe(tracing)
        if self.telemetry is not None:
            self.telemetry.watch(self.bus)
        # The channels between processes are made on first use: a recording here waits for
        # each other agent's notice, which names the channels that carried messages (see
        # agentsnap.distributed.recording). The environment's channels exist (``bus.add``).

    async def start(self, positions: Mapping[str, int] | None = None) -> None:
        """Start consuming from the run's stream and delivering.

        Args:
            positions: Per hosted agent, the stream sequence to consume from (by default
                the start of the stream).
        """
        replay = self.replay
        if replay is not None and self.order_in_stream:
            replay.mirror = self._secure_segment
            replay.on_written = self._order_written
        await self.transport.start(positions)
        self.scheduler.start()
        if self.following is not None:
            self.following.watch()

    def enter_timeline(self, timeline: int) -> None:
        """Start on the run's ``timeline`` (as its coordinator said), before delivering."""
        if self.replay is not None:
            self.replay.timeline = timeline

    async def mark_timeline(self, timeline: int) -> None:
        """Mark in the run's replay log that the run goes on with ``timeline`` from here.

        The run's coordinator marks each timeline it starts before it orders it: the mark
        holds no delivery, and every worker's deliveries on that timeline come after it. A
        coordinator that takes the run over goes on with the newest timeline marked, the
        one the workers logged their order on and recorded their model calls on.

        Raises:
            StoreError: The store could not write it.
            OwnershipLost: The store is fenced, and another coordinator took the run over.
        """
        await _append_shared(self.store, self.run_id, ReplaySegment.of(timeline))

    async def close(self, drain: float = 10.0) -> None:
        """Stop delivering; the snapshots in progress fail here; wait for the part writes.

        Args:
            drain: Seconds to wait at most for the server to confirm what is still queued
                for it (a server that is away confirms nothing).
        """
        if self.telemetry is not None:
            self.telemetry.unwatch(self.bus)
        await self.scheduler.close()
        self.coordinator.abort_all(f"worker {self.worker} stopped before recording its part")
        await self.coordinator.drain()
        replay = self.replay
        if replay is not None:
            assert self.following is not None
            if self.link.before_publish == self._before_publish:
                self.link.before_publish = None
            self.following.unwatch()
            try:
                await replay.flush()  # the order of what was delivered, for a recovery
            except Exception as exc:  # no effect depends on it
                logger.warning("%s: the replay log was not written: %r", self.worker, exc)
            await replay.close()
        trimming = self._trimming
        if trimming is not None:
            trimming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await trimming
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.transport.flush(), drain)
        await self.transport.close()
        if self._owns_ledger:
            await self.ledger.close()

    # -- rollback ---------------------------------------------------------------------------

    async def roll_back(
        self,
        order: RollbackOrder,
        snapshot: Snapshot | None,
        offsets: Sequence[ChannelOffsets] = (),
    ) -> int:
        """Phase 1 of a rollback: put the processes hosted here back on ``snapshot``'s cut.

        Stops delivering (the handlers under way are cancelled, as in one process: one
        inside a side-effecting tool call first lets the call finish and its outcome be
        recorded in the ledger), moves to the order's generation (what was sent before is
        dropped from then on), restores the hosted agents' states and every channel's
        counters from the cut, and puts back the messages the cut recorded in flight on the
        channels into the hosted processes: on a
        channel from another process, by replaying its recorded stream range (``offsets``,
        from the snapshot's parts), taking in the range's messages although they are of an
        older generation; from the bodies the cut recorded when the stream no longer holds
        the range (or it cannot be replayed). The process hosting the environment also sends
        again the input sent after the cut. Nothing is delivered until
        [`resume`][agentsnap.distributed.Host.resume].

        Args:
            order: The rollback.
            snapshot: The complete snapshot it goes back to; ``None`` for the run's start.
            offsets: The stream ranges the snapshot's parts recorded.

        Returns:
            How many messages queued here were discarded.
        """
        await self.team.quiesce("the run rolled back before the snapshot completed")
        replay, following = self.replay, self.following
        same = replay is not None and order.line == replay.timeline
        if following is not None:
            following.stop()
        if replay is not None:
            if same:
                replay.take()  # numbered from the channels' counters, before the restore
            else:
                replay.new_timeline(order.line)
        transport = self.transport
        transport.generation = max(transport.generation, order.generation)
        self.scheduler.reset()
        coordinator = self.coordinator
        epoch = max(order.epoch, coordinator.last_seq)
        coordinator.last_seq = epoch
        cut = snapshot or Snapshot(
            id="",
            run_id=self.run_id,
            seq=0,
            initiator=ENVIRONMENT,
            status=SnapshotStatus.COMPLETE,
            started_at=utcnow(),
        )
        replays = await self._replayable(cut, offsets)
        if replays:
            kept = [ch for ch in cut.channels if (ch.src, ch.dst) not in replays]
            cut = cut.model_copy(update={"channels": kept})
        discarded = self.team.restore(
            cut,
            epoch=epoch,
            inputs=self.inputs if ENVIRONMENT in self.local else None,
            local=self.local,
        )
        if replays:
            assert snapshot is not None
            await self._replay(snapshot, replays, epoch)
        planned = await self._follow(cut) if same else 0
        self._reported = None
        self.rollbacks.append(order)
        logger.warning(
            "%s: rolled back to %s (generation %d, timeline %d%s): %s",
            self.worker,
            f"snapshot {snapshot.seq}" if snapshot is not None else "the start",
            order.generation,
            order.line,
            f", {planned} deliveries to redo in the order logged" if same else "",
            order.reason,
        )
        return discarded

    async def _follow(self, cut: Snapshot) -> int:
        """Have the hosted agents redo their deliveries after ``cut`` in the order logged.

        A recovery keeps the run on its timeline: every process's agents take their
        messages after the cut in the order they took them before, so that their handlers
        get the answers their model calls recorded, send the same messages, and derive the
        same idempotency keys. The order comes from the replay log every worker of the run
        appends to, whichever worker hosted the agents before.

        Returns:
            How many deliveries the plans name.
        """
        replay, following = self.replay, self.following
        assert replay is not None
        assert following is not None
        try:
            await replay.flush()
        except Exception as exc:  # what was not written had no effect depending on it
            logger.warning(
                "%s: the replay log was not written before the rollback: %r", self.worker, exc
            )
        try:
            segments = await self.store.load_replay(self.run_id)
        except Exception as exc:
            logger.warning(
                "%s: the replay log could not be read (%r); the agents here take their "
                "messages in any order",
                self.worker,
                exc,
            )
            return 0
        segments = await self._copy_secured(segments)
        plan = plan_replay(segments, cut, timeline=replay.timeline, agents=self._agents)
        self.followed += plan.deliveries
        following.follow(plan)
        return plan.deliveries

    async def _before_publish(self) -> None:
        """Make the hosted agents' delivery order durable before what they sent leaves.

        Another process's work depends on the messages it receives, and so on the order in
        which the agents here took theirs: a recovery redoes that order, and the messages
        sent again carry the same content under the same ids. Secured in the run's stream
        (``order_in_stream``), it is one acknowledged publish for every item queued
        meanwhile, and the store takes it in the background; else the replay log's group
        commit makes it one write to the store. A stream that does not take it in time
        leaves it to the store.
        """
        replay = self.replay
        if replay is None or replay.secured():
            return
        if replay.mirror is not None and self.link.nc.is_connected:
            try:
                await replay.secure()
            except Exception as exc:
                logger.debug("%s: the delivery order goes to the store: %r", self.worker, exc)
            else:
                return
        try:
            await replay.flush()
        except Exception as exc:  # published anyway: the run must not stall on its log
            logger.warning(
                "%s: messages published before the order of their deliveries was written: %r",
                self.worker,
                exc,
            )

    async def _write_segment(self, segment: ReplaySegment) -> None:
        await _append_shared(self.store, self.run_id, segment)

    async def _secure_segment(self, segment: ReplaySegment) -> int:
        """Store ``segment`` of the replay log in the run's stream; where it was stored."""
        body = orjson.dumps({"timeline": segment.timeline, "body": segment.body})
        if len(body) > self.link.max_payload:
            raise StoreError(  # the store takes it instead
                f"a piece of the delivery order of {len(body)} bytes does not fit the "
                f"server's {self.link.max_payload}"
            )
        self._order_count += 1
        return await self.link.append(
            self._order_subject,
            body,
            item_id=f"{self._order_ids}{self._order_count}",
            patience=_ORDER_TIMEOUT,
        )

    def _order_written(self, where: int) -> None:
        """The store holds the delivery order the stream held up to ``where``: drop it there."""
        self._trim_below = max(self._trim_below, where + 1)
        if self._trimming is None:
            self._trimming = asyncio.ensure_future(self._trim())

    async def _trim(self) -> None:
        try:
            while self._trim_below > self._trimmed:
                below = self._trim_below
                await self.link.purge_subject(self.run_id, self._order_subject, below)
                self._trimmed = below
                await asyncio.sleep(_TRIM_EVERY)
        except Exception as exc:  # kept in the stream: a recovery finds it in the store
            logger.debug("%s: the delivery order stays in the stream: %r", self.worker, exc)
        finally:
            self._trimming = None

    async def _copy_secured(self, segments: list[ReplaySegment]) -> list[ReplaySegment]:
        """``segments`` of the store, with the pieces of the order the stream secured and the
        store lacks (a worker stopped before writing them) appended, and written there.

        What the stream holds of a worker's order follows what the store holds of it: the
        pieces the store lacks complete it, in the order the worker secured them.
        """  # noqa: D205
        subjects = order_subjects(self.run_id)
        try:
            held = await self.link.read(self.run_id, subjects)
        except Exception as exc:
            logger.warning(
                "%s: the delivery order secured in the stream could not be read (%r); "
                "the store's is followed",
                self.worker,
                exc,
            )
            return segments
        if not held:
            return segments
        secured: list[ReplaySegment] = []
        for seq, body in held:
            try:
                piece = orjson.loads(body)
                secured.append(ReplaySegment(int(piece["timeline"]), str(piece["body"])))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                logger.error("%s: dropped stream item %d: not a piece of order", self.worker, seq)
        lacking = missing(segments, secured)
        try:
            for segment in lacking:
                await self._write_segment(segment)
        except Exception as exc:  # followed from memory: the next recovery copies them again
            logger.warning(
                "%s: the delivery order from the stream was not written to the store: %r",
                self.worker,
                exc,
            )
            return segments + lacking
        self.copied += len(lacking)
        with contextlib.suppress(Exception):  # the store holds all of it now
            await self.link.purge_subject(self.run_id, subjects, held[-1][0] + 1)
        return segments + lacking

    async def _replayable(
        self, cut: Snapshot, offsets: Sequence[ChannelOffsets]
    ) -> dict[tuple[str, str], ChannelOffsets]:
        """The channels into hosted agents whose range in flight the stream can replay."""
        incoming = self.transport.incoming
        found = {
            (o.src, o.dst): o
            for o in offsets
            if (o.src, o.dst) in incoming
            and o.count
            and len(o.seqs) == o.count
            and all(o.seqs)
            and len(cut.in_flight(o.src, o.dst)) == o.count
        }
        if not found:
            return {}
        try:
            held = await self.link.first_sequence(self.run_id)
        except Exception as exc:  # put the recorded bodies back instead
            logger.warning("%s: the stream's range is unknown (%r)", self.worker, exc)
            return {}
        return {key: o for key, o in found.items() if min(o.seqs) >= held}

    async def _replay(
        self, snapshot: Snapshot, replays: dict[tuple[str, str], ChannelOffsets], epoch: int
    ) -> None:
        """Replay each range from the stream; put back the recorded bodies where it fails."""
        incoming = self.transport.incoming
        for key, offsets in sorted(replays.items()):
            await incoming[key].replay_from(
                ChannelOffset(min(offsets.seqs), offsets.after), offsets.seqs
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.replay_timeout
        delay = 0.001
        # The range arrives through the consumer, with nothing to await on here.
        while loop.time() < deadline and any(
            len(incoming[key]) < o.count for key, o in replays.items()
        ):
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        short = sorted(key for key, o in replays.items() if len(incoming[key]) != o.count)
        self.replayed += len(replays) - len(short)
        if not short:
            return
        # The stream did not give the range back (messages deleted from it): the bodies.
        logger.warning(
            "%s: %s not replayed from the stream; the messages the cut recorded are put back",
            self.worker,
            ", ".join(f"{src}>{dst}" for src, dst in short),
        )
        self.put_back += len(short)
        self.scheduler.reset()
        for key in short:
            channel = incoming[key]
            channel.stop_accepting()
            channel.clear()
            for message in recorded_messages(
                next(ch for ch in snapshot.channels if (ch.src, ch.dst) == key)
            ):
                channel.append(message._replace(epoch=epoch) if message.epoch > epoch else message)
        notify = self.scheduler.notify
        for held in self.bus.channels.values():
            if held.dst in self._agents:
                for _ in range(len(held)):
                    notify(held)

    async def resume(self, order: RollbackOrder, epoch: int = 0) -> None:
        """Phase 2 of a rollback: every process carried it out; deliver again.

        The agent whose output was rejected gets the reason as feedback, every hosted agent's
        [`on_rollback`][agentsnap.Agent.on_rollback] is called (one that raises is a failure
        of its agent, and the others go on), and delivery resumes.

        Args:
            order: The rollback, as carried out by ``roll_back``.
            epoch: The newest snapshot number begun by now (snapshots begun during the
                rollback failed).
        """
        coordinator = self.coordinator
        if epoch > coordinator.last_seq:
            coordinator.last_seq = epoch
            for name in self.local:
                endpoint = self.bus.endpoints[name]
                endpoint.epoch = max(endpoint.epoch, epoch)
        await self.team.after_rollback(order.info(self.run_id))
        self._redo = set(order.redo)
        self.team.redoing = self._redo
        self.scheduler.resume()

    def stop(self, reason: str) -> None:
        """The run stopped (its retry policy gave up): deliver nothing more."""
        self.scheduler.pause()
        self.scheduler.reset()
        self.coordinator.abort_all(f"the run stopped: {reason}")

    # -- what the team reports (TeamEvents) ---------------------------------------------------

    def _stop_to_report(self, generation: int, what: str) -> int | None:
        """Stop delivering here, to report ``what`` happened on ``generation`` to the coordinator.

        One report per timeline: the first stops the scheduler, and the coordinator's rollback
        order (or its stop) follows.

        Returns:
            The timeline reported; ``None`` when ``generation`` is a discarded timeline's, or
            this one was reported already (nothing to do).
        """
        if generation != self.team.generation or self._reported is not None:
            logger.debug("%s: dropped %s of a discarded timeline", self.worker, what)
            return None
        reported = self._reported = self.transport.generation
        # Stop here at once, before other handlers see what this one did.
        self.scheduler.pause()
        return reported

    def failed(self, failure: HandlerFailed) -> None:
        """A hosted handler (or ``on_rollback``) raised: the other agents go on."""
        self.failures.append(failure)

    async def rejected(
        self, rejection: OutputRejected, generation: int, handling: Message | None
    ) -> None:
        """An output was rejected here: stop delivering, and tell the run's coordinator."""
        reported = self._stop_to_report(generation, "a rejection")
        if reported is None:
            return
        logger.warning(
            "%s: output of %s rejected by %s: %s",
            self.worker,
            rejection.agent,
            rejection.source,
            rejection.reason,
        )
        if self.report is not None:
            self.report(rejection, handling, reported)

    async def lost(self, error: Exception, agent: str, message: Message, generation: int) -> None:
        """A handler here could not finish for a database fault: stop delivering, and tell the
        run's coordinator, which rolls every process back once the database answers.
        """  # noqa: D205
        reported = self._stop_to_report(generation, "a database failure")
        if reported is None:
            return
        logger.warning(
            "%s: agent %r could not finish %s: %s; the run goes back to its last cut once the "
            "database answers",
            self.worker,
            agent,
            message.id,
            error,
        )
        if self.report_lost is not None:
            self.report_lost(agent, message, f"the database was unavailable: {error}", reported)

    def passed(self, message: Message) -> None:
        """A message redone after a rejection passed: its episode ends at the coordinator."""
        key = (message.src, message.dst, message.seq)
        if key in self._redo:
            self._redo.discard(key)
            if self.report_passed is not None:
                self.report_passed(key)

    def snapshot_due(self) -> None:
        """Never reported: the run's coordinator decides when snapshots are taken."""

    async def _write_part(self, part: SnapshotPart) -> None:
        redaction = self.redaction
        await self.store.save_snapshot_part(part if redaction is None else redaction.part(part))
        notice = orjson.dumps({"part": part.seq, "worker": part.worker})
        try:
            await self.link.nc.publish(self._control, notice)
        except Exception as exc:  # the coordinator finds the part in the store anyway
            logger.debug("%s: notice of part %d not sent: %r", self.worker, part.seq, exc)
