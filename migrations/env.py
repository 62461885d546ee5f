"""Alembic environment for agentsnap's schema.

Run through `agentsnap db upgrade` (or `agentsnap.store.migrate.upgrade`), which passes the
database URL in the Alembic config; the schema's version lives in its own table so that it can
share a database with an application's own migrations.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Connection, Engine, engine_from_config, event, pool

from agentsnap.store.tables import VERSION_TABLE, Base

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    """Emit SQL to stdout instead of running it."""
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        version_table=VERSION_TABLE,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations against a live connection."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = engine_from_config(
        config.get_section(config.config_ini_section, {}),
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    if engine.dialect.name == "sqlite":
        _transactional_sqlite(engine)
    with engine.connect() as connection:
        _run(connection)


def _transactional_sqlite(engine: Engine) -> None:
    """Run each migration in one SQLite transaction, DDL included.

    Python's sqlite3 driver commits before every CREATE or ALTER on its own, so a process
    killed half-way through a migration would leave tables without a version row and a
    database nothing can upgrade. Taking over BEGIN makes the schema change and its version
    row one atomic commit; IMMEDIATE also makes two processes migrating the same new file
    take turns instead of both creating the tables.
    """

    @event.listens_for(engine, "connect")
    def _no_implicit_transactions(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        render_as_batch=True,
        compare_type=True,
        transactional_ddl=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
