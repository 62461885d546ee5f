"""Where runs and snapshots are kept.

A store is a set of roles, each a small protocol:

- [`RunStore`][agentsnap.store.RunStore]: runs, snapshots, rollbacks, state schemas (every
  user);
- [`RunLog`][agentsnap.store.RunLog]: a run's journal and replay log (the runtime, the
  inspector);
- [`RunLeases`][agentsnap.store.RunLeases]: who owns a run, leases and fencing (the runtime,
  the inspector);
- [`RunQueries`][agentsnap.store.RunQueries]: runs by filter, snapshots by page, summaries,
  histories (the inspector);
- [`DistributedParts`][agentsnap.store.DistributedParts]: snapshot parts and agent leases
  (the workers of a distributed run).

Each user asks for the union of the roles it uses: a [`Runtime`][agentsnap.Runtime] for a
[`OneProcessStore`][agentsnap.store.OneProcessStore], the coordinator and workers of a
distributed run for a [`DistributedStore`][agentsnap.store.DistributedStore], the inspector
for an [`InspectedStore`][agentsnap.store.InspectedStore].
[`Store`][agentsnap.store.Store], every role, is what the built-in backends implement; a
backend for one-process runs needs only the three roles a runtime asks for. An optional
capability is a protocol of its own, found with ``isinstance``: a store in a database other
processes can open is [`KeptInDatabase`][agentsnap.store.KeptInDatabase].

The runtime hands a store each snapshot once the snapshot is complete (or has failed), in
one call; a store must make that write atomic, so a snapshot is either entirely there or not
at all.

A store also keeps who owns each run (a lease with a fencing token, see
[`agentsnap.ownership`][agentsnap.ownership]) and each run's replay log. Once the owner has
fenced the store for a run, the store refuses that owner's writes to the run as soon as
another owner has taken the lease over.

A run spread over processes (see [`agentsnap.distributed`][agentsnap.distributed]) also
keeps, per snapshot in progress, each worker's part (written in one transaction each), and
which worker hosts each agent (a lease per agent).

A store may also list the LangGraph checkpoints of its runs' graph agents: that optional
protocol, [`GraphCheckpointIndex`][agentsnap.store.graph.GraphCheckpointIndex], lives in
[`agentsnap.store.graph`][agentsnap.store.graph] with the storage of LangGraph checkpoints.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agentsnap.store._roles import (
    DistributedParts,
    DistributedStore,
    InspectedStore,
    KeptInDatabase,
    OneProcessStore,
    RunLeases,
    RunLog,
    RunQueries,
    RunStore,
)
from agentsnap.store.memory import MemoryStore

__all__ = [
    "DistributedParts",
    "DistributedStore",
    "InspectedStore",
    "KeptInDatabase",
    "MemoryStore",
    "OneProcessStore",
    "RunLeases",
    "RunLog",
    "RunQueries",
    "RunStore",
    "Store",
]


@runtime_checkable
class Store(DistributedStore, InspectedStore, Protocol):
    """The contract every built-in store fulfils: every role, for every user.

    [`MemoryStore`][agentsnap.store.MemoryStore] and
    [`SqlStore`][agentsnap.store.sql.SqlStore] are stores; a backend of its own may
    implement only the roles its users need (see
    [`OneProcessStore`][agentsnap.store.OneProcessStore]). Fencing is described under
    [`RunLeases`][agentsnap.store.RunLeases], interrupted runs under
    [`RunStore`][agentsnap.store.RunStore].
    """
