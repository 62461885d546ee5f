"""What the commands share: the ``--db``, ``--json``, ``--app`` and ``--wait`` kinds of options.

And the database: a query or an action runs against the database in a store of its own,
its errors said in one line (``guard``).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

import click

from agentsnap.exceptions import AgentsnapError
from agentsnap.store.faults import StoreRetry

if TYPE_CHECKING:
    from pydantic import BaseModel

    from agentsnap.distributed.app import App
    from agentsnap.ledger import Ledger
    from agentsnap.store.sql import SqlStore


T = TypeVar("T")
Option = Callable[[Callable[..., object]], Callable[..., object]]

# A command waits a few seconds for a database that does not answer, then says so.
RETRY = StoreRetry(timeout=10.0, deadline=5.0)

DB = click.option(
    "--db",
    envvar="AGENTSNAP_DB",
    default="sqlite:///agentsnap.db",
    show_default=True,
    help="Database URL (or set AGENTSNAP_DB).",
)

JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def app_option(help: str, *, required: bool = False) -> Option:
    """An ``--app MODULE:FACTORY`` option (``app_spec``), saying what the app is for."""
    return click.option(
        "--app", "app_spec", required=required, default=None, metavar="MODULE:FACTORY", help=help
    )


APP = app_option(
    "Read the states as this app's state classes read them now, through their "
    "upcasters: a factory returning an agentsnap.distributed.App or a list of agents (the "
    "current directory is importable)."
)


def seconds_option(
    flag: str,
    help: str,
    *,
    default: float | None,
    least: float = 0.0,
) -> Option:
    """An option taking a number of seconds, at least ``least``; its default shown, if any."""
    return click.option(
        flag,
        type=click.FloatRange(min=least),
        default=default,
        show_default=default is not None,
        help=help,
    )


def importable_here() -> None:
    """Let the user's modules next to where the command runs be imported (``--app``)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def app_of(app_spec: str) -> App:
    """The app ``--app`` names, or a usage error saying what is wrong with it."""
    from agentsnap.distributed.app import load_app  # noqa: PLC0415
    from agentsnap.exceptions import ConfigurationError  # noqa: PLC0415

    importable_here()
    try:
        return load_app(app_spec)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--app") from exc


def state_models(app_spec: str | None) -> dict[str, type[BaseModel]] | None:
    """The state classes of the app ``--app`` names, by agent name (``None`` without one)."""
    return None if app_spec is None else app_of(app_spec).state_models()


class _Closing(Protocol):
    async def close(self) -> None: ...


Opened = TypeVar("Opened", bound=_Closing)


def _on(opening: Callable[[], Opened], action: Callable[[Opened], Awaitable[T]]) -> T:
    """Run ``action`` on what ``opening`` opens, closed after, its errors said in one line."""

    async def go() -> T:
        opened = opening()
        try:
            return await action(opened)
        finally:
            await opened.close()

    return guard(lambda: asyncio.run(go()))


def act(db: str, action: Callable[[SqlStore], Awaitable[T]], *, create: bool = False) -> T:
    """Run ``action`` with a store on ``db`` that writes (``create``: a database and its
    schema are created if there is none).
    """  # noqa: D205
    from agentsnap.store.sql import SqlStore  # noqa: PLC0415

    return _on(lambda: SqlStore(db, create=create), action)


def with_ledger(db: str, action: Callable[[Ledger], Awaitable[T]]) -> T:
    """Run ``action`` against the ledger at ``db`` without creating anything there."""
    from agentsnap.store.sql_ledger import SqlLedger  # noqa: PLC0415

    return _on(lambda: SqlLedger(db, create=False, retry=RETRY), action)


def read(db: str, query: Callable[[SqlStore], Awaitable[T]]) -> T:
    """Run one query against the database at ``db`` without creating anything there."""
    from agentsnap.store.sql import SqlStore  # noqa: PLC0415

    return _on(lambda: SqlStore(db, create=False, retry=RETRY), query)


def guard(action: Callable[[], T]) -> T:
    """``action()``, its error as one line for the command line (no traceback)."""
    try:
        return action()
    except BrokenPipeError:  # standard output was closed: the main group stops quietly
        raise
    except AgentsnapError as exc:
        raise click.ClickException(str(exc)) from exc
    except Exception as exc:  # a database error: one line, no traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise click.ClickException(f"{type(exc).__name__}: {first}") from exc
