"""Messages per second and snapshot latency of a run spread over 1, 2 and 3 worker processes.

The work: six relays in a ring; the environment starts ``chains`` chains of ``hops`` hops
(one to each relay in turn), each relay bumps a counter in its state and passes the chain
on to the next relay, and the relay that takes a chain's last hop reports it done. A round
is timed from the first input sent until every chain is done; its rate is every message
delivered (inputs and hops) over that time.

The same rounds run, interleaved and in turn (the order rotates each repetition), on:

* ``inproc``: a [`Runtime`][agentsnap.Runtime] in this process, the same agents on the
  in-process bus (memory store, no journal, no snapshots);
* ``w1``, ``w2``, ``w3``: a run spread over 1, 2 and 3 ``agentsnap worker`` processes,
  this process being its coordinator ([`DistributedRun`][agentsnap.distributed.DistributedRun]).
  Relay ``i`` is hosted by worker ``i mod N`` (``--agents``), so with 2 and 3 workers every
  hop crosses processes through NATS JetStream (file storage, every publish acknowledged by
  the server), and with 1 worker the hops stay inside the worker, only the inputs crossing.
  A relay reports a chain done on a plain NATS subject. PostgreSQL holds the run, the
  agents' leases and the snapshot parts. Before a worker's messages leave, its relays'
  delivery order is secured in the run's stream (one acknowledged publish per batch;
  PostgreSQL takes it in the background);
* ``w2store``: as ``w2``, with each worker writing that order to PostgreSQL before its
  messages leave instead (``Host.order_in_stream`` off: one commit per batch), the way
  before the stream held it; ``ratio_w2_vs_w2store`` is the rate of ``w2`` over it, round
  by round.

Every worker process is started once, before the first round, and serves all rounds.

Besides the rates: ``snapshot_ms_w3``, the time from beginning a snapshot of the 3-worker
run (while a round runs on it) until it is stored complete (every worker's part written,
joined, checked); ``restart_ms_after_kill``, from SIGKILL of one worker of the 3-worker run
until a new worker started on the same agents hosts them (the dead worker's claim expires
after its ``--lease`` of 2 s; not measured with ``--quick``, ``null`` then);
``recovery_ms_after_kill``: until the run is recovered (its rollback to the last complete
cut recorded, and a round of chains sent after it finished), ``null`` with
``recovery_reason`` when no rollback is recorded within 40 s (or with ``--quick``).

``--markers`` measures instead the control traffic of one snapshot of a run of 60, 300 and
1,000 agents (``--sizes`` to choose) on 3 workers, where each agent sends to 3 others (the
next three in a ring, one of them at random each time; placed by ``--group N/3``, so most
of those channels cross processes): the workers run as hosts in this process, each with its
own NATS connection, bus and scheduler, on a store in memory. Every agent starts a chain of
3 hops; a snapshot begun right then (``busy``) and one taken once the run is idle
(``quiet``) are counted: the markers published on channels between processes, the notices
of cuts, and the part notices (one per process), with the channels that carried a message,
the channel objects the busiest worker holds (``channel_objects_per_worker``: made on first
use), the time each snapshot took and the time the run took to start. A size that does not
start and take its snapshots within ``--patience`` seconds (600 by default) is reported as
not finished.

``--profile`` adds rounds on a run over 2 workers, the first of which runs under
``cProfile`` from the first message it takes until it stops (the ``AGENTSNAP_BENCH_PROFILE``
variable names the file it writes), with its own time split by where it is spent and its
CPU time against the time it ran. ``--json`` prints one JSON object; ``--quick`` runs
smaller and fewer repetitions (under a minute); ``--nats URL`` names the NATS server
(JetStream on), ``--db URL`` the PostgreSQL database (by default
``AGENTSNAP_TEST_POSTGRES_URL``). Run it from the repository root with:

    python benchmarks/distributed.py --db postgresql://postgres@127.0.0.1:5432/agentsnap
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import cProfile
import functools
import gc
import json
import os
import pstats
import random
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

import workloads

from agentsnap import Agent, AgentState, Context, Message, Runtime, Snapshot, SnapshotFailed
from agentsnap.distributed import App, DistributedRun
from agentsnap.snapshot import SnapshotPolicy

HERE = Path(__file__).resolve().parent
RELAYS = 6
PROFILE_VARIABLE = "AGENTSNAP_BENCH_PROFILE"
ORDER_VARIABLE = "AGENTSNAP_BENCH_ORDER"
"""``store``: the worker writes its delivery order to the store before its messages leave."""
NATS_VARIABLE = "AGENTSNAP_BENCH_NATS"
DONE = "agentsnap-bench-done"
"""First token of the plain NATS subject a relay reports a finished chain on."""
LEASE = 2.0
RECOVERY_PATIENCE = 40.0
"""Seconds after a SIGKILL within which the run must have rolled back to count as recovered."""
# name: (chains, hops, repetitions, snapshots)
PROFILES: dict[str, tuple[int, int, int, int]] = {
    "full": (40, 50, 5, 30),
    "quick": (20, 30, 3, 12),
}
WORKERS = (1, 2, 3)


# -- the app (every worker process imports this module to build it) ------------------------


class RelayState(AgentState):
    handled: int = 0


Finish = Callable[[str], Awaitable[None]]


class _Notices:
    """How a relay reports a finished chain: on NATS in a worker, set by the caller here."""

    finish: Finish | None = None
    nc: Any = None

    @classmethod
    async def publish(cls, run_id: str) -> None:
        if cls.nc is None:
            import nats

            cls.nc = await nats.connect(os.environ[NATS_VARIABLE])
        await cls.nc.publish(f"{DONE}.{run_id}", b"")


class Relay(Agent[RelayState]):
    """Passes each chain on to the next relay until its hops run out."""

    def __init__(self, name: str, after: str) -> None:
        super().__init__(name, RelayState())
        self.after = after

    async def handle(self, message: Message, ctx: Context[RelayState]) -> None:
        if _Profile.profiler is not None:
            _Profile.begin()
        self.state.handled += 1
        payload = message.payload
        assert isinstance(payload, dict)
        hops = payload["hops"]
        assert isinstance(hops, int)
        if hops > 0:
            ctx.send(self.after, {"hops": hops - 1}, kind="hop")
            return
        finish = _Notices.finish
        await (finish(ctx.run_id) if finish is not None else _Notices.publish(ctx.run_id))


def relay_names() -> list[str]:
    return [f"relay-{i}" for i in range(RELAYS)]


class _Profile:
    """A worker's profile: from the first message its relays take until the process ends."""

    profiler: cProfile.Profile | None = None
    path = ""
    cpu = 0.0
    wall = 0.0

    @classmethod
    def prepare(cls, path: str) -> None:
        if cls.profiler is None:
            cls.profiler, cls.path = cProfile.Profile(), path
            atexit.register(cls.dump)

    @classmethod
    def begin(cls) -> None:
        if cls.profiler is not None and not cls.wall:
            cls.cpu, cls.wall = time.process_time(), time.perf_counter()
            cls.profiler.enable()

    @classmethod
    def dump(cls) -> None:
        if cls.profiler is None or not cls.wall:
            return
        cls.profiler.disable()
        cls.profiler.dump_stats(cls.path)
        times = {"cpu_s": time.process_time() - cls.cpu, "wall_s": time.perf_counter() - cls.wall}
        Path(cls.path + ".json").write_text(json.dumps(times))


