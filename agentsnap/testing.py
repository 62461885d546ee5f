"""Test doubles for agentsnap users: schedulers, models and a consistency checker.

Models that need no network: [`ScriptedModel`][agentsnap.testing.ScriptedModel] answers by
rules (text, or whole answers with tool calls), the same answer every time;
[`SampledModel`][agentsnap.testing.SampledModel] answers like a sampled language model, with
another of its variants each time (another wording, other tool-call arguments);
[`FunctionModel`][agentsnap.testing.FunctionModel] answers with a function of the request.

The schedulers here deliver one item at a time and wait for its handler to finish before the
next, so a run is a pure function of the schedule:

* [`SeededScheduler`][agentsnap.testing.SeededScheduler] picks any deliverable item at random
  from a seeded generator: every interleaving is possible, and the seed reproduces one.
* [`ScriptedScheduler`][agentsnap.testing.ScriptedScheduler] delivers exactly what the test
  asks for, channel by channel, to replay a given schedule step by step.

Example:
    ```python
    from agentsnap import Runtime
    from agentsnap.testing import ScriptedScheduler

    scheduler = ScriptedScheduler()
    runtime = Runtime(scheduler=scheduler)
    # ... add agents, send messages, then:
    # await scheduler.deliver("$env", "alice")   # the next item from $env to alice
    ```
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Union

from agentsnap.bus import planned_channel
from agentsnap.exceptions import ScheduleError
from agentsnap.integrity import cut_problems
from agentsnap.models import ChatMessage, ModelRequest, ModelResponse, prompt_of

if TYPE_CHECKING:
    from agentsnap.bus import Bus, Channel, Deliver, Endpoint
    from agentsnap.messages import Marker, Message
    from agentsnap.records import Snapshot
    from agentsnap.runtime import Runtime

__all__ = [
    "FunctionModel",
    "SampledModel",
    "ScriptedModel",
    "ScriptedScheduler",
    "SeededScheduler",
    "SequentialScheduler",
    "assert_consistent",
    "bus_of",
    "cut_problems",
]


class SequentialScheduler:
    """Base of the deterministic schedulers: one delivery at a time, in the caller's order."""

    def __init__(self) -> None:
        self._bus: Bus | None = None
        self._deliver: Deliver | None = None
        # Channels that may hold items, in the order they last became non-empty.
        self._ready: dict[Channel, None] = {}
        self._paused = False
        self.steps = 0
        """Deliveries made so far."""

    def bind(self, bus: Bus, deliver: Deliver) -> None:  # noqa: D102
        self._bus = bus
        self._deliver = deliver

    def notify(self, channel: Channel) -> None:  # noqa: D102
        self._ready[channel] = None

    def added(self, endpoint: Endpoint) -> None:  # noqa: D102
        return None

    def start(self) -> None:  # noqa: D102
        return None

    async def close(self) -> None:  # noqa: D102
        return None

    def pause(self) -> None:  # noqa: D102
        self._paused = True

    def resume(self) -> None:  # noqa: D102
        self._paused = False

    def reset(self) -> None:  # noqa: D102
        self._ready.clear()

    def interrupt(self, endpoint: Endpoint) -> bool:  # noqa: D102
        return False  # the caller awaits each delivery: a rollback waits for it

    def at_rest(self, endpoint: Endpoint) -> bool:  # noqa: D102
        return False  # every delivery is the caller's: a snapshot sends markers

    def deliverable(self) -> list[Channel]:
        """Channels whose next item can be delivered now, in a stable order."""
        if self._paused:
            return []
        ready = [channel for channel in self._ready if channel]
        if len(ready) != len(self._ready):
            self._ready = dict.fromkeys(ready)
        bus = self._bus
        if bus is not None and ready and bus.replaying():
            # A process replaying a plan takes the next item of the channel it names only.
            allowed = [
                c for c in ready if not c.receiver.replay or planned_channel(c.receiver) is c
            ]
            if allowed:
                return allowed
            bus.replay_stalled()
        return ready

    def pending(self) -> list[Message | Marker]:
        """The next item of every deliverable channel."""
        return [channel[0] for channel in self.deliverable()]

    async def deliver_from(self, channel: Channel) -> Message | Marker:
        """Deliver the next item of ``channel`` and wait for its handler to return."""
        if self._deliver is None:
            raise ScheduleError("the scheduler is not attached to a runtime yet")
        if not channel:
            raise ScheduleError(f"nothing to deliver on channel {channel.src}>{channel.dst}")
        item = channel[0]
        self.steps += 1
        await self._deliver(channel)
        return item

    async def step(self) -> bool:
        """Deliver one item chosen by this scheduler; ``False`` when nothing is deliverable."""
        ready = self.deliverable()
        if not ready:
            return False
        await self.deliver_from(self.choose(ready))
        return True

    def choose(self, ready: list[Channel]) -> Channel:
        """Pick the channel to deliver from next (first come, first served here)."""
        return ready[0]

    async def run_until_idle(self) -> None:  # noqa: D102
        while await self.step():
            pass


