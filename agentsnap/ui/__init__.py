"""The web inspector: an HTTP server over a store, and the page it serves.

Start it with ``agentsnap ui`` (see [`agentsnap.ui.server`][agentsnap.ui.server] for the app
and its API). It needs the ``ui`` extra: ``pip install 'agentsnap[ui]'``.
"""

from __future__ import annotations

import importlib.util

__all__ = ["MISSING", "require"]

_NEEDED = ("fastapi", "uvicorn", "jsonschema")

MISSING = tuple(name for name in _NEEDED if importlib.util.find_spec(name) is None)
"""The packages of the ``ui`` extra that are not installed."""


def require() -> None:
    """Raise a clear error unless the ``ui`` extra is installed.

    Raises:
        ConfigurationError: A package the inspector needs is missing; the message says
            how to install it.
    """
    if MISSING:
        from agentsnap.exceptions import ConfigurationError  # noqa: PLC0415

        raise ConfigurationError(
            f"the web inspector needs {', '.join(MISSING)}: pip install 'agentsnap[ui]'"
        )
