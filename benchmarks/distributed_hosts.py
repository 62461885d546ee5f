"""Messages per second of a run over three hosts, against the same run over one network stack.

The work is ``distributed.py``'s: six relays in a ring, relay ``i`` on worker ``i mod 3`` (so
every hop crosses processes through NATS JetStream, file storage, every publish acknowledged),
the environment starting ``chains`` chains of ``hops`` hops; a round is timed from the first
input sent until every chain is reported done, and its rate is every message delivered over
that time. Two runs of three ``agentsnap worker`` processes serve the rounds:

* ``hosts``: each worker on a host of its own, a network namespace reaching the NATS server and
  the PostgreSQL server over veth links and Linux bridges (``tests/netns.py``);
* ``stack``: the three workers in this process's network namespace, as processes beside each
  other.

Both runs use the same NATS server and the same PostgreSQL cluster (the test harness's own:
``fsync`` off, on the bridges' addresses, which processes on the stack reach without crossing
a link), with this process as their coordinator, so the only difference is the network path.
Rounds are interleaved (the order swaps every repetition) after a warm-up round on each;
``ratio_hosts_vs_stack`` is the median of the per-repetition ``hosts / stack`` rates, with its
spread (lowest and highest). ``snapshot_ms_*`` is the time from beginning a snapshot (while a
round runs) until it is stored complete.

It needs root (it makes network namespaces) and ``ip``. ``--json`` prints one JSON object;
``--quick`` runs smaller and fewer repetitions (under a minute). Run it from the repository
root with:

    python benchmarks/distributed_hosts.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import workloads
from distributed import Spread

sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))  # after ours: `tools`
from netns import Hosts, missing

# name: (chains, hops, repetitions, snapshots)
PROFILES: dict[str, tuple[int, int, int, int]] = {
    "full": (40, 50, 9, 20),
    "quick": (20, 30, 3, 6),
}
SIDES = ("hosts", "stack")


def spread(values: list[float]) -> list[float]:
    return [round(min(values), 4), round(max(values), 4)]


async def measure(profile: str) -> dict[str, Any]:
    chains, hops, repetitions, snapshot_count = PROFILES[profile]
    messages = chains * (hops + 1)
    logs = Path(tempfile.mkdtemp(prefix="agentsnap-bench-hosts-"))
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    snapshots: dict[str, list[float]] = {}
    started = time.perf_counter()
    with Hosts(3) as hosts:
        runs = {side: Spread(3, hosts.nats.url, hosts.postgres.url, logs) for side in SIDES}
        runs["hosts"].where = lambda n: hosts.command(n, [])
        try:
            for run in runs.values():
                await run.launch_all()
            for run in runs.values():
                await run.ready()
            for run in runs.values():  # warm-up: connections, consumers, caches
                await run.round(chains, hops)
            for rep in range(repetitions):
                for side in SIDES if rep % 2 == 0 else reversed(SIDES):
                    times[side].append(await runs[side].round(chains, hops))
            for side in SIDES:
                taken, _ = await runs[side].snapshots(chains, hops * 4, snapshot_count)
                snapshots[side] = taken
        finally:
            await asyncio.gather(*(run.close() for run in runs.values()))
        nets = {service: str(net) for service, net in hosts.nets.items()}
    per_rep = [stack / host for host, stack in zip(times["hosts"], times["stack"], strict=True)]
    return {
        **workloads.environment("agentsnap distributed over hosts", profile),
        "networks": nets,
        "relays": 6,
        "workers": 3,
        "chains": chains,
        "hops": hops,
        "messages_per_round": messages,
        "repetitions": repetitions,
        **{f"msgs_per_s_{side}": workloads.rate(messages, times[side]) for side in SIDES},
        "ratio_hosts_vs_stack": round(statistics.median(per_rep), 4),
        "ratio_hosts_vs_stack_spread": spread(per_rep),
        **{f"snapshot_ms_{side}": workloads.ms(snapshots[side]) for side in SIDES},
        "samples_msgs_per_s": {side: workloads.rates(messages, times[side]) for side in SIDES},
        "seconds": round(time.perf_counter() - started, 1),
    }


def table(results: dict[str, Any]) -> str:
    low, high = results["ratio_hosts_vs_stack_spread"]
    return "\n".join(
        [
            f"agentsnap run over 3 workers ({results['profile']}: {results['relays']} relays, "
            f"{results['chains']} chains of {results['hops']} hops = "
            f"{results['messages_per_round']} messages a round, {results['repetitions']} "
            "interleaved repetitions)",
            f"  3 hosts (namespaces)   {results['msgs_per_s_hosts']:>10,.0f} msg/s   snapshot "
            f"{results['snapshot_ms_hosts']} ms",
            f"  1 stack (processes)    {results['msgs_per_s_stack']:>10,.0f} msg/s   snapshot "
            f"{results['snapshot_ms_stack']} ms",
            f"  hosts / stack          {results['ratio_hosts_vs_stack']:.4f} "
            f"({low:.4f} .. {high:.4f})",
        ]
    )


def main() -> None:
    parser = workloads.argument_parser(
        __doc__, f"{PROFILES['quick'][0]} chains of {PROFILES['quick'][1]} hops, 3 repetitions"
    )
    args = parser.parse_args()
    reason = missing()
    if reason is not None:
        parser.error(reason)
    results = asyncio.run(measure("quick" if args.quick else "full"))
    workloads.report(results, args.json, table)


if __name__ == "__main__":
    main()
