"""Cost of checkpointing a LangGraph agent loop in agentsnap's database, against SqliteSaver.

One graph, run three ways in the same process (and two more for context, below): without
a checkpointer, with LangGraph's own ``SqliteSaver`` (package ``langgraph-checkpoint-sqlite``,
on ``sqlite3.connect(path, check_same_thread=False)``, as its documentation sets it up) and
with ``AgentsnapSaver`` on an SQLite file (``sqlite:///path``, schema created before the
clock starts). Each checkpointed run starts from a fresh file.

The graph is an agent loop: a ``StateGraph`` with one node, ``agent``, that routes back to
itself for 1000 super-steps (200 with ``--quick``; ``recursion_limit`` is raised to match).
Its state is about 10 KB, as an agent's usually is: a long context that hardly ever changes
and small fields that change on every step.

* ``context``: a conversation of 24 messages (``{"role", "content"}`` dicts, about 10 KB of
  JSON), written once by the input and never again (as is ``steps``, the loop's length);
* ``step``: a counter the node increments on every super-step;
* ``note``: a short note (a dozen words) the node replaces on every super-step.

So every super-step writes two small channels (plus LangGraph's routing channel) and leaves
the large one alone: a saver that stores a checkpoint's values in full pays for the context
on every step, one that stores a value once per version pays for it once. The graph runs
with ``graph.invoke(..., durability="sync")``, so that each checkpoint is written before the
next step starts and its whole cost is on the clock (LangGraph's default, ``"async"``, writes
it from a background thread while the next step runs, hiding part of it behind the node).

Rounds: each round runs every variant once, in an order that rotates from round to
round, after a warm-up round that is not timed. Garbage is collected before each run.
Reported times are medians over the rounds of the time of ``invoke`` divided by the number
of super-steps (``ms_per_step_*``);
``overhead_ratio = (agentsnap - none) / (sqlitesaver - none)`` is the median of the
per-round ratios, so both sides of a ratio ran seconds apart on the same (shared, noisy)
machine. Database sizes (``db_bytes_*``) are the size of the SQLite file after the run, once
its savers are closed and its WAL has been checkpointed into it
(``PRAGMA wal_checkpoint(TRUNCATE)`` from a new connection), plus whatever remains of the
``-wal`` file (nothing, normally); the same for both files. agentsnap's file also holds the
(empty) tables of agentsnap's other features: ``db_bytes_agentsnap_empty`` is its size with
the schema and no checkpoint. After each run both savers must give back the final state and
hold one checkpoint per super-step (plus the input's); otherwise the program stops with an
error (status 1).

Both savers run with their defaults: ``SqliteSaver`` leaves SQLite's ``synchronous=FULL``
(an fsync of the WAL on every commit), ``AgentsnapSaver`` sets ``synchronous=NORMAL`` (WAL
mode: an application crash loses nothing, a power loss may lose the last commits). The
temporary directory's file system (``--dir`` chooses where) decides what an fsync costs, so
two more variants run in every round, for context only:

* ``sqlitesaver_normal``: ``SqliteSaver`` on a connection set to ``synchronous=NORMAL``, the
  durability ``AgentsnapSaver`` has (``overhead_ratio_vs_sqlitesaver_normal``);
* ``nullsaver``: a checkpointer that stores nothing, i.e. what LangGraph itself spends on
  checkpointing (copies, versions, handing each save to a worker thread), which no saver can
  save: ``overhead_floor_ratio = (nullsaver - none) / (sqlitesaver - none)``.

Targets: ``overhead_ratio <= 0.5`` and ``db_bytes_agentsnap <= db_bytes_sqlitesaver / 2``.
``--json`` prints a single JSON object on stdout; ``--quick`` runs fewer steps and rounds
(well under 30 s). Run it from the repository root with:

    python benchmarks/langgraph_saver.py
"""

from __future__ import annotations

import gc
import random
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Final, TypedDict

import orjson
import workloads
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

from agentsnap.integrations.langgraph import AgentsnapSaver

TARGET_OVERHEAD_RATIO = 0.5
TARGET_BYTES_RATIO = 0.5

CONTEXT_MESSAGES = 24
CONTEXT_BYTES = 10_000  # the context is at least this long as JSON
NOTE_WORDS = 12
SEED = 20_261_122
DURABILITY: Final = "sync"  # LangGraph's default is "async": see the docstring

