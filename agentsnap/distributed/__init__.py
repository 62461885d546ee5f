"""Agents across processes: workers on NATS JetStream, consistent cuts into a shared store.

The same agents, unchanged, run spread over processes. Each ``agentsnap worker`` process
hosts some agents of one run (placed by name, or by a stable hash of the name:
[`place`][agentsnap.distributed.place]); every process builds the same
[`App`][agentsnap.distributed.App] and keeps only its own agents local, the others being
remote endpoints of its bus whose channels the
[`JetStreamTransport`][agentsnap.jetstream.JetStreamTransport] carries over NATS. The program
that created the run is its coordinator ([`DistributedRun`][agentsnap.distributed.DistributedRun]):
it hosts the environment, sends the input and numbers every snapshot.

Snapshots stay consistent cuts. Each worker runs the Chandy-Lamport protocol for the
processes it hosts ([`PartCoordinator`][agentsnap.distributed.PartCoordinator]), and writes
its **part** of snapshot ``k`` (its agents' cuts; the messages in flight on the channels into
them, with the stream-sequence range of those from other processes) in one transaction once
its agents have recorded ``k`` and every channel into them is closed for ``k``. The
coordinator joins the parts into an ordinary [`Snapshot`][agentsnap.Snapshot] once every
process has its part, checks it, and stores it complete; a part missing after a timeout fails
that snapshot, not the run. See the concepts page *Channel state as offsets*.

```python
from agentsnap.distributed import App, DistributedRun
from agentsnap.jetstream import JetStreamLink
from agentsnap.store.sql import SqlStore

link = await JetStreamLink.connect("nats://127.0.0.1:4222")
store = SqlStore("postgresql://127.0.0.1/agentsnap")
async with DistributedRun(link, store, make_app(), run_id="bank-1") as run:
    ...  # start `agentsnap worker ... --run bank-1 --group N/3` for N in 0, 1, 2
    run.send("teller-0", {"amount": 10})
    snapshot = await run.snapshot()
    idle = await run.run_until_idle()  # the run's cut once nothing is left to do
```

It needs the ``nats`` extra: ``pip install 'agentsnap[nats]'``.

**Rollback across processes.** The agents, checks and tools run as in one process: an app
declares checks ([`App.check`][agentsnap.distributed.App.check], or an agent's own
``evaluate``) and a retry policy (``App(retry=...)``), and side-effecting tools record their
calls in the ledger of the run's store, so they take effect once across rollbacks and
crashes. A rejected output in any worker is reported to the run's coordinator, the one
authority on rollbacks ([`RollbackAuthority`][agentsnap.distributed.RollbackAuthority]):
rejections reported by several workers at once become one rollback. It picks the last
complete snapshot before the rejected output, applies the retry policy, raises the
generation, and orders every process back to the cut; each one stops delivering (a
side-effecting call under way finishes first and its outcome lands in the ledger), fails its
snapshots in progress, restores its agents and channels (replaying the stream ranges the cut
recorded: see the concepts page) and says so. Once every process did, the coordinator sends
again the environment's input sent after the cut, records the rollback in the store, and
tells every process to resume: the rejected agent gets the reason as feedback, every agent's
``on_rollback`` is called. A rollback before the run's first complete snapshot goes back to
the run's start, which the coordinator stores as a complete snapshot to record it against.
When the retry policy gives up, every process stops delivering and
[`DistributedRun.exhausted`][agentsnap.distributed.DistributedRun.exhausted] says why; the run
is recorded as failed when the coordinator closes.

**Recovery.** The coordinator watches the agents' leases in the store. A worker whose leases
expired without being let go stopped: the snapshots in progress fail and none begins until
its agents are hosted again, by the same worker restarted or by another given its agents
(``agentsnap worker ... --wait 30`` waits for the leases to expire). A worker that starts
asks the coordinator for the run's generation and snapshot numbering; when its agents ran
before, the whole run rolls back to its last complete snapshot as above, the new worker
restoring them from it. Nothing is lost (the cut and the input after it are replayed) and no
effect happens twice (the ledger).

**Takeover.** A coordinator that dies is replaced by another
([`DistributedRun.take_over`][agentsnap.distributed.DistributedRun.take_over], or a standby
waiting on the run's lease): it takes the run's lease, which fences the dead one out, reads
the run back from the store and the stream, stores the snapshots the dead one left
unfinished as failed, and rolls the whole run back to its last complete snapshot; the workers
serve on throughout.

A restart of the NATS server is waited for (publishing and consuming go on where they
stopped; a worker gives up after ``nats_patience`` seconds), and a
[`StreamRetention`][agentsnap.distributed.StreamRetention] keeps the run's stream and parts
from growing: see *Channel state as offsets*.
"""

from __future__ import annotations

from agentsnap.distributed.app import App, check_run, load_app
from agentsnap.distributed.coordinator import DistributedRun, join_parts
from agentsnap.distributed.host import Host
from agentsnap.distributed.orders import RollbackOrder, broadcast_subject, control_subject
from agentsnap.distributed.placement import group_of, parse_group, place
from agentsnap.distributed.recording import PartCoordinator
from agentsnap.distributed.recovery import RollbackAuthority
from agentsnap.distributed.retention import Retained, StreamRetention, retain
from agentsnap.distributed.worker import AgentsHeld, Worker
from agentsnap.records import AgentLease, ChannelOffsets, SnapshotPart

__all__ = [
    "AgentLease",
    "AgentsHeld",
    "App",
    "ChannelOffsets",
    "DistributedRun",
    "Host",
    "PartCoordinator",
    "Retained",
    "RollbackAuthority",
    "RollbackOrder",
    "SnapshotPart",
    "StreamRetention",
    "Worker",
    "broadcast_subject",
    "check_run",
    "control_subject",
    "group_of",
    "join_parts",
    "load_app",
    "parse_group",
    "place",
    "retain",
]
