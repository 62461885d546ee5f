"""Reading snapshots back: a store's rows become a snapshot, intact or damaged with a reason.

A store writes each snapshot in one transaction, so it is stored whole or not at all. What it
reads back can still be damaged: rows deleted or edited by hand, a backup restored in part,
a migration gone wrong. A reader must then neither show the snapshot as complete (with
agents silently missing) nor fail with a traceback, and a run must never go back to it.

[`SnapshotReader`][agentsnap.integrity.SnapshotReader] rebuilds snapshots from a store's
rows and checks every part of a complete snapshot:

* every process's part is there: the environment's (``$env``) always is, since it takes
  part in every cut, and every process that another process's counters or a message in
  flight names. The environment has a channel to every agent from the moment the agent is
  registered, so its counters name every agent of the cut: a deleted agent row is found
  whenever the environment's row is intact, and a deleted environment row is found always;
* each state is there, is a JSON object, and matches the SHA-256 hash it is stored under;
  a state stored in chunks (see [`agentsnap.store.chunks`][agentsnap.store.chunks]) is
  rebuilt from them first, and a chunk that is missing or does not match its own hash is
  named in the reason;
* a snapshot stored as the changes to an earlier one (see
  [`agentsnap.store.sql`][agentsnap.store.sql]) holds as many rows of its own as it
  was written with (the store reports it with
  [`problem`][agentsnap.integrity.SnapshotReader.problem]), so that a lost row is found,
  not replaced by the earlier snapshot's;
* the ``sent`` and ``received`` counters are JSON objects mapping process names to
  non-negative integers;
* each message in flight can be read (its payload is JSON, its headers map strings to
  strings);
* the counters and the messages in flight make a consistent cut (the check the runtime
  makes before it calls a snapshot complete): on every channel, the messages in flight are
  exactly those the sender had sent and the receiver had not received.

A snapshot that fails a check comes back with status
[`DAMAGED`][agentsnap.SnapshotStatus.DAMAGED], ``error`` saying in one line what is wrong,
``damaged_agents`` naming the processes whose part is missing or unreadable, and the parts
that could be read. Runs treat it like a failed snapshot: they never roll back to it,
resume from it or fork it.

Example:
    ```python
    from datetime import UTC, datetime

    from agentsnap.integrity import SnapshotReader
    from agentsnap.state import content_hash

    reader = SnapshotReader()
    for state in ("{}", '{"count":1}'):  # every state the cuts name
        reader.blob(content_hash(state), state)
    reader.cut("s1", "$env", content_hash("{}"), '{"alice":1}', "{}")
    reader.cut("s1", "alice", content_hash('{"count":1}'), "{}", '{"$env":2}')
    now = datetime.now(UTC)
    snapshot = reader.snapshot(
        {"id": "s1", "run_id": "r1", "seq": 1, "initiator": "$env", "status": "complete",
         "started_at": now, "completed_at": now, "error": None}
    )
    print(snapshot.status.value, snapshot.error)
    # damaged channel $env>alice: alice received 2 but $env had sent only 1; ...
    ```
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agentsnap.messages import ENVIRONMENT
from agentsnap.records import (
    AgentCut,
    AgentVersion,
    ChannelRecord,
    RecordedMessage,
    Snapshot,
    SnapshotStatus,
    SnapshotSummary,
)
from agentsnap.state import content_hash

__all__ = ["SnapshotReader", "agent_versions", "cut_problems", "one_line"]

_SHOWN = 3
"""How many problems a damaged snapshot's reason spells out."""


def one_line(problems: list[str]) -> str:
    """The problems found in a snapshot as one line: the first few, and how many more."""
    text = "; ".join(problems[:_SHOWN])
    if len(problems) > _SHOWN:
        text += f"; and {len(problems) - _SHOWN} more problem(s)"
    return " ".join(text.split())


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "null" if value is None else type(value).__name__


def _short(text: str | None, limit: int = 40) -> str:
    if text is None:
        return "nothing"
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "…"


