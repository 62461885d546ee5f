"""Each bad input gives an error of the right class that names the culprit and the fix."""

from __future__ import annotations

import asyncio
import math
import warnings
from collections.abc import Awaitable
from enum import Enum
from typing import Any, TypeVar

import pytest
from pydantic import BaseModel, ConfigDict, Field, computed_field, field_serializer

from agentsnap import (
    Agent,
    AgentsnapError,
    AgentState,
    ConfigurationError,
    Context,
    DuplicateAgentError,
    HandlerFailed,
    InvalidAgentName,
    Message,
    NotFoundError,
    PayloadNotSerializable,
    RunError,
    Runtime,
    RuntimeClosedError,
    ScheduleError,
    SnapshotFailed,
    SnapshotHandle,
    SnapshotInProgress,
    SnapshotStatus,
    StateNotSerializable,
    UnknownAgentError,
)
from agentsnap.messages import dumps_json, json_problem
from agentsnap.testing import ScriptedScheduler, assert_consistent, bus_of

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float = 5) -> T:
    """Await ``awaitable``, failing instead of hanging if a snapshot never completes."""
    async with asyncio.timeout(seconds):
        return await awaitable


# -- agents used below ------------------------------------------------------------------------


class CountState(AgentState):
    count: int = 0


class Counter(Agent[CountState]):
    """Counts the messages it handles; forwards to ``payload["to"]`` when there is one."""

    async def handle(self, message: Message, ctx: Context[CountState]) -> None:
        self.state.count += 1
        if isinstance(message.payload, dict) and isinstance(to := message.payload.get("to"), str):
            ctx.send(to, {"from": self.name})


class OtherState(AgentState):
    label: str = ""


