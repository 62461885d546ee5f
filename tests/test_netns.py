"""The hosts harness of the partition tests: links that cut and heal, and nothing left behind.

[`netns.Hosts`][] must do what the partition tests take for granted: a host reaches the NATS
server and PostgreSQL over its own links; a cut from one service leaves the other reachable;
healing restores both; and leaving it, even by an exception, or killing the test process
that made it, leaves no namespace, link, route or process behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from netns import STATE, Hosts, skip_unless_possible, sweep

HERE = Path(__file__).resolve().parent


def leftovers(token: str) -> list[str]:
    """The namespaces, links, routes and state of the ``Hosts`` with ``token`` still there."""
    found = [n for n in _out("ip", "netns", "list").split() if f"-{token}-" in n]
    found += [w for w in _out("ip", "-o", "link", "show").split() if w.startswith(f"as{token}")]
    found += [str(p) for p in STATE.glob(f"*-{token}")] if STATE.exists() else []
    return found


def _out(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def unreachable_routes() -> list[str]:
    return _out("ip", "-o", "route", "show", "type", "unreachable").splitlines()


def test_a_cut_parts_a_host_from_one_service_and_healing_joins_it_again() -> None:
    skip_unless_possible()
    routes = unreachable_routes()
    with Hosts(2) as hosts:
        assert all(hosts.reaches(h, s) for h in (0, 1) for s in ("nats", "postgres"))
        with psycopg.connect(hosts.postgres.url, connect_timeout=5) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        hosts.cut(0, ("nats",))
        assert not hosts.reaches(0, "nats")
        assert hosts.reaches(0, "postgres")
        assert hosts.reaches(1, "nats")
        hosts.cut(1, ("nats", "postgres"), how="unreachable")
        assert not hosts.reaches(1, "nats")
        assert not hosts.reaches(1, "postgres")
        assert hosts.reaches(0, "postgres")
        hosts.heal(0)
        assert hosts.reaches(0, "nats")
        assert not hosts.reaches(1, "postgres")
        hosts.heal()
        assert hosts.reaches(1, "nats")
        assert hosts.reaches(1, "postgres")
        hosts.cut(0, ("postgres",), how="unreachable")  # left cut: closing heals it
    assert unreachable_routes() == routes
    assert leftovers(hosts.token) == []


def test_leaving_by_an_exception_removes_everything_and_kills_what_ran_on_the_hosts() -> None:
    skip_unless_possible()
    made: list[tuple[Hosts, subprocess.Popen[bytes], int | None]] = []

    def fail_inside() -> None:
        with Hosts(1) as hosts:
            sleeper = subprocess.Popen(hosts.command(0, ["sleep", "600"]))
            made.append((hosts, sleeper, hosts.nats.pid))
            hosts.cut(0, ("nats",))
            raise RuntimeError("the test failed")

    with pytest.raises(RuntimeError, match="the test failed"):
        fail_inside()
    [(hosts, sleeper, nats_pid)] = made
    assert sleeper.wait(10) == -signal.SIGKILL
    assert leftovers(hosts.token) == []
    assert nats_pid is not None
    assert not Path(f"/proc/{nats_pid}").exists()


def test_what_a_killed_test_process_left_is_swept_away_by_the_next() -> None:
    skip_unless_possible()
    script = (
        "import sys, time\n"
        f"sys.path.insert(0, {str(HERE)!r})\n"
        "from netns import Hosts\n"
        "hosts = Hosts(2)\n"
        "hosts.open()\n"
        "hosts.cut(1, ('postgres',), how='unreachable')\n"
        "print(hosts.token, hosts.nats.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    routes = unreachable_routes()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env) as child:
        try:
            assert child.stdout is not None
            token, nats_pid = child.stdout.readline().decode().split()
            assert leftovers(token)
            assert len(unreachable_routes()) == len(routes) + 1  # the host's side of the cut
        finally:
            child.kill()
    assert leftovers(token)  # nobody cleaned up: the process was killed outright
    assert token in sweep()
    assert leftovers(token) == []
    assert unreachable_routes() == routes
    deadline = time.monotonic() + 10
    while Path(f"/proc/{nats_pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{nats_pid}").exists()
