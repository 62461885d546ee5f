"""``agentsnap runs``: runs listed by filters, deleted (``delete``) and pruned (``prune``)."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypedDict, Unpack

import click
from click.core import ParameterSource

from agentsnap import console
from agentsnap.cli._common import DB, JSON, T, guard, read
from agentsnap.cli._format import many, print_json, print_rows, when
from agentsnap.cli._main import UTC_KEY, main
from agentsnap.cli._results import Removal
from agentsnap.records import RunStatus

if TYPE_CHECKING:
    from agentsnap.records import RunInfo
    from agentsnap.store.retention import DeleteReport
    from agentsnap.store.sql import SqlStore


# -- runs: list, delete, prune ---------------------------------------------------------------

_RUN_STATUSES = tuple(status.value for status in RunStatus)
"""What ``runs --status`` takes: the values of ``RunStatus``."""

_RUNS_DB_KEY = "agentsnap.runs.db"
"""Where ``runs --db URL`` is kept for ``runs delete`` and ``runs prune`` (``ctx.meta``)."""

_DURATION = re.compile(r"(\d+)\s*(s|m|h|d|w)")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def _duration(text: str) -> timedelta | None:
    """``7d``, ``12h``, ``30m``, ``45s``, ``2w`` as a timedelta; ``None`` for other text."""
    found = _DURATION.fullmatch(text.strip().lower())
    if found is None:
        return None
    try:
        span = timedelta(**{_UNITS[found[2]]: int(found[1])})
    except OverflowError:
        return None
    # A span that reaches back before the year 1 names no time.
    return span if span < datetime.now(UTC) - datetime.min.replace(tzinfo=UTC) else None


def _duration_option(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> timedelta | None:
    """``--older-than``: a span of time, ``7d``, ``12h``, ``30m``, ``45s`` or ``2w``."""
    if value is None:
        return None
    found = _duration(value)
    if found is None:
        raise click.BadParameter(
            f"{value!r} is not a duration: give a number and a unit, like 7d, 12h, 30m, 45s or 2w",
            ctx,
            param,
        )
    return found


def _since_option(ctx: click.Context, param: click.Parameter, value: str | None) -> datetime | None:
    """``--since``: a span back from now (``7d``), or an ISO 8601 date or date and time.

    A date or time without an offset is local time (UTC with ``--utc``), as times are shown.
    """
    if value is None:
        return None
    span = _duration(value)
    if span is not None:
        return datetime.now(UTC) - span
    try:
        moment = datetime.fromisoformat(value.strip())
        if moment.tzinfo is None:
            utc = bool(ctx.meta.get(UTC_KEY))
            moment = moment.replace(tzinfo=UTC) if utc else moment.astimezone()
        moment.astimezone(UTC)  # the store compares in UTC: one before the year 1 is no time
    except (ValueError, OverflowError):
        raise click.BadParameter(
            f"{value!r} is not a time: give a span back from now (7d, 12h, 30m) or an ISO "
            "date or date and time (2026-11-24, 2026-11-24T09:30, 2026-11-24T09:30+01:00)",
            ctx,
            param,
        ) from None
    return moment


def _tags_option(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> dict[str, str]:
    """``--tag KEY=VALUE``, repeated: the tags every run listed must carry."""
    tags = {}
    for given in value:
        key, equals, text = given.partition("=")
        if not equals or not key:
            raise click.BadParameter(
                f"{given!r} is not KEY=VALUE: give a tag like team=billing", ctx, param
            )
        tags[key] = text
    return tags


def _run_filters(command: Callable[..., None]) -> Callable[..., None]:
    """``--status``, ``--name`` and ``--tag``: which runs a command looks at."""
    for option in reversed(
        [
            click.option(
                "--status",
                "statuses",
                type=click.Choice(_RUN_STATUSES),
                multiple=True,
                help="Only runs in this status (repeat for several).",
            ),
            click.option(
                "--name", default=None, help="Only runs of this name; * stands for any text."
            ),
            click.option(
                "--tag",
                "tags",
                metavar="KEY=VALUE",
                multiple=True,
                callback=_tags_option,
                help="Only runs with this tag, KEY=VALUE (repeat: every one must match).",
            ),
        ]
    ):
        command = option(command)
    return command


_LISTING = {
    "statuses": "--status",
    "name": "--name",
    "tags": "--tag",
    "since": "--since",
    "limit": "--limit",
    "tracebacks": "--traceback",
    "as_json": "--json",
}
"""The ``runs`` options that only listing takes, by parameter."""


@main.group(invoke_without_command=True)
@DB
@_run_filters
@click.option(
    "--since",
    metavar="WHEN",
    default=None,
    callback=_since_option,
    help="Only runs created since: 7d, 12h, 30m back from now, or an ISO date or time.",
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the newest N.")
@click.option(
    "--traceback",
    "tracebacks",
    is_flag=True,
    help="After the table, print the tracebacks each failed run recorded.",
)
@JSON
@click.pass_context
def runs(
    ctx: click.Context,
    *,
    db: str,
    statuses: tuple[str, ...],
    name: str | None,
    tags: dict[str, str],
    since: datetime | None,
    limit: int | None,
    tracebacks: bool,
    as_json: bool,
) -> None:
    """List runs, oldest first: id, name, status, tags, created, snapshots, parent.

    Why a run ended so, when it is known, is on a line of its own under the run's row
    (`why: <reason>`; `status_reason` with `--json`), with where a failed run's error was
    raised; `--traceback` prints each failed run's tracebacks (handler failures and the
    error that ended it, exception chains included) after the table (`traceback` with
    `--json`). The filters combine: `--status failed
    --status cancelled --tag team=billing --since 7d` lists the failed or cancelled runs of
    the last seven days tagged team=billing; `--limit N` keeps the newest N of them.

    `agentsnap runs delete` and `agentsnap runs prune` remove runs and everything they hold.
    """
    if ctx.invoked_subcommand is not None:
        given = [
            flag
            for param, flag in _LISTING.items()
            if ctx.get_parameter_source(param) is ParameterSource.COMMANDLINE
        ]
        if given:
            options = ", ".join(given)
            raise click.UsageError(
                f"{options} list runs: give `{ctx.invoked_subcommand}` its own options after "
                "its name"
            )
        if ctx.get_parameter_source("db") is ParameterSource.COMMANDLINE:
            ctx.meta[_RUNS_DB_KEY] = db
        return
    from agentsnap.inspect import runs_table  # noqa: PLC0415

    rows = read(
        db,
        lambda store: runs_table(
            store,
            status=statuses or None,
            name=name,
            tags=tags,
            since=since,
            limit=limit,
        ),
    )
    print_rows(
        rows,
        as_json,
        {
            "ID": "id",
            "NAME": "name",
            "STATUS": "status",
            "TAGS": lambda r: ",".join(f"{k}={v}" for k, v in sorted(r.tags.items())) or None,
            "CREATED": lambda r: when(r.created_at),
            "SNAPSHOTS": "snapshots",
            "PARENT": "parent_run_id",
        },
        # Under its row, whole: a reason is often longer than the rest of the row.
        notes=lambda r: (
            f"why: {' '.join(r.status_reason.split())}{_raised_at(r.traceback)}"
            if r.status_reason
            else None
        ),
    )
    if tracebacks and not as_json:
        for row in rows:
            if row.traceback:
                click.echo(f"\n--- run {row.id} ({row.status.value}) ---")
                click.echo(row.traceback.rstrip())


def _raised_at(traceback: str | None) -> str:
    """`` (at FILE:LINE in FUNCTION)``: where a failed run's first failure began (the
    innermost frame of the first exception of its chain, which a traceback prints first).
    """  # noqa: D205
    if not traceback:
        return ""
    first = re.split(r"\n(?:The above exception|During handling)", traceback, maxsplit=1)[0]
    frames = re.findall(r'^\s*File "([^"]+)", line (\d+), in (.+)$', first, re.MULTILINE)
    if not frames:
        return ""
    path, line, function = frames[-1]
    return f" (at {os.path.basename(path)}:{line} in {function.strip()})"


def _runs_db(ctx: click.Context, db: str) -> str:
    """The database of ``runs delete`` or ``runs prune``: its own ``--db``, else that of
    ``runs`` (``agentsnap runs --db URL delete RUN``), else the environment or default.
    """  # noqa: D205
    if ctx.get_parameter_source("db") is ParameterSource.COMMANDLINE:
        return db
    return str(ctx.meta.get(_RUNS_DB_KEY, db))


class _Removal(TypedDict):
    """The options ``_removal_options`` declares, as click passes them."""

    yes: bool
    dry_run: bool
    vacuum: bool
    as_json: bool
    nats_url: str | None


def _removal_options(command: Callable[..., None]) -> Callable[..., None]:
    """``--yes``, ``--dry-run``, ``--vacuum`` and ``--json`` of ``runs delete`` and ``prune``."""
    for option in reversed(
        [
            click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation."),
            click.option(
                "--dry-run", is_flag=True, help="Show what would be deleted; delete nothing."
            ),
            click.option(
                "--vacuum",
                is_flag=True,
                help="Then give the space back: VACUUM the SQLite file (it shrinks), or "
                "VACUUM ANALYZE on PostgreSQL.",
            ),
            click.option("--json", "as_json", is_flag=True, help="Print what was deleted as JSON."),
            click.option(
                "--nats",
                "nats_url",
                metavar="URL",
                default=None,
                help="Also delete the runs' NATS JetStream streams (runs spread over "
                "processes) on this server; it must answer before anything is deleted.",
            ),
        ]
    ):
        command = option(command)
    return command


async def _run_streams(nats_url: str, run_ids: list[str], *, delete: bool) -> list[str]:
    """The runs' JetStream streams on the server at ``nats_url`` (deleted, with ``delete``)."""
    from agentsnap.jetstream import JetStreamLink  # noqa: PLC0415
    from agentsnap.jetstream.codec import stream_name  # noqa: PLC0415

    link = await JetStreamLink.connect(nats_url)
    try:
        found: list[str] = []
        for run_id in run_ids:
            there = await link.delete_stream(run_id) if delete else await link.has_stream(run_id)
            if there:
                found.append(stream_name(run_id))
        return found
    finally:
        await link.close()


