"""PostgreSQL: migration 4 (the forced-cancel mark) upgrades schema 3's tables with live rows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import jaren_jobs
from jaren_jobs import Runtime
from jaren_jobs.backends.postgres import queries as sql
from jaren_jobs.backends.postgres.schema import MIGRATIONS, SCHEMA_VERSION
from tests.conftest import FakeClock, require_postgres
from tests.harness import PostgresUrl

psycopg = pytest.importorskip("psycopg", reason="the dev extra installs psycopg")


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[PostgresUrl]:
    require_postgres()
    harness = PostgresUrl(tmp_path / "unused.db")
    try:
        yield harness
    finally:
        harness.close()


def test_schema_3_live_lease_upgrades_in_place_and_can_be_force_cancelled(
    pg: PostgresUrl, runtime: Runtime, clock: FakeClock
) -> None:
    # migrations 1-3 alone, as the previous release applied them
    with psycopg.connect(pg.url) as conn:
        for _, _, text in MIGRATIONS[:3]:
            conn.execute(text)
        conn.execute(sql.CREATE_META)
        conn.execute(sql.WRITE_SCHEMA_VERSION, {"v": "3"})
    with jaren_jobs.open_store(pg.url, runtime=runtime) as store:
        assert pg.query("SELECT value FROM _jaren_meta WHERE key = 'schema_version'") == [
            (str(SCHEMA_VERSION),)
        ]
        store.jobs.enqueue("k", id="j")
        claimed = store.jobs.claim(["k"], owner="w", lease_seconds=10)
        assert claimed is not None
        assert pg.query('SELECT cancel_requested_at FROM "_jaren_jobs"') == [(None,)]
        assert store.jobs.cancel("j", force=True) is True
        clock.advance(11)
        job = store.jobs.get("j")
        assert job is not None
        assert (job.state, job.cancel_requested) == ("cancelled", True)


def test_schema_4_error_history_is_rekeyed_keeping_every_entry_in_order(
    pg: PostgresUrl, runtime: Runtime
) -> None:
    # migrations 1-4 alone, with two entries as schema 4 keyed them (attempt, instant)
    with psycopg.connect(pg.url) as conn:
        for _, _, text in MIGRATIONS[:4]:
            conn.execute(text)
        conn.execute(sql.CREATE_META)
        conn.execute(sql.WRITE_SCHEMA_VERSION, {"v": "4"})
    with jaren_jobs.open_store(pg.url, runtime=runtime) as store:
        job = store.jobs.enqueue("k", max_attempts=5)
    pg.execute("DELETE FROM _jaren_job_errors")
    pg.execute("UPDATE _jaren_meta SET value = '4'")
    pg.execute("ALTER TABLE _jaren_job_errors DROP COLUMN generation")
    pg.execute("ALTER TABLE _jaren_job_errors ADD PRIMARY KEY (job_id, attempt, at)")
    pg.execute(
        "INSERT INTO _jaren_job_errors (job_id, attempt, at, error, traceback) VALUES "
        "(?, 2, 2000, 'second', NULL), (?, 1, 1000, 'first', 'tb')",
        (job.id, job.id),
    )
    with jaren_jobs.open_store(pg.url, runtime=runtime) as store:
        claimed = store.jobs.claim(["k"], owner="w")
        assert claimed is not None
        assert store.jobs.fail(claimed.lease, "third")
        history = store.jobs.errors(job.id)
    assert [(e.attempt, e.error, e.traceback) for e in history] == [
        (1, "first", "tb"),
        (2, "second", None),
        (1, "third", None),
    ]
