"""Every example runs, checks itself, and documents the command that runs it."""

from __future__ import annotations

import ast
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from nats_server import SHARED_URL, reachable, unavailable
from postgres_db import postgres_url_or_skip

from agentsnap._hints import cli_words

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# Small, quick argument sets for each example: one run per entry. A new example needs an entry
# here (an empty list of arguments, [[]], if its defaults are already quick).
EXAMPLE_ARGS: dict[str, list[list[str]]] = {
    "approvals.py": [[]],
    "bank_transfers.py": [
        ["--agents", "4", "--transfers", "200", "--snapshot-every", "20", "--seed", "3"],
        [
            "--agents",
            "4",
            "--transfers",
            "200",
            "--snapshot-every",
            "20",
            "--seed",
            "3",
            "--deterministic",
        ],
    ],
    "distributed_bank.py": [
        ["--workers", "3", "--transfers", "300", "--nats", "NATS", "--db", "POSTGRES"],
        [
            "--workers",
            "2",
            "--tellers",
            "4",
            "--transfers",
            "200",
            "--snapshot-every",
            "0.05",
            "--nats",
            "NATS",
            "--db",
            "POSTGRES",
        ],
    ],
    "langchain_agent.py": [[]],
    "langgraph_agents.py": [[]],
    "mcp_tools.py": [[]],
    "openai_agents_agent.py": [[]],
    "payments.py": [["--orders", "2"]],
    "pydantic_ai_agent.py": [[]],
    "research_team.py": [[]],
    "redaction.py": [[]],
    "sdk_team.py": [[]],
    "state_versions.py": [[]],
}

# What each example prints when all its checks pass.
SUCCESS: dict[str, str] = {
    "approvals.py": "each approved refund paid exactly once, the denied one never",
    "bank_transfers.py": "all snapshots consistent",
    "distributed_bank.py": "all snapshots consistent",
    "langchain_agent.py": "the answer was redone after the review, and the order was refunded once",
    "langgraph_agents.py": "the quote was fixed after the review, and the stock was reserved once",
    "mcp_tools.py": "the transfer reached the bank once, across the rollback",
    "openai_agents_agent.py": "the answer was fixed after the review, and the refund was made once",
    "payments.py": "every order charged exactly once",
    "redaction.py": "the card number is nowhere in the database",
    "pydantic_ai_agent.py": "the answer was fixed after the review, and the refund happened once",
    "research_team.py": "the team recovered from the rejected draft",
    "sdk_team.py": "the critic's rejection took the whole team back, and the email went out once",
    "state_versions.py": "the runs stored before the deploy resume and fork under version 2",
}
TIMEOUT = 60
SERVICES = {"--nats": "nats", "--db": "postgres"}
"""Options whose value is a service's URL: the test's own is put in, or the test skips."""


def with_services(args: list[str]) -> list[str]:
    """``args`` with the test's NATS server and PostgreSQL database after ``--nats``/``--db``.

    Skips the test when the service is not there (an example that needs none is unchanged).
    """
    given = list(args)
    for i, word in enumerate(given[:-1]):
        service = SERVICES.get(word)
        if service == "nats":
            if not reachable(SHARED_URL):
                unavailable(f"no NATS server at {SHARED_URL}")
            given[i + 1] = SHARED_URL
        elif service == "postgres":
            given[i + 1] = postgres_url_or_skip()
    return given


HELPERS = {"mail_server.py", "mcp_server.py"}
"""Modules an example starts (a server), not examples of their own."""


def discover() -> list[str]:
    return sorted(
        path.name
        for path in EXAMPLES.glob("*.py")
        if not path.name.startswith("_") and path.name not in HELPERS
    )


def run_params() -> list[object]:
    params: list[object] = []
    for name in discover():
        runs = EXAMPLE_ARGS.get(name)
        if runs is None:
            # Still collected, so the missing entry fails loudly instead of going unnoticed.
            params.append(pytest.param(name, None, id=f"{name}-no-entry"))
            continue
        params.extend(
            pytest.param(name, args, id=f"{name}-{' '.join(args) or 'defaults'}") for args in runs
        )
    return params