class Caller(Agent[CountState]):
    """Sends to an agent that does not exist; catches the error when told to."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.caught: list[UnknownAgentError] = []

    async def handle(self, message: Message, ctx: Context[CountState]) -> None:
        self.state.count += 1
        if message.kind == "catch":
            try:
                ctx.send("nobody", {"hello": 1})
            except UnknownAgentError as exc:
                self.caught.append(exc)
        else:
            ctx.send("nobody", {"hello": 1})


class AnyState(AgentState):
    value: Any = None
    count: int = 0


class Mutator(Agent[AnyState]):
    """Puts whatever the test asks for into its Any-typed field."""

    async def handle(self, message: Message, ctx: Context[AnyState]) -> None:
        self.state.count += 1
        if message.kind == "poison":
            self.state.value = object()
        elif message.kind == "set":
            self.state.value = {1, 2}
        elif message.kind == "fix":
            self.state.value = {"ok": True}


class Flaky(Agent[CountState]):
    """Raises on messages of kind ``boom``, counts the others."""

    async def handle(self, message: Message, ctx: Context[CountState]) -> None:
        if message.kind == "boom":
            raise ValueError("kaboom: the flaky agent broke")
        self.state.count += 1


def declare_agent(param: Any) -> type[Agent[Any]]:
    """Declare ``class Bad(Agent[param])``; the declaration itself may raise."""

    class Bad(Agent[param]):
        async def handle(self, message: Message, ctx: Context[Any]) -> None:
            return None

    return Bad


# -- the exception tree -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "parent"),
    [
        (ConfigurationError, AgentsnapError),
        (InvalidAgentName, ConfigurationError),
        (DuplicateAgentError, ConfigurationError),
        (UnknownAgentError, ConfigurationError),
        (StateNotSerializable, ConfigurationError),
        (PayloadNotSerializable, ConfigurationError),
        (ScheduleError, ConfigurationError),
        (NotFoundError, AgentsnapError),
        (NotFoundError, LookupError),
        (RunError, AgentsnapError),
        (HandlerFailed, RunError),
        (SnapshotFailed, RunError),
        (RuntimeClosedError, RunError),
        (SnapshotInProgress, ConfigurationError),
        (SnapshotInProgress, RuntimeError),
    ],
)
def test_exception_tree(error: type[Exception], parent: type[Exception]) -> None:
    assert issubclass(error, parent)


# -- unknown agents ---------------------------------------------------------------------------


async def test_send_to_unknown_agent_raises_inside_the_handler() -> None:
    async with Runtime() as runtime:
        caller = Caller("alice")
        runtime.add(caller)
        runtime.send("alice", kind="catch")
        await runtime.run_until_idle()

    assert len(caller.caught) == 1
    error = caller.caught[0]
    assert isinstance(error, ConfigurationError)
    assert (error.sender, error.recipient, error.known) == ("alice", "nobody", ["alice"])
    text = str(error)
    assert "'alice'" in text
    assert "'nobody'" in text
    assert "register it with Runtime.add()" in text
    assert runtime.failures == []


async def test_uncaught_unknown_agent_becomes_handler_failed_naming_both_agents() -> None:
    async with Runtime() as runtime:
        runtime.add(Caller("alice"))
        sent = runtime.send("alice", kind="send")
        with pytest.raises(HandlerFailed) as info:
            await runtime.run_until_idle()

    failure = info.value
    assert failure.agent == "alice"
    assert failure.message == sent
    assert isinstance(failure.__cause__, UnknownAgentError)
    assert "'alice'" in str(failure)
    assert "'nobody'" in str(failure)
    assert "UnknownAgentError" in str(failure)
    assert runtime.failures == [failure]


async def test_a_handler_failure_says_where_it_happened_apart_from_the_errors_advice() -> None:
    async with Runtime() as runtime:
        runtime.add(Caller("alice"))
        runtime.send("alice", kind="send")
        with pytest.raises(HandlerFailed) as info:
            await runtime.run_until_idle()

    assert str(info.value) == (
        "agent 'alice' failed while handling message $env>alice#1 (kind 'send'). "
        "UnknownAgentError: 'alice' sent a message to 'nobody', which is not a registered "
        "agent (registered: 'alice'); register it with Runtime.add() before sending to it"
    )


async def test_runtime_send_to_unknown_agent_raises_at_once() -> None:
    async with Runtime() as runtime:
        runtime.add(Counter("alice"))
        with pytest.raises(UnknownAgentError) as info:
            runtime.send("nobody", {"x": 1})
        assert (info.value.sender, info.value.recipient) == ("$env", "nobody")
        assert "'nobody'" in str(info.value)
        assert "registered: 'alice'" in str(info.value)
        assert "register it with Runtime.add()" in str(info.value)
        # Nothing was queued and no channel to the unknown agent exists.
        assert ("$env", "nobody") not in bus_of(runtime).channels


async def test_runtime_send_with_no_agents_says_none_are_registered() -> None:
    async with Runtime() as runtime:
        with pytest.raises(UnknownAgentError, match=r"registered: none"):
            runtime.send("nobody")


async def test_agents_cannot_send_to_the_environment() -> None:
    class ToEnv(Agent[CountState]):
        async def handle(self, message: Message, ctx: Context[CountState]) -> None:
            ctx.send("$env", {"x": 1})

    async with Runtime() as runtime:
        runtime.add(ToEnv("alice"))
        runtime.send("alice")
        with pytest.raises(HandlerFailed) as info:
            await runtime.run_until_idle()
    assert isinstance(info.value.__cause__, UnknownAgentError)
    assert "'$env'" in str(info.value.__cause__)


async def test_snapshot_with_unknown_initiator_raises() -> None:
    async with Runtime() as runtime:
        runtime.add(Counter("alice"))
        with pytest.raises(UnknownAgentError, match=r"'ghost'"):
            runtime.snapshot(initiator="ghost")
        assert runtime.snapshots_in_progress == 0


# -- agent names ----------------------------------------------------------------------------


async def test_duplicate_agent_name() -> None:
    async with Runtime() as runtime:
        first = runtime.add(Counter("alice"))
        with pytest.raises(DuplicateAgentError) as info:
            runtime.add(Counter("alice"))
        assert info.value.name == "alice"
        assert "'alice'" in str(info.value)
        assert "give this one another name" in str(info.value)
        assert runtime.agents["alice"] is first
        assert list(runtime.agents) == ["alice"]


@pytest.mark.parametrize(
    "name",
    ["", "a b", "$env", "x" * 200, "x" * 129, ".hidden", "-dash", "tab\t", "é", 42, None],
    ids=[
        "empty",
        "space",
        "env",
        "200-chars",
        "129-chars",
        "dot",
        "dash",
        "tab",
        "e-acute",
        "int",
        "none",
    ],
)
def test_invalid_agent_name(name: Any) -> None:
    with pytest.raises(InvalidAgentName) as info:
        Counter(name)
    text = str(info.value)
    assert repr(name) in text
    assert "use 1 to 128 characters" in text


@pytest.mark.parametrize("name", ["a", "x" * 128, "agent_1.v-2", "_private", "0"])
def test_valid_agent_names(name: str) -> None:
    assert Counter(name).name == name


# -- agent state that is not JSON -----------------------------------------------------------------


class ObjectState(AgentState):
    payload: object = None


class DictState(AgentState):
    table: dict[Any, Any] = Field(default_factory=dict)


class FloatState(AgentState):
    ratio: float = 0.0


class StateAgent(Agent[AgentState]):
    """An agent with whatever state it is given."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        return None


