"""API footguns: mistakes that used to pass silently now say what is wrong.

* a check on an agent that is never added,
* Ctrl-C: the run is recorded as cancelled (resumable), with its reason, and the examples exit
  with one line.
* a runtime never closed is closed when its event loop ends, with a warning.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ctrl_c import DUMP_ON_ABORT, interrupt, stopped

from agentsnap import (
    Agent,
    AgentState,
    ConfigurationError,
    Context,
    MemoryStore,
    Message,
    RollbackExhausted,
    RunStatus,
    Runtime,
    UnknownAgentError,
)
from agentsnap.store.sql import SqlStore

ROOT = Path(__file__).resolve().parent.parent


class Sink(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.state.memory["last"] = message.payload


class Writer(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        ctx.send("sink", {"text": "bad"})


class Forever(Agent[AgentState]):
    """Handles its message until it is cancelled."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        await asyncio.Event().wait()


def never(message: Message) -> str:
    return "never good enough"


# -- 1. a check on an agent that is not registered -------------------------------------------


async def test_a_check_on_an_unknown_agent_is_refused_at_the_first_input() -> None:
    async with Runtime() as runtime:
        runtime.check("writr", check=never)  # a typo: no agent of that name is ever added
        runtime.add(Writer("writer"))
        runtime.add(Sink("sink"))
        with pytest.raises(UnknownAgentError) as caught:
            runtime.send("writer", {})
        text = str(caught.value)
        assert "Runtime.check() names 'writr'" in text
        assert "registered: 'sink', 'writer'" in text
        assert "Runtime.add()" in text
        assert isinstance(caught.value, ConfigurationError)
        # Nothing was sent: fixing the name lets the run go on.
        assert not any(runtime.inputs_sent.values())


async def test_a_check_on_an_unknown_agent_is_refused_at_once_after_the_first_input() -> None:
    async with Runtime() as runtime:
        runtime.add(Sink("sink"))
        runtime.send("sink", {})
        with pytest.raises(UnknownAgentError, match=r"names 'writer', .*registered: 'sink'"):
            runtime.check("writer", check=never)
        await runtime.run_until_idle()


async def test_a_check_declared_before_its_agent_is_added_still_runs() -> None:
    runtime = Runtime()
    runtime.check("writer", check=never, name="never")  # before the agent: still supported
    async with runtime:
        runtime.add(Writer("writer"))
        runtime.add(Sink("sink"))
        runtime.send("writer", {})
        with pytest.raises(RollbackExhausted):
            await runtime.run_until_idle()
    assert runtime.rollbacks
    assert all("never good enough" in rollback.reason for rollback in runtime.rollbacks)


async def test_resume_refuses_a_check_on_an_unknown_agent() -> None:
    store = MemoryStore()
    async with Runtime(store=store) as first:
        first.add(Sink("sink"))
        first.send("sink", {})
        await first.run_until_idle()
        run_id = first.run_id
        first.snapshot()
    second = Runtime(store=store, run_id=run_id)
    second.add(Sink("sink"))
    second.check("sinc", check=never)
    with pytest.raises(UnknownAgentError, match="names 'sinc'"):
        await second.resume()
    await second.close()


# -- 2. a runtime that is never closed -------------------------------------------------------


async def test_a_cancelled_run_is_recorded_as_cancelled(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'runs.db'}")
    started = asyncio.Event()
    runtime = Runtime(store=store)

    async def work() -> None:
        async with runtime:
            runtime.add(Forever("busy"))
            runtime.send("busy", {})
            started.set()
            await runtime.run_until_idle()

    try:
        task = asyncio.create_task(work())
        await started.wait()
        await asyncio.sleep(0.05)
        task.cancel()  # what asyncio.run() does to the main task on Ctrl-C
        with pytest.raises(asyncio.CancelledError):
            await task
        run = await store.get_run(runtime.run_id)
        assert run.status is RunStatus.CANCELLED
        assert run.status_reason == "task cancelled; resume() continues it"
    finally:
        await store.close()


