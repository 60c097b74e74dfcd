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

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jaren_jobs import NewJob, Store, testing
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


def jobs_steps(details: list[str]) -> list[str]:
    """The steps of a plan that read the jobs table (a batch's own rows are a constant list)."""
    return [d for d in details if JOBS in d]


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
    # a batch claim is two statements: the candidates in claim order, read
    # from the same indexes as a lone claim, then one update by rowid
    statements = traced(populated, lambda: populated.jobs.claim_many(["a"], owner="w", limit=8))
    selections = [s for s in statements if s.lstrip().startswith("SELECT")]
    updates = [s for s in statements if s.lstrip().startswith("UPDATE")]
    assert (len(selections), len(updates)) == (1, 1), statements
    details = plan(populated, selections[0])
    assert_no_table_scan(details, selections[0])
    assert f"SEARCH {JOBS} USING INDEX _jaren_jobs_ready (kind=?)" in details
    assert f"SEARCH {JOBS} USING INDEX _jaren_jobs_leased (lease_until<?)" in details
    assert jobs_steps(plan(populated, updates[0])) == [
        f"SEARCH {JOBS} USING INTEGER PRIMARY KEY (rowid=?)"
    ]


def test_a_rescue_reads_the_expired_range_of_the_lease_index(populated: Store) -> None:
    # the crashed owner's leases (expired) hold the oldest "a" jobs: first in claim order
    rescued: list[Any] = []
    for details in claim_plans(
        populated, lambda: rescued.append(populated.jobs.claim(["a"], owner="rescuer"))
    ):
        assert f"SEARCH {JOBS} USING INDEX _jaren_jobs_leased (lease_until<?)" in details
        assert not any("_jaren_jobs_unleased" in d for d in details), details  # no live leases read
    assert rescued[0] is not None
    assert rescued[0].lease.owner == "rescuer"
    assert rescued[0].attempts == 2  # a rescue: the crashed attempt counted


def test_counts_read_an_index_never_the_table(populated: Store) -> None:
    statements = traced(populated, populated.jobs.counts)
    assert len(statements) == 3
    for statement in statements:
        assert_no_table_scan(plan(populated, statement), statement)
    by_state, leased, kinds = (plan(populated, statement) for statement in statements)
    # every state but leased from one covering index; leased from the lease index;
    # the ready jobs per kind from the claim's index, in kind order (no sort)
    assert by_state == [f"SCAN {JOBS} USING COVERING INDEX _jaren_jobs_state_id"]
    assert leased == [f"SCAN {JOBS} USING INDEX _jaren_jobs_leased"]
    assert kinds == [f"SCAN {JOBS} USING INDEX _jaren_jobs_ready"]


def test_counts_agree_with_the_rows(populated: Store) -> None:
    counts = populated.jobs.counts()
    rows = populated.connection.execute(
        f"SELECT state, COUNT(*) FROM {JOBS} NOT INDEXED GROUP BY state"
    ).fetchall()
    assert {state: getattr(counts, state) for state, _ in rows} == dict(rows)
    assert counts.leased > 0
    kinds = populated.connection.execute(
        f"SELECT kind, COUNT(*) FROM {JOBS} NOT INDEXED "
        "WHERE state IN ('pending', 'failed') GROUP BY kind"
    ).fetchall()
    assert counts.pending_kinds == dict(kinds)


@pytest.mark.parametrize("limit", [10, None])
@pytest.mark.parametrize("states", [None, ["done", "dead"]])
def test_sweep_reads_each_settled_state_in_order(
    populated: Store, states: list[str] | None, limit: int | None
) -> None:
    from datetime import datetime, timezone

    horizon = datetime.fromtimestamp(START, timezone.utc)
    statements = traced(
        populated,
        lambda: populated.jobs.sweep(settled_before=horizon, limit=limit, states=states),
    )
    selections = [s for s in statements if "DELETE" in s]
    assert len(selections) == 3  # checkpoints, error history, then the jobs
    for statement in selections:
        details = plan(populated, statement)
        assert_no_table_scan(details, statement)
        seek = "COVERING INDEX _jaren_jobs_state_newest (state=? AND updated_at<?)"
        seeks = [d for d in details if d == f"SEARCH {JOBS} USING {seek}"]
        if limit is None:
            # every entry before the horizon, in no order: one seek per state, no sort
            assert len(seeks) == 1, details
            assert not any("TEMP B-TREE" in d for d in details), details
            continue
        assert len(seeks) == (3 if states is None else 2), details  # one branch per state
        # sorted: only the merge of the branches' oldest (at most `limit` each),
        # never the settled rows of a state
        for before, step in itertools.pairwise(details):
            if "TEMP B-TREE" in step:
                assert before.startswith("SCAN (subquery"), details


