"""A research team that notices a bad draft and goes back to fix it.

Four agents (planner, researcher, writer, critic) write a short report with a scripted model;
the critic rejects the first draft for citing no sources, every agent rolls back to the
researcher's snapshot, the writer gets the reason as feedback, and the second draft passes.
Each agent asks the model it keeps (``self.model.complete(...)``), so every call is recorded:
the writer's redo asks the model again, on the run's new timeline. The workflow itself is
``agentsnap.demo`` (read it: it is short); this program runs it, in memory or against the
database given with ``--db``, and prints the story, like ``agentsnap demo`` does, with the
model calls that were recorded.

Run it with:

    python examples/research_team.py
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid

from agentsnap import MemoryStore
from agentsnap.demo import DemoResult, describe, run_demo
from agentsnap.runtime import interrupted_message
from agentsnap.store.sql import SqlStore


async def run(url: str | None, run_id: str | None = None) -> DemoResult:
    store = SqlStore(url) if url else MemoryStore()
    try:
        return await run_demo(store, run_id=run_id)
    finally:
        await store.close()


def interrupted(run_id: str, db: str | None) -> int:
    """Ctrl-C: say in one line what became of the run, and exit with 130, like a shell."""
    print(interrupted_message(run_id, db), file=sys.stderr)
    return 130


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", help="keep the run in this database (sqlite:/// or postgresql://)")
    args = parser.parse_args(argv)
    run_id = uuid.uuid4().hex
    try:
        result = asyncio.run(run(args.db, run_id))
    except KeyboardInterrupt:
        return interrupted(run_id, args.db)
    print("\n".join(describe(result, args.db)))
    if result.model_calls:
        redone = sum(call.timeline > 0 for call in result.model_calls)
        print(f"{len(result.model_calls)} model calls recorded, {redone} after the rollback")
    ok = bool(result.rollbacks) and result.report is not None
    print("the team recovered from the rejected draft" if ok else "the run did not recover")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