@pytest.mark.parametrize(
    ("state", "field"),
    [
        (ObjectState(payload={1, 2}), "payload"),
        (ObjectState(payload=object()), "payload"),
        (ObjectState(payload=("a", "tuple")), "payload"),
        (AnyState(value=object()), "value"),
        (AnyState(value=b"bytes"), "value"),
        (DictState(table={1: "int key"}), "table"),
        (FloatState(ratio=math.nan), "ratio"),
        (FloatState(ratio=math.inf), "ratio"),
    ],
    ids=["set", "object", "tuple", "any-object", "bytes", "int-keys", "nan", "inf"],
)
async def test_state_not_serializable_at_registration(state: AgentState, field: str) -> None:
    async with Runtime() as runtime:
        with pytest.raises(StateNotSerializable) as info:
            runtime.add(StateAgent("keeper", state))
        assert "keeper" not in runtime.agents
    error = info.value
    assert (error.agent, error.field) == ("keeper", field)
    text = str(error)
    assert f"field {field!r} of agent 'keeper'" in text
    assert "use JSON types" in text


async def test_state_that_becomes_unserializable_fails_only_that_snapshot() -> None:
    async with Runtime() as runtime:
        runtime.add(Mutator("mutant"))
        runtime.add(Counter("bystander"))
        runtime.send("mutant", kind="tick")
        runtime.send("bystander", kind="tick")
        before = await within(runtime.snapshot())

        runtime.send("mutant", kind="poison")
        await runtime.run_until_idle()
        handle = runtime.snapshot()
        with pytest.raises(SnapshotFailed) as info:
            await within(handle)
        error = info.value
        assert error.snapshot_id == handle.id
        assert "field 'value' of agent 'mutant'" in error.reason
        assert "use JSON types" in error.reason
        assert error.reason in str(error)

        runtime.send("mutant", kind="fix")
        await runtime.run_until_idle()
        after = await within(runtime.snapshot())
        await runtime.run_until_idle()

        stored = await runtime.list_snapshots()
        assert [(s.seq, s.status) for s in stored] == [
            (1, SnapshotStatus.COMPLETE),  # the start snapshot, taken at the first input
            (2, SnapshotStatus.COMPLETE),
            (3, SnapshotStatus.FAILED),  # taken as the run went idle with the bad state
            (4, SnapshotStatus.FAILED),
            (5, SnapshotStatus.COMPLETE),  # taken as the run went idle, state fixed
            (6, SnapshotStatus.COMPLETE),
        ]
        failed = await runtime.store.load_snapshot(handle.id)
        assert failed.status is SnapshotStatus.FAILED
        assert failed.error == error.reason
        assert failed.agents == {}
        failed_at_idle = stored[2]
        assert failed_at_idle.initiator == "$env"
        assert failed_at_idle.error == error.reason
        assert failed_at_idle.agents == {}
        fixed_at_idle = stored[4]
        assert fixed_at_idle.initiator == "$env"
        assert fixed_at_idle.agents == after.agents

        # The earlier snapshots are untouched, the later one is whole again.
        start = stored[0]
        assert start.initiator == "$env"
        assert start.agents["mutant"].state["count"] == 0
        assert start.agents["bystander"].state["count"] == 0
        assert_consistent(start)
        assert await runtime.store.load_snapshot(before.id) == before
        assert before.agents["mutant"].state["value"] is None
        assert before.agents["mutant"].state["count"] == 1
        assert_consistent(before)
        assert after.agents["mutant"].state["value"] == {"ok": True}
        assert after.agents["mutant"].state["count"] == 3
        assert after.agents["bystander"].state["count"] == 1
        assert_consistent(after)


