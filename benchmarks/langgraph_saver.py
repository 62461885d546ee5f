"""Cost of checkpointing a LangGraph agent loop with AgentsnapSaver, against LangGraph's savers.

Two graphs, each run in the same process without a checkpointer, with LangGraph's own
``SqliteSaver`` (package ``langgraph-checkpoint-sqlite``) and with ``AgentsnapSaver`` on an
SQLite file (``sqlite:///path``, schema created before the clock starts), and, with
``--postgres URL``, with LangGraph's ``PostgresSaver`` and ``AsyncPostgresSaver`` (package
``langgraph-checkpoint-postgres``) and ``AgentsnapSaver`` on that PostgreSQL database, sync
(``graph.invoke``) and async (``graph.ainvoke``). Each checkpointed run starts from empty
tables (a fresh SQLite file; on PostgreSQL, both savers' tables truncated, then vacuumed and
analyzed).

Both graphs are an agent loop: a ``StateGraph`` with one node, ``agent``, that routes back to
itself for 1000 super-steps (100 with ``--quick``; ``recursion_limit`` is raised to match).
Its state is about 10 KB, as an agent's usually is:

* ``context``: a conversation of 24 messages (``{"role", "content"}`` dicts, about 10 KB of
  JSON);
* ``step``: a counter the node increments on every super-step;
* ``note``: a short note (a dozen words) the node replaces on every super-step;
* ``steps``: the loop's length, written once by the input.

In the ``static`` graph the context is written once, by the input, and never again; in the
``changing`` graph the node also replaces the context's last message on every super-step,
so the 10 KB value is new at every step. A saver that stores each channel once per version
pays for the context once in the first and at every step in the second. The graphs run
with ``durability="sync"``, so that each checkpoint is written before the next step starts
and its whole cost is on the clock (LangGraph's default, ``"async"``, writes it from a
background thread while the next step runs, hiding part of it behind the node).

Equal durability: on SQLite both savers run in WAL mode with ``synchronous=NORMAL`` (what
``AgentsnapSaver`` sets; an application crash loses nothing, a power loss may lose the last
commits). ``SqliteSaver``'s ``setup()`` turns WAL on; its connection
(``sqlite3.connect(path, check_same_thread=False)``, as its documentation sets it up) is set
to ``synchronous=NORMAL`` before. Both are checked on every run: on ``SqliteSaver``'s
connection before it, on the connection ``AgentsnapSaver``'s writes went through after it
(the program stops with an error otherwise). On PostgreSQL both commit each write as the server is
configured (``synchronous_commit`` unchanged). The official PostgreSQL savers run on one
connection in autocommit mode with ``dict_row``, as their documentation sets them up.

Rounds: each round runs every variant of both graphs once, and the graph without a
checkpointer twice (at two places in the round's order), in an order that rotates from round
to round, after a warm-up round of 10 super-steps that is not timed. Garbage is collected
before each run.
Reported times are medians over the rounds of the time of ``invoke`` divided by the number
of super-steps (``ms_per_step``), and of the process's CPU time over the same span (all its
threads: ``cpu_ms_per_step``), which the other programs sharing the machine disturb less.
A ratio compares the checkpointing overhead of two savers on one graph,
``(agentsnap - none) / (official - none)``, per round (both sides ran seconds apart on the
same, shared and noisy, machine), with ``none`` the mean of the round's two runs without a
checkpointer. A round whose two baseline runs differ by as much as either saver's
overhead is rejected: its baseline is noisier than the quantity measured, so the noise would
decide its ratio. The figure is the median of the ratios of the rounds kept, with their min
and max, how many rounds were kept and rejected, and, for every round, its ratio and its
baseline's spread over the smaller overhead (``baseline_noise``; above 1 is rejected). When
every round is rejected the figures are those of all rounds, flagged ``all_rejected``:

* ``overhead_ratio_same_durability_changing`` and ``…_static``: against ``SqliteSaver``
  (and the same ratio of CPU times, ``cpu_overhead_ratio_same_durability_*``, a cross-check
  without a target: the waits of the savers' threads are on the clock, not on the CPU);
* with ``--postgres``: ``overhead_ratio_vs_postgres`` (against ``PostgresSaver``, sync) and
  ``overhead_ratio_vs_async_postgres`` (against ``AsyncPostgresSaver``, async, measured
  from ``ainvoke`` without a checkpointer), the higher of the two graphs' figures, each
  graph's under ``…_changing`` and ``…_static``.

Targets: each of those ratios ``<= 1.0``. Database sizes (``db_bytes_*``, SQLite) are the
size of the file after the run, once its savers are closed and its WAL has been checkpointed
into it; agentsnap's file also holds the (empty) tables of agentsnap's other features. For
context, a checkpointer that stores nothing (``nullsaver``) runs too: what LangGraph itself
spends on checkpointing, which no saver can save. After each run every saver must give back
the final state and hold one checkpoint per super-step (plus the input's); otherwise the
program stops with an error (status 1).

What each saver writes per super-step is measured once, off the clock, after the timed
rounds (``storage_per_step``): on SQLite, ``wal_pages_per_step`` (the pages its commits write
to the WAL, counted as WAL frames while a reader's open snapshot keeps the WAL from being
reset) and ``bytes_per_step`` (the growth of the database file once checkpointed); on
PostgreSQL, ``commits_per_step`` and ``rows_written_per_step`` (``pg_stat_database``'s
committed transactions and inserted or updated rows in the benchmark's database, read once
the saver's connections are closed) and ``bytes_per_step`` (the growth of the saver's tables
with their indexes and TOAST).

``--json`` prints a single JSON object on stdout; ``--quick`` runs fewer steps and rounds.
Run it from the repository root with:

    python benchmarks/langgraph_saver.py [--postgres postgresql://user@host/db]

The PostgreSQL database is the benchmark's: the official savers' tables (``checkpoints``,
``checkpoint_blobs``, ``checkpoint_writes``, ``checkpoint_migrations``) and agentsnap's are
created in it and emptied before each run; agentsnap's are dropped and created anew by the
agentsnap that runs, so that two revisions compared on one database each have their schema.
"""

