"""Render a run's HTML timeline to a PNG with headless Chromium.

    python scripts/render_timeline.py run.html -o run.png
    python scripts/render_timeline.py RUN_ID --db sqlite:///agentsnap.db -o run.png

The first form takes a page written by ``agentsnap timeline RUN -o run.html``; the second
draws the run itself. Chromium is looked for as ``--chromium``, else ``$CHROMIUM``, else
``chromium``, ``chromium-browser``, ``google-chrome`` on the PATH; without it the script says
so and exits with status 2. It needs a browser, so the test suite does not run it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium(given: str | None) -> str | None:
    """The Chromium executable to use, or ``None`` when there is none."""
    if given:
        return given if Path(given).is_file() or shutil.which(given) else None
    env = os.environ.get("CHROMIUM")
    if env:
        return env if Path(env).is_file() or shutil.which(env) else None
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def run_page(run_id: str, db: str) -> str:
    """The HTML timeline of run ``run_id`` in the database at ``db``."""
    from agentsnap.store.sql import SqlStore  # noqa: PLC0415
    from agentsnap.timeline import load_timeline, render_html  # noqa: PLC0415

    async def go() -> str:
        store = SqlStore(db, create=False)
        try:
            return render_html(await load_timeline(store, run_id))
        finally:
            await store.close()

    return asyncio.run(go())


def page_size(page: str) -> tuple[int, int]:
    """A window large enough for the page's diagram."""
    match = re.search(r'<svg[^>]*\bwidth="(\d+)"[^>]*\bheight="(\d+)"', page)
    if match is None:
        return 1600, 1000
    return int(match.group(1)) + 60, int(match.group(2)) + 140


def main(argv: list[str] | None = None) -> int:
    """Write the PNG; the exit status: 0 written, 1 failed, 2 no Chromium."""
    parser = argparse.ArgumentParser(description="Render a run's HTML timeline to a PNG.")
    parser.add_argument("source", help="an .html file written by agentsnap timeline, or a run id")
    parser.add_argument("-o", "--output", required=True, help="the PNG file to write")
    parser.add_argument(
        "--db",
        default=os.environ.get("AGENTSNAP_DB", "sqlite:///agentsnap.db"),
        help="database URL, when SOURCE is a run id (default: $AGENTSNAP_DB)",
    )
    parser.add_argument("--chromium", default=None, help="the Chromium executable")
    args = parser.parse_args(argv)

    chromium = find_chromium(args.chromium)
    if chromium is None:
        print(
            "render_timeline: Chromium not found (install chromium, or give --chromium PATH "
            "or set CHROMIUM)",
            file=sys.stderr,
        )
        return 2
    source = Path(args.source)
    if source.suffix.lower() == ".html" and source.is_file():
        page = source.read_text(encoding="utf-8")
    else:
        try:
            page = run_page(args.source, args.db)
        except Exception as exc:
            print(f"render_timeline: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    width, height = page_size(page)
    output = Path(args.output).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "timeline.html"
        html.write_text(page, encoding="utf-8")
        done = subprocess.run(  # noqa: S603  # the browser the user chose
            [
                chromium,
                "--headless",
                "--disable-gpu",
                "--no-sandbox",
                "--hide-scrollbars",
                f"--user-data-dir={Path(tmp) / 'profile'}",
                f"--window-size={width},{height}",
                f"--screenshot={output}",
                html.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    if done.returncode != 0 or not output.is_file():
        print(f"render_timeline: chromium failed:\n{done.stderr.strip()}", file=sys.stderr)
        return 1
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
