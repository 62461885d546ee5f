"""Run an SDK agent, and the agents it hands off to, as a team of agentsnap agents."""

from __future__ import annotations

import asyncio
import contextlib
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from agents import Agent as SDKAgent
from agents import RunConfig
from agents.handoffs import Handoff
from agents.stream_events import StreamEvent

from agentsnap.agents import Agent, Context
from agentsnap.exceptions import ConfigurationError
from agentsnap.integrations import require_keywords
from agentsnap.integrations.openai_agents._agent import OnEvent, OpenAIAgent, agent_name
from agentsnap.integrations.openai_agents._model import as_json
from agentsnap.messages import JsonValue, Message
from agentsnap.rollback import RetryPolicy
from agentsnap.runtime import Runtime
from agentsnap.state import AgentState
from agentsnap.store import Store

__all__ = ["OUTPUTS", "AgentsnapRunner", "TeamResult", "TeamStream", "team"]

OUTPUTS = "outputs"
"""The name of the agent that keeps the team's final outputs, in runs made by
[`AgentsnapRunner`][agentsnap.integrations.openai_agents.AgentsnapRunner]."""


class _Outputs(Agent[AgentState]):
    """Keeps the final outputs sent to it, in order, in ``memory["outputs"]``."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        kept = self.state.memory.setdefault("outputs", [])
        assert isinstance(kept, list)
        kept.append(message.payload)


@dataclass(frozen=True)
class TeamResult:
    """What a run of an SDK agent's team came to."""

    run_id: str
    """The agentsnap run: ``agentsnap show``, ``model-calls``, ``tools`` take it."""
    final_output: JsonValue
    """The final output of the agent that answered last, as JSON (``None``: no answer)."""
    last_agent: str | None
    """The SDK agent that answered last."""
    outputs: tuple[JsonValue, ...]
    """Every final output the team sent, in order (one per input)."""
    rollbacks: int
    """How many rollbacks the run made in this process."""


class _AgentOptions(TypedDict, total=False):
    """How every SDK agent of a team runs: options of
    [`OpenAIAgent`][agentsnap.integrations.openai_agents.OpenAIAgent], which keeps their
    defaults.
    """  # noqa: D205

    read_only: Collection[str]
    """Names of function tools that do not change the world, in any of the agents."""
    run_config: RunConfig | None
    """The SDK's run configuration, for every agent."""
    max_turns: int
    """The SDK's bound on model calls per message."""
    context: Any
    """The SDK's run context object."""
    chain_responses: bool
    """Keep the conversations at the provider, chained by response ids."""


class _TeamOptions(_AgentOptions, total=False):
    """The keyword arguments of [`team`][agentsnap.integrations.openai_agents.team]."""

    reply_to: str | None
    """Where the final outputs go by default."""
    snapshot_at_handoff: bool
    """Start a snapshot as each handoff is sent."""
    on_event: OnEvent | None
    """Run every agent streamed, handing its stream events here."""


class _RunOptions(_AgentOptions, total=False):
    """The keyword arguments of
    [`AgentsnapRunner.resume`][agentsnap.integrations.openai_agents.AgentsnapRunner.resume]
    after ``store`` and ``run_id``.
    """  # noqa: D205

    retry: RetryPolicy | None
    """The bound on rollbacks."""
    setup: Callable[[Runtime, Mapping[str, OpenAIAgent]], None] | None
    """Called with the runtime and the team before the run goes on."""


class _StartOptions(_RunOptions, total=False):
    """The keyword arguments of
    [`AgentsnapRunner.run`][agentsnap.integrations.openai_agents.AgentsnapRunner.run] and
    ``run_streamed``.
    """  # noqa: D205

    store: Store | None
    """Where the run is kept; in memory by default."""
    run_id: str | None
    """The run's id; a new one by default."""


def _agent_options(options: _StartOptions) -> _AgentOptions:
    """The options every agent of the team takes, without the run's own."""
    given = {k: v for k, v in options.items() if k in _AgentOptions.__optional_keys__}
    return typing.cast("_AgentOptions", given)