def make_app() -> App:
    """The relays; a worker started with ``AGENTSNAP_BENCH_PROFILE=FILE`` profiles itself."""
    path = os.environ.get(PROFILE_VARIABLE)
    if path:
        _Profile.prepare(path)
    if os.environ.get(ORDER_VARIABLE) == "store":
        from agentsnap.distributed.host import Host

        Host.order_in_stream = False
    names = relay_names()
    return App(
        agents=[Relay(name, names[(i + 1) % len(names)]) for i, name in enumerate(names)],
        metadata={"benchmark": "distributed"},
    )


# -- the sides --------------------------------------------------------------------------------


class Chains:
    """Counts finished chains; ``done`` is set when the round's last one is reported."""

    def __init__(self) -> None:
        self.expected = 0
        self.count = 0
        self.done = asyncio.Event()

    def begin(self, chains: int) -> None:
        self.expected, self.count = chains, 0
        self.done.clear()

    def one(self) -> None:
        self.count += 1
        if self.count >= self.expected:
            self.done.set()


async def inproc_round(chains: int, hops: int) -> float:
    counter = Chains()

    async def finish(_: str) -> None:
        counter.one()

    _Notices.finish = finish
    runtime = Runtime(snapshot_policy=SnapshotPolicy(at_start=False, at_end=False), journal=False)
    try:
        for agent in make_app().agents:
            runtime.add(agent)
        await runtime.start()
        names = relay_names()
        counter.begin(chains)
        gc.collect()
        started = time.perf_counter()
        for j in range(chains):
            runtime.send(names[j % len(names)], {"hops": hops}, kind="go")
        await counter.done.wait()
        return time.perf_counter() - started
    finally:
        _Notices.finish = None
        await runtime.close()


