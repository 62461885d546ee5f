"""A snapshot costs what changed: unchanged states are not encoded again, changed ones are.

Also the fast canonical JSON of states: orjson writes the same bytes as the standard library
(so content hashes of stored states do not change), and the standard library takes over
where orjson cannot represent a value or would write it differently.
"""

from __future__ import annotations

import enum
import functools
import json
import uuid
import warnings
from collections.abc import Callable
from typing import Any, Literal

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    computed_field,
    field_serializer,
    field_validator,
)

import agentsnap.snapshot
from agentsnap import (
    Agent,
    AgentState,
    ConfigurationError,
    Context,
    Message,
    RollbackInfo,
    Runtime,
    Snapshot,
    SnapshotPolicy,
    tool,
)
from agentsnap.exceptions import StateNotSerializable
from agentsnap.state import (
    PlanStep,
    StateBlob,
    ToolCallRecord,
    canonical_json,
    content_hash,
    encode_checked,
    encode_state,
    plain_canonical_json,
    round_trip_is_identity,
)

# -- canonical JSON: orjson and the standard library agree -----------------------------------


def stdlib_canonical(value: Any) -> str:
    """The canonical form as the standard library writes it (the form stored so far)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: beyond 64 bits too
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=10), children, max_size=6)
    ),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_orjson_writes_the_same_canonical_json_as_the_standard_library(value: Any) -> None:
    assert plain_canonical_json(value) == stdlib_canonical(value) == canonical_json(value)


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_finite_float_comes_out_as_the_standard_library_writes_it(value: float) -> None:
    assert plain_canonical_json([value, {"f": value}]) == stdlib_canonical([value, {"f": value}])


@pytest.mark.parametrize(
    "value",
    [
        2**64,  # beyond orjson's integers
        -(2**63) - 1,
        {"big": [10**30, -(10**30)]},
        {2: "two", 1: "one"},  # keys that are not strings
        {"a": {3: None}},
        "\ud800 a lone surrogate",
        1e-7,  # orjson: 1e-7, the standard library: 1e-07
        1.5e-5,  # orjson: 0.000015
        -9.999e-9,
        {"note": "re-run with e-mail 0.0000 here"},  # the float marks inside a string
    ],
)
def test_the_standard_library_takes_over_where_orjson_differs(value: Any) -> None:
    assert plain_canonical_json(value) == stdlib_canonical(value)


@pytest.mark.parametrize(
    "value",
    [
        {"note": None, "ratio": float("nan")},  # None beside a NaN: both would be null
        [None, float("inf")],
        {"deep": [{"key": None}, {"x": -float("inf")}]},
    ],
)
def test_a_non_finite_float_beside_none_is_refused(value: Any) -> None:
    with pytest.raises(ValueError, match="JSON compliant"):
        plain_canonical_json(value)


def test_none_is_written_as_null() -> None:
    value: Any = {"note": None, "steps": [{"key": None, "n": 1.5}], "text": "null"}
    assert plain_canonical_json(value) == stdlib_canonical(value)


def test_what_neither_writes_is_still_refused() -> None:
    not_json: Any = {"x": object()}
    mixed_keys: Any = {1: "a", "b": 2}  # cannot be sorted
    with pytest.raises(TypeError):
        plain_canonical_json(not_json)
    with pytest.raises(TypeError):
        plain_canonical_json(mixed_keys)


class FixedState(AgentState):
    balance: int = 0
    ratio: float = 0.0
    tags: list[str] = Field(default_factory=list)


def fixed_state() -> FixedState:
    return FixedState(
        memory={"name": "Zoë", "n": [1, 2.5, None, True], "z": {"b": 1, "a": "\u2028"}},
        balance=2**70,
        ratio=1e-7,
        tags=["x", "émoji 🎉", 'quote " and \\ slash', "tab\there"],
        tool_calls=[ToolCallRecord(tool="search", arguments={"q": "w", "limit": 3})],
    )


# The hash of fixed_state() as the standard library encoded it before orjson did, and before
# tool-call records said whether they were replayed.
FIXED_STATE_HASH = "d97896c8dd7334774610c629951b99dd429cb2be24671d037d0fa3f5047a5362"
REPLAYED_FIELD = ',"replayed":false'


def test_the_content_hash_of_a_stored_state_does_not_change() -> None:
    state = fixed_state()
    stdlib = stdlib_canonical(state.model_dump(mode="json"))
    blob = encode_state("teller", state)
    assert blob.json == stdlib
    assert blob.hash == content_hash(stdlib)
    # Nothing else about the text changed since.
    assert stdlib.count(REPLAYED_FIELD) == 1
    assert content_hash(stdlib.replace(REPLAYED_FIELD, "")) == FIXED_STATE_HASH
    small = encode_state("teller", AgentState(memory={"count": 3}))
    assert small.hash == StateBlob('{"memory":{"count":3},"plan":[],"tool_calls":[]}').hash


# -- dirty tracking ---------------------------------------------------------------------------


class CountState(AgentState):
    count: int = 0
    note: str = ""


class Counter(Agent[CountState]):
    async def handle(self, message: Message, ctx: Context[CountState]) -> None:
        self.state.count += 1


class Rollbacker(Agent[CountState]):
    async def handle(self, message: Message, ctx: Context[CountState]) -> None:
        self.state.count += 1

    async def on_rollback(self, rollback: RollbackInfo, ctx: Context[CountState]) -> None:
        self.state.note = f"rolled back: {rollback.reason}"


@pytest.fixture
def encoded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the agents whose states the snapshot coordinator encodes, in order."""
    calls: list[str] = []
    real = encode_checked

    def counting(agent: str, state: BaseModel, verified: str | None = None) -> StateBlob:
        calls.append(agent)
        return real(agent, state, verified)

    monkeypatch.setattr(agentsnap.snapshot, "encode_checked", counting)
    return calls


