"""Redaction before persistence: secrets and personal data kept out of what a run leaves.

A [`Redaction`][agentsnap.Redaction] given to a runtime (``Runtime(redact=...)``,
``Worker(..., redact=...)``, ``App(redact=...)``) names what must never be written: fields of
agent states, keys of message payloads, arguments and results of tools, parts of model
requests and answers, text patterns, and a callable for anything else. It is applied where a
record is made for the store (a snapshot's states and messages in flight, the journal's
segments, the replay log's inputs, the ledger's claims and outcomes, model call records) and
to the spans' free text, so the database, the exports, the timeline, the inspector and the
traces only ever see markers. The values an agent works with in memory are never redacted.

A marker is a string that names the type of the value it replaces and a hash of it::

    [redacted str hmac:5f1d0c9e2b7a4c3d8e6f1a2b]

The hash is stable (the same value gives the same marker), so diffs between snapshots, the
dedup of unchanged states and the fingerprints of tool arguments still work. It is an
HMAC-SHA256 under the policy's ``key`` (or the ``AGENTSNAP_REDACTION_KEY`` environment
variable), and a plain SHA-256 when neither is given: a plain hash of a value with few
possibilities (a card number, a birth date) can be found by trying them all, a keyed one
cannot without the key.

A marker is never turned back into its value by agentsnap. A resume, or a rollback to a cut
read back from the store, that meets one asks the policy's ``secret`` provider for the
value (and checks that it hashes to the marker), or raises
[`RedactedValueNeeded`][agentsnap.RedactedValueNeeded], naming the agent, the
place and what to do.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import orjson

from agentsnap.exceptions import ConfigurationError, RedactedValueNeeded
from agentsnap.state import StateBlob, canonical_json, plain_canonical_json

if TYPE_CHECKING:
    from agentsnap.messages import JsonValue
    from agentsnap.records import AgentCut, ChannelRecord, Snapshot, SnapshotPart

__all__ = [
    "MARKED",
    "Kind",
    "Redaction",
    "Secret",
    "Where",
    "find_markers",
    "unredact",
    "unredact_snapshot",
]

logger = logging.getLogger("agentsnap.redaction")

Kind = Literal["state", "payload", "tool_arguments", "tool_result", "model_request", "model_answer"]
"""The kinds of value a policy redacts."""

KEY_VARIABLE = "AGENTSNAP_REDACTION_KEY"
"""The environment variable read for the hash key when ``Redaction(key=...)`` is not given."""

_MARKER = re.compile(
    r"\[redacted (str|int|float|bool|null|list|object) (hmac|sha256):([0-9a-f]{24})\]"
)
MARKED = "[redacted "
"""What every marker starts with: a text without it holds none."""
_OPENING = MARKED
_OPENING_BYTES = _OPENING.encode()
_TYPES: dict[type, str] = {
    str: "str",
    int: "int",
    float: "float",
    bool: "bool",
    type(None): "null",
    list: "list",
    tuple: "list",
    dict: "object",
}


@dataclass(frozen=True, slots=True)
class Where:
    """The place of a value in a record: what a rule and a secret provider are told.

    ``owner`` and ``path`` together are what a policy's paths match: the agent and the
    state's fields, the receiver and the payload's keys, the tool and its arguments' (or
    result's) keys, the agent and the model request's (or answer's) fields. List items are
    their index, as text.
    """

    kind: Kind
    """What is being redacted (or restored)."""
    owner: str
    """The agent (state, payload, model call) or the tool (arguments, result)."""
    path: tuple[str, ...] = ()
    """Keys from the record's root to the value."""
    marker: str | None = None
    """The marker found, when a secret provider is asked for its value."""

    def __str__(self) -> str:
        place = ".".join(self.path) or "(the whole value)"
        return f"{self.kind} of {self.owner!r} at {place}"


Rule = Callable[[Where, Any], bool]
"""``rule(where, value)``: whether to redact ``value`` (called for every value of a record)."""

Secret = Callable[[Where], Any]
"""``secret(where)``: the value a marker stands for (``where.marker``), or ``None``."""


def _compile(paths: Iterable[str], what: str) -> dict[str, list[tuple[str, ...]]]:
    """Paths by their last name (``"*"`` for a wildcard last)."""
    if isinstance(paths, str):
        raise ConfigurationError(f"Redaction({what}=...) takes a list of paths, not one string")
    rules: dict[str, list[tuple[str, ...]]] = {}
    for path in paths:
        parts = tuple(path.split("."))
        if not path or "" in parts:
            raise ConfigurationError(f"Redaction({what}=...): {path!r} is not a dotted path")
        rules.setdefault(parts[-1], []).append(parts)
    return rules


def _matches(rules: dict[str, list[tuple[str, ...]]], location: tuple[str, ...]) -> bool:
    candidates = rules.get(location[-1], ())
    wild = rules.get("*", ())
    for rule in (*candidates, *wild):
        size = len(rule)
        if size <= len(location) and all(
            want in {"*", got} for want, got in zip(rule, location[-size:], strict=True)
        ):
            return True
    return False


class Redaction:
    """What a run must never write: fields, keys, arguments, patterns, and how to restore.

    Paths are dotted names matched against the end of a value's place: ``"card"`` is every
    value under a key ``card``, at any depth; ``"customer.email"`` is ``email`` inside
    ``customer``; ``"*"`` matches any one key or list index. Each kind of record starts its
    places with its owner: the agent for a state (``"payer.card"`` is only agent
    ``payer``'s ``card``), the receiving agent for a payload, the tool for its arguments and
    result (``"charge.card"``, or ``"charge"`` for the whole result), the agent for a model
    request (``messages.*.content``) or answer (``text``, ``output``).

    Args:
        state: Paths in agent states. A state's ``tool_calls`` are redacted by the tool
            paths below as well.
        payload: Paths in message payloads (the run's input, messages between agents, and
            those in flight in a snapshot).
        tool_arguments: Paths in tool arguments, as the ledger and the agents' tool call
            histories record them. The arguments' fingerprint is taken after redaction.
        tool_results: Paths in tool results.
        model_request: Paths in recorded model requests (``messages``, ``tools``,
            ``settings``...).
        model_answer: Paths in recorded model answers (``text``, ``output``,
            ``tool_calls``...).
        patterns: Regular expressions: every match in any text of any record (and in the
            spans' free text) is replaced by a marker, the rest of the text kept.
        rule: Called with the place and value of every value of every record: ``True``
            redacts it.
        key: The key of the markers' HMAC-SHA256 (default: the
            ``AGENTSNAP_REDACTION_KEY`` environment variable; without either, a plain
            SHA-256, which a value with few possibilities does not resist). Keep it for the
            life of a run: the fingerprints of redacted arguments depend on it.
        secret: Asked for the value of a marker that a resume or a rollback to a stored cut
            needs; returns it, or ``None`` when it cannot (then ``RedactedValueNeeded``).

    Raises:
        ConfigurationError: A path is not a dotted name, or a pattern does not compile.
    """

    def __init__(
        self,
        *,
        state: Iterable[str] = (),
        payload: Iterable[str] = (),
        tool_arguments: Iterable[str] = (),
        tool_results: Iterable[str] = (),
        model_request: Iterable[str] = (),
        model_answer: Iterable[str] = (),
        patterns: Iterable[str | re.Pattern[str]] = (),
        rule: Rule | None = None,
        key: str | bytes | None = None,
        secret: Secret | None = None,
    ) -> None:
        self._rules: dict[Kind, dict[str, list[tuple[str, ...]]]] = {
            "state": _compile(state, "state"),
            "payload": _compile(payload, "payload"),
            "tool_arguments": _compile(tool_arguments, "tool_arguments"),
            "tool_result": _compile(tool_results, "tool_results"),
            "model_request": _compile(model_request, "model_request"),
            "model_answer": _compile(model_answer, "model_answer"),
        }
        try:
            self._patterns = [re.compile(p) if isinstance(p, str) else p for p in patterns]
        except re.error as exc:
            raise ConfigurationError(f"Redaction(patterns=...): {exc}") from exc
        self._rule = rule
        self.secret = secret
        """The provider asked for a marker's value on restore, or ``None``."""
        if key is None:
            key = os.environ.get(KEY_VARIABLE) or None
        self._key = key.encode() if isinstance(key, str) else key
        self.scheme = "hmac" if self._key else "sha256"
        """How markers are hashed: ``"hmac"`` (keyed) or ``"sha256"`` (plain)."""
        if self._key is None:
            logger.warning(
                "Redaction without a key: markers hold a plain SHA-256 of each value, which "
                "can be found by trying every value of a small set (card numbers, dates); "
                "pass Redaction(key=...) or set %s",
                KEY_VARIABLE,
            )
        # The names a record must hold somewhere for a path to match: a state's text that
        # holds none of them is written as it is, without a walk.
        self._walk_always = bool(self._patterns) or rule is not None
        names = set().union(*(set(rules) for rules in self._rules.values()))
        self._walk_always = self._walk_always or "*" in names
        self._needles = tuple(orjson.dumps(name) for name in sorted(names))
        self._cuts: dict[tuple[str, str], AgentCut] = {}

    # -- markers ----------------------------------------------------------------------------

    def mark(self, value: Any) -> str:
        """The marker of ``value``: its JSON type and a stable hash of its canonical JSON."""
        data = canonical_json(value).encode()
        if self._key is not None:
            digest = hmac.new(self._key, data, hashlib.sha256).hexdigest()
        else:
            digest = hashlib.sha256(data).hexdigest()
        return f"[redacted {_TYPES.get(type(value), 'str')} {self.scheme}:{digest[:24]}]"

    # -- one apply per kind of record --------------------------------------------------------

    def value(self, kind: Kind, owner: str, value: Any) -> Any:
        """``value`` (JSON) with what the policy names under ``kind`` replaced by markers.

        Returns ``value`` itself when nothing in it is redacted; otherwise a copy (the
        value an agent holds is never changed).
        """
        return self._walk(kind, self._rules[kind], (owner,), value)

    def _walk(
        self,
        kind: Kind,
        rules: dict[str, list[tuple[str, ...]]],
        location: tuple[str, ...],
        value: Any,
    ) -> Any:
        if rules and (len(location) > 1 or kind != "state") and _matches(rules, location):
            return value if _is_marker(value) else self.mark(value)
        rule = self._rule
        if rule is not None and rule(Where(kind, location[0], location[1:]), value):
            return value if _is_marker(value) else self.mark(value)
        if isinstance(value, str):
            return self._text(value) if self._patterns else value
        if isinstance(value, dict):
            if kind == "state" and len(location) == 1 and "tool_calls" in value:
                value = self._tool_calls(value)
            entries: Iterable[tuple[Any, Any]] = value.items()
        elif isinstance(value, (list, tuple)):
            entries = enumerate(value)
        else:
            return value
        # Copied on the first change only: a value with nothing to redact is given back as is.
        changed: Any = None
        for key, item in entries:
            new = self._walk(kind, rules, (*location, str(key)), item)
            if new is not item:
                if changed is None:
                    changed = dict(value) if isinstance(value, dict) else list(value)
                changed[key] = new
        return value if changed is None else changed

    def _tool_calls(self, state: dict[str, Any]) -> dict[str, Any]:
        """A state's ``tool_calls`` with the tool paths applied to arguments and results."""
        calls = state["tool_calls"]
        if not isinstance(calls, list):
            return state
        changed: list[Any] | None = None
        for i, call in enumerate(calls):
            if not isinstance(call, dict) or not isinstance(call.get("tool"), str):
                continue
            tool = call["tool"]
            new = call
            arguments = call.get("arguments")
            redacted = self.value("tool_arguments", tool, arguments)
            if redacted is not arguments:
                new = {**new, "arguments": redacted}
            result = call.get("result")
            redacted = self.value("tool_result", tool, result)
            if redacted is not result:
                new = {**new, "result": redacted}
            if new is not call:
                if changed is None:
                    changed = list(calls)
                changed[i] = new
        return state if changed is None else {**state, "tool_calls": changed}

    def _text(self, text: str) -> str:
        for pattern in self._patterns:
            text = pattern.sub(
                lambda m: m.group() if _is_marker(m.group()) else self.mark(m.group()), text
            )
        return text

    def text(self, text: str) -> str:
        """Free text (a span's attribute, an error) with the policy's patterns masked."""
        return self._text(text) if self._patterns else text

    def tool_arguments(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """A tool's arguments as the ledger records and fingerprints them."""
        redacted: dict[str, Any] = self.value("tool_arguments", tool, arguments)
        return redacted

    def tool_result(self, tool: str, result: JsonValue) -> JsonValue:
        """A tool's result as the ledger records it."""
        redacted: JsonValue = self.value("tool_result", tool, result)
        return redacted

    def payload(self, receiver: str, payload: Any) -> Any:
        """A message's payload as the journal, the replay log and a snapshot record it."""
        if payload is None or type(payload) in {int, float, bool}:
            return payload
        return self.value("payload", receiver, payload)

    def state_text(self, agent: str, blob: StateBlob) -> StateBlob:
        """An agent's state, frozen as canonical JSON, with what the policy names redacted."""
        if not self._walk_always:
            data = blob.json.encode()
            if not any(needle in data for needle in self._needles):
                return blob
        value = blob.value()
        redacted = self.value("state", agent, value)
        if redacted is value:
            return blob
        return StateBlob(plain_canonical_json(redacted))

    def _cut(self, agent: str, cut: AgentCut) -> AgentCut:
        known = self._cuts.get((agent, cut.state_hash))
        if known is None:
            blob = self.state_text(agent, StateBlob(cut.state_json))
            known = cut.model_copy(update={"state_json": blob.json, "state_hash": blob.hash})
            if len(self._cuts) > 4096:
                self._cuts.clear()
            self._cuts[(agent, cut.state_hash)] = known
        if known.sent != cut.sent or known.received != cut.received:
            known = known.model_copy(update={"sent": cut.sent, "received": cut.received})
        return known

    def _channels(self, channels: list[ChannelRecord]) -> list[ChannelRecord]:
        out = []
        for record in channels:
            messages = [
                m.model_copy(update={"payload": payload})
                if (payload := self.payload(record.dst, m.payload)) is not m.payload
                else m
                for m in record.messages
            ]
            out.append(record.model_copy(update={"messages": messages}))
        return out

    def snapshot(self, snapshot: Snapshot) -> Snapshot:
        """A snapshot as the store keeps it: its states and messages in flight redacted.

        The redacted form of an agent's state is kept by its hash, so an agent whose state
        did not change since the last snapshot costs a dictionary look-up.
        """
        if not snapshot.agents and not snapshot.channels:
            return snapshot
        agents = {name: self._cut(name, cut) for name, cut in snapshot.agents.items()}
        return snapshot.model_copy(
            update={"agents": agents, "channels": self._channels(snapshot.channels)}
        )

    def part(self, part: SnapshotPart) -> SnapshotPart:
        """A distributed run's snapshot part as the store keeps it."""
        agents = {name: self._cut(name, cut) for name, cut in part.agents.items()}
        return part.model_copy(update={"agents": agents, "channels": self._channels(part.channels)})

    def model_call(
        self, agent: str, request: dict[str, Any], answer: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """A model call's request and answer, as JSON, as the ledger records them."""
        return (
            self.value("model_request", agent, request),
            self.value("model_answer", agent, answer),
        )


def _is_marker(value: object) -> bool:
    return isinstance(value, str) and _MARKER.fullmatch(value) is not None


def find_markers(value: Any) -> bool:
    """Whether a JSON value holds a marker anywhere (cheap when it holds none)."""
    if value is None or type(value) in {int, float, bool}:
        return False
    if isinstance(value, str):
        return _OPENING in value and _MARKER.search(value) is not None
    try:
        data = orjson.dumps(value)
    except TypeError:
        data = canonical_json(value).encode()
    return _OPENING_BYTES in data and _MARKER.search(data.decode()) is not None


def unredact(
    value: Any,
    kind: Kind,
    owner: str,
    redaction: Redaction | None,
    *,
    doing: str,
) -> Any:
    """``value`` with every marker replaced by what the policy's ``secret`` provider gives.

    For a value a resume or a rollback read back from the store. A value without markers is
    returned as it is, at the cost of a look for one.

    Args:
        value: JSON read back from the store.
        kind: What it is.
        owner: Its agent (or tool).
        redaction: The run's policy, whose ``secret`` is asked (``None``: nothing is).
        doing: What needs the value (for the error): ``"resume"``, ``"roll back"``...

    Raises:
        RedactedValueNeeded: A marker whose value no provider gave (or gave one that does
            not hash to it).
    """
    if not find_markers(value):
        return value
    return _restore(value, kind, owner, (), redaction, doing)


def unredact_snapshot(snapshot: Snapshot, redaction: Redaction | None, *, doing: str) -> Snapshot:
    """``snapshot`` read back from the store, every marker in it given back (see ``unredact``).

    Called before anything is put back, so that a cut that cannot be restored changes
    nothing. A snapshot without markers is returned as it is.

    Raises:
        RedactedValueNeeded: A marker whose value no provider gave.
    """
    agents = dict(snapshot.agents)
    for name, cut in snapshot.agents.items():
        if MARKED in cut.state_json:
            value = unredact(orjson.loads(cut.state_json), "state", name, redaction, doing=doing)
            blob = StateBlob(plain_canonical_json(value))
            agents[name] = cut.model_copy(update={"state_json": blob.json, "state_hash": blob.hash})
    channels = []
    for record in snapshot.channels:
        messages = list(record.messages)
        for i, m in enumerate(messages):
            if find_markers(m.payload):
                payload = unredact(m.payload, "payload", record.dst, redaction, doing=doing)
                messages[i] = m.model_copy(update={"payload": payload})
        channels.append(record.model_copy(update={"messages": messages}))
    return snapshot.model_copy(update={"agents": agents, "channels": channels})


def _restore(  # noqa: PLR0917
    value: Any,
    kind: Kind,
    owner: str,
    path: tuple[str, ...],
    redaction: Redaction | None,
    doing: str,
) -> Any:
    if isinstance(value, str):
        if _OPENING not in value:
            return value
        whole = _MARKER.fullmatch(value)
        if whole is not None:
            return _ask(Where(kind, owner, path, value), redaction, doing)
        return _MARKER.sub(
            lambda m: str(_ask(Where(kind, owner, path, m.group()), redaction, doing)), value
        )
    if isinstance(value, dict):
        return {
            k: _restore(v, kind, owner, (*path, str(k)), redaction, doing) for k, v in value.items()
        }
    if isinstance(value, list):
        return [
            _restore(v, kind, owner, (*path, str(i)), redaction, doing) for i, v in enumerate(value)
        ]
    return value


def _ask(where: Where, redaction: Redaction | None, doing: str) -> Any:
    assert where.marker is not None
    provider = redaction.secret if redaction is not None else None
    found = provider(where) if provider is not None else None
    if found is None:
        raise RedactedValueNeeded(
            where.kind, where.owner, ".".join(where.path), where.marker, doing, provided=False
        )
    assert redaction is not None
    if redaction.mark(found) != where.marker:
        raise RedactedValueNeeded(
            where.kind, where.owner, ".".join(where.path), where.marker, doing, provided=True
        )
    return found
