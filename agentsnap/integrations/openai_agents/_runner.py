"""Run an SDK agent, and the agents it hands off to, as a team of agentsnap agents."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from agents import Agent as SDKAgent
from agents import RunConfig
from agents.handoffs import Handoff
from agents.stream_events import StreamEvent

from agentsnap.agents import Agent, Context
from agentsnap.exceptions import ConfigurationError
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


def team(
    runtime: Runtime,
    starting_agent: SDKAgent[Any],
    *,
    reply_to: str | None = None,
    read_only: Collection[str] = (),
    run_config: RunConfig | None = None,
    max_turns: int = 10,
    context: Any = None,
    snapshot_at_handoff: bool = True,
    chain_responses: bool = False,
    on_event: OnEvent | None = None,
) -> dict[str, OpenAIAgent]:
    """Register an SDK agent and every SDK agent it can hand off to, each as an agent.

    Each SDK agent becomes an [`OpenAIAgent`][agentsnap.integrations.openai_agents.OpenAIAgent]
    named [`agent_name`][agentsnap.integrations.openai_agents.agent_name] of its name, so
    that handoffs between them travel on the run's channels. Targets are found through the
    agents' ``handoffs``: SDK agents, and ``handoff(agent)`` objects whose agent is alive.

    Args:
        runtime: The runtime to register them in.
        starting_agent: The SDK agent that takes the input.
        reply_to: Where the final outputs go by default.
        read_only: Names of function tools that do not change the world, in any of the
            agents; every other function tool is ledger-backed.
        run_config: The SDK's run configuration, for every agent.
        max_turns: The SDK's bound on model calls per message.
        context: The SDK's run context object.
        snapshot_at_handoff: Start a snapshot as each handoff is sent (the default).
        chain_responses: Keep each agent's conversation at the provider, chained by
            response ids kept in its state (see
            [`OpenAIAgent`][agentsnap.integrations.openai_agents.OpenAIAgent]).
        on_event: Run every agent streamed, handing its stream events here.

    Returns:
        The registered agents, by agentsnap name (the starting agent's first).

    Raises:
        ConfigurationError: Two SDK agents have the same name.
    """
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
    made: dict[str, OpenAIAgent] = {}
    for name, sdk_agent in found.items():
        names = {getattr(t, "name", None) for t in sdk_agent.tools}
        made[name] = runtime.add(
            OpenAIAgent(
                name,
                sdk_agent,
                read_only=[n for n in read_only if n in names],
                reply_to=reply_to,
                run_config=run_config,
                max_turns=max_turns,
                context=context,
                snapshot_at_handoff=snapshot_at_handoff,
                chain_responses=chain_responses,
                on_event=on_event,
            )
        )
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
        cls,
        starting_agent: SDKAgent[Any],
        input: str | list[Any],
        *,
        store: Store | None = None,
        run_id: str | None = None,
        retry: RetryPolicy | None = None,
        read_only: Collection[str] = (),
        run_config: RunConfig | None = None,
        max_turns: int = 10,
        context: Any = None,
        chain_responses: bool = False,
        setup: Callable[[Runtime, Mapping[str, OpenAIAgent]], None] | None = None,
    ) -> TeamResult:
        """Run ``starting_agent`` on ``input`` until its team is idle.

        Args:
            starting_agent: The SDK agent that takes the input.
            input: A string, or a list of the SDK's input items.
            store: Where the run is kept (``SqlStore(url)`` to resume it elsewhere);
                in memory by default.
            run_id: The run's id (a new one by default).
            retry: The bound on rollbacks, as for [`Runtime`][agentsnap.Runtime].
            read_only: Names of function tools that do not change the world (every other
                function tool is ledger-backed).
            run_config: The SDK's run configuration.
            max_turns: The SDK's bound on model calls per message.
            context: The SDK's run context object.
            chain_responses: Keep the conversations at the provider, chained by response
                ids kept in the agents' states.
            setup: Called with the runtime and the team before the input is sent: declare
                checks (``runtime.check(name, kind="output", check=...)``), add critics.

        Returns:
            What the run came to.
        """
        return await cls._team_run(
            starting_agent,
            input,
            (store, run_id, retry),
            read_only,
            run_config,
            max_turns,
            context,
            chain_responses,
            setup,
            None,
        )

    @classmethod
    def run_streamed(
        cls,
        starting_agent: SDKAgent[Any],
        input: str | list[Any],
        *,
        store: Store | None = None,
        run_id: str | None = None,
        retry: RetryPolicy | None = None,
        read_only: Collection[str] = (),
        run_config: RunConfig | None = None,
        max_turns: int = 10,
        context: Any = None,
        chain_responses: bool = False,
        setup: Callable[[Runtime, Mapping[str, OpenAIAgent]], None] | None = None,
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
            store: Where the run is kept; in memory by default.
            run_id: The run's id (a new one by default).
            retry: The bound on rollbacks.
            read_only: Names of function tools that do not change the world.
            run_config: The SDK's run configuration.
            max_turns: The SDK's bound on model calls per message.
            context: The SDK's run context object.
            chain_responses: As for ``run``.
            setup: As for ``run``.

        Returns:
            The streamed run.
        """

        async def go(on_event: OnEvent) -> TeamResult:
            return await cls._team_run(
                starting_agent,
                input,
                (store, run_id, retry),
                read_only,
                run_config,
                max_turns,
                context,
                chain_responses,
                setup,
                on_event,
            )

        return TeamStream(go)

    @classmethod
    async def _team_run(  # noqa: PLR0917
        cls,
        starting_agent: SDKAgent[Any],
        input: str | list[Any],
        where: tuple[Store | None, str | None, RetryPolicy | None],
        read_only: Collection[str],
        run_config: RunConfig | None,
        max_turns: int,
        context: Any,
        chain_responses: bool,
        setup: Callable[[Runtime, Mapping[str, OpenAIAgent]], None] | None,
        on_event: OnEvent | None,
    ) -> TeamResult:
        """Run the team on ``input`` to its end: what ``run`` and ``run_streamed`` share."""
        store, run_id, retry = where
        runtime = Runtime(store=store, run_id=run_id, retry=retry)
        async with runtime:
            agents = cls._register(
                runtime,
                starting_agent,
                read_only,
                run_config,
                max_turns,
                context,
                chain_responses,
                on_event,
            )
            if setup is not None:
                setup(runtime, agents)
            first = next(iter(agents))
            runtime.send(first, {"input": as_json(input), "reply_to": OUTPUTS}, kind="input")
            await runtime.run_until_idle()
            return cls._result(runtime)

    @classmethod
    async def resume(
        cls,
        starting_agent: SDKAgent[Any],
        *,
        store: Store,
        run_id: str,
        retry: RetryPolicy | None = None,
        read_only: Collection[str] = (),
        run_config: RunConfig | None = None,
        max_turns: int = 10,
        context: Any = None,
        chain_responses: bool = False,
        setup: Callable[[Runtime, Mapping[str, OpenAIAgent]], None] | None = None,
    ) -> TeamResult:
        """Continue a stored run of ``starting_agent``'s team, after a crash.

        The team is registered as ``run`` did (give the same agents and options), the run
        goes back to its last consistent cut, and the handlers that ran after it run again:
        their model calls get the recorded answers, their recorded effects are not repeated.

        Args:
            starting_agent: The SDK agent the run started with.
            store: The store holding the run.
            run_id: The run's id.
            retry: The bound on rollbacks.
            read_only: Names of function tools that do not change the world (every other
                function tool is ledger-backed).
            run_config: The SDK's run configuration.
            max_turns: The SDK's bound on model calls per message.
            context: The SDK's run context object.
            chain_responses: As for ``run``.
            setup: As for ``run``.

        Returns:
            What the run came to.
        """
        runtime = Runtime(store=store, run_id=run_id, retry=retry)
        async with runtime:
            agents = cls._register(
                runtime,
                starting_agent,
                read_only,
                run_config,
                max_turns,
                context,
                chain_responses,
                None,
            )
            if setup is not None:
                setup(runtime, agents)
            await runtime.resume()
            await runtime.run_until_idle()
            return cls._result(runtime)

    @staticmethod
    def _register(  # noqa: PLR0917
        runtime: Runtime,
        starting_agent: SDKAgent[Any],
        read_only: Collection[str],
        run_config: RunConfig | None,
        max_turns: int,
        context: Any,
        chain_responses: bool,
        on_event: OnEvent | None,
    ) -> dict[str, OpenAIAgent]:
        agents = team(
            runtime,
            starting_agent,
            read_only=read_only,
            run_config=run_config,
            max_turns=max_turns,
            context=context,
            chain_responses=chain_responses,
            on_event=on_event,
        )
        if OUTPUTS in agents:
            raise ConfigurationError(
                f"an SDK agent is named {OUTPUTS!r}, the name of the agent that keeps the "
                "outputs; rename it"
            )
        runtime.add(_Outputs(OUTPUTS))
        return agents

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
