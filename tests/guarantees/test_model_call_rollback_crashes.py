"""Rollbacks of a sampled executor, killed with SIGKILL at random and resumed: no write twice.

``rollback_crash_workflow.py`` runs in a child process: an executor asks a sampled model
(fresh randomness in every process, up to 5 ms to answer) for tool calls, a random number of
lookups then two writes worded at random, runs them with ``run_tool_calls`` and reports to an
auditor who rejects about one report in three, so the run keeps rolling back and the model
keeps being asked again on new timelines. The test kills the child at random moments (after
a random number of new writes, a random delay after its first delivery, or, for a resumed
child, a random delay after it was spawned), resumes the run in a new child
(``Runtime(store=SqlStore(url), run_id=...)``, ``resume()``, ``run_until_idle()``) and kills
again, until a child finishes. Then:

* no write was performed twice: each ``(tool, task)`` is in the service's table under one
  idempotency key, whatever the redos after rollbacks and the re-executions after resumes
  asked for, and every write of every task happened;
* no model call was asked again after its answer was recorded (a handler re-executed after a
  resume, on the timeline its call was recorded on, gets the recorded answer);
* every task was reported, once, in the final state;
* every stored complete snapshot is a consistent cut, and the run is stored as succeeded.

On SQLite and PostgreSQL, ``KILLS_PER_RUN`` kills a run; ``AGENTSNAP_ROLLBACK_CRASH_KILLS``
kill points in all (20 by default, half per backend), ``AGENTSNAP_CRASH_SEED`` replays the
kill moments, ``AGENTSNAP_ROLLBACK_CRASH_TASKS`` sets the tasks of a run (24 by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sqlite3
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from agentsnap import RunStatus, SnapshotStatus
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger

from .rollback_crash_workflow import SERVICE_SCHEMA, WRITE_TOOLS
from .test_crash_resume import BACKENDS, SEED, Crashes, database, stored_run

WORKFLOW = Path(__file__).with_name("rollback_crash_workflow.py")
KILLS = int(os.environ.get("AGENTSNAP_ROLLBACK_CRASH_KILLS", "20"))
KILLS_PER_RUN = 10
RUNS_PER_BACKEND = max(1, -(-KILLS // (2 * KILLS_PER_RUN)))
TASKS = int(os.environ.setdefault("AGENTSNAP_ROLLBACK_CRASH_TASKS", "48"))
"""Passed on to the children. With one report in three rejected, a run of 48 tasks without a
rollback has odds of about 1 in 280 million; and it lasts long enough for most of its kills to
land before it ends, however fast the machine."""


def make_service(tmp_path: Path) -> Path:
    path = tmp_path / "service.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(SERVICE_SCHEMA)
        conn.commit()
    return path


def write_rows(service: Path) -> list[tuple[str, str, str, int]]:
    """``(key, tool, task, pid)`` of every write the service recorded."""
    with contextlib.closing(sqlite3.connect(service, timeout=60)) as conn:
        rows = conn.execute("SELECT key, tool, task, pid FROM writes").fetchall()
    return [(str(k), str(t), str(n), int(p)) for k, t, n, p in rows]


def write_count(service: Path) -> int:
    with contextlib.closing(sqlite3.connect(service, timeout=60)) as conn:
        ((count,),) = conn.execute("SELECT count(*) FROM writes").fetchall()
    return int(count)


def execution_count(service: Path) -> int:
    with contextlib.closing(sqlite3.connect(service, timeout=60)) as conn:
        ((count,),) = conn.execute("SELECT count(*) FROM executions").fetchall()
    return int(count)


def model_call_problems(url: str, run_id: str, service: Path) -> tuple[list[str], int]:
    """Model calls asked again after their answer was recorded (the prompt names the message
    and the timeline), and how many recorded answers were replayed."""
    ledger = SqlLedger(url, create=False)
    try:
        calls = asyncio.run(ledger.list_model_calls(run_id))
    finally:
        asyncio.run(ledger.close())
    with contextlib.closing(sqlite3.connect(service, timeout=60)) as conn:
        asks = conn.execute("SELECT prompt, asked_at FROM asks").fetchall()
    asked: dict[str, list[float]] = defaultdict(list)
    for prompt, at in asks:
        asked[str(prompt)].append(float(at))
    problems = []
    for call in calls:
        prompt = str(call.asked().messages[0].content)
        done = call.finished_at.timestamp()
        again = [at for at in asked[prompt] if at > done + 0.001]
        if again:
            problems.append(
                f"{prompt!r} was asked {len(again)} more time(s) after its answer was recorded"
            )
    return problems, sum(call.replays for call in calls)


def write_problems(service: Path) -> list[str]:
    """Writes performed under more than one key, and writes that never happened."""
    rows = write_rows(service)
    seen = Counter((tool, task) for _, tool, task, _ in rows)
    twice = sorted(w for w, n in seen.items() if n > 1)
    problems = []
    if twice:
        shown = [
            f"{tool} {task}: "
            + ", ".join(f"key {k} (pid {p})" for k, t, n, p in rows if (t, n) == (tool, task))
            for tool, task in twice[:10]
        ]
        problems.append(
            f"{len(twice)} writes performed more than once:\n    " + "\n    ".join(shown)
        )
    expected = {(tool, str(task)) for tool in WRITE_TOOLS for task in range(TASKS)}
    if expected - set(seen):
        problems.append(f"writes that never happened: {sorted(expected - set(seen))[:12]}")
    if set(seen) - expected:
        problems.append(f"unexpected writes: {sorted(set(seen) - expected)[:12]}")
    return problems


async def final_run(url: str, run_id: str) -> tuple[list[str], int]:
    """What the auditor's newest complete snapshot says was reported, and the rollbacks
    stored."""
    store = SqlStore(url)
    try:
        snapshots = [
            s for s in await store.list_snapshots(run_id) if s.status is SnapshotStatus.COMPLETE
        ]
        newest = max(snapshots, key=lambda s: s.seq)
        rollbacks = len(await store.list_rollbacks(run_id))
    finally:
        await store.close()
    memory = newest.agents["auditor"].state["memory"]
    assert isinstance(memory, dict)
    done = memory.get("done", [])
    assert isinstance(done, list)
    return [str(task) for task in done], rollbacks


@pytest.mark.parametrize("case", range(RUNS_PER_BACKEND))
@pytest.mark.parametrize("backend", BACKENDS)
def test_rollbacks_of_a_sampled_executor_never_write_twice_across_kills(
    backend: str, case: int, tmp_path: Path
) -> None:
    url = database(backend, tmp_path)
    crashes = Crashes(
        backend=backend,
        url=url,
        service=make_service(tmp_path),
        run_id=f"ab{case:03d}" + "0" * 27,
        rng=random.Random(f"{SEED}:rollbacks:{backend}:{case}"),
        workdir=tmp_path,
        script=WORKFLOW,
        effects=len(WRITE_TOOLS) * TASKS,
        count=write_count,
        delay=0.3,
    )
    result = crashes.run(KILLS_PER_RUN)
    problems = write_problems(crashes.service)
    asked_again, replays = model_call_problems(url, crashes.run_id, crashes.service)
    problems += asked_again
    status, cut = asyncio.run(stored_run(url, crashes.run_id))
    problems += cut
    if status is not RunStatus.SUCCEEDED:
        problems.append(f"the run is stored as {status.value}, not succeeded")
    problems += crashes.problems
    done, rollbacks = asyncio.run(final_run(url, crashes.run_id))
    expected = [str(task) for task in range(TASKS)]
    if sorted(done, key=int) != expected:
        problems.append(f"the auditor's final state reports {done}, not every task once")
    if result is not None and sorted(result["done"], key=int) != expected:
        problems.append(f"the last child's auditor reported {result['done']}")
    killed = sum(line.startswith("killed") for line in crashes.log)
    print(
        f"{backend} run {crashes.run_id}: {killed} kills, {rollbacks} rollbacks, "
        f"{replays} model answers replayed, "
        f"{execution_count(crashes.service)} tool executions for "
        f"{write_count(crashes.service)} writes"
    )
    assert not problems, "\n".join([*problems, crashes.describe()])
    assert killed >= KILLS_PER_RUN // 2, f"only {killed} kills landed\n{crashes.describe()}"
    assert rollbacks, f"the auditor rejected no report\n{crashes.describe()}"
