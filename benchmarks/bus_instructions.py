"""Instructions per message of ``bus.py``'s hand-off and ping-pong, for code trees side by side.

``ratio_vs_queue`` and ``pingpong_ratio`` of ``bus.py`` are timed, and a timing on a shared
machine moves by more than the few percent a change of the delivery path makes. This program
counts them in instructions instead: each of ``bus.py``'s four scenarios runs in a process
of its own under ``valgrind --tool=callgrind --instr-atstart=no``, ``PYTHONHASHSEED=0``:

* ``queue_handoff``: one producer task hands N items to one consumer task on an
  ``asyncio.Queue`` (``bus.queue_handoff``);
* ``bus_handoff``: the program sends N messages to one counting agent on the default runtime
  (``bus.bus_handoff``);
* ``queue_pingpong``: two tasks bounce one item N times through two queues
  (``bus.queue_pingpong``);
* ``bus_pingpong``: two agents bounce one message N times (``bus.bus_pingpong``).

A process runs a warm-up of 200 messages uninstrumented, then has ``callgrind_control``
switch instrumentation on and zero the counters, runs the scenario with n1 messages, has the
count dumped, runs it with n2 messages and has that count dumped (n1, n2 = 2,000, 10,000;
500, 2,500 with ``--quick``). The scenario's cost is ``(I(n2) - I(n1)) / (n2 - n1)``
instructions per message: creating and closing the event loop and the runtime is in both
counts and cancels out. The ratios are those of ``bus.py`` in instructions:
``ratio_vs_queue = queue_handoff / bus_handoff`` and
``pingpong_ratio = queue_pingpong / bus_pingpong`` (the fewer instructions the bus spends
beside the queue, the higher).

Each ``--tree`` is a checkout of agentsnap (a folder holding the ``agentsnap`` package), put
first on ``sys.path`` of its processes; the scenarios are those of the ``bus.py`` beside this
program, so every tree runs the same benchmark code. The processes run interleaved, two at a
time (``--jobs``): for each scenario the trees one after the other, their order reversed
every round (``--rounds``, figures are medians over the rounds). The table gives every tree's
figures and, for each further tree, its relative difference from the first; the same tree
given twice shows the noise floor. ``--tolerance`` (3 % by default) says whether each tree's
ratios stay that close to the first tree's; it does not change the exit status.

To compare a revision with the working tree, check it out into a worktree first::

    git worktree add --detach /tmp/agentsnap-base main
    python benchmarks/bus_instructions.py --tree /tmp/agentsnap-base --tree .

A process takes 5 to 15 seconds on an idle machine (more under load), a round of two trees
about half a minute; ``--json`` prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

SCENARIOS = ("queue_handoff", "bus_handoff", "queue_pingpong", "bus_pingpong")
# figure: (baseline scenario, bus scenario); the figure is baseline / bus
RATIOS = {
    "ratio_vs_queue": ("queue_handoff", "bus_handoff"),
    "pingpong_ratio": ("queue_pingpong", "bus_pingpong"),
}
COUNTS = {"full": (2_000, 10_000), "quick": (500, 2_500)}
WARM_UP_MESSAGES = 200  # run before callgrind starts counting
CHILD = "--child"  # how the program calls itself under valgrind
LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


# -- under valgrind ------------------------------------------------------------------------------


def _callgrind(request: str) -> None:
    """Send ``request`` to the callgrind running this process; wait until it is done.

    Callgrind acts on a request while the process runs, so the wait is a poll that sleeps,
    not a blocking wait (as in ``bus.py``).
    """
    switch = subprocess.Popen(
        ["callgrind_control", request, str(os.getpid())],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while switch.poll() is None:
        time.sleep(0.002)


def _child(tree: str, scenario: str, counts: tuple[int, int]) -> None:
    """Under callgrind (started with instrumentation off): run ``scenario`` with ``tree``'s
    agentsnap, a warm-up uninstrumented, then ``counts[0]`` and ``counts[1]`` messages, each
    count dumped; print where agentsnap came from and end without the interpreter's teardown.
    """
    sys.path.insert(0, tree)
    import bus

    import agentsnap

    run: Callable[[int], Coroutine[Any, Any, float]] = getattr(bus, scenario)
    asyncio.run(run(WARM_UP_MESSAGES))
    gc.collect()
    _callgrind("--instr=on")
    _callgrind("--zero")
    for n in counts:
        asyncio.run(run(n))
        _callgrind("--dump")
    _callgrind("--instr=off")
    print(json.dumps({"agentsnap": agentsnap.__file__}))
    sys.stdout.flush()
    os._exit(0)


# -- the driver ----------------------------------------------------------------------------------


def _instructions(tree: Path, scenario: str, counts: tuple[int, int]) -> float:
    """Instructions per message of ``scenario`` on ``tree``: one process under callgrind."""
    with tempfile.TemporaryDirectory(prefix="agentsnap-bus-instructions-") as folder:
        out = Path(folder) / "callgrind.out"
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={out}",
                f"--log-file={folder}/valgrind.log",
                sys.executable,
                str(Path(__file__).resolve()),
                CHILD,
                str(tree),
                scenario,
                *map(str, counts),
            ],
            env={**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(tree)},
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            log = Path(folder, "valgrind.log").read_text(errors="replace")
            raise SystemExit(
                f"{scenario} failed on {tree} (status {done.returncode}):\n"
                f"{done.stderr[-3000:]}{log[-2000:]}"
            )
        loaded = Path(json.loads(done.stdout.strip().splitlines()[-1])["agentsnap"]).resolve()
        if not loaded.is_relative_to(tree):
            raise SystemExit(f"{scenario} ran the agentsnap of {loaded}, not of {tree}")
        found = []
        for dump in (1, 2):
            summary = re.search(r"^summary:\s*(\d+)", Path(f"{out}.{dump}").read_text(), re.M)
            if summary is None:
                raise SystemExit(f"no instruction count from callgrind for {scenario} on {tree}")
            found.append(int(summary.group(1)))
    small, large = counts
    return (found[1] - found[0]) / (large - small)


def _revision(tree: Path) -> str:
    """The tree's commit, with ``+changes`` when its package differs from the commit."""
    head = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    if head.returncode != 0:
        return "not a git checkout"
    changes = subprocess.run(
        ["git", "-C", str(tree), "status", "--porcelain", "--", "agentsnap"],
        capture_output=True,
        text=True,
        check=False,
    )
    return head.stdout.strip() + (" +changes" if changes.stdout.strip() else "")


