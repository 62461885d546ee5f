"""What ``Store.list_runs`` filters on, checked once for every store.

Every store checks the filters the same way (``RunListing.list_runs``, which every store's
``list_runs`` is) and matches a run the same way (``RunFilter.matches``); an SQL store also
turns them into a query, so that only the runs asked for are read.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypedDict, Unpack

from agentsnap.exceptions import ConfigurationError
from agentsnap.records import RunInfo, RunStatus

__all__ = ["RunFilter", "RunFilters", "RunListing"]

_STATUSES = ", ".join(status.value for status in RunStatus)


class RunFilters(TypedDict, total=False):
    """The filters ``list_runs`` takes, as keywords; see
    [`RunQueries.list_runs`][agentsnap.store.RunQueries.list_runs].
    """  # noqa: D205

    status: RunStatus | str | Collection[RunStatus | str] | None
    name: str | None
    tags: Mapping[str, str] | None
    since: datetime | None
    limit: int | None


@dataclass(frozen=True)
class RunFilter:
    """The filters of one ``list_runs`` call, checked."""

    statuses: frozenset[RunStatus] | None = None
    """Only runs in one of these statuses (as reported); ``None`` for every status."""
    name: str | None = None
    """Only runs of this name; ``*`` in it stands for any characters."""
    tags: dict[str, str] = field(default_factory=dict)
    """Only runs that carry every one of these tags."""
    since: datetime | None = None
    """Only runs created at or after this time."""
    limit: int | None = None
    """At most this many runs: the newest."""

    @classmethod
    def of(cls, caller: str, filters: RunFilters) -> RunFilter:
        """The filters given to ``caller`` as keywords, checked.

        Raises:
            ConfigurationError: A filter's value is invalid.
            TypeError: A keyword is not one of the filters.
        """
        for keyword in filters:
            if keyword not in RunFilters.__optional_keys__:
                raise TypeError(f"{caller}() got an unexpected keyword argument {keyword!r}")
        status = filters.get("status")
        return cls(
            statuses=None if status is None else _statuses(status),
            name=_name(filters.get("name")),
            tags=_tags(filters.get("tags")),
            since=_since(filters.get("since")),
            limit=_limit(filters.get("limit")),
        )

    @property
    def selects_all(self) -> bool:
        """Whether no filter is set (every run is listed)."""
        return (
            self.statuses is None
            and self.name is None
            and not self.tags
            and self.since is None
            and self.limit is None
        )

    def matches(self, run: RunInfo) -> bool:
        """Whether ``run`` (with its status as reported) passes every filter but ``limit``."""
        if self.statuses is not None and run.status not in self.statuses:
            return False
        if self.name is not None and (run.name is None or not name_matches(self.name, run.name)):
            return False
        if any(run.tags.get(key) != value for key, value in self.tags.items()):
            return False
        return self.since is None or run.created_at >= self.since


class RunListing:
    """``list_runs`` for a store: the filters are checked here, once for every store, and
    the store's ``_list_runs`` lists the runs that pass them.
    """  # noqa: D205

    async def list_runs(self, **filters: Unpack[RunFilters]) -> list[RunInfo]:
        """The runs that pass every filter given (every run without one), oldest first.

        See [`RunQueries.list_runs`][agentsnap.store.RunQueries.list_runs].

        Raises:
            ConfigurationError: A status is not a ``RunStatus`` (or one's value), the name is
                empty, a tag is not a string, ``since`` has no time zone, or ``limit`` is not
                a whole number of at least 1.
            TypeError: A keyword is not one of the filters.
        """
        return await self._list_runs(RunFilter.of("list_runs", filters))

    async def _list_runs(self, wanted: RunFilter) -> list[RunInfo]:
        raise NotImplementedError


def name_matches(pattern: str, name: str) -> bool:
    """Whether ``name`` is ``pattern``, where each ``*`` stands for any characters."""
    if "*" not in pattern:
        return name == pattern
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, name, flags=re.DOTALL) is not None


def _statuses(status: RunStatus | str | Collection[RunStatus | str]) -> frozenset[RunStatus]:
    given = [status] if isinstance(status, str) else list(status)
    found = set()
    for value in given:
        try:
            found.add(RunStatus(value))
        except ValueError:
            raise ConfigurationError(
                f"{value!r} is not a run status: use one of {_STATUSES}"
            ) from None
    return frozenset(found)


def _name(name: str | None) -> str | None:
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise ConfigurationError(
            f"name= must be a run's name (a non-empty string), got {name!r}: pass None to "
            "list runs of every name"
        )
    return name


def _tags(tags: Mapping[str, str] | None) -> dict[str, str]:
    if tags is None:
        return {}
    if not isinstance(tags, Mapping):
        raise ConfigurationError(
            f"tags= must be a mapping of strings to strings, got {type(tags).__name__}: "
            "pass tags={'team': 'billing'}"
        )
    for key, value in tags.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ConfigurationError(
                f"tags= must map strings to strings, got {key!r}: {value!r}: pass "
                "tags={'team': 'billing'}"
            )
    return dict(tags)


def _since(since: datetime | None) -> datetime | None:
    if since is None:
        return None
    if not isinstance(since, datetime):
        raise ConfigurationError(
            f"since= must be a datetime, got {type(since).__name__}: pass "
            "datetime.now(UTC) - timedelta(days=7), say"
        )
    if since.tzinfo is None or since.utcoffset() is None:
        raise ConfigurationError(
            f"since={since.isoformat()} has no time zone, so the moment it names is unknown: "
            "pass an aware datetime (tzinfo=UTC, say)"
        )
    return since


def _limit(limit: int | None) -> int | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(
            f"limit= must be a whole number of at least 1, got {limit!r}: pass None for no limit"
        )
    return limit
