"""A small, safe condition over a snapshot's agent states: a path, an operator and a value.

The inspector's bisect takes a condition rather than code, so nothing a browser sends is ever
run. The path is JSONPath-style over ``{agent: state}``: ``$`` then any number of
``.name``, ``["any name"]`` (JSON string syntax) and ``[index]`` steps, so
``$.writer.memory.drafts[0]`` or ``$["my-agent"].plan[-1]``. The operators:

| op | holds when |
|---|---|
| ``exists`` | the path leads somewhere (``value`` is not used) |
| ``==``, ``!=`` | the value found equals (does not equal) ``value``, as JSON |
| ``<``, ``<=``, ``>``, ``>=`` | both are numbers, or both are strings, and compare so |
| ``len==``, ``len<``, ``len<=``, ``len>``, ``len>=`` | its length compares so with ``value`` |

A length is that of a list, an object or a string; ``value`` is then an integer. Where the
path leads nowhere, only ``!=`` holds. Where the values cannot be compared (a
number with a string), the condition does not hold.

Example:
    ```python
    from agentsnap.ui.conditions import Condition

    condition = Condition.parse("$.writer.memory.drafts", "len<=", 1)
    print(condition({"writer": {"memory": {"drafts": ["one"]}}}))  # True
    ```
"""

from __future__ import annotations

import json
import operator
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentsnap.exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["OPERATORS", "Condition", "parse_path"]

_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_LENGTH: dict[str, Callable[[Any, Any], bool]] = {
    "len==": operator.eq,
    "len<": operator.lt,
    "len<=": operator.le,
    "len>": operator.gt,
    "len>=": operator.ge,
}
OPERATORS = ("exists", "==", "!=", *_ORDER, *_LENGTH)
"""The operators a condition may use."""

_NAME = re.compile(r"\.([A-Za-z_$][A-Za-z0-9_$-]*)")
_INDEX = re.compile(r"\[\s*(-?\d+)\s*\]")
_QUOTED = re.compile(r'\[\s*("(?:[^"\\]|\\.)*")\s*\]')
_MAX_PATH = 1000

Step = str | int
_MISSING = object()


def parse_path(path: str) -> tuple[Step, ...]:
    """The steps of a path: names (``str``) and list indexes (``int``).

    Raises:
        ConfigurationError: The path is not ``$`` followed by ``.name``, ``["name"]`` and
            ``[index]`` steps; the message says where it goes wrong.
    """
    if not isinstance(path, str) or not path.startswith("$"):
        raise ConfigurationError(
            f"path {path!r} must start with $, as in $.agent.memory.key or $.agent.plan[0]"
        )
    if len(path) > _MAX_PATH:
        raise ConfigurationError(f"path is longer than {_MAX_PATH} characters")
    steps: list[Step] = []
    at = 1
    while at < len(path):
        name = _NAME.match(path, at)
        if name:
            steps.append(name.group(1))
            at = name.end()
            continue
        index = _INDEX.match(path, at)
        if index:
            steps.append(int(index.group(1)))
            at = index.end()
            continue
        quoted = _QUOTED.match(path, at)
        if quoted:
            steps.append(json.loads(quoted.group(1)))
            at = quoted.end()
            continue
        raise ConfigurationError(
            f"path {path!r} cannot be read at character {at + 1} ({path[at : at + 10]!r}): use "
            '.name, ["any name"] or [index] steps after $'
        )
    return tuple(steps)


def _follow(value: Any, steps: tuple[Step, ...]) -> Any:
    for step in steps:
        if isinstance(step, int):
            if not isinstance(value, list) or not -len(value) <= step < len(value):
                return _MISSING
            value = value[step]
        else:
            if not isinstance(value, dict) or step not in value:
                return _MISSING
            value = value[step]
    return value


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Condition:
    """A parsed condition; call it with ``{agent: state}`` to know whether it holds."""

    path: str
    steps: tuple[Step, ...]
    op: str
    value: Any

    @classmethod
    def parse(cls, path: str, op: str, value: Any = None) -> Condition:
        """Check and parse a condition.

        Raises:
            ConfigurationError: The path cannot be read, the operator is unknown, or a
                ``len`` operator's value is not an integer.
        """
        steps = parse_path(path)
        if op not in OPERATORS:
            raise ConfigurationError(f"unknown operator {op!r}: use one of {', '.join(OPERATORS)}")
        if op in _LENGTH and (not isinstance(value, int) or isinstance(value, bool)):
            raise ConfigurationError(
                f"operator {op} compares a length: its value must be an integer"
            )
        return cls(path, steps, op, value)

    def __call__(self, states: Mapping[str, Any]) -> bool:
        """Whether the condition holds for these states."""
        found = _follow(dict(states), self.steps)
        op = self.op
        if op == "exists":
            return found is not _MISSING
        if op == "!=":
            return found is _MISSING or found != self.value
        if found is _MISSING:
            return False
        if op == "==":
            return bool(found == self.value)
        if op in _LENGTH:
            if not isinstance(found, (list, dict, str)):
                return False
            return _LENGTH[op](len(found), self.value)
        same = (_number(found) and _number(self.value)) or (
            isinstance(found, str) and isinstance(self.value, str)
        )
        return same and _ORDER[op](found, self.value)
