"""What following a live run in the web inspector costs: the server, the page, and the run.

A run of 20 agents passes 40 tokens round a ring at full speed (``Runtime(journal=True)``
over one SQLite file in WAL mode, a snapshot every 1,000 deliveries) in a process of its
own, for ``--seconds`` per round. The inspector's app is served by uvicorn in another
process over the same file. Rounds alternate, in one run of this script, between a round
with Chromium (``$CHROMIUM`` or ``/usr/bin/chromium``, driven by Playwright) following the
run's page and a round with no page open:

* ``throughput_ratio``: the run's messages per second with the page open divided by
  without it, median of the per-pair ratios with their min and max (1.0: following costs
  the run nothing);
* ``server_cpu_share``: the server process's CPU time (user + system, from ``/proc``) over
  the round's wall time, while the page follows the run;
* ``bytes_per_second``: what the page fetched from the server per second (the responses'
  lengths);
* ``frame_ms``: the page's frame intervals (``requestAnimationFrame``), median and 95th
  percentile, while it follows the run.

``--json`` prints one JSON object. Run it from the repository root:

    python benchmarks/ui_live.py --seconds 60 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ui import _SERVE, CHROMIUM, free_port, get

AGENTS = 20
TOKENS = 40

_RUN = """
import asyncio, sys, time
from agentsnap import Agent, AgentState, Context, Message, Runtime
from agentsnap.snapshot import SnapshotPolicy
from agentsnap.store.sql import SqlStore

url, seconds, agents, tokens = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
deadline = 0.0
count = 0

class Node(Agent[AgentState]):
    def __init__(self, name, nxt):
        super().__init__(name)
        self.next = nxt

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        global count
        count += 1
        if time.monotonic() < deadline:
            ctx.send(self.next, message.payload)

async def main():
    global deadline
    store = SqlStore(url)
    names = [f"node-{i:02d}" for i in range(agents)]
    try:
        async with Runtime(
            store=store, journal=True, name="live",
            snapshot_policy=SnapshotPolicy(every_deliveries=1000, at_start=False),
        ) as runtime:
            for i, name in enumerate(names):
                runtime.add(Node(name, names[(i + 1) % agents]))
            print(runtime.run_id, flush=True)
            sys.stdin.readline()  # the page is ready
            start = time.monotonic()
            deadline = start + seconds
            for t in range(tokens):
                runtime.send(names[t % agents], {"t": t})
            await runtime.run_until_idle()
            print(count / (time.monotonic() - start), flush=True)
    finally:
        await store.close()

asyncio.run(main())
"""

_FRAMES = """() => {
    window.__frames = [];
    let last = performance.now();
    const tick = (now) => {
        window.__frames.push(now - last);
        last = now;
        requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
}"""


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(url: str, seconds: float, page: Any, base: str, server: int) -> dict[str, float]:
    """Run the ring for ``seconds``, followed by ``page`` when one is given."""
    child = subprocess.Popen(
        [sys.executable, "-c", _RUN, url, str(seconds), str(AGENTS), str(TOKENS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    run_id = child.stdout.readline().strip()
    figures: dict[str, float] = {}
    received: list[Any] = []

    def count(response: Any) -> None:
        received.append(response)

    if page is not None:
        page.goto(f"{base}/#/runs/{run_id}")
        page.wait_for_selector("#view[data-loaded='true'] canvas.st-canvas")
        page.evaluate(_FRAMES)
        page.on("response", count)
    cpu = cpu_seconds(server)
    start = time.monotonic()
    child.stdin.write("go\n")
    child.stdin.flush()
    figures["messages_per_second"] = float(child.stdout.readline())
    child.wait(timeout=120)
    wall = time.monotonic() - start
    if page is not None:
        frames: list[float] = page.evaluate("() => window.__frames.slice(1)")
        page.remove_listener("response", count)
        frames.sort()
        figures.update(
            server_cpu_share=(cpu_seconds(server) - cpu) / wall,
            bytes_per_second=sum(len(response.body()) for response in received) / wall,
            frame_ms=statistics.median(frames),
            frame_p95_ms=frames[int(0.95 * (len(frames) - 1))],
        )
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="each round's length")
    parser.add_argument("--rounds", type=int, default=3, help="pairs of rounds")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if not Path(CHROMIUM).is_file():
        print(f"benchmarks/ui_live.py: no Chromium at {CHROMIUM} (set CHROMIUM)", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'live.db'}"
        asyncio.run(_create(url))
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([sys.executable, "-c", _SERVE, url, str(port)])
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    get(f"{base}/api/runs?limit=1")
                    break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise
                    time.sleep(0.2)
            followed: list[dict[str, float]] = []
            alone: list[dict[str, float]] = []
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM)
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.set_default_timeout(120_000)
                for n in range(args.rounds):
                    order = [True, False] if n % 2 == 0 else [False, True]
                    for with_page in order:
                        page.goto("about:blank")
                        figures = one_round(
                            url, args.seconds, page if with_page else None, base, server.pid
                        )
                        (followed if with_page else alone).append(figures)
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
    ratios = [
        f["messages_per_second"] / a["messages_per_second"]
        for f, a in zip(followed, alone, strict=True)
    ]

    def median(key: str) -> float:
        return round(statistics.median(f[key] for f in followed), 3)

    result = {
        "seconds": args.seconds,
        "rounds": args.rounds,
        "messages_per_second_alone": round(
            statistics.median(a["messages_per_second"] for a in alone)
        ),
        "messages_per_second_followed": round(
            statistics.median(f["messages_per_second"] for f in followed)
        ),
        "throughput_ratio": round(statistics.median(ratios), 3),
        "throughput_ratio_min": round(min(ratios), 3),
        "throughput_ratio_max": round(max(ratios), 3),
        "server_cpu_share": median("server_cpu_share"),
        "bytes_per_second": round(median("bytes_per_second")),
        "frame_ms": median("frame_ms"),
        "frame_p95_ms": median("frame_p95_ms"),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:32} {value}")
    return 0


async def _create(url: str) -> None:
    from agentsnap.store.sql import SqlStore

    store = SqlStore(url)
    try:
        await store.list_runs()  # makes the tables
    finally:
        await store.close()


if __name__ == "__main__":
    sys.exit(main())
