"""``agentsnap tools``: the ledger's side-effecting calls, listed and settled."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from agentsnap import console
from agentsnap.cli._common import DB, read, with_ledger
from agentsnap.cli._format import print_json, print_rows, when
from agentsnap.cli._main import main
from agentsnap.cli._results import ResolvedCall
from agentsnap.ledger import ToolCallStatus

if TYPE_CHECKING:
    from agentsnap.inspect import ToolCallRow
    from agentsnap.store.sql import SqlStore


class _ToolsGroup(click.Group):
    """``tools [RUN]`` lists the ledger's calls; ``tools list`` says the same, ``tools resolve``
    settles a call.
    """  # noqa: D205

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        asks_help = bool(args) and args[0] in ctx.help_option_names
        if not asks_help and (not args or args[0] not in self.commands):
            args = [_LIST, *args]
        return super().parse_args(ctx, args)

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        path = ctx.command_path
        formatter.write_usage(path, "[RUN] [--status S] [--json] [--wide] [--db URL]")
        formatter.write_usage(
            path, "resolve KEY (--result JSON | --error TEXT | --retry)", prefix="   or: "
        )


_LIST = "list"
"""The command behind ``agentsnap tools [RUN]``; ``tools list [RUN]`` names it as well."""


@main.group(cls=_ToolsGroup)
def tools() -> None:
    """Side-effecting tool calls in the ledger.

    `agentsnap tools [RUN]` prints the ledger's calls, of run RUN (an id or a unique prefix)
    when given: key, status, tool, attempts, run, agent, updated (`agentsnap tools list
    [RUN]` is the same command). Calls whose outcome is unknown are marked with a leading
    `!`: check the outside system, then settle them with `agentsnap tools resolve`.
    """


STATUSES = tuple(status.value for status in ToolCallStatus)
"""What ``tools --status`` takes: the values of ``ToolCallStatus``."""


@tools.command(_LIST)
@click.argument("run_id", metavar="[RUN]", required=False)
@DB
@click.option(
    "--status", type=click.Choice(STATUSES), default=None, help="Only calls in this status."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def list_tool_calls(run_id: str | None, db: str, status: str | None, as_json: bool) -> None:
    """Print the ledger's calls, of run RUN (an id or a unique prefix) when given.

    Also `agentsnap tools [RUN]`. A call still in progress whose owner stopped (its process
    is gone, or its run was taken over or left without an owner) is shown as unknown, and
    marked with a leading `!` like every call whose outcome is unknown.
    """
    from agentsnap.inspect import ledger_calls_table, resolve_run  # noqa: PLC0415

    async def query(store: SqlStore) -> list[ToolCallRow]:
        run = None if run_id is None else (await resolve_run(store, run_id)).id
        return await ledger_calls_table(store, run)

    rows = read(db, query)
    rows = [row for row in rows if status is None or row.status == status]
    print_rows(
        rows,
        as_json,
        {
            "": lambda r: "!" if r.unknown else " ",
            "KEY": "key",
            "STATUS": "status",
            "TOOL": "tool",
            "ATTEMPTS": "attempts",
            "RUN": "run",
            "AGENT": "agent",
            "UPDATED": lambda r: when(r.updated_at),
        },
    )
    if as_json:
        return
    unknown = sum(r.unknown for r in rows)
    if unknown:
        click.echo(
            console.paint_warning(
                f"! {unknown} call{'s' if unknown > 1 else ''} with an unknown outcome: check "
                "the outside system, then `agentsnap tools resolve KEY --result JSON | --error "
                "TEXT`"
            )
        )


@tools.command("resolve")
@click.argument("key")
@DB
@click.option("--result", "result", metavar="JSON", help="It happened: what the tool returned.")
@click.option("--error", metavar="TEXT", help="It did not happen: what went wrong.")
@click.option("--retry", is_flag=True, help="It did not happen: run the tool again next time.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {key, status, result, error}.")
def resolve_tool_call(  # noqa: PLR0917
    key: str, db: str, result: str | None, error: str | None, retry: bool, as_json: bool
) -> None:
    """Record the outcome of tool call KEY, whose outcome is unknown.

    Check the outside system first (did the card get charged?). With --result, later calls
    with this key return that JSON without running the tool; with --error, they fail; with
    --retry, the next call runs the tool again.
    """
    from agentsnap.ledger import resolve  # noqa: PLC0415

    if (result is not None) + (error is not None) + retry != 1:
        raise click.UsageError("give one of --result JSON, --error TEXT and --retry")
    if retry:
        entry = with_ledger(db, lambda ledger: resolve(ledger, key, retry=True))
    elif result is not None:
        try:
            value = json.loads(result)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--result") from exc
        entry = with_ledger(db, lambda ledger: resolve(ledger, key, result=value))
    else:
        entry = with_ledger(db, lambda ledger: resolve(ledger, key, error=error))
    if as_json:
        print_json(ResolvedCall.of(entry))
    else:
        click.echo(f"{entry.key}: {entry.status.value}")