def _streams_of(nats_url: str | None, run_ids: list[str]) -> list[str] | None:
    """The runs' streams (``None`` without ``--nats``): also a check that NATS answers."""
    if nats_url is None:
        return None
    return guard(lambda: asyncio.run(_run_streams(nats_url, run_ids, delete=False)))


def _delete_streams(nats_url: str | None, run_ids: list[str]) -> list[str] | None:
    """Delete the deleted runs' streams (``None`` without ``--nats``)."""
    if nats_url is None or not run_ids:
        return None if nats_url is None else []
    try:
        return asyncio.run(_run_streams(nats_url, run_ids, delete=True))
    except Exception as exc:
        from agentsnap.jetstream.codec import stream_name  # noqa: PLC0415

        names = ", ".join(stream_name(run_id) for run_id in run_ids)
        raise click.ClickException(
            f"deleted {many(len(run_ids), 'run')} from the database, but not their NATS "
            f"streams ({type(exc).__name__}: {exc}): delete them once the server answers "
            f"(nats stream rm NAME): {names}"
        ) from exc


@runs.command("delete", short_help="Delete runs and everything they hold.")
@click.argument("run_ids", metavar="RUN...", nargs=-1, required=True)
@DB
@click.option(
    "--force",
    is_flag=True,
    help="Delete even a run that a live runtime owns, or whose LangGraph checkpoints a fork needs.",
)
@_removal_options
@click.pass_context
def delete_runs_command(
    ctx: click.Context,
    *,
    run_ids: tuple[str, ...],
    db: str,
    force: bool,
    **removal: Unpack[_Removal],
) -> None:
    """Delete runs and everything they hold; RUN is an id or a unique prefix of one.

    Their snapshots, journal, replay log, rollbacks, lease, tags, tool calls in the ledger,
    LangGraph checkpoints, and the agent states no other run holds: nothing of them is left.
    Runs forked from them keep working. It asks first, showing what goes (unless --yes);
    --dry-run only shows it. A run that a live runtime owns is refused (--force deletes it
    even so). With --nats, the NATS JetStream streams of runs spread over processes go too.
    """
    from agentsnap.inspect import resolve_run  # noqa: PLC0415
    from agentsnap.store.retention import delete_runs  # noqa: PLC0415

    db = _runs_db(ctx, db)

    async def resolve(store: SqlStore) -> list[RunInfo]:
        found = [await resolve_run(store, prefix) for prefix in run_ids]
        return list({run.id: run for run in found}.values())

    chosen = read(db, resolve)
    ids = [run.id for run in chosen]
    plan = _refusing(lambda: read(db, lambda s: delete_runs(s, ids, force=force, dry_run=True)))
    _remove(
        plan,
        chosen,
        lambda vacuum: _refusing(
            lambda: read(db, lambda s: delete_runs(s, ids, force=force, vacuum=vacuum))
        ),
        removal,
    )