class Spread:
    """One run over ``workers`` worker processes, and this process as its coordinator."""

    def __init__(
        self, workers: int, nats_url: str, db: str, logs: Path, order: str = "stream"
    ) -> None:
        self.workers = workers
        self.order = order
        self.nats_url = nats_url
        self.db = db
        self.logs = logs
        self.run_id = f"bench-{workers}w-{uuid.uuid4().hex[:12]}"
        self.processes: dict[int, asyncio.subprocess.Process] = {}
        self.counter = Chains()
        self.link: Any = None
        self.store: Any = None
        self.run: DistributedRun | None = None
        self.where: Callable[[int], list[str]] = lambda n: []
        """The command that runs worker ``n``'s command line elsewhere (on a host of its own:
        ``distributed_hosts.py``); nothing, in this process's network stack."""

    def placement(self, n: int) -> str:
        return ",".join(name for i, name in enumerate(relay_names()) if i % self.workers == n)

    def log(self, n: int) -> Path:
        return self.logs / f"{self.run_id}-{n}.log"

    async def launch(self, n: int, profile: Path | None = None) -> None:
        command = [
            *self.where(n), sys.executable, "-m", "agentsnap", "worker", "--nats", self.nats_url,
            "--db", self.db, "--app", "distributed:make_app", "--run", self.run_id,
            "--agents", self.placement(n), "--lease", str(LEASE),
        ]  # fmt: skip
        env = {**os.environ, NATS_VARIABLE: self.nats_url, ORDER_VARIABLE: self.order}
        env.pop(PROFILE_VARIABLE, None)
        if profile is not None:
            env[PROFILE_VARIABLE] = str(profile)
        with self.log(n).open("ab") as out:
            self.processes[n] = await asyncio.create_subprocess_exec(
                *command, cwd=HERE, env=env, stdout=out, stderr=out
            )

    async def until_hosting(self, n: int, since: int = 0) -> float:
        """Wait until worker ``n`` hosts its agents (starting it again while the agents are
        still claimed by a dead one); when it does, by ``time.perf_counter()``."""
        deadline = time.perf_counter() + 60
        while time.perf_counter() < deadline:
            text = self.log(n).read_bytes()[since:].decode(errors="replace")
            if " hosts " in text:
                return time.perf_counter()
            process = self.processes[n]
            if process.returncode is not None:
                if "already hosted" not in text:
                    raise RuntimeError(f"worker {n} of {self.run_id} stopped:\n{text}")
                since = self.log(n).stat().st_size
                await self.launch(n)
            await asyncio.sleep(0.01)
        raise RuntimeError(f"worker {n} of {self.run_id} did not start")

    async def start(self, profile: Path | None = None) -> None:
        await self.launch_all(profile)
        await self.ready()

    async def launch_all(self, profile: Path | None = None) -> None:
        """Create the run and start its workers, without waiting for them."""
        from agentsnap.jetstream import JetStreamLink
        from agentsnap.store.sql import SqlStore

        self.store = SqlStore(self.db)
        self.link = await JetStreamLink.connect(self.nats_url)
        self.run = DistributedRun(self.link, self.store, make_app(), run_id=self.run_id)
        await self.run.start()
        await self.link.nc.subscribe(f"{DONE}.{self.run_id}", cb=self._done)
        for n in range(self.workers):
            await self.launch(n, profile if n == 0 else None)

    async def ready(self) -> None:
        """Wait until every worker hosts its agents."""
        for n in range(self.workers):
            await self.until_hosting(n)

    async def _done(self, _: Any) -> None:
        self.counter.one()

    def send(self, chains: int, hops: int) -> None:
        assert self.run is not None
        names = relay_names()
        self.counter.begin(chains)
        for j in range(chains):
            self.run.send(names[j % len(names)], {"hops": hops}, kind="go")

    async def round(self, chains: int, hops: int) -> float:
        gc.collect()
        started = time.perf_counter()
        self.send(chains, hops)
        await self.counter.done.wait()
        return time.perf_counter() - started

    async def snapshots(self, chains: int, hops: int, count: int) -> tuple[list[float], int]:
        """Snapshot latencies while rounds run; how many were taken with the run idle."""
        assert self.run is not None
        taken: list[float] = []
        idle = 0
        self.send(chains, hops)
        while len(taken) < count:
            if self.counter.done.is_set():
                idle += 1
            started = time.perf_counter()
            with contextlib.suppress(SnapshotFailed):
                await self.run.snapshot()
                taken.append(time.perf_counter() - started)
        await self.counter.done.wait()
        return taken, idle

    async def kill_and_recover(
        self, n: int, chains: int, hops: int
    ) -> tuple[float, float | None, str | None]:
        """SIGKILL worker ``n`` of the idle run, and start it again.

        Returns:
            Seconds from the SIGKILL until the new worker hosts the agents; until the run
            rolled back to its last complete cut and took a round of chains again (``None``
            when no rollback was recorded within ``RECOVERY_PATIENCE`` seconds); and why
            there is no such figure.
        """
        assert self.run is not None
        while True:  # the cut to go back to: the idle run, nothing in flight
            with contextlib.suppress(SnapshotFailed):
                await self.run.snapshot()
                break
        process = self.processes[n]
        since = self.log(n).stat().st_size
        killed = time.perf_counter()
        process.send_signal(signal.SIGKILL)
        await process.wait()
        await self.launch(n)
        hosted = await self.until_hosting(n, since) - killed
        while not await self.store.list_rollbacks(self.run_id):
            if time.perf_counter() - killed > RECOVERY_PATIENCE:
                return (
                    hosted,
                    None,
                    (
                        f"no rollback recorded within {RECOVERY_PATIENCE:g} s of the SIGKILL: this "
                        "version does not roll a run across processes back to its last complete "
                        "cut when a dead worker's agents are hosted again (the new worker replays "
                        "their input from the start of the run's stream, with fresh states)"
                    ),
                )
            await asyncio.sleep(0.02)
        await self.round(chains, hops)
        return hosted, time.perf_counter() - killed, None

    async def close(self) -> None:
        for process in self.processes.values():
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()
        if self.run is not None:
            await self.run.close()
        if self.link is not None:
            await self.link.delete_stream(self.run_id)
            await self.link.close()
        if self.store is not None:
            await self.store.close()


