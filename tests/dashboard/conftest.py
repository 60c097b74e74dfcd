"""Fixtures of the dashboard tests: ``db`` is a store on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jaren_jobs import Runtime, Store
from tests.conftest import FakeClock, require_postgres
from tests.harness import Harness, PostgresUrl, SqliteFile


@pytest.fixture(params=["sqlite", "postgres"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    made: Harness
    if request.param == "postgres":
        require_postgres()
        made = PostgresUrl(tmp_path / "unused.db")
    else:
        made = SqliteFile(tmp_path / "jobs.db")
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db(harness: Harness, clock: FakeClock) -> Store:
    """A store on the test's database whose clock the test moves."""
    return harness.open(runtime=Runtime(now=clock.now))