def measure(
    trees: list[Path], counts: tuple[int, int], rounds: int, jobs: int, tolerance: float
) -> dict[str, Any]:
    """Count every scenario on every tree, ``rounds`` times, and return the figures."""
    began = time.perf_counter()
    # For each scenario the trees one after the other, their order reversed every round: the
    # trees' runs of one scenario are neighbours in time (and run together with two jobs).
    order = [
        (round_, scenario, index)
        for round_ in range(rounds)
        for scenario in SCENARIOS
        for index in (range(len(trees)) if round_ % 2 == 0 else reversed(range(len(trees))))
    ]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        found = list(pool.map(lambda job: _instructions(trees[job[2]], job[1], counts), order))
    samples: list[dict[str, list[float]]] = [{s: [] for s in SCENARIOS} for _ in trees]
    for (_, scenario, index), value in zip(order, found, strict=True):
        samples[index][scenario].append(value)

    results: list[dict[str, Any]] = []
    for tree, per_scenario in zip(trees, samples, strict=True):
        figures: dict[str, float] = {s: statistics.median(v) for s, v in per_scenario.items()}
        for ratio, (baseline, subject) in RATIOS.items():
            per_round = [
                b / s for b, s in zip(per_scenario[baseline], per_scenario[subject], strict=True)
            ]
            figures[ratio] = statistics.median(per_round)
        results.append(
            {
                "tree": str(tree),
                "revision": _revision(tree),
                "instructions_per_msg": {s: round(figures[s], 1) for s in SCENARIOS},
                **{ratio: round(figures[ratio], 5) for ratio in RATIOS},
                "samples_instructions_per_msg": {
                    s: [round(v, 1) for v in values] for s, values in per_scenario.items()
                },
                # the widest (max - min) / median of a scenario over the rounds
                "spread": round(
                    max((max(v) - min(v)) / statistics.median(v) for v in per_scenario.values()),
                    6,
                ),
                "_figures": figures,
            }
        )
    first = results[0]["_figures"]
    for result in results[1:]:
        figures = result["_figures"]
        result["relative_to_first"] = {
            name: round(figures[name] / first[name] - 1, 6) for name in (*SCENARIOS, *RATIOS)
        }
        result["ratios_within_tolerance"] = all(
            abs(figures[ratio] / first[ratio] - 1) <= tolerance for ratio in RATIOS
        )
    for result in results:
        del result["_figures"]
    return {
        "benchmark": "agentsnap bus, instructions per message",
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "method": "callgrind, PYTHONHASHSEED=0, per message (I(n2) - I(n1)) / (n2 - n1)",
        "counts": list(counts),
        "rounds": rounds,
        "tolerance": tolerance,
        "trees": results,
        "elapsed_s": round(time.perf_counter() - began, 1),
    }


