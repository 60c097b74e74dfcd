"""SQLite's own part of tests/conformance/test_worker_batching.py: what only SQLite can show.

Moved out of the conformance suite, which holds what every backend promises
(its conftest refuses a ``sqlite`` requirement there); a test marked
``both_apis`` still runs through the asyncio API too, as it did there.
"""

from __future__ import annotations

import dataclasses

import pytest

from jaren_jobs import NewJob, Outcome, Store
from tests.conformance.test_worker import Counter, Outcomes


@pytest.mark.both_apis  # sqlite3's trace callback counts the statements
def test_a_busy_loop_batches_its_transactions(store: Store) -> None:
    jobs = [store.jobs.enqueue("k", n) for n in range(5)]
    outcomes = Outcomes()
    idle = Counter()
    statements: list[str] = []
    worker = store.jobs.create_worker(
        {"k": lambda payload, ctx: payload * 10},
        poll_seconds=3600,
        on_outcome=outcomes,
        on_idle=idle,
    )
    store.connection.set_trace_callback(statements.append)
    try:
        worker.start()
        assert outcomes.wait_for(5)
        assert idle.wait_for(1)
    finally:
        store.connection.set_trace_callback(None)
        worker.stop()
    assert [e.outcome for e in outcomes.events] == ["completed"] * 5
    assert [e.job_id for e in outcomes.events] == [j.id for j in jobs]  # claim order kept
    first = outcomes.events[0]
    assert first == Outcome("completed", jobs[0].id, "k", 1, 1)
    assert hash(first) == hash(Outcome("completed", jobs[0].id, "k", 1, 1))
    assert list(vars(first)) == [f.name for f in dataclasses.fields(Outcome)]
    # claims of 1, 2 and 4 jobs (2 left), and the settling thread's commits,
    # which take whatever the loop posted meanwhile: never more than one
    # transaction per job plus the first claim. Then the idle check, no transaction.
    assert statements.count("BEGIN IMMEDIATE") <= 1 + 5
    assert statements.count("COMMIT") == statements.count("BEGIN IMMEDIATE")
    for job in jobs:
        done = store.jobs.get(job.id)
        assert done is not None
        assert (done.state, done.result, done.attempts) == ("done", job.payload * 10, 1)


@pytest.mark.both_apis  # sqlite3's trace callback counts the statements
def test_draining_many_fast_jobs_takes_few_transactions(store: Store) -> None:
    count = 300
    store.jobs.enqueue_many([NewJob("k", n) for n in range(count)])
    outcomes = Outcomes()
    statements: list[str] = []
    worker = store.jobs.create_worker(
        {"k": lambda p, ctx: p}, poll_seconds=3600, on_outcome=outcomes
    )
    store.connection.set_trace_callback(statements.append)
    try:
        worker.start()
        events = outcomes.wait_for(count)
    finally:
        worker.stop()
        store.connection.set_trace_callback(None)
    assert [e.outcome for e in events] == ["completed"] * count
    # claims double up to 64 jobs (1+2+4+8+16+32, then 64 a batch: 8 claims);
    # the settling thread commits whatever was posted while it wrote last
    assert statements.count("BEGIN IMMEDIATE") < count // 4
    counts = store.jobs.counts()
    assert (counts.done, counts.leased, counts.pending) == (count, 0, 0)


@pytest.mark.both_apis  # sqlite3's trace callback counts the statements
def test_loops_asking_in_one_settling_write_share_one_claim(store: Store) -> None:
    """The settling thread's write claims every asking loop's next jobs with ONE claim."""
    from jaren_jobs.backends.sqlite import queries as sql

    count = 1500
    store.jobs.enqueue_many([NewJob("k", n) for n in range(count)])
    outcomes = Outcomes()
    statements: list[str] = []
    worker = store.jobs.create_worker(
        {"k": lambda p, ctx: p}, concurrency=4, poll_seconds=3600, on_outcome=outcomes
    )
    claims = (sql.claim_candidates(1)[:40], sql.claim_next(1)[:40])
    store.connection.set_trace_callback(statements.append)
    try:
        worker.start()
        events = outcomes.wait_for(count)
    finally:
        worker.stop()
        store.connection.set_trace_callback(None)
    assert [e.outcome for e in events] == ["completed"] * count
    per_transaction: list[int] = []
    for statement in statements:
        if statement == "BEGIN IMMEDIATE":
            per_transaction.append(0)
        elif statement.startswith(claims) and per_transaction:
            per_transaction[-1] += 1
    assert per_transaction, "no transaction was traced"
    assert max(per_transaction) == 1