from __future__ import annotations

import asyncio
import gc
import random
import shutil
import sqlite3
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
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

TARGET_RATIO = 1.0

CONTEXT_MESSAGES = 24
CONTEXT_BYTES = 10_000  # the context is at least this long as JSON
NOTE_WORDS = 12
SEED = 20_261_122
DURABILITY: Final = "sync"  # LangGraph's default is "async": see the docstring

PROFILES = {"full": (1000, 7), "quick": (100, 9)}  # super-steps, timed rounds
WARM_UP_STEPS = 10
GRAPHS = ("changing", "static")
# "none#2" and "anone#2" run the graph without a checkpointer a second time in each round.
SQLITE_VARIANTS = ("none", "nullsaver", "sqlitesaver", "none#2", "agentsnap")
POSTGRES_VARIANTS = (
    "anone",
    "postgressaver",
    "agentsnap_pg",
    "anone#2",
    "apostgressaver",
    "aagentsnap_pg",
)
ASYNC_VARIANTS = {"anone", "apostgressaver", "aagentsnap_pg"}
OFFICIAL_PG_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")
AGENTSNAP_PG_TABLES = ("agentsnap_lg_checkpoints", "agentsnap_lg_blobs", "agentsnap_lg_task_writes")


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


def build_graph(changing: bool) -> StateGraph[LoopState]:
    words = workloads.vocabulary(SEED + 1)

    def agent(state: LoopState) -> dict[str, Any]:
        step = state["step"] + 1
        # A short note that differs from step to step (a deterministic pick of words).
        note = " ".join(words[(step * 7919 + i * 104_729) % len(words)] for i in range(NOTE_WORDS))
        update: dict[str, Any] = {"step": step, "note": f"step {step}: {note}"}
        if changing:
            # A new last message (as long as the one it replaces): a new 10 KB value.
            context = state["context"]
            last = context[-1]["content"]
            update["context"] = [
                *context[:-1],
                {"role": "assistant", "content": f"{step:06} {last[7:]}"},
            ]
        return update

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
    cpu_seconds: float
    """The process's CPU time (all its threads) over the same span as ``seconds``."""
    db_bytes: int | None