async def test_state_that_no_longer_survives_a_round_trip_fails_the_snapshot() -> None:
    # A set in an Any-typed field dumps to a JSON list, which would restore as a list.
    async with Runtime() as runtime:
        runtime.add(Mutator("mutant"))
        runtime.send("mutant", kind="set")
        await runtime.run_until_idle()
        with pytest.raises(SnapshotFailed) as info:
            await within(runtime.snapshot())
        assert "field 'value' of agent 'mutant'" in info.value.reason
        assert "round trip" in info.value.reason

        runtime.send("mutant", kind="fix")
        await runtime.run_until_idle()
        fixed = await within(runtime.snapshot())
        assert fixed.agents["mutant"].state["value"] == {"ok": True}


async def test_closing_a_runtime_never_started_still_stores_the_failed_snapshot() -> None:
    runtime = Runtime(scheduler=ScriptedScheduler())
    runtime.add(Counter("alice"))
    handle = runtime.snapshot()
    await runtime.close()
    with pytest.raises(SnapshotFailed, match=r"closed before the snapshot completed"):
        await within(handle)
    (stored,) = await runtime.store.list_snapshots(runtime.run_id)
    assert stored.status is SnapshotStatus.FAILED


def test_the_result_of_a_snapshot_in_progress_says_to_await_it() -> None:
    handle = SnapshotHandle("a-snapshot", 3, "$env")

    with pytest.raises(SnapshotInProgress) as info:
        handle.result()

    assert isinstance(info.value, RuntimeError)  # as it was before it had its own class
    assert info.value.seq == 3
    assert str(info.value).startswith("snapshot 3 is still in progress, so it has no result")
    assert "await the handle" in str(info.value)


# -- payloads that are not JSON ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (object(), "payload is an object"),
        ({1, 2}, "payload is a set"),
        (math.nan, "payload is nan"),
        (math.inf, "payload is inf"),
        ({1: "one"}, "payload has a key 1 that is not a string"),
        ((1, 2), "payload is a tuple"),
        ({"items": [1, {2}]}, "payload['items'][1] is a set"),
        ({"deep": {"x": [math.nan]}}, "payload['deep']['x'][0] is nan"),
        ({"deep": {("t",): 1}}, "payload['deep'] has a key ('t',)"),
    ],
    ids=[
        "object",
        "set",
        "nan",
        "inf",
        "int-key",
        "tuple",
        "nested-set",
        "nested-nan",
        "tuple-key",
    ],
)
async def test_payload_not_json_from_the_program(payload: object, problem: str) -> None:
    async with Runtime() as runtime:
        runtime.add(Counter("alice"))
        with pytest.raises(PayloadNotSerializable) as info:
            runtime.send("alice", payload)  # type: ignore[arg-type]  # not JSON, on purpose
        error = info.value
        assert (error.sender, error.recipient) == ("$env", "alice")
        text = str(error)
        assert problem in text
        assert "'$env'" in text
        assert "'alice'" in text
        assert "send JSON values" in text
        # The message was not sent: no sequence number was used.
        assert bus_of(runtime).channels["$env", "alice"].sent == 0
        assert runtime.send("alice", {"fine": 1}).seq == 1


async def test_payload_not_json_from_a_handler() -> None:
    class Sender(Agent[CountState]):
        def __init__(self, name: str) -> None:
            super().__init__(name)
            self.errors: list[PayloadNotSerializable] = []

        async def handle(self, message: Message, ctx: Context[CountState]) -> None:
            try:
                ctx.send("bob", {"when": {object()}})  # type: ignore[dict-item]  # on purpose
            except PayloadNotSerializable as exc:
                self.errors.append(exc)

    async with Runtime() as runtime:
        sender = Sender("alice")
        runtime.add(sender)
        runtime.add(Counter("bob"))
        runtime.send("alice")
        await runtime.run_until_idle()
        assert runtime.agents["bob"].state.count == 0

    (error,) = sender.errors
    assert (error.sender, error.recipient) == ("alice", "bob")
    assert "payload['when'] is a set" in str(error)


async def test_headers_must_be_strings() -> None:
    async with Runtime() as runtime:
        runtime.add(Counter("alice"))
        with pytest.raises(PayloadNotSerializable, match=r"header 'retries': 3"):
            runtime.send("alice", headers={"retries": 3})  # type: ignore[dict-item]


class Order(BaseModel):
    item: str
    quantity: int
    tags: list[str] = []


