"""Property tests: snapshots taken under seeded random schedules are consistent cuts.

Tellers on a topology (ring, star, full mesh or a random directed graph) move money to their
out-neighbours while one to five snapshots, from random initiators, start at random points of a
run driven step by step by a `SeededScheduler`. Every snapshot must complete, be a consistent
cut, and conserve money: the recorded balances plus the transfers recorded in flight add up to
the initial total.

Everything random in a run (topology, balances, amounts, where snapshots start, the delivery
order) is derived from the drawn seed, so a failure is replayed with the parameters it prints:
``await run_bank(Scenario(seed=..., topology=..., agents=..., snapshots=..., transfers=...))``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from payloads import get

from agentsnap import (
    ENVIRONMENT,
    Agent,
    AgentState,
    Context,
    Message,
    Runtime,
    Snapshot,
    SnapshotFailed,
    SnapshotHandle,
    SnapshotPolicy,
    SnapshotStatus,
)
from agentsnap.bus import Channel
from agentsnap.testing import SeededScheduler, bus_of, cut_problems

TOPOLOGIES = ("ring", "star", "mesh", "random")
MAX_AMOUNT = 50

seeds = st.integers(min_value=0, max_value=2**32 - 1)


class AccountState(AgentState):
    balance: int


class Teller(Agent[AccountState]):
    """On ``go`` sends part of its balance to an out-neighbour; ``transfer`` adds the amount."""

    def __init__(
        self,
        name: str,
        balance: int,
        peers: list[str],
        rng: random.Random,
        on_new_peer: Callable[[str, str], None] | None = None,
    ) -> None:
        super().__init__(name, AccountState(balance=balance))
        self.peers = peers
        self.rng = rng
        self.contacted: set[str] = set()
        self.on_new_peer = on_new_peer

    def pick_peer(self) -> str:
        return self.rng.choice(self.peers)

    async def handle(self, message: Message, ctx: Context[AccountState]) -> None:
        if message.kind == "transfer":
            self.state.balance += message.payload_as(dict[str, int])["amount"]
        elif message.kind == "go" and self.peers and self.state.balance > 0:
            amount = self.rng.randint(1, min(self.state.balance, MAX_AMOUNT))
            peer = self.pick_peer()
            if peer not in self.contacted:
                self.contacted.add(peer)
                if self.on_new_peer is not None:
                    self.on_new_peer(self.name, peer)
            self.state.balance -= amount
            ctx.send(peer, {"amount": amount}, kind="transfer")


class Explorer(Teller):
    """A teller that prefers peers it has never paid, so channels keep appearing."""

    def pick_peer(self) -> str:
        fresh = [peer for peer in self.peers if peer not in self.contacted]
        return self.rng.choice(fresh or self.peers)


def build_topology(kind: str, names: list[str], rng: random.Random) -> dict[str, list[str]]:
    """Out-neighbours of every agent."""
    n = len(names)
    if kind == "ring":
        return {name: [names[(i + 1) % n]] for i, name in enumerate(names)}
    if kind == "star":
        hub, *leaves = names
        return {hub: list(leaves), **{leaf: [hub] for leaf in leaves}}
    if kind == "mesh":
        return {name: [peer for peer in names if peer != name] for name in names}
    assert kind == "random", kind
    density = rng.uniform(0.05, 0.6)
    return {
        name: [peer for peer in names if peer != name and rng.random() < density] for name in names
    }


@dataclass(frozen=True)
class Scenario:
    seed: int
    topology: str
    agents: int
    snapshots: int
    transfers: int

    def __str__(self) -> str:
        return (
            f"seed={self.seed} topology={self.topology} agents={self.agents} "
            f"snapshots={self.snapshots} transfers={self.transfers}"
        )


@dataclass
class Outcome:
    total: int
    graph: dict[str, list[str]]
    initiators: list[str]
    handles: list[SnapshotHandle]
    snapshots: list[Snapshot]
    final_balances: dict[str, int]
    steps: int
    new_channels_during_snapshot: int = 0


async def run_bank(
    scenario: Scenario,
    *,
    graph: dict[str, list[str]] | None = None,
    idle: tuple[str, ...] = (),
    explorers: bool = False,
) -> Outcome:
    """Run tellers under a seeded schedule with snapshots started at random points.

    Args:
        scenario: What to run; everything random derives from ``scenario.seed``.
        graph: Out-neighbours to use instead of ``scenario.topology``.
        idle: Agents never sent any work (only markers ever reach them).
        explorers: Use `Explorer` tellers, and open with a transfer on a fresh channel made
            by an agent that recorded while the snapshot is still in progress.
    """
    rng = random.Random(scenario.seed)
    scheduler = SeededScheduler(scenario.seed)
    names = [f"a{i}" for i in range(scenario.agents)]
    if graph is None:
        graph = build_topology(scenario.topology, names, rng)
    names = list(graph)
    workers = [name for name in names if name not in idle]
    initiators: list[str] = []
    handles: list[SnapshotHandle] = []
    new_during_snapshot = 0

    # No start or end snapshot: the snapshots stored are exactly the ones started here.
    policy = SnapshotPolicy(at_start=False, at_end=False)
    async with Runtime(scheduler=scheduler, snapshot_policy=policy) as runtime:

        def on_new_peer(src: str, dst: str) -> None:
            nonlocal new_during_snapshot
            assert (src, dst) not in bus_of(runtime).channels, f"{scenario}: {src}>{dst} exists"
            if runtime.snapshots_in_progress:
                new_during_snapshot += 1

        kind = Explorer if explorers else Teller
        for name in names:
            teller_rng = random.Random(rng.getrandbits(64))
            runtime.add(kind(name, rng.randint(1, 200), graph[name], teller_rng, on_new_peer))
        total = sum(agent.state.balance for agent in runtime.agents.values())

        def start_snapshot(initiator: str | None) -> None:
            handles.append(runtime.snapshot(initiator=initiator))
            initiators.append(initiator or ENVIRONMENT)

        snapshots_left = scenario.snapshots
        if explorers and workers:
            # The first worker gets work, then records (as initiator) before handling it: the
            # transfer it makes goes on a channel created after its cut, during the snapshot.
            first = workers[0]
            runtime.send(first, kind="go")
            start_snapshot(first)
            snapshots_left -= 1
            await scheduler.deliver_from(bus_of(runtime).channels[ENVIRONMENT, first])

        actions = ["go"] * scenario.transfers + ["snapshot"] * snapshots_left
        rng.shuffle(actions)
        for action in actions:
            if action == "go" and workers:
                runtime.send(rng.choice(workers), kind="go")
            elif action == "snapshot":
                start_snapshot(rng.choice([None, *names]))
            for _ in range(rng.randint(0, 8)):
                if not await scheduler.step():
                    break
        await runtime.run_until_idle()
        snapshots = await runtime.list_snapshots()
        final = {name: agent.state.balance for name, agent in runtime.agents.items()}
        return Outcome(
            total=total,
            graph=graph,
            initiators=initiators,
            handles=handles,
            snapshots=snapshots,
            final_balances=final,
            steps=scheduler.steps,
            new_channels_during_snapshot=new_during_snapshot,
        )


def money_in(snapshot: Snapshot) -> int:
    """Recorded balances plus the amounts of transfers recorded in flight."""
    total = sum(
        get(cut.state, "balance", int)
        for name, cut in snapshot.agents.items()
        if name != ENVIRONMENT
    )
    for channel in snapshot.channels:
        total += sum(
            get(m.payload, "amount", int) for m in channel.messages if m.kind == "transfer"
        )
    return total


def check_outcome(outcome: Outcome, context: str) -> None:
    """Every snapshot started completed, is a consistent cut and conserves money."""
    note(context)
    note(f"graph={outcome.graph}")
    started = len(outcome.handles)
    assert len(outcome.snapshots) == started, (
        f"{context}: {started} snapshots started, {len(outcome.snapshots)} stored"
    )
    assert sum(outcome.final_balances.values()) == outcome.total, (
        f"{context}: money changed by the run itself: {outcome.final_balances}"
    )
    processes = {ENVIRONMENT, *outcome.graph}
    for number, (snapshot, handle, initiator) in enumerate(
        zip(outcome.snapshots, outcome.handles, outcome.initiators, strict=True), start=1
    ):
        where = f"{context} snapshot={snapshot.seq}"
        assert snapshot.seq == number, f"{where}: stored out of order"
        assert snapshot.initiator == initiator, f"{where}: initiator {snapshot.initiator}"
        assert snapshot.status is SnapshotStatus.COMPLETE, (
            f"{where}: {snapshot.status}: {snapshot.error}"
        )
        assert handle.done(), f"{where}: handle still pending after run_until_idle"
        assert handle.result().id == snapshot.id, f"{where}: handle resolved to another one"
        assert set(snapshot.agents) == processes, f"{where}: processes {set(snapshot.agents)}"
        assert snapshot.agents[ENVIRONMENT].state == {}, f"{where}: $env has a state"
        problems = cut_problems(snapshot)
        assert problems == [], f"{where}: not a consistent cut: {problems}"
        for channel in snapshot.channels:
            assert channel.src == ENVIRONMENT or channel.dst in outcome.graph[channel.src], (
                f"{where}: in flight on {channel.src}>{channel.dst}, not an edge"
            )
            for message in channel.messages:
                # Only what the sender sent before recording can be in flight.
                assert message.epoch < snapshot.seq, f"{where}: {message.id} sent after the cut"
        found = money_in(snapshot)
        assert found == outcome.total, (
            f"{where}: recorded money {found} != initial total {outcome.total}; "
            f"in flight: {[(c.src, c.dst, [m.seq for m in c.messages]) for c in snapshot.channels]}"
        )


@settings(max_examples=100, deadline=None)
@given(
    seed=seeds,
    topology=st.sampled_from(TOPOLOGIES),
    agents=st.integers(min_value=2, max_value=20),
    snapshots=st.integers(min_value=1, max_value=5),
    transfers=st.integers(min_value=0, max_value=60),
)
async def test_snapshots_are_consistent_and_conserve_money(
    seed: int, topology: str, agents: int, snapshots: int, transfers: int
) -> None:
    scenario = Scenario(seed, topology, agents, snapshots, transfers)
    outcome = await run_bank(scenario)
    check_outcome(outcome, str(scenario))


def fingerprint(outcome: Outcome) -> list[Any]:
    """What a run recorded, without the ids and times that differ between runs."""
    prints: list[Any] = [outcome.total, outcome.final_balances, outcome.steps]
    for snapshot in outcome.snapshots:
        agents = {
            name: (cut.state_json, cut.sent, cut.received) for name, cut in snapshot.agents.items()
        }
        channels = [(c.src, c.dst, [m.model_dump() for m in c.messages]) for c in snapshot.channels]
        prints.append((snapshot.seq, snapshot.initiator, snapshot.status, agents, channels))
    return prints


@settings(max_examples=15, deadline=None)
@given(
    seed=seeds,
    topology=st.sampled_from(TOPOLOGIES),
    agents=st.integers(min_value=2, max_value=12),
    snapshots=st.integers(min_value=1, max_value=5),
)
async def test_same_seed_replays_the_same_run(
    seed: int, topology: str, agents: int, snapshots: int
) -> None:
    scenario = Scenario(seed, topology, agents, snapshots, transfers=40)
    note(str(scenario))
    first = fingerprint(await run_bank(scenario))
    second = fingerprint(await run_bank(scenario))
    assert first == second, f"{scenario}: two runs with the same seed differ"
    # The seed is what decides the interleaving: the scheduler's own draws replay too.
    a, b = SeededScheduler(seed), SeededScheduler(seed)
    assert [a.random.random() for _ in range(5)] == [b.random.random() for _ in range(5)]


@settings(max_examples=30, deadline=None)
@given(
    seed=seeds,
    chain=st.integers(min_value=1, max_value=5),
    silent=st.integers(min_value=1, max_value=5),
    snapshots=st.integers(min_value=1, max_value=5),
)
async def test_snapshots_complete_when_the_graph_is_not_strongly_connected(
    seed: int, chain: int, silent: int, snapshots: int
) -> None:
    # c0 -> c1 -> ... -> ck-1 -> sink: money flows one way only. "sink" and the "busy-*"
    # agents get work but have nobody to pay; the "quiet-*" agents never get anything but
    # markers. Initiators are drawn among all of them.
    chain_names = [f"c{i}" for i in range(chain)]
    graph: dict[str, list[str]] = {
        name: [chain_names[i + 1] if i + 1 < chain else "sink"]
        for i, name in enumerate(chain_names)
    }
    graph["sink"] = []
    busy = [f"busy-{i}" for i in range(silent)]
    quiet = [f"quiet-{i}" for i in range(silent)]
    for name in busy + quiet:
        graph[name] = []
    scenario = Scenario(seed, "chain+silent", len(graph), snapshots, transfers=30)
    outcome = await run_bank(scenario, graph=graph, idle=tuple(quiet))
    context = f"{scenario} chain={chain} silent={silent}"
    check_outcome(outcome, context)
    for snapshot in outcome.snapshots:
        for name in busy + quiet + ["sink"]:
            assert snapshot.agents[name].sent == {}, f"{context}: {name} never sends"
        for name in quiet:
            cut = snapshot.agents[name]
            assert cut.received == {ENVIRONMENT: 0}, f"{context}: {name} received {cut.received}"
        assert all(c.dst not in quiet for c in snapshot.channels), f"{context}: quiet in flight"


@settings(max_examples=40, deadline=None)
@given(
    seed=seeds,
    agents=st.integers(min_value=2, max_value=10),
    snapshots=st.integers(min_value=1, max_value=5),
    transfers=st.integers(min_value=1, max_value=60),
)
async def test_channels_created_during_a_snapshot_keep_it_consistent(
    seed: int, agents: int, snapshots: int, transfers: int
) -> None:
    scenario = Scenario(seed, "mesh", agents, snapshots, transfers)
    outcome = await run_bank(scenario, explorers=True)
    check_outcome(outcome, f"{scenario} explorers")
    assert outcome.new_channels_during_snapshot >= 1, (
        f"{scenario}: no channel was created while a snapshot was in progress"
    )
    # Snapshots taken while channels appeared do not list the later ones in the cut.
    first = outcome.snapshots[0]
    assert first.agents[ENVIRONMENT].sent["a0"] == 1, f"{scenario}: {first.agents}"
    assert first.agents["a0"].sent == {}, f"{scenario}: a0 recorded before paying anyone"


class SleepyTeller(Teller):
    """A teller whose handlers await a little at random, so they interleave for real."""

    async def handle(self, message: Message, ctx: Context[AccountState]) -> None:
        pause = self.rng.choice((0.0, 0.0, 0.001, 0.003))
        if pause:
            await asyncio.sleep(pause)
        await super().handle(message, ctx)


async def run_bank_concurrently(scenario: Scenario, *, rollbacks: int) -> Outcome:
    """Tellers on the default scheduler: snapshots (several at once) and rollbacks at random.

    Handlers sleep at random, so snapshots find agents inside handlers, channels empty or
    not, receivers recorded or not, in orders no scripted schedule chooses. Only the
    workload is drawn from the seed; the interleaving is the event loop's.
    """
    rng = random.Random(scenario.seed)
    names = [f"a{i}" for i in range(scenario.agents)]
    graph = build_topology(scenario.topology, names, rng)
    handles: list[SnapshotHandle] = []
    policy = SnapshotPolicy(at_start=False, at_end=False)
    async with Runtime(snapshot_policy=policy) as runtime:
        for name in names:
            teller_rng = random.Random(rng.getrandbits(64))
            runtime.add(SleepyTeller(name, rng.randint(1, 200), graph[name], teller_rng))
        total = sum(agent.state.balance for agent in runtime.agents.values())
        await runtime.snapshot()  # a cut to roll back to from the start
        actions = (
            ["go"] * scenario.transfers
            + ["snapshot"] * scenario.snapshots
            + ["rollback"] * rollbacks
        )
        rng.shuffle(actions)
        for action in actions:
            if action == "go":
                runtime.send(rng.choice(names), kind="go")
            elif action == "snapshot":
                handles.append(runtime.snapshot(initiator=rng.choice([None, *names])))
            else:
                await runtime.rollback(reason="a rollback drawn by the test")
            await asyncio.sleep(rng.choice((0.0, 0.0, 0.001)))
        await runtime.run_until_idle()
        for handle in handles:
            with contextlib.suppress(SnapshotFailed):  # a rollback may abandon it
                await handle
        snapshots = await runtime.list_snapshots()
        final = {name: agent.state.balance for name, agent in runtime.agents.items()}
    return Outcome(
        total=total,
        graph=graph,
        initiators=[],
        handles=handles,
        snapshots=snapshots,
        final_balances=final,
        steps=0,
    )


@settings(max_examples=40, deadline=None)
@given(
    seed=seeds,
    topology=st.sampled_from(TOPOLOGIES),
    agents=st.integers(min_value=2, max_value=12),
    snapshots=st.integers(min_value=1, max_value=12),
    transfers=st.integers(min_value=0, max_value=60),
    rollbacks=st.integers(min_value=0, max_value=2),
)
async def test_cuts_are_consistent_on_the_default_scheduler(
    seed: int, topology: str, agents: int, snapshots: int, transfers: int, rollbacks: int
) -> None:
    scenario = Scenario(seed, topology, agents, snapshots, transfers)
    context = f"{scenario} rollbacks={rollbacks}"
    note(context)
    outcome = await run_bank_concurrently(scenario, rollbacks=rollbacks)
    assert sum(outcome.final_balances.values()) == outcome.total, context
    complete = [s for s in outcome.snapshots if s.status is SnapshotStatus.COMPLETE]
    assert complete, f"{context}: not even the first snapshot completed"
    for snapshot in outcome.snapshots:
        where = f"{context} snapshot={snapshot.seq}"
        if snapshot.status is not SnapshotStatus.COMPLETE:
            # Only a rollback abandons a snapshot here; an inconsistent cut is never stored.
            assert "not consistent" not in (snapshot.error or ""), f"{where}: {snapshot.error}"
            continue
        assert cut_problems(snapshot) == [], where
        assert set(snapshot.agents) == {ENVIRONMENT, *outcome.graph}, where
        assert money_in(snapshot) == outcome.total, where
    if not rollbacks:
        # Nothing abandons a snapshot: every one started completed.
        for handle in outcome.handles:
            assert handle.result().status is SnapshotStatus.COMPLETE, context


@pytest.mark.parametrize("seed", range(6))
async def test_agents_at_rest_record_without_a_marker_and_cuts_keep_what_crossed(
    seed: int,
) -> None:
    # On the default scheduler an agent that waits for work records as a snapshot starts,
    # and nothing is put on the channels to it; its senders, some inside handlers that send
    # after the cut began, still reach it, and what they sent before recording must be in
    # the cut, in flight.
    rng = random.Random(seed)
    names = [f"a{i}" for i in range(8)]
    policy = SnapshotPolicy(at_start=False, at_end=False)
    markers: list[tuple[str, str, int]] = []
    handles: list[SnapshotHandle] = []
    async with Runtime(snapshot_policy=policy) as runtime:
        for name in names:
            peers = [peer for peer in names if peer != name]
            runtime.add(SleepyTeller(name, 100, peers, random.Random(rng.getrandbits(64))))
        total = 100 * len(names)
        await runtime.snapshot()
        post_marker = bus_of(runtime).post_marker

        def counting(channel: Channel, snapshot: int) -> None:
            markers.append((channel.src, channel.dst, snapshot))
            post_marker(channel, snapshot)

        bus_of(runtime).post_marker = counting  # type: ignore[method-assign]
        for _ in range(30):
            for _ in range(rng.randint(0, 3)):
                runtime.send(rng.choice(names), kind="go")
            await asyncio.sleep(rng.choice((0.0, 0.001, 0.002)))
            handles.append(runtime.snapshot())
        await runtime.run_until_idle()
        snapshots = [await handle for handle in handles]
        assert sum(agent.state.balance for agent in runtime.agents.values()) == total
    crossed = 0
    for snapshot in snapshots:
        assert snapshot.status is SnapshotStatus.COMPLETE
        assert cut_problems(snapshot) == [], snapshot.seq
        assert money_in(snapshot) == total, snapshot.seq
        crossed += sum(len(channel.messages) for channel in snapshot.channels)
    woken = {(dst, seq) for src, dst, seq in markers if src == ENVIRONMENT}
    at_rest = len(names) * len(snapshots) - len(woken)
    assert at_rest > 0, "no agent was at rest when a snapshot started"
    assert crossed > 0, "no transfer crossed a cut"
