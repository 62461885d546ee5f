"""What every process of a run spread over processes builds: the run's agents and their checks.

An app is named ``module:factory``; the factory, called with no argument, returns an
[`App`][agentsnap.distributed.App] (or just a list of agents). Every worker calls it, keeps the
agents it hosts, and knows the others by name; the run's coordinator uses the names, the
checks' names and the retry policy. So the factory must return the same agents, by name and
in state, and the same checks, in every process.

An app declares checks on its agents' outputs as a [`Runtime`][agentsnap.Runtime] does
([`App.check`][agentsnap.distributed.App.check]; an agent's own ``evaluate`` counts too), and
the retry policy the run's coordinator applies when one fails. Side-effecting tools need
nothing more: each worker records their calls in the ledger of the run's store.

```python
app = App(agents=[Writer("writer"), Critic("critic")], retry=RetryPolicy.attempts(3))
app.check("writer", kind="draft", schema=Draft)
```
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Unpack

from pydantic import BaseModel

from agentsnap.agents import Agent
from agentsnap.checks import CheckOptions, OutputCheck, declare_check
from agentsnap.exceptions import ConfigurationError
from agentsnap.messages import ENVIRONMENT
from agentsnap.records import RunInfo, RunStatus
from agentsnap.redaction import Redaction
from agentsnap.requests import ApprovalPolicy
from agentsnap.rollback import RetryPolicy

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
        retry: How often the run's coordinator rolls back for one rejected output, and how
            long it waits (default: [`RetryPolicy()`][agentsnap.rollback.RetryPolicy]).
        checks: The checks declared with [`check`][agentsnap.distributed.App.check], as
            ``(agent, check)`` in the order declared.
        redact: What the run must never write (see
            [`agentsnap.redaction`][agentsnap.redaction]): every worker of the app (unless
            given its own, ``Worker(..., redact=...)``) and the run's coordinator apply it
            to what they store.
        approvals: Tools whose side-effecting calls wait for a person's approval before
            they are claimed in the ledger, by tool name, as
            [`Runtime(approvals=...)`][agentsnap.Runtime] takes them: every worker of the
            app applies it, besides each tool's own ``approval=``.
    """

    agents: Sequence[Agent[Any]]
    metadata: dict[str, Any] = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    checks: list[tuple[str, OutputCheck]] = field(default_factory=list)
    redact: Redaction | None = None
    approvals: Mapping[str, ApprovalPolicy] = field(default_factory=dict)

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

    def check(self, agent: str, kind: str | None = None, **options: Unpack[CheckOptions]) -> None:
        """Declare a check on what ``agent`` sends, as ``Runtime.check`` does.

        A message failing it is not sent: the worker hosting the agent tells the run's
        coordinator, which rolls every process back to the last complete snapshot before it
        (see [`agentsnap.distributed`][agentsnap.distributed]).

        Raises:
            ConfigurationError: The app has no agent ``agent``; or as for
                [`Runtime.check`][agentsnap.Runtime.check].
        """
        if agent not in self.names:
            known = ", ".join(repr(name) for name in self.names)
            raise ConfigurationError(
                f"App.check() names {agent!r}, which is not an agent of the app (its agents: "
                f"{known}); fix the name, or add the agent to the app first"
            )
        self.checks.append((agent, declare_check(kind, where="App.check()", **options)))

    def state_models(self) -> dict[str, type[BaseModel]]:
        """Each agent's state class, by agent name: what reads the run's stored states.

        ``agentsnap states check``, ``show``, ``diff``, ``fork`` and ``ui`` take an app
        (``--app``) for these: stored states are read through their upcasters (see
        [`agentsnap.versions`][agentsnap.versions]).
        """
        return {agent.name: agent.state_type for agent in self.agents}

    def checks_of(self, agent: str) -> list[OutputCheck]:
        """The checks declared on ``agent``, in order."""
        return [declared for name, declared in self.checks if name == agent]


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