def test_a_claim_over_many_kinds_still_reads_the_ready_index(populated: Store) -> None:
    # past the per-kind probes the candidates come from one IN probe of the index
    kinds = ["a", "b", *(f"other-{i}" for i in range(70))]
    statements = traced(populated, lambda: populated.jobs.claim_many(kinds, owner="w", limit=8))
    selections = [s for s in statements if s.lstrip().startswith("SELECT")]
    assert len(selections) == 1, statements
    details = plan(populated, selections[0])
    assert_no_table_scan(details, selections[0])
    # (with ANALYZE statistics SQLite may skip-scan the same index)
    assert any(d.startswith(f"SEARCH {JOBS} USING INDEX _jaren_jobs_ready (") for d in details), (
        details
    )


def test_settle_done_many_finds_each_row_by_its_key(populated: Store) -> None:
    leases = [c.lease for c in populated.jobs.claim_many(["a", "b"], owner="w", limit=6)]
    assert len(leases) == 6
    now = testing.now_ms(populated.jobs)

    def settle() -> None:
        with populated.transaction() as tx:
            answers = testing.settle_done_many(
                tx.jobs, [(lease, "null") for lease in leases], now, "x"
            )
            assert answers == [1] * 6

    statements = [s for s in traced(populated, settle) if s.lstrip().startswith("UPDATE")]
    assert len(statements) == 1, statements
    # the fence may not pull the plan onto the lease or state index: the
    # primary key, one probe per item
    assert jobs_steps(plan(populated, statements[0])) == [
        f"SEARCH {JOBS} USING INDEX sqlite_autoindex_{JOBS}_1 (id=?)"
    ]


def test_release_within_finds_each_row_by_its_key(populated: Store) -> None:
    leases = [c.lease for c in populated.jobs.claim_many(["a", "b"], owner="w", limit=6)]
    now = testing.now_ms(populated.jobs)

    def release() -> None:
        with populated.transaction() as tx:
            assert testing.release_within(tx.jobs, leases, now, "x") == 6

    statements = [s for s in traced(populated, release) if s.lstrip().startswith("UPDATE")]
    assert len(statements) == 1, statements
    assert jobs_steps(plan(populated, statements[0])) == [
        f"SEARCH {JOBS} USING INDEX sqlite_autoindex_{JOBS}_1 (id=?)"
    ]


# ----------------------------------------------------------------- queues and unique keys (§12)


@pytest.fixture(params=[False, True], ids=["no-stats", "analyzed"])
def queued(request: pytest.FixtureRequest, store: Store, clock: FakeClock) -> Store:
    """The populated table, plus jobs in named queues and jobs holding unique keys."""
    populate(store, clock)
    store.jobs.enqueue_many([NewJob("a", i, queue=f"q{i % 4}") for i in range(400)])
    store.jobs.enqueue_many([NewJob("a", i, unique_key=f"u{i}") for i in range(200)])
    if request.param:
        with store.transaction() as tx:
            tx.execute("ANALYZE")
    return store


def sorted_branches(store: Store, statement: str, index: str) -> tuple[int, int]:
    """(branches reading ``index``, those of them that sort their rows): a branch that
    walks the index in claim order has no TEMP B-TREE of its own."""
    rows = store.connection.execute("EXPLAIN QUERY PLAN " + statement).fetchall()
    parents = [parent for _, parent, _, detail in rows if f"USING INDEX {index} " in detail]
    sorting = [
        parent
        for _, parent, _, detail in rows
        if detail.startswith("USE TEMP B-TREE") and parent in parents
    ]
    return len(parents), len(sorting)


def test_a_claim_by_queues_reads_the_queue_index_per_queue_and_kind_in_claim_order(
    queued: Store,
) -> None:
    call = lambda: queued.jobs.claim(["a", "b"], owner="w", queues=["q1", "q2"])  # noqa: E731
    statements = [s for s in traced(queued, call) if s.lstrip().startswith("UPDATE")]
    assert len(statements) == 1
    details = plan(queued, statements[0])
    assert_no_table_scan(details, statements[0])
    ready = [d for d in details if "_jaren_jobs_ready" in d]
    probe = f"SEARCH {JOBS} USING INDEX _jaren_jobs_ready_queue (queue=? AND kind=?)"
    assert ready == [probe] * 4, details
    assert f"SEARCH {JOBS} USING INDEX _jaren_jobs_leased (lease_until<?)" in details
    assert sorted_branches(queued, statements[0], "_jaren_jobs_ready_queue") == (4, 0)


