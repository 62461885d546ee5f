"""``agentsnap timeline``: a run as a space-time diagram, in SVG or in one HTML page."""

from __future__ import annotations

import asyncio
import functools
import html
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsnap import ConfigurationError
from agentsnap.cli import main
from agentsnap.demo import run_demo
from agentsnap.records import (
    AgentCut,
    JournalMessage,
    RunInfo,
    RunStatus,
    Snapshot,
    SnapshotStatus,
)
from agentsnap.store import MemoryStore, Store
from agentsnap.store.sql import SqlStore
from agentsnap.timeline import (
    Timeline,
    load_timeline,
    recording_times,
    render,
    render_html,
    render_svg,
)

SVG = "{http://www.w3.org/2000/svg}"
EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["']?\s*https?://""", re.I)


async def demo_run(store: Store, *, journal: bool) -> str:
    """Run the demo into ``store``, keeping its journal or not; return the run id."""
    result = await run_demo(store, journal=journal)
    return result.run.id


def texts(document: str) -> str:
    """All the text of an SVG document (titles included), joined."""
    root = ET.fromstring(document)
    return "\n".join(text for element in root.iter() for text in [element.text] if text)


async def test_the_demo_as_svg() -> None:
    store = MemoryStore()
    run_id = await demo_run(store, journal=True)
    timeline = await load_timeline(store, run_id)
    assert timeline.messages, "the demo's journal was kept"
    assert timeline.snapshots
    assert timeline.rollbacks
    svg = render_svg(timeline)
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    text = texts(svg)
    for name in ["$env", "planner", "researcher", "writer", "critic"]:
        assert name in text
    for snapshot in timeline.snapshots:
        assert f"S{snapshot.seq}" in text
    assert "rollback" in text
    assert "no journal" not in text
    # One arrow per message: a delivered one with an arrowhead, else a dashed stub.
    arrows = root.findall(f".//{SVG}g[@class='msg']")
    assert len(arrows) == len(timeline.messages)
    # Every delivery comes after its send.
    for message in timeline.messages:
        assert message.delivered_at is None or message.delivered_at >= message.sent_at


async def test_the_demo_as_html() -> None:
    store = MemoryStore()
    run_id = await demo_run(store, journal=True)
    timeline = await load_timeline(store, run_id)
    page = render_html(timeline)
    assert page.startswith("<!DOCTYPE html>")
    assert "<script>" in page
    assert "<style>" in page
    assert not EXTERNAL.search(page)
    assert "<script src" not in page
    assert "<link" not in page
    for name in ["$env", "planner", "researcher", "writer", "critic"]:
        assert name in page
    for snapshot in timeline.snapshots:
        assert f"S{snapshot.seq}" in page
        assert snapshot.id in page  # in the hover details
    for rollback in timeline.rollbacks:
        assert html.escape(rollback.reason) in page
    # The SVG inside is the same well-formed document.
    svg = page[page.index("<svg") : page.index("</svg>") + len("</svg>")]
    ET.fromstring(svg)


async def test_a_run_without_a_journal_is_drawn_from_its_snapshots() -> None:
    store = MemoryStore()
    run_id = await demo_run(store, journal=False)
    timeline = await load_timeline(store, run_id)
    assert timeline.messages is None
    svg = render_svg(timeline)
    text = texts(svg)
    assert "no journal" in text
    for snapshot in timeline.snapshots:
        assert f"S{snapshot.seq}" in text
    for snapshot in timeline.snapshots:
        assert not any(derived for _, derived in recording_times(snapshot, None).values())
    page = render_html(timeline)
    ET.fromstring(page[page.index("<svg") : page.index("</svg>") + len("</svg>")])


def test_an_empty_run_renders() -> None:
    timeline = Timeline(RunInfo(id="0" * 32))
    ET.fromstring(render_svg(timeline))


def test_text_is_escaped() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    nasty = '<b>&"x\x00'
    message = JournalMessage(
        src="$env",
        dst=nasty,
        seq=1,
        kind="</text><script>",
        payload={"p": nasty},
        sent_at=start,
        delivered_at=start + timedelta(milliseconds=5),
    )
    timeline = Timeline(RunInfo(id="1" * 32, created_at=start), messages=[message])
    svg = render_svg(timeline)
    assert "<script>" not in svg
    assert nasty.replace("\x00", "\ufffd") in texts(svg)


def test_the_recording_point_lies_between_the_deliveries() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    ms = functools.partial(timedelta, milliseconds=1)

    def at(n: int) -> datetime:
        return start + n * ms()

    messages = [
        JournalMessage(src="$env", dst="a", seq=i, kind="k", sent_at=at(i), delivered_at=at(10 * i))
        for i in (1, 2, 3)
    ]
    snapshot = Snapshot(
        id="2" * 32,
        run_id="1" * 32,
        seq=1,
        initiator="$env",
        status=SnapshotStatus.COMPLETE,
        started_at=at(5),
        completed_at=at(40),
        agents={
            "$env": AgentCut(state_json="{}", state_hash="", sent={"a": 3}),
            "a": AgentCut(state_json="{}", state_hash="", received={"$env": 2}),
        },
    )
    points = recording_times(snapshot, messages)
    when, derived = points["a"]
    assert derived
    assert at(20) <= when <= at(30)
    assert points["$env"] == (at(5), True)


