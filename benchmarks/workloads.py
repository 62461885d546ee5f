"""What the benchmarks share: workloads, the states they hold, and the plumbing around them.

* the ring: ``RING_AGENTS`` agents passing ``RING_TOKENS`` tokens, each token forwarded to the
  next agent until it has made a given number of hops (``bus.py``, ``snapshot_store.py``);
* the pieces of a worker state of about 10 KB of canonical JSON (memory, plan and tool calls;
  ``snapshot_store.py``, ``rollback.py``);
* SQLite files in a benchmark's temporary directory;
* interleaved repetitions and the statistics drawn from them;
* the command line, and the description of the environment every JSON output starts with.

The benchmarks run as ``python benchmarks/X.py``, which puts this folder on ``sys.path``, so
they import this module as ``workloads``.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import platform
import random
import statistics
import string
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from itertools import count
from pathlib import Path
from typing import Any

import agentsnap
from agentsnap import Agent, AgentState, Context, Message, PlanStep, Runtime, ToolCallRecord

RING_AGENTS = 6
RING_TOKENS = 4

Timed = Callable[[], Awaitable[float]]
Sentence = Callable[[random.Random, int], str]


# -- the ring ----------------------------------------------------------------------------------


class RingState(AgentState):
    forwarded: int = 0


class RingNode(Agent[RingState]):
    """Forwards each token to the next node until the token has made ``hops`` hops."""

    def __init__(self, name: str, nxt: str, hops: int, state: RingState | None = None) -> None:
        super().__init__(name, state)
        self.next = nxt
        self.hops = hops

    async def handle(self, message: Message, ctx: Context[RingState]) -> None:
        # State changes on every message, so each snapshot records something new.
        self.state.forwarded += 1
        payload = message.payload
        assert isinstance(payload, dict)
        h = payload["h"]
        assert isinstance(h, int)
        if h < self.hops:
            ctx.send(self.next, {"t": payload["t"], "h": h + 1})


def add_ring(runtime: Runtime, hops: int, state_bytes: int = 0) -> list[RingNode]:
    """Add the ``RING_AGENTS`` nodes of a ring whose tokens make ``hops`` hops; return them.

    With ``state_bytes``, each node starts with a distinct state of at least that many bytes
    of JSON (memory, plan and tool calls, as ``ring_state`` makes it) instead of an empty one.
    """
    names = [f"node-{i}" for i in range(RING_AGENTS)]
    nodes = [
        RingNode(
            name,
            names[(i + 1) % RING_AGENTS],
            hops,
            ring_state(i, state_bytes) if state_bytes else None,
        )
        for i, name in enumerate(names)
    ]
    for node in nodes:
        runtime.add(node)
    return nodes


async def drive_ring(runtime: Runtime, nodes: list[RingNode]) -> float:
    """Seconds from sending the ``RING_TOKENS`` tokens (together, to the first node, so they
    travel as a convoy) until the runtime is idle."""
    first = nodes[0].name
    start = time.perf_counter()
    for token in range(RING_TOKENS):
        runtime.send(first, {"t": token, "h": 1})
    await runtime.run_until_idle()
    return time.perf_counter() - start


def check_ring(nodes: list[RingNode], hops: int) -> None:
    """Check that the ring forwarded every token ``hops`` times."""
    forwarded = sum(node.state.forwarded for node in nodes)
    assert forwarded == RING_TOKENS * hops, (forwarded, RING_TOKENS * hops)


# -- the states --------------------------------------------------------------------------------


def word(rng: random.Random) -> str:
    """A made-up word of 2 to 9 lowercase letters."""
    return "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9)))


def vocabulary(seed: int, size: int = 4096) -> list[str]:
    """``size`` made-up words, the same for the same ``seed``."""
    rng = random.Random(seed)
    return [word(rng) for _ in range(size)]


def plan_and_calls(
    rng: random.Random, sentence: Sentence, key: str
) -> tuple[list[PlanStep], list[ToolCallRecord]]:
    """A plan of 6 steps and 8 tool calls, keyed ``{key}-0`` to ``{key}-7``."""
    plan = [
        PlanStep(description=sentence(rng, 8), status=rng.choice(["done", "pending"]))
        for _ in range(6)
    ]
    calls = [
        ToolCallRecord(
            tool=rng.choice(["search", "fetch", "ledger.post", "email.send"]),
            arguments={"query": sentence(rng, 6), "limit": rng.randint(1, 50)},
            key=f"{key}-{k}",
            result={"hits": rng.randint(0, 9), "summary": sentence(rng, 14)},
        )
        for k in range(8)
    ]
    return plan, calls


def add_notes(
    rng: random.Random,
    sentence: Sentence,
    notes: list[agentsnap.JsonValue],
    facts: dict[str, agentsnap.JsonValue],
    missing: int,
) -> None:
    """Append notes and facts until they add at least ``missing`` bytes of canonical JSON.

    Each note and fact adds at least its own length (plus 12), so nothing is encoded here.
    """
    while missing > 0:
        note = sentence(rng, rng.randint(8, 20))
        notes.append(note)
        facts[f"fact-{len(facts)}"] = rng.randint(0, 1_000_000)
        missing -= len(note) + 12


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(word(rng) for _ in range(words)).capitalize() + "."


def ring_state(index: int, state_bytes: int) -> RingState:
    """A distinct state for ring node ``index``: at least ``state_bytes`` bytes of JSON."""
    rng = random.Random(f"ring/{index}")
    plan, calls = plan_and_calls(rng, _sentence, f"ring-{index}")
    notes: list[agentsnap.JsonValue] = []
    facts: dict[str, agentsnap.JsonValue] = {}
    state = RingState(memory={"notes": notes, "facts": facts}, plan=plan, tool_calls=calls)
    add_notes(rng, _sentence, notes, facts, state_bytes - len(state.model_dump_json()))
    return RingState.model_validate(state.model_dump())


# -- SQLite files --------------------------------------------------------------------------------


_files = count()


def fresh_db(directory: Path, kind: str) -> Path:
    """A path for a new SQLite file in ``directory``, unique in this process."""
    return directory / f"{kind}-{next(_files)}.db"


def remove_db(path: Path) -> None:
    """Remove a SQLite file with its WAL and shared-memory files."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


