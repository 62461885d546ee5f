"""The schema changes only through migrations, and the migrations match the models."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from click.testing import CliRunner

from agentsnap.cli import main
from agentsnap.exceptions import SchemaOutOfDate
from agentsnap.store import migrate
from agentsnap.store.sql import SqlStore
from agentsnap.store.tables import VERSION_TABLE, Base


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(migrate.sync_url(url))
    try:
        with engine.connect() as conn:
            return set(sa.inspect(conn).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_from_empty_to_head_and_down_to_base(empty_db: str) -> None:
    assert migrate.current(empty_db) is None
    migrate.upgrade(empty_db)
    assert migrate.current(empty_db) == migrate.head()
    assert set(Base.metadata.tables) <= _tables(empty_db)

    migrate.downgrade(empty_db, "base")
    assert migrate.current(empty_db) is None
    assert _tables(empty_db) & set(Base.metadata.tables) == set()

    migrate.upgrade(empty_db)  # and up again: downgrade left nothing behind
    assert migrate.current(empty_db) == migrate.head()


def test_models_match_the_migrations(empty_db: str) -> None:
    migrate.upgrade(empty_db)
    engine = sa.create_engine(migrate.sync_url(empty_db))
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"version_table": VERSION_TABLE, "compare_type": True}
            )
            diff = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert diff == [], f"models and migrations differ; write a migration for: {diff}"


async def test_a_store_creates_the_schema_in_an_empty_database(empty_db: str) -> None:
    store = SqlStore(empty_db)
    try:
        assert await store.list_runs() == []
    finally:
        await store.close()
    assert migrate.current(empty_db) == migrate.head()


async def test_a_database_at_another_revision_is_refused_with_the_fix(empty_db: str) -> None:
    migrate.upgrade(empty_db)
    engine = sa.create_engine(migrate.sync_url(empty_db))
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = 'f00dfeed'"))
    engine.dispose()

    store = SqlStore(empty_db)
    try:
        with pytest.raises(SchemaOutOfDate) as info:
            await store.list_runs()
    finally:
        await store.close()
    message = str(info.value)
    assert "\n" not in message
    assert "f00dfeed" in message
    assert "agentsnap db upgrade" in message


async def test_a_database_at_an_older_revision_is_refused_then_upgraded(empty_db: str) -> None:
    migrate.upgrade(empty_db, "0001")

    store = SqlStore(empty_db)
    try:
        with pytest.raises(SchemaOutOfDate) as info:
            await store.list_runs()
    finally:
        await store.close()
    message = str(info.value)
    assert "\n" not in message
    assert "revision 0001" in message
    assert f"needs {migrate.head()}" in message
    assert "agentsnap db upgrade" in message

    migrate.upgrade(empty_db)
    store = SqlStore(empty_db)
    try:
        assert await store.list_runs() == []
    finally:
        await store.close()


def test_every_revision_upgrades_and_downgrades_one_step_at_a_time(empty_db: str) -> None:
    revisions = [r.revision for r in reversed(list(migrate.script_directory().walk_revisions()))]
    assert revisions[0] == "0001"
    assert revisions[-1] == migrate.head()
    for revision in revisions:
        migrate.upgrade(empty_db, revision)
        assert migrate.current(empty_db) == revision
    for revision in reversed(revisions[:-1]):
        migrate.downgrade(empty_db, revision)
        assert migrate.current(empty_db) == revision
    migrate.downgrade(empty_db, "base")
    assert migrate.current(empty_db) is None


def test_cli_db_upgrade_and_current(empty_db: str) -> None:
    runner = CliRunner()
    before = runner.invoke(main, ["db", "current", "--db", empty_db])
    assert before.exit_code == 0, before.output
    assert "agentsnap db upgrade" in before.output

    done = runner.invoke(main, ["db", "upgrade", "--db", empty_db])
    assert done.exit_code == 0, done.output
    assert migrate.head() in done.output

    after = runner.invoke(main, ["db", "current"], env={"AGENTSNAP_DB": empty_db})
    assert after.exit_code == 0, after.output
    assert f"{migrate.head()} (newest)" in after.output


def test_cli_rejects_a_database_it_cannot_use() -> None:
    result = CliRunner().invoke(main, ["db", "current", "--db", "mysql://host/db"])
    assert result.exit_code != 0
    assert "SQLite or PostgreSQL" in result.output
    assert "Traceback" not in result.output
