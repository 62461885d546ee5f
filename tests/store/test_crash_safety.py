"""A run killed with SIGKILL leaves an SQLite database that opens cleanly and holds only whole,
consistent snapshots.

``examples/bank_transfers.py --db sqlite:///…`` runs in a child process and is killed:

* at random moments while it writes snapshots, once per seed (the seed and the kill delay are
  in every failure message, so a failing case can be replayed);
* at every write step (each data-changing SQL statement and each commit) from its start up to
  and including the commit of its first snapshot, so every point of schema creation, run
  creation and the first snapshot's transaction is covered, deterministically.

Afterwards a fresh ``SqlStore`` must open the database; every snapshot it returns must hold
every teller and ``$env`` with parseable states, be a consistent cut, and conserve the money
(1000 per teller); SQLite's ``integrity_check`` and ``foreign_key_check`` must pass; and every
snapshot committed before the kill must still be there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agentsnap.records import RunInfo, Snapshot, SnapshotStatus
from agentsnap.state import content_hash
from agentsnap.store.sql import SqlStore
from agentsnap.testing import cut_problems

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "bank_transfers.py"

AGENTS = 5
TELLERS = frozenset(f"teller-{i}" for i in range(AGENTS))
INITIAL_TOTAL = 1_000 * AGENTS
# Far more transfers than can be made before the kill: the run is always cut short.
BANK_ARGS = ["--agents", str(AGENTS), "--transfers", "20000", "--snapshot-every", "10"]

SEEDS = [11, 23, 37, 41, 59]
MAX_KILL_DELAY = 1.0
"""Longest wait, in seconds, between the first committed snapshot and the kill."""
START_TIMEOUT = 30.0
"""How long the child may take to commit its first snapshot (a slow, loaded machine)."""

# Kills the example at each write step before its first snapshot is committed. A write step is
# an SQL statement other than SELECT or PRAGMA, or a commit. This process imports everything
# once, then forks one child per kill point; a child runs the example with its database in
# <argv[1]>/<name>/ and kills itself with SIGKILL right before its N-th write step, or right
# before the commit of its first snapshot, whichever comes first, after writing the step to
# its stderr. The first child (N = 0) only stops at that commit, which gives the number of
# steps before it. Once a snapshot's transaction has begun, only that connection's steps are
# counted: other writers just wait for it. One JSON line per child goes to stdout.
CRASH_AT_EVERY_STEP = """
import json
import os
import runpy
import signal
import sys
import traceback
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.engine import Engine

base = Path(sys.argv[1])
example = sys.argv[2]
example_args = sys.argv[3:]
kill_at = 0
steps = 0
leader_chosen = False