class SnapshotReader:
    """Rebuilds snapshots from a store's rows, checking each part; damage is reported, not
    raised.

    Give it, for the snapshots to read, every state the cuts name
    ([`blob`][agentsnap.integrity.SnapshotReader.blob]), every process's cut
    ([`cut`][agentsnap.integrity.SnapshotReader.cut], in the order ``agents`` should list
    them) and every message in flight
    ([`message`][agentsnap.integrity.SnapshotReader.message], in ``(src, dst, seq)``
    order); then ask for each [`snapshot`][agentsnap.integrity.SnapshotReader.snapshot].
    Counters and payloads are given as the JSON text the store holds, so that text that is
    not JSON is found here rather than raised by the database layer. Each state is checked
    once, however many cuts share it.
    """  # noqa: D205

    def __init__(self, *, keep_states: bool = True) -> None:
        # Without keep_states, a state is checked as soon as it is given and let go: the
        # snapshots read back then hold empty states, good for summaries only.
        self._keep = keep_states
        self._blobs: dict[str, str] = {}
        # Per state hash, what is wrong with the state, or None: checked once.
        self._verdicts: dict[str, str | None] = {}
        self._cuts: dict[str, dict[str, AgentCut]] = {}
        self._channels: dict[str, dict[tuple[str, str], list[RecordedMessage]]] = {}
        self._problems: dict[str, list[str]] = {}
        self._broken: dict[str, set[str]] = {}

    def wanted(self, hashes: Iterable[str]) -> list[str]:
        """Those of ``hashes`` whose state was not given yet, sorted, each once."""
        return sorted(set(hashes) - self._blobs.keys() - self._verdicts.keys())

    def blob(self, state_hash: str, state: str) -> None:
        """A state the store holds under ``state_hash``."""
        if self._keep:
            self._blobs[state_hash] = state
        elif state_hash not in self._verdicts:
            self._verdicts[state_hash] = _state_problem(state_hash, state)

    def unreadable(self, state_hash: str, problem: str) -> None:
        """A state the store holds under ``state_hash`` but cannot rebuild, and why.

        Args:
            state_hash: The state's hash.
            problem: What is wrong, as a phrase that follows "the state of 'agent' ", such
                as ``"is incomplete (the store holds no state chunk 1f2e3d4c5b6a)"``.
        """
        self._verdicts[state_hash] = problem

    def cut(
        self,
        snapshot_id: str,
        agent: str,
        state_hash: str,
        sent: str | None,
        received: str | None,
        *,
        state_version: int = 1,
    ) -> None:
        """One process's part of a snapshot: its state's hash and its counters' JSON text.

        A state not given with [`blob`][agentsnap.integrity.SnapshotReader.blob] before is
        missing from the store. ``state_version`` is the version of the state class the state
        was written with.
        """
        problems: list[str] = []
        state = self._state_problem(state_hash)
        if state is not None:
            problems.append(f"the state of {agent!r} {state}")
        counters: list[dict[str, int]] = []
        for what, text in (("sent", sent), ("received", received)):
            parsed = _counters(text)
            if parsed is None:
                problems.append(
                    f"the {what} counters of {agent!r} are not a JSON object of process names "
                    f"to non-negative counts ({_short(text)})"
                )
            else:
                counters.append(parsed)
        if problems:
            self._problems.setdefault(snapshot_id, []).extend(problems)
            self._broken.setdefault(snapshot_id, set()).add(agent)
            return
        self._cuts.setdefault(snapshot_id, {})[agent] = AgentCut(
            state_json=self._blobs[state_hash] if self._keep else "",
            state_hash=state_hash,
            sent=counters[0],
            received=counters[1],
            state_version=state_version,
        )

    def problem(self, snapshot_id: str, problem: str) -> None:
        """Something wrong with a snapshot's rows that its parts cannot show.

        Args:
            snapshot_id: The snapshot.
            problem: What is wrong, in the words of the snapshot's ``error``, such as ``"it
                holds 2 agent rows of its own where 3 were written"``.
        """
        self._problems.setdefault(snapshot_id, []).append(problem)

    def message(  # noqa: PLR0917
        self,
        snapshot_id: str,
        src: str,
        dst: str,
        seq: int,
        kind: str,
        payload: str | None,
        headers: str | None,
        epoch: int,
    ) -> None:
        """One message in flight in a snapshot, its payload and headers as JSON text."""
        value = fields = None
        problem: str | None = None
        try:
            value = json.loads(payload) if payload is not None else None
        except ValueError as exc:
            problem = f"its payload is not JSON ({exc})"
        if payload is None:
            problem = "it has no payload"
        try:
            fields = json.loads(headers) if headers is not None else None
        except ValueError:
            fields = None
        if not isinstance(fields, dict) or not all(isinstance(v, str) for v in fields.values()):
            problem = problem or f"its headers are not a JSON object of strings ({_short(headers)})"
        if problem is not None or not isinstance(fields, dict):
            self._problems.setdefault(snapshot_id, []).append(
                f"message {src}>{dst}#{seq} in flight cannot be read: {problem}"
            )
            return
        self._channels.setdefault(snapshot_id, {}).setdefault((src, dst), []).append(
            RecordedMessage(
                id=f"{src}>{dst}#{seq}",
                seq=seq,
                kind=kind,
                payload=value,
                headers=fields,
                epoch=epoch,
            )
        )

    def snapshot(self, row: Mapping[str, Any]) -> Snapshot:
        """The snapshot of a snapshot row, with the parts given for it; damaged if need be.

        Args:
            row: ``id``, ``run_id``, ``seq``, ``initiator``, ``status`` (the text stored),
                ``started_at``, ``completed_at`` and ``error``.
        """
        snapshot_id = row["id"]
        agents = self._cuts.pop(snapshot_id, {})
        channels = self._channels.pop(snapshot_id, {})
        problems = self._problems.pop(snapshot_id, [])
        broken = self._broken.pop(snapshot_id, set())
        try:
            status = SnapshotStatus(row["status"])
        except ValueError:
            status = SnapshotStatus.COMPLETE  # checked as if complete, and damaged anyway
            problems.insert(0, f"its status {row['status']!r} is not one agentsnap writes")
        snapshot = Snapshot(
            id=snapshot_id,
            run_id=row["run_id"],
            seq=row["seq"],
            initiator=row["initiator"],
            status=status,
            started_at=row["started_at"],
            completed_at=row["completed_at"],
            error=row["error"],
            agents=agents,
            channels=[
                ChannelRecord(src=src, dst=dst, messages=found)
                for (src, dst), found in sorted(channels.items())
            ],
        )
        if status is not SnapshotStatus.COMPLETE:
            return snapshot  # a failed snapshot holds no cut to check
        if snapshot.completed_at is None:
            problems.append("it is marked complete but has no completion time")
        problems.extend(_structure_problems(snapshot, broken))
        if not problems:
            return snapshot
        return snapshot.model_copy(
            update={
                "status": SnapshotStatus.DAMAGED,
                "error": one_line(problems),
                "damaged_agents": sorted(broken),
            }
        )

    def summary(self, row: Mapping[str, Any]) -> SnapshotSummary:
        """The summary of the snapshot of a snapshot row (as ``snapshot``, then summed up)."""
        return SnapshotSummary.of(self.snapshot(row))

    def _state_problem(self, state_hash: str) -> str | None:
        if state_hash in self._verdicts:
            return self._verdicts[state_hash]
        problem = _state_problem(state_hash, self._blobs.get(state_hash))
        self._verdicts[state_hash] = problem
        return problem


