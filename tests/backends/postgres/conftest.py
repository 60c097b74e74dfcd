"""The fixture every test of PostgreSQL's own mechanics shares."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require_postgres
from tests.harness import PostgresUrl


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[PostgresUrl]:
    """A store harness on a fresh schema of the test server (dropped afterwards)."""
    require_postgres()
    harness = PostgresUrl(tmp_path / "unused.db")
    try:
        yield harness
    finally:
        harness.close()
