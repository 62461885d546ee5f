"""The handler an agent SDK runs in: how an integration's hooks find its context.

An agent SDK calls the model and the tools itself, from code of its own; an integration's
hooks (a capability, a middleware, a model wrapper, a tool wrapper) are made once, with the
agent, and run in many handlers. The integration's agent sets the handler's context for the
SDK's run with [`handling`][agentsnap.integrations._running.handling]; its hooks read it with
[`current`][agentsnap.integrations._running.current]. A context variable carries it, so the
tasks the SDK starts for parallel tool calls see it too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from agentsnap.agents import Context
from agentsnap.exceptions import ConfigurationError

__all__ = ["current", "handling", "running"]

_CURRENT: ContextVar[Context[Any] | None] = ContextVar("agentsnap_handler", default=None)


@contextlib.contextmanager
def handling(ctx: Context[Any]) -> Iterator[Context[Any]]:
    """Make ``ctx`` the context of the SDK's calls made inside the ``with`` block."""
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


def running() -> Context[Any] | None:
    """The context of the handler running the SDK here, or ``None`` outside one."""
    return _CURRENT.get()


def current(what: str) -> Context[Any]:
    """The context of the handler running the SDK here.

    Args:
        what: What needs it, for the error (``"a durable model call"``, say).

    Raises:
        ConfigurationError: No agentsnap handler runs the SDK here.
    """
    ctx = _CURRENT.get()
    if ctx is None:
        raise ConfigurationError(
            f"{what} runs outside an agentsnap handler: run the SDK's agent as an agentsnap "
            "agent (register it with Runtime.add() and send it a message), or call it inside "
            "agentsnap.integrations handling(ctx)"
        )
    return ctx
