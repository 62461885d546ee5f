"""``agentsnap requests`` and ``agentsnap answer``: requests to people, listed and answered."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from agentsnap import console
from agentsnap.cli._common import DB, read
from agentsnap.cli._format import many, print_json, print_rows, when
from agentsnap.cli._main import main

if TYPE_CHECKING:
    from agentsnap.store.sql import SqlStore


# -- requests to people: list, answer --------------------------------------------------------


@main.command("requests")
@click.argument("run_id", required=False)
@DB
@click.option("--pending", is_flag=True, help="Only the requests that wait for an answer.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: a list of requests, whole.")
def requests_command(run_id: str | None, db: str, pending: bool, as_json: bool) -> None:
    """List the requests to people of run RUN_ID (of every run without it), oldest first.

    RUN_ID may be a unique prefix of the id. A request is a question a handler asked
    (`ctx.ask`) or an approval a side-effecting call waits for. Each row shows its id (what
    `agentsnap answer` takes), status, kind, agent, who may answer, the question, and the
    answer or the reason. A `pending` request waits for an answer; `withdrawn` ones were
    discarded by a rollback (the redone handler asked again, under a new id).
    """
    from agentsnap.inspect import list_requests, resolve_run  # noqa: PLC0415

    async def query(store: SqlStore) -> list[dict[str, Any]]:
        run = None if run_id is None else (await resolve_run(store, run_id)).id
        found = await list_requests(store, run, pending=pending)
        return [request.to_json() for request in found]

    rows = read(db, query)
    if as_json:
        print_json(rows)
        return
    if not rows:
        what = "pending requests" if pending else "requests"
        click.echo(f"no {what}" + ("" if run_id is None else f" in run {run_id}"))
        return
    print_rows(
        rows,
        False,
        {
            "ID": "id",
            "STATUS": "status",
            "KIND": "kind",
            "AGENT": "agent",
            "WHO": lambda r: r["who"] or "-",
            "ASKED": lambda r: when(r["asked_at"]),
            "QUESTION": lambda r: _brief(r["question"]),
            "ANSWER": _request_outcome,
        },
        kinds={"QUESTION": console.Kind.TEXT, "ANSWER": console.Kind.TEXT},
    )
    waiting = sum(r["status"] == "pending" for r in rows)
    if waiting:
        click.echo(
            f"{many(waiting, 'request')} pending: `agentsnap answer ID --json VALUE`, "
            "`--approve` or `--deny --reason TEXT`"
        )


def _brief(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _request_outcome(row: dict[str, Any]) -> str:
    status = row["status"]
    if status == "pending":
        return "-"
    if row["kind"] == "approval" and status in {"answered", "rejected", "expired"}:
        approved = isinstance(row["answer"], dict) and row["answer"].get("approved") is True
        verdict = "approved" if approved else "denied"
        return f"{verdict}: {row['reason']}" if row["reason"] else verdict
    if status == "answered" or (status == "expired" and row["answer"] is not None):
        return _brief(row["answer"])
    return str(row["reason"] or status)


@main.command("answer")
@click.argument("request_id")
@DB
@click.option("--json", "value", metavar="JSON", help="The answer to a question, as JSON.")
@click.option("--approve", is_flag=True, help="Approve a call that waits for approval.")
@click.option(
    "--deny", is_flag=True, help="Deny an approval, or turn a question down (give --reason)."
)
@click.option("--reason", metavar="TEXT", help="Why; a denial's reason reaches the agent.")
@click.option("--by", metavar="NAME", help="Who answers, recorded with the answer.")
def answer_command(  # noqa: PLR0917
    request_id: str,
    db: str,
    value: str | None,
    approve: bool,
    deny: bool,
    reason: str | None,
    by: str | None,
) -> None:
    """Answer request REQUEST_ID, from any process, while its run runs or not.

    A question takes --json VALUE, checked against the request's schema; an approval takes
    --approve or --deny (with --reason, which the agent gets). The answer is stored: a
    handler waiting on it gets it within a couple of seconds, and a run whose program is
    down gets it when it is resumed. A request that is no longer pending (answered,
    expired, or withdrawn by a rollback) cannot be answered.
    """
    from agentsnap.inspect import answer  # noqa: PLC0415

    if sum((value is not None, approve, deny)) != 1:
        raise click.UsageError("give one of --json VALUE, --approve, --deny")
    answer_value: Any = None
    if value is not None:
        try:
            answer_value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--json") from exc
    decision = True if approve else (False if deny else None)
    done = read(
        db,
        lambda store: answer(
            store, request_id, answer_value, approve=decision, reason=reason, by=by
        ),
    )
    click.echo(f"{done.id}: {done.status} ({_request_outcome(done.to_json())})")
