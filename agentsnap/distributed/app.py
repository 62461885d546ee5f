"""What every process of a run spread over processes builds: the run's agents.

An app is named ``module:factory``; the factory, called with no argument, returns an
[`App`][agentsnap.distributed.App] (or just a list of agents). Every worker calls it, keeps the
agents it hosts, and knows the others by name; the run's coordinator uses the names only. So
the factory must return the same agents, by name and in state, in every process.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentsnap.agents import Agent
from agentsnap.exceptions import ConfigurationError
from agentsnap.messages import ENVIRONMENT
from agentsnap.records import RunInfo, RunStatus

__all__ = ["App", "check_run", "load_app"]

PROCESSES = "processes"
"""The key of a run's metadata under which its coordinator records the run's processes."""

_ENDED = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})


@dataclass(frozen=True)
class App:
    """The agents of a run spread over processes.

    Attributes:
        agents: Every agent of the run, each with its initial state; names are unique.
        metadata: JSON recorded with the run by its coordinator.
    """

    agents: Sequence[Agent[Any]]
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for agent in self.agents:
            if not isinstance(agent, Agent):
                raise ConfigurationError(
                    f"an App holds agentsnap.Agent objects, not {type(agent).__name__}"
                )
            if agent.name in seen or agent.name == ENVIRONMENT:
                raise ConfigurationError(f"the app names agent {agent.name!r} twice")
            seen.add(agent.name)

    @property
    def names(self) -> list[str]:
        """The agents' names, in the app's order."""
        return [agent.name for agent in self.agents]


def load_app(spec: str) -> App:
    """Import ``module:factory`` and call the factory.

    Raises:
        ConfigurationError: ``spec`` is not ``module:factory``; the module cannot be imported;
            it has no such factory; the factory raised, or returned neither an ``App`` nor a
            list of agents.
    """
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise ConfigurationError(
            f"--app {spec!r} is not module:factory (e.g. myproject.bank:make_app)"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"cannot import the app's module {module_name!r}: {exc}; check --app and PYTHONPATH"
        ) from exc
    factory = getattr(module, attribute, None)
    if factory is None or not callable(factory):
        raise ConfigurationError(
            f"module {module_name!r} has no factory {attribute!r} (a function returning an "
            "agentsnap.distributed.App)"
        )
    try:
        made = factory()
    except Exception as exc:
        raise ConfigurationError(
            f"the app factory {spec} raised {type(exc).__name__}: {exc}"
        ) from exc
    if isinstance(made, App):
        return made
    if isinstance(made, (list, tuple)):
        try:
            return App(agents=list(made))
        except ConfigurationError as exc:
            raise ConfigurationError(f"the app factory {spec} returned a list: {exc}") from exc
    raise ConfigurationError(
        f"the app factory {spec} returned {type(made).__name__}: return an "
        "agentsnap.distributed.App (or a list of agents)"
    )


def check_run(run: RunInfo, app: App) -> None:
    """Refuse to serve ``run`` with ``app`` unless it is a run of that app, still going.

    A worker serves a run that a [`DistributedRun`][agentsnap.distributed.DistributedRun]
    created (it records the run's processes in the run's metadata) for the same agents as
    ``app``'s, and that has not ended.

    Raises:
        ConfigurationError: The run was created otherwise (by a ``Runtime``, or another
            deployment), for other agents, or it has ended; the message says what to do.
    """
    processes = run.metadata.get(PROCESSES)
    if not isinstance(processes, list) or not all(isinstance(p, str) for p in processes):
        raise ConfigurationError(
            f"run {run.id} was not created by the coordinator of a run spread over processes "
            "(agentsnap.distributed.DistributedRun), so no worker serves it: pass the id of "
            "a run that a DistributedRun created (--run), or create one"
        )
    ran = {str(p) for p in processes}
    expected = {ENVIRONMENT, *app.names}
    if ran != expected:
        only_run = ", ".join(sorted(ran - expected)) or "none"
        only_app = ", ".join(sorted(expected - ran)) or "none"
        raise ConfigurationError(
            f"run {run.id} has other agents than the app (only in the run: {only_run}; "
            f"only in the app: {only_app}): start the worker with the app and configuration "
            "the run's coordinator used (--app), or pass the id of a run of this app (--run)"
        )
    if run.status in _ENDED:
        raise ConfigurationError(
            f"run {run.id} has ended ({run.status.value}): a worker serves a run that is "
            "still going; create a new run for this work"
        )
