"""The statements the engine runs read what they should: ``EXPLAIN QUERY PLAN``.

Each test records the statements an engine call actually executes (SQLite's
trace callback hands over the SQL with its values bound) and asks SQLite for
their plans, on a table that holds settled, pending, delayed, live-leased and
expired-leased rows — with and without ``ANALYZE`` statistics, which an
application may gather on its own database at any time. No plan may scan the
jobs table; claims read the ready index per kind and only the expired range of
the lease index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jaren_jobs import NewJob, Store
from tests.conftest import START, FakeClock

JOBS = "_jaren_jobs"
SETTLED = 3_000


def populate(store: Store, clock: FakeClock) -> None:
    old = int((START - 86_400) * 1000)
    with store.transaction() as tx:
        tx.executemany(
            f'INSERT INTO "{JOBS}" (id, kind, payload, state, priority, run_at, attempts, '
            "max_attempts, lease_generation, settled_generation, created_at, updated_at) "
            "VALUES (?, 'a', 'null', 'done', 0, ?, 1, 5, 1, 1, ?, ?)",
            [(f"done-{i:05d}", old, old, old + i) for i in range(SETTLED)],
        )
    store.jobs.enqueue_many([NewJob("a", i) for i in range(40)])
    store.jobs.enqueue_many([NewJob("b", i, priority=i % 3) for i in range(40)])
    store.jobs.enqueue_many([NewJob("a", i, delay_seconds=3600) for i in range(20)])
    # leases that expire, then leases that stay live
    store.jobs.claim_many(["a"], owner="crashed", limit=5, lease_seconds=1)
    clock.advance(5)
    store.jobs.claim_many(["b"], owner="alive", limit=10, lease_seconds=600)


@pytest.fixture(params=[False, True], ids=["no-stats", "analyzed"])
def populated(request: pytest.FixtureRequest, store: Store, clock: FakeClock) -> Store:
    populate(store, clock)
    if request.param:
        with store.transaction() as tx:
            tx.execute("ANALYZE")
    return store


def traced(store: Store, call: Callable[[], Any]) -> list[str]:
    """The job-table statements ``call`` executed, values bound in."""
    statements: list[str] = []
    store.connection.set_trace_callback(statements.append)
    try:
        call()
    finally:
        store.connection.set_trace_callback(None)
    return [s for s in statements if JOBS in s]


def plan(store: Store, statement: str) -> list[str]:
    rows = store.connection.execute("EXPLAIN QUERY PLAN " + statement).fetchall()
    return [row[3] for row in rows]


def assert_no_table_scan(details: list[str], statement: str) -> None:
    for detail in details:
        # "SCAN _jaren_jobs" alone is a full scan of the table; a scan of a
        # covering or partial index names it
        assert detail.split(" USING ")[0] != f"SCAN {JOBS}" or " USING " in detail, (
            f"full table scan in {statement!r}: {details}"
        )


def claim_plans(store: Store, call: Callable[[], Any]) -> Iterator[list[str]]:
    statements = [s for s in traced(store, call) if s.lstrip().startswith("UPDATE")]
    assert statements, "the call ran no claim statement"
    for statement in statements:
        details = plan(store, statement)
        assert_no_table_scan(details, statement)
        yield details


def test_claim_reads_the_ready_index_per_kind_and_only_expired_leases(populated: Store) -> None:
    for details in claim_plans(populated, lambda: populated.jobs.claim(["a", "b"], owner="w")):
        ready = [d for d in details if "_jaren_jobs_ready" in d]
        assert ready == [f"SEARCH {JOBS} USING INDEX _jaren_jobs_ready (kind=?)"] * 2, details
        assert f"SEARCH {JOBS} USING INDEX _jaren_jobs_leased (lease_until<?)" in details
        # the row itself is found by its key
        assert any("(id=?)" in d and d.startswith(f"SEARCH {JOBS}") for d in details)


def test_claim_many_reads_the_same_indexes(populated: Store) -> None:
    plans = list(
        claim_plans(populated, lambda: populated.jobs.claim_many(["a"], owner="w", limit=8))
    )
    assert len(plans) >= 1
    for details in plans:
        assert f"SEARCH {JOBS} USING INDEX _jaren_jobs_ready (kind=?)" in details
        assert f"SEARCH {JOBS} USING INDEX _jaren_jobs_leased (lease_until<?)" in details


def test_a_rescue_reads_the_expired_range_of_the_lease_index(populated: Store) -> None:
    # the crashed owner's leases (expired) hold the oldest "a" jobs: first in claim order
    rescued: list[Any] = []
    for details in claim_plans(
        populated, lambda: rescued.append(populated.jobs.claim(["a"], owner="rescuer"))
    ):
        assert f"SEARCH {JOBS} USING INDEX _jaren_jobs_leased (lease_until<?)" in details
        assert not any("_jaren_jobs_state" in d for d in details), details  # no live leases read
    assert rescued[0] is not None
    assert rescued[0].lease.owner == "rescuer"
    assert rescued[0].attempts == 2  # a rescue: the crashed attempt counted


def test_counts_read_an_index_never_the_table(populated: Store) -> None:
    statements = traced(populated, populated.jobs.counts)
    assert len(statements) == 2
    for statement in statements:
        details = plan(populated, statement)
        assert_no_table_scan(details, statement)
        assert any("_jaren_jobs_state" in d or "_jaren_jobs_ready" in d for d in details), details
    by_state = plan(populated, statements[0])
    assert by_state == [f"SCAN {JOBS} USING COVERING INDEX _jaren_jobs_state"]


def test_sweep_reads_the_settled_index_in_order(populated: Store) -> None:
    from datetime import datetime, timezone

    horizon = datetime.fromtimestamp(START, timezone.utc)
    statements = traced(populated, lambda: populated.jobs.sweep(settled_before=horizon, limit=10))
    selections = [s for s in statements if "DELETE" in s]
    assert len(selections) == 2
    for statement in selections:
        details = plan(populated, statement)
        assert_no_table_scan(details, statement)
        assert f"SEARCH {JOBS} USING INDEX _jaren_jobs_settled (updated_at<?)" in details
        assert not any("TEMP B-TREE" in d for d in details), details  # no sort of the settled rows