def db_bytes(path: Path) -> int:
    """The file's size once its WAL is checkpointed into it (plus any WAL left)."""
    with closing(sqlite3.connect(path)) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    wal = Path(f"{path}-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def check_saved(tuple_: Any, count: int, steps: int, final: dict[str, Any]) -> None:
    """The saver gave back the final state and holds a checkpoint per super-step."""
    assert tuple_ is not None, "no checkpoint saved"
    values = tuple_.checkpoint["channel_values"]
    assert values["step"] == final["step"] == steps, (values["step"], final["step"], steps)
    assert values["note"] == final["note"]
    assert values["context"] == final["context"]
    assert count == steps + 2, (count, steps + 2)  # the input, each step, and the start


def check(saver: BaseCheckpointSaver[Any], config: Any, steps: int, final: dict[str, Any]) -> None:
    check_saved(saver.get_tuple(config), sum(1 for _ in saver.list(config)), steps, final)


async def acheck(
    saver: BaseCheckpointSaver[Any], config: Any, steps: int, final: dict[str, Any]
) -> None:
    count = 0
    async for _ in saver.alist(config):
        count += 1
    check_saved(await saver.aget_tuple(config), count, steps, final)


def timed(invoke: Callable[[], dict[str, Any]], steps: int) -> tuple[float, float, dict[str, Any]]:
    """Wall-clock and CPU seconds of ``invoke``, and its result."""
    gc.collect()
    began, cpu_began = time.perf_counter(), time.process_time()
    final = invoke()
    seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - cpu_began
    assert final["step"] == steps, (final["step"], steps)
    return seconds, cpu_seconds, final


def agentsnap_db(directory: Path) -> Path:
    """A new SQLite file with agentsnap's empty schema (a copy of one made once)."""
    template = directory / "agentsnap-schema.db"
    if not template.exists():
        made = AgentsnapSaver(f"sqlite:///{template}")
        made.get_tuple({"configurable": {"thread_id": "none"}})  # creates the schema
        made.close()
        db_bytes(template)  # its WAL checkpointed into it
    path = workloads.fresh_db(directory, "agentsnap")
    shutil.copyfile(template, path)
    return path


def run_sqlite(
    variant: str, builder: StateGraph[LoopState], inputs: LoopState, directory: Path
) -> Run:
    steps = inputs["steps"]
    config: Any = {"configurable": {"thread_id": "loop"}, "recursion_limit": steps + 10}
    saver: BaseCheckpointSaver[Any] | None = None
    path: Path | None = None
    connection: sqlite3.Connection | None = None
    if variant == "nullsaver":
        saver = NullSaver()
    elif variant == "sqlitesaver":
        path = workloads.fresh_db(directory, variant)
        connection = sqlite3.connect(path, check_same_thread=False)
        connection.execute("PRAGMA synchronous=NORMAL")  # AgentsnapSaver's durability
        sqlite_saver = SqliteSaver(connection)
        sqlite_saver.setup()  # journal_mode=WAL, as AgentsnapSaver's
        (mode,) = connection.execute("PRAGMA journal_mode").fetchone()
        (sync,) = connection.execute("PRAGMA synchronous").fetchone()
        assert (mode, sync) == ("wal", 1), (mode, sync)  # 1 is NORMAL
        saver = sqlite_saver
    elif variant == "agentsnap":
        path = agentsnap_db(directory)
        agentsnap_saver = AgentsnapSaver(f"sqlite:///{path}")
        agentsnap_saver.get_tuple(config)  # checks the schema, off the clock
        saver = agentsnap_saver
    graph = builder.compile(checkpointer=saver)
    if saver is None:
        seconds, cpu_seconds, final = timed(lambda: graph.invoke(inputs, config), steps)
    else:
        seconds, cpu_seconds, final = timed(
            lambda: graph.invoke(inputs, config, durability=DURABILITY), steps
        )
    size = None
    try:
        if saver is not None and path is not None:
            check(saver, config, steps, final)
        if isinstance(saver, AgentsnapSaver):
            # The connection its writes went through, at SqliteSaver's durability.
            assert write_durability(saver) == ("wal", 1), write_durability(saver)
    finally:
        if isinstance(saver, AgentsnapSaver):
            saver.close()
        if connection is not None:
            connection.close()
    if path is not None:
        size = db_bytes(path)
        workloads.remove_db(path)
    return Run(seconds, cpu_seconds, size)


def write_durability(saver: AgentsnapSaver) -> tuple[str, int]:
    """The journal mode and ``synchronous`` level of the saver's SQLite write connection."""
    raw = saver._storage._raw  # type: ignore[attr-defined]
    assert isinstance(raw, sqlite3.Connection), "no write went through the saver"
    (mode,) = raw.execute("PRAGMA journal_mode").fetchone()
    (sync,) = raw.execute("PRAGMA synchronous").fetchone()
    return str(mode), int(sync)


class Postgres:
    """The benchmark's PostgreSQL database: its savers, set up once, and emptying them."""

    def __init__(self, url: str) -> None:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        self.url = url
        self.dsn = url.replace("postgresql+psycopg://", "postgresql://")
        self.connection: Any = psycopg.Connection.connect(
            self.dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row
        )
        PostgresSaver(self.connection).setup()
        # agentsnap's tables are made anew by this agentsnap, at its schema's revision (two
        # revisions compared on one database each find their own).
        found = self.connection.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
            "AND tablename LIKE 'agentsnap%%'"
        ).fetchall()
        if found:
            names = ", ".join(row["tablename"] for row in found)
            self.connection.execute(f"DROP TABLE {names} CASCADE")
        setup = AgentsnapSaver(url)
        setup.get_tuple({"configurable": {"thread_id": "none"}})  # creates the schema
        setup.close()

    def empty(self) -> None:
        tables = ", ".join(OFFICIAL_PG_TABLES + AGENTSNAP_PG_TABLES)
        self.connection.execute(f"TRUNCATE {tables}")
        self.connection.execute(f"VACUUM ANALYZE {tables}")

    def close(self) -> None:
        self.connection.close()