class SeededScheduler(SequentialScheduler):
    """Delivers any deliverable item, chosen by a seeded random generator.

    The same seed, agents and inputs give the same run, so a failing schedule can be replayed
    from its seed.

    Args:
        seed: Seed of the generator.
    """

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed
        """The seed this scheduler was made with."""
        self.random = random.Random(seed)
        """The generator; tests may draw from it to interleave their own actions."""

    def choose(self, ready: list[Channel]) -> Channel:  # noqa: D102
        return ready[self.random.randrange(len(ready))]


class ScriptedScheduler(SequentialScheduler):
    """Delivers exactly what the test asks for.

    ``run_until_idle`` delivers in the order items were sent.
    """

    async def deliver(self, src: str, dst: str) -> Message | Marker:
        """Deliver the next item on channel ``src -> dst`` and wait for its handler.

        Returns:
            The item delivered: a message, or a snapshot marker.

        Raises:
            ScheduleError: The channel does not exist or is empty.
        """
        if self._bus is None:
            raise ScheduleError("the scheduler is not attached to a runtime yet")
        channel = self._bus.channels.get((src, dst))
        if channel is None:
            raise ScheduleError(f"there is no channel {src}>{dst}: nothing was sent on it yet")
        return await self.deliver_from(channel)

    def queued(self, src: str, dst: str) -> list[Message | Marker]:
        """The items waiting on channel ``src -> dst``, oldest first."""
        if self._bus is None:
            return []
        channel = self._bus.channels.get((src, dst))
        return list(channel) if channel is not None else []


Answer = Union[str, ModelResponse]  # noqa: UP007 (a runtime alias, for Python 3.11)
"""What a test model answers: text, or a whole answer (tool calls, output, usage)."""


def _response(answer: Answer) -> ModelResponse:
    return answer if isinstance(answer, ModelResponse) else ModelResponse(text=answer)


class _RuleModel:
    """What the rule-answering test models share: both protocols, over one ``_answer``."""

    prompts: list[str]

    async def complete(self, prompt: str) -> str:
        """The text of the answer to ``prompt``.

        Raises:
            ScheduleError: No rule matches; the message shows the start of the prompt.
        """
        return (await self._answer(prompt)).text

    async def respond(self, request: ModelRequest) -> ModelResponse:
        """The answer to the conversation, read as one prompt (one line per message).

        Raises:
            ScheduleError: No rule matches.
        """
        return await self._answer(prompt_of(request))

    async def _answer(self, prompt: str) -> ModelResponse:
        raise NotImplementedError


class ScriptedModel(_RuleModel):
    """A stand-in for a language model: canned answers, chosen by what the prompt contains.

    The first rule whose text occurs in the prompt gives the answer, so the same prompt always
    gets the same answer, however often it is asked (an agent re-running after a rollback
    asks again), and a prompt that carries feedback can be answered differently. An answer
    is text, or a [`ModelResponse`][agentsnap.ModelResponse] with tool calls; asked with a
    conversation (``respond``), the rules look at the whole conversation, one line per
    message.

    Example:
        ```python
        import asyncio
        from agentsnap.testing import ScriptedModel

        model = ScriptedModel([("Feedback:", "a better draft"), ("Write", "a first draft")])
        assert asyncio.run(model.complete("Write about cuts")) == "a first draft"
        ```

    Args:
        rules: ``(text to look for, answer)`` pairs, tried in order.
        delay: Seconds each answer takes, as a real model's would (other agents run
            meanwhile); none by default.
        name: The model's name in its answers.

    Attributes:
        prompts: Every prompt asked so far, oldest first.
    """

    def __init__(
        self,
        rules: Sequence[tuple[str, Answer]],
        *,
        delay: float = 0.0,
        name: str = "scripted",
    ) -> None:
        self.rules = list(rules)
        self.delay = delay
        self.name = name
        self.prompts: list[str] = []

    async def _answer(self, prompt: str) -> ModelResponse:
        self.prompts.append(prompt)
        if self.delay:
            await asyncio.sleep(self.delay)
        for needle, answer in self.rules:
            if needle in prompt:
                response = _response(answer)
                return (
                    response if response.model else response.model_copy(update={"model": self.name})
                )
        raise ScheduleError(
            f"the scripted model has no answer for the prompt {prompt[:80]!r}...; add a rule "
            "whose text occurs in it"
        )


