"""Run ownership: one runtime at a time owns a run, through a lease with a fencing token.

A run's lease is a row in its store: who owns the run, a **fencing token**, and until when
the lease holds. The owner renews it (a heartbeat, every third of its time to live); an owner
that stops renewing (its process died, or was suspended) loses the run once the lease
expires, and another runtime may take it over. A takeover raises the token by one, and the
store refuses every write still made under the old token, checked in the same transaction
as the write: an owner that wakes up after losing its run cannot change it.

A lease whose owner is a process of this host that no longer exists is taken over at once,
without waiting for it to expire. Owners on other hosts cannot be checked: their lease
decides, so the hosts' clocks should agree to well within the lease's time to live.

Example:
    ```python
    import asyncio

    from agentsnap.ownership import RunOwnership
    from agentsnap.records import RunInfo
    from agentsnap.store import MemoryStore

    async def main() -> None:
        store = MemoryStore()
        await store.create_run(RunInfo(id="run-1"))
        ownership = RunOwnership(store, "run-1", ttl=15.0)
        lease = await ownership.acquire()
        print(lease.token)  # 1: the run's first owner
        ownership.start_heartbeat(lambda lost: print("lost the run:", lost))
        ...  # run: every write to the run is now fenced by the token
        await ownership.release()

    asyncio.run(main())
    ```
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from agentsnap.exceptions import (
    ConfigurationError,
    NotFoundError,
    OwnershipLost,
    RunOwnedError,
    StoreError,
)
from agentsnap.liveness import owner_id, owner_is_gone, owner_is_live, owner_runs_here
from agentsnap.records import RunLease, utcnow
from agentsnap.store import KeptInDatabase

if TYPE_CHECKING:
    from agentsnap.ledger import Ledger
    from agentsnap.store import OneProcessStore

__all__ = ["RunOwnership", "owner_is_live"]

logger = logging.getLogger("agentsnap")

_POLL_FIRST = 0.02
_POLL_MAX = 0.5
"""Longest pause between two looks at a lease someone else holds."""
_RETRY_MAX = 1.0
"""Longest pause between two renewals that failed for a store error."""


class RunOwnership:
    """Takes, keeps and gives back the lease of one run.

    Args:
        store: The store that holds the run.
        run_id: The run.
        ttl: Seconds a lease holds without renewal; the heartbeat renews it every ``ttl / 3``.
        owner: Who owns the run, ``host:pid:token``; by default this process's
            [`owner_id`][agentsnap.ledger.owner_id], the name its ledger claims carry too,
            which is how a claim is tied to its run's owner.

    Raises:
        ConfigurationError: ``ttl`` is not positive.
    """

    def __init__(
        self, store: OneProcessStore, run_id: str, *, ttl: float = 15.0, owner: str | None = None
    ) -> None:
        if not ttl > 0:
            raise ConfigurationError(f"a run's lease needs ttl > 0 (seconds), got ttl={ttl!r}")
        self.store = store
        self.run_id = run_id
        self.ttl = ttl
        self.owner = owner if owner is not None else owner_id()
        self.lease: RunLease | None = None
        """The lease held, once acquired (renewals do not change it but for its expiry)."""
        self._ledgers: list[Ledger] = []
        self._heartbeat: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        token = None if self.lease is None else self.lease.token
        return f"RunOwnership(run_id={self.run_id!r}, owner={self.owner!r}, token={token})"

    async def acquire(self, *, wait: float = 0.0, refuse_live: bool = False) -> RunLease:
        """Take the run's lease, and fence the store (and the ledgers given) with its token.

        A run without a lease gets its first one (token 1). A lease that expired, or whose
        owner is a process of this host that no longer exists, is taken over (its token plus
        one). A live lease held by someone else is waited for, up to ``wait`` seconds, until
        it expires or its owner is gone.

        Args:
            wait: Seconds to wait for a live owner to let go; ``0`` to refuse at once.
            refuse_live: Refuse at once, whatever ``wait`` says, when the owner shows that it
                is alive: a process of this host that still runs, or a lease renewed while
                this call waits. ``wait`` is then only spent on an owner elsewhere that
                stopped renewing (a crashed host), until its lease expires.

        Returns:
            The lease now held.

        Raises:
            RunOwnedError: Another owner holds a live lease, still after ``wait`` seconds.
            NotFoundError: The store holds no such run.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(wait, 0.0)
        pause = _POLL_FIRST
        first_seen: RunLease | None = None
        while True:
            current = await self.store.get_lease(self.run_id)
            now = utcnow()
            expires_at = now + timedelta(seconds=self.ttl)
            if current is None:
                taken = await self.store.take_lease(
                    self.run_id, self.owner, expires_at, replacing=None
                )
            elif self.lease is not None and current.token == self.lease.token:
                # Already ours: just renew it.
                renewed = await self.store.renew_lease(self.run_id, current.token, expires_at)
                taken = current.model_copy(update={"expires_at": expires_at}) if renewed else None
            elif not owner_is_live(current, now):
                taken = await self.store.take_lease(
                    self.run_id, self.owner, expires_at, replacing=current.token
                )
                if taken is not None:
                    logger.info(
                        "run %s: took the lease over from %s (%s), token %d",
                        self.run_id,
                        current.owner,
                        "gone" if owner_is_gone(current.owner) else "expired",
                        taken.token,
                    )
            else:
                remaining = deadline - loop.time()
                if first_seen is None or first_seen.token != current.token:
                    first_seen = current
                renewed = current.expires_at > first_seen.expires_at
                alive = refuse_live and (renewed or owner_runs_here(current.owner))
                if remaining <= 0 or alive:
                    raise RunOwnedError(self.run_id, current.owner, current.expires_at)
                until_expiry = (current.expires_at - now).total_seconds()
                await asyncio.sleep(max(min(pause, remaining, until_expiry), 0.001))
                pause = min(pause * 2, _POLL_MAX)
                continue
            if taken is not None:
                self._hold(taken)
                return taken
            # Lost a race for the lease: look at it again.

    def _hold(self, lease: RunLease) -> None:
        self.lease = lease
        self.store.fence(self.run_id, lease.token)
        for ledger in self._ledgers:
            ledger.fence(self.run_id, lease.token)

    def fence_ledger(self, ledger: Ledger) -> None:
        """Fence ``ledger``'s claims and updates of the run's tool calls with the lease's
        token, now if the lease is held, else once it is acquired.

        Only a ledger in the store's database can check the lease: a ledger whose ``url``
        is not the store's is left as it is (a memory ledger's ``fence`` does nothing).
        """  # noqa: D205
        store_url = self.store.url if isinstance(self.store, KeptInDatabase) else None
        if getattr(ledger, "url", store_url) != store_url:
            return
        self._ledgers.append(ledger)
        if self.lease is not None:
            ledger.fence(self.run_id, self.lease.token)

    def start_heartbeat(
        self,
        on_lost: Callable[[OwnershipLost], None],
        on_cancel: Callable[[str], None] | None = None,
    ) -> None:
        """Renew the lease every ``ttl / 3`` seconds in a task, until ``release``.

        ``on_lost`` is called once, from the task, when the lease was taken over (the token
        changed); the heartbeat then stops. ``on_cancel``, when given, is called once with
        the reason when someone asked the run to stop
        ([`Store.request_cancel`][agentsnap.store.RunStore.request_cancel]): each renewal looks
        for a request, so it is seen within ``ttl / 3`` seconds.

        While the store fails, renewing is retried for as long as it takes: a lease that
        expired meanwhile is still this runtime's unless another took the run over, which
        the next renewal (and every fenced write) finds out from the token.

        Raises:
            ConfigurationError: The lease is not held, or the heartbeat already runs.
        """
        lease = self.lease
        if lease is None:
            raise ConfigurationError("acquire the run's lease before starting its heartbeat")
        if self._heartbeat is not None and not self._heartbeat.done():
            raise ConfigurationError(f"the heartbeat of run {self.run_id} already runs")
        self._heartbeat = asyncio.get_running_loop().create_task(
            self._beat(lease, on_lost, on_cancel), name=f"agentsnap-lease-{self.run_id}"
        )

    async def _beat(
        self,
        lease: RunLease,
        on_lost: Callable[[OwnershipLost], None],
        on_cancel: Callable[[str], None] | None,
    ) -> None:
        every = self.ttl / 3
        holds_until = lease.expires_at
        while True:
            await asyncio.sleep(every)
            expires_at = utcnow() + timedelta(seconds=self.ttl)
            pause = min(every / 4, _RETRY_MAX)
            while True:
                try:
                    renewed = await self.store.renew_lease(self.run_id, lease.token, expires_at)
                    break
                except StoreError as exc:
                    if (holds_until - utcnow()).total_seconds() <= 0:
                        logger.error(
                            "run %s: its lease expired while the database was unavailable; "
                            "renewing goes on (another process may take the run over now, "
                            "which ends this one's writes): %s",
                            self.run_id,
                            exc,
                        )
                    else:
                        logger.warning("run %s: renewing the lease failed: %s", self.run_id, exc)
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, _RETRY_MAX)
                    expires_at = utcnow() + timedelta(seconds=self.ttl)
            if not renewed:
                current = await _quietly(self.store.get_lease(self.run_id))
                detail = "" if current is None else f"{current.owner} holds it now"
                _tell(on_lost, OwnershipLost(self.run_id, lease.token, detail))
                return
            holds_until = expires_at
            self.lease = lease = lease.model_copy(update={"expires_at": expires_at})
            if on_cancel is not None:
                reason = await self._cancel_requested()
                if reason is not None:
                    _tell_cancel(on_cancel, self.run_id, reason)
                    on_cancel = None  # once; the lease is still renewed until release

    async def _cancel_requested(self) -> str | None:
        """Why someone asked the run to stop, if anyone did (``None`` on a store error)."""
        try:
            run = await self.store.get_run(self.run_id)
        except (StoreError, NotFoundError) as exc:  # looked for again at the next renewal
            logger.warning("run %s: looking for a cancel request failed: %s", self.run_id, exc)
            return None
        return run.cancel_requested

    async def release(self) -> None:
        """Stop the heartbeat and end the lease now (if it is still ours).

        The run keeps its lease, expired: the next owner's token is higher still. The store
        stays fenced with the old token, so a write after this is refused once someone
        else took the run.
        """
        heartbeat, self._heartbeat = self._heartbeat, None
        if heartbeat is not None:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
        lease = self.lease
        if lease is not None:
            await self.store.release_lease(self.run_id, lease.token)


async def _quietly(read: Awaitable[RunLease | None]) -> RunLease | None:
    """The lease ``read`` gives, or ``None`` if the store failed."""
    try:
        return await read
    except StoreError:
        return None


def _tell_cancel(on_cancel: Callable[[str], None], run_id: str, reason: str) -> None:
    logger.warning("run %s: cancel requested (%s); stopping it", run_id, reason)
    try:
        on_cancel(reason)
    except Exception:  # the heartbeat must go on renewing the lease until the run closes
        logger.exception("run %s: the on_cancel callback failed", run_id)


def _tell(on_lost: Callable[[OwnershipLost], None], error: OwnershipLost) -> None:
    logger.error("%s", error)
    try:
        on_lost(error)
    except Exception:  # the callback's failure must not hide that the run was lost
        logger.exception("run %s: the on_lost callback failed", error.run_id)