def run_postgres(
    variant: str, builder: StateGraph[LoopState], inputs: LoopState, postgres: Postgres
) -> Run:
    steps = inputs["steps"]
    config: Any = {"configurable": {"thread_id": "loop"}, "recursion_limit": steps + 10}
    if variant not in ("anone", "none"):
        postgres.empty()
    if variant in ASYNC_VARIANTS:
        return asyncio.run(_run_async_postgres(variant, builder, inputs, config, postgres))
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    saver: BaseCheckpointSaver[Any]
    connection: Any = None
    if variant == "postgressaver":
        connection = psycopg.Connection.connect(
            postgres.dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row
        )
        saver = PostgresSaver(connection)
    else:
        saver = AgentsnapSaver(postgres.url)
    saver.get_tuple(config)  # connects, off the clock
    graph = builder.compile(checkpointer=saver)
    try:
        seconds, cpu_seconds, final = timed(
            lambda: graph.invoke(inputs, config, durability=DURABILITY), steps
        )
        check(saver, config, steps, final)
    finally:
        if isinstance(saver, AgentsnapSaver):
            saver.close()
        if connection is not None:
            connection.close()
    return Run(seconds, cpu_seconds, None)


async def _run_async_postgres(
    variant: str, builder: StateGraph[LoopState], inputs: LoopState, config: Any, pg: Postgres
) -> Run:
    import psycopg
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row

    steps = inputs["steps"]
    saver: BaseCheckpointSaver[Any] | None = None
    connection: Any = None
    if variant == "apostgressaver":
        connection = await psycopg.AsyncConnection.connect(
            pg.dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row
        )
        saver = AsyncPostgresSaver(connection)
    elif variant == "aagentsnap_pg":
        saver = AgentsnapSaver(pg.url)
    if saver is not None:
        await saver.aget_tuple(config)  # connects, off the clock
    graph = builder.compile(checkpointer=saver)
    invoke: Callable[[], Awaitable[dict[str, Any]]]
    if saver is None:

        def invoke() -> Awaitable[dict[str, Any]]:
            return graph.ainvoke(inputs, config)

    else:

        def invoke() -> Awaitable[dict[str, Any]]:
            return graph.ainvoke(inputs, config, durability=DURABILITY)

    try:
        gc.collect()
        began, cpu_began = time.perf_counter(), time.process_time()
        final = await invoke()
        seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - cpu_began
        assert final["step"] == steps, (final["step"], steps)
        if saver is not None:
            await acheck(saver, config, steps, final)
    finally:
        if isinstance(saver, AgentsnapSaver):
            await saver.aclose()
        if connection is not None:
            await connection.close()
    return Run(seconds, cpu_seconds, None)


