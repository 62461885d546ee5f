"""Nothing the outside world sees happens twice, however often a run is killed and resumed,
and no model call whose answer was recorded is asked again.

``crash_workflow.py`` runs in a child process: four agents pass six tokens round a ring, and
every delivery calls two side-effecting tools, one with an explicit idempotency key and one
with a derived key, each recording its logical effect in an outside service's table keyed by
the idempotency key it was handed. The test kills the child with SIGKILL at a random moment
(after a random number of new effects, or a random delay after its first handler started, or,
for a resumed child, a random delay after it was spawned), then resumes the run in a new
child (``--resume``), and kills again, until a child finishes. Then:

* every logical effect is in the service's table under exactly one key, for both kinds of
  key (two keys for one effect: the effect happened twice), though the derived key's call
  carries a note a sampled model words anew each time it is asked;
* no model call was asked again after its answer was recorded (a resumed handler gets the
  recorded answer), and every hop's model call is recorded;
* every logical effect of a complete run happened, and the final states hold every hop of
  every token exactly once;
* every stored complete snapshot is a consistent cut;
* the run is stored as succeeded.

On SQLite and PostgreSQL, ``KILLS_PER_RUN`` kills a run, ``AGENTSNAP_CRASH_KILLS`` kill points
in all (60 by default, half per backend); ``AGENTSNAP_CRASH_SEED`` replays the kill moments
(the interleavings differ from one attempt to the next).

Two more tests: a killed run is shown as interrupted (by the store and by ``agentsnap runs``),
and of two resumes started at once exactly one proceeds, the other fails with
``RunOwnedError`` naming the owner, without touching the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
from click.testing import CliRunner
from postgres_db import postgres_url_or_skip

import agentsnap
from agentsnap import ConfigurationError, RunStatus, SnapshotStatus
from agentsnap.cli import main as cli
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger
from agentsnap.testing import cut_problems

from .crash_workflow import (
    AGENTS,
    ASKS_SCHEMA,
    DERIVED,
    EXIT_REFUSED,
    EXPLICIT,
    HOPS,
    SERVICE_SCHEMA,
    TOKENS,
    expected_effects,
    initial_inputs,
)

WORKFLOW = Path(__file__).with_name("crash_workflow.py")
ROOT = WORKFLOW.parents[2]
KILLS = int(os.environ.get("AGENTSNAP_CRASH_KILLS", "60"))
KILLS_PER_RUN = 7
RUNS_PER_BACKEND = max(1, -(-KILLS // (2 * KILLS_PER_RUN)))
SEED = int(os.environ.get("AGENTSNAP_CRASH_SEED") or random.SystemRandom().randrange(2**31))
DEADLINE = 120.0
"""Longest wait, in seconds, for a child to get somewhere (a slow, loaded machine); not a
timing check."""
BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


def database(backend: str, tmp_path: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'agentsnap.db'}"
    return postgres_url_or_skip()


def make_service(tmp_path: Path) -> Path:
    path = tmp_path / "service.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(SERVICE_SCHEMA)
        conn.execute(ASKS_SCHEMA)
        conn.commit()
    return path


def service_rows(service: Path) -> list[tuple[str, str, str, int, int]]:
    """``(key, effect, tool, pid, attempt)`` of every effect the service recorded."""
    with contextlib.closing(sqlite3.connect(service, timeout=60)) as conn:
        rows = conn.execute("SELECT key, effect, tool, pid, attempt FROM effects").fetchall()
    return [(str(k), str(e), str(t), int(p), int(a)) for k, e, t, p, a in rows]


def effect_count(service: Path) -> int:
    with contextlib.closing(sqlite3.connect(service, timeout=60)) as conn:
        ((count,),) = conn.execute("SELECT count(*) FROM effects").fetchall()
    return int(count)


def workflow(url: str, service: Path, run_id: str, *args: str) -> list[str]:
    return [sys.executable, str(WORKFLOW), url, str(service), run_id, *args]


def tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] or "(nothing)"


async def stored_run(url: str, run_id: str) -> tuple[RunStatus, list[str]]:
    """The run's status, and what is wrong with its stored complete snapshots."""
    store = SqlStore(url)
    try:
        run = await store.get_run(run_id)
        problems = [
            f"snapshot {s.seq}: {problem}"
            for s in await store.list_snapshots(run_id)
            if s.status is SnapshotStatus.COMPLETE
            for problem in cut_problems(s)
        ]
    finally:
        await store.close()
    return run.status, problems