def quiet() -> Runtime:
    return Runtime(snapshot_policy=SnapshotPolicy(at_start=False, at_end=False))


def count_of(snapshot: Snapshot, agent: str) -> Any:
    return snapshot.agents[agent].state["count"]


async def test_an_unchanged_agent_is_not_encoded_again(encoded: list[str]) -> None:
    async with quiet() as runtime:
        agents = [runtime.add(Counter(f"c{i}")) for i in range(10)]
        runtime.send("c0", {})
        await runtime.run_until_idle()
        first = await runtime.snapshot()
        assert sorted(encoded) == sorted(a.name for a in agents)
        encoded.clear()
        runtime.send("c3", {})
        runtime.send("c3", {})
        await runtime.run_until_idle()
        second = await runtime.snapshot()
        assert encoded == ["c3"]
        encoded.clear()
        third = await runtime.snapshot()  # nothing delivered since
        assert encoded == []
    assert count_of(first, "c3") == 0
    assert count_of(second, "c3") == count_of(third, "c3") == 2
    assert count_of(third, "c0") == 1
    for name in ("c0", "c5"):
        assert second.agents[name].state_hash == first.agents[name].state_hash


async def test_assigning_the_state_marks_it(encoded: list[str]) -> None:
    async with quiet() as runtime:
        counter = runtime.add(Counter("c"))
        await runtime.snapshot()
        encoded.clear()
        counter.state = CountState(count=41)
        snapshot = await runtime.snapshot()
    assert encoded == ["c"]
    assert count_of(snapshot, "c") == 41


