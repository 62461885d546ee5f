"""Run LangGraph's own test suite against ``AgentsnapSaver`` and report the counts.

LangGraph's graph tests (the ``tests/`` of its source distribution) run once per
checkpointer. This script takes the source distribution of the installed ``langgraph``
(``pip download langgraph==<version> --no-binary :all: --no-deps``, kept in a cache
directory), unpacks its ``tests/``, installs the few test-only packages they import
(``pytest-mock``, ``syrupy``, ``redis``, at the versions of LangGraph's own lock file) into
that cache, and runs pytest on them with ``langgraph_suite_plugin``, which adds an
``agentsnap`` checkpointer (``AgentsnapSaver`` on SQLite) to their checkpointer fixtures.
Only the cases on that checkpointer run (``-k agentsnap``).

Two sizes: by default a sample of a few hundred cases, a few minutes at most (what CI
runs); ``--full`` runs every case on the saver (a nightly run). Failures that are known
and explained (``KNOWN_FAILURES``) are reported apart and do not fail the run.

The cache directory is ``--cache``, else ``$AGENTSNAP_LANGGRAPH_SUITE_CACHE``, else
``~/.cache/agentsnap/langgraph-suite``; a CI job keeps it between runs.

Run it from the repository's root:

    python scripts/langgraph_suite.py            # the CI sample
    python scripts/langgraph_suite.py --full     # every agentsnap case
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys
import tarfile
import time
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The repository's root (agentsnap's package is imported from there)."""

TEST_PACKAGES = ("pytest-mock", "syrupy", "redis")
"""Packages LangGraph's tests import that agentsnap's development environment lacks."""

CI_SAMPLE = (
    "tests/test_checkpoint_migration.py",
    "tests/test_delta_channel_exit_mode.py",
    "tests/test_delta_channel_parallel_order.py",
    "tests/test_delta_channel_subgraph.py",
    "tests/test_delta_channel_update_state.py",
    "tests/test_interrupt_state.py",
    "tests/test_interruption.py",
    "tests/test_strict_resume.py",
    "tests/test_subgraph_persistence.py",
    "tests/test_subgraph_persistence_async.py",
    "tests/test_time_travel.py",
)
"""The files whose agentsnap cases CI runs (about 230 cases, a minute): checkpoints,
interrupts, subgraphs, time travel and delta channels."""

CI_BUDGET = 240.0
"""Seconds the CI sample may take, at most."""

FULL_BUDGET = 3600.0
"""Seconds the full run may take, at most."""

UNAVAILABLE = 3
"""The exit status when the suite or its test packages could not be downloaded."""

_OWN_SAVERS_FAIL = (
    "fails on LangGraph's own savers too: the installed langchain-core adds metadata to "
    "the messages streamed that the test does not expect"
)

KNOWN_FAILURES: dict[str, str] = {
    "tests/test_large_cases.py::test_weather_subgraph[agentsnap]": _OWN_SAVERS_FAIL,
    "tests/test_large_cases_async.py::test_weather_subgraph[agentsnap]": _OWN_SAVERS_FAIL,
}
"""Cases expected to fail on the saver, by test id (``file::name[params]``), with why."""


@dataclass
class Counts:
    """What a run of the suite gave."""

    passed: int = 0
    failed: list[str] = field(default_factory=list)
    skipped: int = 0
    seconds: float = 0.0

    @property
    def unexpected(self) -> list[str]:
        """The failures not in ``KNOWN_FAILURES``."""
        return [name for name in self.failed if name not in KNOWN_FAILURES]


def cache_dir(given: str | None) -> Path:
    """The cache directory: ``given``, the environment's, or the user's cache."""
    found = given or os.environ.get("AGENTSNAP_LANGGRAPH_SUITE_CACHE")
    return Path(found) if found else Path.home() / ".cache" / "agentsnap" / "langgraph-suite"


def fetch_tests(cache: Path, version: str) -> Path:
    """The unpacked source distribution of ``langgraph==version`` (its tests and config)."""
    unpacked = cache / f"langgraph-{version}"
    if (unpacked / "tests" / "conftest.py").exists():
        return unpacked
    sdist = cache / f"langgraph-{version}.tar.gz"
    if not sdist.exists():
        cache.mkdir(parents=True, exist_ok=True)
        _run(
            sys.executable,
            "-m",
            "pip",
            "download",
            f"langgraph=={version}",
            "--no-binary",
            ":all:",
            "--no-deps",
            "--disable-pip-version-check",
            "-d",
            str(cache),
        )
    prefix = f"langgraph-{version}/"
    with tarfile.open(sdist) as archive:
        members = [
            member
            for member in archive.getmembers()
            if member.name.startswith(f"{prefix}tests/")
            or member.name in {f"{prefix}pyproject.toml", f"{prefix}uv.lock"}
        ]
        archive.extractall(cache, members=members, filter="data")
    return unpacked


