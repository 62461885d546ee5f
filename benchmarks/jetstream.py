"""Messages per second through one JetStream channel, against the in-process bus hand-off.

Both sides send N small messages from agent ``a`` to agent ``b``, whose delivery only counts
them, yielding to the event loop every 64 sends; the clock runs from the first send until
``b`` has taken the last message. The in-process side is one bus on the default transport.
The JetStream side is two buses in this process, each with its own ``JetStreamLink`` (its own
connection) and ``JetStreamTransport``, so every message is encoded, published, acknowledged
by the server (file storage), consumed and decoded: what two processes would do, minus a
second CPU. Run as interleaved repetitions; ``ratio_vs_local`` is the median of the
per-repetition ratios (JetStream rate / in-process rate).

Where the time goes:

* ``publish_only_msgs_per_s``: the same sends with no consumer, until the server has
  acknowledged every publish (the sender's half);
* ``codec_us_per_msg``: encoding and decoding one message, CPU only;
* ``profile_share``: one more JetStream run under ``cProfile``, its own time split by where
  it is spent: agentsnap's transport, the NATS client (protocol parsing, headers), the event
  loop and sockets, the bus and scheduler, the rest.

``--json`` prints a single JSON object on stdout; ``--quick`` runs smaller and fewer
repetitions; ``--nats URL`` names the server (``nats://127.0.0.1:4222`` by default; it needs
JetStream). Run it from the repository root with:

    python benchmarks/jetstream.py
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import importlib.metadata
import pstats
import sys
import time
import uuid
from typing import Any

import workloads

from agentsnap.bus import AsyncioScheduler, Bus, Channel, Transport
from agentsnap.jetstream import JetStreamLink, JetStreamTransport
from agentsnap.jetstream.codec import decode, encode
from agentsnap.messages import ENVIRONMENT, Message

YIELD_EVERY = 64
# name: (N, repetitions)
PROFILES: dict[str, tuple[int, int]] = {"full": (20_000, 5), "quick": (5_000, 3)}


class Pair:
    """The sender's bus and the receiver's bus (the same one in process)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.count = 0
        self.done: asyncio.Event = asyncio.Event()

    def bus(self, transport: Transport | None) -> Bus:
        scheduler = AsyncioScheduler()
        bus = Bus(scheduler, transport)

        async def deliver(channel: Channel) -> None:
            item = channel.take()
            if type(item) is Message:
                bus.delivered(channel, item)
                self.count += 1
                if self.count == self.n:
                    self.done.set()

        scheduler.bind(bus, deliver)
        bus.add("a", 0)
        bus.add("b", 0)
        scheduler.start()
        return bus

    async def send(self, bus: Bus) -> float:
        gc.collect()
        sender = bus.endpoints["a"]
        send = bus.send
        started = time.perf_counter()
        for i in range(self.n):
            send(sender, "b", {"i": i}, "message", None)
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)
        await self.done.wait()
        return time.perf_counter() - started


async def local(n: int) -> float:
    pair = Pair(n)
    bus = pair.bus(None)
    elapsed = await pair.send(bus)
    await bus.scheduler.close()
    return elapsed


async def jetstream(url: str, n: int, *, consume: bool = True) -> float:
    run = f"bench-{uuid.uuid4().hex[:12]}"
    sending, receiving = await JetStreamLink.connect(url), await JetStreamLink.connect(url)
    pair = Pair(n)
    out = JetStreamTransport(sending, run, {ENVIRONMENT, "a"})
    into = JetStreamTransport(receiving, run, {"b"})
    bus = pair.bus(out)
    receiver = pair.bus(into)
    try:
        await out.start()
        if consume:
            await into.start()
            return await pair.send(bus)
        pair.done.set()  # nobody consumes: time the publishes and their acknowledgements
        started = time.perf_counter()
        await pair.send(bus)
        await sending.flush()
        return time.perf_counter() - started
    finally:
        await bus.scheduler.close()
        await receiver.scheduler.close()
        await sending.delete_stream(run)
        await sending.close()
        await receiving.close()