async def test_a_change_in_place_outside_handlers_needs_mark_changed(encoded: list[str]) -> None:
    async with quiet() as runtime:
        counter = runtime.add(Counter("c"))
        runtime.add(Counter("d"))
        await runtime.snapshot()
        counter.state.count = 5
        unmarked = await runtime.snapshot()  # the rule: nothing said the state changed
        runtime.mark_changed("c")
        encoded.clear()
        marked = await runtime.snapshot()
        assert encoded == ["c"]
        counter.state.count = 6
        runtime.context("c").mark_changed()
        via_context = await runtime.snapshot()
        with pytest.raises(ConfigurationError, match="no agent 'nobody'"):
            runtime.mark_changed("nobody")
    assert count_of(unmarked, "c") == 0
    assert count_of(marked, "c") == 5
    assert count_of(via_context, "c") == 6


async def test_a_change_made_before_the_first_snapshot_is_recorded() -> None:
    async with quiet() as runtime:
        counter = runtime.add(Counter("c"))
        counter.state.count = 3  # registered, and never recorded yet
        snapshot = await runtime.snapshot()
    assert count_of(snapshot, "c") == 3


async def test_an_agent_added_later_is_recorded(encoded: list[str]) -> None:
    async with quiet() as runtime:
        runtime.add(Counter("c"))
        await runtime.snapshot()
        encoded.clear()
        runtime.add(Counter("late", CountState(count=9)))
        snapshot = await runtime.snapshot()
    assert encoded == ["late"]
    assert count_of(snapshot, "late") == 9


async def test_a_rollback_and_on_rollback_are_recorded(encoded: list[str]) -> None:
    async with quiet() as runtime:
        runtime.add(Rollbacker("r"))
        counter = runtime.add(Counter("c"))
        runtime.send("r", {})
        runtime.send("c", {})
        await runtime.run_until_idle()
        cut = await runtime.snapshot()
        counter.state.count = 50
        runtime.mark_changed("c")
        before = await runtime.snapshot()
        await runtime.rollback(cut.id, reason="again")
        encoded.clear()
        after = await runtime.snapshot()
    assert sorted(encoded) == ["c", "r"]  # restored states are encoded again
    assert count_of(before, "c") == 50
    assert count_of(after, "r") == count_of(after, "c") == 1
    assert after.agents["r"].state["note"] == "rolled back: again"
    assert after.agents["c"].state_hash == cut.agents["c"].state_hash


@tool
async def lookup(query: str) -> str:
    return f"found {query}"


async def test_a_tool_called_outside_handlers_is_recorded() -> None:
    async with quiet() as runtime:
        runtime.add(Counter("c"))
        await runtime.snapshot()
        await lookup(runtime.context("c"), query="x")
        snapshot = await runtime.snapshot()
    calls = snapshot.agents["c"].state["tool_calls"]
    assert isinstance(calls, list)
    (call,) = calls
    assert isinstance(call, dict)
    assert call["status"] == "ok"
    assert call["result"] == "found x"


class MaybeNumber(AgentState):
    value: float | None = None


async def test_a_nan_where_none_was_recorded_fails_the_snapshot_and_is_never_stored_as_none() -> (
    None
):
    """orjson writes NaN as null; a state whose field held None before must not pass as null."""
    from agentsnap.exceptions import SnapshotFailed

    class Holder(Agent[MaybeNumber]):
        async def handle(self, message: Message, ctx: Context[MaybeNumber]) -> None:
            self.state.value = float("nan")

    async with Runtime() as runtime:
        runtime.add(Holder("holder"))
        await runtime.snapshot()  # records value=None, verified
        runtime.send("holder", 1)
        await runtime.run_until_idle()
        with pytest.raises(SnapshotFailed, match="holder"):
            await runtime.snapshot()


class Loose(AgentState):
    bag: Any = None


@pytest.mark.parametrize("verified", [False, True])
def test_an_encoding_that_skips_the_read_back_still_refuses_a_nan(verified: bool) -> None:
    """Without a verified text the round trip finds the NaN; with one, the read back does."""
    state = MaybeNumber(value=float("nan"))
    known = content_hash(canonical_json(MaybeNumber().model_dump(mode="json")))
    with pytest.raises(StateNotSerializable, match="value"):
        encode_checked("holder", state, known if verified else None)


