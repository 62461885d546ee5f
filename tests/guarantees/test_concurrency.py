"""The run guarantees under the default scheduler, with handlers that really interleave.

A randomized workload runs many times on the default ``AsyncioScheduler``: tokens hop between
a few workers (each hop is a delivery, and the worker forwards the token to the next), every
handler sleeps a little at random, and some outputs are flawed:

* ``bad``: a check declared with ``Runtime.check`` rejects it;
* ``sloppy``: the worker's own ``evaluate`` rejects it;
* ``dubious``: a review sent to the critic, which rejects it with ``ctx.reject``.

A worker keeps making a flawed output until it has been told about it (by a rollback's
feedback from that source) a number of times drawn per worker and source: its *stubbornness*.
With ``RetryPolicy.attempts(k)`` a site (a worker and a source) gives up after ``k`` counted
rejections, that is ``k - 1`` rollbacks, so a run must give up exactly when some flawed site is
at least ``k`` stubborn. Each run then checks:

* every stored complete snapshot is a consistent cut (``cut_problems``), and no snapshot
  failed for being inconsistent;
* no handler ever took a ``bad`` or ``sloppy`` message, a ``dubious`` review reached nobody
  but the critic, and no final state holds a flawed output;
* no site was rolled back more than ``k - 1`` times;
* when the run gives up, ``RollbackExhausted.attempts <= k``, the site it gave up on was
  stubborn enough to give up on, no handler started after that site's last rejection, the
  run is stored as failed, ``runtime.send`` raises and nothing is delivered afterwards;
* otherwise every hop of every token was handled exactly once and the run succeeded.

The workload is drawn from a seed; the interleaving is not (that is the point of the default
scheduler), so a failing seed reproduces the workload and usually, not always, the failure.
``AGENTSNAP_GUARANTEE_RUNS`` sets the number of runs on MemoryStore (1,000 by default; a
twentieth of it runs on SQLite), ``AGENTSNAP_GUARANTEE_SEED`` fixes the base seed.
"""

from __future__ import annotations

import asyncio
import os
import random
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from payloads import get
from pydantic import Field

from agentsnap import (
    Agent,
    AgentState,
    Context,
    Feedback,
    MemoryStore,
    Message,
    RetryPolicy,
    RollbackExhausted,
    RunError,
    RunStatus,
    Runtime,
    RuntimeClosedError,
    SnapshotPolicy,
    SnapshotStatus,
    Store,
)
from agentsnap.checks import CheckResult
from agentsnap.store.sql import SqlStore
from agentsnap.testing import cut_problems

