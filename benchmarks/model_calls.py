"""The cost of recording model calls, and what replaying them saves on a resume.

Two comparisons, each on a ``SqlStore`` on a new SQLite file (the runtime's default
durability: WAL, ``synchronous=NORMAL``; the ledger, which records the model calls, shares
the file):

* recording: one agent handles M messages and makes K model calls per message to a fake
  model that answers at once, once calling the model directly (``model.respond(request)``,
  nothing recorded) and once through its context (``ctx.chat(model, ...)``, each request and
  answer written before the handler goes on). Both sides run the same runtime end to end, in
  interleaved rounds (the order flipped every round). Reported as
  ``record_overhead_us`` (the median per-round difference per call, in microseconds),
  ``record_ratio`` (recorded / bare time, median of the per-round ratios, with its spread)
  and ``share_of_100ms_call`` (the overhead against a model call of 100 ms; target < 1%).
* replay: a run whose handlers made 1,000 recorded model calls is re-executed on the same
  timeline, as a resumed run's handlers are: the handlers run again (timed as the bare run of
  the same handlers) and every call finds its recorded answer by its identity and counts the
  replay (timed against the SQLite ledger). Reported as ``replay_1000_s`` against
  ``reask_1000_s``, what asking a model answering in 100 ms again would take: 1,000 x 0.1 s
  plus the bare run's own time (computed, not measured), and their ratio
  ``replay_vs_reask``.

``--json`` prints one JSON object; ``--quick`` runs fewer rounds. Run it from the repository
root with:

    python benchmarks/model_calls.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentsnap import Agent, AgentState, Context, Message, ModelResponse, Runtime
from agentsnap.models import ChatMessage, ModelRequest
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger

REQUEST = (
    ChatMessage(role="system", content="You are a careful assistant. " * 8),
    ChatMessage(role="user", content="Summarise the booking and say what to do next."),
)
ANSWER = ModelResponse(text="The booking is confirmed; nothing else to do.", model="fake")


class InstantModel:
    """A model that answers at once."""

    def __init__(self) -> None:
        self.calls = 0

    async def respond(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        return ANSWER


class Caller(Agent[AgentState]):
    """Makes ``per_message`` model calls per message, recorded or not."""

    def __init__(self, name: str, model: InstantModel, per_message: int, recorded: bool) -> None:
        super().__init__(name)
        self.bare = model  # kept under another name than `model`: not bound by the runtime
        self.per_message = per_message
        self.recorded = recorded

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        request = ModelRequest(messages=REQUEST)
        for _ in range(self.per_message):
            if self.recorded:
                await ctx.chat(self.bare, REQUEST)
            else:
                await self.bare.respond(request)


async def one_run(
    folder: Path, messages: int, per_message: int, recorded: bool, run_id: str | None = None
) -> tuple[float, str]:
    """Seconds to handle ``messages`` messages; the run's id."""
    url = f"sqlite:///{folder / 'agentsnap.db'}"
    store = SqlStore(url)
    ledger = SqlLedger(url)
    model = InstantModel()
    try:
        runtime = Runtime(store=store, ledger=ledger, run_id=run_id)
        async with runtime:
            runtime.add(Caller("caller", model, per_message, recorded))
            runtime.send("caller", {"i": -1})  # the run's rows, the schema: not timed
            await runtime.run_until_idle()
            started = time.perf_counter()
            for i in range(messages):
                runtime.send("caller", {"i": i})
            await runtime.run_until_idle()
            elapsed = time.perf_counter() - started
        return elapsed, runtime.run_id
    finally:
        await ledger.close()
        await store.close()


def spread(values: list[float]) -> list[float]:
    return [round(min(values), 4), round(max(values), 4)]


async def recording(rounds: int, messages: int, per_message: int) -> dict[str, Any]:
    calls = messages * per_message
    bare: list[float] = []
    recorded: list[float] = []
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for side in order:
            with tempfile.TemporaryDirectory() as folder:
                elapsed, _ = await one_run(Path(folder), messages, per_message, side)
            (recorded if side else bare).append(elapsed)
    ratios = [rec / b for rec, b in zip(recorded, bare, strict=True)]
    overheads = [(rec - b) / calls * 1e6 for rec, b in zip(recorded, bare, strict=True)]
    overhead = statistics.median(overheads)
    return {
        "calls_per_round": calls,
        "rounds": rounds,
        "bare_us_per_call": round(statistics.median(bare) / calls * 1e6, 1),
        "recorded_us_per_call": round(statistics.median(recorded) / calls * 1e6, 1),
        "record_overhead_us": round(overhead, 1),
        "record_overhead_us_spread": spread(overheads),
        "record_ratio": round(statistics.median(ratios), 3),
        "record_ratio_spread": spread(ratios),
        "share_of_100ms_call": round(overhead / 100_000, 5),
        "share_target_met": overhead / 100_000 < 0.01,
    }


async def replay(rounds: int) -> dict[str, Any]:
    messages, per_message = 100, 10
    replays: list[float] = []
    bares: list[float] = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as folder:
            bare, _ = await one_run(Path(folder), messages, per_message, recorded=False)
            _, run_id = await one_run(Path(folder), messages, per_message, recorded=True)
            # A resumed run re-executes the handlers (the bare run's time) and finds every
            # answer by its identity on the same timeline, counting the replay.
            url = f"sqlite:///{Path(folder) / 'agentsnap.db'}"
            ledger = SqlLedger(url)
            try:
                started = time.perf_counter()
                for m in range(messages):
                    for position in range(per_message):
                        found = await ledger.find_model_call(
                            run_id, "caller", f"$env>caller#{m + 2}", position, 0
                        )
                        assert found is not None
                        await ledger.replayed_model_call(
                            run_id, "caller", f"$env>caller#{m + 2}", position, 0
                        )
                replays.append(time.perf_counter() - started + bare)
            finally:
                await ledger.close()
            bares.append(bare)
    replay_s = statistics.median(replays)
    reask_s = 1000 * 0.1 + statistics.median(bares)
    return {
        "recorded_calls": messages * per_message,
        "replay_1000_s": round(replay_s, 4),
        "replay_1000_s_spread": spread(replays),
        "reask_1000_s": round(reask_s, 2),
        "replay_vs_reask": round(replay_s / reask_s, 5),
    }


async def measure(quick: bool) -> dict[str, Any]:
    result: dict[str, Any] = {"profile": "quick" if quick else "full", "store": "sqlite NORMAL"}
    result.update(await recording(5 if quick else 11, 100 if quick else 200, 10))
    result.update(await replay(2 if quick else 5))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="fewer, smaller rounds")
    options = parser.parse_args(argv)
    result = asyncio.run(measure(options.quick))
    if options.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
