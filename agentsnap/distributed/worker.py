"""A worker: hosts some agents of a run spread over processes, and records their parts.

```text
agentsnap worker --nats nats://127.0.0.1:4222 --db postgresql://127.0.0.1/db
    --app myproject.bank:make_app --run RUN --group 0/3
```

A worker claims its agents in the store (a lease per agent, renewed every third of its time
to live: a second worker for one of them is refused), consumes what is sent to them from the
run's stream, delivers it, and writes its part of every snapshot the run's coordinator
begins. It stops cleanly on SIGTERM or SIGINT (``stop``): snapshots in progress fail (the
part says why), its consumers and leases are let go.

As it starts, it asks the run's coordinator for the run's generation and snapshot number.
When its agents ran before (it restarts after a crash, or takes over the agents of a worker
that stopped: ``wait`` lets it wait for that worker's leases to expire), it delivers nothing
until the coordinator has rolled the whole run back to the last complete snapshot, this
worker restoring its agents from it. It reports its agents' rejected outputs to the
coordinator and carries out the rollbacks the coordinator orders (see
[`RollbackAuthority`][agentsnap.distributed.RollbackAuthority]).

**Moving agents.** A worker started with ``move`` (``agentsnap worker ... --agents a
--move``) takes its agents from the workers hosting them without stopping the run: it asks
the run's coordinator, which takes a snapshot (the cut the agents move at) and tells every
worker to let them go; the new worker asks for that order again every second while the
agents are still held (plain NATS may lose it), and a worker carries it out once. A worker
told so stops delivering, lets its snapshot parts in progress fail, writes its agents'
delivery order, ends its claim on those agents alone, and goes on with the agents it keeps,
delivering nothing to them until the run went back to the cut (it stops when it keeps
none). The new worker then claims them, and the run goes back to that cut as for a worker
that restarted, on its timeline, in one rollback: every agent redoes its work after the cut
in the order it logged, so handlers derive the same keys and effects happen once; the moved
agents are restored from the cut by the worker that now hosts them.

A NATS server that goes away and comes back (a restart) is waited for: the worker publishes
what it queued meanwhile and consumes from where it stopped. One that stays away longer than
``nats_patience`` seconds makes the worker give up: it stops as on ``stop()``, and
[`run`][agentsnap.distributed.Worker.run] raises a
[`TransportError`][agentsnap.exceptions.TransportError] saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import orjson

from agentsnap.distributed.app import App, check_run
from agentsnap.distributed.host import Host
from agentsnap.distributed.orders import (
    RollbackOrder,
    broadcast_subject,
    control_subject,
    rejection_to_json,
)
from agentsnap.exceptions import ConfigurationError, StoreError, TransportError
from agentsnap.limits import MAX_WORKER_NAME, check_text
from agentsnap.liveness import owner_id
from agentsnap.records import utcnow

if TYPE_CHECKING:
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription

    from agentsnap.exceptions import OutputRejected
    from agentsnap.jetstream import JetStreamLink
    from agentsnap.messages import Message
    from agentsnap.redaction import Redaction
    from agentsnap.store import DistributedStore
    from agentsnap.telemetry import Telemetry

__all__ = ["AgentsHeld", "Worker"]

logger = logging.getLogger("agentsnap.distributed")

_LET_GO = 60.0
"""Seconds a worker moving agents to itself waits for them at least: the worker hosting them
finishes its handlers under way and writes what it queued first."""

_MOVE_CUT = 30.0
"""Seconds the coordinator takes at most for the cut a move happens at."""

_LAPSED = "claim-lapsed"
"""The hold on a worker's deliveries while its claim on the agents ran out unrenewed."""

_ASK_AGAIN = 1.0
"""Seconds between two requests of a worker moving agents to itself, while they are held,
that the coordinator send its let-go order again (plain NATS may lose it on the way)."""


class AgentsHeld(ConfigurationError):
    """Another live worker hosts some of the agents this one was to host."""