class SampledModel(_RuleModel):
    """A stand-in for a sampled language model: each call picks one of several answers.

    Like a real model at a temperature above zero, asking twice gets different words (or
    different tool-call arguments): the first rule whose text occurs in the prompt gives its
    variants, and a random generator picks one. A handler that is re-executed and asks again
    gets another answer unless its calls are recorded, which is what the tests of recorded
    model calls need.

    Example:
        ```python
        import asyncio
        from agentsnap.testing import SampledModel

        model = SampledModel([("email", ["Hi Ann,", "Dear Ann,", "Hello Ann,"])], seed=7)
        print(asyncio.run(model.complete("write the email")))
        ```

    Args:
        rules: ``(text to look for, answers to pick from)`` pairs, tried in order.
        seed: Seed of the generator (default: a new sequence every run).
        delay: Seconds each answer takes.
        name: The model's name in its answers.

    Attributes:
        calls: How many times the model was asked.
        prompts: Every prompt asked so far, oldest first.
    """

    def __init__(
        self,
        rules: Sequence[tuple[str, Sequence[Answer]]],
        *,
        seed: int | None = None,
        delay: float = 0.0,
        name: str = "sampled",
    ) -> None:
        for needle, answers in rules:
            if not answers:
                raise ScheduleError(f"the sampled model's rule {needle!r} has no answers")
        self.rules = [(needle, list(answers)) for needle, answers in rules]
        self.random = random.Random(seed)
        self.delay = delay
        self.name = name
        self.calls = 0
        self.prompts: list[str] = []

    async def _answer(self, prompt: str) -> ModelResponse:
        self.calls += 1
        self.prompts.append(prompt)
        if self.delay:
            await asyncio.sleep(self.delay)
        for needle, answers in self.rules:
            if needle in prompt:
                response = _response(self.random.choice(answers))
                return (
                    response if response.model else response.model_copy(update={"model": self.name})
                )
        raise ScheduleError(
            f"the sampled model has no answer for the prompt {prompt[:80]!r}...; add a rule "
            "whose text occurs in it"
        )


class FunctionModel:
    """A stand-in for a language model whose answers a function computes.

    ``function(request)`` (sync or async) returns text or a
    [`ModelResponse`][agentsnap.ModelResponse]; it can look at the whole conversation, the
    tools offered and the settings, and use any randomness it likes.

    Args:
        function: Computes the answer to a request.
        name: The model's name in its answers.

    Attributes:
        requests: Every request asked so far, oldest first.
    """

    def __init__(
        self,
        function: Callable[[ModelRequest], Answer | Awaitable[Answer]],
        *,
        name: str = "function",
    ) -> None:
        self.function = function
        self.name = name
        self.requests: list[ModelRequest] = []

    async def complete(self, prompt: str) -> str:
        """The text the function answers to a one-message conversation."""
        request = ModelRequest(messages=(ChatMessage(role="user", content=prompt),))
        return (await self.respond(request)).text

    async def respond(self, request: ModelRequest) -> ModelResponse:
        """What the function answers to ``request``."""
        self.requests.append(request)
        answer = self.function(request)
        if inspect.isawaitable(answer):
            answer = await answer
        response = _response(answer)
        return response if response.model else response.model_copy(update={"model": self.name})


def assert_consistent(snapshot: Snapshot) -> None:
    """Raise ``AssertionError`` listing every way ``snapshot`` is not a consistent cut."""
    problems = cut_problems(snapshot)
    if problems:
        raise AssertionError(
            f"snapshot {snapshot.seq} ({snapshot.id}) is not a consistent cut:\n  "
            + "\n  ".join(problems)
        )


def bus_of(runtime: Runtime) -> Bus:
    """The bus of ``runtime``: its processes, channels and their counters, for a test to look at.

    The bus is the runtime's own: what a test reads here (channels, counters, epochs) or adds
    (a [`BusObserver`][agentsnap.bus.BusObserver] with ``observe``) is not a stable API, and
    changing it under a running runtime breaks its guarantees.
    """
    return runtime._bus
