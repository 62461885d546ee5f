"""How fast the web inspector answers a window of a large run.

A run is built once in an SQLite file (WAL) by a ``Runtime(journal=True)``: ``--agents``
agents (20) pass tokens to one another, each token making ``HOPS`` hops to peers that depend
on the token and the hop (so every channel of the mesh is used), ``--messages`` messages
(100,000) in all, with ``--snapshots`` snapshots (500) taken while tokens are on their way.
Then, through the inspector's app (in this process, over httpx's ASGI transport):

* ``index_s``: the first request of the run's messages, which reads and indexes the journal
  (once per run; later requests reuse the index);
* ``window_s``: a request for a wall-time window holding ``--window`` messages (10,000),
  answered exactly (``limit`` = the window), the index already built: the median of
  ``--rounds`` requests (5), with each one's time beside it;
* ``lamport_window_s``: the same for a window of Lamport time;
* ``density_s``: the whole run asked with the default limit (5,000), answered as counts;
* ``index_mb``: the memory the index holds (``tracemalloc``, Python allocations only).

``--json`` prints one JSON object. Run it from the repository root with:

    python benchmarks/inspector.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import httpx

from agentsnap import Agent, AgentState, Context, Message, Runtime
from agentsnap.snapshot import SnapshotPolicy
from agentsnap.store.sql import SqlStore
from agentsnap.ui.queries import build_index
from agentsnap.ui.server import create_app

HOPS = 5


class MeshState(AgentState):
    forwarded: int = 0


class MeshNode(Agent[MeshState]):
    """Forwards each token to a peer chosen by the token and its hop, until it is done."""

    def __init__(self, name: str, peers: list[str]) -> None:
        super().__init__(name)
        self.peers = peers

    async def handle(self, message: Message, ctx: Context[MeshState]) -> None:
        token = message.payload
        assert isinstance(token, dict)
        hop = int(str(token["h"]))
        if hop >= HOPS:
            return
        ctx.state.forwarded += 1
        t = int(str(token["t"]))
        peer = self.peers[(t * 7 + hop * 3) % len(self.peers)]
        ctx.send(peer, {"t": t, "s": token["s"], "h": hop + 1})


async def build_run(path: Path, agents: int, snapshots: int, messages: int) -> dict[str, Any]:
    """The run: ``messages`` messages (about), ``snapshots`` snapshots, ``agents`` agents."""
    tokens = max(1, messages // snapshots // HOPS)
    names = [f"agent-{i:02d}" for i in range(agents)]
    store = SqlStore(f"sqlite:///{path}")
    try:
        async with Runtime(
            store=store,
            journal=True,
            snapshot_policy=SnapshotPolicy(at_start=False, at_end=False),
        ) as runtime:
            for name in names:
                runtime.add(MeshNode(name, [n for n in names if n != name]))
            for step in range(snapshots):
                for token in range(tokens):
                    runtime.send(names[token % agents], {"t": token, "s": step, "h": 1})
                await runtime.snapshot()
            await runtime.run_until_idle()
        counts = await store.snapshot_counts()
    finally:
        await store.close()
    return {
        "db": f"sqlite:///{path}",
        "run_id": runtime.run_id,
        "snapshots": counts.get(runtime.run_id, 0),
    }


async def measure(run: dict[str, Any], window: int, rounds: int) -> dict[str, Any]:
    store = SqlStore(run["db"], create=False)
    try:
        tracemalloc.start()
        rollbacks = await store.list_rollbacks(run["run_id"])
        before = tracemalloc.get_traced_memory()[0]
        index = await build_index(store, run["run_id"], rollbacks)
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        del index
        app = create_app(store)
        transport = httpx.ASGITransport(app=app)
        url = f"/api/runs/{run['run_id']}/messages"
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            start = time.perf_counter()
            whole = (await client.get(url, params={"limit": 1})).json()
            index_s = time.perf_counter() - start
            detail = (await client.get(f"/api/runs/{run['run_id']}")).json()
            messages = detail["messages"]
            low, high = detail["start_us"], detail["end_us"]
            # A wall window in the middle of the run holding about ``window`` messages.
            span = max(1, (high - low) * window // max(messages, 1))
            middle = (low + high) // 2
            params = {"from": middle - span // 2, "to": middle + span // 2, "limit": 100_000}
            found = (await client.get(url, params=params)).json()
            wall_times, lamport_times = [], []
            for _ in range(rounds):
                start = time.perf_counter()
                answer = (await client.get(url, params=params)).json()
                wall_times.append(time.perf_counter() - start)
            assert answer["mode"] == "exact"
            lc_span = max(1, detail["lamport_max"] * window // max(messages, 1))
            lc_params = {
                "axis": "lamport",
                "from": detail["lamport_max"] // 2 - lc_span // 2,
                "to": detail["lamport_max"] // 2 + lc_span // 2,
                "limit": 100_000,
            }
            lamport = (await client.get(url, params=lc_params)).json()
            for _ in range(rounds):
                start = time.perf_counter()
                await client.get(url, params=lc_params)
                lamport_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            dense = (await client.get(url)).json()
            density_s = time.perf_counter() - start
    finally:
        await store.close()
    return {
        "messages": messages,
        "snapshots": run["snapshots"],
        "agents": len(detail["agents"]),
        "channels": len(whole.get("channels", [])),
        "index_s": round(index_s, 3),
        "index_mb": round(held / 2**20, 1),
        "window_messages": len(found["messages"]),
        "window_s": round(statistics.median(wall_times), 4),
        "window_samples_s": [round(t, 4) for t in wall_times],
        "lamport_window_messages": len(lamport["messages"]),
        "lamport_window_s": round(statistics.median(lamport_times), 4),
        "density_mode": dense["mode"],
        "density_s": round(density_s, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--snapshots", type=int, default=500)
    parser.add_argument("--window", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        run = asyncio.run(
            build_run(Path(folder) / "run.db", args.agents, args.snapshots, args.messages)
        )
        built = time.perf_counter() - start
        figures = asyncio.run(measure(run, args.window, args.rounds))
    figures["build_s"] = round(built, 1)
    if args.json:
        json.dump(figures, sys.stdout)
        print()
        return
    for key, value in figures.items():
        print(f"{key:>24}  {value}")


if __name__ == "__main__":
    main()