def _state_problem(state_hash: str, text: str | None) -> str | None:
    """What is wrong with the state stored under ``state_hash`` (``None``: nothing)."""
    if text is None:
        return f"is missing (the store holds no state blob {state_hash[:12]})"
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"is not JSON ({exc})"
    if not isinstance(value, dict):
        return f"is a JSON {_json_type(value)}, not an object"
    if content_hash(text) != state_hash:
        return (
            f"does not match its hash {state_hash[:12]} (the state blob was changed "
            "after it was written)"
        )
    return None


def _counters(text: str | None) -> dict[str, int] | None:
    """Counters from their JSON text, or ``None`` when they are not a name-to-count object."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not all(
        type(count) is int and count >= 0 for count in value.values()
    ):
        return None
    return value


def _structure_problems(snapshot: Snapshot, broken: set[str]) -> list[str]:
    """What is missing from a complete snapshot's cut, or inconsistent in it.

    Adds the processes whose part is missing to ``broken``.
    """
    agents = snapshot.agents
    named: set[str] = {ENVIRONMENT}
    for cut in agents.values():
        named.update(cut.sent)
        named.update(cut.received)
    for channel in snapshot.channels:
        named.update((channel.src, channel.dst))
    problems = []
    for name in sorted(named - agents.keys() - broken):
        why = (
            "the environment takes part in every cut"
            if name == ENVIRONMENT
            else "other processes' counters or the messages in flight name it"
        )
        problems.append(f"the part of {name!r} is missing ({why})")
        broken.add(name)
    if not broken:
        return problems + cut_problems(snapshot)
    # Check what could be read: the channels between processes whose part is intact.
    intact = {
        name: cut.model_copy(
            update={
                "sent": {k: v for k, v in cut.sent.items() if k not in broken},
                "received": {k: v for k, v in cut.received.items() if k not in broken},
            }
        )
        for name, cut in agents.items()
    }
    kept = [c for c in snapshot.channels if c.src not in broken and c.dst not in broken]
    return problems + cut_problems(snapshot.model_copy(update={"agents": intact, "channels": kept}))


def agent_versions(snapshots: Iterable[Snapshot], agent: str) -> list[AgentVersion]:
    """``agent``'s part of each complete or damaged snapshot of ``snapshots`` that holds it,
    or whose damage concerns it, in the order given.

    What a store's ``agent_history`` returns, before it raises ``NotFoundError`` for an empty
    list.
    """  # noqa: D205
    versions = []
    for snapshot in snapshots:
        damaged = snapshot.status is SnapshotStatus.DAMAGED
        if snapshot.status is not SnapshotStatus.COMPLETE and not damaged:
            continue
        cut = snapshot.agents.get(agent)
        if cut is None and agent not in snapshot.damaged_agents:
            continue
        versions.append(
            AgentVersion(
                snapshot_id=snapshot.id,
                snapshot_seq=snapshot.seq,
                completed_at=snapshot.completed_at,
                cut=cut,
                damaged=snapshot.error if damaged else None,
            )
        )
    return versions


def cut_problems(snapshot: Snapshot) -> list[str]:
    """Check that a snapshot is a consistent cut; return what is wrong (empty when nothing).

    For every channel ``(src, dst)``: the receiver cannot have received more than the sender
    had sent at the cut, and the channel's recorded messages must be exactly sequence numbers
    ``received + 1 .. sent``, in order. The coordinator runs this on every snapshot before it
    calls it complete; it costs one pass over the channels.
    """
    if snapshot.status is not SnapshotStatus.COMPLETE:
        return [f"snapshot {snapshot.seq} is {snapshot.status}, not complete"]
    agents = snapshot.agents
    if not snapshot.channels and _all_received(agents):
        return []  # nothing in flight, and every message sent was received
    in_flight = {(ch.src, ch.dst): ch.messages for ch in snapshot.channels}
    found: list[tuple[tuple[str, str], str]] = []
    # Every channel is checked once: those a sender's counters name, then those only a
    # receiver's counters name, then those only the messages in flight name.
    both = 0  # channels that both their sender's and their receiver's counters name
    for src, cut in agents.items():
        for dst, sent in cut.sent.items():
            receiver = agents.get(dst)
            if receiver is not None:
                received = receiver.received.get(src)
                if received is not None:
                    both += 1
                    if received == sent and (src, dst) not in in_flight:
                        continue  # nothing in flight, all received: the common case, quickly
            _check_channel(agents, in_flight, src, dst, sent, found)
    if both < sum(len(cut.received) for cut in agents.values()):
        for dst, cut in agents.items():
            for src in cut.received:
                sender = agents.get(src)
                if sender is None or dst not in sender.sent:
                    _check_channel(agents, in_flight, src, dst, 0, found)
    for src, dst in in_flight:
        sender, receiver = agents.get(src), agents.get(dst)
        if (sender is None or dst not in sender.sent) and (
            receiver is None or src not in receiver.received
        ):
            _check_channel(agents, in_flight, src, dst, 0, found)
    found.sort(key=lambda item: item[0])  # by channel; stable: a channel's own order kept
    return [problem for _, problem in found]


def _all_received(agents: Mapping[str, AgentCut]) -> bool:
    """Whether every process received exactly what the others' counters say they sent it.

    The check of a cut with nothing in flight, in one pass over the senders' counters and
    one comparison of dictionaries per receiver (a team whose channels are idle: the common
    case, and a full mesh has a hundred times more channels than processes).
    """
    sent_to: dict[str, dict[str, int]] = {name: {} for name in agents}
    for src, cut in agents.items():
        for dst, sent in cut.sent.items():
            expected = sent_to.get(dst)
            if expected is None:
                return False  # a process missing from the cut: told by the full check
            expected[src] = sent
    return all(sent_to[name] == cut.received for name, cut in agents.items())


def _check_channel(  # noqa: PLR0917
    agents: Mapping[str, AgentCut],
    in_flight: Mapping[tuple[str, str], Sequence[RecordedMessage]],
    src: str,
    dst: str,
    sent: int,
    found: list[tuple[tuple[str, str], str]],
) -> None:
    """Check the channel ``src > dst`` of a cut (``sent`` by the sender's counters)."""
    receiver = agents.get(dst)
    if receiver is None or src not in agents:
        found.append(((src, dst), f"channel {src}>{dst} names a process missing from the cut"))
        return
    received = receiver.received.get(src, 0)
    messages = in_flight.get((src, dst), ())
    if received > sent:
        found.append(
            (
                (src, dst),
                f"channel {src}>{dst}: {dst} received {received} but {src} had sent only {sent}",
            )
        )
    if len(messages) != sent - received or any(
        m.seq != received + i for i, m in enumerate(messages, 1)
    ):
        seqs = [m.seq for m in messages]
        expected = list(range(received + 1, sent + 1))
        found.append(
            (
                (src, dst),
                f"channel {src}>{dst}: in flight {seqs}, expected {expected} "
                f"(sent {sent}, received {received})",
            )
        )
