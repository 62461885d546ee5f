"""Every Python code block in the README and in docs/ runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A block may carry a title (```python title="bank.py"); ```py blocks are shown, not run.
BLOCK = re.compile(r"^```python(?: [^\n]*)?\n(.*?)^```", re.S | re.M)


def _blocks() -> list[tuple[str, str]]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found: list[tuple[str, str]] = []
    for path in files:
        for index, match in enumerate(BLOCK.finditer(path.read_text()), start=1):
            found.append((f"{path.relative_to(ROOT)}#{index}", match.group(1)))
    return found


BLOCKS = _blocks()


def test_the_readme_has_code_to_run() -> None:
    assert any(name.startswith("README.md") for name, _ in BLOCKS)


@pytest.mark.parametrize(("name", "code"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_code_block_runs(name: str, code: str, tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, "-W", "error", str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"
