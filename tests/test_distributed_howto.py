"""The how-to's coordinator program runs as printed, with real workers, NATS and PostgreSQL.

``docs/how-to/distributed.md`` shows two whole files: the app, ``bank.py``, and the program
that coordinates a run of it, ``coordinator.py``. The coordinator needs workers, so the docs'
own block runner leaves it out; here both files are written out as the page prints them, the
coordinator is started as a user starts it, and two ``agentsnap worker`` processes join the
run whose id it prints. The program must end by itself once the run is idle, with every
order carried out and the bank's money whole.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import pytest
from distributed_teardown import Teardown
from nats_server import SHARED_URL, reachable, unavailable

from agentsnap.jetstream import JetStreamLink
from agentsnap.messages import ENVIRONMENT
from agentsnap.records import RunStatus
from agentsnap.store.sql import SqlStore

ROOT = Path(__file__).resolve().parent.parent
HOWTO = ROOT / "docs" / "how-to" / "distributed.md"
PATIENCE = 120.0
"""Seconds a step may take (never reached when green)."""

pytestmark = pytest.mark.postgres


def titled_block(title: str) -> str:
    """The code of the how-to's block titled ``title``."""
    pattern = rf'^```py(?:thon)? title="{re.escape(title)}"\n(.*?)^```'
    found = re.search(pattern, HOWTO.read_text(), re.S | re.M)
    assert found is not None, f"no block titled {title} in {HOWTO.name}"
    return found.group(1)


async def line_with(stream: asyncio.StreamReader, prefix: str) -> str:
    """The first line of ``stream`` that starts with ``prefix``."""
    seen: list[str] = []
    while True:
        line = (await stream.readline()).decode()
        assert line, f"no line starting with {prefix!r}: {seen}"
        seen.append(line)
        if line.startswith(prefix):
            return line.removeprefix(prefix).strip()


async def test_the_howtos_coordinator_waits_for_the_run_to_be_idle_and_ends(
    postgres_url: str, tmp_path: Path, teardown: Teardown
) -> None:
    if not reachable(SHARED_URL):
        unavailable(f"no NATS server at {SHARED_URL}")
    (tmp_path / "bank.py").write_text(titled_block("bank.py"))
    (tmp_path / "coordinator.py").write_text(titled_block("coordinator.py"))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "NATS_URL": SHARED_URL,
        "DATABASE_URL": postgres_url,
    }
    coordinator = await asyncio.create_subprocess_exec(
        sys.executable, "-W", "error", "coordinator.py",
        cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    workers = teardown.processes()
    teardown.process(coordinator)
    assert coordinator.stdout is not None
    async with asyncio.timeout(PATIENCE):
        run_id = await line_with(coordinator.stdout, "run: ")
    teardown.link(await JetStreamLink.connect(SHARED_URL))
    teardown.stream_of(run_id)
    # The orders were sent before any worker started: they wait in the stream.
    for group in ("0/2", "1/2"):
        args = ["--nats", SHARED_URL, "--db", postgres_url, "--app", "bank:make_app"]
        args += ["--run", run_id, "--group", group]
        worker = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentsnap", "worker", *args, cwd=tmp_path, env=env,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        workers.append(worker)
    async with asyncio.timeout(PATIENCE):
        rest = (await coordinator.stdout.read()).decode()
        assert await coordinator.wait() == 0, rest
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    async with asyncio.timeout(PATIENCE):
        assert [await worker.wait() for worker in workers] == [0, 0]
    await teardown.close()

    [last_line] = [line for line in rest.splitlines() if line.startswith("idle at snapshot ")]
    seq = int(last_line.split(":")[0].removeprefix("idle at snapshot "))
    assert last_line == f"idle at snapshot {seq}: 9000 in 9 tellers"
    store = SqlStore(postgres_url)
    try:
        run = await store.get_run(run_id)
        idle = next(s for s in await store.list_snapshots(run_id) if s.seq == seq)
    finally:
        await store.close()
    assert run.status == RunStatus.SUCCEEDED
    # The cut it returned holds every order taken and carried out, nothing in flight.
    assert idle.channels == []
    assert idle.agents[ENVIRONMENT].sent == dict.fromkeys(idle.agents[ENVIRONMENT].sent, 1)
    assert len(idle.agents[ENVIRONMENT].sent) == 9
    tellers = [cut for name, cut in idle.agents.items() if name != ENVIRONMENT]
    assert sum(sum(cut.sent.values()) for cut in tellers) == 9
