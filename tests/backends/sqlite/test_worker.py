"""SQLite's own part of tests/conformance/test_worker.py: what only SQLite can show.

Moved out of the conformance suite, which holds what every backend promises
(its conftest refuses a ``sqlite`` requirement there); a test marked
``both_apis`` still runs through the asyncio API too, as it did there.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from jaren_jobs import (
    JobContext,
    Lease,
    StopOutcome,
    Store,
    StoreClosed,
    WorkerStopped,
)
from tests.conformance.test_worker import (
    WAIT,
    LogEvents,
    Outcomes,
    job_state,
    join_threads,
    worker_threads,
)
from tests.conftest import FakeClock
from tests.harness import Harness


@pytest.mark.requires("file")  # another connection holds SQLite's write lock
@pytest.mark.both_apis
def test_a_storage_error_during_renewal_keeps_the_lease_and_retries(
    backend: Harness,
    runtime: Any,
    clock: FakeClock,
    log_events: Callable[[str], LogEvents],
) -> None:
    logs = log_events("renewing the lease")
    outcomes = Outcomes()
    renewals: queue.Queue[Lease] = queue.Queue()
    started = threading.Event()
    release = threading.Event()

    def long(payload: Any, ctx: JobContext) -> Any:
        started.set()
        assert release.wait(WAIT)
        return "ok"

    with backend.open(runtime=runtime, busy_timeout_seconds=0.01) as store:
        worker = store.jobs.create_worker(
            {"k": long}, lease_seconds=0.3, on_outcome=outcomes, on_renewal=renewals.put
        )
        job = store.jobs.enqueue("k")
        worker.start()
        assert started.wait(WAIT)
        blocker = sqlite3.connect(backend.path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")  # another connection holds the write lock
            assert logs.seen.wait(WAIT)  # a renewal met "database is locked"
            blocker.execute("ROLLBACK")
        finally:
            blocker.close()
        # renewals run one at a time on the scheduler thread, so every success
        # before the failure is already queued: drop them, then wait for one
        # made after it, with the lease the failed renewal kept
        while not renewals.empty():
            renewals.get_nowait()
        lease = renewals.get(timeout=WAIT)
        assert lease.generation == 1
        assert worker.leases()[0].expires_at >= lease.expires_at
        release.set()
        assert outcomes.wait_for(1)[0].outcome == "completed"
        assert job_state(store, job.id) == "done"
        assert any("locked" in r.getMessage() for r in logs.records)
        assert worker.stats().lost_settlements == 0
        worker.stop()


@pytest.mark.requires("file")  # another connection holds SQLite's write lock
@pytest.mark.both_apis
def test_a_completion_that_meets_a_locked_database_is_retried_not_failed(
    backend: Harness, runtime: Any, log_events: Callable[[str], LogEvents]
) -> None:
    logs = log_events("completing job")
    outcomes = Outcomes()
    started, release = threading.Event(), threading.Event()

    def handler(payload: Any, ctx: JobContext) -> Any:
        started.set()
        assert release.wait(WAIT)
        return {"kept": payload}

    with backend.open(runtime=runtime, busy_timeout_seconds=0.01) as store:
        worker = store.jobs.create_worker({"k": handler}, poll_seconds=3600, on_outcome=outcomes)
        job = store.jobs.enqueue("k", 1, max_attempts=1)
        worker.start()
        assert started.wait(WAIT)
        blocker = sqlite3.connect(backend.path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")  # another connection holds the write lock
            release.set()
            assert logs.seen.wait(WAIT)  # the completion met "database is locked"
            assert outcomes.events == []  # no outcome yet: it is being retried
            blocker.execute("ROLLBACK")
        finally:
            blocker.close()
        event = outcomes.wait_for(1)[0]
        assert (event.outcome, event.job_id) == ("completed", job.id)
        stored = store.jobs.get(job.id)
        assert stored is not None
        assert (stored.state, stored.result, stored.attempts) == ("done", {"kept": 1}, 1)
        stats = worker.stats()
        assert (stats.completions, stats.failures, stats.lost_settlements) == (1, 0, 0)
        assert worker.stop() == StopOutcome(drained=True, in_flight=0)


@pytest.mark.both_apis  # sqlite3's trace callback counts the statements
def test_an_undrained_handler_is_barred_and_its_job_reclaimed(
    store: Store, clock: FakeClock
) -> None:
    outcomes = Outcomes()
    started = threading.Event()
    release = threading.Event()
    late: list[BaseException] = []

    def stubborn(payload: Any, ctx: JobContext) -> Any:
        started.set()
        release.wait(WAIT)  # ignores ctx.signal on purpose
        try:
            ctx.checkpoints.save(ctx.job.id, "late", 1)
        except Exception as exc:
            late.append(exc)
        return "late result"

    worker = store.jobs.create_worker({"k": stubborn}, on_outcome=outcomes, poll_seconds=3600)
    job = store.jobs.enqueue("k")
    worker.start()
    assert started.wait(WAIT)
    began = time.monotonic()
    outcome = worker.stop(grace_seconds=0.2)
    elapsed = time.monotonic() - began
    assert outcome == StopOutcome(drained=False, in_flight=1)
    assert 0.2 <= elapsed < 2.0

    statements: list[str] = []
    store.connection.set_trace_callback(statements.append)
    try:
        release.set()
        event = outcomes.wait_for(1)[0]
        join_threads(worker)
    finally:
        store.connection.set_trace_callback(None)
    assert statements == []  # nothing the first attempt did afterwards reached the database
    assert (event.outcome, event.phase, event.code) == ("lost", "completion", "JD2091")
    assert len(late) == 1
    assert isinstance(late[0], WorkerStopped)
    assert isinstance(late[0], StoreClosed)
    assert job_state(store, job.id) == "leased"

    clock.advance(31)  # past the abandoned lease
    rescued = Outcomes()
    second = store.jobs.create_worker({"k": lambda p, ctx: "second"}, on_outcome=rescued)
    assert second.run_once() is True
    stored = store.jobs.get(job.id)
    assert stored is not None
    assert (stored.state, stored.result, stored.attempts) == ("done", "second", 2)
    assert rescued.events[0].generation == 2
    second.stop()


@pytest.mark.both_apis  # sqlite3's trace callback counts the statements
def test_stop_races_leave_nothing_touching_the_database(store: Store) -> None:
    """Stop while claims, renewals and settlements are in flight, many times over."""
    renewed_total = 0
    lost_total = 0
    for round_ in range(24):
        outcomes = Outcomes()
        renewed = threading.Event()
        release = threading.Event()
        stubborn_started = threading.Event()
        grace = (0.0, 0.005, 0.03)[round_ % 3]

        def quick(payload: Any, ctx: JobContext) -> Any:
            return payload

        def slow(payload: Any, ctx: JobContext, renewed: threading.Event = renewed) -> Any:
            renewed.wait(0.1)  # long enough for renewals to be under way
            ctx.signal.wait(0.02)
            ctx.checkpoints.save(ctx.job.id, "n", payload)
            return payload

        def stubborn(
            payload: Any,
            ctx: JobContext,
            release: threading.Event = release,
            started: threading.Event = stubborn_started,
        ) -> Any:
            started.set()
            release.wait(WAIT)  # ignores its signal: always outlives the grace period
            ctx.checkpoints.save(ctx.job.id, "n", payload)  # barred: WorkerStopped
            return payload

        kinds = {f"quick{round_}": quick, f"slow{round_}": slow, f"stubborn{round_}": stubborn}
        worker = store.jobs.create_worker(
            kinds,
            concurrency=4,
            poll_seconds=0.005,
            lease_seconds=0.03,  # a renewal every 10 ms (the fake clock never expires it)
            on_outcome=outcomes,
            on_renewal=lambda lease, renewed=renewed: renewed.set(),
        )
        store.jobs.enqueue(f"stubborn{round_}", -1, priority=1)  # claimed first
        for i in range(12):
            store.jobs.enqueue(f"quick{round_}", i)
            store.jobs.enqueue(f"slow{round_}", i)
        worker.start()
        assert stubborn_started.wait(WAIT)
        outcomes.wait_for(3)
        assert renewed.wait(WAIT)
        result = worker.stop(grace_seconds=grace)

        statements: list[str] = []
        store.connection.set_trace_callback(statements.append)
        try:
            release.set()
            join_threads(worker)  # every handler has now returned and been recorded
        finally:
            store.connection.set_trace_callback(None)
        assert statements == [], f"round {round_}: the stopped worker ran {statements}"
        assert worker_threads(worker) == []

        stats = worker.stats()
        # exactly one outcome per attempt, even for the barred ones
        assert len(outcomes.events) == stats.claims
        assert len({(e.job_id, e.generation) for e in outcomes.events}) == stats.claims
        assert stats.in_flight == 0
        assert result.drained is False
        assert result.in_flight >= 1  # the stubborn handler, at least
        assert sum(e.code == "JD2091" for e in outcomes.events) >= 1  # ...barred
        renewed_total += stats.renewals
        lost_total += stats.lost_settlements
    assert renewed_total > 0
    assert lost_total >= 24  # every round's stubborn handler was barred
