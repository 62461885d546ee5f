"""Database faults: what kind a failure is, and retrying the ones that pass.

A connection dropped by a proxy, a server restarting, a serialization failure, a lock held
by another process or a full disk all make a database operation fail, and all of them go
away again. Stores and ledgers run every operation through a
[`StoreRetry`][agentsnap.store.faults.StoreRetry] policy: the first attempt runs as it
would without one (no cost on the happy path); a failure that
[`classify`][agentsnap.store.faults.classify] calls transient is retried with exponential
backoff and jitter (tenacity) until the policy's deadline, each attempt bounded by its
timeout. Errors that retrying cannot fix (a constraint, the schema, bad data) are raised at
once.

Example:
    ```python
    from agentsnap import StoreRetry
    from agentsnap.store.sql import SqlStore

    # Ride out outages of up to five minutes; no statement may take more than 30 s.
    store = SqlStore("sqlite:///agentsnap.db", retry=StoreRetry(timeout=30.0, deadline=300.0))
    ```

Faults are recognised from the driver's own codes: PostgreSQL's SQLSTATE (class ``08``
connection exception, ``57P0x`` the server shutting down or starting, ``40001``/``40P01``
serialization failure and deadlock, ``55P03`` lock not available, ``57014`` statement
timeout, ``53100`` disk full, class ``53`` insufficient resources, ``3D000`` a database that
does not exist), SQLite's result codes (``SQLITE_BUSY``, ``SQLITE_LOCKED``, ``SQLITE_FULL``,
``SQLITE_IOERR``), SQLAlchemy's ``connection_invalidated``, and the operating system's
``ENOSPC``. Message text is read in one case only: libpq keeps no SQLSTATE when the server
refuses a connection, so a database that does not exist is told by the server's message
(``database "…" does not exist``); a server set to another language for its messages makes
it a connection fault, retried until the deadline.

A database that does not exist ([`Fault.MISSING`][agentsnap.store.faults.Fault]) is not
retried: the error says so at once, and how to create it.

A retried write must not happen twice. When a connection is lost while a commit is in flight,
the client cannot know whether it happened: every store and ledger write therefore checks,
on its second and later attempts, whether the first one was in fact committed (a snapshot,
rollback or lease with its id or token, a journal segment, a replay segment, a claim by the
same owner and attempt, an update whose values are already there), and then does not write
again.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import tenacity

from agentsnap.exceptions import ConfigurationError, StoreError
from agentsnap.store._fault_kinds import Fault

__all__ = ["Fault", "StoreRetry", "classify", "describe"]

logger = logging.getLogger("agentsnap.store")

T = TypeVar("T")


def classify(error: BaseException) -> Fault | None:
    """The kind of database failure ``error`` is, or ``None`` if it is not one.

    Follows the error's causes (a ``StoreError`` made from SQLAlchemy's error made from the
    driver's) and decides by the first that carries a code.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        fault = _own_fault(current)
        if fault is not None:
            return fault
        orig = getattr(current, "orig", None)  # SQLAlchemy's DBAPIError wraps the driver's
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return None


def _own_fault(error: BaseException) -> Fault | None:
    """The fault ``error`` itself says it is, without looking at its causes."""
    if isinstance(error, (TimeoutError, asyncio.TimeoutError)):
        return Fault.TIMEOUT
    if getattr(error, "connection_invalidated", False):
        return Fault.CONNECTION
    # Each dialect knows its driver's error codes. The dialects are imported when first
    # needed: they load SQLAlchemy, which ``import agentsnap`` (StoreRetry) does without.
    from agentsnap.store.dialect import driver_fault  # noqa: PLC0415

    fault = driver_fault(error)
    if fault is not None:
        return fault
    if type(error).__module__.startswith("sqlalchemy"):
        name = type(error).__name__
        if name == "TimeoutError":  # the connection pool had none free in time
            return Fault.UNAVAILABLE
        return None  # look at the driver's error under it
    if isinstance(error, OSError):
        if error.errno == errno.ENOSPC:
            return Fault.DISK_FULL
        return Fault.CONNECTION
    return None


def describe(fault: Fault, where: str) -> str:
    """A short explanation of ``fault`` for an error message about database ``where``."""
    return {
        Fault.CONNECTION: f"{where} cannot be reached (the connection was refused or lost)",
        Fault.UNAVAILABLE: f"{where} is unavailable (starting, stopping or out of resources)",
        Fault.CONFLICT: f"{where} aborted the transaction (serialization failure or deadlock)",
        Fault.LOCKED: f"{where} is locked by another writer",
        Fault.TIMEOUT: f"{where} did not answer in time",
        Fault.DISK_FULL: f"the disk of {where} is full: free some space",
        Fault.MISSING: f"{where} does not exist",
        Fault.PERMANENT: f"{where} refused the operation",
    }[fault]


