"""Run every fault of the suite once and print what the workload went through, as a table.

From the repository's root::

    .venv/bin/python -m tests.faults.report                  # all five faults
    .venv/bin/python -m tests.faults.report --fault pg-drop --fault sqlite-locked
    .venv/bin/python -m tests.faults.report --deadline 0     # retry nothing
    .venv/bin/python -m tests.faults.report --library-defaults  # SqlStore(url), no retry=

It makes what the tests' fixtures make: a private PostgreSQL server (never the shared one),
a proxy per PostgreSQL fault, an SQLite file per SQLite fault, a tmpfs for the disk-full
fault (as root). A fault that cannot be set up here is listed with the reason. Warnings are
errors, as in the test suite, so the figures are the ones the tests see. Prints a markdown
table of each run's figures (see ``FaultReport``), then the broken guarantees of each, and
exits with status 1 if any fault broke one.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

from .disk import DiskUnavailable
from .pg_server import PostgresServer, PostgresUnavailable
from .scenarios import SCENARIOS, Scenario, prepared
from .workload import FaultReport, Workload, run_under_fault


def markdown(rows: Sequence[dict[str, str]]) -> str:
    """Rows of cells (the same keys in each) as a markdown table."""
    if not rows:
        return "(nothing ran)"
    header = list(rows[0])
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    for row in rows:
        cells = [row.get(name, "").replace("|", "\\|") for name in header]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


async def run_one(
    scenario: Scenario, workload: Workload, server: PostgresServer | None, workdir: Path
) -> FaultReport:
    """Set ``scenario`` up, run the workload under it, and tear it down."""
    with prepared(scenario, server=server, workdir=workdir / scenario.name) as (url, fault):
        return await run_under_fault(url, fault, workload)


def skipped(scenario: Scenario, reason: str, workload: Workload) -> FaultReport:
    """A report row for a fault that could not be set up here."""
    report = FaultReport(fault=scenario.name, url="-", hops_expected=workload.expected_hops)
    report.status = "skipped"
    report.error = reason
    return report


async def main(options: argparse.Namespace) -> int:
    """Run the chosen faults; print the table; 1 if a guarantee broke, else 0."""
    workload = Workload(timeout=options.timeout, deadline=options.deadline, retry=options.retry)
    chosen = [
        s if options.seconds is None else dataclasses.replace(s, seconds=options.seconds)
        for s in SCENARIOS
        if not options.fault or s.name in options.fault
    ]
    server: PostgresServer | None = None
    server_error = ""
    if any(s.backend == "postgres" for s in chosen):
        try:
            server = await asyncio.to_thread(PostgresServer.create)
        except PostgresUnavailable as exc:
            server_error = str(exc)
    reports: list[tuple[Scenario, FaultReport]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="agentsnap-faults-") as folder:
            for scenario in chosen:
                print(f"running {scenario.name} ({scenario.seconds:.0f} s)...", file=sys.stderr)
                if scenario.backend == "postgres" and server is None:
                    reports.append((scenario, skipped(scenario, server_error, workload)))
                    continue
                try:
                    report = await run_one(scenario, workload, server, Path(folder))
                except DiskUnavailable as exc:
                    report = skipped(scenario, str(exc), workload)
                report.fault = scenario.name
                reports.append((scenario, report))
    finally:
        if server is not None:
            await asyncio.to_thread(server.close)
    retry = (
        f"StoreRetry(timeout={workload.timeout}, deadline={workload.deadline})"
        if workload.retry
        else "SqlStore(url) with the library's default retry"
    )
    print(
        f"## Faults: {workload.chains} chains x {workload.hops} hops, {retry}, snapshots every "
        f"{workload.snapshot_every} s, journal on\n"
    )
    print(markdown([report.row() for _, report in reports]))
    broken = 0
    for scenario, report in reports:
        if report.status == "skipped":
            continue
        problems = report.problems()
        if problems:
            broken += 1
            print(f"\n### {scenario.name}: {len(problems)} problem(s)\n")
            print("\n".join(f"- {problem}" for problem in problems))
    return 1 if broken else 0


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line's options."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.faults.report", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--fault",
        action="append",
        choices=[s.name for s in SCENARIOS],
        help="run only this fault (repeatable; default: all)",
    )
    parser.add_argument(
        "--library-defaults",
        dest="retry",
        action="store_false",
        help="make the store as SqlStore(url), without retry= (the library's defaults)",
    )
    parser.add_argument(
        "--seconds", type=float, help="how long each fault lasts (default: each one's own)"
    )
    parser.add_argument("--timeout", type=float, default=1.0, help="StoreRetry timeout (s)")
    parser.add_argument("--deadline", type=float, default=60.0, help="StoreRetry deadline (s)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show agentsnap's log")
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse(sys.argv[1:])
    warnings.simplefilter("error")
    if arguments.verbose:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(asyncio.run(main(arguments)))