def codec_seconds(n: int) -> float:
    message = Message("a", "b", 1, "message", {"i": 1}, {}, 0)
    started = time.perf_counter()
    prev = None
    for seq in range(1, n + 1):
        _, headers, body, prev = encode("bench", message._replace(seq=seq), 0, seq, prev)
        decode(headers, body)
    return time.perf_counter() - started


BUCKETS = [
    ("agentsnap.jetstream", "/agentsnap/jetstream/"),
    ("nats client", "/nats/"),
    ("event loop and sockets", "/asyncio/"),
    ("bus and scheduler", "/agentsnap/bus.py"),
]


async def profile_share(url: str, n: int) -> dict[str, float]:
    profiler = cProfile.Profile()
    profiler.enable()
    await jetstream(url, n)
    profiler.disable()
    stats: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    spent = dict.fromkeys([name for name, _ in BUCKETS] + ["other"], 0.0)
    for (filename, _, function), (_, _, tottime, _, _) in stats.items():
        for name, where in BUCKETS:
            if where in filename:
                spent[name] += tottime
                break
        else:
            if function.startswith(("<method 'send'", "<method 'recv'", "<method 'select'")):
                spent["event loop and sockets"] += tottime
            else:
                spent["other"] += tottime
    total = sum(spent.values()) or 1.0
    return {name: round(seconds / total, 3) for name, seconds in spent.items()}


async def measure(url: str, profile: str) -> dict[str, Any]:
    n, repetitions = PROFILES[profile]
    try:
        link = await JetStreamLink.connect(url)
    except Exception as exc:
        sys.exit(f"benchmarks/jetstream.py: {exc}")
    await link.close()
    local_s, jet_s = await workloads.pairs(lambda: local(n), lambda: jetstream(url, n), repetitions)
    publish_s = [await jetstream(url, n, consume=False) for _ in range(repetitions)]
    codec_s = min(codec_seconds(n) for _ in range(3))
    return {
        **workloads.environment("agentsnap jetstream", profile),
        "nats_py_version": importlib.metadata.version("nats-py"),
        "n": n,
        "repetitions": repetitions,
        "nats_url": url,
        "local_msgs_per_s": workloads.rate(n, local_s),
        "jetstream_msgs_per_s": workloads.rate(n, jet_s),
        "ratio_vs_local": round(workloads.median_ratio(local_s, jet_s), 5),
        "publish_only_msgs_per_s": workloads.rate(n, publish_s),
        "codec_us_per_msg": round(codec_s / n * 1e6, 2),
        "jetstream_us_per_msg": round(min(jet_s) / n * 1e6, 1),
        "profile_share": await profile_share(url, n),
        "samples_msgs_per_s": {
            "local": workloads.rates(n, local_s),
            "jetstream": workloads.rates(n, jet_s),
            "publish_only": workloads.rates(n, publish_s),
        },
    }


def table(results: dict[str, Any]) -> str:
    share = "\n".join(
        f"    {name:<24} {part:>6.1%}" for name, part in results["profile_share"].items()
    )
    return (
        f"agentsnap JetStream channel ({results['profile']}: {results['n']} messages, "
        f"{results['repetitions']} repetitions, {results['nats_url']})\n"
        f"  in-process hand-off      {results['local_msgs_per_s']:>12,.0f} msg/s\n"
        f"  one JetStream channel    {results['jetstream_msgs_per_s']:>12,.0f} msg/s"
        f"  ({results['jetstream_us_per_msg']} us/msg)\n"
        f"  ratio (JetStream/local)  {results['ratio_vs_local']:>12.4f}\n"
        f"  publishing only          {results['publish_only_msgs_per_s']:>12,.0f} msg/s\n"
        f"  encode + decode          {results['codec_us_per_msg']:>12} us/msg\n"
        f"  where a JetStream run spends its time (cProfile, own time):\n{share}"
    )


def main() -> None:
    parser = workloads.argument_parser(__doc__, "5,000 messages, 3 repetitions")
    parser.add_argument("--nats", default="nats://127.0.0.1:4222", help="the NATS server")
    args = parser.parse_args()
    results = asyncio.run(measure(args.nats, "quick" if args.quick else "full"))
    workloads.report(results, args.json, table)


if __name__ == "__main__":
    main()