async def test_pydantic_payload_arrives_as_its_json_dict() -> None:
    received: list[object] = []

    class Receiver(Agent[CountState]):
        async def handle(self, message: Message, ctx: Context[CountState]) -> None:
            received.append(message.payload)

    async with Runtime() as runtime:
        runtime.add(Receiver("shop"))
        sent = runtime.send("shop", Order(item="tea", quantity=2, tags=["green"]))
        await runtime.run_until_idle()
        snapshot = await within(runtime.snapshot())

    assert sent.payload == {"item": "tea", "quantity": 2, "tags": ["green"]}
    assert received == [{"item": "tea", "quantity": 2, "tags": ["green"]}]
    assert type(received[0]) is dict
    assert_consistent(snapshot)


class Measurement(BaseModel):
    value: float


class Anything(BaseModel):
    value: Any = None


@pytest.mark.parametrize(
    ("payload", "problem"),
    [(Measurement(value=math.nan), "nan"), (Anything(value=object()), "object")],
    ids=["nan-field", "object-field"],
)
async def test_pydantic_payload_that_is_not_json_is_rejected(
    payload: BaseModel, problem: str
) -> None:
    # A pydantic model is sent as its JSON form, so that form must be JSON too: a NaN would
    # otherwise travel (and fail the snapshot that finds it in flight), and an unknown type
    # would surface as a raw pydantic error instead of agentsnap's.
    async with Runtime() as runtime:
        runtime.add(Counter("alice"))
        with pytest.raises(PayloadNotSerializable) as info:
            runtime.send("alice", payload)
        assert "'alice'" in str(info.value)
        assert problem in str(info.value)
        assert bus_of(runtime).channels["$env", "alice"].sent == 0


class Loose(BaseModel):
    model_config = ConfigDict(extra="allow")
    item: str = "tea"


class Scored(BaseModel):
    item: str = "tea"
    score: int = 0

    @field_serializer("score")
    def _score(self, score: int) -> Any:
        return math.nan if score < 0 else score


class Rated(BaseModel):
    rating: int = 0

    @field_serializer("rating")
    def _rating(self, rating: int) -> float:
        return math.nan if rating < 0 else rating


class Tally(BaseModel):
    count: int = 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def mean(self) -> int:
        return math.nan if self.count < 0 else self.count  # type: ignore[return-value]


class Counted(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="constants")
    count: int = 0


class Colour(Enum):
    RED = "red"


class Swatch(BaseModel):
    colour: Colour = Colour.RED
    names: dict[int, list[str]] = {}


def test_a_model_without_floats_or_untyped_values_is_known_to_dump_json() -> None:
    # Those are sent as their dump, unchecked; the others are checked after the dump.
    exact: list[type[BaseModel]] = [Order, Swatch, Tally, Counted]
    checked: list[type[BaseModel]] = [Measurement, Anything, Loose, Scored, Rated]
    assert [model for model in exact if dumps_json(model)] == exact
    assert [model for model in checked if dumps_json(model)] == []


@pytest.mark.parametrize(
    "payload",
    [
        Order.model_construct(item="tea", quantity=math.nan),  # type: ignore[arg-type]
        Loose(item="tea", weight=math.nan),
        Scored(score=-1),
        Rated(rating=-1),
        Tally(count=-1),
        Counted.model_construct(count=math.nan),  # type: ignore[arg-type]
    ],
    ids=[
        "unvalidated-field",
        "extra-field",
        "any-serializer",
        "float-serializer",
        "computed",
        "unvalidated-field-nan-kept",
    ],
)
async def test_a_nan_anywhere_in_a_model_never_travels(payload: BaseModel) -> None:
    # Pydantic's JSON mode writes a NaN as null where it infers a value's type (unless the
    # model says otherwise), and leaves it as it is where a float is declared: those are
    # refused.
    async with Runtime() as runtime:
        runtime.add(Counter("alice"))
        with warnings.catch_warnings():
            # Pydantic warns of a value that does not fit its field, as it dumps it.
            warnings.simplefilter("ignore", UserWarning)
            if isinstance(payload, Rated | Counted):
                with pytest.raises(PayloadNotSerializable, match="nan"):
                    runtime.send("alice", payload)
                assert bus_of(runtime).channels["$env", "alice"].sent == 0
            else:
                message = runtime.send("alice", payload)
                assert json_problem(message.payload) is None, message.payload


async def test_a_model_is_sent_as_its_json_form_whichever_way_it_is_checked() -> None:
    async with Runtime() as runtime:
        runtime.add(Counter("alice"))
        swatch = runtime.send("alice", Swatch(names={1: ["rouge"]}))
        tally = runtime.send("alice", Tally(count=3))
        await runtime.run_until_idle()
    assert swatch.payload == {"colour": "red", "names": {"1": ["rouge"]}}
    assert tally.payload == {"count": 3, "mean": 3}