RUNS = int(os.environ.get("AGENTSNAP_GUARANTEE_RUNS", "1000"))
BATCHES = 10
SQLITE_RUNS = max(RUNS // 20, 10)
SQLITE_BATCHES = 2
BASE_SEED = int(
    os.environ.get("AGENTSNAP_GUARANTEE_SEED") or random.SystemRandom().randrange(2**31)
)
HANG = 60.0
"""Seconds after which a run that has not returned is reported as hung (not a timing check:
a run takes a few milliseconds)."""

CHECK = "no-bad"
SELF = "self-evaluation"
CRITIC = "critic"
SINK = "sink"
SOURCES = {"bad": CHECK, "sloppy": SELF, "dubious": CRITIC}
"""Which source rejects each kind of flaw."""


# -- the workload -------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """One run's workload, drawn from its seed."""

    seed: int
    workers: tuple[str, ...]
    tokens: int
    hops: int
    attempts: int
    every: int
    flaws: dict[tuple[int, int], str]
    """``(token, hop)`` -> the flaw of the output of the handler of that hop."""
    reviewed: frozenset[tuple[int, int]]
    """Hops whose handler also sends a review to the critic."""
    stubborn: dict[tuple[str, str], int]
    """``(worker, source)`` -> feedback from that source needed before the flaw is fixed."""

    @classmethod
    def draw(cls, seed: int) -> Plan:
        rng = random.Random(seed)
        workers = tuple(f"w{i}" for i in range(rng.randint(3, 5)))
        tokens = rng.randint(3, 7)
        hops = rng.randint(2, 6)
        attempts = rng.randint(1, 4)
        flaws: dict[tuple[int, int], str] = {}
        reviewed: set[tuple[int, int]] = set()
        for token in range(tokens):
            for hop in range(hops + 1):
                roll = rng.random()
                if roll < 0.06:
                    flaws[token, hop] = "bad"
                elif roll < 0.12:
                    flaws[token, hop] = "sloppy"
                elif roll < 0.18:
                    flaws[token, hop] = "dubious"
                if flaws.get((token, hop)) == "dubious" or rng.random() < 0.25:
                    reviewed.add((token, hop))
        # Mostly fixable within the policy's rollbacks; now and then one that outlasts it.
        stubborn = {
            (worker, source): attempts if rng.random() < 0.1 else rng.randint(0, attempts - 1)
            for worker in workers
            for source in SOURCES.values()
        }
        return cls(
            seed=seed,
            workers=workers,
            tokens=tokens,
            hops=hops,
            attempts=attempts,
            every=rng.randint(2, 7),
            flaws=flaws,
            reviewed=frozenset(reviewed),
            stubborn=stubborn,
        )

    def owner(self, token: int, hop: int) -> str:
        """The worker that handles ``hop`` of ``token``."""
        return self.workers[(token + hop) % len(self.workers)]

    def flaw(self, worker: str, token: int, hop: int, feedback: Sequence[Feedback]) -> str | None:
        """The flaw of this output, if the worker has not been told often enough yet."""
        flaw = self.flaws.get((token, hop))
        if flaw is None:
            return None
        source = SOURCES[flaw]
        told = sum(1 for item in feedback if item.source == source)
        return flaw if told < self.stubborn[worker, source] else None

    def sites(self) -> set[tuple[str, str]]:
        """``(worker, source)`` of every flawed output of the run."""
        return {
            (self.owner(token, hop), SOURCES[flaw]) for (token, hop), flaw in self.flaws.items()
        }

    def must_give_up(self) -> bool:
        """Whether some flawed site outlasts the retry policy."""
        return any(self.stubborn[site] >= self.attempts for site in self.sites())

    def describe(self) -> str:
        flawed = {f"{t}:{h}": f for (t, h), f in sorted(self.flaws.items())}
        stubborn = {f"{w}/{s}": n for (w, s), n in sorted(self.stubborn.items()) if n}
        return (
            f"{len(self.workers)} workers, {self.tokens} tokens x {self.hops + 1} hops, "
            f"attempts={self.attempts}, snapshot every {self.every}; flaws {flawed}; "
            f"stubborn {stubborn}"
        )


@dataclass
class Problems:
    """What a run broke: ``(kind, detail)`` pairs; the kinds are tallied across runs."""

    found: list[tuple[str, str]] = field(default_factory=list)

    def add(self, kind: str, detail: str = "") -> None:
        self.found.append((kind, detail))

    def __bool__(self) -> bool:
        return bool(self.found)

    def kinds(self) -> set[str]:
        return {kind for kind, _ in self.found}

    def lines(self) -> list[str]:
        return [f"{kind}: {detail}" if detail else kind for kind, detail in self.found]


@dataclass
class Observer:
    """What the test sees of a run, from inside its handlers and checks."""

    plan: Plan
    rng: random.Random
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """``("start", agent, message id)`` and ``("reject", agent, source)``, in order."""
    gave_up: bool = False
    """Set once ``run_until_idle`` raised ``RollbackExhausted``."""
    problems: Problems = field(default_factory=Problems)

    def started(self, agent: str, message: Message) -> None:
        self.events.append(("start", agent, message.id))
        if self.gave_up:
            self.problems.add(
                "a handler started after run_until_idle raised RollbackExhausted",
                f"{agent} took {message.id}",
            )
        payload = message.payload
        assert isinstance(payload, dict)
        for flaw in ("bad", "sloppy"):
            if payload.get(flaw):
                self.problems.add(
                    f"a handler took an output rejected as {flaw}",
                    f"{agent} took {message.id} {payload}",
                )
        if payload.get("dubious") and agent != CRITIC:
            self.problems.add("a dubious review reached an agent other than the critic", agent)

    def rejected(self, agent: str, source: str) -> None:
        self.events.append(("reject", agent, source))

    async def pause(self) -> None:
        if self.rng.random() < 0.6:
            await asyncio.sleep(self.rng.uniform(0, 0.002))


class WorkerState(AgentState):
    handled: list[list[int]] = Field(default_factory=list)
    """``[token, hop]`` of every hop handled, in order."""
    flawed: list[str] = Field(default_factory=list)
    """A flaw of a message handled (must stay empty)."""


class Worker(Agent[WorkerState]):
    """Handles one hop of a token and forwards it; sometimes asks the critic for a review."""

    def __init__(self, name: str, observer: Observer) -> None:
        super().__init__(name)
        self.observer = observer

    async def handle(self, message: Message, ctx: Context[WorkerState]) -> None:
        observer, plan = self.observer, self.observer.plan
        observer.started(self.name, message)
        payload = message.payload_as(dict[str, int | bool])
        token, hop = int(payload["token"]), int(payload["hop"])
        self.state.handled.append([token, hop])
        self.state.flawed.extend(f for f in ("bad", "sloppy") if payload.get(f))
        await observer.pause()
        flaw = plan.flaw(self.name, token, hop, ctx.feedback)
        out = {"token": token, "hop": hop + 1, "bad": flaw == "bad", "sloppy": flaw == "sloppy"}
        if hop < plan.hops:
            ctx.send(plan.owner(token, hop + 1), out, kind="work")
        else:
            ctx.send(SINK, out, kind="done")
        await observer.pause()
        if (token, hop) in plan.reviewed:
            review = {"token": token, "hop": hop, "dubious": flaw == "dubious"}
            ctx.send(CRITIC, review, kind="review")
            await observer.pause()

    async def evaluate(self, outputs: Sequence[Message], ctx: Context[WorkerState]) -> CheckResult:
        for output in outputs:
            payload = output.payload
            if isinstance(payload, dict) and payload.get("sloppy"):
                self.observer.rejected(self.name, SELF)
                return f"{output.id} is sloppy"
        return True


class CriticState(AgentState):
    reviewed: list[list[int]] = Field(default_factory=list)
    passed_dubious: int = 0


class Critic(Agent[CriticState]):
    """Rejects dubious reviews with ``ctx.reject``; records the others."""

    def __init__(self, observer: Observer) -> None:
        super().__init__(CRITIC)
        self.observer = observer

    async def handle(self, message: Message, ctx: Context[CriticState]) -> None:
        self.observer.started(self.name, message)
        payload = message.payload_as(dict[str, int | bool])
        await self.observer.pause()
        if payload["dubious"]:
            self.observer.rejected(message.src, CRITIC)
            ctx.reject(message.src, f"review {payload['token']}:{payload['hop']} is dubious")
        self.state.reviewed.append([int(payload["token"]), int(payload["hop"])])


class SinkState(AgentState):
    done: list[int] = Field(default_factory=list)
    flawed: list[str] = Field(default_factory=list)


class Sink(Agent[SinkState]):
    """Collects the tokens that made every hop."""

    def __init__(self, observer: Observer) -> None:
        super().__init__(SINK)
        self.observer = observer

    async def handle(self, message: Message, ctx: Context[SinkState]) -> None:
        self.observer.started(self.name, message)
        payload = message.payload_as(dict[str, int | bool])
        self.state.done.append(int(payload["token"]))
        self.state.flawed.extend(f for f in ("bad", "sloppy") if payload.get(f))
        await self.observer.pause()


# -- one run --------------------------------------------------------------------------------


@dataclass
class Outcome:
    seed: int
    plan: Plan
    gave_up: bool
    problems: Problems


async def check_snapshots(store: Store, run_id: str, problems: Problems) -> None:
    for snapshot in await store.list_snapshots(run_id):
        if snapshot.status is SnapshotStatus.COMPLETE:
            for problem in cut_problems(snapshot):
                problems.add("a stored complete snapshot is not a consistent cut", problem)
        elif snapshot.error and "not consistent" in snapshot.error:
            problems.add(
                "a snapshot failed for recording an inconsistent cut",
                f"snapshot {snapshot.seq}: {snapshot.error}",
            )


def check_final_states(runtime: Runtime, plan: Plan, problems: Problems) -> None:
    """The run went to its end: every hop handled once, nothing flawed kept."""
    handled: Counter[tuple[int, int]] = Counter()
    for name in plan.workers:
        state = runtime.agents[name].state
        assert isinstance(state, WorkerState)
        handled.update((t, h) for t, h in state.handled)
        if state.flawed:
            problems.add("a final state holds a rejected output", f"{name}: {state.flawed}")
    expected = Counter((t, h) for t in range(plan.tokens) for h in range(plan.hops + 1))
    if handled != expected:
        missing = sorted((expected - handled).elements())
        extra = sorted((handled - expected).elements())
        problems.add(
            "the final states do not hold every hop exactly once",
            f"missing {missing[:10]}, extra {extra[:10]}",
        )
    sink = runtime.agents[SINK].state
    assert isinstance(sink, SinkState)
    if sorted(sink.done) != list(range(plan.tokens)):
        problems.add(
            "the final states do not hold every token exactly once",
            f"done {sorted(sink.done)}, expected 0..{plan.tokens - 1}",
        )
    if sink.flawed:
        problems.add("a final state holds a rejected output", f"{SINK}: {sink.flawed}")
    critic = runtime.agents[CRITIC].state
    assert isinstance(critic, CriticState)
    reviewed = Counter((t, h) for t, h in critic.reviewed)
    if reviewed != Counter(plan.reviewed):
        problems.add(
            "the critic's final state does not hold every review exactly once",
            f"{sorted(reviewed.elements())}, expected {sorted(plan.reviewed)}",
        )


def check_gave_up(
    exhausted: RollbackExhausted, observer: Observer, plan: Plan, problems: Problems
) -> None:
    """The run gave up: within the policy, on a site that deserved it, and stopped at once."""
    site = (exhausted.agent, exhausted.source)
    if exhausted.attempts > plan.attempts:
        problems.add(
            "RollbackExhausted.attempts exceeds the policy",
            f"{exhausted.attempts} > {plan.attempts} for {site}",
        )
    if plan.stubborn.get(site, 0) < plan.attempts:
        problems.add(
            "gave up on a site that the policy's rollbacks would have fixed",
            f"{site} fixes its output after {plan.stubborn.get(site)} feedback(s), the policy "
            f"allows {plan.attempts - 1} rollback(s): rejections were counted that gave no "
            "feedback",
        )
    last = max(
        (i for i, event in enumerate(observer.events) if event == ("reject", *site)),
        default=None,
    )
    if last is None:
        problems.add("gave up on a site the workload never rejected", str(site))
        return
    after = [e for e in observer.events[last + 1 :] if e[0] == "start"]
    if after:
        problems.add(
            "a handler started after the rejection the run gave up on",
            f"{len(after)} after the last rejection of {site}: {after[:5]}",
        )


async def after_giving_up(runtime: Runtime, observer: Observer, problems: Problems) -> None:
    """Once the run gave up, input is refused and nothing is delivered any more."""
    started = len(observer.events)
    try:
        late = {"token": 0, "hop": 0, "bad": False, "sloppy": False}
        runtime.send(observer.plan.owner(0, 0), late, kind="work")
    except (RuntimeClosedError, RollbackExhausted):
        pass
    except Exception as exc:
        problems.add("runtime.send after giving up raised something else", repr(exc))
    else:
        problems.add("runtime.send after RollbackExhausted did not raise")
    for _ in range(5):
        await asyncio.sleep(0.001)
    try:
        async with asyncio.timeout(HANG):
            await runtime.run_until_idle()
    except TimeoutError:
        problems.add("run_until_idle after giving up hung")
    except RunError:
        pass
    else:
        problems.add("run_until_idle after RollbackExhausted returned normally")
    late_starts = [e for e in observer.events[started:] if e[0] == "start"]
    if late_starts:
        problems.add("delivered after the run gave up", str(late_starts[:5]))


def check_rollbacks(runtime: Runtime, plan: Plan, problems: Problems) -> None:
    allowed = plan.attempts - 1
    per_site = Counter((r.agent, r.source) for r in runtime.rollbacks)
    for site, count in per_site.items():
        if count > allowed:
            problems.add("more rollbacks for a site than the policy allows", f"{count} for {site}")
    for info in runtime.rollbacks:
        if info.attempt > allowed:
            problems.add(
                "a rollback's attempt number exceeds the policy",
                f"attempt {info.attempt} for {(info.agent, info.source)}, allowed {allowed}",
            )


async def one_run(seed: int, store: Store) -> Outcome:
    plan = Plan.draw(seed)
    observer = Observer(plan, random.Random(seed ^ 0x5EED))
    problems = observer.problems
    runtime = Runtime(
        store=store,
        snapshot_policy=SnapshotPolicy(every_deliveries=plan.every),
        retry=RetryPolicy.attempts(plan.attempts),
    )

    def no_bad(message: Message) -> CheckResult:
        payload = message.payload
        if isinstance(payload, dict) and payload.get("bad"):
            observer.rejected(message.src, CHECK)
            return f"{message.id} is marked bad"
        return True

    exhausted: RollbackExhausted | None = None
    try:
        async with runtime:
            for name in plan.workers:
                runtime.add(Worker(name, observer))
                runtime.check(name, check=no_bad, name=CHECK)
            runtime.add(Critic(observer))
            runtime.add(Sink(observer))
            for token in range(plan.tokens):
                first = {"token": token, "hop": 0, "bad": False, "sloppy": False}
                runtime.send(plan.owner(token, 0), first, kind="work")
            try:
                async with asyncio.timeout(HANG):
                    await runtime.run_until_idle()
            except RollbackExhausted as exc:
                observer.gave_up = True
                exhausted = exc
            except TimeoutError:
                problems.add("run_until_idle hung")
            if exhausted is not None:
                check_gave_up(exhausted, observer, plan, problems)
                await after_giving_up(runtime, observer, problems)
            elif not problems:
                check_final_states(runtime, plan, problems)
            check_rollbacks(runtime, plan, problems)
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-3:]
        frames = " <- ".join(
            f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(where)
        )
        problems.add("the run raised", f"{type(exc).__name__}: {exc} (at {frames})")
    if exhausted is None and not problems and plan.must_give_up():
        problems.add("a site outlasted the retry policy, yet the run did not give up")
    if exhausted is not None or not problems:
        status = (await store.get_run(runtime.run_id)).status
        wanted = RunStatus.FAILED if exhausted is not None else RunStatus.SUCCEEDED
        if status is not wanted:
            problems.add("wrong run status", f"{status.value}, expected {wanted.value}")
    await check_snapshots(store, runtime.run_id, problems)
    return Outcome(seed, plan, exhausted is not None, problems)


