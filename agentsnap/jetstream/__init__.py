"""Channels between processes on NATS JetStream: the transport of a run spread over processes.

Each channel ``src -> dst`` of a run is a subject, ``agentsnap.<run>.<dst>.<src>``, of one
stream per run. Where a channel's two ends run in one process it stays a plain in-process
channel; otherwise the sender's side publishes each item, in order and de-duplicated by id,
and the receiver's side consumes them in order, each with its **stream sequence**: the
offset a snapshot records, per channel, for the range of items in flight across a cut, and
from which a restore replays (see the concepts page *Channel state as offsets*).

```python
from agentsnap.bus import AsyncioScheduler, Bus
from agentsnap.jetstream import JetStreamLink, JetStreamTransport

link = await JetStreamLink.connect("nats://127.0.0.1:4222")
transport = JetStreamTransport(link, run="run-1", local={"$env", "planner"})
bus = Bus(AsyncioScheduler(), transport)  # the bus binds the transport
...  # add every process of the run to the bus, local or not
await transport.start()
```

It needs the ``nats`` extra: ``pip install 'agentsnap[nats]'``.
"""

from __future__ import annotations

try:
    import nats  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "agentsnap.jetstream needs the NATS client (nats-py): pip install 'agentsnap[nats]'"
    ) from exc

from agentsnap.jetstream.codec import Envelope, decode, encode, encode_token
from agentsnap.jetstream.link import JetStreamLink, Published
from agentsnap.jetstream.transport import (
    ChannelOffset,
    IncomingChannel,
    JetStreamTransport,
    OutgoingChannel,
)

__all__ = [
    "ChannelOffset",
    "Envelope",
    "IncomingChannel",
    "JetStreamLink",
    "JetStreamTransport",
    "OutgoingChannel",
    "Published",
    "decode",
    "encode",
    "encode_token",
]