# -- handlers that raise ----------------------------------------------------------------------


async def test_handler_failure_is_reported_and_the_others_keep_running() -> None:
    async with Runtime() as runtime:
        runtime.add(Flaky("flaky"))
        runtime.add(Counter("b"))
        runtime.add(Counter("c"))
        runtime.send("flaky", kind="ok")
        boom = runtime.send("flaky", kind="boom")
        for i in range(10):
            runtime.send("b", {"i": i})
            runtime.send("c", {"i": i, "to": "b"})
            runtime.send("flaky", kind="ok")
        with pytest.raises(HandlerFailed) as info:
            await runtime.run_until_idle()

        failure = info.value
        assert failure.agent == "flaky"
        assert failure.message is boom
        assert failure.message.id == "$env>flaky#2"
        assert isinstance(failure.__cause__, ValueError)
        assert str(failure.__cause__) == "kaboom: the flaky agent broke"
        text = str(failure)
        assert "'flaky'" in text
        assert "ValueError: kaboom" in text
        assert "$env>flaky#2" in text
        assert runtime.failures == [failure]

        # Everyone handled every message, the failing agent included.
        assert runtime.agents["flaky"].state.count == 11
        assert runtime.agents["b"].state.count == 20
        assert runtime.agents["c"].state.count == 10

        # Reported once: the next call has nothing new to raise.
        await runtime.run_until_idle()

        snapshot = await within(runtime.snapshot())
        assert snapshot.status is SnapshotStatus.COMPLETE
        assert_consistent(snapshot)
        assert snapshot.agents["flaky"].received == {"$env": 12}


async def test_run_until_idle_without_raising_failures() -> None:
    async with Runtime() as runtime:
        runtime.add(Flaky("flaky"))
        runtime.add(Counter("other"))
        runtime.send("flaky", kind="boom")
        runtime.send("flaky", kind="boom")
        runtime.send("other")
        await runtime.run_until_idle(raise_failures=False)

        assert [f.agent for f in runtime.failures] == ["flaky", "flaky"]
        assert [f.message.seq if f.message else None for f in runtime.failures] == [1, 2]
        assert all(isinstance(f.__cause__, ValueError) for f in runtime.failures)
        assert runtime.agents["other"].state.count == 1

        # Failures already passed over are not raised later.
        await runtime.run_until_idle()
        snapshot = await within(runtime.snapshot())
        assert_consistent(snapshot)


async def test_a_snapshot_requested_by_a_failing_handler_still_completes() -> None:
    class SnapAndFail(Agent[CountState]):
        async def handle(self, message: Message, ctx: Context[CountState]) -> None:
            self.state.count += 1
            handles.append(ctx.snapshot())
            raise RuntimeError("after asking for a snapshot")

    handles: list[Any] = []
    async with Runtime() as runtime:
        runtime.add(SnapAndFail("agent"))
        runtime.send("agent")
        with pytest.raises(HandlerFailed):
            await runtime.run_until_idle()
        async with asyncio.timeout(5):
            snapshot = await handles[0]
    # Recorded as the handler ended, with its state then: the message is consumed.
    assert snapshot.agents["agent"].state["count"] == 1
    assert snapshot.agents["agent"].received == {"$env": 1}
    assert snapshot.in_flight("$env", "agent") == []
    assert_consistent(snapshot)


# -- configuration mistakes -------------------------------------------------------------------


@pytest.mark.parametrize("param", [int, dict, BaseModel, Order], ids=lambda p: p.__name__)
def test_agent_declared_with_a_non_state_type(param: type) -> None:
    with pytest.raises(ConfigurationError) as info:
        declare_agent(param)
    text = str(info.value)
    assert f"Bad is declared as Agent[{param.__name__}]" in text
    assert "must be a subclass of agentsnap.AgentState" in text


@pytest.mark.parametrize(
    "param",
    [dict[str, int], list[CountState], CountState | None],
    ids=["dict-alias", "list-alias", "optional-state"],
)
def test_agent_declared_with_a_generic_non_state_type(param: Any) -> None:
    # Parameterised types are not classes, but they are no more a state type than ``dict``
    # is; declaring ``Agent[dict[str, int]]`` must not silently fall back to AgentState.
    with pytest.raises(ConfigurationError) as info:
        declare_agent(param)
    text = str(info.value)
    assert "Bad" in text
    assert "must be a subclass of agentsnap.AgentState" in text


