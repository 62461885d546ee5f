"""``agentsnap model-calls``: a run's recorded model calls, with token totals."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from agentsnap import console
from agentsnap.cli._common import DB, read
from agentsnap.cli._format import latency, many, print_json, print_table, when
from agentsnap.cli._main import main

if TYPE_CHECKING:
    from agentsnap.inspect import CallTotals


@main.command("model-calls")
@click.argument("run_id")
@DB
@click.option("--agent", default=None, help="Only this agent's calls.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON: {run_id, timeline, calls, totals}."
)
def model_calls(run_id: str, db: str, agent: str | None, as_json: bool) -> None:
    """Print the model calls of run RUN_ID, in the order they were made, with token totals.

    RUN_ID may be a unique prefix of the id. Each call shows its agent, the message its
    handler was handling, its position among that handler's calls, the timeline it was
    made on, the model, tokens in and out, latency, start, and how many times a re-executed
    handler got its answer replayed. A call marked `~` was made on a timeline a rollback
    discarded: the handler asked again on a later one. With --json, each call is whole,
    request and answer included.
    """
    from agentsnap.inspect import model_calls_table  # noqa: PLC0415

    doc = read(db, lambda store: model_calls_table(store, run_id, agent))
    if as_json:
        print_json(doc)
        return
    calls = doc.calls
    if not calls:
        who = f" of agent {agent}" if agent else ""
        click.echo(f"run {doc.run_id} recorded no model calls{who}")
        return
    totals = doc.totals
    rows: list[list[object]] = [
        [
            "~" if c.discarded else " ",
            c.agent,
            c.message,
            c.position,
            c.timeline,
            c.model,
            c.input_tokens,
            c.output_tokens,
            latency(c.latency_ms),
            when(c.started_at),
            c.replays,
        ]
        for c in calls
    ]
    by_agent = totals.agents if len(totals.agents) > 1 else {}
    footer = [_total_row(name, t) for name, t in by_agent.items()]
    footer.append(_total_row("total", totals))
    print_table(
        _MODEL_CALL_HEADERS,
        [*rows, *footer],
        kinds={"MESSAGE": console.Kind.TEXT, "MODEL": console.Kind.TEXT},
    )
    discarded = sum(c.discarded for c in calls)
    if discarded:
        click.echo(
            f"~ {many(discarded, 'call')} of a discarded timeline (asked again after a "
            f"rollback); the run's latest timeline is {doc.timeline}"
        )


_MODEL_CALL_HEADERS = [
    "",  # the mark of a call of a discarded timeline
    "AGENT",
    "MESSAGE",
    "POS",
    "TIMELINE",
    "MODEL",
    "IN",
    "OUT",
    "LATENCY",
    "STARTED",
    "REPLAYS",
]


def _total_row(name: str, totals: CallTotals) -> list[object]:
    """A footer line of ``model-calls``: how many calls, and their tokens in and out."""
    calls = many(totals.calls, "call")
    tokens = [totals.input_tokens, totals.output_tokens]
    return [" ", name, calls, "", "", "", *tokens, "", "", ""]