@pytest.mark.parametrize("signal_", [KeyboardInterrupt, RuntimeError])
async def test_the_exception_that_ends_the_block_decides_the_status(
    signal_: type[BaseException],
) -> None:
    """Ctrl-C outside asyncio.run() raises KeyboardInterrupt in the block: cancelled."""
    store = MemoryStore()
    runtime = Runtime(store=store)

    async def work() -> None:
        async with runtime:
            runtime.add(Sink("sink"))
            runtime.send("sink", {})
            await runtime.run_until_idle()
            raise signal_

    with pytest.raises(signal_):
        await work()
    run = await store.get_run(runtime.run_id)
    if signal_ is KeyboardInterrupt:
        assert (run.status, run.status_reason) == (
            RunStatus.CANCELLED,
            "Ctrl-C; resume() continues it",
        )
    else:
        assert (run.status, run.status_reason) == (RunStatus.FAILED, "RuntimeError")


def test_an_example_exits_with_one_line_on_ctrl_c(tmp_path: Path) -> None:
    db = tmp_path / "bank.db"
    url = f"sqlite:///{db}"
    process = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "examples" / "bank_transfers.py"),
            *("--transfers", "1000000", "--db", url),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **DUMP_ON_ABORT},
    )
    try:
        deadline = time.monotonic() + 30
        while not _runs(db):  # the run is recorded: the runtime has started
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the example did not start its run"
            time.sleep(0.05)
        time.sleep(0.3)
        interrupt(process)
        stdout, stderr = stopped(process, timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    report = f"stdout:\n{stdout}\nstderr:\n{stderr}"
    assert process.returncode == 130, report
    assert "Traceback" not in stderr, report
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, report
    ((run_id, status),) = _runs(db)
    assert lines[0].startswith(f"cancelled: run {run_id} is recorded as cancelled"), report
    assert ".resume()" in lines[0]
    # The command it prints to see where the run stopped works when pasted.
    command = lines[0].split("see where it stopped with: ")[1]
    shown = subprocess.run(
        command, shell=True, cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert shown.returncode == 0, shown.stderr
    assert "SEQ" in shown.stdout
    assert status == "cancelled"


def _runs(db: Path) -> list[tuple[str, str]]:
    if not db.exists():
        return []
    try:
        with sqlite3.connect(db) as conn:
            return list(conn.execute("select id, status from agentsnap_runs"))
    except sqlite3.Error:
        return []


# -- 3. a runtime that is never closed -------------------------------------------------------

NEVER_CLOSED = """
import asyncio, sys
from agentsnap import Agent, AgentState, Runtime
from agentsnap.store.sql import SqlStore

class Counter(Agent[AgentState]):
    async def handle(self, message, ctx):
        self.state.memory["n"] = self.state.memory.get("n", 0) + 1
        if message.payload == "wait":
            await asyncio.Event().wait()

async def main():
    runtime = Runtime(store=SqlStore(sys.argv[1]), run_id="forgotten")
    await runtime.start()
    runtime.add(Counter("counter"))
    runtime.send("counter", sys.argv[2])
    if sys.argv[2] == "wait":
        await asyncio.sleep(0.2)
    else:
        await runtime.run_until_idle()
    # returns without closing the runtime

asyncio.run(main())
print("returned")
"""


@pytest.mark.parametrize(
    ("payload", "status", "snapshots"),
    [("count", "succeeded", 2), ("wait", "cancelled", 1)],
)
def test_a_runtime_never_closed_is_closed_with_its_event_loop(
    tmp_path: Path, payload: str, status: str, snapshots: int
) -> None:
    db = tmp_path / "runs.db"
    script = tmp_path / "forgetful.py"
    script.write_text(NEVER_CLOSED)
    result = subprocess.run(
        [sys.executable, "-W", "default::ResourceWarning", str(script), f"sqlite:///{db}", payload],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "returned"
    assert "the Runtime of run forgotten was never closed" in result.stderr
    assert "ResourceWarning" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    with sqlite3.connect(db) as connection:
        (stored,) = connection.execute("SELECT status FROM agentsnap_runs").fetchall()
        (count,) = connection.execute("SELECT count(*) FROM agentsnap_snapshots").fetchone()
        (expires,) = connection.execute("SELECT expires_at FROM agentsnap_run_leases").fetchone()
    assert stored == (status,)
    assert count == snapshots  # the final states, unless a handler was cut off half-way
    # The lease was released (it expires at once): resume() can take the run without waiting.
    assert datetime.fromisoformat(expires) <= datetime.now(UTC).replace(tzinfo=None)