def team(
    runtime: Runtime, starting_agent: SDKAgent[Any], **options: Unpack[_TeamOptions]
) -> dict[str, OpenAIAgent]:
    """Register an SDK agent and every SDK agent it can hand off to, each as an agent.

    Each SDK agent becomes an [`OpenAIAgent`][agentsnap.integrations.openai_agents.OpenAIAgent]
    named [`agent_name`][agentsnap.integrations.openai_agents.agent_name] of its name, so
    that handoffs between them travel on the run's channels. Targets are found through the
    agents' ``handoffs``: SDK agents, and ``handoff(agent)`` objects whose agent is alive.
    The keyword arguments are options of ``OpenAIAgent``, given to every agent.

    Args:
        runtime: The runtime to register them in.
        starting_agent: The SDK agent that takes the input.
        **options: The keyword arguments below, each optional.

    Keyword Args:
        reply_to (str | None): Where the final outputs go by default (``None``: back to the
            agent that asked).
        read_only (Collection[str]): Names of function tools that do not change the world,
            in any of the agents; every other function tool is ledger-backed (none by
            default).
        run_config (RunConfig | None): The SDK's run configuration, for every agent.
        max_turns (int): The SDK's bound on model calls per message (10 by default).
        context (Any): The SDK's run context object.
        snapshot_at_handoff (bool): Start a snapshot as each handoff is sent (``True`` by
            default).
        chain_responses (bool): Keep each agent's conversation at the provider, chained by
            response ids kept in its state (see
            [`OpenAIAgent`][agentsnap.integrations.openai_agents.OpenAIAgent]; ``False`` by
            default).
        on_event (OnEvent | None): Run every agent streamed, handing its stream events here.

    Returns:
        The registered agents, by agentsnap name (the starting agent's first).

    Raises:
        TypeError: A keyword argument is not one of those above.
        ConfigurationError: Two SDK agents have the same name.
    """
    require_keywords("team()", options, _TeamOptions.__optional_keys__)
    found: dict[str, SDKAgent[Any]] = {}
    waiting = [starting_agent]
    while waiting:
        sdk_agent = waiting.pop(0)
        name = agent_name(sdk_agent.name)
        if name in found:
            if found[name] is not sdk_agent:
                raise ConfigurationError(
                    f"two SDK agents are both named {sdk_agent.name!r} (agentsnap agent "
                    f"{name!r}); give them different names"
                )
            continue
        found[name] = sdk_agent
        waiting.extend(_targets(sdk_agent))
    read_only = options.get("read_only", ())
    made: dict[str, OpenAIAgent] = {}
    for name, sdk_agent in found.items():
        names = {getattr(t, "name", None) for t in sdk_agent.tools}
        own: _TeamOptions = {**options, "read_only": [n for n in read_only if n in names]}
        made[name] = runtime.add(OpenAIAgent(name, sdk_agent, **own))
    return made


def _targets(sdk_agent: SDKAgent[Any]) -> list[SDKAgent[Any]]:
    targets: list[SDKAgent[Any]] = []
    for given in sdk_agent.handoffs:
        if isinstance(given, SDKAgent):
            targets.append(given)
        elif isinstance(given, Handoff):
            ref = getattr(given, "_agent_ref", None)
            target = ref() if callable(ref) else None
            if isinstance(target, SDKAgent):
                targets.append(target)
    return targets


