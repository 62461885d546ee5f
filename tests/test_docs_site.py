"""The documentation site's navigation and its pages agree (the build itself is `make docs`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _nav_pages(entries: Any) -> list[str]:
    pages: list[str] = []
    for entry in entries:
        if isinstance(entry, str):
            pages.append(entry)
        else:
            for value in entry.values():
                pages.extend([value] if isinstance(value, str) else _nav_pages(value))
    return pages


NAV = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])


def test_every_nav_entry_is_a_page() -> None:
    missing = [page for page in NAV if not (DOCS / page).is_file()]
    assert not missing, f"in mkdocs.yml's nav but not in docs/: {missing}"


def test_every_page_is_in_the_nav() -> None:
    pages = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")}
    assert not pages - set(NAV), f"in docs/ but not in mkdocs.yml's nav: {sorted(pages - set(NAV))}"


def test_no_page_is_listed_twice() -> None:
    assert len(NAV) == len(set(NAV))
