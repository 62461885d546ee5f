"""Where a runtime is in its life: the phase machine, and how a run gives up."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING

from agentsnap.exceptions import RuntimeClosedError
from agentsnap.records import RunStatus

if TYPE_CHECKING:
    from agentsnap.bus import Scheduler
    from agentsnap.snapshot import SnapshotCoordinator

__all__ = [
    "ENDED",
    "MOVES",
    "NOT_STARTED",
    "TAKING_INPUT",
    "WITHOUT_CUT",
    "Phase",
    "Phases",
    "one_line",
]


class Phase(enum.Enum):
    """Where a runtime is in its life; it moves only as ``MOVES`` allows."""

    NEW = "new"
    """Created: agents and checks are added; nothing started, no input yet."""
    PRIMED = "primed"
    """Input was sent before ``start()``: the run has its first cut, and waits to start."""
    STARTED = "started"
    """Started, and waiting for its first input, ``resume()`` or ``fork_from()``."""
    RESTORING = "restoring"
    """``resume()`` or ``fork_from()`` puts the run on its cut."""
    RUNNING = "running"
    """Started, with its first cut: input is taken and delivered."""
    STOPPED = "stopped"
    """The run gave up (its retry policy, or another runtime took it over): nothing more is
    delivered, sent or snapshotted; only closing is left."""
    CLOSING = "closing"
    """``close()`` is under way."""
    CLOSED = "closed"
    """Closed: nothing more can be done with it."""


MOVES: Mapping[Phase, frozenset[Phase]] = {
    Phase.NEW: frozenset({Phase.PRIMED, Phase.STARTED, Phase.STOPPED, Phase.CLOSING}),
    Phase.PRIMED: frozenset({Phase.RUNNING, Phase.STOPPED, Phase.CLOSING}),
    Phase.STARTED: frozenset({Phase.RUNNING, Phase.RESTORING, Phase.STOPPED, Phase.CLOSING}),
    # A restore that failed leaves the runtime as it found it: started, without a cut.
    Phase.RESTORING: frozenset({Phase.RUNNING, Phase.STARTED, Phase.STOPPED, Phase.CLOSING}),
    Phase.RUNNING: frozenset({Phase.STOPPED, Phase.CLOSING}),
    Phase.STOPPED: frozenset({Phase.CLOSING}),
    Phase.CLOSING: frozenset({Phase.CLOSED}),
    Phase.CLOSED: frozenset(),
}
"""The moves each phase allows."""

NOT_STARTED = frozenset({Phase.NEW, Phase.PRIMED})
WITHOUT_CUT = frozenset({Phase.NEW, Phase.STARTED, Phase.RESTORING})
"""The run has no cut yet: no input taken, not resumed or forked."""
TAKING_INPUT = frozenset({Phase.PRIMED, Phase.RUNNING})
"""Input is sent on the fast path, without the checks of the first input."""
ENDED = frozenset({Phase.CLOSING, Phase.CLOSED})


def one_line(error: BaseException) -> str:
    """``error`` as one line: its type, and the first line of its message."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


class Phases:
    """A runtime's phase, the one place it changes, and how the run gives up.

    Args:
        scheduler: The bus's scheduler, paused for good when the run stops.

    Attributes:
        coordinator: The snapshot coordinator, whose snapshots fail when the run stops (set
            once it is built: it writes through the run's record, which needs the phases).
        now: The phase the runtime is in.
        taking_input: Whether ``now`` takes input on the fast path (``TAKING_INPUT``).
        stopped_because: Why the run gave up, in one line (``None``: it did not).
        stopped_by: The exception the run gave up for, when there was one.
        status_on_close: The status the run gets when it closes, when giving up decided it.
    """

    __slots__ = (
        "_scheduler",
        "coordinator",
        "now",
        "status_on_close",
        "stopped_because",
        "stopped_by",
        "taking_input",
    )

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self.coordinator: SnapshotCoordinator | None = None
        self.now = Phase.NEW
        self.taking_input = False
        self.stopped_because: str | None = None
        self.stopped_by: BaseException | None = None
        self.status_on_close: RunStatus | None = None

    def enter(self, phase: Phase) -> None:
        """Move to ``phase``: the one place the phase changes."""
        assert phase in MOVES[self.now], f"a runtime cannot go from {self.now} to {phase}"
        self.now = phase
        self.taking_input = phase in TAKING_INPUT

    @property
    def closed(self) -> bool:
        """Closing or closed: nothing more is handled."""
        return self.now in ENDED

    def check_open(self) -> None:
        """Refuse to act on a closed runtime.

        Raises:
            RuntimeClosedError: The runtime is closing or closed.
        """
        if self.now in ENDED:
            raise RuntimeClosedError("this runtime is closed; create a new Runtime to go on")

    def stop(self, reason: BaseException | None, status: RunStatus = RunStatus.FAILED) -> None:
        """The run gave up (or was cancelled, ``status``): nothing is delivered, sent or
        snapshotted any more.
        """  # noqa: D205
        self.status_on_close = status
        if reason is not None and self.stopped_because is None:
            self.stopped_because = one_line(reason)
            self.stopped_by = reason
        if Phase.STOPPED in MOVES[self.now]:  # not while closing
            self.enter(Phase.STOPPED)
        self._scheduler.pause()
        self._scheduler.reset()
        coordinator = self.coordinator
        if coordinator is not None:
            coordinator.suspended = f"the run stopped: {reason}"
            coordinator.abort_all(coordinator.suspended)