# -- measuring ------------------------------------------------------------------------------


BUCKETS = [
    ("agentsnap.jetstream", "/agentsnap/jetstream/"),
    ("agentsnap.distributed and snapshots", "/agentsnap/distributed/"),
    ("nats client", "/nats/"),
    ("event loop and sockets", "/asyncio/"),
    ("bus, agents, scheduler", "/agentsnap/"),
    ("pydantic, orjson", "/pydantic"),
    ("sqlalchemy, asyncpg", "/sqlalchemy/"),
]


def profile_share(path: Path) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """A worker's own time split by where it is spent, and its ten costliest functions."""
    stats: dict[Any, Any] = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    spent = dict.fromkeys(
        [name for name, _ in BUCKETS] + ["asyncpg", "waiting (select)", "other"], 0.0
    )
    functions: list[tuple[str, float]] = []
    for (filename, line, function), (_, _, tottime, _, _) in stats.items():
        functions.append((f"{Path(filename).name}:{line}({function})", tottime))
        if function == "<method 'poll' of 'select.epoll' objects>":
            spent["waiting (select)"] += tottime
            continue
        for name, where in BUCKETS:
            if where in filename:
                spent[name] += tottime
                break
        else:
            if "asyncpg" in filename:
                spent["asyncpg"] += tottime
            elif function.startswith(("<method 'send'", "<method 'recv'")):
                spent["event loop and sockets"] += tottime
            else:
                spent["other"] += tottime
    total = sum(spent.values()) or 1.0
    busy = total - spent["waiting (select)"]
    share = {name: round(seconds / total, 3) for name, seconds in spent.items()}
    share["busy_seconds"] = round(busy, 3)
    top = sorted(functions, key=lambda item: -item[1])[:10]
    return share, [(name, round(seconds, 4)) for name, seconds in top]