def test_claim_many_by_queues_reads_the_queue_index_in_claim_order(queued: Store) -> None:
    statements = traced(
        queued, lambda: queued.jobs.claim_many(["a"], owner="w", limit=8, queues=["q3"])
    )
    selections = [s for s in statements if s.lstrip().startswith("SELECT")]
    assert len(selections) == 1, statements
    details = plan(queued, selections[0])
    assert_no_table_scan(details, selections[0])
    probe = f"SEARCH {JOBS} USING INDEX _jaren_jobs_ready_queue (queue=? AND kind=?)"
    assert probe in details
    assert sorted_branches(queued, selections[0], "_jaren_jobs_ready_queue") == (1, 0)
    # the claims of every queue still read the kind-first index, unsorted too
    plain = traced(queued, lambda: queued.jobs.claim_many(["a"], owner="w", limit=8))
    selection = next(s for s in plain if s.lstrip().startswith("SELECT"))
    assert sorted_branches(queued, selection, "_jaren_jobs_ready") == (1, 0)


def test_an_enqueue_with_a_held_key_reads_the_unique_index(queued: Store) -> None:
    statements = traced(queued, lambda: queued.jobs.enqueue("a", unique_key="u7"))
    reads = [s for s in statements if s.lstrip().startswith("SELECT")]
    assert reads, statements
    for statement in reads:
        details = plan(queued, statement)
        assert_no_table_scan(details, statement)
    holder = [s for s in reads if "unique_key" in s]
    assert jobs_steps(plan(queued, holder[0])) == [
        f"SEARCH {JOBS} USING INDEX _jaren_jobs_unique (unique_key=?)"
    ]


def test_requeue_checks_the_key_by_the_unique_index(queued: Store) -> None:
    job = queued.jobs.enqueue("a", id="keyed", unique_key="requeued")
    queued.jobs.cancel(job.id)
    statements = traced(queued, lambda: queued.jobs.requeue("keyed"))
    update = [s for s in statements if s.lstrip().startswith("UPDATE")]
    assert len(update) == 1
    details = plan(queued, update[0])
    assert_no_table_scan(details, update[0])
    assert "SEARCH other USING INDEX _jaren_jobs_unique (unique_key=?)" in details


@pytest.mark.parametrize(
    ("options", "index"),
    [
        ({"state": "done"}, "_jaren_jobs_state_id (state=? AND id>?)"),
        ({"state": "pending", "kind": "a", "queue": "default"}, "_jaren_jobs_state_id"),
        ({"state": "done", "order": "newest"}, "_jaren_jobs_state_newest (state=? AND "),
        ({"state": "cancelled", "order": "newest"}, "_jaren_jobs_state_newest (state=? AND "),
        ({"kind": "a", "order": "newest"}, "_jaren_jobs_newest ("),
        ({"state": "leased"}, "_jaren_jobs_leased"),
        ({"queue": "default"}, "sqlite_autoindex__jaren_jobs_1"),
        ({"queue": "default", "order": "newest"}, "_jaren_jobs_newest ("),
    ],
    ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) else "",
)
def test_a_page_by_state_or_newest_first_seeks_in_its_index(
    populated: Store, options: dict[str, str], index: str
) -> None:
    statements = traced(populated, lambda: list(populated.jobs.page(limit=3, **options)))
    assert statements
    for statement in statements:
        details = plan(populated, statement)
        assert_no_table_scan(details, statement)
        assert any(f"USING INDEX {index}" in d for d in details), details
        # sorted: only the few leased rows, the merge of the branches' rows (at
        # most a page each) and a queue's rows when it holds few (its branch's
        # LIMIT is 0 otherwise), never the rows of a state
        for before, step in itertools.pairwise(details):
            if "TEMP B-TREE" in step:
                merging = before.startswith("SCAN (subquery")
                few = "_jaren_jobs_queue_state (queue=?" in before and "queue" in options
                assert merging or few or "_jaren_jobs_leased" in before, details


def test_due_counts_read_indexes_never_the_table(populated: Store) -> None:
    statements = traced(populated, populated.jobs.due_counts)
    assert len(statements) == 1
    details = plan(populated, statements[0])
    assert_no_table_scan(details, statements[0])
    assert details.count(f"SEARCH {JOBS} USING COVERING INDEX _jaren_jobs_state_id (state=?)") == 2
    assert f"SEARCH {JOBS} USING INDEX _jaren_jobs_leased (lease_until<?)" in details


