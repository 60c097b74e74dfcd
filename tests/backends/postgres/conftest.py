"""The fixtures the tests of PostgreSQL's own mechanics share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import Runtime, Store
from tests.conftest import FakeClock, Sequence, require_postgres
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


@pytest.fixture
def store(pg: PostgresUrl, clock: FakeClock) -> Store:
    """A store on ``pg`` with the fake clock and deterministic ids and tokens."""
    ids = Sequence()
    return pg.open(runtime=Runtime(now=clock.now, random=ids.random, uuid=ids.uuid))


def index_names(pg: PostgresUrl) -> set[str]:
    """The indexes of the harness's schema, by name."""
    rows = pg.query("SELECT indexname FROM pg_indexes WHERE schemaname = ?", (pg.schema,))
    return {str(name) for (name,) in rows}


def plan_of(pg: PostgresUrl, statement: str, params: dict[str, Any]) -> str:
    """``EXPLAIN statement`` with these values, as one text."""
    import psycopg

    with psycopg.connect(pg.url) as conn:
        rows = conn.execute("EXPLAIN " + statement, params).fetchall()
    return "\n".join(str(row[0]) for row in rows)
