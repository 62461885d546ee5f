"""``agentsnap states check``: which stored states the current code can read."""

from __future__ import annotations

import click

from agentsnap.cli._common import DB, JSON, app_option, read, state_models
from agentsnap.cli._format import print_rows
from agentsnap.cli._main import main


@main.group()
def states() -> None:
    """Stored agent states, as the current code reads them."""


@states.command("check")
@click.argument("run_id", required=False)
@DB
@app_option(
    "The code to check against: a factory returning an agentsnap.distributed.App or a "
    "list of agents (the current directory is importable).",
    required=True,
)
@JSON
def check(run_id: str | None, db: str, app_spec: str, as_json: bool) -> None:
    """Report which stored states of RUN (or of every run) the app's state classes can read.

    Every agent's state in every complete snapshot is read as a resume, rollback or fork
    would read it: through the upcasters of its state class, from the version it was
    stored with to the version the class is at now. One row per run, agent and stored
    version. The exit status is 1 when some state cannot be read, 0 otherwise.
    """
    from agentsnap.inspect import check_stored_states  # noqa: PLC0415

    models = state_models(app_spec)
    assert models is not None
    rows = read(db, lambda store: check_stored_states(store, models, run_id))
    bad = [row for row in rows if row.unreadable]
    print_rows(
        rows,
        as_json,
        {
            "RUN": "run_id",
            "AGENT": "agent",
            "STORED": "stored_version",
            "NOW": lambda r: "-" if r.current_version is None else r.current_version,
            "SNAPSHOTS": lambda r: _seqs(r.snapshots),
            "READABLE": "readable",
            "UNREADABLE": "unreadable",
        },
        notes=lambda r: None if r.error is None else f"! {r.error}",
    )
    if not as_json:
        if not rows:
            click.echo("no stored states")
        elif not bad:
            click.echo("every stored state is readable")
        else:
            click.echo(f"{len(bad)} of {len(rows)} rows hold states the code cannot read")
    if bad:
        raise click.exceptions.Exit(1)


def _seqs(seqs: list[int]) -> str:
    """Snapshot numbers in short: ``1-4,7``."""
    parts: list[str] = []
    start = previous = None
    for seq in [*sorted(seqs), None]:
        if seq is not None and previous is not None and seq == previous + 1:
            previous = seq
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = seq
    return ",".join(parts)
