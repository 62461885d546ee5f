"""A run as a space-time diagram, in the style of the classic Chandy-Lamport figures.

One horizontal line per process (the environment, ``$env``, included), time flowing left to
right; messages are arrows from the sender's line at the moment they were sent to the
receiver's line at the moment they were delivered; each snapshot's cut is a line through the
points where the processes recorded; rollbacks are vertical bands pointing back to the cut
they returned to.

Messages come from the run's journal (``Runtime(journal=True)``). A run without a journal is
drawn from its snapshots alone, with the recording points approximated by the snapshot's
times, and the diagram says so.

Example:
    ```python
    import asyncio

    from agentsnap import MemoryStore, Runtime
    from agentsnap.timeline import load_timeline, render_svg

    async def main() -> None:
        store = MemoryStore()
        async with Runtime(store=store, journal=True) as runtime:
            await runtime.snapshot()
        timeline = await load_timeline(store, runtime.run_id)
        print(render_svg(timeline)[:60])

    asyncio.run(main())
    ```

The command line writes the same diagram with ``agentsnap timeline RUN -o run.svg``, or
``run.html``: one self-contained page with the inspector's space-time view (``agentsnap ui``)
and the run's data inline, to zoom into, pan, and switch to Lamport time. Past a thousand
messages the SVG draws each channel's density, the messages it carried in each slice of
time; the page does the same for any window holding too many, and draws arrows when zoomed
in.
"""

from __future__ import annotations

import bisect
import json
import math
import posixpath
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentsnap.exceptions import ConfigurationError
from agentsnap.inspect import ledger_calls, resolve_run
from agentsnap.journal import read_journal
from agentsnap.records import SnapshotStatus

if TYPE_CHECKING:
    from collections.abc import Iterable

    from agentsnap.ledger import LedgerEntry
    from agentsnap.records import JournalMessage, RollbackInfo, RunInfo, Snapshot
    from agentsnap.store import Store

__all__ = [
    "FORMATS",
    "JournalIndex",
    "Timeline",
    "load_timeline",
    "page_data",
    "recording_times",
    "render",
    "render_html",
    "render_svg",
]

FORMATS = (".svg", ".html")
"""The file suffixes [`render`][agentsnap.timeline.render] knows."""

ENVIRONMENT = "$env"

_LEFT = 130  # room for the agents' names
_RIGHT = 40
_TOP = 70  # room for the snapshots' labels
_LANE = 36
_PLOT_WIDTH = 1200
_PAYLOAD_EXCERPT = 160
_DENSITY_BINS = 120  # slices of the time axis per channel for a run past max_messages
# Characters XML 1.0 does not allow, even escaped.
_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


@dataclass
class Timeline:
    """What a diagram of one run is drawn from.

    Attributes:
        run: The run.
        snapshots: Its snapshots, in the order they were started.
        rollbacks: Its rollbacks, oldest first.
        messages: Its journal, in send order; ``None`` when the run kept no journal.
        tool_calls: Its side-effecting tool calls from the ledger (an ``SqlStore``'s), oldest
            first.
    """

    run: RunInfo
    snapshots: list[Snapshot] = field(default_factory=list)
    rollbacks: list[RollbackInfo] = field(default_factory=list)
    messages: list[JournalMessage] | None = None
    tool_calls: list[LedgerEntry] = field(default_factory=list)


async def load_timeline(store: Store, run_id: str) -> Timeline:
    """Read what the diagram of run ``run_id`` (or a unique prefix of it) needs from ``store``.

    Raises:
        NotFoundError: No run's id starts with ``run_id``, or several do.
    """
    run = await resolve_run(store, run_id)
    snapshots = await store.list_snapshots(run.id)
    rollbacks = await store.list_rollbacks(run.id)
    segments = await store.load_journal(run.id)
    messages = read_journal(segments) if segments else None
    tool_calls = await ledger_calls(store, run.id)
    return Timeline(run, snapshots, rollbacks, messages, tool_calls)


def render(timeline: Timeline, suffix: str, *, max_messages: int = 1000) -> str:
    """The diagram as the document a file with this suffix (``.svg`` or ``.html``) holds.

    Raises:
        ConfigurationError: Another suffix.
    """
    kind = suffix.lower()
    if kind == ".svg":
        return render_svg(timeline, max_messages=max_messages)
    if kind == ".html":
        return render_html(timeline, max_messages=max_messages)
    raise ConfigurationError(
        f"cannot draw a timeline as {suffix or 'a file without a suffix'!r}: use .svg or .html"
    )


