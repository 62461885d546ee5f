"""How the web inspector copes with a large run: first render, zoom frames, one API window.

The run is built once in a temporary SQLite file (WAL) by a ``Runtime(journal=True)``: a
ring of A agents (20 by default, in two groups of names, ``east.*`` and ``west.*``) is sent,
S times over, M / S / 5 tokens that make 5 hops each, with a snapshot taken behind them: M
messages journaled (100,000) and S snapshots (500). The inspector's app
(``agentsnap.ui.server.create_app``) is then served by uvicorn in a process of its own, and
Chromium (``$CHROMIUM`` or ``/usr/bin/chromium``, driven by Playwright) opens the run:

* ``first_render_ms``: from the start of the page's navigation until the space-time view has
  drawn its first window of data (the whole run, as per-channel density bands);
* ``zoom_frame_ms``: the median time from a zoom (``+``) to the end of the frame that draws
  it, over 20 zooms in then out, in the page (the frame draws what it has, new windows
  arrive later);
* ``api_window_ms``: the median of 5 requests of ``GET /api/runs/{run}/messages`` for a wall
  clock window holding about 10,000 messages, with ``limit=10000`` (exact arrows);
  ``api_first_ms`` is the first request for the run's detail, which builds the server's
  index of the run;
* ``server_rss_mb``: the server process's resident memory at the end (``VmRSS``) and its
  peak (``VmHWM``), from ``/proc``.

``--json`` prints one JSON object on stdout. Run it from the repository root:

    python benchmarks/ui.py --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import workloads

from agentsnap import Runtime
from agentsnap.snapshot import SnapshotPolicy
from agentsnap.store.sql import SqlStore

HOPS = 5
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")

_SERVE = """
import sys, uvicorn
from agentsnap.store.sql import SqlStore
from agentsnap.ui.server import create_app
app = create_app(SqlStore(sys.argv[1], create=False))
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


async def build_run(path: Path, agents: int, snapshots: int, messages: int) -> dict[str, Any]:
    tokens = max(1, messages // snapshots // HOPS)
    store = SqlStore(f"sqlite:///{path}")
    names = [f"{'east' if i < agents // 2 else 'west'}.node-{i:02d}" for i in range(agents)]
    try:
        async with Runtime(
            store=store,
            journal=True,
            name="ui benchmark",
            snapshot_policy=SnapshotPolicy(at_start=False, at_end=False),
        ) as runtime:
            nodes = [
                workloads.RingNode(name, names[(i + 1) % agents], HOPS)
                for i, name in enumerate(names)
            ]
            for node in nodes:
                runtime.add(node)
            for step in range(snapshots):
                for token in range(tokens):
                    runtime.send(names[token % agents], {"t": token, "s": step, "h": 1})
                await runtime.snapshot()
            await runtime.run_until_idle()
    finally:
        await store.close()
    return {"db": f"sqlite:///{path}", "run_id": runtime.run_id}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def get(url: str) -> tuple[float, Any]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=300) as answer:
        body = json.loads(answer.read())
    return (time.perf_counter() - start) * 1000, body


def window_of(base: str, run_id: str, wanted: int) -> tuple[int, int]:
    """A wall-clock window in the middle of the run that about ``wanted`` messages touch.

    The run's density (sends per bin, per channel) places it; it is narrowed until the
    server answers with the messages themselves.
    """
    _, density = get(f"{base}/api/runs/{run_id}/messages?axis=wall&limit=1")
    bins = density["bins"]
    width = (density["to"] - density["from"]) / bins
    per_bin = [sum(c["counts"][i] for c in density["channels"]) for i in range(bins)]
    first = bins // 2 - 1
    total, last = 0, first
    while last < bins and total + per_bin[last] <= wanted:
        total += per_bin[last]
        last += 1
    lo = int(density["from"] + first * width)
    hi = int(density["from"] + last * width)
    for _ in range(20):
        _, body = get(
            f"{base}/api/runs/{run_id}/messages?axis=wall&from={lo}&to={hi}&limit={wanted}"
        )
        if body["mode"] == "exact":
            break
        hi = lo + int((hi - lo) * 0.9)
    return lo, hi


def memory_mb(pid: int) -> dict[str, float]:
    found: dict[str, float] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in {"VmRSS", "VmHWM"}:
                found[key] = int(value.split()[0]) / 1024
    return found


def measure_page(base: str, run_id: str) -> dict[str, float]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(300_000)
        page.goto(f"{base}/#/runs/{run_id}")
        page.wait_for_selector("canvas.st-canvas[data-first-render]")
        first = float(page.locator("canvas.st-canvas").get_attribute("data-first-render") or 0)
        mode = page.locator("canvas.st-canvas").get_attribute("data-mode")
        frames: list[float] = page.evaluate(
            """async () => {
                const tl = window.agentsnap.timeline;
                const times = [];
                for (const factor of [...Array(10).fill(1 / 1.5), ...Array(10).fill(1.5)]) {
                    const start = performance.now();
                    tl.zoomBy(factor);
                    await tl.nextFrame();
                    times.push(performance.now() - start);
                }
                return times;
            }"""
        )
        browser.close()
    return {
        "first_render_ms": round(first, 1),
        "first_mode": mode,  # type: ignore[dict-item]
        "zoom_frame_ms": round(statistics.median(frames), 2),
        "zoom_frame_max_ms": round(max(frames), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--snapshots", type=int, default=500)
    args = parser.parse_args()
    if not Path(CHROMIUM).is_file():
        print(f"benchmarks/ui.py: no Chromium at {CHROMIUM} (set CHROMIUM)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ui.db"
        start = time.perf_counter()
        run = asyncio.run(build_run(path, args.agents, args.snapshots, args.messages))
        built = time.perf_counter() - start
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([sys.executable, "-c", _SERVE, run["db"], str(port)])
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
            first_ms, detail = get(f"{base}/api/runs/{run['run_id']}")
            lo, hi = window_of(base, run["run_id"], 10_000)
            url = (
                f"{base}/api/runs/{run['run_id']}/messages?axis=wall&from={lo}&to={hi}&limit=10000"
            )
            timings = []
            for _ in range(5):
                ms, body = get(url)
                timings.append(ms)
            window_mode = body["mode"]
            window_messages = len(body.get("messages", []))
            page = measure_page(base, run["run_id"])
            memory = memory_mb(server.pid)
        finally:
            server.terminate()
            server.wait(timeout=30)
    result = {
        "agents": len(detail["agents"]),
        "messages": detail["messages"],
        "snapshots": detail.get("snapshots"),
        "build_s": round(built, 1),
        "api_first_ms": round(first_ms, 1),
        "api_window_ms": round(statistics.median(timings), 1),
        "api_window_mode": window_mode,
        "api_window_messages": window_messages,
        **page,
        "server_rss_mb": round(memory.get("VmRSS", 0.0), 1),
        "server_peak_rss_mb": round(memory.get("VmHWM", 0.0), 1),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>22}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