@runs.command("prune", short_help="Delete old runs by a policy: --keep N, --older-than D.")
@DB
@click.option(
    "--keep",
    type=click.IntRange(min=0),
    default=None,
    help="Keep the newest N of the runs the filters select.",
)
@click.option(
    "--older-than",
    metavar="DURATION",
    default=None,
    callback=_duration_option,
    help="Delete only runs created longer ago than this: 7d, 12h, 30m, 2w.",
)
@_run_filters
@_removal_options
@click.pass_context
def prune_runs_command(
    ctx: click.Context,
    *,
    db: str,
    keep: int | None,
    older_than: timedelta | None,
    statuses: tuple[str, ...],
    name: str | None,
    tags: dict[str, str],
    **removal: Unpack[_Removal],
) -> None:
    """Delete old runs: all but the newest N (--keep), or those older than a time, or both.

    Given both, a run goes when it is outside the newest N and older than the time. --status,
    --name and --tag narrow the runs looked at (`prune --keep 10 --status failed` keeps the
    ten newest failed runs, and deletes the other failed ones). Runs that a live runtime owns
    are never deleted. It asks first, showing what goes (unless --yes); --dry-run only shows
    it. With --nats, the NATS JetStream streams of runs spread over processes go too.
    """
    from dataclasses import replace  # noqa: PLC0415

    from agentsnap.store.retention import delete_runs, prune_runs  # noqa: PLC0415

    if keep is None and older_than is None:
        raise click.UsageError("give --keep N, --older-than DURATION (7d, 12h…), or both")
    db = _runs_db(ctx, db)
    plan = read(
        db,
        lambda store: prune_runs(
            store,
            keep=keep,
            older_than=older_than,
            status=statuses or None,
            name=name,
            tags=tags,
            dry_run=True,
        ),
    )
    chosen = read(db, lambda store: _runs_of(store, [*plan.run_ids, *plan.skipped]))

    def delete(vacuum: bool) -> DeleteReport:
        report = read(
            db, lambda store: delete_runs(store, plan.run_ids, skip_refused=True, vacuum=vacuum)
        )
        return replace(report, skipped={**plan.skipped, **report.skipped})

    _remove(plan, chosen, delete, removal)


