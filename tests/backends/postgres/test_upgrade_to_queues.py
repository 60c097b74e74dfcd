"""PostgreSQL: migration 2 (queues and unique keys) upgrades round 1's tables with live rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import jaren_jobs
from jaren_jobs import Runtime
from jaren_jobs.backends.postgres import queries as sql
from jaren_jobs.backends.postgres.schema import MIGRATIONS, SCHEMA_VERSION
from tests.backends import round1
from tests.conftest import FakeClock
from tests.harness import PostgresUrl

psycopg = pytest.importorskip("psycopg", reason="the dev extra installs psycopg")


def build_round_1(pg: PostgresUrl) -> None:
    """Migration 1 alone, as round 1's library applied it, then its live rows."""
    number, _, text = MIGRATIONS[0]
    assert number == 1
    with psycopg.connect(pg.url) as conn:
        conn.execute(text)
        conn.execute(sql.CREATE_META)
        conn.execute(sql.WRITE_SCHEMA_VERSION, {"v": "1"})
        names = ", ".join(round1.COLUMNS)
        marks = ", ".join(["%s"] * len(round1.COLUMNS))
        with conn.cursor() as cursor:
            cursor.executemany(f'INSERT INTO "_jaren_jobs" ({names}) VALUES ({marks})', round1.ROWS)
            cursor.executemany(
                'INSERT INTO "_jaren_job_checkpoints" VALUES (%s, %s, %s, %s)', round1.CHECKPOINTS
            )


def _query(pg: PostgresUrl) -> Any:
    def query(statement: str) -> list[tuple[Any, ...]]:
        return pg.query(statement)

    return query


def test_round_1_live_rows_upgrade_in_place_to_queues_and_unique_keys(
    pg: PostgresUrl, runtime: Runtime, clock: FakeClock
) -> None:
    build_round_1(pg)
    # 2: queues and unique keys; 3: the error history; 4: forced-cancel marks; 5: the
    # history keyed by generation; 6: the enqueuing trace context; 7: the indexes of the
    # reads by state; 8: one queue's jobs per state
    assert SCHEMA_VERSION == 8
    with jaren_jobs.open_store(pg.url, runtime=runtime) as store:
        version = pg.query("SELECT value FROM _jaren_meta WHERE key = 'schema_version'")
        assert version == [("8",)]
        # the upgraded schema has the (empty) error history table
        assert pg.query('SELECT count(*) FROM "_jaren_job_errors"') == [(0,)]
        round1.check_upgraded(store, _query(pg), clock)


def test_round_1_upgraded_equals_every_migration_from_empty(
    pg: PostgresUrl, tmp_path: Path, runtime: Runtime
) -> None:
    build_round_1(pg)
    jaren_jobs.open_store(pg.url, runtime=runtime).close()
    fresh = PostgresUrl(tmp_path / "fresh.db")
    try:
        jaren_jobs.open_store(fresh.url, runtime=runtime).close()

        def shape(harness: PostgresUrl) -> tuple[Any, ...]:
            columns = harness.query(
                "SELECT table_name, column_name, data_type, is_nullable, column_default, "
                "collation_name FROM information_schema.columns WHERE table_schema = ? "
                "ORDER BY table_name, ordinal_position",
                (harness.schema,),
            )
            indexes = harness.query(
                "SELECT indexname, replace(indexdef, ?, 'S') FROM pg_indexes "
                "WHERE schemaname = ? ORDER BY indexname",
                (harness.schema, harness.schema),
            )
            return columns, indexes

        assert shape(pg) == shape(fresh)
    finally:
        fresh.close()