class Worker:
    """Hosts some agents of a run on NATS JetStream, writing their parts of its snapshots.

    Args:
        link: The connection to NATS.
        store: The run's store (which holds the run: its coordinator created it).
        run_id: The run.
        app: Every agent of the run.
        agents: The names of those hosted here.
        name: The worker's name in the run; by default ``host:pid:token``.
        lease: Seconds a claim on the agents holds without renewal.
        nats_patience: Seconds the worker waits for a lost NATS server to come back before
            it gives up (and stops).
        wait: Seconds to wait for agents held by another worker: a worker that stopped
            without letting them go holds them until its leases expire, and one cut off
            from the database in the middle of a transaction keeps their rows locked until
            the server ends its session (default: refuse at once).
        hello_timeout: Seconds to wait for the run's coordinator to answer as the worker
            starts; without an answer it starts as in a new run.
        telemetry: Where the hosted handlers' spans and the bus's metrics go, as for a
            [`Runtime`][agentsnap.Runtime]: by default the global OpenTelemetry providers
            when an SDK is installed there; ``False`` records nothing.
        redact: What the worker must never write (see
            [`agentsnap.redaction`][agentsnap.redaction]); by default the app's
            (``App(redact=...)``). Give every worker of a run the same policy and key.
        move: Take the agents from the workers hosting them now, at a cut, while the run
            goes on (see *Moving agents* above); ``start`` then waits ``wait`` seconds at
            most, and at least 60, for them to be let go.
    """

    def __init__(
        self,
        link: JetStreamLink,
        store: DistributedStore,
        run_id: str,
        app: App,
        agents: Collection[str],
        *,
        name: str | None = None,
        lease: float = 10.0,
        nats_patience: float = 60.0,
        wait: float = 0.0,
        hello_timeout: float = 10.0,
        telemetry: Telemetry | bool | None = None,
        redact: Redaction | None = None,
        move: bool = False,
    ) -> None:
        if not set(agents).intersection(app.names):
            raise ConfigurationError("a worker hosts at least one of the app's agents")
        self.name = (
            owner_id()
            if name is None
            else check_text(name, "worker name", MAX_WORKER_NAME, "use a shorter name")
        )
        self.run_id = run_id
        self.store = store
        self.agents = sorted(set(agents).intersection(app.names))
        self.move = move
        self.moved_out: list[str] = []
        """The agents this worker let go to another (``move``), oldest first."""
        self.lease = lease
        if nats_patience <= 0:
            raise ConfigurationError(
                f"nats_patience is a number of seconds above 0, not {nats_patience}"
            )
        self.nats_patience = nats_patience
        self.error: TransportError | None = None
        """Why the worker stopped on its own (its NATS server stayed away), if it did."""
        self.wait = wait
        self.hello_timeout = hello_timeout
        self._telemetry = telemetry
        self._redact = redact
        self._app = app
        self._link = link
        self.host = self._make_host(self.agents)
        self.rejoined = False
        """Whether the worker's agents ran before it started: the run rolled back for it."""
        self._closed: Host | None = None  # the host closed as it let all its agents go
        self._claiming = asyncio.Lock()  # a renewal never claims an agent being let go
        self._heartbeat: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._orders: Subscription | None = None
        self._applied = 0  # the generation of the latest rollback carried out here
        self._order: RollbackOrder | None = None  # carried out, not resumed yet
        self._held_until = 0.0  # loop time at which the last claim made runs out
        self._lapse: asyncio.TimerHandle | None = None  # holds delivery at _held_until
        self._sending: set[asyncio.Task[None]] = set()
        self.stopped = asyncio.Event()
        """Set when the worker stops (asked to, or its claim on the agents was lost)."""

    def _make_host(self, agents: Collection[str]) -> Host:
        """The process's bus, agents and recording for ``agents``, wired to this worker."""
        app = self._app
        hosted = {agent.name: agent for agent in app.agents if agent.name in set(agents)}
        host = Host(
            self._link,
            self.store,
            self.run_id,
            app.names,
            hosted,
            worker=self.name,
            checks={name: app.checks_of(name) for name in hosted},
            telemetry=self._telemetry,
            redaction=self._redact if self._redact is not None else app.redact,
            approvals=app.approvals,
        )
        host.report = self._report
        host.report_passed = self._passed
        host.report_lost = self._report_lost
        return host

    async def _claim(self) -> None:
        async with self._claiming:
            asked = asyncio.get_running_loop().time()
            expires = utcnow() + timedelta(seconds=self.lease)
            held = await self.store.claim_agents(self.run_id, self.name, self.agents, expires)
            if not held:
                self._renewed(asked + self.lease)
        if held:
            described = ", ".join(f"{lease.agent} by {lease.owner}" for lease in held)
            raise AgentsHeld(
                f"run {self.run_id}: agents already hosted by another live worker ({described}); "
                "stop it first, or host other agents"
            )

    async def start(self) -> None:
        """Claim the agents, learn where the run stands, then start consuming and delivering.

        Raises:
            AgentsHeld: Another live worker hosts some of the agents (beyond ``wait``).
            StoreError: The store did not answer (beyond ``wait``).
            NotFoundError: The store holds no such run.
            ConfigurationError: The run is not one of this app's, or it has ended
                ([`check_run`][agentsnap.distributed.check_run]); or, with ``move``, its
                coordinator did not answer or refused the move.
        """
        check_run(await self.store.get_run(self.run_id), self._app)
        loop = asyncio.get_running_loop()
        wait = self.wait
        if self.move:
            await self._ask_move()
            wait = max(wait, _LET_GO)
        deadline = loop.time() + wait
        asked = loop.time()
        waiting = False
        while True:
            try:
                await self._claim()
                break
            except AgentsHeld as exc:
                if loop.time() >= deadline or self.stopped.is_set():
                    raise
                if not waiting:
                    waiting = True
                    logger.warning("worker %s waits for its agents: %s", self.name, exc)
                if self.move and loop.time() - asked >= _ASK_AGAIN:
                    asked = loop.time()
                    await self._ask_let_go()
                await asyncio.sleep(min(0.2, self.lease / 5))
            except StoreError as exc:
                # The rows of the agents may be locked by a worker cut off in the middle of
                # a transaction, until the server ends its session: wait for that too.
                if loop.time() >= deadline or self.stopped.is_set():
                    raise
                logger.warning("worker %s could not claim its agents yet: %s", self.name, exc)
                await asyncio.sleep(min(1.0, self.lease / 5))
        self._heartbeat = loop.create_task(
            self._renew(), name=f"agentsnap:worker-lease:{self.name}"
        )
        self._watchdog = loop.create_task(
            self._watch_link(), name=f"agentsnap:worker-link:{self.name}"
        )
        self._orders = await self._link.nc.subscribe(
            broadcast_subject(self.run_id), cb=self._on_order
        )
        await self._join(self.host)
        logger.info("worker %s hosts %s of run %s", self.name, ", ".join(self.agents), self.run_id)

    async def _join(self, host: Host) -> None:
        """Learn where the run stands from its coordinator, then start ``host``."""
        answer = await self._hello()
        positions: dict[str, int] | None = None
        if answer is not None:
            generation = int(answer.get("generation", 0))
            epoch = int(answer.get("epoch", 0))
            host.transport.generation = max(host.transport.generation, generation)
            host.enter_timeline(int(answer.get("timeline", generation)))
            if self._applied <= generation and host.coordinator.last_seq < epoch:
                # Snapshots begun before this worker started are not recorded here.
                host.coordinator.last_seq = epoch
                for name in self.agents:
                    host.bus.endpoints[name].epoch = epoch
                for channel in host.bus.channels.values():
                    if channel.dst in host.local:
                        channel.closed = max(channel.closed, epoch)
            self._applied = max(self._applied, generation)
            if answer.get("restore"):
                # The agents ran before: nothing is delivered until the coordinator's
                # rollback restored them. Everything in the stream so far is of an older
                # generation than the rollback's, and would be dropped.
                self.rejoined = True
                host.scheduler.pause()
                start = await self._link.last_sequence(self.run_id) + 1
                positions = dict.fromkeys(self.agents, start)
        await host.start(positions)

    async def _ask_move(self) -> None:
        """Have the run's coordinator tell the workers hosting this one's agents to let go.

        Raises:
            ConfigurationError: The coordinator did not answer, or refused the move.
        """
        body = orjson.dumps({"move": self.name, "agents": self.agents})
        try:
            reply = await self._link.nc.request(
                control_subject(self.run_id), body, timeout=self.hello_timeout + _MOVE_CUT
            )
            answer = orjson.loads(reply.data)
        except Exception as exc:
            raise ConfigurationError(
                f"worker {self.name}: the coordinator of run {self.run_id} did not answer the "
                f"move of {', '.join(self.agents)} ({exc!r}); a move needs the run's "
                "coordinator running: start it (or a takeover), then the worker again"
            ) from exc
        if not isinstance(answer, dict) or "error" in answer:
            why = answer.get("error") if isinstance(answer, dict) else answer
            raise ConfigurationError(f"worker {self.name}: the move was refused: {why}")
        logger.warning(
            "worker %s: moving %s here at snapshot %s",
            self.name,
            ", ".join(self.agents),
            answer.get("snapshot"),
        )

    async def _ask_let_go(self) -> None:
        """Ask the run's coordinator to send its order to let this worker's agents go again.

        The order travels on plain NATS, which may lose it: the worker asks again as long as
        the agents are held, and a worker carries the order out once (an agent it no longer
        hosts is not let go twice).
        """
        body = orjson.dumps({"let_go": self.agents, "to": self.name})
        try:
            await self._link.nc.publish(control_subject(self.run_id), body)
        except Exception as exc:  # asked again at the next look
            logger.warning("worker %s: the let-go was not asked again: %r", self.name, exc)

    async def _let_go(self, names: Collection[str], to: str) -> None:
        """Stop hosting ``names`` (another worker takes them), going on with the others."""
        gone = sorted(set(names).intersection(self.agents))
        if not gone or to == self.name:
            return
        keep = [name for name in self.agents if name not in gone]
        logger.warning(
            "worker %s lets %s go to worker %s%s",
            self.name,
            ", ".join(gone),
            to,
            f"; it goes on with {', '.join(keep)}" if keep else "; it hosts nothing more",
        )
        async with self._claiming:
            self.agents = keep
        await self.host.close()
        self._closed = self.host
        self.moved_out.extend(gone)
        try:
            # Ends the claim on the agents let go alone: the others stay claimed.
            await self.store.claim_agents(self.run_id, self.name, gone, utcnow())
        except Exception as exc:  # they expire by themselves
            logger.warning("worker %s: %s not let go at once: %r", self.name, gone, exc)
        if not keep:
            self.stop()
            return
        # The agents kept go back to the cut with the others once the new worker started.
        self.host = self._make_host(keep)
        if self._lapse is None:  # the claim ran out unrenewed: the new host waits as well
            self.host.scheduler.hold(_LAPSED)
        await self._join(self.host)

    async def _hello(self) -> dict[str, Any] | None:
        body = orjson.dumps({"hello": self.name, "agents": self.agents})
        try:
            reply = await self._link.nc.request(
                control_subject(self.run_id), body, timeout=self.hello_timeout
            )
            answer = orjson.loads(reply.data)
        except Exception as exc:  # no coordinator (yet): start as in a new run
            logger.warning(
                "worker %s: the coordinator of run %s did not answer (%r); starting as in a "
                "new run",
                self.name,
                self.run_id,
                exc,
            )
            return None
        return answer if isinstance(answer, dict) else None

    # -- rollbacks --------------------------------------------------------------------------

    def _send(self, body: dict[str, object]) -> None:
        async def send() -> None:
            try:
                await self._link.nc.publish(control_subject(self.run_id), orjson.dumps(body))
            except Exception as exc:
                logger.warning("worker %s: not told to the coordinator: %r", self.name, exc)

        task = asyncio.ensure_future(send())
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    def _report(self, rejection: OutputRejected, handling: Message | None, generation: int) -> None:
        self._send(
            {
                "rejected": rejection_to_json(rejection, handling),
                "generation": generation,
                "worker": self.name,
            }
        )

    def _report_lost(self, agent: str, handling: Message, reason: str, generation: int) -> None:
        self._send(
            {
                "lost": reason,
                "agent": agent,
                "handling": [handling.src, handling.dst, handling.seq],
                "generation": generation,
                "worker": self.name,
            }
        )

    def _passed(self, key: tuple[str, str, int]) -> None:
        self._send({"passed": list(key), "worker": self.name})

    async def _on_order(self, msg: Msg) -> None:
        # The client calls this for one order after the other: a rollback is carried out
        # before the resume that follows it is read.
        try:
            body = orjson.loads(msg.data)
            if "rollback" in body:
                await self._roll_back(RollbackOrder.from_json(body["rollback"]))
            elif "resume" in body:
                order = self._order
                if order is not None and int(body["resume"]) == order.generation:
                    self._order = None
                    if body.get("snapshot_id"):  # the run's start, stored as it went back
                        order = replace(order, snapshot_id=str(body["snapshot_id"]))
                    await self.host.resume(order, int(body.get("epoch", 0)))
            elif "let_go" in body:
                await self._let_go([str(n) for n in body["let_go"]], str(body.get("to")))
            elif "stop" in body:
                # A cancel is asked for; a retry policy that gave up is a failure.
                level = logging.WARNING if body.get("cancelled") else logging.ERROR
                logger.log(level, "worker %s: the run stopped: %s", self.name, body["stop"])
                self.host.stop(str(body["stop"]))
                self.stop()
        except Exception:
            logger.exception("worker %s: an order of the coordinator failed", self.name)

    async def _roll_back(self, order: RollbackOrder) -> None:
        if order.generation < self._applied or (
            order.generation == self._applied and self._order is None
        ):
            return  # older, or carried out and resumed already
        discarded = 0
        if order.generation > self._applied or self._order is None:
            snapshot = None
            offsets = []
            if order.snapshot_id is not None:
                snapshot = await self.store.load_snapshot(order.snapshot_id)
                parts = await self.store.load_snapshot_parts(self.run_id, snapshot.seq)
                offsets = [o for part in parts for o in part.offsets]
            if not await self._still_hosting():
                return  # replaced while away: its agents run elsewhere
            discarded = await self.host.roll_back(order, snapshot, offsets)
            self._applied = order.generation
            self._order = order
        self._send(
            {
                "restored": order.generation,
                "epoch": self.host.coordinator.last_seq,
                "worker": self.name,
                "agents": self.agents,
                "discarded": discarded,
                "replayed": self.host.replayed,
                "put_back": self.host.put_back,
            }
        )

    def _renewed(self, until: float) -> None:
        """The claim holds until loop time ``until``: deliver until then, and after it only
        once it is renewed.

        A worker whose claim ran out without renewal (the store does not answer) may be
        replaced by another at any moment: it starts no delivery until it renews the claim,
        or learns that another worker took its agents and stops.
        """  # noqa: D205
        self._held_until = until
        if self._lapse is not None:
            self._lapse.cancel()
        self._lapse = asyncio.get_running_loop().call_at(until, self._lapsed)
        scheduler = self.host.scheduler
        if _LAPSED in scheduler.held():
            logger.warning("worker %s renewed its claim: it delivers again", self.name)
            scheduler.release(_LAPSED)

    def _lapsed(self) -> None:
        self._lapse = None
        logger.warning(
            "worker %s: the claim on %s ran out without renewal; it delivers nothing until "
            "the store answers",
            self.name,
            ", ".join(self.agents),
        )
        self.host.scheduler.hold(_LAPSED)

    async def _still_hosting(self) -> bool:
        """Whether the claim on the agents is still this worker's, renewed now.

        A worker cut off from the store past its lease may have been replaced meanwhile: the
        rollback its replacement's start ordered reaches it too, once the store answers
        again, and restoring its agents then would run them in two places. It stops instead.
        While the store does not answer, the claim is taken for held until its lease ran out
        since the last renewal; after that, the store is asked until it answers.
        """
        loop = asyncio.get_running_loop()
        while not self.stopped.is_set():
            try:
                await self._claim()
            except AgentsHeld as exc:
                self._lost_agents(exc)
                return False
            except Exception as exc:
                if loop.time() < self._held_until:
                    return True  # the claim holds a while yet
                logger.warning("worker %s could not renew its claim: %r", self.name, exc)
                await asyncio.sleep(min(1.0, self.lease / 5))
            else:
                return True
        return False

    def _lost_agents(self, exc: AgentsHeld) -> None:
        """Another worker holds the agents now: deliver nothing more, and stop."""
        logger.error("worker %s lost its agents: %s", self.name, exc)
        self.host.scheduler.pause()
        self.stopped.set()

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                await self._claim()
            except AgentsHeld as exc:
                self._lost_agents(exc)
                return
            except Exception as exc:  # the store is away: the claim holds a while yet
                logger.warning("worker %s could not renew its claim: %r", self.name, exc)

    async def _watch_link(self) -> None:
        link = self._link
        while not self.stopped.is_set():
            await asyncio.sleep(min(1.0, self.nats_patience / 4))
            away = link.away_for()
            if away > self.nats_patience:
                self.error = TransportError(
                    f"worker {self.name} gave up: the NATS server at {link.url} has been "
                    f"unreachable for {away:.0f} s (more than --nats-patience "
                    f"{self.nats_patience:g}); start it again, then start the worker again"
                )
                logger.error("%s", self.error)
                self.stopped.set()
                return

    async def request_snapshot(self) -> None:
        """Ask the run's coordinator to begin a snapshot (it numbers every snapshot)."""
        body = orjson.dumps({"snapshot": self.name})
        await self._link.nc.publish(control_subject(self.run_id), body)

    def stop(self) -> None:
        """Have [`run`][agentsnap.distributed.Worker.run] return (a signal handler calls it)."""
        self.stopped.set()

    async def run(self) -> None:
        """Start, serve until ``stop()``, and close.

        Raises:
            TransportError: The worker gave up on its NATS server.
        """
        await self.start()
        try:
            await self.stopped.wait()
        finally:
            await self.close()
        if self.error is not None:
            raise self.error

    async def close(self) -> None:
        """Stop delivering, let the snapshots in progress fail here, release the agents."""
        if self._lapse is not None:
            self._lapse.cancel()
            self._lapse = None
        for task in (self._heartbeat, self._watchdog):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._heartbeat = self._watchdog = None
        if self._orders is not None:
            with contextlib.suppress(Exception):
                await self._orders.unsubscribe()
            self._orders = None
        # A server that is away takes nothing: do not wait for it to confirm what is queued.
        if self.host is not self._closed:
            await self.host.close(drain=0.0 if self.error is not None else 10.0)
        await asyncio.gather(*self._sending, return_exceptions=True)
        try:
            await self.store.release_agents(self.run_id, self.name)
        except Exception as exc:  # they expire by themselves
            logger.warning("worker %s: agents not released: %r", self.name, exc)
