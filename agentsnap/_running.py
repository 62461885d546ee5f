"""Running an app in one process, from the command line or from Python: to its end, or on
from where a stopped run left off.

An app is the same declaration whether its agents run in one process or over several (see
[`App`][agentsnap.distributed.App]): its agents, its checks, its retry policy, what it must
never write and which tools need a person's approval. Here it is turned into a
[`Runtime`][agentsnap.Runtime] on a store, and driven until the run has nothing left to do
(or is cancelled, or fails); the run's status is then the one the runtime recorded.
"""  # noqa: D205

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from agentsnap.exceptions import ConfigurationError, RunError
from agentsnap.runtime import Runtime

if TYPE_CHECKING:
    from agentsnap.distributed.app import App
    from agentsnap.messages import JsonInput
    from agentsnap.records import RunInfo
    from agentsnap.store import OneProcessStore

__all__ = ["resume_app", "run_app", "runtime_for"]


def runtime_for(
    app: App, store: OneProcessStore, *, run_id: str | None = None, name: str | None = None
) -> Runtime:
    """A runtime on ``store`` with ``app``'s agents, checks and policies, not started."""
    runtime = Runtime(
        store=store,
        run_id=run_id,
        metadata=app.metadata,
        name=name,
        retry=app.retry,
        redact=app.redact,
        approvals=app.approvals,
    )
    for agent in app.agents:
        runtime.add(agent)
    for agent_name, declared in app.checks:
        runtime.check(
            agent_name,
            declared.kind,
            schema=declared.schema,
            check=declared.check,
            name=declared.name,
        )
    return runtime


async def run_app(
    app: App,
    store: OneProcessStore,
    payload: JsonInput,
    *,
    to: str | None = None,
    run_id: str | None = None,
    name: str | None = None,
    started: Callable[[str], None] | None = None,
) -> RunInfo:
    """Start a run of ``app`` with ``payload`` sent to agent ``to``, and run it to its end.

    ``started`` is called with the run's id once the run is recorded, before anything is
    delivered: a process killed after it can be resumed by that id.

    Returns:
        The run as the store holds it once the runtime closed: succeeded, failed (with
        its reason and tracebacks), cancelled or interrupted.

    Raises:
        ConfigurationError: ``to`` is not an agent of the app; or ``run_id`` is taken.
    """
    target = to if to is not None else app.names[0] if app.names else None
    if target is None or target not in app.names:
        known = ", ".join(repr(n) for n in app.names) or "none"
        raise ConfigurationError(
            f"the input goes to agent {target!r}, which is not an agent of the app (its "
            f"agents: {known}); pass one of them (--to)"
        )
    runtime = runtime_for(app, store, run_id=run_id, name=name)
    async with runtime:
        runtime.send(target, payload)
        await runtime.start()
        if started is not None:
            started(runtime.run_id)
        await _until_idle(runtime)
    return await store.get_run(runtime.run_id)


async def resume_app(
    app: App,
    store: OneProcessStore,
    run_id: str,
    *,
    wait: float | None = None,
    resumed: Callable[[str], None] | None = None,
) -> RunInfo:
    """Resume run ``run_id`` of ``app`` after its process stopped, and run it to its end.

    The run is taken over as [`Runtime.resume`][agentsnap.Runtime.resume] takes it (its
    lease, the claims its last owner left in progress); ``resumed`` is called with the id of
    the snapshot it continues from.

    Returns:
        The run as the store holds it once the runtime closed.

    Raises:
        NotFoundError: The store holds no run ``run_id``.
        RunOwnedError: A live process owns the run.
        ConfigurationError: The run succeeded: there is nothing to resume.
    """
    runtime = runtime_for(app, store, run_id=run_id)
    async with runtime:
        snapshot = await runtime.resume(wait=wait)
        if resumed is not None:
            resumed(snapshot.id)
        await _until_idle(runtime)
    return await store.get_run(runtime.run_id)


async def _until_idle(runtime: Runtime) -> None:
    """Deliver until nothing is left; a failure or a cancel ends the run, as recorded."""
    # A handler failed, retries ran out, or the run was cancelled: closing records which,
    # with its reason and tracebacks.
    with contextlib.suppress(RunError):
        await runtime.run_until_idle()
