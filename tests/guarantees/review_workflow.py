"""A writer and a critic, which ``test_resume_crashes.py`` kills and resumes.

The environment gives the critic its rubric, then the writer a few topics. The writer sends
a draft of each topic to the critic, marked revised once the writer was told why an earlier
draft was rejected. A strict critic rejects every draft that is not revised; a lenient one
accepts every draft. The result does not depend on the interleaving: every topic accepted
once, in the critic's final state.

Usage::

    python tests/guarantees/review_workflow.py URL RUN_ID start [--hold-after K] [...]
    python tests/guarantees/review_workflow.py URL RUN_ID in-flight
    python tests/guarantees/review_workflow.py URL RUN_ID resume [--strict] [--gate] [...]

``URL`` is the agentsnap database (SQLite or PostgreSQL). ``start`` runs the team under the
default scheduler with a lenient critic, which prints ``HOLDING`` once it accepted K drafts
and waits to be killed. ``in-flight`` builds, under a ``ScriptedScheduler``, a stored cut in
which the writer's draft is in flight to the critic (the lenient critic takes it after it
recorded), prints ``HOLDING`` and waits to be killed. ``resume`` resumes the run and runs it
to its end; it prints one JSON line, ``{"result": ...}``, or ``{"error": ...}`` when
``resume()`` raised (then exits with status 3). With ``--gate`` it prints ``ready`` and
waits for a ``go`` line before resuming, and for another once it resumed, before running.
``--every-seconds`` sets a timed snapshot policy, and ``--slow-store`` makes every call of
the store that reads or takes the run, or its lease, take that many seconds more.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import Field

from agentsnap import (
    Agent,
    AgentState,
    Context,
    Message,
    RunInfo,
    RunLease,
    Runtime,
    SnapshotPolicy,
)
from agentsnap.store.sql import SqlStore
from agentsnap.testing import ScriptedScheduler

TOPICS = tuple(f"topic-{i}" for i in range(8))
EXIT_REFUSED = 3


class SlowStore(SqlStore):
    """An SqlStore whose look-ups of a run and of its lease take ``delay`` seconds more."""

    def __init__(self, url: str, delay: float) -> None:
        super().__init__(url)
        self.delay = delay

    async def get_run(self, run_id: str) -> RunInfo:
        await asyncio.sleep(self.delay)
        return await super().get_run(run_id)

    async def get_lease(self, run_id: str) -> RunLease | None:
        await asyncio.sleep(self.delay)
        return await super().get_lease(run_id)

    async def take_lease(
        self, run_id: str, owner: str, expires_at: datetime, *, replacing: int | None
    ) -> RunLease | None:
        await asyncio.sleep(self.delay)
        return await super().take_lease(run_id, owner, expires_at, replacing=replacing)


class WriterState(AgentState):
    drafts: int = 0


class Writer(Agent[WriterState]):
    """Drafts each topic it is given; a draft is revised once the writer had feedback."""

    async def handle(self, message: Message, ctx: Context[WriterState]) -> None:
        self.state.drafts += 1
        draft: dict[str, str | bool] = {
            "topic": message.payload_as(str),
            "revised": bool(ctx.feedback),
        }
        ctx.send("critic", draft, kind="draft")
        await asyncio.sleep(0.001)


class CriticState(AgentState):
    rubric: str = ""
    accepted: list[str] = Field(default_factory=list)


class Critic(Agent[CriticState]):
    """Accepts drafts (only revised ones when strict)."""

    def __init__(self, strict: bool, hold_after: int | None) -> None:
        super().__init__("critic")
        self.strict = strict
        self.hold_after = hold_after

    async def handle(self, message: Message, ctx: Context[CriticState]) -> None:
        if message.kind == "rubric":
            self.state.rubric = message.payload_as(str)
            return
        draft = message.payload_as(dict[str, Any])
        if self.strict and not draft["revised"]:
            ctx.reject("writer", f"the draft of {draft['topic']} needs a revision")
        self.state.accepted.append(str(draft["topic"]))
        if self.hold_after is not None and len(self.state.accepted) >= self.hold_after:
            print("HOLDING", flush=True)
            await asyncio.Event().wait()


def emit(document: Mapping[str, Any]) -> None:
    print(json.dumps(document, sort_keys=True), flush=True)


async def hold() -> None:
    print("HOLDING", flush=True)
    await asyncio.Event().wait()


async def in_flight(runtime: Runtime, scheduler: ScriptedScheduler) -> None:
    """Store a cut with the writer's draft in flight to the critic, then wait to be killed."""
    runtime.send("critic", "be brief", kind="rubric")  # the run's first snapshot is before it
    runtime.send("writer", TOPICS[0], kind="topic")
    await scheduler.deliver("$env", "critic")
    await scheduler.deliver("$env", "writer")  # the writer sends its draft
    snapshot = runtime.snapshot()
    await scheduler.deliver("$env", "critic")  # the marker: the critic records first
    await scheduler.deliver("$env", "writer")  # then the writer, with its draft sent
    await scheduler.deliver("writer", "critic")  # the draft, taken after the critic recorded
    await scheduler.deliver("writer", "critic")  # the marker behind it
    await snapshot
    await runtime.run_until_idle()  # the snapshot and the replay log are written
    await hold()


async def main(options: argparse.Namespace) -> int:
    store = (
        SlowStore(options.url, options.slow_store) if options.slow_store else SqlStore(options.url)
    )
    scheduler = ScriptedScheduler() if options.mode == "in-flight" else None
    # No snapshot as the in-flight run goes idle: the cut with the draft in flight stays
    # the newest.
    policy = SnapshotPolicy(every_seconds=options.every_seconds, at_end=options.mode != "in-flight")
    try:
        async with Runtime(
            store=store, run_id=options.run_id, scheduler=scheduler, snapshot_policy=policy
        ) as runtime:
            runtime.add(Writer("writer"))
            runtime.add(Critic(options.strict, options.hold_after))
            if options.mode == "in-flight":
                assert scheduler is not None
                await in_flight(runtime, scheduler)
            elif options.mode == "start":
                runtime.send("critic", "be brief", kind="rubric")
                for topic in TOPICS:
                    runtime.send("writer", topic, kind="topic")
            else:
                if options.gate:
                    emit({"ready": True})
                    await asyncio.to_thread(sys.stdin.readline)
                try:
                    snapshot = await runtime.resume(wait=0)
                except Exception as exc:
                    emit(
                        {
                            "error": type(exc).__name__,
                            "message": str(exc),
                            "owner": getattr(exc, "owner", None),
                        }
                    )
                    return EXIT_REFUSED
                if options.gate:
                    emit({"resumed": snapshot.seq})
                    await asyncio.to_thread(sys.stdin.readline)
            await runtime.run_until_idle()
            critic = runtime.agents["critic"].state
            assert isinstance(critic, CriticState)
            result = {
                "accepted": critic.accepted,
                "rollbacks": [r.snapshot_id for r in runtime.rollbacks],
            }
    finally:
        await store.close()
    emit({"result": result})
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the agentsnap database URL")
    parser.add_argument("run_id")
    parser.add_argument("mode", choices=["start", "in-flight", "resume"])
    parser.add_argument("--strict", action="store_true", help="reject drafts not revised")
    parser.add_argument("--hold-after", type=int, default=None, help="hold after K drafts")
    parser.add_argument("--gate", action="store_true", help="wait for 'go' lines (see above)")
    parser.add_argument("--every-seconds", type=float, default=None, help="timed snapshots")
    parser.add_argument("--slow-store", type=float, default=0.0, help="seconds per look-up")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse(sys.argv[1:]))))