def test_encode_checked_writes_what_encode_state_writes_and_checks_the_round_trip() -> None:
    state = Counter("c").state
    state.memory["none"] = None
    blob = encode_checked("c", state)
    assert blob.json == encode_state("c", state).json
    assert encode_checked("c", state, blob.hash).hash == blob.hash
    with pytest.raises(StateNotSerializable, match="bag"):
        encode_checked("l", Loose(bag={1, 2}))  # a set comes back a list


# -- the round trip, checked per class where the schema does not already show it -------------


class Plain(AgentState):
    count: int = 0
    ratio: float = 0.0
    mood: Literal["calm", "busy"] = "calm"
    tags: list[str] = Field(default_factory=list)
    scores: dict[str, float] = Field(default_factory=dict)
    note: str | None = None


class Mode(enum.Enum):
    FAST = "fast"


class Doubled(AgentState):
    """Writes ``count`` doubled: a serializer whose JSON does not come back the same."""

    count: int = 1

    @field_serializer("count")
    def _double(self, value: int) -> int:
        return value * 2


class Trimmed(AgentState):
    """Changes ``name`` as it reads it back: a validator the round trip does not survive."""

    name: str = ""

    @field_validator("name")
    @classmethod
    def _trim(cls, value: str) -> str:
        return value.strip()


class Aliased(AgentState):
    name: str = Field(default="", alias="title")


class Bounded(AgentState):
    count: int = Field(default=0, ge=0)


class Private(AgentState):
    _cache: dict[str, int] = PrivateAttr(default_factory=dict)


class Computed(AgentState):
    @computed_field  # type: ignore[prop-decorator]
    @property
    def size(self) -> int:
        return len(self.memory)


class StepWithOwner(PlanStep):
    owner: str = "me"


def test_a_plain_state_class_is_known_to_survive_json_by_its_schema() -> None:
    assert round_trip_is_identity(AgentState)
    assert round_trip_is_identity(Plain)
    assert round_trip_is_identity(Counter("c").state.__class__)


@pytest.mark.parametrize("model", [Doubled, Trimmed, Aliased, Bounded, Private, Computed])
def test_a_class_with_validators_serializers_or_constraints_is_checked_in_full(
    model: type[BaseModel],
) -> None:
    assert not round_trip_is_identity(model)


def test_a_plain_state_is_not_validated_again(monkeypatch: pytest.MonkeyPatch) -> None:
    validated: list[str] = []
    real = BaseModel.model_validate_json.__func__  # type: ignore[attr-defined]

    def counting(cls: type[BaseModel], /, data: str | bytes, **options: Any) -> BaseModel:
        validated.append(cls.__name__)
        result: BaseModel = real(cls, data, **options)
        return result

    monkeypatch.setattr(BaseModel, "model_validate_json", classmethod(counting))
    state = Plain(count=3, ratio=0.5, tags=["a"], scores={"x": 1.5}, note="n")
    state.memory["facts"] = {"list": [1, 2.5, "three", None, True]}
    state.plan.append(PlanStep(description="step", status="done"))
    state.tool_calls.append(ToolCallRecord(tool="search", arguments={"q": "x"}, result=[1]))
    read_back: list[bytes | str] = []
    real_loads = orjson.loads

    def reading(data: bytes | str) -> Any:
        read_back.append(data)
        return real_loads(data)

    monkeypatch.setattr(orjson, "loads", reading)
    blob = encode_checked("p", state)
    assert validated == []
    assert read_back == []  # its values are exact JSON: the text is not read back either
    monkeypatch.setattr(orjson, "loads", real_loads)
    assert blob.json == encode_state("p", state).json  # the same text, so the same hash
    assert Plain.model_validate_json(blob.json) == state
    validated.clear()

    encode_checked("t", Trimmed(name="x"))
    assert validated == ["Trimmed"]