def test_settled_buckets_read_the_covering_state_index(populated: Store) -> None:
    from datetime import datetime, timezone

    since = datetime.fromtimestamp(START - 86_400, timezone.utc)
    call = lambda: populated.jobs.settled_buckets(since=since, bucket_seconds=3600, buckets=48)  # noqa: E731
    statements = traced(populated, call)
    assert len(statements) == 1
    details = plan(populated, statements[0])
    assert_no_table_scan(details, statements[0])
    searches = [d for d in details if "_jaren_jobs_state_newest" in d]
    window = "(state=? AND updated_at>? AND updated_at<?)"
    expected = f"SEARCH {JOBS} USING COVERING INDEX _jaren_jobs_state_newest {window}"
    assert searches == [expected] * 3, details


def test_one_queues_counts_read_its_entries_of_an_index_never_the_table(
    populated: Store,
) -> None:
    statements = traced(populated, lambda: populated.jobs.counts(queue="default"))
    assert len(statements) == 2
    by_state, kinds = (plan(populated, statement) for statement in statements)
    for statement in statements:
        assert_no_table_scan(plan(populated, statement), statement)
    # the queue is where the index seeks (covering), not a filter over every row;
    # its leased rows from the lease index
    assert f"SEARCH {JOBS} USING COVERING INDEX _jaren_jobs_queue_state (queue=?)" in by_state
    assert f"SCAN {JOBS} USING INDEX _jaren_jobs_leased" in by_state
    assert kinds == [f"SEARCH {JOBS} USING INDEX _jaren_jobs_ready_queue (queue=?)"]
    # and it counts what the rows hold
    rows = populated.connection.execute(
        f"SELECT state, COUNT(*) FROM {JOBS} NOT INDEXED WHERE queue = 'default' GROUP BY state"
    ).fetchall()
    counts = populated.jobs.counts(queue="default")
    assert {state: getattr(counts, state) for state, _ in rows} == dict(rows)
    assert populated.jobs.counts(queue="nowhere").to_dict() == {
        **dict.fromkeys(("pending", "leased", "done", "failed", "dead", "cancelled"), 0),
        "pending_kinds": {},
    }


def test_one_queues_due_counts_read_its_entries_of_an_index(populated: Store) -> None:
    statements = traced(populated, lambda: populated.jobs.due_counts(queue="default"))
    assert len(statements) == 1
    details = plan(populated, statements[0])
    assert_no_table_scan(details, statements[0])
    seek = f"SEARCH {JOBS} USING COVERING INDEX _jaren_jobs_queue_state (queue=? AND state=?)"
    assert details.count(seek) == 2, details
    assert populated.jobs.due_counts(queue="default") == populated.jobs.due_counts()


@pytest.mark.parametrize("order", ["id", "newest"])
@pytest.mark.parametrize(
    "options",
    [
        {"queue": "default"},  # more rows than FEW_IN_QUEUE: read in page order
        {"queue": "default", "state": "done"},
        {"queue": "default", "state": "pending"},  # fewer: read from the queue's index
        {"queue": "other"},
        {"queue": "other", "state": "pending", "kind": "a"},
        {"queue": "nowhere"},
    ],
    ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()),
)
def test_a_page_by_queue_holds_the_rows_the_table_holds_whichever_index_reads_them(
    populated: Store, options: dict[str, str], order: str
) -> None:
    from jaren_jobs.backends.sqlite.listing import FEW_IN_QUEUE

    populated.jobs.enqueue_many([NewJob("a", i, queue="other") for i in range(30)])
    populated.jobs.enqueue_many([NewJob("b", i, queue="other") for i in range(5)])
    busy = populated.jobs.counts(queue="default")
    assert busy.done >= FEW_IN_QUEUE > busy.pending  # both branches are exercised
    where = " AND ".join(f"{name} = ?" for name in options)
    ordering = "id" if order == "id" else "updated_at DESC, id DESC"
    expected = [
        row[0]
        for row in populated.connection.execute(
            f"SELECT id FROM {JOBS} NOT INDEXED WHERE {where} ORDER BY {ordering}",
            tuple(options.values()),
        )
    ]
    # two pages, the second continuing past the first's last row
    first = [job.id for job in populated.jobs.page(limit=20, order=order, **options)]
    rest = (
        [
            job.id
            for job in populated.jobs.page(
                limit=len(expected), order=order, after=first[-1], **options
            )
        ]
        if first
        else []
    )
    assert first + rest == expected
