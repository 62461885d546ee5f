"""The roots of agentsnap's error tree, below every other module.

`AgentsnapError` and `ConfigurationError` are defined here, with nothing to import, so that a
module `agentsnap.exceptions` imports can derive an error of its own from them:
`agentsnap.messages` defines `PayloadInvalid` beside the `Message` it names, and
`agentsnap.exceptions` names `Message` in the errors raised while handling one. Import them
from `agentsnap` or `agentsnap.exceptions`, which hold the whole tree.
"""

from __future__ import annotations

__all__ = ["AgentsnapError", "ConfigurationError"]


class AgentsnapError(Exception):
    """Base class of every exception raised by agentsnap."""


class ConfigurationError(AgentsnapError):
    """The program uses agentsnap in a way that cannot work; the message says how to fix it."""
