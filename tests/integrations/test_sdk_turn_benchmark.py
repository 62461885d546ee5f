"""``benchmarks/sdk_turn.py --quick`` runs its three sides and reports every figure.

No figure is checked against a target here: timings belong to the benchmark's own report.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_quick_benchmark_reports_every_side() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sdk_turn.py"), "--quick", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout)["sqlite"]
    for side in ("plain", "agentsnap", "dbos"):
        assert figures[f"{side}_ms_per_turn"] > 0
    assert len(figures["overhead_ratio_spread"]) == 2
    assert isinstance(figures["target_met"], bool)
