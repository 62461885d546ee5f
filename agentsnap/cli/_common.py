"""What the commands share: the ``--db``, ``--json`` and ``--app`` options, and the database.

A query or an action runs against the database in a store of its own, its errors said in one
line (``guard``).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import click

from agentsnap.exceptions import AgentsnapError
from agentsnap.store.faults import StoreRetry

if TYPE_CHECKING:
    from pydantic import BaseModel

    from agentsnap.distributed.app import App
    from agentsnap.ledger import Ledger
    from agentsnap.store.sql import SqlStore


T = TypeVar("T")

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

APP = click.option(
    "--app",
    "app_spec",
    default=None,
    metavar="MODULE:FACTORY",
    help="Read the states as this app's state classes read them now, through their "
    "upcasters: a factory returning an agentsnap.distributed.App or a list of agents (the "
    "current directory is importable).",
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


def act(db: str, action: Callable[[SqlStore], Awaitable[T]], *, create: bool = False) -> T:
    """Run ``action`` with a store on ``db`` that writes (``create``: a database and its
    schema are created if there is none).
    """  # noqa: D205
    from agentsnap.store.sql import SqlStore  # noqa: PLC0415

    async def go() -> T:
        store = SqlStore(db, create=create)
        try:
            return await action(store)
        finally:
            await store.close()

    return guard(lambda: asyncio.run(go()))


def with_ledger(db: str, action: Callable[[Ledger], Awaitable[T]]) -> T:
    """Run ``action`` against the ledger at ``db`` without creating anything there."""
    from agentsnap.store.sql_ledger import SqlLedger  # noqa: PLC0415

    async def go() -> T:
        ledger = SqlLedger(db, create=False, retry=RETRY)
        try:
            return await action(ledger)
        finally:
            await ledger.close()

    return guard(lambda: asyncio.run(go()))


def read(db: str, query: Callable[[SqlStore], Awaitable[T]]) -> T:
    """Run one query against the database at ``db`` without creating anything there."""
    from agentsnap.store.sql import SqlStore  # noqa: PLC0415

    async def go() -> T:
        store = SqlStore(db, create=False, retry=RETRY)
        try:
            return await query(store)
        finally:
            await store.close()

    return guard(lambda: asyncio.run(go()))


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
