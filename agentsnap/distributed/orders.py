"""What the processes of a run spread over processes tell each other about rollbacks, and where.

Every message is JSON on plain NATS (not stored in the run's stream). A worker tells the
run's coordinator on the run's control subject
([`control_subject`][agentsnap.distributed.control_subject]):

| message | meaning |
|---|---|
| ``{"rejected": {...}, "generation": g, "worker": w}`` | an output of an agent hosted by ``w`` was rejected in generation ``g`` |
| ``{"restored": g, "epoch": n, "worker": w, "agents": [...], "discarded": d}`` | ``w`` carried out rollback ``g`` (its agents are restored); ``n``: the newest snapshot number it saw |
| ``{"passed": [src, dst, seq], "worker": w}`` | a message redone after a rejection was handled without one |
| ``{"move": w, "agents": [...]}`` (a request) | ``w`` takes these agents from the workers hosting them: the coordinator takes a snapshot, tells every worker to let them go, and replies ``{"moving": [...], "snapshot": k}`` (or ``{"error": why}``) |
| ``{"let_go": [...], "to": w}`` | ``w``, moving these agents to itself, finds them still held: the coordinator orders the latest move of them again |
| ``{"hello": w, "agents": [...]}`` (a request) | ``w`` starts: the reply says the run's generation, timeline and snapshot number, and whether ``w`` is to wait for a rollback that restores its agents |

The coordinator tells every process on the run's broadcast subject
([`broadcast_subject`][agentsnap.distributed.broadcast_subject]):

| message | meaning |
|---|---|
| ``{"rollback": {...}}`` | phase 1: stop, and go back to the cut (a [`RollbackOrder`][agentsnap.distributed.RollbackOrder]) |
| ``{"resume": g, "epoch": n}`` | phase 2: every process carried out rollback ``g``: deliver again |
| ``{"let_go": [...], "to": w}`` | the worker hosting these agents stops hosting them (``w`` takes them) and goes on with the others |
| ``{"stop": reason, "cancelled": c}`` | the run stopped (cancelled on request, or its retry policy gave up): deliver nothing more |
"""  # noqa: E501 - tables

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from agentsnap.exceptions import OutputRejected
from agentsnap.jetstream.codec import encode_token
from agentsnap.records import RollbackInfo

__all__ = [
    "CONTROL",
    "RollbackOrder",
    "broadcast_subject",
    "control_subject",
    "rejection_of",
    "rejection_to_json",
]

CONTROL = "agentsnap-control"
"""First token of a run's control subject: outside the run's stream (``agentsnap.<run>.>``),
so that requests and notices are not stored with the channels."""


def control_subject(run_id: str) -> str:
    """The subject on which a run's workers ask its coordinator for snapshots, and tell it
    of the parts they wrote (plain NATS, not stored).
    """  # noqa: D205
    return f"{CONTROL}.{encode_token(run_id)}"


def broadcast_subject(run_id: str) -> str:
    """The subject on which a run's coordinator tells every process to roll back and resume
    (plain NATS, not stored).
    """  # noqa: D205
    return f"{CONTROL}.{encode_token(run_id)}.all"


MessageKey = tuple[str, str, int]
"""A message by ``(src, dst, seq)``."""


@dataclass(frozen=True)
class RollbackOrder:
    """One rollback of a run spread over processes, as its coordinator orders it.

    Attributes:
        id: The rollback's id (also the id of its record in the store).
        generation: The generation every process moves to; what was sent before is dropped.
        epoch: The newest snapshot number begun: snapshots after it are new.
        snapshot_id: The complete snapshot to go back to; ``None`` for the start of the run
            (no snapshot was complete yet): every agent's initial state, nothing in flight.
        agent: The agent whose output was rejected (it gets ``reason`` as feedback), or
            ``None`` (a recovery after a worker stopped).
        reason: Why.
        source: What rejected the output (a check's name, ``schema``, ``self-evaluation``,
            ``critic``), or ``recovery``.
        attempt: Which failure of that output this is.
        redo: The messages being redone after rejected outputs: a worker says when one of
            them was handled without a rejection, which ends its episode.
        timeline: The timeline the run is on after the rollback (``None``: the
            generation's). A rollback for a rejected output starts a new one, numbered by
            its generation; a recovery (a worker restarted, or a coordinator took the run
            over) and a rollback for work lost to the database stay on the run's timeline,
            as one process resumed after a crash does: every process then redoes its
            agents' deliveries after the cut in the order it logged, and the handlers get
            the answers their model calls recorded.
    """

    id: str
    generation: int
    epoch: int
    snapshot_id: str | None
    agent: str | None
    reason: str
    source: str
    attempt: int = 1
    redo: list[MessageKey] = field(default_factory=list)
    timeline: int | None = None

    @property
    def line(self) -> int:
        """The timeline the run is on after the rollback."""
        return self.generation if self.timeline is None else self.timeline

    def to_json(self) -> dict[str, Any]:
        """The order as JSON."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RollbackOrder:
        """The order from JSON (``to_json``'s)."""
        redo = [(str(src), str(dst), int(seq)) for src, dst, seq in data.get("redo", [])]
        return cls(**{**data, "redo": redo})

    def info(self, run_id: str, discarded: int = 0) -> RollbackInfo:
        """The rollback as recorded, and as agents' ``on_rollback`` sees it."""
        return RollbackInfo(
            id=self.id,
            run_id=run_id,
            snapshot_id=self.snapshot_id or "",
            agent=self.agent,
            reason=self.reason,
            source=self.source,
            attempt=self.attempt,
            discarded=discarded,
        )


def _key(message: Any) -> list[Any] | None:
    return None if message is None else [message.src, message.dst, message.seq]


def rejection_to_json(rejection: OutputRejected, handling: Any) -> dict[str, Any]:
    """A rejected output as a worker reports it (``handling``: the message being handled)."""
    return {
        "agent": rejection.agent,
        "reason": rejection.reason,
        "source": rejection.source,
        "output": _key(rejection.output),
        "handling": _key(handling),
    }


def rejection_of(
    data: dict[str, Any],
) -> tuple[str, str, str, MessageKey | None, MessageKey | None]:
    """``(agent, reason, source, output, handling)`` from a worker's report.

    Raises:
        KeyError, TypeError, ValueError: The report is malformed.
    """

    def key(value: Any) -> MessageKey | None:
        if value is None:
            return None
        src, dst, seq = value
        return str(src), str(dst), int(seq)

    return (
        str(data["agent"]),
        str(data["reason"]),
        str(data["source"]),
        key(data.get("output")),
        key(data.get("handling")),
    )