PROFILES = {"full": (1000, 5), "quick": (200, 2)}  # super-steps, timed rounds
VARIANTS = ("none", "nullsaver", "sqlitesaver", "sqlitesaver_normal", "agentsnap")


class LoopState(TypedDict):
    context: list[dict[str, str]]
    step: int
    note: str
    steps: int


def make_context(seed: int) -> list[dict[str, str]]:
    """A conversation of ``CONTEXT_MESSAGES`` messages, at least ``CONTEXT_BYTES`` as JSON."""
    rng = random.Random(seed)
    words = workloads.vocabulary(seed)
    per_message = CONTEXT_BYTES // CONTEXT_MESSAGES
    context: list[dict[str, str]] = []
    for k in range(CONTEXT_MESSAGES):
        role = "system" if k == 0 else ("user" if k % 2 else "assistant")
        content = ""
        while len(content) < per_message:
            content += " ".join(rng.choices(words, k=8)) + ". "
        context.append({"role": role, "content": content.strip()})
    return context


def build_graph() -> StateGraph[LoopState]:
    words = workloads.vocabulary(SEED + 1)

    def agent(state: LoopState) -> dict[str, Any]:
        step = state["step"] + 1
        # A short note that differs from step to step (a deterministic pick of words).
        note = " ".join(words[(step * 7919 + i * 104_729) % len(words)] for i in range(NOTE_WORDS))
        return {"step": step, "note": f"step {step}: {note}"}

    def route(state: LoopState) -> str:
        return "agent" if state["step"] < state["steps"] else END

    builder = StateGraph(LoopState)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["agent", END])
    return builder


class NullSaver(BaseCheckpointSaver[str]):
    """A checkpointer that keeps nothing: what LangGraph itself spends on checkpointing."""

    def get_tuple(self, config: Any) -> None:
        return None

    def list(self, config: Any, **kwargs: Any) -> Iterator[Any]:
        return iter(())

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        return {"configurable": {**config["configurable"], "checkpoint_id": checkpoint["id"]}}

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        return None

    def get_next_version(self, current: Any, channel: None) -> str:
        number = 0 if current is None else int(str(current).split(".")[0])
        return f"{number + 1:032}"


@dataclass
class Run:
    seconds: float
    db_bytes: int | None
    final: dict[str, Any]


