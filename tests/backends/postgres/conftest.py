"""The fixtures the tests of PostgreSQL's own mechanics share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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