# --- Where each process recorded ----------------------------------------------------------


class JournalIndex:
    """A run's journal indexed by channel and sequence number, built once for every cut.

    Maps ``(src, dst, seq)`` to the times of the sends and of the deliveries of that number
    (a rollback reuses numbers, so there may be several of each), in journal order.
    """

    __slots__ = ("deliveries", "sends")

    def __init__(self, messages: Iterable[JournalMessage]) -> None:
        self.sends: dict[tuple[str, str, int], list[datetime]] = defaultdict(list)
        self.deliveries: dict[tuple[str, str, int], list[datetime]] = defaultdict(list)
        for message in messages:
            self.sends[message.src, message.dst, message.seq].append(message.sent_at)
            if message.delivered_at is not None:
                self.deliveries[message.src, message.dst, message.seq].append(message.delivered_at)


_NONE: list[datetime] = []


def recording_times(
    snapshot: Snapshot,
    messages: list[JournalMessage] | None,
    *,
    index: JournalIndex | None = None,
) -> dict[str, tuple[datetime, bool]]:
    """When each process of ``snapshot`` recorded, and whether the journal says so.

    With a journal, an agent recorded after the delivery numbered ``received[src]`` of each
    incoming channel and before the one numbered ``received[src] + 1`` (and likewise between
    its sends numbered ``sent[dst]`` and ``sent[dst] + 1``); the time chosen lies within
    those bounds and, where they allow, within the snapshot's own start and completion (the
    earliest such time, as markers travel fast). When
    the journal does not bound it, the time is approximated from the snapshot (the second
    item is then ``False``).

    Args:
        snapshot: The snapshot.
        messages: The run's journal, ``None`` when it kept none.
        index: ``JournalIndex(messages)``, when placing several snapshots of the run: built
            once, it makes each call cost the size of the cut rather than of the journal.
    """
    start = snapshot.started_at
    end = snapshot.completed_at or start
    end = max(end, start)
    result: dict[str, tuple[datetime, bool]] = {}
    if messages is not None and index is None:
        index = JournalIndex(messages)
    for name, cut in snapshot.agents.items():
        approx = start
        if index is None:
            result[name] = (approx, False)
            continue
        sends = index.sends
        deliveries = index.deliveries
        before: list[list[datetime]] = []
        after: list[list[datetime]] = []
        for src, count in cut.received.items():
            before.append(deliveries.get((src, name, count), _NONE) if count else _NONE)
            after.append(deliveries.get((src, name, count + 1), _NONE))
        for dst, count in cut.sent.items():
            before.append(sends.get((name, dst, count), _NONE) if count else _NONE)
            after.append(sends.get((name, dst, count + 1), _NONE))
        # Sequence numbers repeat after a rollback: take the latest event before the
        # snapshot ended as the lower bound, and the first one after that as the upper.
        lows = [max((t for t in times if t <= end), default=None) for times in before]
        low = max((t for t in lows if t is not None), default=None)
        highs = [
            min((t for t in times if low is None or t >= low), default=None) for times in after
        ]
        high = min((t for t in highs if t is not None), default=None)
        if low is None and high is None:
            result[name] = (approx, False)
            continue
        lo = max(low, start) if low is not None else start
        hi = min(high, end) if high is not None else end
        # Markers travel fast: a process records as early as its own events allow.
        if lo <= hi:
            when = lo
        elif low is not None and high is not None and low <= high:
            when = low
        else:
            when = low if low is not None else high  # type: ignore[assignment]
        assert when is not None
        result[name] = (when, True)
    return result


# --- Drawing ------------------------------------------------------------------------------


def _text(value: object) -> str:
    """Escaped text for an element or an attribute."""
    return escape(_INVALID_XML.sub("\ufffd", str(value)), quote=True)


def _excerpt(value: object, limit: int = _PAYLOAD_EXCERPT) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _stamp(when: datetime | None) -> str:
    return "-" if when is None else when.isoformat(timespec="microseconds")