def db_bytes(path: Path) -> int:
    """The file's size once its WAL is checkpointed into it (plus any WAL left)."""
    with closing(sqlite3.connect(path)) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    wal = Path(f"{path}-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def check(saver: BaseCheckpointSaver[Any], config: Any, steps: int, final: dict[str, Any]) -> None:
    """The saver gives back the final state and holds a checkpoint per super-step."""
    saved = saver.get_tuple(config)
    assert saved is not None, "no checkpoint saved"
    values = saved.checkpoint["channel_values"]
    assert values["step"] == final["step"] == steps, (values["step"], final["step"], steps)
    assert values["note"] == final["note"]
    assert values["context"] == final["context"]
    count = sum(1 for _ in saver.list(config))
    assert count == steps + 2, (count, steps + 2)  # the input, each step, and the start


def run_variant(
    variant: str, builder: StateGraph[LoopState], inputs: LoopState, directory: Path
) -> Run:
    steps = inputs["steps"]
    config: Any = {"configurable": {"thread_id": "loop"}, "recursion_limit": steps + 10}
    saver: BaseCheckpointSaver[Any] | None = None
    path: Path | None = None
    connection: sqlite3.Connection | None = None
    if variant == "nullsaver":
        saver = NullSaver()
    elif variant.startswith("sqlitesaver"):
        path = workloads.fresh_db(directory, variant)
        connection = sqlite3.connect(path, check_same_thread=False)
        if variant == "sqlitesaver_normal":
            connection.execute("PRAGMA synchronous=NORMAL")
        sqlite_saver = SqliteSaver(connection)
        sqlite_saver.setup()
        saver = sqlite_saver
    elif variant == "agentsnap":
        path = workloads.fresh_db(directory, "agentsnap")
        agentsnap_saver = AgentsnapSaver(f"sqlite:///{path}")
        agentsnap_saver.get_tuple(config)  # creates the schema, off the clock
        saver = agentsnap_saver
    graph = builder.compile(checkpointer=saver)
    invoke: Callable[[], dict[str, Any]]
    if saver is None:

        def invoke() -> dict[str, Any]:
            return graph.invoke(inputs, config)

    else:

        def invoke() -> dict[str, Any]:
            return graph.invoke(inputs, config, durability=DURABILITY)

    gc.collect()
    began = time.perf_counter()
    final = invoke()
    seconds = time.perf_counter() - began
    assert final["step"] == steps, (final["step"], steps)
    size = None
    try:
        if saver is not None and path is not None:
            check(saver, config, steps, final)
    finally:
        if isinstance(saver, AgentsnapSaver):
            saver.close()
        if connection is not None:
            connection.close()
    if path is not None:
        size = db_bytes(path)
        workloads.remove_db(path)
    return Run(seconds, size, final)


def empty_agentsnap_bytes(directory: Path) -> int:
    path = workloads.fresh_db(directory, "empty")
    saver = AgentsnapSaver(f"sqlite:///{path}")
    try:
        saver.get_tuple({"configurable": {"thread_id": "none"}})
    finally:
        saver.close()
    size = db_bytes(path)
    workloads.remove_db(path)
    return size


def measure(profile: str, directory: Path) -> dict[str, Any]:
    began = time.perf_counter()
    steps, rounds = PROFILES[profile]
    context = make_context(SEED)
    inputs: LoopState = {"context": context, "step": 0, "note": "", "steps": steps}
    builder = build_graph()
    state_bytes = len(orjson.dumps(inputs))

    # Warm-up (imports, code paths, page cache), not timed.
    for variant in VARIANTS:
        run_variant(variant, builder, {**inputs, "steps": min(steps, 50)}, directory)

    runs: dict[str, list[Run]] = {variant: [] for variant in VARIANTS}
    for index in range(rounds):
        shift = index % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            runs[variant].append(run_variant(variant, builder, inputs, directory))

    def per_step(variant: str) -> list[float]:
        return [run.seconds / steps for run in runs[variant]]

    none_s, theirs_s, ours_s = per_step("none"), per_step("sqlitesaver"), per_step("agentsnap")
    null_s, normal_s = per_step("nullsaver"), per_step("sqlitesaver_normal")

    def ratios_of(subject: list[float], reference: list[float]) -> list[float]:
        return [
            (sub - none) / (ref - none)
            for none, ref, sub in zip(none_s, reference, subject, strict=True)
        ]

    ratios = ratios_of(ours_s, theirs_s)
    overhead_ratio = statistics.median(ratios)
    floor_ratios = ratios_of(null_s, theirs_s)
    normal_ratios = ratios_of(ours_s, normal_s)
    theirs_bytes = [run.db_bytes or 0 for run in runs["sqlitesaver"]]
    normal_bytes = [run.db_bytes or 0 for run in runs["sqlitesaver_normal"]]
    ours_bytes = [run.db_bytes or 0 for run in runs["agentsnap"]]
    bytes_ratio = statistics.median(ours_bytes) / statistics.median(theirs_bytes)

    return {
        **workloads.environment("AgentsnapSaver vs SqliteSaver", profile, "sqlite", "sqlalchemy"),
        **{
            f"{name.replace('-', '_')}_version": metadata.version(name)
            for name in ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite")
        },
        "db_dir": str(directory),
        "statistic": "median of rounds; overhead_ratio is the median of per-round ratios",
        "rounds": rounds,
        "steps": steps,
        "durability": DURABILITY,
        "state_bytes": state_bytes,
        "context_messages": CONTEXT_MESSAGES,
        "ms_per_step_none": workloads.ms(none_s),
        "ms_per_step_sqlitesaver": workloads.ms(theirs_s),
        "ms_per_step_agentsnap": workloads.ms(ours_s),
        "overhead_ratio": round(overhead_ratio, 4),
        "ms_per_step_nullsaver": workloads.ms(null_s),
        "overhead_floor_ratio": round(statistics.median(floor_ratios), 4),
        "ms_per_step_sqlitesaver_normal": workloads.ms(normal_s),
        "overhead_ratio_vs_sqlitesaver_normal": round(statistics.median(normal_ratios), 4),
        "db_bytes_sqlitesaver": round(statistics.median(theirs_bytes)),
        "db_bytes_agentsnap": round(statistics.median(ours_bytes)),
        "db_bytes_agentsnap_empty": empty_agentsnap_bytes(directory),
        "db_bytes_sqlitesaver_normal": round(statistics.median(normal_bytes)),
        "db_bytes_ratio": round(bytes_ratio, 4),
        "samples": {
            "ms_per_step_none": workloads.samples_ms(none_s),
            "ms_per_step_sqlitesaver": workloads.samples_ms(theirs_s),
            "ms_per_step_agentsnap": workloads.samples_ms(ours_s),
            "ms_per_step_nullsaver": workloads.samples_ms(null_s),
            "ms_per_step_sqlitesaver_normal": workloads.samples_ms(normal_s),
            "overhead_ratio": [round(r, 4) for r in ratios],
            "db_bytes_sqlitesaver": theirs_bytes,
            "db_bytes_agentsnap": ours_bytes,
        },
        "targets": {
            "overhead_ratio_max": TARGET_OVERHEAD_RATIO,
            "overhead_ratio_met": overhead_ratio <= TARGET_OVERHEAD_RATIO,
            "db_bytes_ratio_max": TARGET_BYTES_RATIO,
            "db_bytes_ratio_met": bytes_ratio <= TARGET_BYTES_RATIO,
        },
        "elapsed_s": round(time.perf_counter() - began, 2),
    }


def _table(r: dict[str, Any]) -> str:
    t = r["targets"]
    met = workloads.met
    none = r["ms_per_step_none"]
    lines = [
        f"agentsnap {r['agentsnap_version']} LangGraph saver benchmark, "
        f"{r['python_implementation']} {r['python']}, SQLite {r['sqlite_version']}, "
        f"LangGraph {r['langgraph_version']}, {r['cpu_count']} CPUs, profile {r['profile']}",
        f"median of {r['rounds']} rounds (variants in rotating order); one graph, "
        f"{r['steps']:,} super-steps, state {r['state_bytes']:,} bytes of JSON, "
        f"durability={r['durability']}",
        "",
        f"{'checkpointer':<26}{'ms/step':>10}{'overhead ms':>13}{'db bytes':>14}",
        f"{'none':<26}{none:>10.3f}{'':>13}{'':>14}",
        f"{'null (stores nothing)':<26}{r['ms_per_step_nullsaver']:>10.3f}"
        f"{r['ms_per_step_nullsaver'] - none:>13.3f}{'':>14}",
        f"{'SqliteSaver':<26}{r['ms_per_step_sqlitesaver']:>10.3f}"
        f"{r['ms_per_step_sqlitesaver'] - none:>13.3f}{r['db_bytes_sqlitesaver']:>14,}",
        f"{'SqliteSaver, sync=NORMAL':<26}{r['ms_per_step_sqlitesaver_normal']:>10.3f}"
        f"{r['ms_per_step_sqlitesaver_normal'] - none:>13.3f}"
        f"{r['db_bytes_sqlitesaver_normal']:>14,}",
        f"{'AgentsnapSaver':<26}{r['ms_per_step_agentsnap']:>10.3f}"
        f"{r['ms_per_step_agentsnap'] - none:>13.3f}{r['db_bytes_agentsnap']:>14,}",
        f"{'  (empty schema)':<26}{'':>10}{'':>13}{r['db_bytes_agentsnap_empty']:>14,}",
        "",
        f"overhead_ratio = {r['overhead_ratio']:.3f}  target <= {t['overhead_ratio_max']}: "
        f"{met(t['overhead_ratio_met'])}  (per round: {r['samples']['overhead_ratio']})",
        f"overhead_floor_ratio (null vs SqliteSaver) = {r['overhead_floor_ratio']:.3f}; "
        "overhead_ratio_vs_sqlitesaver_normal = "
        f"{r['overhead_ratio_vs_sqlitesaver_normal']:.3f}",
        f"db_bytes_ratio = {r['db_bytes_ratio']:.3f}  target <= {t['db_bytes_ratio_max']}: "
        f"{met(t['db_bytes_ratio_met'])}",
        f"total {r['elapsed_s']} s",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = workloads.argument_parser(
        __doc__, "200 super-steps and 2 rounds (< 30 s)", directory=True
    )
    args = parser.parse_args(argv)
    with workloads.scratch_directory(args.dir) as directory:
        results = measure("quick" if args.quick else "full", directory)
    workloads.report(results, args.json, _table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