def test_agent_declared_with_a_state_type_is_fine() -> None:
    assert declare_agent(CountState).state_type is CountState


def test_state_of_the_wrong_type() -> None:
    with pytest.raises(ConfigurationError) as info:
        Counter("alice", OtherState())  # type: ignore[arg-type]
    text = str(info.value)
    assert "'alice'" in text
    assert "Counter" in text
    assert "needs a state of type CountState" in text
    assert "got OtherState" in text


def test_state_that_is_not_a_model() -> None:
    with pytest.raises(ConfigurationError, match=r"got dict"):
        Counter("alice", {"count": 1})  # type: ignore[arg-type]


async def test_runtime_add_takes_only_agents() -> None:
    async with Runtime() as runtime:
        with pytest.raises(ConfigurationError, match=r"takes an agentsnap.Agent, got str"):
            runtime.add("alice")  # type: ignore[type-var]


async def test_closed_runtime_refuses_work() -> None:
    runtime = Runtime()
    runtime.add(Counter("alice"))
    await runtime.start()
    await runtime.close()
    await runtime.close()  # closing twice is harmless

    with pytest.raises(RuntimeClosedError, match=r"create a new Runtime"):
        runtime.add(Counter("bob"))
    with pytest.raises(RuntimeClosedError, match=r"create a new Runtime"):
        runtime.send("alice")
    with pytest.raises(RuntimeClosedError, match=r"create a new Runtime"):
        runtime.snapshot()
    with pytest.raises(RuntimeClosedError, match=r"create a new Runtime"):
        await runtime.start()
    with pytest.raises(RuntimeClosedError, match=r"create a new Runtime"):
        await runtime.run_until_idle()
    with pytest.raises(RuntimeClosedError):
        async with runtime:
            pass


async def test_closing_fails_snapshots_in_progress() -> None:
    scheduler = ScriptedScheduler()
    runtime = Runtime(scheduler=scheduler)
    runtime.add(Counter("alice"))
    await runtime.start()
    handle = runtime.snapshot()  # the marker to alice is never delivered
    assert runtime.snapshots_in_progress == 1
    await runtime.close()

    with pytest.raises(SnapshotFailed, match=r"closed before the snapshot completed"):
        await within(handle)
    (stored,) = await runtime.list_snapshots()
    assert stored.status is SnapshotStatus.FAILED


# -- scripted schedules -----------------------------------------------------------------------


async def test_scripted_deliver_on_an_empty_channel() -> None:
    scheduler = ScriptedScheduler()
    async with Runtime(scheduler=scheduler) as runtime:
        runtime.add(Counter("alice"))
        runtime.send("alice")
        await scheduler.deliver("$env", "alice")
        with pytest.raises(ScheduleError, match=r"nothing to deliver on channel \$env>alice"):
            await scheduler.deliver("$env", "alice")
        assert runtime.agents["alice"].state.count == 1


async def test_scripted_deliver_on_a_channel_that_does_not_exist() -> None:
    scheduler = ScriptedScheduler()
    async with Runtime(scheduler=scheduler) as runtime:
        runtime.add(Counter("alice"))
        runtime.add(Counter("bob"))
        with pytest.raises(ScheduleError) as info:
            await scheduler.deliver("alice", "bob")
        assert "alice>bob" in str(info.value)
        assert "nothing was sent on it yet" in str(info.value)
        with pytest.raises(ScheduleError, match=r"no channel alice>ghost"):
            await scheduler.deliver("alice", "ghost")


async def test_scripted_scheduler_not_attached() -> None:
    with pytest.raises(ScheduleError, match=r"not attached to a runtime"):
        await ScriptedScheduler().deliver("$env", "alice")


def test_a_generic_subclass_of_agent_given_the_state_type_names_it() -> None:
    S = TypeVar("S", bound=AgentState)

    class Named(Agent[S]):
        async def handle(self, message: Message, ctx: Context[S]) -> None:
            pass

    class Counting(Named[CountState]):
        pass

    assert Counting.state_type is CountState
    assert isinstance(Counting("agent").state, CountState)
    with pytest.raises(ConfigurationError, match=r"Wrong is declared as Named\[int\]"):

        class Wrong(Named[int]):  # type: ignore[type-var]
            pass
