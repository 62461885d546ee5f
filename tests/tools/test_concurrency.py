"""Many callers, one key: the tool's body runs once, whoever calls and from where.

Two processes with 8 tasks each call a side-effecting tool on the same keys at the same time
(``ledger_worker.py``). The body records each run in a table of its own. Every key's body
must have run exactly once; every other call gets the recorded result, or ``ToolInProgress``
when the call in progress outlasted its (short) wait.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import sqlalchemy

from agentsnap import LedgerEntry
from agentsnap.store import migrate
from agentsnap.store.sql_ledger import SqlLedger

WORKER = Path(__file__).with_name("ledger_worker.py")
PROCESSES = 2
TASKS = 8


async def list_calls(url: str) -> list[LedgerEntry]:
    ledger = SqlLedger(url)
    try:
        return await ledger.list_calls()
    finally:
        await ledger.close()


def test_each_key_runs_once_across_tasks_and_processes(db_url: str) -> None:
    migrate.upgrade(db_url)
    engine = sqlalchemy.create_engine(migrate.sync_url(db_url))
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE ledger_test_effects (key TEXT, runner TEXT)"))

    workers = [
        subprocess.Popen(
            [sys.executable, str(WORKER), db_url, f"p{n}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(PROCESSES)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready", worker.stderr
        for worker in workers:  # both processes are waiting: start them together
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        reports = [worker.communicate(timeout=120) for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    for worker, (_, err) in zip(workers, reports, strict=True):
        assert worker.returncode == 0, err
    outcomes = [outcome for out, _ in reports for outcome in json.loads(out)]

    with engine.connect() as conn:
        effects = conn.execute(sqlalchemy.text("SELECT key, runner FROM ledger_test_effects"))
        runs = Counter(key for key, _ in effects)
    engine.dispose()
    recorded = {entry.key: entry for entry in asyncio.run(list_calls(db_url))}

    keys = {outcome["key"] for outcome in outcomes}
    assert len(outcomes) == PROCESSES * TASKS * len(keys)
    assert runs == dict.fromkeys(keys, 1), "each key's tool body ran exactly once"
    for outcome in outcomes:
        entry = recorded[outcome["key"]]
        assert entry.status == "succeeded"
        assert entry.attempts == 1
        if outcome["outcome"] == "result":
            assert outcome["result"] == entry.result, outcome
        else:
            assert outcome["outcome"] == "in_progress", outcome
