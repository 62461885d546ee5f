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
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from agentsnap.exceptions import RunError
from agentsnap.runtime import Runtime

if TYPE_CHECKING:
    from agentsnap.distributed.app import App
    from agentsnap.records import RunInfo
    from agentsnap.store import OneProcessStore

__all__ = ["run_to_end", "runtime_for"]


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


async def run_to_end(
    app: App,
    store: OneProcessStore,
    begin: Callable[[Runtime], Awaitable[str]],
    told: Callable[[str], None] | None,
    *,
    run_id: str | None,
    name: str | None = None,
) -> RunInfo:
    """Run ``app`` on ``store`` until its run has nothing left to do; the run as then stored.

    ``begin`` starts the runtime (a new run, or one resumed) and returns the id ``told`` is
    called with (the run's, or the snapshot's it resumed from), before anything is delivered.
    """
    runtime = runtime_for(app, store, run_id=run_id, name=name)
    async with runtime:
        begun = await begin(runtime)
        if told is not None:
            told(begun)
        await _until_idle(runtime)
    return await store.get_run(runtime.run_id)


async def _until_idle(runtime: Runtime) -> None:
    """Deliver until nothing is left; a failure or a cancel ends the run, as recorded."""
    # A handler failed, retries ran out, or the run was cancelled: closing records which,
    # with its reason and tracebacks.
    with contextlib.suppress(RunError):
        await runtime.run_until_idle()
