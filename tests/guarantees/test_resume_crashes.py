"""Resuming runs whose process was killed with SIGKILL.

``review_workflow.py`` runs a writer and a critic in a child process, which the test kills
once it holds, then resumes in new children:

* a draft in flight in the cut the run resumes from, rejected by the critic, is redone from
  the run's first snapshot, and the run finishes;
* a resume under a 50 ms timed snapshot policy, with a store slowed down so that taking the
  run over lasts several periods, finishes the run; of two such resumes started at once,
  exactly one does, and the other fails with ``RunOwnedError``;
* resuming a prefix of the killed run's id fails with ``NotFoundError`` naming the run, and
  writes nothing.

The same cases in one process are in ``tests/test_resume.py``.
"""

from __future__ import annotations

import asyncio
import json
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest

from agentsnap import RunStatus
from agentsnap.store.sql import SqlStore

from .review_workflow import EXIT_REFUSED, TOPICS
from .test_crash_resume import BACKENDS, DEADLINE, database, stored_run

WORKFLOW = Path(__file__).with_name("review_workflow.py")
ROOT = WORKFLOW.parents[2]
RUN = "5e5e" + "0" * 28
TIMED = ("--every-seconds", "0.05")
SLOW = ("--slow-store", "0.1")
"""Each look-up of the run or its lease takes 0.1 s more: taking the run over lasts several
periods of the timed policy."""


class Child:
    """A workflow process, whose output lines the test reads as they come."""

    def __init__(self, url: str, run_id: str, mode: str, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(WORKFLOW), url, run_id, mode, *args],
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

    def line(self) -> str:
        """The next line the child prints."""
        try:
            return self.lines.get(timeout=DEADLINE)
        except queue.Empty:
            raise AssertionError(
                f"the child printed nothing\n{''.join(self.errors)[-3000:]}"
            ) from None

    def document(self) -> dict[str, Any]:
        """The next JSON line the child prints."""
        while True:
            line = self.line()
            if line.startswith("{"):
                document: dict[str, Any] = json.loads(line)
                return document

    def killed_when_holding(self) -> None:
        """Wait until the child holds, then kill it with SIGKILL."""
        while (line := self.line()).strip() != "HOLDING":
            assert not line.startswith("{"), line
        self.process.send_signal(signal.SIGKILL)
        assert self.wait() == -signal.SIGKILL

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

    def finished(self) -> dict[str, Any]:
        """The result of a child that ran to its end."""
        assert self.wait() == 0, "".join(self.errors)[-3000:]
        document = self.document()
        assert "result" in document, document
        result: dict[str, Any] = document["result"]
        return result

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for pump in self.pumps:
            pump.join(timeout=DEADLINE)
        if self.process.stdin is not None:
            self.process.stdin.close()


def killed(url: str, mode: str, *args: str) -> None:
    """Run ``RUN`` in a child until it holds, and kill it there."""
    child = Child(url, RUN, mode, *args)
    try:
        child.killed_when_holding()
    finally:
        child.stop()
    status, problems = asyncio.run(stored_run(url, RUN))
    assert status is RunStatus.INTERRUPTED, status
    assert not problems, problems


async def snapshots(url: str) -> list[tuple[int, str, int]]:
    """``(seq, id, messages in flight)`` of every stored snapshot of ``RUN``."""
    store = SqlStore(url)
    try:
        return [
            (s.seq, s.id, sum(len(c.messages) for c in s.channels))
            for s in await store.list_snapshots(RUN)
        ]
    finally:
        await store.close()


async def runs(url: str, prefix: str) -> list[str]:
    store = SqlStore(url)
    try:
        return await store.find_ids("run", prefix)
    finally:
        await store.close()


def finish(url: str, run_id: str, *args: str) -> dict[str, Any]:
    child = Child(url, run_id, "resume", *args)
    try:
        return child.finished()
    finally:
        child.stop()


def test_a_draft_in_flight_at_the_kill_is_redone_when_rejected(tmp_path: Path) -> None:
    url = database("sqlite", tmp_path)
    killed(url, "in-flight")
    (first, _, _), (_, _, in_flight) = asyncio.run(snapshots(url))
    assert in_flight == 1  # the writer's draft, to the critic

    result = finish(url, RUN, "--strict")
    assert result["accepted"] == [TOPICS[0]]
    first_id = next(i for seq, i, _ in asyncio.run(snapshots(url)) if seq == first)
    assert result["rollbacks"] == [first_id]
    status, problems = asyncio.run(stored_run(url, RUN))
    assert status is RunStatus.SUCCEEDED
    assert not problems, problems


def test_a_slow_resume_under_a_timed_policy_finishes_the_run(tmp_path: Path) -> None:
    url = database("sqlite", tmp_path)
    killed(url, "start", "--hold-after", "3", *TIMED)
    result = finish(url, RUN, *TIMED, *SLOW)
    assert sorted(result["accepted"]) == sorted(TOPICS)
    status, problems = asyncio.run(stored_run(url, RUN))
    assert status is RunStatus.SUCCEEDED
    assert not problems, problems


@pytest.mark.parametrize("backend", BACKENDS)
def test_of_two_slow_resumes_at_once_one_finishes_the_run(backend: str, tmp_path: Path) -> None:
    url = database(backend, tmp_path)
    killed(url, "start", "--hold-after", "3", *TIMED)
    children = [Child(url, RUN, "resume", "--gate", *TIMED, *SLOW) for _ in range(2)]
    try:
        for child in children:
            assert "ready" in child.document()
        for child in children:  # both wait on their stdin: let them resume together
            child.go()
        outcomes = [child.document() for child in children]
        resumed = [c for c, o in zip(children, outcomes, strict=True) if "resumed" in o]
        refused = [o for o in outcomes if "error" in o]
        assert len(resumed) == 1, f"one must resume, one be refused: {outcomes}"
        assert [o["error"] for o in refused] == ["RunOwnedError"], outcomes
        (owner,) = resumed
        (loser,) = [c for c in children if c is not owner]
        assert loser.wait() == EXIT_REFUSED
        owner.go()
        assert sorted(owner.finished()["accepted"]) == sorted(TOPICS)
    finally:
        for child in children:
            child.stop()
    status, problems = asyncio.run(stored_run(url, RUN))
    assert status is RunStatus.SUCCEEDED
    assert not problems, problems


def test_resuming_a_prefix_of_a_killed_run_writes_nothing(tmp_path: Path) -> None:
    url = database("sqlite", tmp_path)
    killed(url, "start", "--hold-after", "3")
    prefix = RUN[:8]
    child = Child(url, prefix, "resume")
    try:
        refusal = child.document()
        assert child.wait() == EXIT_REFUSED
    finally:
        child.stop()
    assert refusal["error"] == "NotFoundError", refusal
    assert RUN in refusal["message"], refusal
    assert asyncio.run(runs(url, prefix)) == [RUN]
    status, _ = asyncio.run(stored_run(url, RUN))
    assert status is RunStatus.INTERRUPTED

    assert sorted(finish(url, RUN)["accepted"]) == sorted(TOPICS)
    assert asyncio.run(stored_run(url, RUN))[0] is RunStatus.SUCCEEDED