def cpu_and_wall(path: Path) -> dict[str, float]:
    """The profiled worker's CPU and wall-clock seconds, as it wrote them beside its profile."""
    times: dict[str, float] = json.loads(Path(f"{path}.json").read_text())
    return times


def spread(values: list[float]) -> list[float]:
    return [round(min(values), 4), round(max(values), 4)]


async def measure(nats_url: str, db: str, profile: str, with_profile: bool) -> dict[str, Any]:
    chains, hops, repetitions, snapshot_count = PROFILES[profile]
    messages = chains * (hops + 1)
    logs = Path(tempfile.mkdtemp(prefix="agentsnap-bench-"))
    spreads = {w: Spread(w, nats_url, db, logs) for w in WORKERS}
    in_store = Spread(2, nats_url, db, logs, order="store")
    sides: dict[str, Callable[[], Awaitable[float]]] = {
        "inproc": lambda: inproc_round(chains, hops),
        **{f"w{w}": functools.partial(s.round, chains, hops) for w, s in spreads.items()},
        "w2store": functools.partial(in_store.round, chains, hops),
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    results: dict[str, Any] = {}
    phases: dict[str, float] = {}
    clock = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        phases[name] = round(now - clock, 2)
        clock = now

    try:
        # Every worker process starts at once (they import and connect side by side).
        for s in [*spreads.values(), in_store]:
            await s.launch_all()
        for s in [*spreads.values(), in_store]:
            await s.ready()
        phase("start_workers")
        # A warm-up round on each side (connections, consumers, caches), not counted.
        for side in sides.values():
            await side()
        order = list(sides)
        for rep in range(repetitions):
            turn = order[rep % len(order) :] + order[: rep % len(order)]
            for name in turn:
                times[name].append(await sides[name]())
        phase("rounds")
        snapshot_s, idle = await spreads[3].snapshots(chains, hops * 4, snapshot_count)
        phase("snapshots")
        restart_s = recovery_s = None
        why: str | None = "not measured with --quick (process starts and a lease to expire)"
        if profile == "full":
            restart_s, recovery_s, why = await spreads[3].kill_and_recover(0, chains, hops)
            phase("kill_and_recover")
    finally:
        await asyncio.gather(*(s.close() for s in [*spreads.values(), in_store]))
        phase("stop_workers")
    if with_profile:
        results["worker_profile"] = await profiled_worker(nats_url, db, logs, chains, hops)
        phase("profile")
    results["phase_seconds"] = phases

    inproc = times["inproc"]
    ratios: dict[str, Any] = {}
    for w in WORKERS:
        per_round = [i / t for i, t in zip(inproc, times[f"w{w}"], strict=True)]
        ratios[f"ratio_w{w}_vs_inproc"] = round(statistics.median(per_round), 5)
        ratios[f"ratio_w{w}_vs_inproc_spread"] = spread(per_round)
    scaling = [a / b for a, b in zip(times["w1"], times["w3"], strict=True)]
    secured = [a / b for a, b in zip(times["w2store"], times["w2"], strict=True)]
    return {
        **workloads.environment("agentsnap distributed", profile),
        "nats_url": nats_url,
        "relays": RELAYS,
        "chains": chains,
        "hops": hops,
        "messages_per_round": messages,
        "repetitions": repetitions,
        "msgs_per_s_inproc": workloads.rate(messages, inproc),
        **{f"msgs_per_s_w{w}": workloads.rate(messages, times[f"w{w}"]) for w in WORKERS},
        "msgs_per_s_w2store": workloads.rate(messages, times["w2store"]),
        **ratios,
        "ratio_w2_vs_w2store": round(statistics.median(secured), 5),
        "ratio_w2_vs_w2store_spread": spread(secured),
        "ratio_w3_vs_w1": round(statistics.median(scaling), 5),
        "ratio_w3_vs_w1_spread": spread(scaling),
        "snapshot_ms_w3": workloads.ms(snapshot_s),
        "snapshot_ms_w3_spread": [
            round(min(snapshot_s) * 1000, 2),
            round(max(snapshot_s) * 1000, 2),
        ],
        "snapshot_ms_w3_p90": round(sorted(snapshot_s)[int(0.9 * (len(snapshot_s) - 1))] * 1000, 2),
        "snapshots_w3": len(snapshot_s),
        "snapshots_w3_idle": idle,
        "restart_ms_after_kill": None if restart_s is None else round(restart_s * 1000, 1),
        "lease_s": LEASE,
        "recovery_ms_after_kill": None if recovery_s is None else round(recovery_s * 1000, 1),
        "recovery_reason": why,
        "samples_msgs_per_s": {name: workloads.rates(messages, t) for name, t in times.items()},
        "samples_snapshot_ms": workloads.samples_ms(snapshot_s),
        **results,
    }


async def profiled_worker(
    nats_url: str, db: str, logs: Path, chains: int, hops: int
) -> dict[str, Any]:
    """Rounds on two worker processes, the first profiling itself; where its time went."""
    path = logs / "worker.prof"
    s = Spread(2, nats_url, db, logs)
    try:
        await s.start(profile=path)
        seconds = [await s.round(chains, hops) for _ in range(3)]
    finally:
        await s.close()
    share, top = profile_share(path)
    times = cpu_and_wall(path)
    return {
        "workers": 2,
        "msgs_per_s_under_cprofile": workloads.rate(chains * (hops + 1), seconds),
        "worker_cpu_s": round(times["cpu_s"], 3),
        "worker_wall_s": round(times["wall_s"], 3),
        "share": share,
        "top_functions_own_s": top,
    }


# -- control traffic per snapshot ------------------------------------------------------------

MARKER_SIZES = (60, 300, 1000)
MARKER_WORKERS = 3
MARKER_PEERS = 3


class PeerState(AgentState):
    handled: int = 0


class Peer(Agent[PeerState]):
    """Passes each chain on to one of its peers, at random, until its hops run out."""

    def __init__(self, name: str, peers: list[str]) -> None:
        super().__init__(name, PeerState())
        self.peers = peers
        self.rng = random.Random(name)

    async def handle(self, message: Message, ctx: Context[PeerState]) -> None:
        self.state.handled += 1
        payload = message.payload
        assert isinstance(payload, dict)
        hops = payload["hops"]
        assert isinstance(hops, int)
        if hops > 0:
            ctx.send(self.rng.choice(self.peers), {"hops": hops - 1}, kind="hop")


def peers_app(agents: int) -> App:
    names = [f"peer-{i}" for i in range(agents)]
    return App(
        agents=[
            Peer(name, [names[(i + k) % agents] for k in range(1, MARKER_PEERS + 1)])
            for i, name in enumerate(names)
        ]
    )


class _Traffic:
    """Markers and notices of cuts, counted per snapshot number as they are sent here."""

    markers: ClassVar[Counter[int]] = Counter()
    notices: ClassVar[Counter[int]] = Counter()
    installed = False

    @classmethod
    def install(cls) -> None:
        if cls.installed:
            return
        cls.installed = True
        from agentsnap.bus import Bus
        from agentsnap.jetstream import JetStreamTransport

        post_marker = Bus.post_marker

        def counted_marker(bus: Bus, channel: Any, snapshot: int) -> None:
            if type(channel).__name__ == "OutgoingChannel":
                cls.markers[snapshot] += 1
            post_marker(bus, channel, snapshot)

        Bus.post_marker = counted_marker  # type: ignore[method-assign,assignment]
        tell = getattr(JetStreamTransport, "tell_cut", None)
        if tell is not None:  # before notices of cuts, every channel took its marker

            def counted_notice(transport: Any, notice: Any) -> None:
                cls.notices[notice["cut"]] += 1
                tell(transport, notice)

            JetStreamTransport.tell_cut = counted_notice  # type: ignore[method-assign,assignment]


async def control_traffic(nats_url: str, agents: int) -> dict[str, Any]:
    """One size: start the run, send a chain to every agent, count a busy and a quiet cut."""
    from agentsnap import MemoryStore
    from agentsnap.distributed import Worker, group_of
    from agentsnap.jetstream import JetStreamLink

    _Traffic.install()
    _Traffic.markers.clear()  # each run numbers its snapshots from 1
    _Traffic.notices.clear()
    started = time.perf_counter()
    store = MemoryStore()
    app = peers_app(agents)
    placed = [[n for n in app.names if group_of(n, MARKER_WORKERS) == w] for w in range(3)]
    links = [await JetStreamLink.connect(nats_url) for _ in range(MARKER_WORKERS + 1)]
    run = DistributedRun(links[0], store, app, part_timeout=3600)
    workers = [
        # The hosts share this process's loop: a long lease, so that a loop busy with a
        # thousand agents' recordings is not taken for a dead worker.
        Worker(link, store, run.run_id, peers_app(agents), names, name=f"w{w}", lease=3600)
        for w, (link, names) in enumerate(zip(links[1:], placed, strict=True))
    ]
    try:
        await run.start()
        for worker in workers:
            await worker.start()
        setup = time.perf_counter() - started
        for name in app.names:
            run.send(name, {"hops": 3}, kind="go")
        clock = time.perf_counter()
        busy = await run.snapshot().wait()
        busy_s = time.perf_counter() - clock
        await run.run_until_idle()
        clock = time.perf_counter()
        quiet = await run.snapshot().wait()
        quiet_s = time.perf_counter() - clock
        carried = sum(
            1
            for worker in workers
            for channel in worker.host.transport.outgoing.values()
            if channel.sent
        )
        channel_objects = [len(worker.host.bus.channels) for worker in workers]
    finally:
        for worker in workers:
            await worker.close()
        with contextlib.suppress(Exception):
            await run.close()
        with contextlib.suppress(Exception):
            await links[0].delete_stream(run.run_id)
        for link in links:
            await link.close()
    between = sum(len(names) * (agents - len(names)) for names in placed)
    parts = MARKER_WORKERS + 1

    def cut(snapshot: Snapshot, seconds: float) -> dict[str, Any]:
        markers = _Traffic.markers[snapshot.seq]
        notices = _Traffic.notices[snapshot.seq]
        return {
            "markers": markers,
            "notices": notices,
            "part_notices": parts,
            "control_messages": markers + notices + parts,
            "snapshot_ms": round(seconds * 1000, 1),
        }

    return {
        "agents": agents,
        "workers": MARKER_WORKERS,
        "peers": MARKER_PEERS,
        "channels_between_workers": between,
        "channels_that_carried_messages": carried,
        "channel_objects_per_worker": max(channel_objects),
        "busy": cut(busy, busy_s),
        "quiet": cut(quiet, quiet_s),
        "start_s": round(setup, 2),
    }


async def measure_markers(nats_url: str, sizes: list[int], patience: float) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    for agents in sizes:
        try:
            async with asyncio.timeout(patience):
                results.append(await control_traffic(nats_url, agents))
        except TimeoutError:
            results.append({"agents": agents, "not_finished": f"not done in {patience:.0f} s"})
        except SnapshotFailed as exc:
            results.append({"agents": agents, "not_finished": str(exc)[:300]})
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        gc.collect()
    return {
        **workloads.environment("agentsnap distributed markers", "markers"),
        "nats_url": nats_url,
        "sizes": results,
    }


def markers_table(results: dict[str, Any]) -> str:
    lines = [
        f"control traffic of one snapshot, {MARKER_WORKERS} workers, each agent sending to "
        f"{MARKER_PEERS} others ({results['nats_url']})",
        "  agents  channels between workers  carried  objects  |  busy: markers notices control"
        " ms  |  quiet: markers notices control ms  |  start s",
    ]
    for size in results["sizes"]:
        if "not_finished" in size:
            lines.append(f"  {size['agents']:>6}  {size['not_finished']}")
            continue
        busy, quiet = size["busy"], size["quiet"]
        lines.append(
            f"  {size['agents']:>6}  {size['channels_between_workers']:>24,}  "
            f"{size['channels_that_carried_messages']:>7,}  "
            f"{size.get('channel_objects_per_worker', 0):>7,}  |  {busy['markers']:>13,} "
            f"{busy['notices']:>7} {busy['control_messages']:>7,} {busy['snapshot_ms']:>7}"
            f"  |  {quiet['markers']:>14,} {quiet['notices']:>7} "
            f"{quiet['control_messages']:>7,} {quiet['snapshot_ms']:>7}  |  {size['start_s']:>7}"
        )
    return "\n".join(lines)


def table(results: dict[str, Any]) -> str:
    def ratio(key: str) -> str:
        low, high = results[f"{key}_spread"]
        return f"{results[key]:.4f} ({low:.4f} .. {high:.4f})"

    lines = [
        f"agentsnap run spread over worker processes ({results['profile']}: "
        f"{results['relays']} relays, {results['chains']} chains of {results['hops']} hops = "
        f"{results['messages_per_round']} messages a round, {results['repetitions']} "
        f"repetitions, {results['nats_url']})",
        f"  in-process bus            {results['msgs_per_s_inproc']:>10,.0f} msg/s",
    ]
    lines += [
        f"  {w} worker process{'es' if w > 1 else '  '}      "
        f"{results[f'msgs_per_s_w{w}']:>10,.0f} msg/s   vs in-process "
        + ratio(f"ratio_w{w}_vs_inproc")
        for w in WORKERS
    ]
    low, high = results["snapshot_ms_w3_spread"]
    lines += [
        f"  2, order in the store     {results['msgs_per_s_w2store']:>10,.0f} msg/s   "
        f"2 workers / it {ratio('ratio_w2_vs_w2store')}",
        f"  3 workers / 1 worker      {ratio('ratio_w3_vs_w1')}",
        f"  snapshot, 3 workers       {results['snapshot_ms_w3']:>10} ms median "
        f"({low} .. {high}; p90 {results['snapshot_ms_w3_p90']}; "
        f"{results['snapshots_w3']} snapshots, {results['snapshots_w3_idle']} idle)",
        f"  worker restarted          {results['restart_ms_after_kill'] or '-':>10} ms after "
        f"SIGKILL (lease {results['lease_s']} s)",
        f"  recovered after SIGKILL   {results['recovery_ms_after_kill'] or '-':>10} ms "
        + (f"({results['recovery_reason']})" if results["recovery_reason"] else ""),
    ]
    profile = results.get("worker_profile")
    if profile:
        lines.append(
            f"  worker 0 of 2 under cProfile ({profile['msgs_per_s_under_cprofile']:,.0f} msg/s; "
            f"{profile['worker_cpu_s']} s CPU in {profile['worker_wall_s']} s), own time:"
        )
        lines += [f"    {name:<36} {part}" for name, part in profile["share"].items()]
        lines.append("  costliest functions (own seconds):")
        lines += [f"    {seconds:>8}  {name}" for name, seconds in profile["top_functions_own_s"]]
    return "\n".join(lines)


def main() -> None:
    parser = workloads.argument_parser(
        __doc__, f"{PROFILES['quick'][0]} chains of {PROFILES['quick'][1]} hops, 3 repetitions"
    )
    parser.add_argument("--nats", default="nats://127.0.0.1:4222", help="the NATS server")
    parser.add_argument(
        "--db",
        default=os.environ.get("AGENTSNAP_TEST_POSTGRES_URL"),
        help="the PostgreSQL database the workers share (default: AGENTSNAP_TEST_POSTGRES_URL)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="also profile one worker process with cProfile"
    )
    parser.add_argument(
        "--markers",
        action="store_true",
        help="measure the control traffic per snapshot of 60, 300 and 1,000 agents instead",
    )
    parser.add_argument(
        "--sizes",
        default=",".join(map(str, MARKER_SIZES)),
        help="with --markers: the numbers of agents, comma-separated",
    )
    parser.add_argument(
        "--patience",
        type=float,
        default=600.0,
        help="with --markers: seconds a size may take before it counts as not finished",
    )
    args = parser.parse_args()
    if args.markers:
        sizes = [int(size) for size in args.sizes.split(",")]
        results = asyncio.run(measure_markers(args.nats, sizes, args.patience))
        workloads.report(results, args.json, markers_table)
        return
    if not args.db or not args.db.startswith("postgresql"):
        parser.error("--db must name a PostgreSQL database (every process shares it)")
    results = asyncio.run(
        measure(args.nats, args.db, "quick" if args.quick else "full", args.profile)
    )
    workloads.report(results, args.json, table)


if __name__ == "__main__":
    main()