def seeds(batch: int, runs: int) -> list[int]:
    rng = random.Random(f"{BASE_SEED}:{batch}")
    return [rng.randrange(2**31) for _ in range(runs)]


def report(outcomes: list[Outcome], where: str) -> None:
    """Fail with the failure rate of each kind of problem and the first failing seeds."""
    broken = [o for o in outcomes if o.problems]
    if not broken:
        return
    kinds: Counter[str] = Counter()
    for outcome in broken:
        kinds.update(outcome.problems.kinds())
    lines = [
        f"{len(broken)} of {len(outcomes)} runs on {where} broke a guarantee "
        f"({sum(o.gave_up for o in outcomes)} of them gave up); replay the workloads with "
        f"AGENTSNAP_GUARANTEE_SEED={BASE_SEED}",
        "runs per kind of problem:",
        *(f"  {count:4d}  {kind}" for kind, count in kinds.most_common()),
    ]
    for outcome in broken[:5]:
        lines.append(f"seed {outcome.seed}: {outcome.plan.describe()}")
        lines.extend(f"    {line}" for line in outcome.problems.lines()[:8])
    pytest.fail("\n".join(lines), pytrace=False)


def runs_per(batches: int, runs: int) -> list[int]:
    return [runs // batches + (1 if i < runs % batches else 0) for i in range(batches)]


@pytest.mark.parametrize("batch", range(BATCHES))
async def test_guarantees_hold_under_random_interleavings(batch: int) -> None:
    outcomes = [
        await one_run(seed, MemoryStore()) for seed in seeds(batch, runs_per(BATCHES, RUNS)[batch])
    ]
    report(outcomes, "MemoryStore")


@pytest.mark.parametrize("batch", range(SQLITE_BATCHES))
async def test_guarantees_hold_on_sqlite(batch: int, tmp_path: Path) -> None:
    outcomes: list[Outcome] = []
    for seed in seeds(1000 + batch, runs_per(SQLITE_BATCHES, SQLITE_RUNS)[batch]):
        store = SqlStore(f"sqlite:///{tmp_path / f'{seed}.db'}")
        try:
            outcomes.append(await one_run(seed, store))
        finally:
            await store.close()
    report(outcomes, "SQLite")


def test_the_workload_gives_up_sometimes_and_not_always() -> None:
    # Both branches of the checks above must be exercised by the seeds drawn.
    plans = [Plan.draw(seed) for seed in seeds(0, 200)]
    giving_up = sum(plan.must_give_up() for plan in plans)
    assert 20 < giving_up < 180, giving_up
    assert sum(bool(plan.flaws) for plan in plans) > 150


# -- a handler that catches what it should not -------------------------------------------


class WriterState(AgentState):
    sent: int = 0


class Swallower(Agent[WriterState]):
    """Sends a bad draft first, a good one once told; catches around ``ctx.send``."""

    def __init__(self, name: str, catch: type[BaseException]) -> None:
        super().__init__(name)
        self.catch = catch

    async def handle(self, message: Message, ctx: Context[WriterState]) -> None:
        self.state.sent += 1
        draft: dict[str, Any] = {"good": bool(ctx.feedback), "n": self.state.sent}
        # Written the way application code does it, not with contextlib.suppress.
        try:  # noqa: SIM105
            ctx.send("reader", draft, kind="draft")
        except self.catch:
            pass
        # Give the reader every chance to take what was sent before this handler returns.
        for _ in range(5):
            await asyncio.sleep(0.001)
        ctx.send("reader", {"good": True, "n": -1}, kind="note")


class ReaderState(AgentState):
    got: list[dict[str, Any]] = Field(default_factory=list)


class Reader(Agent[ReaderState]):
    def __init__(self, name: str, seen: list[dict[str, Any]]) -> None:
        super().__init__(name)
        self.seen = seen

    async def handle(self, message: Message, ctx: Context[ReaderState]) -> None:
        payload = message.payload
        assert isinstance(payload, dict)
        self.seen.append(dict(payload))
        self.state.got.append(dict(payload))


@pytest.mark.parametrize("catch", [Exception, BaseException], ids=["Exception", "BaseException"])
async def test_a_handler_cannot_swallow_a_rejection(catch: type[BaseException]) -> None:
    seen: list[dict[str, Any]] = []
    runtime = Runtime(retry=RetryPolicy.attempts(3))
    async with runtime:
        runtime.add(Swallower("writer", catch))
        runtime.add(Reader("reader", seen))
        runtime.check(
            "writer",
            kind="draft",
            check=lambda m: get(m.payload, "good", bool) or "not good",
            name="good-drafts",
        )
        runtime.send("writer", {}, kind="go")
        async with asyncio.timeout(HANG):
            await runtime.run_until_idle(raise_failures=False)
        rollbacks = runtime.rollbacks
        final = runtime.agents["reader"].state
        assert isinstance(final, ReaderState)
    bad = [p for p in seen if not p["good"]]
    assert bad == [], f"the reader took a rejected draft: {bad}"
    assert [(r.agent, r.source) for r in rollbacks] == [("writer", "good-drafts")], rollbacks
    assert [p["good"] for p in final.got] == [True, True]


# -- after the run gave up -----------------------------------------------------------------


class PingState(AgentState):
    count: int = 0


class Ping(Agent[PingState]):
    """Bounces a ball with its partner forever, so there is always something to deliver."""

    def __init__(self, name: str, partner: str, deliveries: list[str]) -> None:
        super().__init__(name)
        self.partner = partner
        self.deliveries = deliveries

    async def handle(self, message: Message, ctx: Context[PingState]) -> None:
        self.deliveries.append(f"{self.name}:{message.id}")
        self.state.count += 1
        await asyncio.sleep(0)
        ctx.send(self.partner, {"ball": self.state.count}, kind="ball")


class Stubborn(Agent[WriterState]):
    """Always sends a bad draft, whatever it is told."""

    def __init__(self, name: str, deliveries: list[str]) -> None:
        super().__init__(name)
        self.deliveries = deliveries

    async def handle(self, message: Message, ctx: Context[WriterState]) -> None:
        self.deliveries.append(f"{self.name}:{message.id}")
        self.state.sent += 1
        await asyncio.sleep(0.001)
        ctx.send("ping", {"bad": True}, kind="draft")


@pytest.mark.parametrize("attempts", [1, 2, 3])
async def test_after_giving_up_nothing_is_delivered_and_send_raises(attempts: int) -> None:
    deliveries: list[str] = []
    store = MemoryStore()
    runtime = Runtime(
        store=store,
        retry=RetryPolicy.attempts(attempts),
        snapshot_policy=SnapshotPolicy(every_deliveries=3),
    )
    async with runtime:
        runtime.add(Ping("ping", "pong", deliveries))
        runtime.add(Ping("pong", "ping", deliveries))
        runtime.add(Stubborn("writer", deliveries))
        runtime.check("writer", kind="draft", check=lambda m: False, name="never")
        runtime.send("ping", {"ball": 0}, kind="ball")
        runtime.send("writer", {}, kind="go")
        with pytest.raises(RollbackExhausted) as raised:
            async with asyncio.timeout(HANG):
                await runtime.run_until_idle()
        assert raised.value.attempts <= attempts
        assert (raised.value.agent, raised.value.source) == ("writer", "never")
        assert len(runtime.rollbacks) <= attempts - 1
        delivered = len(deliveries)
        with pytest.raises((RuntimeClosedError, RollbackExhausted)):
            runtime.send("ping", {"ball": -1}, kind="ball")
        for _ in range(20):
            await asyncio.sleep(0.001)
        with pytest.raises(RunError):
            async with asyncio.timeout(HANG):
                await runtime.run_until_idle()
        assert deliveries[delivered:] == [], "delivered after the run gave up"
    assert (await store.get_run(runtime.run_id)).status is RunStatus.FAILED