def _remove(
    plan: DeleteReport,
    chosen: list[RunInfo],
    delete: Callable[[bool], DeleteReport],
    removal: _Removal,
) -> None:
    """Carry out a delete or prune whose dry run gave ``plan``, as ``removal`` says.

    With ``--dry-run``, or when nothing goes, it only shows ``plan``; otherwise it asks
    (unless ``--yes``), deletes with ``delete(vacuum)`` and shows what went. With
    ``--nats``, the server must answer before anything is deleted.
    """
    streams = _streams_of(removal["nats_url"], plan.run_ids)
    if removal["dry_run"] or not plan.run_ids:
        _print_removal(plan, chosen, removal["as_json"], streams)
        return
    if not removal["yes"]:
        _confirm(plan, chosen)
    report = delete(removal["vacuum"])
    _print_removal(
        report, chosen, removal["as_json"], _delete_streams(removal["nats_url"], report.run_ids)
    )


def _refusing(action: Callable[[], T]) -> T:
    """``action()``, a refused delete's error saying what to do on the command line."""
    from agentsnap.store.retention import DeleteRefused  # noqa: PLC0415

    try:
        return action()
    except click.ClickException as exc:
        refused = exc.__cause__
        if not isinstance(refused, DeleteRefused):
            raise
        reasons = "; ".join(f"run {run_id} {why}" for run_id, why in refused.refused.items())
        raise click.ClickException(
            f"refused to delete {many(len(refused.refused), 'run')}, so nothing was deleted: "
            f"{reasons}; or pass --force to delete even so"
        ) from refused


