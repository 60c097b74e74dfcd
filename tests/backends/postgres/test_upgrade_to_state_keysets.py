"""PostgreSQL: migration 6 (the indexes of the reads by state) upgrades live rows, and the
operator's reads it serves are answered from those indexes (their plans name them)."""

from __future__ import annotations

import pytest

import jaren_jobs
from jaren_jobs import Runtime
from jaren_jobs.backends.postgres import listing as sql
from jaren_jobs.backends.postgres.schema import SCHEMA_VERSION
from jaren_jobs.core.commands import PageFilters
from tests.backends.postgres.conftest import index_names, plan_of
from tests.conftest import FakeClock
from tests.harness import PostgresUrl

psycopg = pytest.importorskip("psycopg", reason="the dev extra installs psycopg")

NEW_INDEXES = ("_jaren_jobs_newest", "_jaren_jobs_state_id", "_jaren_jobs_state_newest")


def _fill(store: jaren_jobs.Store, clock: FakeClock) -> None:
    for n in range(40):
        store.jobs.enqueue("k" if n % 2 else "j", {"n": n}, id=f"a{n:03d}")
        clock.advance(1)
    for _ in range(10):
        claimed = store.jobs.claim(["k"], owner="w")
        assert claimed is not None
        store.jobs.fail(claimed.lease, "boom", retry=False)
        clock.advance(1)


def test_schema_6_with_live_rows_upgrades_to_7(
    pg: PostgresUrl, runtime: Runtime, clock: FakeClock
) -> None:
    assert SCHEMA_VERSION >= 7
    with jaren_jobs.open_store(pg.url, runtime=runtime) as store:
        _fill(store, clock)
        before = [j.id for j in store.jobs.page(state="dead", order="newest", limit=100)]
    # back to schema 6, as the previous release left it
    for name in NEW_INDEXES:
        pg.execute(f'DROP INDEX "{name}"')
    pg.execute("UPDATE _jaren_meta SET value = '6'")
    assert not index_names(pg) & set(NEW_INDEXES)
    with jaren_jobs.open_store(pg.url, runtime=runtime) as store:
        version = pg.query("SELECT value FROM _jaren_meta WHERE key = 'schema_version'")
        assert version == [(str(SCHEMA_VERSION),)]
        assert set(NEW_INDEXES) <= index_names(pg)
        after = [j.id for j in store.jobs.page(state="dead", order="newest", limit=100)]
        assert after == before
        # newest first: the dead-lettered jobs, last changed last
        assert after == [f"a{n:03d}" for n in range(19, 0, -2)]
        assert store.jobs.counts().dead == 10


def _fill_many(pg: PostgresUrl) -> None:
    """20,000 jobs, nearly all done and a few in each other state, each with a
    payload of a few hundred bytes, then analysed (as on a queue that has run for a
    while): on a handful of narrow rows, or on states of similar sizes, reading past
    the other rows is as cheap as seeking, and a plan would say nothing about the
    indexes."""
    pg.execute(
        'INSERT INTO "_jaren_jobs" (id, kind, payload, state, run_at, max_attempts, '
        "created_at, updated_at, queue) "
        "SELECT 'b' || lpad(n::text, 6, '0'), 'k' || (n % 5), "
        "'{\"pad\": \"' || repeat('x', 300) || '\"}', "
        "CASE WHEN n % 1000 = 7 THEN 'pending' WHEN n % 1000 = 8 THEN 'dead' "
        "WHEN n % 1000 = 9 THEN 'cancelled' WHEN n % 1000 = 10 THEN 'failed' "
        "ELSE 'done' END, n, 5, n, n, 'default' "
        "FROM generate_series(1, 20000) AS n"
    )
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute('VACUUM ANALYZE "_jaren_jobs"')


@pytest.mark.parametrize(
    "filters",
    [
        PageFilters("dead", None, None, "", 1, "id"),
        PageFilters("pending", "k2", "default", "", 1, "id"),
        PageFilters("dead", None, None, "", 1, "newest"),
        PageFilters("cancelled", "k3", None, "", 1, "newest"),
        PageFilters(None, "k1", None, "", 1, "newest"),
        PageFilters("leased", None, None, "", 1, "id"),
    ],
    ids=lambda f: f"{f.state}-{f.kind}-{f.order}",
)
def test_a_page_by_state_or_newest_first_seeks_in_an_index(
    pg: PostgresUrl, runtime: Runtime, filters: PageFilters
) -> None:
    jaren_jobs.open_store(pg.url, runtime=runtime).close()
    _fill_many(pg)
    params = {"now": 0, "after": "", "after_at": 2**62, "limit": 1}
    params.update(state=filters.state, kind=filters.kind, queue=filters.queue)
    plan = plan_of(pg, sql.page_jobs(filters), params)
    assert "Seq Scan" not in plan
    # only the few leased rows are sorted (one sort per branch reading them)
    assert plan.count("Sort  (") <= plan.count("using _jaren_jobs_leased")
    if filters.state == "leased":
        assert "using _jaren_jobs_leased" in plan
    elif filters.state is not None:
        # the state is where the index seeks, not a filter over every other row
        assert f"Index Cond: ((state = '{filters.state}'::text)" in plan
    else:
        assert "Index Scan Backward using _jaren_jobs_newest" in plan


def test_the_counts_read_indexes_only(pg: PostgresUrl, runtime: Runtime) -> None:
    jaren_jobs.open_store(pg.url, runtime=runtime).close()
    _fill_many(pg)
    # counts() reads one of the unleased indexes whole (the planner picks the
    # smallest), never the table
    plan = plan_of(pg, sql.COUNT_BY_STATE, {"now": 0})
    assert "Index Only Scan using _jaren_jobs_" in plan, plan
    assert "using _jaren_jobs_leased" in plan
    assert "Seq Scan" not in plan
    plan = plan_of(pg, sql.DUE_COUNTS, {"now": 0})
    assert "Index Only Scan using _jaren_jobs_state_id" in plan
    assert "using _jaren_jobs_leased" in plan
    assert "Seq Scan" not in plan


def test_the_settled_buckets_read_an_index_only(pg: PostgresUrl, runtime: Runtime) -> None:
    jaren_jobs.open_store(pg.url, runtime=runtime).close()
    _fill_many(pg)
    params = {"since": 0, "until": 20_000, "bucket": 1000, "limit": 100}
    plan = plan_of(pg, sql.SETTLED_BUCKETS, params)
    assert plan.count("Index Only Scan Backward using _jaren_jobs_state_newest") == 3
    assert "Seq Scan" not in plan