def _agents(timeline: Timeline) -> list[str]:
    """Every process, the environment first, then in the order they first appear."""
    seen: dict[str, None] = {ENVIRONMENT: None}
    for message in timeline.messages or []:
        seen.setdefault(message.src, None)
        seen.setdefault(message.dst, None)
    for snapshot in timeline.snapshots:
        if snapshot.initiator:
            seen.setdefault(snapshot.initiator, None)
        for name in snapshot.agents:
            seen.setdefault(name, None)
    for rollback in timeline.rollbacks:
        if rollback.agent:
            seen.setdefault(rollback.agent, None)
    return list(seen)


class _Scale:
    """Maps times to x coordinates, with a little room after the last event."""

    def __init__(self, times: list[datetime], width: float) -> None:
        self.first = min(times)
        last = max(times)
        self.span = max((last - self.first).total_seconds() * 1.05, 1e-6)
        self.width = width

    def x(self, when: datetime) -> float:
        offset = (when - self.first).total_seconds() / self.span
        return round(_LEFT + min(max(offset, 0.0), 1.0) * self.width, 1)

    def ticks(self, count: int = 8) -> list[tuple[float, str]]:
        """Round times from the first event: steps of 1, 2 or 5 times a power of ten."""
        rough = self.span / count
        power = 10 ** math.floor(math.log10(rough))
        step = next(m * power for m in (1, 2, 5, 10) if m * power >= rough)
        return [
            (self.x(self.first + timedelta(seconds=step * i)), f"+{step * i:.4g} s")
            for i in range(int(self.span / step) + 1)
        ]


def _times(timeline: Timeline) -> list[datetime]:
    times: list[datetime] = []
    for message in timeline.messages or []:
        times.append(message.sent_at)
        if message.delivered_at is not None:
            times.append(message.delivered_at)
    for snapshot in timeline.snapshots:
        times.append(snapshot.started_at)
        if snapshot.completed_at is not None:
            times.append(snapshot.completed_at)
    times.extend(rollback.at for rollback in timeline.rollbacks)
    if not times:
        # Nothing happened: the run's own start and end frame the picture. Otherwise they
        # are left out, since setting a run up (opening the database) can take longer than
        # the whole run and would squeeze it into a corner.
        times.append(timeline.run.created_at)
        if timeline.run.finished_at is not None:
            times.append(timeline.run.finished_at)
    return times


@dataclass
class _Band:
    """Messages of one channel sent within one slice of the time axis."""

    src: str
    dst: str
    start: datetime
    end: datetime
    count: int
    undelivered: int


def _bands(messages: list[JournalMessage], scale: _Scale, bins: int) -> list[_Band]:
    """Per channel, the number of messages sent in each of ``bins`` equal slices of the axis.

    One pass over the messages: each adds one to its channel's slice, so every message
    counts where it was really sent (nothing is averaged).
    """
    step = scale.span / bins
    counts: dict[tuple[str, str], list[int]] = {}
    undelivered: dict[tuple[str, str], list[int]] = {}
    for m in messages:
        index = int((m.sent_at - scale.first).total_seconds() / step)
        index = min(max(index, 0), bins - 1)
        channel = (m.src, m.dst)
        if channel not in counts:
            counts[channel] = [0] * bins
            undelivered[channel] = [0] * bins
        counts[channel][index] += 1
        if m.delivered_at is None:
            undelivered[channel][index] += 1
    bands: list[_Band] = []
    for (src, dst), row in sorted(counts.items()):
        for index, count in enumerate(row):
            if count:
                bands.append(
                    _Band(
                        src,
                        dst,
                        scale.first + timedelta(seconds=step * index),
                        scale.first + timedelta(seconds=step * (index + 1)),
                        count,
                        undelivered[src, dst][index],
                    )
                )
    return bands


