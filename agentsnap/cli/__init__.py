"""The ``agentsnap`` command line: a thin shell over the library.

The database comes from ``--db``, else the ``AGENTSNAP_DB`` environment variable, else
``sqlite:///agentsnap.db``. Errors are one line on standard error and a non-zero exit status.
Colour is used only on a terminal, and never with ``--no-color`` or ``NO_COLOR`` set; times
are shown in local time with their UTC offset (``--utc`` for UTC), and in ISO 8601 UTC in JSON.

One private module per group of commands (``_runs``, ``_snapshots``, ``_tools``, ``_db``, ...)
registers its commands on the group of ``_main``; ``_format`` is the only one that shapes
output. Each command imports what it needs when it runs, so that ``agentsnap --help`` stays fast.
"""

from __future__ import annotations

# Each module registers its commands on ``main`` when it is imported.
from agentsnap.cli import (  # noqa: F401
    _db,
    _export,
    _fork,
    _lifecycle,
    _model_calls,
    _requests,
    _runs,
    _snapshots,
    _states,
    _tools,
    _ui,
    _worker,
)
from agentsnap.cli._main import add_shared_options, main

__all__ = ["main"]

add_shared_options(main)