def sqlite_storage(
    variant: str, builder: StateGraph[LoopState], inputs: LoopState, directory: Path
) -> dict[str, float]:
    """What a saver writes per super-step on SQLite, off the clock: WAL pages and bytes kept.

    A reader holds a snapshot from before the run to its end, so that no checkpoint can
    reset the WAL: every page the run commits is a frame of its own in the WAL file.
    """
    steps = inputs["steps"]
    config: Any = {"configurable": {"thread_id": "loop"}, "recursion_limit": steps + 10}
    if variant == "sqlitesaver":
        path = workloads.fresh_db(directory, f"storage-{variant}")
    else:
        path = agentsnap_db(directory)
    connection = sqlite3.connect(path, check_same_thread=False)
    saver: BaseCheckpointSaver[Any]
    if variant == "sqlitesaver":
        connection.execute("PRAGMA synchronous=NORMAL")
        saver = SqliteSaver(connection)
        saver.setup()
    else:
        saver = AgentsnapSaver(f"sqlite:///{path}")
        saver.get_tuple(config)  # checks the schema
    reader = sqlite3.connect(path, isolation_level=None)
    try:
        reader.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        before = path.stat().st_size
        (page_size,) = reader.execute("PRAGMA page_size").fetchone()
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM sqlite_master").fetchone()
        wal = Path(f"{path}-wal")
        wal_before = wal.stat().st_size if wal.exists() else 0
        graph = builder.compile(checkpointer=saver)
        graph.invoke(inputs, config, durability=DURABILITY)
        frames = (wal.stat().st_size - max(wal_before, 32)) / (page_size + 24)
        reader.execute("COMMIT")
    finally:
        reader.close()
        if isinstance(saver, AgentsnapSaver):
            saver.close()
        connection.close()
    stored = db_bytes(path) - before
    workloads.remove_db(path)
    return {
        "wal_pages_per_step": round(frames / steps, 2),
        "bytes_per_step": round(stored / steps),
    }