def _svg_arrow(m: JournalMessage, scale: _Scale, lane: dict[str, int], right: int) -> str:
    """One message: an arrow from its send to its delivery, or a dashed stub if undelivered."""
    tip = (
        f"{m.src} → {m.dst} #{m.seq}\nkind: {m.kind}\nepoch: {m.epoch}\n"
        f"sent: {_stamp(m.sent_at)}\ndelivered: {_stamp(m.delivered_at)}\n"
        f"payload: {_excerpt(m.payload)}"
    )
    x1, y1 = scale.x(m.sent_at), lane[m.src]
    y2 = lane[m.dst]
    out = [f'<g class="msg"><title>{_text(tip)}</title>']
    if m.delivered_at is not None:
        x2 = scale.x(m.delivered_at)
        out.append(f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" marker-end="url(#head)"/>')
    else:
        # Never delivered: a short arrow leaving the sender, ending in a dashed stub.
        mx, my = min(x1 + 18, right), y1 + (y2 - y1) * 0.25
        ex, ey = min(x1 + 45, right), y1 + (y2 - y1) * 0.6
        out.append(f'<line x1="{x1}" y1="{y1}" x2="{mx}" y2="{my}"/>')
        out.append(f'<line class="stub" x1="{mx}" y1="{my}" x2="{ex}" y2="{ey}"/>')
    out.append("</g>")
    return "".join(out)


def _svg_band(band: _Band, scale: _Scale, lane: dict[str, int], peak: int) -> str:
    """A channel's messages of one time slice, as a band between the two lanes.

    The band runs from the sender's lane to the receiver's, as wide as the slice and as dark
    as the number of messages it holds.
    """
    x1, x2 = scale.x(band.start), max(scale.x(band.end), scale.x(band.start) + 1)
    y1, y2 = lane[band.src], lane[band.dst]
    opacity = 0.08 + 0.72 * math.sqrt(band.count / peak)
    tip = (
        f"{band.src} → {band.dst}: {band.count} message(s) sent\n"
        f"from {_stamp(band.start)}\nto {_stamp(band.end)}\nundelivered: {band.undelivered}"
    )
    return (
        f'<g class="band" data-count="{band.count}"><title>{_text(tip)}</title>'
        f'<polygon points="{x1},{y1} {x2},{y1} {x2},{y2} {x1},{y2}" '
        f'fill-opacity="{opacity:.3f}"/></g>'
    )


def render_svg(
    timeline: Timeline, *, max_messages: int = 1000, plot_width: int = _PLOT_WIDTH
) -> str:
    """The diagram as a standalone SVG document.

    Every element with details carries them in a ``<title>`` (a tooltip in most viewers).

    Args:
        timeline: What to draw.
        max_messages: Past this many messages, each channel is drawn as its density: a
            band per slice of the time axis, as dark as the number of messages sent in it.
        plot_width: Width of the time axis, in pixels; the agents' names and the margins
            add 170. A narrower diagram of a short run reads better in a page's column.
    """
    agents = _agents(timeline)
    lane = {name: _TOP + i * _LANE for i, name in enumerate(agents)}
    bottom = _TOP + (len(agents) - 1) * _LANE
    notes: list[str] = []
    scale = _Scale(_times(timeline), plot_width)
    right = _LEFT + plot_width
    by_id = {snapshot.id: snapshot for snapshot in timeline.snapshots}
    cut_x: dict[str, float] = {}

    out: list[str] = []
    add = out.append
    # Time axis and lanes.
    add('<g class="axis">')
    for x, label in scale.ticks():
        add(f'<line class="tick" x1="{x}" y1="{_TOP - 20}" x2="{x}" y2="{bottom + 12}"/>')
        add(f'<text class="ticklabel" x="{x}" y="{bottom + 26}">{_text(label)}</text>')
    add("</g>")
    add('<g class="lanes">')
    for name in agents:
        y = lane[name]
        add(f'<g class="lane"><title>{_text(name)}</title>')
        add(f'<line x1="{_LEFT}" y1="{y}" x2="{right}" y2="{y}"/>')
        add(f'<text class="agent" x="{_LEFT - 8}" y="{y + 4}">{_text(name)}</text></g>')
    add("</g>")

    # Messages.
    add('<g class="messages">')
    if timeline.messages is None:
        notes.append(
            "This run kept no journal: drawn from its snapshots alone; recording points are "
            "approximated by the snapshots' times."
        )
    elif len(timeline.messages) <= max_messages:
        for m in timeline.messages:
            if m.src in lane and m.dst in lane:
                add(_svg_arrow(m, scale, lane, right))
    else:
        bands = _bands(timeline.messages, scale, _DENSITY_BINS)
        notes.append(
            f"{len(timeline.messages)} messages, more than {max_messages}: each channel is "
            f"drawn as its density, the messages sent in each of {_DENSITY_BINS} slices of "
            "the time axis (darker is more). The HTML page zooms in to the arrows."
        )
        peak = max((band.count for band in bands), default=1)
        for band in bands:
            if band.src in lane and band.dst in lane:
                add(_svg_band(band, scale, lane, peak))
    add("</g>")

    # Cuts.
    add('<g class="cuts">')
    journal = None if timeline.messages is None else JournalIndex(timeline.messages)
    for snapshot in timeline.snapshots:
        complete = snapshot.status == SnapshotStatus.COMPLETE
        points = recording_times(snapshot, timeline.messages, index=journal)
        placed = sorted(
            ((lane[name], scale.x(when), derived) for name, (when, derived) in points.items()),
        )
        if not placed:
            x = scale.x(snapshot.started_at)
            placed = [(_TOP - 10, x, False), (bottom + 10, x, False)]
        cls = "cut" if complete else "cut failed"
        tip = (
            f"snapshot {snapshot.seq} ({snapshot.status.value})\nid: {snapshot.id}\n"
            f"initiator: {snapshot.initiator}\nstarted: {_stamp(snapshot.started_at)}\n"
            f"completed: {_stamp(snapshot.completed_at)}"
        )
        if snapshot.error:
            tip += f"\nerror: {snapshot.error}"
        approximated = [name for name, (_, derived) in points.items() if not derived]
        if approximated and timeline.messages is not None:
            tip += f"\napproximated by time: {', '.join(sorted(approximated))}"
        top_x = placed[0][1]
        cut_x[snapshot.id] = top_x
        path = " ".join(f"{x},{y}" for y, x, _ in placed)
        add(f'<g class="{cls}"><title>{_text(tip)}</title>')
        add(f'<polyline points="{top_x},{_TOP - 16} {path} {placed[-1][1]},{bottom + 10}"/>')
        for y, x, derived in placed:
            if y in lane.values():
                add(
                    f'<circle class="{"rec" if derived else "rec approx"}" '
                    f'cx="{x}" cy="{y}" r="3.5"/>'
                )
        label = f"S{snapshot.seq}" + ("" if complete else " (failed)")
        add(f'<text class="cutlabel" x="{top_x}" y="{_TOP - 20}">{_text(label)}</text></g>')
    add("</g>")

    # Rollbacks.
    add('<g class="rollbacks">')
    for index, rollback in enumerate(timeline.rollbacks):
        x = scale.x(rollback.at)
        target = by_id.get(rollback.snapshot_id)
        where = f"S{target.seq}" if target else rollback.snapshot_id[:8]
        tip = (
            f"rollback to {where}\nreason: {rollback.reason}\nagent: {rollback.agent or '-'}\n"
            f"source: {rollback.source} (attempt {rollback.attempt})\n"
            f"discarded: {rollback.discarded} message(s)\nat: {_stamp(rollback.at)}"
        )
        add(f'<g class="rollback"><title>{_text(tip)}</title>')
        add(f'<rect x="{x - 4}" y="{_TOP - 14}" width="8" height="{bottom - _TOP + 28}" rx="2"/>')
        if target is not None and target.id in cut_x:
            tx = cut_x[target.id]
            lift = 48 + (index % 3) * 6
            add(
                f'<path class="back" d="M{x},{_TOP - 14} C{x},{_TOP - lift} {tx},{_TOP - lift} '
                f'{tx},{_TOP - 30}" marker-end="url(#back)"/>'
            )
        reason = rollback.reason if len(rollback.reason) <= 60 else rollback.reason[:59] + "…"
        label_y = bottom + 44 + (index % 4) * 14
        anchor = "end" if x > _LEFT + plot_width / 2 else "start"
        add(
            f'<text class="rblabel" x="{x}" y="{label_y}" text-anchor="{anchor}">'
            f"{_text(f'rollback → {where}: {reason}')}</text></g>"
        )
    add("</g>")

    height = bottom + 44 + min(4, len(timeline.rollbacks)) * 14 + 16 + len(notes) * 16
    note_y = bottom + 44 + min(4, len(timeline.rollbacks)) * 14 + 8
    for note in notes:
        add(f'<text class="note" x="{_LEFT}" y="{note_y}">{_text(note)}</text>')
        note_y += 16
    width = right + _RIGHT
    title = f"run {timeline.run.id} ({timeline.run.status.value})"
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" '
        'font-size="11">'
        f"<title>{_text(title)}</title>"
        f"<style>{_SVG_STYLE}</style>"
        "<defs>"
        '<marker id="head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" markerUnits="userSpaceOnUse" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z" fill="#36c"/></marker>'
        '<marker id="back" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" markerUnits="userSpaceOnUse" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z" fill="#c33"/></marker>'
        "</defs>"
        f'<text class="title" x="{_LEFT}" y="16">{_text(title)}</text>'
    )
    return head + "".join(out) + "</svg>\n"


_SVG_STYLE = """
.tick{stroke:#eee}.ticklabel{fill:#888;text-anchor:middle;font-size:10px}
.lane line{stroke:#444;stroke-width:1.5}.agent{text-anchor:end;font-weight:bold;fill:#222}
.msg line{stroke:#36c;opacity:.75}.msg .stub{stroke-dasharray:3 3}
.band polygon{fill:#36c}
.cut polyline{fill:none;stroke:#e80;stroke-width:2}.cut circle{fill:#e80}
.cut circle.approx{fill:#fff;stroke:#e80}
.cut.failed{opacity:.3}.cut.failed polyline{stroke-dasharray:5 4}
.cutlabel{fill:#b60;font-weight:bold;text-anchor:middle}
.rollback rect{fill:#c33;opacity:.18}.rollback .back{fill:none;stroke:#c33;stroke-dasharray:4 3}
.rblabel{fill:#c33;font-size:10px}.note{fill:#666;font-style:italic}
.title{font-size:13px;font-weight:bold}
"""

_HTML = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
{css}
</style>
</head>
<body>
<header class="top"><span class="brand">agentsnap timeline</span>
<span id="status" class="status"></span></header>
<main id="view"></main>
<script type="application/json" id="agentsnap-data">{data}</script>
<script type="module">
{js}
</script>
</body>
</html>
"""

_STATIC = Path(__file__).resolve().parent / "ui" / "static"


_PAGE_MODULE = "timeline_page.js"
"""The entry module of the exported page; the page holds it and the modules it imports."""

_IMPORT = re.compile(r'^import\s*\{[^}]*\}\s*from\s*"([^"]+)";[ \t]*\n', re.MULTILINE)
_EXPORT = re.compile(r"^export (?=(?:async\s+)?(?:function|class|const|let)\b)", re.MULTILINE)
_MODULE_SYNTAX = re.compile(r"^(?:import|export)\b.*$", re.MULTILINE)
_DECLARED = re.compile(
    r"^(?:async\s+)?(?:function\*?|class|const|let|var)\s+([A-Za-z_$][\w$]*)", re.MULTILINE
)


def _asset(name: str) -> str:
    text = (_STATIC / name).read_text(encoding="utf-8")
    if "</script" in text.lower() or "</style" in text.lower():
        raise ConfigurationError(f"{name} cannot be inlined: it holds a closing tag")
    return text


def _script(entry: str) -> str:
    """``entry`` and the static modules it imports, as the body of one inline module.

    The inspector's modules import each other by relative path, which a page opened from a
    file cannot follow inline. So each module needed comes once, after the modules it
    imports, with its ``import`` lines and ``export`` keywords taken out: they then share one
    module scope, which is why two of them declaring the same top-level name is refused.
    Only ``import { a, b } from "./x.js";`` and ``export`` before a declaration are
    understood; any other form is refused rather than inlined half-understood.
    """
    ordered: list[tuple[str, str]] = []
    seen: set[str] = set()

    def visit(name: str, importer: str | None) -> None:
        if name in seen:
            return
        seen.add(name)
        if name.startswith("../") or not (_STATIC / name).is_file():
            where = f" (imported by {importer})" if importer else ""
            raise ConfigurationError(
                f"the module {name}{where} is not a file of {_STATIC}: fix the import"
            )
        text = _asset(name)
        for spec in _IMPORT.findall(text):
            if not spec.startswith(("./", "../")):
                raise ConfigurationError(
                    f"{name} imports {spec!r}: the export inlines relative imports only"
                )
            visit(posixpath.normpath(posixpath.join(posixpath.dirname(name), spec)), name)
        body = _EXPORT.sub("", _IMPORT.sub("", text))
        left = _MODULE_SYNTAX.search(body)
        if left is not None:
            raise ConfigurationError(
                f"{name} cannot be inlined: {left.group(0)!r} is an import or export form the "
                'export does not understand; use import { a } from "./x.js" and export before '
                "a declaration"
            )
        ordered.append((name, body))

    visit(entry, None)
    owners: dict[str, str] = {}
    for name, body in ordered:
        for declared in _DECLARED.findall(body):
            if declared in owners:
                raise ConfigurationError(
                    f"{owners[declared]} and {name} both declare {declared!r}; the export puts "
                    "them in one scope: rename one of them"
                )
            owners[declared] = name
    return "\n".join(f"// {name}\n{body}" for name, body in ordered)


def render_html(timeline: Timeline, *, max_messages: int = 1000) -> str:
    """The run as one self-contained HTML page, with no server and no network.

    The page is the inspector's space-time view (the same drawing code as ``agentsnap ui``)
    with the run's data inline.

    The page zooms (wheel, ``+``/``-``), pans (drag, arrows) and switches between wall-clock
    and Lamport time; it draws every message as an arrow when the window holds at most a few
    thousand, else each channel's density. Hovering over an arrow, a cut or a rollback shows
    its details.

    Args:
        timeline: What to draw.
        max_messages: Unused: kept for callers of the SVG-era signature; the page decides
            between arrows and density bands for each window as it is zoomed.
    """
    del max_messages
    data = json.dumps(page_data(timeline), ensure_ascii=False, separators=(",", ":"))
    # Inside <script>, "</script>" or "<!--" would end or confuse the element: no "<" at all.
    data = data.replace("<", "\\u003c")
    title = _text(f"agentsnap timeline: run {timeline.run.id}")
    return _HTML.format(title=title, css=_asset("app.css"), js=_script(_PAGE_MODULE), data=data)


def _us(when: datetime) -> int:
    """Microseconds since the Unix epoch."""
    return int((when - _EPOCH) // timedelta(microseconds=1))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class _Lamport:
    """Lamport clocks of a journal.

    A send ticks the sender's clock; a delivery sets the receiver's to one more than the
    larger of its own and the message's.
    """

    def __init__(self, messages: list[JournalMessage]) -> None:
        events: list[tuple[datetime, int, int]] = []
        for index, m in enumerate(messages):
            events.append((m.sent_at, 0, index))
            if m.delivered_at is not None:
                events.append((m.delivered_at, 1, index))
        events.sort()
        clock: dict[str, int] = defaultdict(int)
        self.sent = [0] * len(messages)
        self.delivered: list[int | None] = [None] * len(messages)
        # Per agent, when its clock moved and to what: for the clock of a cut or an event.
        self.times: dict[str, list[datetime]] = defaultdict(list)
        self.values: dict[str, list[int]] = defaultdict(list)
        self.max = 0
        for when, kind, index in events:
            m = messages[index]
            if kind == 0:
                clock[m.src] += 1
                self.sent[index] = value = clock[m.src]
                agent = m.src
            else:
                value = max(clock[m.dst], self.sent[index] or clock[m.src]) + 1
                clock[m.dst] = self.delivered[index] = value
                agent = m.dst
            self.times[agent].append(when)
            self.values[agent].append(value)
            self.max = max(self.max, value)

    def at(self, agent: str | None, when: datetime) -> int:
        """The clock of ``agent`` (of the whole run, when ``None``) at ``when``."""
        if agent is None:
            return max((self.at(name, when) for name in self.times), default=0)
        times = self.times.get(agent)
        if not times:
            return 0
        index = bisect.bisect_right(times, when)
        return self.values[agent][index - 1] if index else 0


def page_data(timeline: Timeline) -> dict[str, Any]:
    """The run as the HTML page embeds it: the inspector API's shapes, messages as rows.

    Linear in the snapshots, messages, rollbacks and tool calls: every message is kept (with a
    payload excerpt), none is averaged. Times are microseconds since the Unix epoch.
    """
    run = timeline.run
    messages = timeline.messages or []
    clocks = _Lamport(messages)
    names = _agents(timeline)
    for m in messages:  # _agents lists them all; this keeps the index total.
        for name in (m.src, m.dst):
            if name not in names:
                names.append(name)
    number = {name: i for i, name in enumerate(names)}
    kinds: dict[str, int] = {}
    discarded = _discarded(timeline)
    rows = []
    for i, m in enumerate(messages):
        rows.append(
            [
                number[m.src],
                number[m.dst],
                m.seq,
                kinds.setdefault(m.kind, len(kinds)),
                m.epoch,
                _us(m.sent_at),
                None if m.delivered_at is None else _us(m.delivered_at),
                clocks.sent[i],
                clocks.delivered[i],
                1 if i in discarded else 0,
            ]
        )
    journal = JournalIndex(messages) if timeline.messages is not None else None
    snapshots = []
    in_flight_total = 0
    for snapshot in timeline.snapshots:
        points = recording_times(snapshot, timeline.messages, index=journal)
        in_flight = sum(len(channel.messages) for channel in snapshot.channels)
        in_flight_total += in_flight
        snapshots.append(
            {
                "id": snapshot.id,
                "seq": snapshot.seq,
                "status": snapshot.status.value,
                "started_at_us": _us(snapshot.started_at),
                "completed_at_us": None
                if snapshot.completed_at is None
                else _us(snapshot.completed_at),
                "initiator": snapshot.initiator,
                "in_flight": in_flight,
                "error": snapshot.error,
                "recorded": {
                    name: {"at_us": _us(when), "lc": clocks.at(name, when)}
                    for name, (when, _) in points.items()
                },
            }
        )
    times = _times(timeline) + [call.created_at for call in timeline.tool_calls]
    note = None
    if timeline.messages is None:
        note = (
            "This run kept no journal: drawn from its snapshots alone; recording points are "
            "approximated by the snapshots' times."
        )
    return {
        "run": {
            "id": run.id,
            "name": run.name,
            "status": run.status.value,
            "reason": run.status_reason,
            "tags": [f"{key}={value}" if value else key for key, value in run.tags.items()],
            "created_at_us": _us(run.created_at),
            "agents": names,
            "start_us": _us(min(times)),
            "end_us": _us(max(times)),
            "lamport_max": clocks.max,
            "messages": len(messages),
        },
        "names": names,
        "note": note,
        "messages": {
            "kinds": list(kinds),
            "rows": rows,
            "payloads": [_excerpt(m.payload, 120) for m in messages],
        },
        "snapshots": snapshots,
        "events": {
            "rollbacks": [
                {
                    "id": r.id,
                    "at_us": _us(r.at),
                    "lc": clocks.at(r.agent, r.at),
                    "agent": r.agent,
                    "reason": r.reason,
                    "source": r.source,
                    "snapshot_id": r.snapshot_id,
                }
                for r in timeline.rollbacks
            ],
            "tool_calls": [
                {
                    "key": call.key,
                    "tool": call.tool,
                    "agent": call.agent,
                    "status": call.status.value,
                    "at_us": _us(call.created_at),
                    "lc": clocks.at(call.agent, call.created_at),
                }
                for call in timeline.tool_calls
            ],
        },
    }


def _discarded(timeline: Timeline) -> set[int]:
    """The messages (by index in the journal) a rollback threw away.

    Those sent after their sender recorded in the cut rolled back to and before the rollback,
    and those still undelivered when a rollback emptied the channels.
    """
    messages = timeline.messages or []
    if not messages or not timeline.rollbacks:
        return set()
    by_id = {snapshot.id: snapshot for snapshot in timeline.snapshots}
    journal = JournalIndex(messages)
    sent = [m.sent_at for m in messages]  # the journal is in send order
    last = max(r.at for r in timeline.rollbacks)
    found: set[int] = set()
    for rollback in timeline.rollbacks:
        target = by_id.get(rollback.snapshot_id)
        if target is None:
            continue
        recorded = recording_times(target, messages, index=journal)
        start = min((when for when, _ in recorded.values()), default=rollback.at)
        first = bisect.bisect_right(sent, start)
        end = bisect.bisect_right(sent, rollback.at)
        for index in range(first, end):
            m = messages[index]
            when = recorded.get(m.src)
            if when is not None and when[0] < m.sent_at:
                found.add(index)
    for index, m in enumerate(messages):
        if m.delivered_at is None and m.sent_at <= last:
            found.add(index)
    return found