def run_example(path: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(path), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def docstring_command(name: str) -> str:
    docstring = ast.get_docstring(ast.parse((EXAMPLES / name).read_text(encoding="utf-8")))
    assert docstring, f"examples/{name} has no module docstring"
    lines = [line.strip() for line in docstring.splitlines() if line.strip()]
    return lines[-1]


def test_there_are_examples() -> None:
    assert discover(), f"no examples found in {EXAMPLES}"


def test_argument_table_has_no_stale_entries() -> None:
    stale = sorted(set(EXAMPLE_ARGS) - set(discover()))
    assert not stale, f"EXAMPLE_ARGS in tests/test_examples.py lists missing examples: {stale}"


@pytest.mark.parametrize("name", discover())
def test_every_example_has_an_argument_entry(name: str) -> None:
    assert name in EXAMPLE_ARGS, (
        f"examples/{name} has no entry in EXAMPLE_ARGS in tests/test_examples.py; add one "
        "with arguments that run it in a few seconds"
    )
    assert EXAMPLE_ARGS[name], f"EXAMPLE_ARGS[{name!r}] is empty; give at least one run"
    assert name in SUCCESS, (
        f"examples/{name} has no entry in SUCCESS in tests/test_examples.py; add the line it "
        "prints when its checks pass"
    )


@pytest.mark.parametrize(("name", "args"), run_params())
def test_example_runs_and_passes_its_checks(name: str, args: list[str] | None) -> None:
    if args is None:
        pytest.fail(
            f"examples/{name} has no entry in EXAMPLE_ARGS in tests/test_examples.py, so it "
            "is not run; add one with arguments that run it in a few seconds"
        )
    result = run_example(EXAMPLES / name, with_services(args))
    report = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, f"examples/{name} {shlex.join(args)} failed\n{report}"
    assert SUCCESS[name] in result.stdout, report


@pytest.mark.parametrize("name", discover())
def test_docstring_ends_with_the_command_that_runs_it(name: str) -> None:
    command = docstring_command(name)
    assert command.startswith(f"python examples/{name}"), (
        f"the last line of the docstring of examples/{name} should be the command that runs "
        f"it, starting with 'python examples/{name}'; found {command!r}"
    )
    words = shlex.split(command)
    assert words[:2] == ["python", f"examples/{name}"], command


@pytest.mark.parametrize("name", discover())
def test_documented_command_works(name: str) -> None:
    words = shlex.split(docstring_command(name))
    if words[:2] != ["python", f"examples/{name}"]:
        pytest.fail(f"examples/{name}: the docstring does not end with its command")
    result = run_example(ROOT / words[1], with_services(words[2:]))
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert SUCCESS[name] in result.stdout


async def test_bank_transfers_writes_its_run_to_sql(tmp_path: Path) -> None:
    from agentsnap.journal import read_journal
    from agentsnap.store.sql import SqlStore
    from agentsnap.testing import assert_consistent

    url = f"sqlite:///{tmp_path / 'bank.db'}"
    args = ["--agents", "3", "--transfers", "100", "--snapshot-every", "25", "--db", url]
    result = run_example(EXAMPLES / "bank_transfers.py", [*args, "--journal"])
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    written = [line for line in lines if line.startswith("run ")]
    assert len(written) == 1, result.stdout
    assert written[0].endswith(f"written to {url}"), written
    run_id = written[0].split()[1]
    # The command as it can be pasted where the example ran (.venv/bin/agentsnap off PATH).
    command = shlex.join([*cli_words(cwd=ROOT), "export", run_id, "--db", url])
    assert lines[-1] == f"inspect it with: {command}"

    store = SqlStore(url)
    try:
        run = await store.get_run(run_id)
        snapshots = await store.list_snapshots(run_id)
        messages = read_journal(await store.load_journal(run_id))
    finally:
        await store.close()
    assert run.metadata["example"] == "bank_transfers"
    assert snapshots, "the example took snapshots"
    for snapshot in snapshots:
        assert_consistent(snapshot)
    assert sum(m.kind == "go" for m in messages) == 100
    assert all(m.delivered_at is not None for m in messages)


def test_bank_transfers_journal_needs_a_database() -> None:
    result = run_example(EXAMPLES / "bank_transfers.py", ["--journal"])
    assert result.returncode == 2
    assert "--journal needs --db" in result.stderr


def distributed_bank(*args: str) -> tuple[str, str, subprocess.CompletedProcess[str]]:
    """Run the distributed bank on the test's NATS and PostgreSQL: its run id, its database."""
    url = postgres_url_or_skip()
    words = with_services(["--nats", "NATS", "--db", url, *args])
    result = run_example(EXAMPLES / "distributed_bank.py", words)
    ids = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("run: ")]
    assert len(ids) == 1, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return ids[0], url, result


@pytest.mark.postgres
def test_distributed_bank_exports_its_balances_and_transfers_like_any_run() -> None:
    run_id, url, result = distributed_bank("--workers", "3", "--transfers", "400")
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "all snapshots consistent" in result.stdout
    command = shlex.join([*cli_words(cwd=ROOT), "export", run_id, "--db", url])
    assert result.stdout.strip().splitlines()[-1] == f"inspect it with: {command}"

    exported = subprocess.run(
        [sys.executable, "-m", "agentsnap", "export", run_id, "--db", url],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert exported.returncode == 0, exported.stderr
    document = json.loads(exported.stdout)
    assert document["run"]["status"] == "succeeded"
    assert document["run"]["metadata"]["example"] == "distributed_bank"
    snapshots = document["snapshots"]
    assert len(snapshots) >= 2
    tellers = [f"teller-{i}" for i in range(9)]
    for snapshot in snapshots:
        assert snapshot["status"] == "complete", snapshot["error"]
        balances = sum(snapshot["agents"][name]["state"]["balance"] for name in tellers)
        in_flight = sum(
            message["payload"]["amount"]
            for channel in snapshot["channels"]
            for message in channel["messages"]
            if message["kind"] == "transfer"
        )
        assert balances + in_flight == 9 * 1_000, snapshot["seq"]
    # The last cut was taken once every order was carried out: all 400 of them.
    last = snapshots[-1]
    assert sum(last["agents"]["$env"]["sent"].values()) == 400
    assert not any(channel["messages"] for channel in last["channels"])
    moved = sum(last["agents"][name]["state"]["transfers_out"] for name in tellers)
    assert 0 < moved <= 400


@pytest.mark.postgres
def test_distributed_bank_keeps_the_money_when_a_worker_is_killed_and_started_again() -> None:
    _, _, result = distributed_bank(
        "--workers", "3", "--transfers", "600", "--kill-one", "--timeout", "50"
    )
    report = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "killing worker 0/3 (SIGKILL)" in result.stdout, report
    assert "worker 0/3 started again" in result.stdout, report
    assert result.returncode == 0, report
    assert "all snapshots consistent" in result.stdout, report