def _table(r: dict[str, Any]) -> str:
    trees = r["trees"]
    n1, n2 = r["counts"]
    labels = LABELS[: len(trees)]
    lines = [
        f"agentsnap bus, instructions per message: callgrind, PYTHONHASHSEED=0, "
        f"(I({n2}) - I({n1})) / {n2 - n1}",
        f"{r['python_implementation']} {r['python']}, {r['cpu_count']} CPUs, "
        f"{r['rounds']} round(s), medians over rounds",
    ]
    lines += [
        f"  {label}: {t['tree']} ({t['revision']})" for label, t in zip(labels, trees, strict=True)
    ]
    header = f"{'figure':<16}" + "".join(f"{label:>12}" for label in labels)
    header += "".join(f"{f'{label}/A - 1':>12}" for label in labels[1:])
    lines += ["", header]
    for name in (*SCENARIOS, *RATIOS):
        if name in RATIOS:
            row = f"{name:<16}" + "".join(f"{t[name]:>12.4f}" for t in trees)
        else:
            row = f"{name:<16}" + "".join(
                f"{t['instructions_per_msg'][name]:>12,.1f}" for t in trees
            )
        row += "".join(f"{t['relative_to_first'][name]:>+12.4%}" for t in trees[1:])
        lines.append(row)
    lines.append("")
    if r["rounds"] > 1:
        spreads = ", ".join(
            f"{label} {t['spread']:.4%}" for label, t in zip(labels, trees, strict=True)
        )
        lines.append(
            f"widest spread of a scenario over the rounds, (max - min) / median: {spreads}"
        )
    for label, t in zip(labels[1:], trees[1:], strict=True):
        ok = "yes" if t["ratios_within_tolerance"] else "NO"
        lines.append(f"{label}'s ratios within {r['tolerance']:.0%} of A's: {ok}")
    lines.append(f"total {r['elapsed_s']} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 5 and args[0] == CHILD:
        _child(args[1], args[2], (int(args[3]), int(args[4])))
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--tree",
        action="append",
        type=Path,
        required=True,
        help="a checkout of agentsnap (repeat; the first is the reference)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every run (1)")
    parser.add_argument("--jobs", type=int, default=2, help="processes at a time (2)")
    parser.add_argument(
        "--tolerance", type=float, default=0.03, help="ratios' allowed relative difference"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"n1, n2 = {COUNTS['quick']} instead of {COUNTS['full']}",
    )
    options = parser.parse_args(args)
    if options.rounds < 1 or options.jobs < 1:
        parser.error("--rounds and --jobs must be at least 1")
    trees = [tree.resolve() for tree in options.tree]
    for tree in trees:
        if not (tree / "agentsnap" / "__init__.py").is_file():
            parser.error(f"{tree} holds no agentsnap package")
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            parser.error(f"{tool} is not installed")
    counts = COUNTS["quick" if options.quick else "full"]
    results = measure(trees, counts, options.rounds, options.jobs, options.tolerance)
    print(json.dumps(results) if options.json else _table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
