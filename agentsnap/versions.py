"""State versions: reading a state stored by an older version of its class.

A deploy changes an agent's state class: a field is added, renamed, retyped or dropped. Runs
stored before it must still resume, roll back, fork and show. So a state class declares a
version (a class variable, 1 when it declares none), every snapshot records the version each
agent's state was written with ([`AgentCut.state_version`][agentsnap.AgentCut.state_version]),
and the class declares **upcasters**: pure functions on the state's JSON, each taking a state
of one version to the next. A state stored with an older version is read through the chain of
them, then validated against the class.

Example:
    ```python
    from typing import Any, ClassVar

    from agentsnap import AgentState, upcaster
    from agentsnap.versions import read_state


    class Tally(AgentState):
        version: ClassVar[int] = 2

        total: int = 0  # was "count" in version 1

        @upcaster(from_version=1)
        def rename_count(state: dict[str, Any]) -> dict[str, Any]:
            state["total"] = state.pop("count")
            return state


    tally = read_state("adder", Tally, '{"count": 5}', 1)
    print(tally.total)  # 5
    ```

A stored state is read as it is when its version is the class's; when it is older, the
upcasters from its version up run in turn, each on the JSON the previous one returned. A
missing step, an upcaster that raises, a state stored by a newer version than the class, or
a result that does not validate raises [`StateNotReadable`][agentsnap.StateNotReadable],
naming the agent, both versions and the step. Nothing of this runs while a run delivers
messages: only reading a stored state (resume, rollback, fork, the inspector) upcasts.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from agentsnap._errors import ConfigurationError
from agentsnap.exceptions import StateNotReadable

__all__ = [
    "VERSION_KEY",
    "StateVersions",
    "Upcaster",
    "check_state",
    "read_state",
    "read_state_json",
    "schema_version",
    "state_schema",
    "state_version",
    "upcast",
    "upcaster",
    "versions_of",
]

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
"""An upcaster: the JSON of a state of one version in, the JSON of the next version out."""

VERSION_KEY = "x-state-version"
"""The key under which a run's stored state schema (a JSON Schema) records the version of the
state class it was written from."""

_FROM = "__agentsnap_upcast_from__"

logger = logging.getLogger("agentsnap")


def upcaster(
    *, from_version: int
) -> Callable[[Upcaster], staticmethod[[dict[str, Any]], dict[str, Any]]]:
    """Declare, in a state class's body, the function that upcasts its states of ``from_version``.

    The function takes the JSON object of a state stored with version ``from_version`` and
    returns the JSON object of the same state in version ``from_version + 1``. It must be
    pure: it sees a fresh copy, may change it in place and return it, and must not depend on
    anything but its argument (it runs whenever a stored state is read, any number of times).
    It stays callable as a static method of the class, so it can be tested alone.

    Args:
        from_version: The version it reads (1 or more, below the class's ``version``).

    Raises:
        ConfigurationError: ``from_version`` is not a whole number of 1 or more.
    """
    if type(from_version) is not int or from_version < 1:
        raise ConfigurationError(
            f"@upcaster(from_version={from_version!r}): a version is a whole number, 1 or more"
        )

    def mark(function: Upcaster) -> staticmethod[[dict[str, Any]], dict[str, Any]]:
        if isinstance(function, staticmethod):
            function = function.__func__
        if not callable(function):
            raise ConfigurationError(
                f"@upcaster(from_version={from_version}) decorates a function, not "
                f"{type(function).__name__}"
            )
        setattr(function, _FROM, from_version)
        return staticmethod(function)

    return mark


class StateVersions:
    """A state class's version and its upcasters, by the version each reads.

    Attributes:
        model: The state class.
        version: The version it declares (1 when it declares none).
        steps: The upcasters, by the version each reads.
    """

    __slots__ = ("model", "steps", "version")

    def __init__(self, model: type[BaseModel], version: int, steps: dict[int, Upcaster]) -> None:
        self.model = model
        self.version = version
        self.steps = steps

    def missing(self, stored: int) -> int | None:
        """The first step missing to read a state of version ``stored``, or ``None``."""
        return next((v for v in range(stored, self.version) if v not in self.steps), None)


_versions: dict[type[BaseModel], StateVersions] = {}


def versions_of(model: type[BaseModel]) -> StateVersions:
    """The version ``model`` declares and its upcasters, found once per class.

    The version is the class variable ``version`` (``version: ClassVar[int] = 2``); a class
    without one is at version 1. Upcasters are the functions its body (or a base class's)
    declares with [`upcaster`][agentsnap.versions.upcaster]; a subclass's replaces its base's
    for the same version.

    Raises:
        ConfigurationError: The version is not a whole number of 1 or more; an upcaster reads
            a version the class is at or beyond; or one class declares two upcasters from
            the same version.
    """
    found = _versions.get(model)
    if found is None:
        found = _versions[model] = _find(model)
    return found


def _find(model: type[BaseModel]) -> StateVersions:
    version: Any = 1
    if "version" in getattr(model, "__class_vars__", ()):
        version = getattr(model, "version", 1)
    name = model.__name__
    if type(version) is not int or version < 1:
        raise ConfigurationError(
            f"{name}.version is {version!r}: a state class's version is a whole number, 1 or "
            "more (version: ClassVar[int] = 2)"
        )
    steps: dict[int, Upcaster] = {}
    for cls in reversed(model.__mro__):
        own: dict[int, str] = {}
        for attribute, value in vars(cls).items():
            function = value.__func__ if isinstance(value, staticmethod) else None
            step = getattr(function, _FROM, None)
            if function is None or step is None:
                continue
            if step in own:
                raise ConfigurationError(
                    f"{cls.__name__} declares two upcasters from version {step} ({own[step]} "
                    f"and {attribute}): keep one"
                )
            own[step] = attribute
            steps[step] = function
    beyond = sorted(step for step in steps if step >= version)
    if beyond:
        raise ConfigurationError(
            f"{name} is at version {version} but declares an upcaster from version "
            f"{beyond[0]}, which never runs: raise {name}.version to {beyond[-1] + 1}, or "
            "remove the upcaster"
        )
    return StateVersions(model, version, steps)


@functools.cache
def state_schema(model: type[BaseModel]) -> dict[str, Any] | None:
    """The JSON schema of a state class, with its version under ``VERSION_KEY``.

    ``None`` when pydantic cannot write one (a field type without a JSON schema): edited
    states of the class then go unchecked by an inspector that has no code.
    """
    try:
        schema: dict[str, Any] = {**model.model_json_schema(), VERSION_KEY: state_version(model)}
        json.dumps(schema, allow_nan=False)
    except Exception as exc:  # a field type without a JSON schema
        logger.debug("no JSON schema for state model %s: %s", model.__name__, exc)
        return None
    return schema


def schema_version(schema: Mapping[str, Any] | None) -> int | None:
    """The version a stored state schema records, or ``None`` (one stored before versions)."""
    version = None if schema is None else schema.get(VERSION_KEY)
    return version if type(version) is int and version >= 1 else None


def state_version(model: type[BaseModel]) -> int:
    """The version ``model`` declares (1 when it declares none)."""
    found = _versions.get(model)
    return found.version if found is not None else versions_of(model).version


def upcast(
    agent: str, model: type[BaseModel], state: Mapping[str, Any], stored_version: int
) -> dict[str, Any]:
    """The JSON of a state stored with ``stored_version``, brought to ``model``'s version.

    Each upcaster from ``stored_version`` up runs in turn on a copy of the JSON; the result
    is not validated (see [`read_state`][agentsnap.versions.read_state]).

    Raises:
        StateNotReadable: The state is of a newer version than ``model``; an upcaster of
            the chain is missing, raises, or does not return a JSON object.
    """
    versions = versions_of(model)
    current = versions.version
    value: dict[str, Any] = json.loads(json.dumps(state))  # the upcasters change a copy
    if stored_version == current:
        return value
    name = model.__name__
    # Every refusal names the same state: the agent, its class, both versions.
    refused = functools.partial(StateNotReadable, agent, name, stored_version, current)
    if stored_version > current:
        raise refused(
            step=None,
            detail=f"it was written by a newer version of {name}, and a state is never downcast: "
            "read it with the code that wrote it",
        )
    if stored_version < 1:
        raise refused(step=None, detail="a version is 1 or more")
    missing = versions.missing(stored_version)
    if missing is not None:
        raise refused(
            step=missing,
            detail=f"{name} has no upcaster from version {missing} to {missing + 1}: declare one "
            f"in its body with @upcaster(from_version={missing})",
        )
    for step in range(stored_version, current):
        function = versions.steps[step]
        what = f"its upcaster from version {step} to {step + 1} ({function.__name__})"
        try:
            value = function(value)  # a JSON object, checked below
        except Exception as exc:
            raise refused(step=step, detail=f"{what} raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(value, dict):
            raise refused(
                step=step,
                detail=f"{what} returned {type(value).__name__}, not a JSON object: return "
                "the state",
            )
    return value


def read_state(agent: str, model: type[BaseModel], text: str, stored_version: int) -> BaseModel:
    """The state ``model`` reads from ``text``, stored with ``stored_version``.

    A state of the class's version is validated as it is, as it always was; an older one is
    upcast first (see [`upcast`][agentsnap.versions.upcast]), then validated from its JSON,
    as a restore validates it.

    Args:
        agent: The agent (for the error message).
        model: The agent's state class, as the code declares it now.
        text: The stored state, as JSON text.
        stored_version: The version it was stored with.

    Raises:
        StateNotReadable: The chain of upcasters cannot take the state to the class's
            version, or the state does not validate against the class.
    """
    versions = versions_of(model)
    current = versions.version
    if stored_version == current:
        try:
            return model.model_validate_json(text)
        except ValidationError as exc:
            raise _invalid(agent, model, stored_version, current, exc) from exc
    value = upcast(agent, model, json.loads(text), stored_version)
    try:
        return model.model_validate_json(orjson.dumps(value))
    except (ValidationError, TypeError) as exc:
        raise _invalid(agent, model, stored_version, current, exc) from exc


def read_state_json(
    agent: str, model: type[BaseModel], text: str, stored_version: int
) -> dict[str, Any]:
    """The state as [`read_state`][agentsnap.versions.read_state] reads it, as JSON again.

    Raises:
        StateNotReadable: As for ``read_state``.
    """
    value: dict[str, Any] = read_state(agent, model, text, stored_version).model_dump(mode="json")
    return value


def check_state(
    agent: str, model: type[BaseModel], text: str, stored_version: int
) -> StateNotReadable | None:
    """Why ``model`` cannot read the stored state, or ``None`` when it can."""
    try:
        read_state(agent, model, text, stored_version)
    except StateNotReadable as exc:
        return exc
    return None


def _invalid(
    agent: str, model: type[BaseModel], stored: int, current: int, exc: Exception
) -> StateNotReadable:
    first = str(exc).strip().splitlines()
    where = "as stored" if stored == current else "once upcast"
    shown = "; ".join(line.strip() for line in first[1:3]) if len(first) > 1 else str(exc)
    hint = (
        f": when {model.__name__} changes in a way its stored states do not fit, raise its "
        f"version to {current + 1} and declare @upcaster(from_version={current})"
        if stored == current
        else ""
    )
    return StateNotReadable(
        agent,
        model.__name__,
        stored,
        current,
        step=None,
        detail=f"it does not validate {where} ({shown}){hint}",
    )