def step(what, first_snapshot_commit=False):
    global steps
    steps += 1
    if steps == kill_at or first_snapshot_commit:
        tag = " first-snapshot-commit" if first_snapshot_commit else ""
        sys.stderr.write(f"KILLED step={steps}{tag} {what}\\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def before_cursor_execute(conn, cursor, statement, parameters, context, executemany):
    global leader_chosen
    text = " ".join(statement.split())
    if text.split(" ", 1)[0].upper() in ("SELECT", "PRAGMA"):
        return
    if text.upper().startswith("INSERT INTO AGENTSNAP_SNAPSHOTS "):
        conn.info["crash_test_snapshot"] = True
        if not leader_chosen:
            leader_chosen = True
            conn.info["crash_test_leader"] = True
    if leader_chosen and not conn.info.get("crash_test_leader"):
        return
    step(text[:100])


def commit(conn):
    first = conn.info.pop("crash_test_snapshot", False)
    if leader_chosen and not first and not conn.info.get("crash_test_leader"):
        return
    step(f"COMMIT on {conn.engine.url.drivername}", first)


def rollback(conn):
    conn.info.pop("crash_test_snapshot", None)


def child(directory):
    error = os.open(directory / "stderr.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(error, 2)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    sys.argv = [example, *example_args, "--db", f"sqlite:///{directory / 'bank.db'}"]
    code = 0
    try:
        runpy.run_path(example, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(n, name):
    global kill_at
    kill_at = n
    directory = base / name
    directory.mkdir()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        child(directory)
    _, status = os.waitpid(pid, 0)
    text = (directory / "stderr.txt").read_text(errors="replace")
    killed = [line for line in text.splitlines() if line.startswith("KILLED ")]
    result = {
        "kill_at": n,
        "db": str(directory / "bank.db"),
        "exit": os.waitstatus_to_exitcode(status),
        "report": killed[-1] if killed else text[-3000:] or "(nothing on stderr)",
    }
    print(json.dumps(result), flush=True)
    return result


def traced_open(self):
    # Snapshots go through SqliteWriter's own sqlite3 connection: count its statements too,
    # once per statement (an executemany runs one statement many times).
    connection = open_writer(self)
    last = [None]

    def trace(statement):
        text = " ".join(statement.split())
        head = text.split(" ", 1)[0].upper()
        # The trace shows each row's values: the rows of one executemany are one statement.
        shape = text.split(" VALUES", 1)[0]
        if head in ("SELECT", "PRAGMA") or shape == last[0]:
            return
        last[0] = shape
        if head == "COMMIT":
            first = writer_snapshot[0]
            writer_snapshot[0] = False
            last[0] = None
            step("COMMIT on the snapshot writer", first)
        elif head == "ROLLBACK":
            writer_snapshot[0] = False
            last[0] = None
        else:
            if text.upper().startswith("INSERT INTO AGENTSNAP_SNAPSHOTS "):
                writer_snapshot[0] = True
            step(text[:100])

    connection.set_trace_callback(trace)
    return connection


runpy.run_path(example, run_name="preload")
from agentsnap.store.sqlite_writer import SqliteWriter  # noqa: E402

open_writer = SqliteWriter._open
writer_snapshot = [False]
SqliteWriter._open = traced_open
event.listen(Engine, "before_cursor_execute", before_cursor_execute)
event.listen(Engine, "commit", commit)
event.listen(Engine, "rollback", rollback)
last = run(0, "first-snapshot-commit")
if " first-snapshot-commit " in last["report"]:
    for n in range(1, int(last["report"].split()[1].removeprefix("step="))):
        run(n, f"step-{n:03}")
"""


@dataclass
class Findings:
    """What a fresh look at a killed run's database found."""

    problems: list[str] = field(default_factory=list)
    runs: int = 0
    complete: int = 0
    snapshots: int = 0


def money_in(snapshot: Snapshot) -> int | str:
    """Balances recorded in the tellers plus transfer amounts recorded in flight.

    A description of the first malformed value instead, if any.
    """
    total = 0
    for name, cut in snapshot.agents.items():
        if name != "$env":
            balance = cut.state.get("balance")
            if not isinstance(balance, int):
                return f"{name} has no integer balance: {cut.state!r}"
            total += balance
    for channel in snapshot.channels:
        for message in channel.messages:
            if message.kind == "transfer":
                payload = message.payload
                amount = payload.get("amount") if isinstance(payload, dict) else None
                if not isinstance(amount, int):
                    return f"transfer {message.id} in flight has payload {payload!r}"
                total += amount
    return total


def snapshot_problems(snapshot: Snapshot) -> list[str]:
    """Ways a snapshot read back from the store is not whole, consistent and conserving."""
    where = f"snapshot {snapshot.seq} ({snapshot.id}, {snapshot.status})"
    if snapshot.status is not SnapshotStatus.COMPLETE:
        return [] if snapshot.error else [f"{where} failed without saying why"]
    problems: list[str] = []
    expected = {*TELLERS, "$env"}
    if set(snapshot.agents) != expected:
        missing = sorted(expected - set(snapshot.agents))
        extra = sorted(set(snapshot.agents) - expected)
        problems.append(f"{where} is not whole: agents missing {missing}, unexpected {extra}")
    if snapshot.completed_at is None:
        problems.append(f"{where} is complete but has no completion time")
    for name, cut in sorted(snapshot.agents.items()):
        try:
            state = cut.state
        except ValueError as exc:
            problems.append(f"{where}: the state of {name} does not parse: {exc}")
            continue
        if content_hash(cut.state_json) != cut.state_hash:
            problems.append(f"{where}: the state of {name} does not match its hash")
        if name == "$env" and state != {}:
            problems.append(f"{where}: $env has state {state!r}")
    if problems:
        return problems
    problems.extend(f"{where}: {problem}" for problem in cut_problems(snapshot))
    found = money_in(snapshot)
    if isinstance(found, str):
        problems.append(f"{where}: {found}")
    elif found != INITIAL_TOTAL:
        problems.append(f"{where} holds {found} in money, not {INITIAL_TOTAL}")
    return problems


async def inspect_database(path: Path) -> Findings:
    """Open a killed run's database as a new process would, and check everything in it."""
    findings = Findings()
    if not await asyncio.to_thread(path.exists):
        return findings
    store = SqlStore(f"sqlite:///{path}")
    stored: list[tuple[RunInfo, list[Snapshot]]] = []
    opened = False
    try:
        runs = await store.list_runs()
        stored.extend([(run, await store.list_snapshots(run.id)) for run in runs])
        opened = True
    except Exception as exc:
        findings.problems.append(
            f"a fresh SqlStore cannot read the database: {type(exc).__name__}: {exc}"
        )
    finally:
        await store.close()
    findings.runs = len(stored)
    for run, snapshots in stored:
        if run.metadata.get("example") != "bank_transfers":
            findings.problems.append(f"run {run.id} has metadata {run.metadata!r}")
        findings.snapshots += len(snapshots)
        seqs = [snapshot.seq for snapshot in snapshots]
        if len(set(seqs)) != len(seqs):
            findings.problems.append(f"run {run.id} repeats snapshot numbers: {seqs}")
        for snapshot in snapshots:
            findings.complete += snapshot.status is SnapshotStatus.COMPLETE
            findings.problems.extend(snapshot_problems(snapshot))
    with contextlib.closing(sqlite3.connect(path)) as db:
        integrity = db.execute("PRAGMA integrity_check").fetchall()
        if integrity != [("ok",)]:
            findings.problems.append(f"PRAGMA integrity_check: {integrity}")
        dangling = db.execute("PRAGMA foreign_key_check").fetchall()
        if dangling:
            findings.problems.append(f"PRAGMA foreign_key_check: {dangling[:10]}")
        if opened:
            # Rows of a snapshot whose own row is missing would be a snapshot half written.
            for table in ("agentsnap_snapshot_agents", "agentsnap_snapshot_messages"):
                (orphans,) = db.execute(
                    f"SELECT count(*) FROM {table} WHERE snapshot_id NOT IN "
                    "(SELECT id FROM agentsnap_snapshots)"
                ).fetchone()
                if orphans:
                    findings.problems.append(f"{orphans} rows of {table} belong to no snapshot")
    return findings


def committed_snapshots(path: Path) -> int:
    """Complete snapshots another process sees committed now (0 until the schema exists)."""
    if not path.exists():
        return 0
    try:
        with contextlib.closing(
            sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=1.0)
        ) as db:
            row = db.execute(
                "SELECT count(*) FROM agentsnap_snapshots WHERE status = 'complete'"
            ).fetchone()
    except sqlite3.OperationalError:
        return 0
    count: int = row[0]
    return count


def stderr_of(path: Path) -> str:
    text = path.read_text(encoding="utf-8", errors="replace")
    return text[-3000:] if text else "(nothing on stderr)"


async def kill(process: asyncio.subprocess.Process) -> int:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL)
    return await process.wait()


# -- killed at random moments while snapshots are being written --------------------------------


@pytest.mark.parametrize("seed", SEEDS)
async def test_killed_while_writing_snapshots(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    db = tmp_path / "bank.db"
    log = tmp_path / "stderr.txt"
    loop = asyncio.get_running_loop()
    with log.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(EXAMPLE),
            *BANK_ARGS,
            "--seed",
            str(seed),
            "--db",
            f"sqlite:///{db}",
            cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            started = loop.time()
            while committed_snapshots(db) < 1:
                assert process.returncode is None, (
                    f"seed {seed}: the run exited ({process.returncode}) before committing a "
                    f"snapshot\n{stderr_of(log)}"
                )
                assert loop.time() - started < START_TIMEOUT, (
                    f"seed {seed}: no snapshot committed within {START_TIMEOUT}s"
                )
                await asyncio.sleep(0.01)
            first_at = loop.time() - started
            delay = rng.uniform(0.0, MAX_KILL_DELAY)
            case = (
                f"seed {seed}: killed {delay:.3f}s after the first snapshot was committed "
                f"({first_at:.2f}s after start)"
            )
            await asyncio.sleep(delay)
            committed_before = committed_snapshots(db)
        finally:
            returncode = await kill(process)

    assert returncode == -signal.SIGKILL, (
        f"{case}: the run was not cut short by the kill (exit status {returncode})\n"
        f"{stderr_of(log)}"
    )
    # Every kill here lands after the first snapshot was committed, while more are written.
    assert committed_before >= 1, f"{case}: no snapshot was committed before the kill"

    findings = await inspect_database(db)
    assert not findings.problems, f"{case}:\n  " + "\n  ".join(findings.problems)
    assert findings.runs == 1, f"{case}: {findings.runs} runs in the database"
    print(f"{case}: {committed_before} committed before it, {findings.complete} stored")
    assert findings.complete >= committed_before, (
        f"{case}: {committed_before} complete snapshots were committed before the kill, "
        f"{findings.complete} are left after it"
    )


# -- killed at every write step up to the first snapshot's commit ------------------------------


@dataclass
class Crash:
    """One child killed at a chosen write step, as the forking parent reported it."""

    kill_at: int
    """The write step it was to be killed at (0: right before its first snapshot commit)."""
    db: Path
    exit: int
    report: str
    """The ``KILLED step=… what`` line the child wrote, or its stderr when there is none."""

    @property
    def step(self) -> int | None:
        words = self.report.split()
        if len(words) < 2 or words[0] != "KILLED" or not words[1].startswith("step="):
            return None
        return int(words[1].removeprefix("step="))

    @property
    def at_first_snapshot_commit(self) -> bool:
        return " first-snapshot-commit " in self.report


def read_crashes(path: Path) -> list[Crash]:
    crashes = []
    for line in path.read_text(encoding="utf-8").splitlines():
        found = json.loads(line)
        crashes.append(Crash(found["kill_at"], Path(found["db"]), found["exit"], found["report"]))
    return crashes


async def test_killed_before_the_first_snapshot_is_committed(tmp_path: Path) -> None:
    kills = tmp_path / "kills.jsonl"
    log = tmp_path / "stderr.txt"
    with kills.open("wb") as stdout, log.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CRASH_AT_EVERY_STEP,
            str(tmp_path),
            str(EXAMPLE),
            *BANK_ARGS,
            "--seed",
            "5",
            cwd=ROOT,
            stdout=stdout,
            stderr=stderr,
        )
        try:
            returncode = await asyncio.wait_for(process.wait(), 4 * START_TIMEOUT)
        finally:
            await kill(process)
    assert returncode == 0, stderr_of(log)
    crashes = read_crashes(kills)
    assert crashes, stderr_of(log)
    last = crashes[0]
    assert last.exit == -signal.SIGKILL, last.report
    assert last.at_first_snapshot_commit, f"never reached a snapshot commit: {last.report}"
    assert last.step is not None
    assert len(crashes) == last.step, f"{len(crashes)} kill points, expected {last.step}"

    failures: list[str] = []
    for crash in crashes:
        case = f"killed at write step {crash.kill_at or crash.step}: {crash.report}"
        if crash.exit != -signal.SIGKILL or crash.step is None:
            failures.append(f"{case}\n    the child was not killed (exit {crash.exit})")
            continue
        if crash.kill_at and crash.step != crash.kill_at:
            # Writers racing for the first snapshot may order their steps differently from
            # one run to the next; this child still died before that snapshot's commit.
            case += f" (reached the first snapshot commit at step {crash.step} first)"
        findings = await inspect_database(crash.db)
        problems = list(findings.problems)
        if findings.snapshots:
            problems.append(f"{findings.snapshots} snapshots are stored, none was committed")
        if problems:
            failures.append(case + "\n    " + "\n    ".join(problems))
    print(f"{len(crashes)} kill points, the first snapshot commit is write step {last.step}")
    assert not failures, (
        f"{len(failures)} of {len(crashes)} kills before the first snapshot commit left a "
        "bad database:\n  " + "\n  ".join(failures)
    )
