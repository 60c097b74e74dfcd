"""The worker's batching: a busy loop pays one transaction per job, and stopping claims nothing.

A loop's settlement claims that loop's next job in the same transaction, so
draining ``n`` jobs on one loop takes ``n + 1`` write transactions (the first
claim, then one per settlement); after the last, the idle check answers the
next claim without any transaction. A worker that is stopping settles its
running attempt without leasing another job.
"""

from __future__ import annotations

import threading
from typing import Any

from jaren_jobs import JobContext, Outcome, Store
from tests.integration.test_worker import WAIT, Counter, Outcomes


def test_a_busy_loop_pays_one_write_transaction_per_job(store: Store) -> None:
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
    assert statements.count("BEGIN IMMEDIATE") == 1 + 5
    assert statements.count("COMMIT") == 1 + 5
    for job in jobs:
        done = store.jobs.get(job.id)
        assert done is not None
        assert (done.state, done.result, done.attempts) == ("done", job.payload * 10, 1)


def test_a_stopping_worker_settles_without_leasing_another_job(store: Store) -> None:
    first = store.jobs.enqueue("k", "first")
    second = store.jobs.enqueue("k", "second")
    started = threading.Event()
    outcomes = Outcomes()

    def handler(payload: Any, ctx: JobContext) -> Any:
        started.set()
        assert ctx.signal.wait(WAIT)  # returns once stop() has begun
        return payload

    worker = store.jobs.create_worker({"k": handler}, on_outcome=outcomes)
    worker.start()
    assert started.wait(WAIT)
    result = worker.stop(grace_seconds=WAIT)
    assert result.drained is True
    events: list[Outcome] = outcomes.wait_for(1)
    assert [(e.job_id, e.outcome) for e in events] == [(first.id, "completed")]
    assert worker.stats().claims == 1
    left = store.jobs.get(second.id)
    assert left is not None
    assert (left.state, left.attempts) == ("pending", 0)  # never leased