@dataclass(frozen=True)
class StoreRetry:
    """How a store or ledger retries database operations that failed for a passing reason.

    Attributes:
        timeout: Seconds one attempt may take: connecting, a statement (PostgreSQL's
            ``statement_timeout``), waiting for SQLite's write lock. An attempt that takes
            longer fails as [`Fault.TIMEOUT`][agentsnap.store.faults.Fault] and is retried.
        deadline: Seconds an operation keeps retrying from its first failure; then the
            last error is raised. ``0`` retries nothing.
        first_wait: Seconds before the first retry; the wait doubles after each failure,
            with random jitter, up to ``max_wait``.
        max_wait: The longest wait between two attempts.
    """

    timeout: float = 10.0
    deadline: float = 60.0
    first_wait: float = 0.05
    max_wait: float = 2.0

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ConfigurationError(
                f"StoreRetry timeout must be a positive number of seconds, not {self.timeout!r}"
            )
        for name in ("deadline", "first_wait", "max_wait"):
            value = getattr(self, name)
            if not value >= 0:
                raise ConfigurationError(
                    f"StoreRetry {name} must be zero or more seconds, not {value!r}"
                )

    @classmethod
    def never(cls, *, timeout: float = 10.0) -> StoreRetry:
        """A policy that retries nothing (each attempt still bounded by ``timeout``)."""
        return cls(timeout=timeout, deadline=0.0)

    async def call(
        self,
        what: str,
        operation: Callable[..., Awaitable[T]],
        *args: Any,
        where: str,
        bounded: bool = False,
    ) -> T:
        """Run ``operation``, retrying transient faults until the deadline.

        ``operation(again, *args)`` is called with ``again`` false the first time and true
        on every retry, when it must first check whether an earlier attempt was committed
        after all.

        Args:
            what: What the operation does, for messages: a ``str.format`` template filled
                with ``args`` only when a message is made ("write snapshot {0.seq}").
            operation: The work, one attempt per call.
            *args: Passed on to ``operation``.
            where: The database, for messages.
            bounded: Bound each attempt by ``timeout`` here (for drivers that can hang on
                a silent network); others bound their waits themselves. SQLAlchemy discards
                a connection whose operation was cancelled, and the whole pool after a
                lost connection, so the next attempt starts on a sound one.

        Raises:
            StoreError: A permanent failure, or a transient one that outlasted the deadline,
                saying what failed and why; the driver's error is its cause.
        """
        try:  # the first attempt inline: no fault, no cost
            if not bounded:
                return await operation(False, *args)
            async with asyncio.timeout(self.timeout):
                return await operation(False, *args)
        except Exception as exc:
            return await self.after(exc, what, operation, *args, where=where, bounded=bounded)

    async def after(
        self,
        error: Exception,
        what: str,
        operation: Callable[..., Awaitable[T]],
        *args: Any,
        where: str,
        bounded: bool = False,
    ) -> T:
        """Go on as [`call`][agentsnap.store.faults.StoreRetry.call] does once its first
        attempt failed with ``error``: retry a transient fault, raise anything else.

        For the hottest operations, which make their first attempt themselves rather than
        through ``call``.
        """  # noqa: D205
        fault = classify(error)
        if fault is None:
            raise error
        what = what.format(*args)
        if not fault.transient or not self.deadline:
            raise _error(what, where, fault, error) from error
        return await self._retry(what, operation, args, where, bounded, (error, fault))

    async def _attempt(
        self,
        operation: Callable[..., Awaitable[T]],
        again: bool,
        args: tuple[Any, ...],
        bounded: bool,
    ) -> T:
        if bounded:
            async with asyncio.timeout(self.timeout):
                return await operation(again, *args)
        return await operation(again, *args)

    async def _retry(  # noqa: PLR0917
        self,
        what: str,
        operation: Callable[..., Awaitable[T]],
        args: tuple[Any, ...],
        where: str,
        bounded: bool,
        first: tuple[Exception, Fault],
    ) -> T:
        started = time.monotonic()
        logger.warning("could not %s, retrying: %s", what, describe(first[1], where))
        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_delay(self.deadline),
            wait=tenacity.wait_exponential_jitter(
                multiplier=self.first_wait, max=self.max_wait, jitter=self.first_wait
            ),
            retry=tenacity.retry_if_exception(_transient),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._attempt(operation, True, args, bounded)
        except Exception as exc:
            fault = classify(exc)
            if fault is None:
                raise
            waited = time.monotonic() - started
            if fault.transient:
                raise _error(
                    what, where, fault, exc, f"; gave up after retrying for {waited:.1f} s"
                ) from exc
            raise _error(what, where, fault, exc) from exc
        raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover


def _transient(error: BaseException) -> bool:
    fault = classify(error)
    return fault is not None and fault.transient


def _error(what: str, where: str, fault: Fault, error: Exception, tail: str = "") -> StoreError:
    """``error`` as the StoreError to raise: kept as it is when it already is one."""
    if isinstance(error, StoreError) and not fault.transient:
        return error
    detail = _first_line(error)
    remedy = _remedy(fault, error)
    advice = f": {remedy}" if remedy else ""
    return StoreError(f"could not {what}: {describe(fault, where)}{advice}{tail} ({detail})")


def _remedy(fault: Fault, error: BaseException) -> str | None:
    """What the dialect of the driver's error under ``error`` says to do about ``fault``."""
    from agentsnap.store.dialect import driver_remedy  # noqa: PLC0415 (see _own_fault)

    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        remedy = driver_remedy(fault, current)
        if remedy is not None:
            return remedy
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return None


def _first_line(error: BaseException) -> str:
    cause: Any = error
    # The driver's own message says most; SQLAlchemy's adds the statement and a link.
    while isinstance(cause, StoreError) and cause.__cause__ is not None:
        cause = cause.__cause__
    orig = getattr(cause, "orig", None)
    if isinstance(orig, BaseException):
        cause = orig
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0]}" if text else type(cause).__name__
