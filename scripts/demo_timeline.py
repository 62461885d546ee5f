"""Draw the demo's run as the timeline picture shown in the README and the documentation.

    python scripts/demo_timeline.py             # rewrites docs/assets/timeline.svg
    python scripts/demo_timeline.py -o run.svg  # writes it elsewhere
    python scripts/demo_timeline.py --check     # exit status 1 if the picture is out of date

The script runs the demo workflow (``agentsnap demo``, ``agentsnap/demo.py``) with its journal
on, as the command does, in a memory store, and draws the run with ``agentsnap.timeline``, as
``agentsnap timeline RUN -o timeline.svg`` does from the database, with a time axis narrow
enough for the picture to read well in a page's column. The run id is fixed, so the picture
changes only where the run's timing or the drawing changes.

``--check`` compares the committed picture with a fresh drawing, leaving out what differs
from one run to the next (coordinates, times, ids): the lanes, messages, cuts, rollbacks,
labels and styles must be the same. The test suite does the same check.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from agentsnap import MemoryStore
from agentsnap.demo import run_demo
from agentsnap.timeline import load_timeline, render_svg

ROOT = Path(__file__).resolve().parent.parent
PICTURE = ROOT / "docs" / "assets" / "timeline.svg"
RUN_ID = "f12a245654bf502eba5132488d67724d"
"""The id the demo's run gets here, so that the picture's title does not change."""
PLOT_WIDTH = 560
"""Width of the picture's time axis, in pixels (730 in all: a README's or a page's column)."""

_SVG = "{http://www.w3.org/2000/svg}"
# Elements whose text is the same on every run (the rest names times, ids and payloads).
_STABLE_TEXT = {"agent", "cutlabel", "rblabel", "note", "title", "count"}


async def draw() -> str:
    """Run the demo and return its timeline as an SVG document."""
    store = MemoryStore()
    await run_demo(store, run_id=RUN_ID)
    return render_svg(await load_timeline(store, RUN_ID), plot_width=PLOT_WIDTH)


def outline(svg: str) -> list[str]:
    """What a drawing of the demo shows, one line per element, without what varies by run.

    Kept: every element's tag and class in document order, the size of the picture, the
    style sheet and marker definitions, and the text of names and labels. Left out: the
    time axis (its ticks follow the run's duration), coordinates, and the tooltips' text
    (times, ids and payloads).

    Raises:
        xml.etree.ElementTree.ParseError: ``svg`` is not well-formed XML.
        ValueError: ``svg`` is not an SVG document.
    """
    root = ET.fromstring(svg)  # noqa: S314  # our own output
    if root.tag != f"{_SVG}svg":
        raise ValueError(f"not an SVG document: the root element is {root.tag}")
    lines = [f"svg width={root.get('width')} height={root.get('height')}"]

    def visit(element: ET.Element, depth: int) -> None:
        tag = element.tag.removeprefix(_SVG)
        cls = element.get("class", "")
        if cls == "axis":
            return
        line = f"{'  ' * depth}{tag}"
        if cls:
            line += f".{cls.replace(' ', '.')}"
        if tag == "style":
            line += " " + " ".join((element.text or "").split())
        elif tag in {"marker", "path"} and depth <= 3 and not cls:  # the markers in <defs>
            line += " " + " ".join(f"{k}={v}" for k, v in sorted(element.attrib.items()))
        elif (tag == "text" and cls in _STABLE_TEXT) or (tag == "title" and depth == 1):
            line += f" {element.text or ''!r}"
        lines.append(line)
        for child in element:
            visit(child, depth + 1)

    for child in root:
        visit(child, 1)
    return lines


def main(argv: list[str] | None = None) -> int:
    """Write (or check) the picture; the exit status: 0 done, 1 out of date."""
    parser = argparse.ArgumentParser(description="Draw the demo's run as an SVG timeline.")
    parser.add_argument(
        "-o", "--output", type=Path, default=PICTURE, help=f"default: {PICTURE.relative_to(ROOT)}"
    )
    parser.add_argument(
        "--check", action="store_true", help="compare with the file instead of writing it"
    )
    args = parser.parse_args(argv)
    svg = asyncio.run(draw())
    if args.check:
        if not args.output.is_file():
            print(f"{args.output} is missing: run python scripts/demo_timeline.py", file=sys.stderr)
            return 1
        if outline(args.output.read_text(encoding="utf-8")) != outline(svg):
            print(
                f"{args.output} is not what the renderer draws now: "
                "run python scripts/demo_timeline.py",
                file=sys.stderr,
            )
            return 1
        print(f"{args.output} is up to date")
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(svg, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
