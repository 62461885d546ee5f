"""Integrations of agentsnap with other frameworks, each behind its own optional extra.

Importing ``agentsnap`` never imports a framework: an integration module does, and raises
[`MissingExtraError`][agentsnap.integrations.MissingExtraError] naming the extra to install
when the framework is missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from typing import Any

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


@contextlib.contextmanager
def needs_extra(extra: str, package: str) -> Iterator[None]:
    """Import an integration's framework inside the block; missing, it raises `MissingExtraError`.

    Each integration's ``__init__`` imports its framework in such a block before its own
    modules, so the error names the extra to install instead of a module deep in the
    framework.

    Args:
        extra: The agentsnap extra that installs the package.
        package: The package the block imports.

    Raises:
        MissingExtraError: An import in the block failed.
    """
    try:
        yield
    except ImportError as exc:
        raise MissingExtraError(extra, package) from exc


def require_kind(value: object, kind: type[Any] | tuple[type[Any], ...], needs: str) -> None:
    """Refuse what an integration was given when it is not the framework's object it takes.

    Args:
        value: What was given.
        kind: The framework's class (or classes) it must be.
        needs: What was expected, said in a sentence's start (``"agent 'a' needs ..."``); the
            error adds what was given.

    Raises:
        ConfigurationError: ``value`` is not a ``kind``.
    """
    if not isinstance(value, kind):
        raise ConfigurationError(f"{needs}, got {type(value).__name__}")


def require_keywords(function: str, given: Collection[str], known: Collection[str]) -> None:
    """Refuse keyword arguments a function taking ``**options`` does not know, as Python does.

    Args:
        function: The function, as the error names it (``"team()"``).
        given: The names of the keyword arguments given.
        known: The names it takes.

    Raises:
        TypeError: A name in ``given`` is not in ``known``.
    """
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise TypeError(
            f"{function} got an unexpected keyword argument {unknown[0]!r} "
            f"(it takes {', '.join(sorted(known))})"
        )