def postgres_storage(
    variant: str, builder: StateGraph[LoopState], inputs: LoopState, postgres: Postgres
) -> dict[str, float]:
    """What a saver writes per super-step on PostgreSQL, off the clock.

    Transactions committed and rows inserted or updated in the benchmark's database (from
    ``pg_stat_database``, read once the saver's connections are closed, which reports their
    counts), and the growth of the saver's tables, indexes and TOAST.
    """
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    steps = inputs["steps"]
    config: Any = {"configurable": {"thread_id": "loop"}, "recursion_limit": steps + 10}
    tables = OFFICIAL_PG_TABLES if variant == "postgressaver" else AGENTSNAP_PG_TABLES
    postgres.empty()

    def counters() -> tuple[int, int, int]:
        # A connection of its own, closed before the next read, which then counts it.
        time.sleep(0.5)  # a closed backend's counts reach the statistics as it exits
        with psycopg.Connection.connect(postgres.dsn, autocommit=True) as stats:
            row = stats.execute(
                "SELECT xact_commit, tup_inserted + tup_updated, "
                + " + ".join(f"pg_total_relation_size('{name}')" for name in tables)
                + " FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

    connection: Any = None
    saver: BaseCheckpointSaver[Any]
    if variant == "postgressaver":
        connection = psycopg.Connection.connect(
            postgres.dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row
        )
        saver = PostgresSaver(connection)
    else:
        saver = AgentsnapSaver(postgres.url)
    saver.get_tuple(config)
    graph = builder.compile(checkpointer=saver)
    first = counters()
    graph.invoke(inputs, config, durability=DURABILITY)
    if isinstance(saver, AgentsnapSaver):
        saver.close()
    if connection is not None:
        connection.close()
    last = counters()
    reading = counters()  # what a read of the counters adds to them, to subtract
    commits, written = (last[i] - first[i] - (reading[i] - last[i]) for i in (0, 1))
    return {
        "commits_per_step": round(commits / steps, 2),
        "rows_written_per_step": round(written / steps, 2),
        "bytes_per_step": round((last[2] - first[2]) / steps),
    }


@dataclass
class Ratios:
    """A ratio's per-round values, and those of the rounds kept."""

    all: list[float]
    kept: list[float]
    noise: list[float]
    """Per round: the baseline's spread over the smaller of the two overheads."""


def spread(ratios: Ratios) -> dict[str, Any]:
    """A ratio's median over the rounds kept, with their min and max, how many rounds were
    kept and rejected, and every round's value and baseline noise.

    When every round was rejected, the figures are those of all the rounds, and
    ``all_rejected`` says so.
    """
    chosen = ratios.kept or ratios.all
    return {
        "median": round(statistics.median(chosen), 4),
        "min": round(min(chosen), 4),
        "max": round(max(chosen), 4),
        "kept": len(ratios.kept),
        "rejected": len(ratios.all) - len(ratios.kept),
        "all_rejected": not ratios.kept,
        "rounds": [round(r, 4) for r in ratios.all],
        "baseline_noise": [round(n, 4) for n in ratios.noise],
    }


def measure(profile: str, directory: Path, postgres_url: str | None) -> dict[str, Any]:
    began = time.perf_counter()
    steps, rounds = PROFILES[profile]
    context = make_context(SEED)
    inputs: LoopState = {"context": context, "step": 0, "note": "", "steps": steps}
    builders = {graph: build_graph(graph == "changing") for graph in GRAPHS}
    state_bytes = len(orjson.dumps(inputs))
    postgres = Postgres(postgres_url) if postgres_url else None

    variants = [(graph, v) for graph in GRAPHS for v in SQLITE_VARIANTS]
    if postgres is not None:
        variants += [(graph, v) for graph in GRAPHS for v in POSTGRES_VARIANTS]

    def run(graph: str, variant: str, loop: LoopState) -> Run:
        variant = variant.split("#", maxsplit=1)[0]
        if variant in SQLITE_VARIANTS:
            return run_sqlite(variant, builders[graph], loop, directory)
        assert postgres is not None
        return run_postgres(variant, builders[graph], loop, postgres)

    try:
        # Warm-up (imports, code paths, page cache, connections), not timed.
        for graph, variant in variants:
            run(graph, variant, {**inputs, "steps": min(steps, WARM_UP_STEPS)})
        runs: dict[tuple[str, str], list[Run]] = {key: [] for key in variants}
        for index in range(rounds):
            shift = index % len(variants)
            for graph, variant in variants[shift:] + variants[:shift]:
                runs[graph, variant].append(run(graph, variant, inputs))
        # What each saver writes, measured once, off the clock.
        storage: dict[str, dict[str, float]] = {}
        for graph in GRAPHS:
            for variant in ("sqlitesaver", "agentsnap"):
                storage[f"{graph}/{variant}"] = sqlite_storage(
                    variant, builders[graph], inputs, directory
                )
            if postgres is not None:
                for variant in ("postgressaver", "agentsnap_pg"):
                    storage[f"{graph}/{variant}"] = postgres_storage(
                        variant, builders[graph], inputs, postgres
                    )
    finally:
        if postgres is not None:
            postgres.close()

    def per_step(graph: str, variant: str, cpu: bool = False) -> list[float]:
        return [(r.cpu_seconds if cpu else r.seconds) / steps for r in runs[graph, variant]]

    def ratios(graph: str, subject: str, reference: str, none: str, cpu: bool = False) -> Ratios:
        """Per round: the baseline is the mean of the round's two runs without a
        checkpointer, and the round is kept only if those two differ by less than either
        saver's overhead (a baseline noisier than the effect would decide the ratio)."""
        found = Ratios([], [], [])
        for base_a, base_b, ref, sub in zip(
            per_step(graph, none, cpu),
            per_step(graph, f"{none}#2", cpu),
            per_step(graph, reference, cpu),
            per_step(graph, subject, cpu),
            strict=True,
        ):
            base = (base_a + base_b) / 2
            ratio = (sub - base) / (ref - base)
            noise = abs(base_a - base_b)
            found.all.append(ratio)
            found.noise.append(noise / min(abs(sub - base), abs(ref - base)))
            if noise < min(sub - base, ref - base):
                found.kept.append(ratio)
        return found

    result: dict[str, Any] = {
        **workloads.environment("AgentsnapSaver vs LangGraph's savers", profile, "sqlite"),
        **{
            f"{name.replace('-', '_')}_version": metadata.version(name)
            for name in (
                "langgraph",
                "langgraph-checkpoint",
                "langgraph-checkpoint-sqlite",
                "langgraph-checkpoint-postgres",
            )
        },
        "db_dir": str(directory),
        "postgres": postgres_url is not None,
        "statistic": "ms/step: median of rounds; ratios: median of per-round ratios (min, max)",
        "durability": f"graph {DURABILITY}; SQLite WAL, synchronous=NORMAL for both savers",
        "rounds": rounds,
        "steps": steps,
        "state_bytes": state_bytes,
        "ms_per_step": {
            f"{graph}/{variant}": workloads.ms(per_step(graph, variant))
            for graph, variant in variants
        },
        "cpu_ms_per_step": {
            f"{graph}/{variant}": workloads.ms(per_step(graph, variant, cpu=True))
            for graph, variant in variants
        },
        "db_bytes": {
            f"{graph}/{variant}": round(statistics.median(r.db_bytes or 0 for r in found))
            for (graph, variant), found in runs.items()
            if variant in ("sqlitesaver", "agentsnap")
        },
        "storage_per_step": storage,
    }
    targets: dict[str, Any] = {"ratio_max": TARGET_RATIO}
    spreads: dict[str, Any] = {}
    for graph in GRAPHS:
        key = f"overhead_ratio_same_durability_{graph}"
        spreads[key] = spread(ratios(graph, "agentsnap", "sqlitesaver", "none"))
        spreads[f"overhead_floor_ratio_{graph}"] = spread(
            ratios(graph, "nullsaver", "sqlitesaver", "none")
        )
        spreads[f"cpu_overhead_ratio_same_durability_{graph}"] = spread(
            ratios(graph, "agentsnap", "sqlitesaver", "none", cpu=True)
        )
        result[key] = spreads[key]["median"]
        targets[f"{key}_met"] = result[key] <= TARGET_RATIO
    if postgres is not None:
        for key, subject, reference, none in (
            ("overhead_ratio_vs_postgres", "agentsnap_pg", "postgressaver", "none"),
            ("overhead_ratio_vs_async_postgres", "aagentsnap_pg", "apostgressaver", "anone"),
        ):
            for graph in GRAPHS:
                spreads[f"{key}_{graph}"] = spread(ratios(graph, subject, reference, none))
                result[f"{key}_{graph}"] = spreads[f"{key}_{graph}"]["median"]
            result[key] = max(result[f"{key}_{graph}"] for graph in GRAPHS)
            targets[f"{key}_met"] = result[key] <= TARGET_RATIO
    result["spread"] = spreads
    result["targets"] = targets
    result["elapsed_s"] = round(time.perf_counter() - began, 2)
    return result


def _table(r: dict[str, Any]) -> str:
    lines = [
        f"agentsnap {r['agentsnap_version']} LangGraph saver benchmark, "
        f"{r['python_implementation']} {r['python']}, SQLite {r['sqlite_version']}, "
        f"LangGraph {r['langgraph_version']}, {r['cpu_count']} CPUs, profile {r['profile']}",
        f"median of {r['rounds']} rounds (variants in rotating order); "
        f"{r['steps']:,} super-steps, state {r['state_bytes']:,} bytes of JSON; {r['durability']}",
        "",
        f"{'graph/checkpointer':<28}{'ms/step':>10}{'cpu ms/step':>13}{'db bytes':>14}",
    ]
    for name, value in r["ms_per_step"].items():
        size = r["db_bytes"].get(name)
        cpu = r["cpu_ms_per_step"][name]
        lines.append(
            f"{name:<28}{value:>10.3f}{cpu:>13.3f}{'' if size is None else f'{size:,}':>14}"
        )
    lines.append("")
    lines.append("written per super-step (off the clock):")
    for name, figures in r["storage_per_step"].items():
        lines.append(f"  {name:<26}" + ", ".join(f"{k} {v:,}" for k, v in figures.items()))
    lines.append("")
    for key, found in r["spread"].items():
        target = r["targets"].get(f"{key}_met")
        verdict = "" if target is None else f"  target <= {TARGET_RATIO}: {workloads.met(target)}"
        lines.append(
            f"{key} = {found['median']:.3f} (min {found['min']:.3f}, max {found['max']:.3f}; "
            f"rounds kept {found['kept']}, rejected {found['rejected']}){verdict}"
        )
    lines.extend(
        f"{key} = {r[key]:.3f} (the higher graph)  target <= {TARGET_RATIO}: "
        f"{workloads.met(r['targets'][f'{key}_met'])}"
        for key in ("overhead_ratio_vs_postgres", "overhead_ratio_vs_async_postgres")
        if key in r
    )
    lines.append(f"total {r['elapsed_s']} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = workloads.argument_parser(__doc__, "100 super-steps and 9 rounds", directory=True)
    parser.add_argument(
        "--postgres",
        metavar="URL",
        default=None,
        help="also compare with PostgresSaver and AsyncPostgresSaver on this database "
        "(its tables are emptied)",
    )
    args = parser.parse_args(argv)
    with workloads.scratch_directory(args.dir) as directory:
        results = measure("quick" if args.quick else "full", directory, args.postgres)
    workloads.report(results, args.json, _table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
