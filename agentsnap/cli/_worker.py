"""``agentsnap worker``: host some agents of a run spread over processes."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import click

from agentsnap.cli._common import DB, RETRY, app_of, app_option, guard, seconds_option
from agentsnap.cli._main import main


@main.command()
@click.option(
    "--nats", "nats_url", required=True, metavar="URL", help="The NATS server (JetStream on)."
)
@DB
@app_option(
    "The run's app: a factory returning an agentsnap.distributed.App (the current "
    "directory is importable).",
    required=True,
)
@click.option("--run", "run_id", required=True, help="The run (its coordinator created it).")
@click.option("--agents", "agent_names", metavar="A,B", help="Host these agents.")
@click.option(
    "--group", metavar="N/M", help="Host the agents whose name hashes to group N of M (0 <= N < M)."
)
@seconds_option(
    "--lease", "Seconds the claim on the agents holds without renewal.", default=10.0, least=1.0
)
@seconds_option(
    "--nats-patience",
    "Seconds to wait for a lost NATS server to come back before giving up (exit status 1).",
    default=60.0,
    least=0.1,
)
@seconds_option(
    "--wait",
    "Seconds to wait for agents another worker holds: to take over the agents of a "
    "worker that stopped, once its leases expire.",
    default=0.0,
)
@click.option(
    "--move",
    is_flag=True,
    help="Take the agents from the workers hosting them, at a cut, while the run goes on "
    "(to rebalance): the run's coordinator takes a snapshot, the worker hosting them lets "
    "them go and serves on with its others, and the run goes back to that snapshot.",
)
def worker(  # noqa: PLR0917 - click passes the options positionally
    nats_url: str,
    db: str,
    app_spec: str,
    run_id: str,
    agent_names: str | None,
    group: str | None,
    lease: float,
    nats_patience: float,
    wait: float,
    move: bool,
) -> None:
    """Host some agents of a run spread over processes, until SIGTERM or Ctrl-C.

    Every worker of the run builds the same app and hosts the agents placed on it; the
    others are reached over NATS JetStream. It writes its part of every snapshot the run's
    coordinator begins to the database (see agentsnap.distributed). A worker started again
    after a crash (or given the agents of a worker that stopped, with --wait) restores them
    from the run's last complete snapshot, the whole run rolling back to it. With --move it
    takes its agents from a running worker, which lets them go and serves on with its others
    (it exits when it hosts nothing more). Needs the nats extra: pip install 'agentsnap[nats]'.
    """
    from agentsnap.distributed import place  # noqa: PLC0415
    from agentsnap.exceptions import ConfigurationError  # noqa: PLC0415

    app = app_of(app_spec)
    try:
        names = None if agent_names is None else [n.strip() for n in agent_names.split(",")]
        hosted = place(app.names, agents=names, group=group)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    guard(
        lambda: asyncio.run(
            _serve_worker(nats_url, db, app, run_id, hosted, lease, nats_patience, wait, move)
        )
    )


async def _serve_worker(  # noqa: PLR0917
    nats_url: str,
    db: str,
    app: Any,
    run_id: str,
    hosted: list[str],
    lease: float,
    nats_patience: float,
    wait: float,
    move: bool = False,
) -> None:
    """Check the run and NATS (writing nothing), then serve until a signal says stop."""
    import signal  # noqa: PLC0415

    from agentsnap.distributed import Worker, check_run  # noqa: PLC0415
    from agentsnap.jetstream import JetStreamLink  # noqa: PLC0415
    from agentsnap.store.sql import SqlStore  # noqa: PLC0415

    # What the worker goes through (rollbacks, recoveries, a lost claim) is told on stderr.
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logging.getLogger("agentsnap").addHandler(handler)
    store = SqlStore(db, create=False, retry=RETRY)
    try:
        check_run(await store.get_run(run_id), app)
        link = await JetStreamLink.connect(nats_url)
        try:
            serving = Worker(
                link,
                store,
                run_id,
                app,
                hosted,
                lease=lease,
                nats_patience=nats_patience,
                wait=wait,
                move=move,
            )
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, serving.stop)
            await serving.start()
            click.echo(
                f"worker {serving.name} hosts {', '.join(serving.agents)} of run {run_id}",
                err=True,
            )
            try:
                await serving.stopped.wait()
            finally:
                await serving.close()
            if serving.moved_out:
                click.echo(
                    f"worker {serving.name} let {', '.join(serving.moved_out)} go to another",
                    err=True,
                )
            if serving.error is not None:
                raise serving.error
        finally:
            await link.close(drain=0.0 if link.away_for() else 10.0)
    finally:
        await store.close()