def test_a_serializer_that_does_not_survive_json_is_still_caught() -> None:
    with pytest.raises(StateNotSerializable, match="round trip"):
        encode_checked("d", Doubled(count=2))
    trimmed = Trimmed()
    trimmed.name = " padded "  # assigned without validation: reads back trimmed
    with pytest.raises(StateNotSerializable, match="name"):
        encode_checked("t", trimmed)


def _with(change: Callable[[Plain], None]) -> Plain:
    state = Plain()
    state.plan.append(PlanStep(description="step"))
    change(state)
    return state


def _refused(change: Callable[[Plain], None], field: str) -> None:
    """``change`` makes a plain state that encoding refuses, naming ``field`` if it can."""
    state = _with(change)
    with pytest.raises(StateNotSerializable) as info:
        encode_checked("p", state)
    assert info.value.field in {field, None}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda s: s.memory.update(pair=(1, 2)), "memory"),  # a tuple comes back a list
        (lambda s: s.memory.update(deep={"a": [{"b": [1, (2,)]}]}), "memory"),  # deep inside
        (lambda s: s.memory.update(mode=Mode.FAST), "memory"),  # comes back its value
        (lambda s: s.memory.update(id=uuid.UUID(int=7)), "memory"),  # comes back a string
        (lambda s: s.plan[0].__dict__.update(note=("a",)), "plan"),  # in a nested model
        (lambda s: s.tool_calls.append(ToolCallRecord(tool="t", result=(1,))), "tool_calls"),
        (
            lambda s: s.tool_calls.append(ToolCallRecord(tool="t", arguments={"x": {1, 2}})),
            "tool_calls",
        ),
        (lambda s: s.memory.update(step=PlanStep(description="x")), "memory"),  # a dict
        (lambda s: s.memory.update(value=float("nan")), "memory"),  # written as null
        (lambda s: setattr(s, "ratio", float("inf")), "ratio"),
        (lambda s: s.scores.update(x=float("nan")), "scores"),
        (lambda s: setattr(s, "mood", "angry"), "mood"),  # not one of the literal's values
        (lambda s: setattr(s.plan[0], "status", "lost"), "plan"),
        (lambda s: setattr(s, "count", "three"), "count"),  # not an int
        (lambda s: s.tags.append(3), "tags"),
        (lambda s: s.plan.append(StepWithOwner(description="y")), "plan"),  # comes back a PlanStep
    ],
)
# The full check that takes over writes what pydantic warns about first, as it always did.
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")
def test_a_plain_class_changed_in_place_to_what_json_cannot_carry_is_refused(
    change: Callable[[Plain], None], field: str
) -> None:
    _refused(change, field)


class Remembering(AgentState):
    """Keeps a derived value in the instance's ``__dict__`` once it is read."""

    tags: list[str] = Field(default_factory=list)

    @functools.cached_property
    def first(self) -> str:
        return self.tags[0] if self.tags else ""


def test_a_plain_state_encodes_its_fields_and_nothing_else() -> None:
    state = Remembering(tags=["a", "b"])
    assert state.first == "a"  # now held beside the fields
    blob = encode_checked("r", state)
    assert blob.json == encode_state("r", state).json
    assert "first" not in orjson.loads(blob.json)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda s: setattr(s, "tags", ("a", "b")), "tags"),  # a tuple comes back a list
        (lambda s: setattr(s, "note", Mode.FAST), "note"),  # an enum member, not a str
        (lambda s: setattr(s.plan[0], "description", uuid.UUID(int=1)), "plan"),
    ],
)
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")
def test_a_value_not_of_its_fields_type_is_checked_in_full(
    change: Callable[[Plain], None], field: str
) -> None:
    _refused(change, field)


def test_a_value_of_a_looser_type_that_comes_back_equal_is_encoded_as_before() -> None:
    # A bool where an int is declared reads back as an equal int: the full check takes
    # over and accepts it, with the text pydantic writes.
    state = _with(lambda s: setattr(s, "count", True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = encode_state("p", state).json
        assert encode_checked("p", state).json == expected