class TeamStream:
    """A streamed run of an SDK agent's team.

    Made by
    [`AgentsnapRunner.run_streamed`][agentsnap.integrations.openai_agents.AgentsnapRunner.run_streamed].
    The run goes on in a task of its own; its agents' stream events wait in a queue until
    [`stream_events`][agentsnap.integrations.openai_agents.TeamStream.stream_events] takes
    them.
    """

    def __init__(self, run: Callable[[OnEvent], Awaitable[TeamResult]]) -> None:
        self._events: asyncio.Queue[tuple[str, StreamEvent] | None] = asyncio.Queue()
        self._task: asyncio.Task[TeamResult] = asyncio.ensure_future(run(self._put))
        self._task.add_done_callback(lambda _: self._events.put_nowait(None))

    def _put(self, agent: str, event: StreamEvent) -> None:
        self._events.put_nowait((agent, event))

    async def stream_events(self) -> AsyncIterator[tuple[str, StreamEvent]]:
        """The team's stream events as they come, until the run is idle.

        Yields:
            ``(agent, event)``: the agentsnap agent that ran, and the SDK's stream event.

        Raises:
            Exception: What the run raised (``RollbackExhausted``, say), once its events
                are given.
        """
        while (item := await self._events.get()) is not None:
            yield item
        self._task.result()

    @property
    def is_complete(self) -> bool:
        """Whether the run is over."""
        return self._task.done()

    @property
    def result(self) -> TeamResult:
        """What the run came to.

        Raises:
            ConfigurationError: The run is not over: iterate ``stream_events`` to its end
                first.
            Exception: What the run raised.
        """
        if not self._task.done():
            raise ConfigurationError(
                "the streamed run is not over: iterate stream_events() to its end first"
            )
        return self._task.result()

    async def cancel(self) -> None:
        """Stop the run (it stays in its store, to be resumed)."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class AgentsnapRunner:
    """Runs an SDK agent durably: the SDK's ``Runner.run``, as an agentsnap run.

    ``await AgentsnapRunner.run(agent, "question", store=SqlStore(url))`` registers the
    agent and the agents it hands off to ([`team`][agentsnap.integrations.openai_agents.team])
    and an agent named ``outputs`` that keeps the final outputs, sends the input, and runs
    until the team is idle. Every model call is recorded, side-effecting tools go through
    the ledger, the conversations are in every snapshot. A run killed half-way is continued
    with [`resume`][agentsnap.integrations.openai_agents.AgentsnapRunner.resume] in another
    process: recorded answers are replayed, recorded effects are not repeated.
    """

    @classmethod
    async def run(
        cls, starting_agent: SDKAgent[Any], input: str | list[Any], **options: Unpack[_StartOptions]
    ) -> TeamResult:
        """Run ``starting_agent`` on ``input`` until its team is idle.

        Args:
            starting_agent: The SDK agent that takes the input.
            input: A string, or a list of the SDK's input items.
            **options: The keyword arguments below, each optional.

        Keyword Args:
            store (Store | None): Where the run is kept (``SqlStore(url)`` to resume it
                elsewhere); in memory by default.
            run_id (str | None): The run's id (a new one by default).
            retry (RetryPolicy | None): The bound on rollbacks, as for
                [`Runtime`][agentsnap.Runtime].
            read_only (Collection[str]): Names of function tools that do not change the world
                (every other function tool is ledger-backed; none by default).
            run_config (RunConfig | None): The SDK's run configuration.
            max_turns (int): The SDK's bound on model calls per message (10 by default).
            context (Any): The SDK's run context object.
            chain_responses (bool): Keep the conversations at the provider, chained by
                response ids kept in the agents' states (``False`` by default).
            setup (Callable[[Runtime, Mapping[str, OpenAIAgent]], None] | None): Called with
                the runtime and the team before the input is sent: declare checks
                (``runtime.check(name, kind="output", check=...)``), add critics.

        Returns:
            What the run came to.

        Raises:
            TypeError: A keyword argument is not one of those above.
        """
        require_keywords("AgentsnapRunner.run()", options, _StartOptions.__optional_keys__)
        return await cls._team_run(starting_agent, options, input)

    @classmethod
    def run_streamed(
        cls, starting_agent: SDKAgent[Any], input: str | list[Any], **options: Unpack[_StartOptions]
    ) -> TeamStream:
        """Run ``starting_agent`` on ``input`` streamed: the SDK's ``Runner.run_streamed``.

        Starts the run at once, as ``run`` would (call it from a coroutine), with every
        agent of the team run streamed. Iterate
        [`stream_events`][agentsnap.integrations.openai_agents.TeamStream.stream_events]
        for ``(agent, event)`` pairs as they come; then ``result`` says what the run came
        to. Every model call is still one recorded step, recorded once its stream is
        complete; a resumed run's replayed calls stream their recorded answers.

        Args:
            starting_agent: The SDK agent that takes the input.
            input: A string, or a list of the SDK's input items.
            **options: The keyword arguments of ``run``, each optional.

        Keyword Args:
            store (Store | None): Where the run is kept; in memory by default.
            run_id (str | None): The run's id; a new one by default.
            retry (RetryPolicy | None): The bound on rollbacks.
            read_only (Collection[str]): The function tools that change nothing, by name.
            run_config (RunConfig | None): The configuration the SDK runs with.
            max_turns (int): At most this many model calls per message (10 by default).
            context (Any): The object the SDK passes to every run as its context.
            chain_responses (bool): As for ``run``.
            setup (Callable[[Runtime, Mapping[str, OpenAIAgent]], None] | None): As for
                ``run``.

        Returns:
            The streamed run.

        Raises:
            TypeError: A keyword argument is not one of those above.
        """
        require_keywords("AgentsnapRunner.run_streamed()", options, _StartOptions.__optional_keys__)
        return TeamStream(lambda on_event: cls._team_run(starting_agent, options, input, on_event))

    @classmethod
    async def resume(
        cls,
        starting_agent: SDKAgent[Any],
        *,
        store: Store,
        run_id: str,
        **options: Unpack[_RunOptions],
    ) -> TeamResult:
        """Continue a stored run of ``starting_agent``'s team, after a crash.

        The team is registered as ``run`` did (give the same agents and options), the run
        goes back to its last consistent cut, and the handlers that ran after it run again:
        their model calls get the recorded answers, their recorded effects are not repeated.

        Args:
            starting_agent: The SDK agent the run started with.
            store: The store holding the run.
            run_id: The run's id.
            **options: The options the run was started with, as ``run`` takes them and
                each optional: ``retry``, ``read_only``, ``run_config``, ``max_turns``,
                ``context``, ``chain_responses`` and ``setup``. Give the same, so that the
                team is registered as it was.

        Returns:
            What the run came to.

        Raises:
            TypeError: A keyword argument is not one of those named above.
        """
        require_keywords("AgentsnapRunner.resume()", options, _RunOptions.__optional_keys__)
        return await cls._team_run(starting_agent, {**options, "store": store, "run_id": run_id})

    @classmethod
    async def _team_run(
        cls,
        starting_agent: SDKAgent[Any],
        options: _StartOptions,
        input: str | list[Any] | None = None,
        on_event: OnEvent | None = None,
    ) -> TeamResult:
        """Run the team to its end: on ``input``, or resuming the stored run when ``None``."""
        runtime = Runtime(
            store=options.get("store"), run_id=options.get("run_id"), retry=options.get("retry")
        )
        async with runtime:
            agents = team(runtime, starting_agent, on_event=on_event, **_agent_options(options))
            if OUTPUTS in agents:
                raise ConfigurationError(
                    f"an SDK agent is named {OUTPUTS!r}, the name of the agent that keeps the "
                    "outputs; rename it"
                )
            runtime.add(_Outputs(OUTPUTS))
            setup = options.get("setup")
            if setup is not None:
                setup(runtime, agents)
            if input is None:
                await runtime.resume()
            else:
                first = next(iter(agents))
                runtime.send(first, {"input": as_json(input), "reply_to": OUTPUTS}, kind="input")
            await runtime.run_until_idle()
            return cls._result(runtime)

    @staticmethod
    def _result(runtime: Runtime) -> TeamResult:
        kept = runtime.agents[OUTPUTS].state.memory.get("outputs", [])
        outputs = tuple(kept) if isinstance(kept, list) else ()
        last = outputs[-1] if outputs else None
        return TeamResult(
            run_id=runtime.run_id,
            final_output=last.get("output") if isinstance(last, dict) else None,
            last_agent=str(last.get("agent")) if isinstance(last, dict) else None,
            outputs=outputs,
            rollbacks=len(runtime.rollbacks),
        )
