"""What kind of database failure an error is: the kinds, below the dialects and the retries.

[`Fault`][agentsnap.store.faults.Fault] is defined here, importing nothing of agentsnap nor
SQLAlchemy, because two modules use it and one of them uses the other:
[`agentsnap.store.dialect`][agentsnap.store.dialect] says which fault each driver error code is,
and [`agentsnap.store.faults`][agentsnap.store.faults], which classifies errors through the
dialects and retries the passing faults, re-exports it. Import it from there.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Fault"]


class Fault(StrEnum):
    """What kind of database failure an error is."""

    CONNECTION = "connection"
    """The connection was lost or refused; a commit in flight may or may not have happened."""
    UNAVAILABLE = "unavailable"
    """The server is starting, shutting down, or out of connections or memory."""
    CONFLICT = "conflict"
    """A serialization failure or a deadlock: the transaction was rolled back."""
    LOCKED = "locked"
    """A lock was not granted in time (another writer holds the database or the row)."""
    TIMEOUT = "timeout"
    """The operation took longer than the policy allows (no answer from the database)."""
    DISK_FULL = "disk_full"
    """The database's disk is full."""
    MISSING = "missing"
    """The database does not exist: it must be created, or the URL fixed; retrying cannot help."""
    PERMANENT = "permanent"
    """A constraint, the schema, bad data: retrying cannot help."""

    @property
    def transient(self) -> bool:
        """Whether the same operation may succeed if tried again later."""
        return self not in {Fault.PERMANENT, Fault.MISSING}
