"""``agentsnap timeline``: a run as a space-time diagram, in SVG or in one HTML page."""

from __future__ import annotations

import asyncio
import functools
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentsnap import ConfigurationError
from agentsnap import timeline as timeline_module
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
    page_data,
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


def embedded(page: str) -> dict[str, Any]:
    """The run data an HTML page carries in its ``agentsnap-data`` script element."""
    start = page.index('<script type="application/json" id="agentsnap-data">')
    start = page.index(">", start) + 1
    end = page.index("</script>", start)
    data: dict[str, Any] = json.loads(page[start:end])
    return data


async def test_the_demo_as_html() -> None:
    store = MemoryStore()
    run_id = await demo_run(store, journal=True)
    timeline = await load_timeline(store, run_id)
    assert timeline.messages is not None
    page = render_html(timeline)
    assert page.startswith("<!DOCTYPE html>")
    assert '<script type="module">' in page
    assert "<style>" in page
    assert "class SpaceTime" in page, "the inspector's drawing code is inline"
    # Only the modules the offline page needs: none that talks to a server.
    assert "class ServerSource" not in page
    assert "async function api(" not in page
    assert "function runView(" not in page
    assert not re.search(r"^\s*(import|export)\b", page, re.MULTILINE)
    assert not EXTERNAL.search(page)
    assert "<script src" not in page
    assert "<link" not in page
    data = embedded(page)
    assert data["run"]["id"] == run_id
    for name in ["$env", "planner", "researcher", "writer", "critic"]:
        assert name in data["names"]
    # Every message is there, none averaged: its own channel, number and times.
    rows = data["messages"]["rows"]
    assert len(rows) == len(timeline.messages)
    for row, message in zip(rows, timeline.messages, strict=True):
        assert data["names"][row[0]] == message.src
        assert data["names"][row[1]] == message.dst
        assert row[2] == message.seq
        assert row[5] == int(message.sent_at.timestamp() * 1_000_000)
    assert [s["id"] for s in data["snapshots"]] == [s.id for s in timeline.snapshots]
    for snapshot in data["snapshots"]:
        assert set(snapshot["recorded"]) == set(
            next(s for s in timeline.snapshots if s.id == snapshot["id"]).agents
        )
    assert [r["reason"] for r in data["events"]["rollbacks"]] == [
        r.reason for r in timeline.rollbacks
    ]
    # The critic's rejection threw the draft it rejected away.
    assert any(row[9] for row in rows), "a message of the discarded timeline is marked"


async def test_the_page_has_lamport_times() -> None:
    store = MemoryStore()
    run_id = await demo_run(store, journal=True)
    data = page_data(await load_timeline(store, run_id))
    rows = data["messages"]["rows"]
    for row in rows:
        sent_lc, delivered_lc = row[7], row[8]
        assert sent_lc >= 1
        assert delivered_lc is None or delivered_lc > sent_lc
    # A sender's clock only moves forward from one send to the next.
    last: dict[int, int] = {}
    for row in sorted(rows, key=lambda r: r[5]):
        assert row[7] > last.get(row[0], 0)
        last[row[0]] = row[7]
    assert data["run"]["lamport_max"] == max(max(r[7], r[8] or 0) for r in rows)


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
    data = embedded(render_html(timeline))
    assert data["messages"]["rows"] == []
    assert "no journal" in data["note"]
    assert len(data["snapshots"]) == len(timeline.snapshots)


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
    page = render_html(timeline)
    assert page.count("<script") == 2, "only the page's own two script elements"
    assert "<b>" not in page
    data = embedded(page)
    assert nasty in data["names"]
    assert data["messages"]["kinds"] == ["</text><script>"]


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


def test_a_large_run_is_drawn_as_density_not_averaged() -> None:
    timeline = big_timeline()
    assert timeline.messages is not None
    svg = render_svg(timeline)
    root = ET.fromstring(svg)
    assert not root.findall(f".//{SVG}g[@class='msg']"), "past max_messages: no arrow at all"
    bands = root.findall(f".//{SVG}g[@class='band']")
    assert bands
    # Every message is counted once, in its own channel's band.
    assert sum(int(band.attrib["data-count"]) for band in bands) == len(timeline.messages)
    channels = {(m.src, m.dst) for m in timeline.messages}
    assert len(bands) >= len(channels)
    text = texts(svg)
    assert "density" in text
    assert "aggregated" not in text
    for n in range(1, 10):
        assert f"S{n}" in text
    # The page keeps every message; the browser decides on arrows or bands per window.
    page = render_html(timeline)
    assert len(embedded(page)["messages"]["rows"]) == len(timeline.messages)
    assert len(page) < 1_500_000
    assert not EXTERNAL.search(page)


def test_a_small_run_has_one_arrow_per_message() -> None:
    timeline = big_timeline(count=200)
    root = ET.fromstring(render_svg(timeline))
    assert len(root.findall(f".//{SVG}g[@class='msg']")) == 200
    assert not root.findall(f".//{SVG}g[@class='band']")


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
    if suffix == ".svg":
        assert "S1" in document
    else:
        assert embedded(document)["run"]["id"] == run_id


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


def write_modules(folder: Path, modules: dict[str, str]) -> None:
    for name, text in modules.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")


def test_the_page_inlines_each_module_once_after_what_it_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_modules(
        tmp_path,
        {
            "page.js": 'import { b } from "./views/b.js";\nimport { a } from "./a.js";\nb(a);\n',
            "views/b.js": (
                'import { a } from "../a.js";\n\nexport function b(x) {\n  return x + a;\n}\n'
            ),
            "a.js": "export const a = 1;\n",
            "unused.js": "export const unused = 2;\n",
        },
    )
    monkeypatch.setattr(timeline_module, "_STATIC", tmp_path)
    script = timeline_module._script("page.js")
    assert [line for line in script.splitlines() if line.startswith("// ")] == [
        "// a.js",
        "// views/b.js",
        "// page.js",
    ]
    assert "export" not in script
    assert "import" not in script
    assert "unused" not in script
    assert "const a = 1;" in script
    assert "function b(x) {" in script


@pytest.mark.parametrize(
    ("modules", "message"),
    [
        (
            {
                "page.js": 'import { a } from "./a.js";\nconst b = 2;\n',
                "a.js": "export const a = 1;\nconst b = 1;\n",
            },
            "a.js and page.js both declare 'b'",
        ),
        (
            {"page.js": 'import { a } from "./gone.js";\n'},
            "the module gone.js (imported by page.js)",
        ),
        (
            {"page.js": 'import { a } from "https://example.org/a.js";\n'},
            "the export inlines relative imports only",
        ),
        ({"page.js": "export default function page() {}\n"}, "export default function page"),
        ({"page.js": 'import * as a from "./a.js";\n', "a.js": ""}, "import * as a"),
        ({"page.js": "const s = '</script>';\n"}, "it holds a closing tag"),
    ],
)
def test_a_module_the_page_cannot_inline_is_refused(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    modules: dict[str, str],
    message: str,
) -> None:
    write_modules(tmp_path, modules)
    monkeypatch.setattr(timeline_module, "_STATIC", tmp_path)
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        timeline_module._script("page.js")
