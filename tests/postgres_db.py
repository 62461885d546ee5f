"""The PostgreSQL the tests run against: ``AGENTSNAP_TEST_POSTGRES_URL``, emptied per test.

Without the variable, tests that need PostgreSQL skip, saying why (``.ci/run`` always sets it).
"""

from __future__ import annotations

import os

import pytest
import sqlalchemy

from agentsnap.store.migrate import sync_url

POSTGRES_URL_VARIABLE = "AGENTSNAP_TEST_POSTGRES_URL"


def reset_postgres(url: str) -> None:
    """Drop everything in the target database, so each test starts from an empty one."""
    engine = sqlalchemy.create_engine(sync_url(url))
    try:
        with engine.begin() as connection:
            connection.execute(sqlalchemy.text("DROP SCHEMA public CASCADE"))
            connection.execute(sqlalchemy.text("CREATE SCHEMA public"))
    finally:
        engine.dispose()


def postgres_url_or_skip() -> str:
    """The test database's URL, emptied; skips the test when none is configured."""
    url = os.environ.get(POSTGRES_URL_VARIABLE)
    if not url:
        pytest.skip(f"{POSTGRES_URL_VARIABLE} is not set: no PostgreSQL to test against")
    reset_postgres(url)
    return url
