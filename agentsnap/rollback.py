"""Validation and rollback: a rejected output takes every agent back to the last consistent cut.

Outputs are checked three ways, all declared per agent (and per message kind):

* a **schema**: a pydantic model the payload must fit,
* a **check**: a callable that looks at the message and passes or fails it with a reason,
* **self-evaluation**: the agent's own [`evaluate`][agentsnap.Agent.evaluate], which sees
  every message a handler sent once the handler returns,

and a critic agent can reject another agent's output with
[`ctx.reject`][agentsnap.Context.reject]. Each raises
[`OutputRejected`][agentsnap.OutputRejected], and the runtime then:

1. pauses the bus and cancels the handlers under way, whose work the rollback throws away
   (one inside a side-effecting tool call first lets the call finish and its outcome be
   recorded), and waits until none runs;
2. fails the snapshots still in progress and waits for the completed ones to be written;
3. picks the last complete snapshot whose cut comes before the rejected output: one its
   author recorded before sending it (an output in flight in a cut was sent before that
   cut). After a resume, the complete snapshots of the run's timeline stored before the cut
   it resumed from count too;
4. checks the retry policy: when this agent's output has failed this way too often, the run
   stops with [`RollbackExhausted`][agentsnap.RollbackExhausted]; otherwise it waits as the
   policy says;
5. empties every channel, restores every agent's state and every channel's counters from the
   cut, puts the cut's in-flight messages back with their original ids, and replays the
   environment's input sent after the cut;
6. records the rollback in the store, gives the reason to the agent as feedback, calls every
   agent's [`on_rollback`][agentsnap.Agent.on_rollback], and resumes the bus.

Example:
    ```python
    from pydantic import BaseModel

    from agentsnap import Runtime
    from agentsnap.rollback import RetryPolicy

    class Draft(BaseModel):
        title: str
        body: str

    runtime = Runtime(retry=RetryPolicy.attempts(3))
    runtime.check("writer", kind="draft", schema=Draft)
    runtime.check(
        "writer",
        kind="draft",
        check=lambda message: len(message.payload["body"]) > 20 or "the draft is too short",
        name="length",
    )
    ```
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import tenacity

from agentsnap.exceptions import (
    ConfigurationError,
    RollbackExhausted,
    SnapshotDamaged,
)
from agentsnap.messages import ENVIRONMENT, Message
from agentsnap.records import ChannelRecord, RollbackInfo, Snapshot, SnapshotStatus
from agentsnap.redaction import MARKED as _MARKED
from agentsnap.redaction import Redaction, find_markers, unredact
from agentsnap.state import HasState
from agentsnap.versions import read_state

if TYPE_CHECKING:
    from agentsnap.bus import Bus
    from agentsnap.replay import InputLog

__all__ = [
    "RetryBudget",
    "RetryPolicy",
    "current_cut",
    "earlier_targets",
    "recorded_messages",
    "restore_cut",
]

logger = logging.getLogger("agentsnap.rollback")


@dataclass(frozen=True)
class RetryPolicy:
    """How often a rejected output may be retried by rolling back, and how long to wait.

    The budget is **per rejected output**: an agent, what rejected its output (a check, the
    schema, its self-evaluation, a critic), and the message it was handling when the output
    was rejected (an *episode*). Each rollback redoes that message; once it is handled
    without a rejection, the output passed and its episode ends, so the next rejected output
    starts with the whole budget again. A long run can thus have any number of unrelated
    rejections, while one output that keeps failing stops the run. ``per_run`` optionally
    bounds the rollbacks of the whole run as well.

    ``stop`` and ``wait`` are tenacity strategies, applied per episode: ``stop`` sees the
    number of failures of that output so far as the attempt number, ``wait`` gives the pause
    before the run resumes.

    Attributes:
        stop: When to give up on one output (default: after 3 failed attempts, that is 2
            rollbacks for it).
        wait: Pause before resuming (default: none).
        per_run: At most this many rollbacks for rejected outputs in the whole run
            (``None``, the default: no bound but the one per output). The rejection that
            would need one more stops the run with
            [`RollbackExhausted`][agentsnap.RollbackExhausted].
    """

    stop: Any = field(default_factory=lambda: tenacity.stop_after_attempt(3))
    wait: Any = field(default_factory=tenacity.wait_none)
    per_run: int | None = None

    def __post_init__(self) -> None:
        """Refuse a run budget below zero.

        Raises:
            ConfigurationError: ``per_run`` is negative.
        """
        if self.per_run is not None and self.per_run < 0:
            raise ConfigurationError(
                f"RetryPolicy(per_run={self.per_run}) must be 0 or more rollbacks (or None for "
                "no bound on the whole run)"
            )

    @classmethod
    def attempts(cls, count: int, *, wait: Any = None, per_run: int | None = None) -> RetryPolicy:
        """Allow ``count`` attempts per rejected output (``count - 1`` rollbacks for it).

        Raises:
            ConfigurationError: ``count`` is below 1, or ``per_run`` below 0.
        """
        if count < 1:
            raise ConfigurationError("a retry policy needs at least 1 attempt")
        return cls(
            stop=tenacity.stop_after_attempt(count),
            wait=wait or tenacity.wait_none(),
            per_run=per_run,
        )


Episode = tuple[str, str, tuple[str, str, int] | None]
"""The rejected agent, what rejected its output, and the message being handled (``src``,
``dst``, ``seq``) when it was rejected, if any."""


class _Site:
    """Failures of one rejected output (an episode), for the retry policy."""

    def __init__(self) -> None:
        self.state = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        self.reasons: list[str] = []

    def failed(self, reason: str) -> int:
        self.reasons.append(reason)
        self.state.attempt_number = len(self.reasons)
        self.state.outcome_timestamp = time.monotonic()
        return len(self.reasons)


class RetryBudget:
    """The retry policy's accounts: failures per rejected output (episode), rollbacks per run.

    One authority keeps them: a runtime's recovery, or the coordinator of a run spread over
    processes.

    Args:
        policy: The retry policy.
    """

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self._episodes: dict[Episode, _Site] = {}
        self.open: dict[tuple[str, str, int], list[Episode]] = {}
        """The episodes under way, by the message whose handling ends them once it passes."""
        self.rejections = 0
        """Rollbacks spent on rejected outputs, for the per-run budget."""

    def spend(
        self, agent: str, source: str, reason: str, handled: tuple[str, str, int] | None
    ) -> tuple[int, RollbackExhausted | None, float]:
        """Count one more failure of an output.

        Returns:
            The attempt this failure was, the error that stops the run when the policy gives
            up (``None``: roll back), and the seconds to wait before resuming.
        """
        episode: Episode = (agent, source, handled)
        site = self._episodes.setdefault(episode, _Site())
        attempt = site.failed(reason)
        per_run = self.policy.per_run
        gave_up = bool(self.policy.stop(site.state))
        if gave_up or (per_run is not None and self.rejections >= per_run):
            return (
                attempt,
                RollbackExhausted(
                    agent, source, attempt, list(site.reasons),
                    per_run=None if gave_up else per_run,
                ),
                0.0,
            )  # fmt: skip
        self.rejections += 1
        if handled is not None:
            waiting = self.open.setdefault(handled, [])
            if episode not in waiting:
                waiting.append(episode)
        return attempt, None, float(self.policy.wait(site.state))

    def passed(self, handled: tuple[str, str, int]) -> bool:
        """The message ``handled`` (``src``, ``dst``, ``seq``) was handled without a rejection:
        the episodes it was redoing end. Returns whether any did.
        """  # noqa: D205
        ended = self.open.pop(handled, ())
        for episode in ended:
            self._episodes.pop(episode, None)
        return bool(ended)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Keep the cycle collector out of the way.

    Restoring parses every state, allocating many objects at once; the collector would walk
    them over and over while nothing here makes cycles.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def recorded_messages(record: ChannelRecord) -> list[Message]:
    """The messages a cut recorded in flight on a channel, as they were sent."""
    return [
        Message(
            record.src,
            record.dst,
            kept.seq,
            kept.kind,
            kept.payload,
            MappingProxyType(dict(kept.headers)),
            kept.epoch,
        )
        for kept in record.messages
    ]


@_collector_paused()
def restore_cut(
    bus: Bus,
    agents: Mapping[str, HasState],
    snapshot: Snapshot,
    *,
    initial_states: Mapping[str, str],
    epoch: int,
    replay: InputLog | None,
    local: Collection[str] | None = None,
    redaction: Redaction | None = None,
) -> int:
    """Put every agent and channel back on ``snapshot``'s cut; return the messages dropped.

    Agents registered after the cut get back the state they were registered with. The
    environment's messages sent after the cut (``replay``) are put back after the cut's
    in-flight messages, as a source is replayed after a restore.

    In one process of a run spread over processes, ``local`` names the processes hosted
    there: ``agents`` are those of them, only the channels into them get their messages in
    flight back, and the cut may name processes hosted elsewhere.

    A cut read back from the store may hold redaction markers (see
    [`agentsnap.redaction`][agentsnap.redaction]): ``redaction``'s ``secret`` provider gives
    their values back; a marker it cannot give stops the restore before anything changed.
    A state stored with an older version of its agent's state class is read through the
    class's upcasters (see [`agentsnap.versions`][agentsnap.versions]).

    Raises:
        ConfigurationError: The snapshot names a process that is not registered.
        RedactedValueNeeded: A state or a message needs a value stored redacted.
        StateNotReadable: A stored state cannot be read by its agent's state class as the
            code declares it now; no agent and no channel was changed.
    """
    for name in snapshot.agents:
        if local is None and name != ENVIRONMENT and name not in agents:
            raise ConfigurationError(
                f"snapshot {snapshot.id} holds agent {name!r}, which is not registered; "
                "register the same agents as the run that took it"
            )
    # Every state is read before any is replaced: a state the code cannot read (see
    # agentsnap.versions), or a redacted value nobody gives back, leaves every agent as it
    # was.
    doing = f"go back to snapshot {snapshot.seq} of run {snapshot.run_id}"
    states = {}
    for name, agent in agents.items():
        cut = snapshot.agents.get(name)
        if cut is None:  # registered after the cut: its initial state, of the current class
            states[name] = agent.state_type.model_validate_json(initial_states[name])
            continue
        text = cut.state_json
        if _MARKED in text:
            value = unredact(json.loads(text), "state", name, redaction, doing=doing)
            text = json.dumps(value)
        states[name] = read_state(name, agent.state_type, text, cut.state_version)
    environment = snapshot.agents.get(ENVIRONMENT)
    in_flight = [
        recorded_messages(record)
        for record in snapshot.channels
        if local is None or record.dst in local
    ]
    # The environment's messages sent after the cut, as a source is replayed.
    inputs: dict[str, list[Message]] = {}
    if replay is not None:
        for sent in replay.after(environment.sent if environment is not None else {}):
            inputs.setdefault(sent.dst, []).append(sent)
    in_flight.extend(inputs.values())
    for messages in in_flight:
        for i, m in enumerate(messages):
            if find_markers(m.payload):
                payload = unredact(m.payload, "payload", m.dst, redaction, doing=doing)
                messages[i] = m._replace(payload=payload)
    for name, agent in agents.items():
        agent.state = states[name]
    return bus.restore(
        epoch, {name: (cut.sent, cut.received) for name, cut in snapshot.agents.items()}, in_flight
    )


def current_cut(snapshots: list[Snapshot], rollbacks: list[RollbackInfo]) -> Snapshot | None:
    """The cut a run stands on: where its latest rollback went, or a snapshot taken since.

    Snapshots that completed before the latest rollback belong to a timeline the run left
    (the rollback's own target excepted). A snapshot found damaged in the store is passed
    over like a failed one, with a warning: the newest intact snapshot of the timeline is
    the cut.

    Raises:
        SnapshotDamaged: The timeline's snapshots are all damaged: there is no cut to stand
            on (starting again from the registered states would lose what the run did).
    """
    cuts = [
        s
        for s in snapshots
        if s.status in {SnapshotStatus.COMPLETE, SnapshotStatus.DAMAGED}
        and s.completed_at is not None
    ]
    if rollbacks:
        last = max(rollbacks, key=lambda r: r.at)
        cuts = [
            s
            for s in cuts
            if s.id == last.snapshot_id or (s.completed_at is not None and s.completed_at > last.at)
        ]
    newest = max(cuts, key=lambda s: s.seq, default=None)
    intact = max(
        (s for s in cuts if s.status is SnapshotStatus.COMPLETE), key=lambda s: s.seq, default=None
    )
    if newest is not None and newest is not intact:
        if intact is None:
            raise SnapshotDamaged(
                newest.id,
                newest.error or "damaged",
                f"run {newest.run_id} cannot go back to it, and no intact snapshot is left in "
                "its timeline",
            )
        logger.warning(
            "snapshot %d (%s) is damaged in the store (%s); the run goes back to snapshot %d",
            newest.seq,
            newest.id,
            newest.error,
            intact.seq,
        )
    return intact


def earlier_targets(
    snapshots: list[Snapshot], rollbacks: list[RollbackInfo], cut: Snapshot
) -> list[Snapshot]:
    """The complete snapshots of ``cut``'s timeline numbered before it, newest first.

    A run resumed from ``cut`` can roll back to them as the runtime that took them could: a
    rejected output that was in flight in ``cut`` (sent before it) is redone from the newest
    of them that precedes it. A snapshot belongs to the timeline unless a rollback made after
    it completed went back to an older snapshot (one whose target is not in ``snapshots``
    is taken to have).
    """
    seqs = {s.id: s.seq for s in snapshots}
    earlier = []
    for snapshot in snapshots:
        done = snapshot.completed_at
        if snapshot.status is not SnapshotStatus.COMPLETE or done is None:
            continue
        if snapshot.seq >= cut.seq:
            continue
        if any(
            rollback.at > done and seqs.get(rollback.snapshot_id, 0) < snapshot.seq
            for rollback in rollbacks
        ):
            continue  # left behind by that rollback
        earlier.append(snapshot)
    return sorted(earlier, key=lambda s: s.seq, reverse=True)