async def _runs_of(store: SqlStore, run_ids: list[str]) -> list[RunInfo]:
    """The runs of these ids, in this order (those not found left out)."""
    wanted = set(run_ids)
    found = {run.id: run for run in await store.list_runs() if run.id in wanted}
    return [found[run_id] for run_id in run_ids if run_id in found]


def _confirm(plan: DeleteReport, runs: list[RunInfo]) -> None:
    """Show what a delete removes, on standard error, and ask; raise unless confirmed."""
    going = [run for run in runs if run.id in set(plan.run_ids)]
    for run in going:
        click.echo(f"  {_run_line(run)}", err=True)
    for run_id, why in plan.skipped.items():
        click.echo(f"  kept {run_id}: {why}", err=True)
    snapshots = plan.rows.get("agentsnap_snapshots", 0)
    question = (
        f"Delete {many(len(plan.run_ids), 'run')} ({many(snapshots, 'snapshot')}, "
        f"{many(plan.total_rows, 'row')} in all)? This cannot be undone"
    )
    try:
        confirmed = click.confirm(question, default=False, err=True)
    except click.Abort:  # end of input
        confirmed = False
        click.echo(err=True)
    else:
        if not sys.stdin.isatty():  # the answer read was not echoed: end the prompt's line
            click.echo(err=True)
    if not confirmed:
        raise click.ClickException("nothing deleted: not confirmed (--yes deletes without asking)")


def _run_line(run: RunInfo) -> str:
    name = run.name if run.name is not None else "-"
    return f"{run.id}  {name}  {run.status.value}  created {when(run.created_at.isoformat())}"


def _print_removal(
    report: DeleteReport, runs: list[RunInfo], as_json: bool, streams: list[str] | None = None
) -> None:
    """What a delete or prune removed (or, dry, would remove); ``streams``: with ``--nats``."""
    if as_json:
        print_json(Removal.of(report, streams).document())
        return
    known = {run.id: run for run in runs}
    for run_id, why in report.skipped.items():
        click.echo(console.paint_warning(f"kept {run_id}: {why}"))
    if not report.run_ids:
        click.echo("nothing to delete")
        return
    verb = "would delete" if report.dry_run else "deleted"
    click.echo(f"{verb} {many(len(report.run_ids), 'run')}:")
    for run_id in report.run_ids:
        click.echo(f"  {_run_line(known[run_id]) if run_id in known else run_id}")
    rows = "rows that would go" if report.dry_run else "rows removed"
    click.echo(f"{rows}: {report.total_rows}")
    counted = {table: count for table, count in report.rows.items() if count}
    width = max(map(len, counted), default=0)
    for table, count in counted.items():
        click.echo(f"  {table.ljust(width)}  {count}")
    if report.reclaimed_bytes is not None:
        click.echo(f"the database file shrank by {many(report.reclaimed_bytes, 'byte')}")
    if streams is not None:
        verb = "would delete" if report.dry_run else "deleted"
        click.echo(f"{verb} {many(len(streams), 'NATS stream')}: {', '.join(streams) or '-'}")
