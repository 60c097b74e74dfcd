"""PostgreSQL: migration 8 (one queue's jobs per state from an index) upgrades live rows
in place, and the per-queue reads it serves are answered from that index, never the table."""

from __future__ import annotations

import re
from typing import Any

import pytest

import jaren_jobs
from jaren_jobs import Runtime
from jaren_jobs.backends.postgres import listing as sql
from jaren_jobs.backends.postgres import queries
from jaren_jobs.backends.postgres.schema import SCHEMA_VERSION
from tests.backends.postgres.conftest import index_names, plan_of
from tests.conftest import FakeClock
from tests.harness import PostgresUrl

psycopg = pytest.importorskip("psycopg", reason="the dev extra installs psycopg")


def test_schema_7_with_live_rows_upgrades_to_8(
    pg: PostgresUrl, runtime: Runtime, clock: FakeClock
) -> None:
    assert SCHEMA_VERSION == 8
    with jaren_jobs.open_store(pg.url, runtime=runtime) as store:
        for n in range(30):
            store.jobs.enqueue("k", {"n": n}, id=f"a{n:03d}", queue=("q1", "q2", "q3")[n % 3])
            clock.advance(1)
        for _ in range(6):
            claimed = store.jobs.claim(["k"], owner="w", queues=["q1"])
            assert claimed is not None
            store.jobs.complete(claimed.lease, None)
        held = store.jobs.claim(["k"], owner="w", queues=["q2"])
        assert held is not None
        before = {q: store.jobs.counts(queue=q) for q in ("q1", "q2", "q3", "none")}
    # back to schema 7, as the previous release left it
    pg.execute('DROP INDEX "_jaren_jobs_queue_state"')
    pg.execute(
        'CREATE INDEX "_jaren_jobs_unleased" ON "_jaren_jobs" (state, kind) '
        "WHERE state <> 'leased'"
    )
    pg.execute(
        'CREATE INDEX "_jaren_jobs_settled" ON "_jaren_jobs" (updated_at, id) '
        "WHERE state IN ('done', 'dead', 'cancelled')"
    )
    pg.execute("UPDATE _jaren_meta SET value = '7'")
    with jaren_jobs.open_store(pg.url, runtime=runtime) as store:
        version = pg.query("SELECT value FROM _jaren_meta WHERE key = 'schema_version'")
        assert version == [("8",)]
        indexes = index_names(pg)
        assert "_jaren_jobs_queue_state" in indexes
        assert not indexes & {"_jaren_jobs_unleased", "_jaren_jobs_settled"}
        after = {q: store.jobs.counts(queue=q) for q in ("q1", "q2", "q3", "none")}
        assert after == before
        assert (after["q1"].done, after["q1"].pending) == (6, 4)
        assert (after["q2"].leased, after["q2"].pending) == (1, 9)
        assert after["none"] == jaren_jobs.Counts()


def _fill_many(pg: PostgresUrl) -> None:
    """30,000 jobs in three queues, nearly all done, then analysed (a queue that has
    run for a while): on a few rows a plan would say nothing about the indexes."""
    pg.execute(
        'INSERT INTO "_jaren_jobs" (id, kind, payload, state, run_at, max_attempts, '
        "created_at, updated_at, queue) "
        "SELECT 'b' || lpad(n::text, 6, '0'), 'k' || (n % 5), '{}', "
        "CASE WHEN n % 1000 = 7 THEN 'pending' WHEN n % 1000 = 8 THEN 'dead' "
        "ELSE 'done' END, n, 5, n, n, 'q' || (n % 3) "
        "FROM generate_series(1, 30000) AS n"
    )
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute('VACUUM ANALYZE "_jaren_jobs"')


