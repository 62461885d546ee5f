"""Compare two revisions of agentsnap on one benchmark, side by side in one run.

Usage::

    python benchmarks/compare.py BASE HEAD BENCHMARK [--rounds N] [--scripts REV] [-- ARGS...]

Each revision is checked out into a temporary git worktree. Rounds alternate which side runs
first; every round runs ``benchmarks/BENCHMARK.py --json --quick`` once per side, with the
revision's own package first on ``PYTHONPATH``. For every number the benchmark reports, the
output gives the median of the per-round ratios head/base, their min and max, and each
side's median. A ratio is taken within a round, so that slow phases of a shared machine
touch both sides alike.

``--scripts REV`` runs the benchmark scripts of ``REV`` on both sides (by default each side
runs its own): the same work, when the scripts themselves changed between the revisions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _flat(data: Mapping[str, object], prefix: str = "") -> Iterator[tuple[str, float]]:
    for key, value in data.items():
        if isinstance(value, Mapping):
            yield from _flat(value, f"{prefix}{key}.")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            yield f"{prefix}{key}", float(value)


def _worktree(rev: str, into: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(into), rev],
        check=True,
        capture_output=True,
    )
    return into


def _run(root: Path, scripts: Path, benchmark: str, args: list[str]) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(root))
    done = subprocess.run(
        [sys.executable, str(scripts / f"{benchmark}.py"), "--json", "--quick", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{benchmark} failed in {root}:\n{done.stderr[-3000:]}")
    return dict(_flat(json.loads(done.stdout.strip().splitlines()[-1])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base")
    parser.add_argument("head")
    parser.add_argument("benchmark", help="a file of benchmarks/, without .py (e.g. bus)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scripts", help="run this revision's benchmark scripts on both sides")
    argv = sys.argv[1:]
    # What follows "--" goes to the benchmark as it is (argparse would take it for its own).
    passed = argv[argv.index("--") + 1 :] if "--" in argv else []
    options = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    options.args = passed
    if options.rounds < 1:
        parser.error("--rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="agentsnap-compare-") as tmp:
        trees = {
            side: _worktree(rev, Path(tmp) / side)
            for side, rev in (("base", options.base), ("head", options.head))
        }
        shared = None
        if options.scripts:
            shared = _worktree(options.scripts, Path(tmp) / "scripts") / "benchmarks"
        try:
            results: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
            for round_ in range(options.rounds):
                for side in ("head", "base") if round_ % 2 == 0 else ("base", "head"):
                    scripts = shared or trees[side] / "benchmarks"
                    results[side].append(
                        _run(trees[side], scripts, options.benchmark, options.args)
                    )
        finally:
            for tree in (*trees.values(), *([shared.parent] if shared else [])):
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                    check=False,
                    capture_output=True,
                )
    heads, bases = results["head"], results["base"]
    print(
        f"{options.benchmark}: {options.rounds} rounds, head {options.head} / base "
        f"{options.base}: median ratio [min..max], head median, base median"
    )
    for key in sorted(heads[0]):
        ratios = [h[key] / b[key] for h, b in zip(heads, bases, strict=True) if b.get(key)]
        if not ratios or key not in bases[0]:
            continue
        print(
            f"  {key:58s} {statistics.median(ratios):6.3f} "
            f"[{min(ratios):.3f}..{max(ratios):.3f}]  "
            f"head {statistics.median(h[key] for h in heads):.4g}  "
            f"base {statistics.median(b[key] for b in bases):.4g}"
        )


if __name__ == "__main__":
    main()
