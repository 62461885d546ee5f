"""Who a process is, and whether the owner of a claim or of a run is still there.

An owner is named ``host:pid:token``: the host, the process id, and a token drawn once per
process, so that a later process that happens to get the same pid is not mistaken for an
earlier one. A process of this host that no longer runs is gone at once (so is one that was
killed and not yet reaped by its parent, a zombie, where ``/proc`` tells); an owner on another
host cannot be checked, and only its lease (its expiry) says whether it is still there.

This module sits below the store and the ledger, which both use it; it imports neither.
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import TYPE_CHECKING

from agentsnap.exceptions import OwnershipLost

if TYPE_CHECKING:
    from datetime import datetime

    from agentsnap.records import RunLease

__all__ = [
    "lost",
    "owner_gone",
    "owner_id",
    "owner_is_gone",
    "owner_is_live",
    "owner_runs_here",
]

_owner: tuple[int, str] | None = None


def owner_id() -> str:
    """Who this process is in the ledger: ``host:pid:token``, new in every process."""
    global _owner  # noqa: PLW0603  # one identity per process, renewed after a fork
    pid = os.getpid()
    if _owner is None or _owner[0] != pid:
        _owner = (pid, f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:12]}")
    return _owner[1]


def owner_is_gone(owner: str | None) -> bool:
    """True only when ``owner`` surely stopped: a process of this host that no longer runs.

    A process that exited and was not reaped yet by its parent (a zombie) no longer runs.
    ``None`` (nobody) is gone. Owners on other hosts, and names not of the form
    ``host:pid:token``, cannot be checked: they are not gone, and their lease decides.
    """
    if owner is None:
        return True
    host, _, rest = owner.partition(":")
    pid_text, _, _ = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    if int(pid_text) == os.getpid():
        return owner != owner_id()  # this pid, an earlier process: that one is gone
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, owned by someone else
        return _zombie(pid)
    return _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits to be reaped by its parent (a zombie).

    Signalling a zombie succeeds, as if it ran, yet it does nothing any more. Told by its
    state in ``/proc``; where there is no ``/proc`` (macOS), a zombie is taken for a live
    process, and its lease decides.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except FileNotFoundError:  # gone meanwhile, or no /proc at all
        return os.path.isdir("/proc")
    except OSError:
        return False
    # The command name, in parentheses, may itself hold spaces and parentheses.
    fields = text[text.rfind(b")") + 2 :].split(b" ", 1)
    return fields[0] in {b"Z", b"X"}


def owner_runs_here(owner: str | None) -> bool:
    """Whether ``owner`` is a process of this host that still runs (this one included)."""
    if owner is None:
        return False
    host, _, rest = owner.partition(":")
    return (
        host == socket.gethostname()
        and rest.partition(":")[0].isdigit()
        and (not owner_is_gone(owner))
    )


def owner_is_live(lease: RunLease | None, now: datetime) -> bool:
    """Whether a run has a live owner: a lease that has not expired, held by a process that is
    not known to be gone.

    Args:
        lease: The run's lease (``None`` when the run never had one).
        now: The present, timezone-aware.
    """  # noqa: D205
    return lease is not None and lease.expires_at > now and not owner_is_gone(lease.owner)


def owner_gone(lease: RunLease | None) -> str:
    """Why a run recorded as running has no live owner, in one line (its status reason)."""
    if lease is None:
        return "no runtime ever owned it"
    if owner_is_gone(lease.owner):
        return f"its owner {lease.owner} stopped without closing it; resume() continues it"
    return (
        f"its owner {lease.owner} stopped renewing its lease (expired at "
        f"{lease.expires_at.isoformat(timespec='seconds')}); resume() continues it"
    )


def lost(run_id: str, token: int, holder: tuple[str, int] | None) -> OwnershipLost:
    """The error for a write refused because the run's lease no longer has ``token``.

    Args:
        run_id: The run.
        token: The token the writer holds.
        holder: ``(owner, token)`` of the lease as it stands, or ``None`` if it has none.
    """
    if holder is None:
        return OwnershipLost(run_id, token, "the run has no lease any more")
    owner, current = holder
    return OwnershipLost(run_id, token, f"{owner} holds it now, with token {current}")
