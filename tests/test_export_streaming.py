"""``write_export`` and ``JournalReader``: the export written as it is read, page by page,
is exactly the document ``export_run`` builds."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_export import Relay, make_run

from agentsnap import JournalSegment, MemoryStore, RunInfo, Runtime, Snapshot, Store
from agentsnap.cli import main
from agentsnap.inspect import export_run, snapshots_table, write_export
from agentsnap.journal import JournalReader, read_journal
from agentsnap.records import SnapshotSummary
from agentsnap.store.sql import SqlStore


async def streamed(store: Store, run_id: str, indent: int | None, page: int = 100) -> str:
    pieces: list[str] = []
    await write_export(store, run_id, pieces.append, indent=indent, page=page)
    return "".join(pieces)


def dumped(document: dict[str, Any], indent: int | None) -> str:
    return json.dumps(document, indent=indent, ensure_ascii=False)


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    opened: Store = (
        MemoryStore()
        if request.param == "memory"
        else SqlStore(f"sqlite:///{tmp_path / 'runs.db'}")
    )
    yield opened
    await opened.close()


@pytest.mark.parametrize("journal", [True, False])
async def test_the_streamed_export_is_the_document_byte_for_byte(
    store: Store, journal: bool
) -> None:
    run_id = await make_run(store, journal=journal)
    document = await export_run(store, run_id)
    assert ("messages" in document) is journal
    for indent in (None, 0, 2, 4):
        for page in (1, 2, 100):
            assert await streamed(store, run_id, indent, page) == dumped(document, indent)


async def test_a_run_with_many_snapshots_streams_the_same_document(store: Store) -> None:
    async with Runtime(store=store, journal=True) as runtime:
        runtime.add(Relay("ann", ["bea"], random.Random(1)))
        runtime.add(Relay("bea", ["ann"], random.Random(2)))
        for i in range(230):  # more than two pages of 100
            runtime.send("ann", i % 3)
            await runtime.run_until_idle()
            await runtime.snapshot()
    document = await export_run(store, runtime.run_id)
    assert len(document["snapshots"]) >= 230
    assert len(document["messages"]) == sum(i % 3 + 1 for i in range(230))
    for indent in (None, 2):
        assert await streamed(store, runtime.run_id, indent) == dumped(document, indent)


async def test_an_empty_run_streams_the_same_document(store: Store) -> None:
    await store.create_run(RunInfo(id="e" * 32, metadata={"k": [1, {"x": None}]}))
    document = await export_run(store, "e" * 32)
    assert document["snapshots"] == []
    for indent in (None, 0, 3):
        assert await streamed(store, "e" * 32, indent) == dumped(document, indent)


def test_the_cli_writes_the_document_export_run_builds(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"

    async def build() -> tuple[str, dict[str, Any]]:
        store = SqlStore(db)
        try:
            run_id = await make_run(store, journal=True, seed=11)
            return run_id, await export_run(store, run_id)
        finally:
            await store.close()

    run_id, document = asyncio.run(build())
    for extra in ([], ["--indent", "2"]):
        result = CliRunner().invoke(main, ["export", run_id, "--db", db, *extra])
        assert result.exit_code == 0, result.output
        indent = 2 if extra else None
        assert result.output == dumped(document, indent) + "\n"


# -- the journal, read in pages -----------------------------------------------------------


def send(src: str, dst: str, seqs: list[int], at: list[int]) -> JournalSegment:
    columns = {
        "seq": seqs,
        "kind": [f"k{s}" for s in seqs],
        "payload": [{"s": s, "t": "é"} for s in seqs],
        "epoch": 0,
        "at": at,
        "headers": {"0": {"h": "v"}},
    }
    return JournalSegment(src, dst, "send", seqs[0], seqs[-1], json.dumps(columns))


def deliver(src: str, dst: str, seqs: list[int], at: list[int]) -> JournalSegment:
    return JournalSegment(
        src, dst, "deliver", seqs[0], seqs[-1], json.dumps({"seq": seqs, "at": at})
    )


def random_journal(rng: random.Random) -> list[JournalSegment]:
    """Flushes of interleaved channels, deliveries late or never, numbers reused (rollbacks),
    and a clock that sometimes steps back or ticks coarsely."""
    channels = [("$env", "a"), ("a", "b"), ("b", "a"), ("b", "c")]
    clock = 1_000_000
    next_seq = dict.fromkeys(channels, 1)
    undelivered: list[tuple[tuple[str, str], int]] = []
    segments: list[JournalSegment] = []
    for _ in range(rng.randint(1, 12)):
        flush: list[JournalSegment] = []
        for channel in rng.sample(channels, rng.randint(1, len(channels))):
            count = rng.randint(1, 5)
            seqs, at = [], []
            for _ in range(count):
                clock += rng.choice([0, 0, 1, 7, 50, -30])
                seqs.append(next_seq[channel])
                at.append(clock)
                undelivered.append((channel, next_seq[channel]))
                next_seq[channel] += 1
            flush.append(send(*channel, seqs, at))
            if rng.random() < 0.2:  # a rollback: the channel's numbers start again lower
                next_seq[channel] = max(1, next_seq[channel] - rng.randint(1, 4))
        rng.shuffle(undelivered)
        taken = [undelivered.pop() for _ in range(rng.randint(0, len(undelivered)))]
        by_channel: dict[tuple[str, str], list[int]] = {}
        for channel, seq in taken:
            by_channel.setdefault(channel, []).append(seq)
        for channel, seqs in by_channel.items():
            at = []
            for _ in seqs:
                clock += rng.choice([1, 3, -2])
                at.append(clock)
            flush.append(deliver(*channel, seqs, at))
        segments.extend(flush)
    return segments


@pytest.mark.parametrize("seed", range(40))
async def test_the_journal_read_in_pages_is_read_journal(seed: int) -> None:
    rng = random.Random(seed)
    segments = random_journal(rng)
    store = MemoryStore()
    await store.create_run(RunInfo(id="r"))
    await store.append_journal("r", segments)
    for page in (1, 3, 100):
        reader = JournalReader(store, "r", page=page)
        count = await reader.index()
        found = [message async for message in reader.messages()]
        assert found == read_journal(segments)
        assert count == len(found)
        assert reader.segments == len(segments)


async def test_a_damaged_journal_is_refused_before_anything_is_written() -> None:
    store = MemoryStore()
    await store.create_run(RunInfo(id="r"))
    await store.append_journal(
        "r", [send("a", "b", [1], [5]), JournalSegment("a", "b", "send", 2, 2, "{oops")]
    )
    written: list[str] = []
    with pytest.raises(ValueError, match="journal segment send a>b is damaged"):
        await write_export(store, "r", written.append)
    assert written == []


# -- listing snapshots ---------------------------------------------------------------------


async def test_listing_snapshots_builds_no_snapshot(store: Store) -> None:
    run_id = await make_run(store, journal=False)
    expected = [SnapshotSummary.of(s) for s in await store.list_snapshots(run_id)]

    async def refuse(run_id: str) -> list[Snapshot]:
        raise AssertionError("listing snapshots loaded them whole")

    store.list_snapshots = refuse  # type: ignore[method-assign]
    rows = await snapshots_table(store, run_id)
    assert [(r.id, r.agents, r.in_flight, r.status) for r in rows] == [
        (s.id, s.agents, s.in_flight, s.status) for s in expected
    ]
