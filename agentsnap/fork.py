"""Forking: a new run whose snapshot 1 is a copy of a complete snapshot of another run.

This is the one way a run is forked. [`fork_run`][agentsnap.inspect.fork_run] (and
``agentsnap fork``) records the fork and leaves it for a program to continue with
``Runtime(store=..., run_id=...)`` and ``resume()``;
[`Runtime.fork_from`][agentsnap.Runtime.fork_from] records it the same way and resumes it
at once. Either way the store holds the same run: its parent run and snapshot, and as its
snapshot 1 the parent's cut under a new id (agent states, counters, messages in flight),
with the agent states that ``states=`` replaces and the messages in flight that
``messages=`` edits, drops or adds (see [`MessageEdits`][agentsnap.fork.MessageEdits]).

Example:
    ```python
    import asyncio

    from agentsnap import MemoryStore, Runtime
    from agentsnap.fork import fork_snapshot

    async def main() -> None:
        store = MemoryStore()
        async with Runtime(store=store) as runtime:
            cut = await runtime.snapshot()
        run = await fork_snapshot(store, cut)
        print(run.parent_snapshot_id == cut.id, run.status)

    asyncio.run(main())
    ```
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentsnap.exceptions import ConfigurationError, SnapshotDamaged, StateInvalid
from agentsnap.limits import check_run_id, check_run_labels
from agentsnap.messages import ENVIRONMENT, JsonValue, type_name
from agentsnap.records import (
    AgentCut,
    ChannelRecord,
    RecordedMessage,
    RunInfo,
    RunStatus,
    Snapshot,
    SnapshotStatus,
    utcnow,
)
from agentsnap.state import StateBlob, canonical_json
from agentsnap.versions import schema_version, state_schema, state_version

if TYPE_CHECKING:
    from collections.abc import Mapping

    from agentsnap.messages import JsonInput
    from agentsnap.store import RunStore

__all__ = [
    "TOOLS_KEY",
    "MessageEdits",
    "NewMessage",
    "ToolsMode",
    "check_forkable",
    "check_states",
    "fork_snapshot",
    "forked_cut",
    "tools_of",
    "validate_states",
]

ToolsMode = Literal["live", "dry"]
"""How a fork's side-effecting tools behave when it runs: ``"live"``, they run for real
(under new keys: a fork is another run); ``"dry"``, they do not run, each call is recorded
in the ledger as ``dry`` with its arguments and returns the tool's declared stand-in
(``@tool(dry_run=...)``)."""

TOOLS_KEY = "agentsnap.tools"
"""The key of a run's metadata that says its tools are dry (``"dry"``)."""


def tools_of(run: RunInfo) -> ToolsMode:
    """Whether ``run``'s side-effecting tools are live or dry (a what-if fork)."""
    return "dry" if run.metadata.get(TOOLS_KEY) == "dry" else "live"


class NewMessage(BaseModel):
    """A message added to a fork's cut, in flight from ``src`` to ``dst``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    src: str
    """The sender: an agent of the cut, or ``$env`` (the outside world)."""
    dst: str
    """The receiver: an agent of the cut."""
    payload: JsonValue = None
    """The message's JSON payload."""
    kind: str = "message"
    """The message's kind, as a sender would give it."""


