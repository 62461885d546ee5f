"""Following the replay plan: a resumed run's agents take their messages in the order they
took them before the run stopped, and the replay log is written as the run goes.
"""  # noqa: D205

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from agentsnap.messages import ENVIRONMENT

if TYPE_CHECKING:
    from collections.abc import Callable

    from agentsnap._team import Team
    from agentsnap.bus import Bus, Channel, Endpoint
    from agentsnap.messages import Message
    from agentsnap.replay import ReplayLog, ReplayPlan

__all__ = ["Following"]

logger = logging.getLogger("agentsnap")

REPLAY_HOLDS = 4096  # deliveries (or inputs) the replay log holds before it writes them
_REPLAY_WATCH_SECONDS = 0.25


class Following:
    """Writes a run's replay log as it goes, and has a resumed run follow its plans.

    While the plans last, the team shows this each delivery (it is the team's
    `Follower`) instead of appending it to the log at once.

    In one process, a plan that cannot go on is given up at once: no message it waits for
    can come, and the run starts a new timeline. In a run spread over processes, what a plan
    waits for may still come from another process: a stall is given up only when no plan
    took a step for ``patience`` seconds, and the run stays on its timeline (its coordinator
    numbers the timelines; a handler then redone on it gets the answers recorded for its
    message, as it would had the order been repeated).

    Args:
        run_id: The run.
        bus: The bus.
        team: The team whose deliveries are followed.
        replay: The replay log.
        patience: Seconds a stall may last before the plans are given up (``None``: one
            process, given up at once).
        wake: Has every process look at its items again (after plans given up late).
    """

    def __init__(
        self,
        run_id: str,
        bus: Bus,
        team: Team,
        replay: ReplayLog,
        *,
        patience: float | None = None,
        wake: Callable[[], None] | None = None,
    ) -> None:
        self._run_id = run_id
        self._bus = bus
        self._team = team
        self._replay = replay
        self._watch: asyncio.TimerHandle | None = None
        self.patience = patience
        self._wake = wake
        self._stall: asyncio.TimerHandle | None = None
        self.steps = 0
        """Deliveries made as a plan named them."""
        self._steps_at_stall = 0
        bus.replay_stalled = self.stalled

    def watch(self) -> None:
        """Write the replay log in the background whenever it holds many deliveries.

        Checked a few times a second rather than on every delivery, which would cost the bus
        a few per cent; at any rate the log is written before each side-effecting call.
        """
        replay = self._replay
        if len(replay.deliveries) >= REPLAY_HOLDS:
            replay.flush_soon()
        self._watch = asyncio.get_running_loop().call_later(_REPLAY_WATCH_SECONDS, self.watch)

    def unwatch(self) -> None:
        """Stop writing the log in the background."""
        if self._watch is not None:
            self._watch.cancel()

    def follow(self, plan: ReplayPlan) -> None:
        """Have each agent take the messages ``plan`` names first, in order."""
        for name, steps in plan.order.items():
            endpoint = self._bus.endpoints.get(name)
            if endpoint is not None and name != ENVIRONMENT:
                endpoint.replay = steps
        if self._bus.replaying():
            self._team.follower = self
            self._team.delivered = None
        replay = self._replay
        replay.timeline = replay.resumed = replay.written = plan.timeline

    def stop(self) -> None:
        """Drop the plans (a rollback comes): deliveries are logged on the fast path again."""
        self._bus.abandon_replay()
        self._done()

    def stalled(self) -> None:
        """Every agent waits for a message its replay plan names, and none can come here."""
        if self.patience is None:
            self._give_up()
        elif self._stall is None:
            self._steps_at_stall = self.steps
            self._stall = asyncio.get_running_loop().call_later(self.patience, self._waited)

    def _waited(self) -> None:
        """``patience`` seconds after a stall: give the plans up unless one took a step
        meanwhile, or a handler runs here (it may send what a plan waits for).
        """  # noqa: D205
        self._stall = None
        if not self._bus.replaying():
            return
        endpoints = self._bus.endpoints
        busy = any(endpoints[name].busy for name in self._team.agents if name in endpoints)
        if busy or self.steps != self._steps_at_stall:  # not stuck: look again later
            self._steps_at_stall = self.steps
            self._stall = asyncio.get_running_loop().call_later(self.patience or 0.0, self._waited)
            return
        self._give_up()
        if self._wake is not None:
            self._wake()

    def _give_up(self) -> None:
        if self.patience is not None:
            logger.warning(
                "run %s: for %g s no agent here could take the message its replay plan names "
                "next (another process took its messages in another order, or did not send "
                "the same ones again); the agents here go on in any order",
                self._run_id,
                self.patience,
            )
            self._bus.abandon_replay()
            self._done()
            return
        logger.warning(
            "run %s: the resumed run could not repeat the order in which its agents took their "
            "messages before it stopped (a handler that is not deterministic, or input that "
            "was not restored); it goes on in any order, and calls of side-effecting tools "
            "without an explicit key= may run again under new keys",
            self._run_id,
        )
        self._bus.abandon_replay()
        self._done()
        self._replay.new_timeline()

    def replayed(self, endpoint: Endpoint, channel: Channel, message: Message) -> None:
        """``endpoint`` took ``message`` while the run replays what it did before it stopped."""
        plan = endpoint.replay
        if plan:
            if plan[0][0] == message.src and plan[0][1] == message.seq:
                plan.popleft()  # logged before the stop already
                self.steps += 1
                if not plan and not self._bus.replaying():
                    self._done()
                return
            self._diverged(endpoint.name, plan[0], message)
        elif not self._bus.replaying():  # pragma: no cover - the plans ended elsewhere
            self._done()
        self._replay.deliveries.append(channel)

    def _done(self) -> None:
        """Every plan is done: deliveries are logged on the fast path again."""
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        self._team.follower = None
        self._team.delivered = self._replay.deliveries

    def _diverged(self, agent: str, planned: tuple[str, int], message: Message) -> None:
        logger.warning(
            "run %s: agent %r took %s, but before the run stopped it took %s>%s#%d next; the "
            "replay is abandoned",
            self._run_id,
            agent,
            message.id,
            planned[0],
            agent,
            planned[1],
        )
        if self.patience is None:
            self.stalled()
        else:
            self._give_up()
