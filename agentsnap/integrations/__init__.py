"""Integrations of agentsnap with other frameworks, each behind its own optional extra.

Importing ``agentsnap`` never imports a framework: an integration module does, and raises
[`MissingExtraError`][agentsnap.integrations.MissingExtraError] naming the extra to install
when the framework is missing.
"""

from __future__ import annotations

from agentsnap.exceptions import ConfigurationError

__all__ = ["MissingExtraError"]


class MissingExtraError(ConfigurationError, ImportError):
    """An integration needs a package that is not installed; the message names the extra.

    Args:
        extra: The agentsnap extra that installs the package (``pip install agentsnap[extra]``).
        package: The missing package.
    """

    def __init__(self, extra: str, package: str) -> None:
        super().__init__(
            f"this integration needs {package!r}, which is not installed: "
            f"pip install 'agentsnap[{extra}]'",
            name=package,
        )
        self.extra = extra
        self.package = package
