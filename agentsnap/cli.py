"""The ``agentsnap`` command line: a thin shell over the library.

The database comes from ``--db``, else the ``AGENTSNAP_DB`` environment variable, else
``sqlite:///agentsnap.db``. Errors are one line on standard error and a non-zero exit status.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

from agentsnap import __version__
from agentsnap.exceptions import AgentsnapError

__all__ = ["main"]

T = TypeVar("T")

_DB = click.option(
    "--db",
    envvar="AGENTSNAP_DB",
    default="sqlite:///agentsnap.db",
    show_default=True,
    help="Database URL (or set AGENTSNAP_DB).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="agentsnap")
def main() -> None:
    """Inspect and drive agentsnap runs."""


@main.group()
def db() -> None:
    """Manage the database schema."""


@db.command()
@_DB
@click.option("--revision", default="head", show_default=True, help="Target revision.")
def upgrade(db: str, revision: str) -> None:
    """Upgrade the schema to the newest revision (or --revision)."""
    from agentsnap.store import migrate  # noqa: PLC0415  # keeps `agentsnap --help` fast

    _guard(lambda: migrate.upgrade(db, revision))
    click.echo(f"schema at {_guard(lambda: migrate.current(db))}")


@db.command()
@_DB
def current(db: str) -> None:
    """Print the schema revision of the database and whether it is the newest."""
    from agentsnap.store import migrate  # noqa: PLC0415

    found = _guard(lambda: migrate.current(db))
    newest = migrate.head()
    if found is None:
        click.echo(f"no agentsnap schema (newest is {newest}): run `agentsnap db upgrade`")
    elif found == newest:
        click.echo(f"{found} (newest)")
    else:
        click.echo(f"{found} (newest is {newest}): run `agentsnap db upgrade`")


def _guard(action: Callable[[], T]) -> T:
    try:
        return action()
    except AgentsnapError as exc:
        raise click.ClickException(str(exc)) from exc
    except Exception as exc:  # a database error: one line, no traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise click.ClickException(f"{type(exc).__name__}: {first}") from exc