def test_one_queues_counts_read_its_entries_of_an_index_only(
    pg: PostgresUrl, runtime: Runtime
) -> None:
    jaren_jobs.open_store(pg.url, runtime=runtime).close()
    _fill_many(pg)
    params = {"queue": "q1", "now": 0}
    for statement in (sql.COUNT_QUEUE_BY_STATE, sql.DUE_COUNTS_QUEUE):
        plan = plan_of(pg, statement, params)
        # the queue is where the index seeks, not a filter over every other queue's rows
        assert "Index Only Scan using _jaren_jobs_queue_state" in plan, plan
        assert re.search(r"Index Cond: \(+queue = 'q1'::text\)", plan), plan
        assert "using _jaren_jobs_leased" in plan
        assert "Seq Scan" not in plan


def _state_of(n: int) -> str:
    """What ``_fill_many`` made of its job number n (updated_at = n)."""
    return "pending" if n % 1000 == 7 else "dead" if n % 1000 == 8 else "done"


@pytest.mark.parametrize("states", [(), ("dead",), ("cancelled", "done")])
def test_a_sweep_reads_each_settled_states_range_oldest_first(
    pg: PostgresUrl, runtime: Runtime, states: tuple[str, ...]
) -> None:
    jaren_jobs.open_store(pg.url, runtime=runtime).close()
    _fill_many(pg)
    params: dict[str, Any] = {"horizon": 20_000, "limit": 100}
    params.update({f"s{i}": state for i, state in enumerate(states)})
    statement = queries.sweep_only(len(states))
    plan = plan_of(pg, statement, params)
    chosen = states or ("done", "dead", "cancelled")
    # one seek per chosen state in the state-and-last-change index, merged in
    # order (a state not chosen is gated off: it reads nothing)
    assert plan.count("Index Only Scan using _jaren_jobs_state_newest") == len(chosen), plan
    for state in chosen:
        assert f"Index Cond: ((state = '{state}'::text) AND (updated_at < " in plan, plan
    assert "Seq Scan on _jaren_jobs " not in plan, plan
    older = [n for n in range(1, 30_001) if _state_of(n) in chosen and n < 20_000]
    gone, kept = older[:100], older[100:]
    with psycopg.connect(pg.url) as conn:
        assert conn.execute(statement, params).fetchone() == (len(gone),)
        ids = {row[0] for row in conn.execute("SELECT id FROM _jaren_jobs").fetchall()}
        conn.rollback()
    assert not ids & {f"b{n:06d}" for n in gone}  # the oldest of the chosen states
    assert {f"b{n:06d}" for n in kept[:5]} <= ids  # and not one more
    assert len(ids) == 30_000 - len(gone)


def test_the_live_queues_are_sought_one_by_one_in_an_index(
    pg: PostgresUrl, runtime: Runtime
) -> None:
    jaren_jobs.open_store(pg.url, runtime=runtime).close()
    _fill_many(pg)
    with psycopg.connect(pg.url) as conn:
        # ANALYZE: plain EXPLAIN leaves out the subplan of the recursive step
        rows = conn.execute("EXPLAIN (ANALYZE) " + sql.LIVE_QUEUES, {"limit": 100}).fetchall()
        conn.rollback()
    plan = "\n".join(str(row[0]) for row in rows)
    # each step of the recursion one seek past the last queue found, never a scan
    # of the queued rows or of the table
    assert "Seq Scan on _jaren_jobs " not in plan, plan
    assert "Recursive Union" in plan, plan
    # in the queued rows' own index: not past every settled row's entry
    assert plan.count("Index Only Scan using _jaren_jobs_ready_queue") == 2, plan
    # each seek meets the next queue's first entry at once: no entry filtered out
    seeks = plan.split("SubPlan 2")[1].split("->  Sort")[0]
    assert "Filter" not in seeks, plan
    with psycopg.connect(pg.url) as conn:
        found = [row[0] for row in conn.execute(sql.LIVE_QUEUES, {"limit": 100})]
    assert found == ["q0", "q1", "q2"]  # the queues with pending jobs
