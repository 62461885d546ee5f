"""``agentsnap db``: the schema (``upgrade``, ``current``) and spooled writes (``recover``)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import click

from agentsnap.cli._common import DB, RETRY, guard
from agentsnap.cli._format import many, print_json
from agentsnap.cli._main import main
from agentsnap.cli._results import Recovery, SchemaState, SchemaUpgraded

if TYPE_CHECKING:
    from agentsnap.store.spool import ReplayReport


@main.group()
def db() -> None:
    """Manage the database: its schema, and writes spooled while it was unavailable."""


@db.command()
@DB
@click.option("--revision", default="head", show_default=True, help="Target revision.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {revision, newest, up_to_date}.")
def upgrade(db: str, revision: str, as_json: bool) -> None:
    """Upgrade the schema to the newest revision (or --revision)."""
    from agentsnap.store import migrate  # noqa: PLC0415  # keeps `agentsnap --help` fast

    guard(lambda: migrate.check_database(db, create=True))
    guard(lambda: migrate.upgrade(db, revision))
    found = guard(lambda: migrate.current(db))
    if as_json:
        newest = migrate.head()
        print_json(SchemaUpgraded(revision=found, newest=newest, up_to_date=found == newest))
    else:
        click.echo(f"schema at {found}")


@db.command()
@DB
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON: {exists, revision, newest, up_to_date}.",
)
def current(db: str, as_json: bool) -> None:
    """Print the schema revision of the database and whether it is the newest.

    Nothing is created: for an SQLite file that does not exist, it says so.
    """
    from agentsnap.store import migrate  # noqa: PLC0415
    from agentsnap.store.dialect import database_exists  # noqa: PLC0415

    exists = guard(lambda: database_exists(db))
    if exists:  # a directory, or a file that is not SQLite, is an error
        guard(lambda: migrate.check_database(db, create=False))
    found = guard(lambda: migrate.current(db)) if exists else None
    newest = migrate.head()
    if as_json:
        up_to_date = found == newest
        print_json(SchemaState(exists=exists, revision=found, newest=newest, up_to_date=up_to_date))
    elif not exists:
        click.echo(
            f"there is no database at {db} (newest schema is {newest}): check the --db URL, "
            "or create it with `agentsnap db upgrade`"
        )
    elif found is None:
        click.echo(f"no agentsnap schema (newest is {newest}): run `agentsnap db upgrade`")
    elif found == newest:
        click.echo(f"{found} (newest)")
    else:
        click.echo(f"{found} (newest is {newest}): run `agentsnap db upgrade`")


@db.command()
@DB
@click.option(
    "--spool",
    "spool_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="The spool directory [default: DB_FILE.spool beside an SQLite database, else the "
    "database's directory under $XDG_STATE_HOME/agentsnap/spool].",
)
@click.option("--run", "run_id", default=None, help="Only this run (an id or a unique prefix).")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON: {spool, applied, kept, complete}.",
)
def recover(db: str, spool_dir: str | None, run_id: str | None, as_json: bool) -> None:
    """Write to the database what runs spooled locally while it was unavailable.

    A run that closes while its database is down keeps the writes it could not make in a
    local spool; `agentsnap db recover` replays them, printing one line per spooled write
    (applied, already stored, no change, stale) and a summary. It exits with status 1 when
    writes are left in the spool, saying why: fix that and run it again.
    """
    from agentsnap.store.spool import Spool  # noqa: PLC0415

    spool = guard(lambda: Spool.for_url(db, spool_dir))
    spooled = guard(spool.runs)
    if run_id is not None:
        spooled = _spooled_run(spooled, run_id)
    if not spooled:
        of_run = f" of run {run_id}" if run_id is not None else ""
        if as_json:
            print_json(Recovery(spool=str(spool.directory), applied=[], kept=[], complete=True))
        else:
            click.echo(f"nothing to recover: no spooled writes{of_run} in {spool.directory}")
        return

    async def go() -> ReplayReport:
        from agentsnap.store.sql import SqlStore  # noqa: PLC0415

        store = SqlStore(db, create=False, retry=RETRY)
        ledger = store.ledger()
        try:
            return await spool.replay(store, ledger, spooled[0] if run_id is not None else None)
        finally:
            await ledger.close()
            await store.close()

    report = guard(lambda: asyncio.run(go()))
    if as_json:
        print_json(Recovery.of(report, spool))
        if not report.complete:
            raise click.ClickException(_recover_advice(report))
        return
    for done in report.applied:
        click.echo(f"{done.outcome.value:<14}  {done.op.run_id}  {done.op.describe()}")
    runs_done = len({done.op.run_id for done in report.applied})
    click.echo(
        f"recovered {many(len(report.applied), 'spooled write')} of {many(runs_done, 'run')} "
        f"from {spool.directory}"
    )
    if report.complete:
        return
    for run, count in sorted(report.kept.items()):
        error = report.errors.get(run)
        why = str(error) if error is not None else "spooled while recovering"
        click.echo(f"kept {many(count, 'spooled write')} of run {run} in {spool.file(run)}: {why}")
    raise click.ClickException(_recover_advice(report))


def _spooled_run(spooled: list[str], run_id: str) -> list[str]:
    """The spooled run that ``run_id`` names, as an id or a unique prefix (or none)."""
    if run_id in spooled:
        return [run_id]
    found = [run for run in spooled if run.startswith(run_id)]
    if len(found) > 1:
        raise click.ClickException(
            f"{run_id!r} matches several spooled runs: {', '.join(found)}; give more of the id"
        )
    return found


def _recover_advice(report: ReplayReport) -> str:
    """The one-line error of a recovery that left writes in the spool: why, and what to do."""
    from agentsnap.exceptions import NotFoundError, StoreError  # noqa: PLC0415
    from agentsnap.store.spool import SpoolError  # noqa: PLC0415

    left = sum(report.kept.values()) or len(report.errors)
    errors = list(report.errors.values())
    if any(isinstance(error, StoreError) for error in errors):
        advice = (
            "the database is unavailable or refused them; run `agentsnap db recover` again "
            "once it is back"
        )
    elif any(isinstance(error, NotFoundError) for error in errors):
        advice = (
            "their run is not in this database: give the database the run was written to "
            "with --db, then run `agentsnap db recover` again"
        )
    elif any(isinstance(error, SpoolError) for error in errors):
        advice = (
            "a line of the spool is malformed: fix or remove it by hand, then run "
            "`agentsnap db recover` again"
        )
    elif errors:
        advice = "fix the cause above, then run `agentsnap db recover` again"
    else:
        advice = "more were spooled while recovering: run `agentsnap db recover` again"
    return f"{many(left, 'spooled write')} not recovered, kept in the spool: {advice}"
