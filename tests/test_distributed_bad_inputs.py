"""Bad input to a run spread over processes: a clear error, and nothing written.

A worker refuses an app it cannot import or a placement that names no agent of it, a run
missing from the database, a run that no distributed coordinator created (a ``Runtime``'s run, say),
one created for other agents than its app's, and one that has ended; it says what to do,
exits with status 1 like the other commands, prints no traceback, and claims no agent. A
database or a NATS server that cannot be reached is refused the same way, and a coordinator
whose NATS server is away writes no run.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from nats_server import SHARED_URL, OwnServer, free_port, reachable, server_binary, unavailable
from teller_app import make_app
from worker_processes import run_worker

from agentsnap import MemoryStore, NotFoundError, RunInfo, RunStatus
from agentsnap.distributed import DistributedRun, Worker, check_run
from agentsnap.exceptions import ConfigurationError, TransportError
from agentsnap.jetstream import JetStreamLink
from agentsnap.messages import ENVIRONMENT
from agentsnap.records import utcnow
from agentsnap.store.sql import SqlStore

APP = "teller_app:make_app"


def of_the_bank(run_id: str, names: list[str] | None = None, **fields: object) -> RunInfo:
    """A run as the bank's coordinator records it (or for other agents, with ``names``)."""
    processes = sorted([ENVIRONMENT, *(make_app().names if names is None else names)])
    return RunInfo.model_validate({"id": run_id, "metadata": {"processes": processes}, **fields})


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[SqlStore]:
    made = SqlStore(postgres_url)
    try:
        yield made
    finally:
        await made.close()


async def nothing_claimed(store: SqlStore, run_id: str) -> bool:
    """Whether another owner can claim every teller at once (no worker holds one)."""
    later = utcnow() + timedelta(seconds=1)
    return await store.claim_agents(run_id, "test", make_app().names, later) == []


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("run", "says"),
    [
        (RunInfo(id="bank-runtime"), "not created by the coordinator"),
        (of_the_bank("bank-others", ["teller-0", "clerk"]), "only in the run: clerk"),
        (of_the_bank("bank-ended", status=RunStatus.SUCCEEDED), "has ended (succeeded)"),
    ],
    ids=["runtime", "other-agents", "ended"],
)
async def test_a_worker_refuses_a_run_that_is_not_its_apps(
    postgres_url: str, store: SqlStore, run: RunInfo, says: str
) -> None:
    await store.create_run(run)
    done = run_worker(
        "--nats", SHARED_URL, "--db", postgres_url, "--app", APP, "--run", run.id,
        "--group", "0/3",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert says in done.stderr
    assert "--run" in done.stderr or "new run" in done.stderr  # it says what to do
    assert "Traceback" not in done.stderr
    assert await nothing_claimed(store, run.id)


@pytest.mark.postgres
async def test_an_unreachable_database_is_a_clear_error() -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"
    done = run_worker(
        "--nats", SHARED_URL, "--db", url, "--app", APP, "--run", "bank", "--group", "0/3"
    )
    assert done.returncode == 1
    assert "cannot be reached" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_database_without_the_schema_is_a_clear_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'none.db'}"
    done = run_worker(
        "--nats", SHARED_URL, "--db", url, "--app", APP, "--run", "bank", "--group", "0/3"
    )
    assert done.returncode == 1
    assert "no database at" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "none.db").exists()


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("app", "placement", "says", "status"),
    [
        ("no_such_module_here:make", ["--group", "0/3"], "cannot import", 2),
        ("teller_app:nothing", ["--group", "0/3"], "no factory 'nothing'", 2),
        ("teller_app:make_app", ["--group", "3/3"], "N/M", 2),
        ("teller_app:make_app", ["--agents", "clerk"], "no agent 'clerk'", 2),
    ],
)
async def test_a_bad_app_or_placement_is_refused_before_anything_is_written(
    postgres_url: str, store: SqlStore, app: str, placement: list[str], says: str, status: int
) -> None:
    await store.create_run(RunInfo(id="bank"))
    done = run_worker(
        "--nats", SHARED_URL, "--db", postgres_url, "--app", app, "--run", "bank", *placement
    )
    assert done.returncode == status
    assert says in done.stderr
    assert "Traceback" not in done.stderr
    assert await nothing_claimed(store, "bank")


@pytest.mark.postgres
async def test_a_run_not_in_the_database_is_a_clear_error(
    postgres_url: str, store: SqlStore
) -> None:
    await store.create_run(RunInfo(id="other"))
    done = run_worker(
        "--nats", SHARED_URL, "--db", postgres_url, "--app", "teller_app:make_app",
        "--run", "bank", "--group", "0/3",
    )  # fmt: skip
    assert done.returncode == 1
    assert "no run with id 'bank'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.postgres
async def test_an_unreachable_nats_server_is_a_clear_error(
    postgres_url: str, store: SqlStore
) -> None:
    processes = sorted([ENVIRONMENT, *make_app().names])
    await store.create_run(RunInfo(id="bank", metadata={"processes": processes}))
    url = f"nats://127.0.0.1:{free_port()}"
    done = run_worker(
        "--nats", url, "--db", postgres_url, "--app", "teller_app:make_app",
        "--run", "bank", "--group", "0/3",
    )  # fmt: skip
    assert done.returncode == 1
    assert url in done.stderr
    assert "Traceback" not in done.stderr
    assert await nothing_claimed(store, "bank")


async def test_the_python_worker_refuses_too() -> None:
    store = MemoryStore()
    await store.create_run(of_the_bank("bank-py", ["teller-0"]))
    app = make_app()
    check_run(of_the_bank("bank-py"), app)  # the app's own run is served
    if not reachable(SHARED_URL):
        unavailable(f"no NATS server at {SHARED_URL}")
    link = await JetStreamLink.connect(SHARED_URL)
    try:
        worker = Worker(link, store, "bank-py", app, ["teller-0"])
        with pytest.raises(ConfigurationError, match="other agents than the app"):
            await worker.start()
    finally:
        await link.close()
    later = utcnow() + timedelta(seconds=1)
    assert await store.claim_agents("bank-py", "test", app.names, later) == []


@pytest.fixture
def server(tmp_path: Path) -> Iterator[OwnServer]:
    binary = server_binary()
    if binary is None:
        unavailable("no nats-server binary to stop")
        return
    own = OwnServer(binary, tmp_path / "jetstream")
    own.start()
    try:
        yield own
    finally:
        own.stop()


async def test_a_coordinator_whose_nats_server_is_away_writes_no_run(server: OwnServer) -> None:
    store = MemoryStore()
    link = await JetStreamLink.connect(server.url)
    try:
        await asyncio.to_thread(server.stop)
        for _ in range(2000):  # the client notices the lost connection at once
            if link.away_for():
                break
            await asyncio.sleep(0.01)
        run = DistributedRun(link, store, make_app(), run_id="bank-away")
        with pytest.raises(TransportError, match="unreachable"):
            await run.start()
    finally:
        await link.close(drain=0)
    with pytest.raises(NotFoundError):
        await store.get_run("bank-away")
