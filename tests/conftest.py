"""Fixtures shared by every test module."""

from __future__ import annotations

import pytest
from postgres_db import postgres_url_or_skip


@pytest.fixture
def postgres_url() -> str:
    """The test PostgreSQL database, emptied; skips when none is configured."""
    return postgres_url_or_skip()