@contextmanager
def scratch_directory(parent: Path | None) -> Iterator[Path]:
    """A temporary directory for the SQLite files (in ``parent``, or the system's default)."""
    with tempfile.TemporaryDirectory(prefix="agentsnap-bench-", dir=parent) as directory:
        yield Path(directory)


# -- repetitions and statistics ------------------------------------------------------------------


def collected(work: Timed) -> Timed:
    """``work``, with the garbage collected before it starts."""

    async def run() -> float:
        gc.collect()
        return await work()

    return run


async def pairs(
    reference: Timed, subject: Timed, repetitions: int
) -> tuple[list[float], list[float]]:
    """Run both ``repetitions`` times, alternating which goes first; return both timings.

    Nothing is collected here: each side collects garbage itself, after its set-up and before
    its clock starts, or is wrapped in ``collected``.
    """
    ref_times: list[float] = []
    sub_times: list[float] = []
    for rep in range(repetitions):
        if rep % 2 == 0:
            ref_times.append(await reference())
            sub_times.append(await subject())
        else:
            sub_times.append(await subject())
            ref_times.append(await reference())
    return ref_times, sub_times


def median_ratio(ref_times: list[float], sub_times: list[float]) -> float:
    """Median over repetitions of subject rate / reference rate (runs side by side)."""
    return statistics.median(r / s for r, s in zip(ref_times, sub_times, strict=True))


def rate(n: int, seconds: list[float]) -> float:
    """Median of ``n`` per second over the runs, rounded."""
    return round(statistics.median(n / s for s in seconds), 1)


def rates(n: int, seconds: list[float]) -> list[float]:
    """``n`` per second of each run, rounded."""
    return [round(n / s, 1) for s in seconds]


def ms(seconds: list[float]) -> float:
    """Median of the runs, in milliseconds."""
    return round(statistics.median(seconds) * 1000, 3)


def samples_ms(seconds: list[float]) -> list[float]:
    """Each run, in milliseconds."""
    return [round(s * 1000, 3) for s in seconds]


def met(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


# -- command line and output ---------------------------------------------------------------------


def argument_parser(
    doc: str | None, quick: str, *, directory: bool = False
) -> argparse.ArgumentParser:
    """The options every benchmark takes, described by its docstring's first paragraph;
    ``quick`` says what ``--quick`` does, ``directory`` adds ``--dir``."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--quick", action="store_true", help=quick)
    if directory:
        parser.add_argument(
            "--dir",
            type=Path,
            default=None,
            help="where the SQLite files go (a temporary directory)",
        )
    return parser


def report(results: dict[str, Any], as_json: bool, table: Callable[[dict[str, Any]], str]) -> None:
    """Print the results as one JSON object, or as the benchmark's table."""
    print(json.dumps(results) if as_json else table(results))


def _library_version(library: str) -> str:
    if library == "sqlite":
        import sqlite3

        return sqlite3.sqlite_version
    if library == "pydantic":
        import pydantic

        return pydantic.VERSION
    version: str = importlib.import_module(library).__version__
    return version


def environment(benchmark: str, profile: str, *libraries: str) -> dict[str, Any]:
    """The first keys of a benchmark's JSON output: what ran, where, and on what.

    Each of ``libraries`` (``"sqlite"``, ``"pydantic"``, or an importable module with a
    ``__version__``) adds ``<library>_version``, between agentsnap's version and the platform.
    """
    info: dict[str, Any] = {
        "benchmark": benchmark,
        "profile": profile,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "agentsnap_version": agentsnap.__version__,
    }
    for library in libraries:
        info[f"{library}_version"] = _library_version(library)
    info["platform"] = platform.platform()
    info["cpu_count"] = os.cpu_count()
    return info