class MessageEdits(BaseModel):
    """What a fork changes in the messages its cut holds in flight.

    Messages are named by their id, ``src>dst#seq`` (as `agentsnap show` and the inspector
    show them). A dropped message is never delivered in the fork: the later messages of its
    channel move up one place, and the sender's count of messages sent goes down by one, so
    that the fork's cut stays consistent (what a sender sent is what its receiver got plus
    what is in flight). An edited message keeps its place with the new payload. An added
    message goes after those in flight on its channel, as if its sender had sent it last.
    Every edit is checked before anything is written, and every problem is listed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    drop: list[str] = Field(default_factory=list)
    """Ids of messages in flight to leave out."""
    edit: dict[str, JsonValue] = Field(default_factory=dict)
    """New payloads, by id of a message in flight."""
    add: list[NewMessage] = Field(default_factory=list)
    """Messages to put in flight, each after those already on its channel."""

    def __bool__(self) -> bool:
        return bool(self.drop or self.edit or self.add)


def _where(path: object) -> str:
    """A place in a state as a JSONPath-style path: ``$``, ``$.memory.notes[0]``."""
    text = "$"
    for step in path:  # type: ignore[attr-defined]
        if isinstance(step, int):
            text += f"[{step}]"
        elif isinstance(step, str) and step.isidentifier():
            text += f".{step}"
        else:
            text += f"[{json.dumps(step, ensure_ascii=False)}]"
    return text


def check_states(
    states: Mapping[str, JsonInput],
    schemas: Mapping[str, Mapping[str, JsonValue]],
) -> list[dict[str, str]]:
    """What is wrong with edited agent states, checked against the agents' state schemas.

    Each state given for an agent that has a schema is validated against it (JSON Schema,
    as pydantic's ``model_json_schema`` writes them); agents without a schema are not
    checked here. Nothing runs: no user code is imported.

    Returns:
        One ``{"agent", "path", "message"}`` per problem, ``path`` JSONPath-style from
        ``$`` (the whole state); empty when every state is valid.

    Raises:
        ConfigurationError: A schema is there to check against, but ``jsonschema`` is not
            installed.
    """
    wanted = [name for name in states if name in schemas]
    if not wanted:
        return []
    try:
        import jsonschema  # noqa: PLC0415 (optional: the ui extra)
    except ImportError as exc:
        raise ConfigurationError(
            "checking edited states against their schemas needs jsonschema: "
            "pip install 'agentsnap[ui]'"
        ) from exc
    problems: list[dict[str, str]] = []
    for name in wanted:
        schema = dict(schemas[name])
        validator_class = jsonschema.validators.validator_for(
            schema, default=jsonschema.Draft202012Validator
        )
        try:
            validator_class.check_schema(schema)
        except jsonschema.SchemaError as exc:
            problems.append(
                {
                    "agent": name,
                    "path": "$",
                    "message": f"its stored schema is unusable: {exc.message}",
                }
            )
            continue
        validator = validator_class(schema)
        errors = sorted(
            validator.iter_errors(states[name]), key=lambda e: list(map(str, e.absolute_path))
        )
        problems.extend(
            {"agent": name, "path": _where(error.absolute_path), "message": error.message}
            for error in errors
        )
    return problems


def validate_states(
    states: Mapping[str, JsonInput], models: Mapping[str, type[BaseModel]]
) -> list[dict[str, str]]:
    """What is wrong with edited agent states, validated against the agents' state classes.

    Each state is validated from its JSON, as a restore validates it, against the class
    ``models`` names for its agent (the current version of it); agents ``models`` does not
    name are not checked here.

    Returns:
        One ``{"agent", "path", "message"}`` per problem, as
        [`check_states`][agentsnap.fork.check_states] gives them; empty when every state
        is valid.
    """
    problems: list[dict[str, str]] = []
    for name, state in states.items():
        model = models.get(name)
        if model is None or not isinstance(state, dict):
            continue  # not a JSON object: forked_cut says so
        try:
            model.model_validate_json(canonical_json(state))
        except ValidationError as exc:
            problems.extend(
                {
                    "agent": name,
                    "path": _where(error["loc"]),
                    "message": f"{error['msg']} (as {model.__name__} version "
                    f"{state_version(model)} reads it)",
                }
                for error in exc.errors()
            )
        except (TypeError, ValueError):
            continue  # not JSON: forked_cut says so
    return problems


def check_forkable(snapshot: Snapshot) -> None:
    """Raise unless a run can be forked from ``snapshot``.

    Raises:
        SnapshotDamaged: The snapshot is damaged in the store.
        ConfigurationError: The snapshot is not complete (it failed, or is in progress).
    """
    check_complete(snapshot, "no run can be forked from it", "fork from")


def check_complete(snapshot: Snapshot, unusable: str, use: str) -> None:
    """Raise unless ``snapshot`` is complete and intact, before a run goes back to it.

    Args:
        snapshot: The snapshot.
        unusable: What a damaged snapshot means here (``"no run can be forked from it"``).
        use: What to do with a complete one instead, before ``"a complete one"``
            (``"fork from"``).

    Raises:
        SnapshotDamaged: The snapshot is damaged in the store.
        ConfigurationError: The snapshot is not complete (it failed, or is in progress).
    """
    if snapshot.status is SnapshotStatus.DAMAGED:
        raise SnapshotDamaged(snapshot.id, snapshot.error or "damaged", unusable)
    if snapshot.status is not SnapshotStatus.COMPLETE:
        raise ConfigurationError(
            f"snapshot {snapshot.id} is {snapshot.status.value}; {use} a complete one"
        )


def _problem(message_id: str, agent: str, text: str) -> dict[str, str]:
    return {"agent": agent, "path": f"message {message_id}", "message": text}


def _message_id(src: str, dst: str, seq: int) -> str:
    return f"{src}>{dst}#{seq}"


def edited_channels(
    snapshot: Snapshot, agents: dict[str, AgentCut], edits: MessageEdits
) -> tuple[list[ChannelRecord], list[dict[str, str]]]:
    """The cut's channels with ``edits`` applied, and the problems found (none: applied).

    ``agents`` is updated in place: a sender's count of messages sent follows the messages
    dropped from and added to its channels.
    """
    problems: list[dict[str, str]] = []
    channels: dict[tuple[str, str], list[RecordedMessage]] = {
        (c.src, c.dst): list(c.messages) for c in snapshot.channels
    }
    known = {m.id: (key, m) for key, messages in channels.items() for m in messages}

    def named(message_id: str, what: str) -> bool:
        if message_id in known:
            return True
        listed = ", ".join(sorted(known)[:10]) or "none"
        problems.append(
            _problem(
                message_id,
                message_id.partition(">")[2].partition("#")[0] or "?",
                f"{what} names {message_id!r}, which is not in flight in snapshot "
                f"{snapshot.id} (in flight: {listed})",
            )
        )
        return False

    for message_id, payload in edits.edit.items():
        if not named(message_id, "edit"):
            continue
        key = known[message_id][0]
        try:
            canonical_json(payload)
        except (TypeError, ValueError) as exc:
            problems.append(_problem(message_id, key[1], f"the new payload is not JSON: {exc}"))
            continue
        channels[key] = [
            m.model_copy(update={"payload": payload}) if m.id == message_id else m
            for m in channels[key]
        ]
    dropped = [m for m in edits.drop if named(m, "drop")]
    problems.extend(
        _problem(message_id, known[message_id][0][1], "it is both dropped and edited")
        for message_id in dropped
        if message_id in edits.edit
    )
    for n, new in enumerate(edits.add):
        where = f"add[{n}]"
        if new.src != ENVIRONMENT and new.src not in agents:
            problems.append(
                _problem(where, new.dst, f"its sender {new.src!r} is not an agent of the cut")
            )
        if new.dst == ENVIRONMENT or new.dst not in agents:
            problems.append(
                _problem(where, new.dst, f"its receiver {new.dst!r} is not an agent of the cut")
            )
        if new.src == new.dst:
            problems.append(_problem(where, new.dst, "an agent sends to itself"))
        try:
            canonical_json(new.payload)
        except (TypeError, ValueError) as exc:
            problems.append(_problem(where, new.dst, f"its payload is not JSON: {exc}"))
    if problems:
        return [], problems

    def counted(src: str, dst: str, change: int) -> None:
        cut = agents.get(src)
        if cut is None:  # a cut always holds $env; an agent unknown was refused above
            return
        sent = dict(cut.sent)
        sent[dst] = sent.get(dst, 0) + change
        agents[src] = cut.model_copy(update={"sent": sent})

    for message_id in dict.fromkeys(dropped):
        key, _message = known[message_id]
        channels[key] = [m for m in channels[key] if m.id != message_id]
        counted(key[0], key[1], -1)
    for new in edits.add:
        key = (new.src, new.dst)
        counted(new.src, new.dst, 1)
        channels.setdefault(key, []).append(
            RecordedMessage(id="", seq=0, kind=new.kind, payload=new.payload)
        )
    records = []
    for (src, dst), messages in sorted(channels.items()):
        if not messages:
            continue
        # Numbered again from the receiver's count, so that the channel stays contiguous.
        start = agents[dst].received.get(src, 0) if dst in agents else 0
        renumbered = [
            m.model_copy(update={"seq": start + i, "id": _message_id(src, dst, start + i)})
            for i, m in enumerate(messages, 1)
        ]
        records.append(ChannelRecord(src=src, dst=dst, messages=renumbered))
    return records, []


def forked_cut(
    snapshot: Snapshot,
    run_id: str,
    states: Mapping[str, JsonInput] | None = None,
    versions: Mapping[str, int] | None = None,
    messages: MessageEdits | None = None,
) -> Snapshot:
    """The fork's snapshot 1: a copy of ``snapshot`` for run ``run_id``, under a new id.

    Args:
        snapshot: The complete snapshot forked from.
        run_id: The fork's run id.
        states: New states of some agents of the cut, by agent name, replacing the recorded
            ones (each a JSON object, stored as canonical JSON with its content hash). The
            runtime that resumes the fork loads them into the agents' state models.
        versions: The version of the state class each new state is of, by agent name (an
            agent not named keeps the version its recorded state was stored with).
        messages: What to change in the messages in flight (see
            [`MessageEdits`][agentsnap.fork.MessageEdits]).

    Raises:
        SnapshotDamaged: The snapshot is damaged in the store.
        ConfigurationError: The snapshot is not complete.
        StateInvalid: ``states`` names an agent the cut does not hold, or gives a state
            that is not a JSON object; or ``messages`` names a message not in flight, or
            adds one between processes the cut does not hold (every problem is listed).
    """
    check_forkable(snapshot)
    agents = dict(snapshot.agents)
    problems: list[dict[str, str]] = []
    for name, state in (states or {}).items():
        if name == ENVIRONMENT or name not in agents:
            known = ", ".join(repr(a) for a in sorted(agents) if a != ENVIRONMENT) or "none"
            problems.append(
                {
                    "agent": name,
                    "path": "$",
                    "message": f"states= names {name!r}, which is not an agent of snapshot "
                    f"{snapshot.id} (its agents: {known})",
                }
            )
            continue
        if not isinstance(state, dict):
            problems.append(
                {
                    "agent": name,
                    "path": "$",
                    "message": f"states= gives agent {name!r} {type_name(type(state))}; an "
                    "agent's state is a JSON object",
                }
            )
            continue
        try:
            blob = StateBlob(canonical_json(state))
        except (TypeError, ValueError) as exc:
            problems.append(
                {
                    "agent": name,
                    "path": "$",
                    "message": f"states= gives agent {name!r} a state that is not JSON: {exc}",
                }
            )
            continue
        version = (versions or {}).get(name, agents[name].state_version)
        agents[name] = agents[name].model_copy(
            update={"state_json": blob.json, "state_hash": blob.hash, "state_version": version}
        )
    channels = snapshot.channels
    if messages:
        channels, message_problems = edited_channels(snapshot, agents, messages)
        problems += message_problems
    if problems:
        raise StateInvalid(problems)
    now = utcnow()
    return snapshot.model_copy(
        update={
            "id": uuid.uuid4().hex,
            "run_id": run_id,
            "seq": 1,
            "started_at": now,
            "completed_at": now,
            "agents": agents,
            "channels": channels,
        },
        deep=True,
    )


async def fork_snapshot(
    store: RunStore,
    snapshot: Snapshot,
    *,
    run_id: str | None = None,
    metadata: Mapping[str, JsonInput] | None = None,
    name: str | None = None,
    tags: Mapping[str, str] | None = None,
    states: Mapping[str, JsonInput] | None = None,
    recorded: bool = False,
    models: Mapping[str, type[BaseModel]] | None = None,
    messages: MessageEdits | None = None,
    tools: ToolsMode = "live",
) -> RunInfo:
    """Record a run forked from ``snapshot``: its parent, and a copy of the cut as snapshot 1.

    Nothing runs: the new run is ``created`` until a runtime resumes it. The parent run is
    not touched. Everything is checked before anything is written.

    Args:
        store: The store holding ``snapshot``; the new run goes there too.
        snapshot: The complete snapshot to fork from.
        run_id: Id of the new run (32 hex digits are generated when omitted).
        metadata: JSON recorded with the new run.
        name: The new run's name.
        tags: The new run's tags.
        states: New states of some agents, by name, replacing the recorded ones in the
            fork's snapshot 1 (see [`forked_cut`][agentsnap.fork.forked_cut]). A new state
            is one of the current version of the agent's state class: it is validated
            against the class in ``models`` and recorded with its version; for an agent
            ``models`` does not name, it is checked against the agent's state schema stored
            with the parent run, when there is one (see
            [`check_states`][agentsnap.fork.check_states]), and recorded with the version
            that schema records.
        recorded: The store already holds run ``run_id``, with no snapshot yet (a runtime
            that started it): only its parent and its snapshot 1 are recorded, and
            ``metadata``, ``name`` and ``tags`` are not used.
        models: The current state classes, by agent name (an app's, or a runtime's agents'
            ``state_type``); their schemas are recorded with the fork.
        messages: Messages in flight to drop, edit or add in the fork's snapshot 1 (see
            [`MessageEdits`][agentsnap.fork.MessageEdits]).
        tools: ``"dry"`` for a what-if fork whose side-effecting tools do not run (see
            [`ToolsMode`][agentsnap.fork.ToolsMode]); recorded in the run's metadata under
            [`TOOLS_KEY`][agentsnap.fork.TOOLS_KEY], where the runtime that resumes the fork
            finds it.

    Returns:
        The new run, as the store holds it.

    Raises:
        SnapshotDamaged: The snapshot is damaged in the store.
        ConfigurationError: The snapshot is not complete; ``run_id`` is taken or longer than
            64 characters; or ``name`` or ``tags`` cannot be stored.
        StateInvalid: An edited state is not valid (not an object, not an agent of the cut,
            or against its schema), or a message edit is not (a message not in flight, a
            payload not JSON, an added message between processes the cut does not hold);
            every problem is listed.
    """
    if run_id is not None:
        check_run_id(run_id)
    elif recorded:
        raise ConfigurationError("fork_snapshot(recorded=True) needs the run_id of the run")
    checked_name, checked_tags = check_run_labels(name, tags)
    if tools not in ("live", "dry"):
        raise ConfigurationError(f'tools= is "live" or "dry", got {tools!r}')
    if tools == "dry" and recorded:
        raise ConfigurationError(
            "a fork into a run already started cannot make its tools dry: fork with "
            'fork_run(..., tools="dry") and resume the new run'
        )
    metadata = dict(metadata or {})
    if tools == "dry":
        metadata[TOOLS_KEY] = "dry"
    run = RunInfo(
        id=run_id or uuid.uuid4().hex,
        parent_run_id=snapshot.run_id,
        parent_snapshot_id=snapshot.id,
        metadata=metadata,
        name=checked_name,
        tags=checked_tags,
        status=RunStatus.CREATED,
    )
    models = models or {}
    schemas = await store.load_state_schemas(snapshot.run_id)
    versions: dict[str, int] = {}
    for agent in states or {}:
        model = models.get(agent)
        if model is not None:
            versions[agent] = state_version(model)
        else:  # of the version of the schema it is checked against
            stored = schema_version(schemas.get(agent))
            if stored is not None:
                versions[agent] = stored
    first = forked_cut(snapshot, run.id, states, versions, messages)
    if states:
        problems = check_states({a: s for a, s in states.items() if a not in models}, schemas)
        problems += validate_states({a: s for a, s in states.items() if a in models}, models)
        if problems:
            raise StateInvalid(problems)
    schemas.update(
        {name: schema for name, model in models.items() if (schema := state_schema(model))}
    )
    if recorded:
        await store.set_parent(run.id, snapshot.run_id, snapshot.id)
    else:
        if run_id is not None and await store.find_ids("run", run_id, limit=1) == [run_id]:
            raise ConfigurationError(f"there is already a run with id {run_id}")
        await store.create_run(run)
    if schemas:
        # A runtime forking into its own run has stored its agents' schemas: they win.
        own = await store.load_state_schemas(run.id) if recorded else {}
        await store.save_state_schemas(run.id, {**schemas, **own})
    await store.save_snapshot(first)
    return await store.get_run(run.id)