# -- killing and resuming ---------------------------------------------------------------------


@dataclass
class Child:
    """A workflow process whose output goes to files."""

    process: subprocess.Popen[bytes]
    out: Path
    err: Path

    def exited(self) -> bool:
        return self.process.poll() is not None

    def kill(self) -> int:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGKILL)
        return self.process.wait()

    def result(self) -> dict[str, Any]:
        for line in reversed(self.out.read_text().splitlines()):
            if line.startswith("{"):
                document: dict[str, Any] = json.loads(line)
                return dict(document["result"])
        raise AssertionError(f"no result printed\n{tail(self.err)}")


@dataclass
class Crashes:
    """Runs one workflow run to its end, killing it ``kills`` times on the way."""

    backend: str
    url: str
    service: Path
    run_id: str
    rng: random.Random
    workdir: Path
    log: list[str] = field(default_factory=list)
    """One line per child: how it was stopped."""
    problems: list[str] = field(default_factory=list)
    """What was wrong right after a kill."""
    effects_before_last: int = 0
    """Effects recorded by the service when the last child started."""
    script: Path = WORKFLOW
    """The workflow the children run (same command line as ``crash_workflow.py``)."""
    effects: int = field(default_factory=lambda: len(expected_effects()))
    """How many effects a complete run has."""
    count: Callable[[Path], int] = effect_count
    """How many effects the service recorded so far."""
    delay: float = 0.06
    """Longest "delay" kill moment after the first delivery (a whole run takes about 0.15 s)."""
    options: tuple[str, ...] = ()
    """More options for every child."""

    def describe(self) -> str:
        return (
            f"{self.backend} run {self.run_id} (AGENTSNAP_CRASH_SEED={SEED}), children:\n  "
            + "\n  ".join(self.log)
        )

    def spawn(self, resume: bool) -> Child:
        n = len(self.log)
        out, err = self.workdir / f"child{n}.out", self.workdir / f"child{n}.err"
        args = ["--resume", *self.options] if resume else [*self.options]
        with out.open("wb") as stdout, err.open("wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, str(self.script), self.url, str(self.service), self.run_id, *args],
                cwd=ROOT,
                stdout=stdout,
                stderr=stderr,
            )
        return Child(process, out, err)

    def wait_for(self, child: Child, ready: Callable[[], bool]) -> bool:
        """Wait until ``ready()``; ``False`` when the child exited first."""
        started = time.monotonic()
        while not ready():
            if child.exited():
                return False
            assert time.monotonic() - started < DEADLINE, (
                f"child {len(self.log)} made no progress in {DEADLINE}s\n{tail(child.err)}"
                f"\n{self.describe()}"
            )
            time.sleep(0.002)
        return True

    def moment(self, child: Child, resume: bool, left: int) -> str | None:
        """Wait for a random moment to kill ``child``; ``None`` when it exited first."""
        mode = self.rng.choice(["effects", "delay", "early"] if resume else ["effects", "delay"])
        if mode == "effects":
            before = self.count(self.service)
            step = max(1, (self.effects - before) // (left + 1))
            target = before + self.rng.randint(1, step)
            extra = self.rng.uniform(0, 0.005)
            reached = self.wait_for(child, lambda: self.count(self.service) >= target)
            where = f"after effect {target} (+{extra * 1000:.1f} ms)"
        elif mode == "delay":
            extra = self.rng.uniform(0, self.delay)
            reached = self.wait_for(child, lambda: "RUNNING" in child.out.read_text())
            where = f"{extra * 1000:.0f} ms after its first delivery"
        else:
            extra = self.rng.uniform(0, 0.7)
            reached = True
            where = f"{extra * 1000:.0f} ms after it was spawned"
        if not reached:
            return None
        time.sleep(extra)
        return where

    def run(self, kills: int) -> dict[str, Any] | None:
        """Kill the run ``kills`` times at random moments; return the finishing child's result.

        ``None`` when the last kill landed after the run had finished (its status stored),
        before the child printed its result.
        """
        resume = False
        while True:
            child = self.spawn(resume)
            before = self.count(self.service)
            left = kills - sum(line.startswith("killed") for line in self.log)
            what = "resume" if resume else "first run"
            if left > 0:
                try:
                    where = self.moment(child, resume, left)
                finally:
                    returncode = child.kill()
                if returncode == -signal.SIGKILL:
                    after = self.count(self.service)
                    self.log.append(f"killed {what} {where}: effects {before} -> {after}")
                    status, _ = asyncio.run(stored_run(self.url, self.run_id))
                    if status is RunStatus.SUCCEEDED:
                        self.log[-1] += ", after the run had finished"
                        return None
                    if status.value != "interrupted":
                        self.problems.append(
                            f"after kill {len(self.log)} the run shows {status.value}, "
                            "not interrupted"
                        )
                    resume = True
                    continue
            else:
                try:
                    returncode = child.process.wait(timeout=DEADLINE)
                except subprocess.TimeoutExpired:
                    child.kill()
                    raise AssertionError(
                        f"the last {what} did not finish in {DEADLINE}s\n{tail(child.err)}\n"
                        f"{self.describe()}"
                    ) from None
            self.effects_before_last = before
            self.log.append(f"{what} exited with status {returncode}")
            assert returncode == 0, f"{tail(child.err)}\n{self.describe()}"
            resumed = child.result().get("resumed_from")
            if resumed is not None:
                self.log[-1] += f" (resumed from snapshot {resumed})"
            return child.result()


def effect_problems(service: Path) -> list[str]:
    """Effects that happened under more than one key, and effects that never happened."""
    keys: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for key, effect, _, pid, attempt in service_rows(service):
        keys[effect].append((key, pid, attempt))
    twice = {effect: found for effect, found in keys.items() if len(found) > 1}
    problems = []
    for tool, kind in ((EXPLICIT, "explicit"), (DERIVED, "derived")):
        mine = {e: f for e, f in sorted(twice.items()) if e.startswith(f"{tool}:")}
        if mine:
            shown = "\n    ".join(
                f"{effect}: " + ", ".join(f"key {k} (pid {p}, attempt {a})" for k, p, a in found)
                for effect, found in list(mine.items())[:10]
            )
            problems.append(
                f"{len(mine)} effects with {kind} keys happened more than once:\n    {shown}"
            )
    expected = expected_effects()
    missing = sorted(expected - set(keys))
    if missing:
        problems.append(f"{len(missing)} effects never happened: {missing[:12]}")
    unexpected = sorted(set(keys) - expected)
    if unexpected:
        problems.append(f"unexpected effects: {unexpected[:12]}")
    return problems


def model_call_problems(url: str, run_id: str, service: Path) -> list[str]:
    """Model calls asked again after their answer was recorded (on the same timeline: the
    prompt names it), and hops without a recorded model call."""
    ledger = SqlLedger(url, create=False)
    try:
        calls = asyncio.run(ledger.list_model_calls(run_id))
    finally:
        asyncio.run(ledger.close())
    with contextlib.closing(sqlite3.connect(service, timeout=60)) as conn:
        asks = conn.execute("SELECT prompt, answer, asked_at FROM asks").fetchall()
    asked: dict[str, list[float]] = defaultdict(list)
    for prompt, _, at in asks:
        asked[str(prompt)].append(float(at))
    problems = []
    recorded: set[str] = set()
    for call in calls:
        prompt = str(call.asked().messages[-1].content)
        recorded.add(prompt.split(" on timeline")[0])
        done = call.finished_at.timestamp()
        again = [at for at in asked[prompt] if at > done + 0.001]
        if again:
            problems.append(
                f"{prompt!r} was asked {len(again)} more time(s) after its answer was recorded"
            )
    hops = {f"note for {t}:{h}" for t in TOKENS for h in range(HOPS + 1)}
    if hops - recorded:
        problems.append(f"hops without a recorded model call: {sorted(hops - recorded)[:8]}")
    return problems


def state_problems(result: dict[str, Any]) -> list[str]:
    handled = Counter(hop for name in AGENTS for hop in result["handled"][name])
    expected = Counter(f"{t}:{h}" for t in TOKENS for h in range(HOPS + 1))
    if handled == expected:
        return []
    missing = sorted((expected - handled).elements())
    extra = sorted((handled - expected).elements())
    return [f"final states: hops missing {missing[:12]}, handled twice {extra[:12]}"]


def initial_counts() -> dict[str, int]:
    return dict(Counter(agent for agent, _ in initial_inputs()))


@pytest.mark.parametrize("case", range(RUNS_PER_BACKEND))
@pytest.mark.parametrize("backend", BACKENDS)
def test_no_effect_happens_twice_across_kills_and_resumes(
    backend: str, case: int, tmp_path: Path
) -> None:
    url = database(backend, tmp_path)
    crashes = Crashes(
        backend=backend,
        url=url,
        service=make_service(tmp_path),
        run_id=f"crash{case:03d}" + "0" * 24,
        rng=random.Random(f"{SEED}:{backend}:{case}"),
        workdir=tmp_path,
    )
    result = crashes.run(KILLS_PER_RUN)
    problems = effect_problems(crashes.service)
    problems += model_call_problems(url, crashes.run_id, crashes.service)
    if result is not None:
        problems += state_problems(result)
    status, cut = asyncio.run(stored_run(url, crashes.run_id))
    problems += cut
    if status is not RunStatus.SUCCEEDED:
        problems.append(f"the run is stored as {status.value}, not succeeded")
    problems += crashes.problems
    # Inputs are durable before the first effect: once there was one, a resume restores them all.
    sent = initial_counts() if result is None else result.get("inputs_sent", initial_counts())
    if crashes.effects_before_last and sent != initial_counts():
        problems.append(
            f"runtime.inputs_sent after the last resume is {sent}, expected {initial_counts()} "
            f"(effects had happened, so every input was durable)"
        )
    killed = sum(line.startswith("killed") for line in crashes.log)
    assert not problems, "\n".join([*problems, crashes.describe()])
    assert killed >= KILLS_PER_RUN // 2, f"only {killed} kills landed\n{crashes.describe()}"


def test_no_effect_happens_twice_when_its_arguments_are_redacted(tmp_path: Path) -> None:
    # The ledger fingerprints the redacted arguments: a re-executed call after a kill has
    # the same markers (the same keyed hash), so it finds its recorded outcome.
    url = database("sqlite", tmp_path)
    crashes = Crashes(
        backend="sqlite",
        url=url,
        service=make_service(tmp_path),
        run_id="redacted" + "0" * 24,
        rng=random.Random(f"{SEED}:redacted"),
        workdir=tmp_path,
        options=("--redact",),
    )
    result = crashes.run(KILLS_PER_RUN)
    problems = effect_problems(crashes.service)
    if result is not None:
        problems += state_problems(result)
    status, cut = asyncio.run(stored_run(url, crashes.run_id))
    problems += cut
    if status is not RunStatus.SUCCEEDED:
        problems.append(f"the run is stored as {status.value}, not succeeded")
    problems += crashes.problems
    assert not problems, "\n".join([*problems, crashes.describe()])
    ledger = SqlLedger(url, create=False)
    try:
        calls = asyncio.run(ledger.list_calls(crashes.run_id))
    finally:
        asyncio.run(ledger.close())
    assert calls
    assert all(str(call.arguments["token"]).startswith("[redacted str hmac:") for call in calls)
    killed = sum(line.startswith("killed") for line in crashes.log)
    assert killed >= KILLS_PER_RUN // 2, f"only {killed} kills landed\n{crashes.describe()}"


# -- ownership --------------------------------------------------------------------------------


def killed_run(url: str, service: Path, run_id: str, tmp_path: Path) -> None:
    """A run killed half-way, after some of its effects."""
    crashes = Crashes("", url, service, run_id, random.Random(SEED), tmp_path)
    child = crashes.spawn(resume=False)
    half = len(expected_effects()) // 3
    try:
        reached = crashes.wait_for(child, lambda: effect_count(service) >= half)
    finally:
        returncode = child.kill()
    assert reached, f"the run ended before it could be killed\n{tail(child.err)}"
    assert returncode == -signal.SIGKILL, tail(child.err)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_killed_run_shows_interrupted(backend: str, tmp_path: Path) -> None:
    url = database(backend, tmp_path)
    run_id = "1" * 32
    killed_run(url, make_service(tmp_path), run_id, tmp_path)
    status, _ = asyncio.run(stored_run(url, run_id))
    assert status.value == "interrupted", f"store.get_run says {status.value}"
    listed = CliRunner().invoke(cli, ["runs", "--db", url, "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {row["id"]: row for row in json.loads(listed.output)}
    assert rows[run_id]["status"] == "interrupted", rows[run_id]


class Gated:
    """A ``--resume --gate`` child: it resumes, and runs, when told to."""

    def __init__(self, url: str, service: Path, run_id: str) -> None:
        self.process = subprocess.Popen(
            # Not waiting for a live owner's lease: the second resume must be refused at once.
            workflow(url, service, run_id, "--resume", "--gate", "--wait", "0"),
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.errors: list[str] = []
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        self.pumps = [
            threading.Thread(target=self._pump, args=(stream, sink), daemon=True)
            for stream, sink in (
                (self.process.stdout, self.lines.put),
                (self.process.stderr, self.errors.append),
            )
        ]
        for pump in self.pumps:
            pump.start()

    @staticmethod
    def _pump(stream: IO[str], sink: Callable[[str], None]) -> None:
        with stream:
            for line in stream:
                sink(line)

    def document(self) -> dict[str, Any]:
        """The next JSON line the child prints (``RUNNING`` lines skipped)."""
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"the child printed nothing\n{''.join(self.errors)[-3000:]}"
                ) from None
            if line.startswith("{"):
                document: dict[str, Any] = json.loads(line)
                return document

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def wait(self) -> int:
        try:
            return self.process.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(
                f"the child did not exit\n{''.join(self.errors)[-3000:]}"
            ) from None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for pump in self.pumps:  # they close the child's output when it ends
            pump.join(timeout=DEADLINE)
        if self.process.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_resumes_at_once(backend: str, tmp_path: Path) -> None:
    url = database(backend, tmp_path)
    service = make_service(tmp_path)
    run_id = "2" * 32
    killed_run(url, service, run_id, tmp_path)
    children = [Gated(url, service, run_id) for _ in range(2)]
    try:
        for child in children:
            assert "ready" in child.document()
        for child in children:  # both wait on their stdin: let them resume together
            child.go()
        outcomes = [child.document() for child in children]
        resumed = [c for c, o in zip(children, outcomes, strict=True) if "resumed" in o]
        refused = [o for o in outcomes if "error" in o]
        assert len(resumed) == 1, f"one must resume, one refuse: {outcomes}"
        assert len(refused) == 1, f"one must resume, one refuse: {outcomes}"
        (owner,) = resumed
        (error,) = refused
        assert error["error"] == "RunOwnedError", error
        assert f":{owner.process.pid}:" in str(error["owner"]), (error, owner.process.pid)
        assert f":{owner.process.pid}:" in error["message"], error
        (loser,) = [c for c in children if c is not owner]
        assert loser.wait() == EXIT_REFUSED
        # The refused runtime left the run alone: it is still the owner's, and running.
        status, _ = asyncio.run(stored_run(url, run_id))
        assert status is RunStatus.RUNNING, f"after the refused resume the run is {status.value}"
        owner.go()
        assert owner.wait() == 0, "".join(owner.errors)[-3000:]
        document = owner.document()
        assert "result" in document, document
    finally:
        for child in children:
            child.stop()
    problems = effect_problems(service)
    status, cut = asyncio.run(stored_run(url, run_id))
    assert not problems + cut, "\n".join(problems + cut)
    assert status is RunStatus.SUCCEEDED

    # A finished run cannot be resumed.
    late = Gated(url, service, run_id)
    try:
        assert "ready" in late.document()
        late.go()
        outcome = late.document()
        refusal = getattr(agentsnap, str(outcome.get("error")), None)
        assert isinstance(refusal, type), outcome
        assert issubclass(refusal, ConfigurationError), outcome
        assert late.wait() == EXIT_REFUSED
    finally:
        late.stop()
    status, _ = asyncio.run(stored_run(url, run_id))
    assert status is RunStatus.SUCCEEDED