def install_test_packages(cache: Path, unpacked: Path) -> Path:
    """A folder holding ``TEST_PACKAGES`` at the versions of LangGraph's lock file."""
    lock = tomllib.loads((unpacked / "uv.lock").read_text(encoding="utf-8"))
    versions = {
        package["name"]: package["version"]
        for package in lock.get("package", [])
        if "version" in package
    }
    pins = [f"{name}=={versions[name]}" if name in versions else name for name in TEST_PACKAGES]
    target = cache / ("deps-" + "-".join(pin.replace("==", "_") for pin in pins))
    if not target.exists():
        partial = target.with_name(target.name + ".partial")
        _run(
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--target",
            str(partial),
            *pins,
        )
        partial.rename(target)
    return target


def run_suite(
    unpacked: Path,
    packages: Path,
    *,
    full: bool,
    select: str | None,
    budget: float,
    extra: list[str],
) -> Counts:
    """Run the agentsnap cases of the suite; their counts."""
    report = unpacked / "agentsnap-report.xml"
    report.unlink(missing_ok=True)
    expression = "agentsnap" if not select else f"agentsnap and ({select})"
    paths = ["tests"] if full else list(CI_SAMPLE)
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "langgraph_suite_plugin",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rfE",
        "-o",
        "asyncio_default_fixture_loop_scope=function",
        "-k",
        expression,
        f"--junitxml={report}",
        *paths,
        *extra,
    ]
    python_path = os.pathsep.join(
        [str(packages), str(ROOT / "scripts"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    )
    # NO_DOCKER: LangGraph's fixtures leave out their PostgreSQL and Redis servers.
    env = {**os.environ, "NO_DOCKER": "true", "PYTHONPATH": python_path}
    started = time.monotonic()
    try:
        subprocess.run(command, cwd=unpacked, env=env, check=False, timeout=budget)  # noqa: S603
    except subprocess.TimeoutExpired:
        print(f"the suite ran over its budget of {budget:.0f} s", file=sys.stderr)
    counts = read_report(report)
    counts.seconds = time.monotonic() - started
    return counts


def read_report(report: Path) -> Counts:
    """The counts of a pytest JUnit XML report (none when the run left no report)."""
    counts = Counts()
    if not report.exists():
        return counts
    for case in ET.parse(report).getroot().iter("testcase"):  # noqa: S314 (our own report)
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            counts.failed.append(name)
        elif case.find("skipped") is not None:
            counts.skipped += 1
        else:
            counts.passed += 1
    return counts


def print_counts(counts: Counts, version: str, *, full: bool) -> None:
    """Print the counts, and each failure (the known ones with their reason)."""
    size = "every agentsnap case" if full else "the CI sample"
    print(
        f"LangGraph {version}'s tests on AgentsnapSaver ({size}): {counts.passed} passed, "
        f"{len(counts.failed)} failed, {counts.skipped} skipped in {counts.seconds:.0f} s"
    )
    for name in counts.failed:
        reason = KNOWN_FAILURES.get(name)
        print(f"  known: {name}: {reason}" if reason else f"  FAILED: {name}")


def _run(*command: str) -> None:
    subprocess.run(command, check=True)  # noqa: S603


def main(argv: list[str] | None = None) -> int:
    """Fetch, run and report.

    Returns:
        0 when every case passed or failed as known, 1 otherwise, ``UNAVAILABLE`` when the
        suite or its test packages could not be downloaded.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--full", action="store_true", help="every agentsnap case")
    parser.add_argument("--cache", help="the cache directory")
    parser.add_argument("-k", dest="select", help="a further pytest -k expression")
    parser.add_argument("--budget", type=float, help="seconds the run may take")
    parser.add_argument("pytest_args", nargs="*", help="more arguments for pytest (after --)")
    args = parser.parse_args(argv)
    version = importlib.metadata.version("langgraph")
    cache = cache_dir(args.cache)
    try:
        unpacked = fetch_tests(cache, version)
        packages = install_test_packages(cache, unpacked)
    except subprocess.CalledProcessError as exc:
        print(f"LangGraph's tests could not be fetched: {exc}", file=sys.stderr)
        return UNAVAILABLE
    budget = args.budget or (FULL_BUDGET if args.full else CI_BUDGET)
    counts = run_suite(
        unpacked,
        packages,
        full=args.full,
        select=args.select,
        budget=budget,
        extra=args.pytest_args,
    )
    print_counts(counts, version, full=args.full)
    if counts.passed == 0 or counts.unexpected:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