def big_timeline(agents: int = 20, count: int = 2000) -> Timeline:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    names = [f"agent{i:02d}" for i in range(agents)]
    seqs: dict[tuple[str, str], int] = {}
    messages = []
    for i in range(count):
        src, dst = names[i % agents], names[(i * 7 + 3) % agents]
        if src == dst:
            dst = names[(i + 1) % agents]
        seqs[src, dst] = seq = seqs.get((src, dst), 0) + 1
        sent = start + timedelta(milliseconds=i)
        delivered = None if i % 97 == 0 else sent + timedelta(milliseconds=3 + i % 11)
        messages.append(
            JournalMessage(
                src=src,
                dst=dst,
                seq=seq,
                kind="work",
                payload={"i": i, "text": "x" * 500},
                sent_at=sent,
                delivered_at=delivered,
            )
        )
    snapshots = [
        Snapshot(
            id=f"{n:032x}",
            run_id="3" * 32,
            seq=n,
            initiator=names[0],
            status=SnapshotStatus.COMPLETE if n % 4 else SnapshotStatus.FAILED,
            started_at=start + timedelta(milliseconds=200 * n),
            completed_at=start + timedelta(milliseconds=200 * n + 20),
            agents={name: AgentCut(state_json="{}", state_hash="") for name in names},
        )
        for n in range(1, 10)
    ]
    run = RunInfo(id="3" * 32, created_at=start, status=RunStatus.SUCCEEDED)
    return Timeline(run, snapshots, [], messages)


def test_a_large_run_is_aggregated() -> None:
    timeline = big_timeline()
    svg = render_svg(timeline)
    root = ET.fromstring(svg)
    arrows = root.findall(f".//{SVG}g[@class='msg']")
    assert 0 < len(arrows) <= 1000
    text = texts(svg)
    assert "aggregated" in text
    assert re.search(r">x\d+<", svg), "aggregated arrows carry their count"
    for n in range(1, 10):
        assert f"S{n}" in text
    page = render_html(timeline)
    assert len(page) < 1_500_000
    assert not EXTERNAL.search(page)


def test_render_chooses_by_suffix() -> None:
    timeline = Timeline(RunInfo(id="0" * 32))
    assert render(timeline, ".SVG").startswith("<svg")
    assert render(timeline, ".html").startswith("<!DOCTYPE html>")
    with pytest.raises(ConfigurationError, match=r"use \.svg or \.html"):
        render(timeline, ".png")


def sql_demo(db: str) -> str:
    async def go() -> str:
        store = SqlStore(db)
        try:
            return await demo_run(store, journal=True)
        finally:
            await store.close()

    return asyncio.run(go())


@pytest.mark.parametrize("suffix", [".svg", ".html"])
def test_cli_writes_the_diagram(suffix: str, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    run_id = sql_demo(db)
    out = tmp_path / f"run{suffix}"
    done = CliRunner().invoke(main, ["timeline", run_id[:8], "--db", db, "-o", str(out)])
    assert done.exit_code == 0, done.output
    document = out.read_text(encoding="utf-8")
    assert "researcher" in document
    assert "S1" in document


def test_cli_unknown_run(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    sql_demo(db)
    out = tmp_path / "run.svg"
    done = CliRunner().invoke(main, ["timeline", "f" * 32, "--db", db, "-o", str(out)])
    assert done.exit_code != 0
    assert len(done.output.strip().splitlines()) == 1
    assert "Error" in done.output
    assert not out.exists()


def test_cli_bad_suffix(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    run_id = sql_demo(db)
    out = tmp_path / "run.png"
    done = CliRunner().invoke(main, ["timeline", run_id, "--db", db, "-o", str(out)])
    assert done.exit_code != 0
    assert len(done.output.strip().splitlines()) == 1
    assert ".svg or .html" in done.output
    assert not out.exists()


def test_the_png_script_says_when_chromium_is_missing(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parent.parent / "scripts" / "render_timeline.py"
    if not script.is_file():
        pytest.skip("scripts/ is not part of this copy")
    page = tmp_path / "run.html"
    page.write_text(render_html(Timeline(RunInfo(id="0" * 32))), encoding="utf-8")
    missing = tmp_path / "no-such-chromium"
    command = [sys.executable, str(script), str(page), "-o", str(tmp_path / "run.png")]
    done = subprocess.run(
        [*command, "--chromium", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "Chromium not found" in done.stderr
    assert not (tmp_path / "run.png").exists()
