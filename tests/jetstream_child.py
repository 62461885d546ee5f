"""The second process of ``test_jetstream.py``: hosts ``c0`` and ``c1`` of a run on NATS.

It sends ``N`` messages on each channel from ``c0``, ``c1`` to ``p0``, ``p1`` (hosted by the
test's process), takes the ``N`` the test sends on each channel the other way, and prints one
JSON line: whether every channel into it held ``0 .. N-1`` in order, and how many it took.

Run by the test as ``python tests/jetstream_child.py NATS_URL RUN N``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import defaultdict

from agentsnap.bus import AsyncioScheduler, Bus, Channel
from agentsnap.jetstream import JetStreamLink, JetStreamTransport
from agentsnap.messages import Message

HERE = ["c0", "c1"]
THERE = ["p0", "p1"]


async def main(url: str, run: str, count: int) -> int:
    link = await JetStreamLink.connect(url)
    transport = JetStreamTransport(link, run, HERE)
    scheduler = AsyncioScheduler()
    bus = Bus(scheduler, transport)
    received: dict[tuple[str, str], list[object]] = defaultdict(list)
    done = asyncio.Event()

    async def deliver(channel: Channel) -> None:
        item = channel.take()
        if type(item) is Message:
            bus.delivered(channel, item)
            received[item.src, item.dst].append(item.payload)
            if sum(len(payloads) for payloads in received.values()) == 4 * count:
                done.set()

    scheduler.bind(bus, deliver)
    for name in [*THERE, *HERE]:
        bus.add(name, 0)
    scheduler.start()
    await transport.start()
    for i in range(count):
        for src in HERE:
            for dst in THERE:
                bus.send(bus.endpoints[src], dst, i, "message", None)
        if i % 50 == 0:
            await asyncio.sleep(0.001)
    await transport.flush()
    await asyncio.wait_for(done.wait(), 60)
    in_order = all(received[src, dst] == list(range(count)) for src in THERE for dst in HERE)
    await scheduler.close()
    await link.close()
    print(json.dumps({"in_order": in_order, "received": sum(map(len, received.values()))}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
