"""The error history (SPEC §13) on every backend: one entry per failed attempt.

``store.jobs.errors(id)`` lists them oldest first, each with the attempt's
``last_error`` text and the formatted traceback of the exception that failed
it. The entry is written by the failure's own transaction (a refused failure
writes none) and swept with its job. Time is the fake clock's.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import datetime, timezone
from typing import Any

import pytest

from jaren_jobs import (
    AsyncJobContext,
    AsyncStore,
    JobContext,
    JobError,
    LeaseExpired,
    LeaseSuperseded,
    Store,
    UnknownJob,
)
from tests.conftest import FakeClock


def now(store: Store) -> datetime:
    """The store's clock now, as a job's times are (aware UTC, whole milliseconds)."""
    return datetime.fromtimestamp(round(store.runtime.now() * 1000) / 1000, timezone.utc)


def explode_in_the_handler(attempt: int) -> None:
    raise ValueError(f"boom {attempt}")


def test_retries_then_a_dead_letter_leave_one_entry_per_attempt_with_tracebacks(
    store: Store, clock: FakeClock
) -> None:
    def flaky(payload: Any, ctx: JobContext) -> Any:
        explode_in_the_handler(ctx.job.attempts)

    worker = store.jobs.create_worker(
        {"flaky": flaky}, backoff_base_seconds=10, backoff_cap_seconds=10
    )
    job = store.jobs.enqueue("flaky", max_attempts=3)
    times = []
    for _ in range(3):
        times.append(now(store))
        assert worker.run_once() is True
        clock.advance(60)
    worker.stop()

    dead = store.jobs.get(job.id)
    assert dead is not None
    assert (dead.state, dead.attempts) == ("dead", 3)
    assert dead.last_error == "ValueError: boom 3"  # unchanged by the history
    history = store.jobs.errors(job.id)
    assert [(e.attempt, e.at, e.error) for e in history] == [
        (1, times[0], "ValueError: boom 1"),
        (2, times[1], "ValueError: boom 2"),
        (3, times[2], "ValueError: boom 3"),
    ]
    for entry in history:
        assert isinstance(entry, JobError)
        assert entry.at.tzinfo is timezone.utc
        assert entry.traceback is not None
        assert entry.traceback.startswith("Traceback (most recent call last):")
        assert "in flaky" in entry.traceback
        assert "in explode_in_the_handler" in entry.traceback
        assert entry.traceback.rstrip().endswith(entry.error)
    assert history[0].to_dict() == {
        "attempt": 1,
        "at": dead.to_dict()["created_at"],  # the first attempt failed at once
        "error": "ValueError: boom 1",
        "traceback": history[0].traceback,
    }


def test_fail_by_hand_with_text_has_no_traceback_and_with_a_raised_exception_has_one(
    store: Store, clock: FakeClock
) -> None:
    job = store.jobs.enqueue("k", max_attempts=3)
    first = store.jobs.claim(["k"], owner="w")
    assert first is not None
    assert store.jobs.fail(first.lease, "the disk is full") is True
    clock.advance(3600)
    second = store.jobs.claim(["k"], owner="w")
    assert second is not None
    with pytest.raises(ValueError) as raised:
        explode_in_the_handler(2)
    assert store.jobs.fail(second.lease, raised.value, retry=False) is True
    history = store.jobs.errors(job.id)
    assert [(e.attempt, e.error) for e in history] == [
        (1, "the disk is full"),
        (2, "ValueError: boom 2"),
    ]
    assert history[0].traceback is None
    assert history[1].traceback is not None
    assert "in explode_in_the_handler" in history[1].traceback
    # an exception never raised has no traceback either
    clock.advance(3600)
    store.jobs.requeue(job.id)
    third = store.jobs.claim(["k"], owner="w")
    assert third is not None
    assert store.jobs.fail(third.lease, RuntimeError("made, not raised")) is True
    assert store.jobs.errors(job.id)[-1].traceback is None


def test_a_job_that_never_failed_has_an_empty_history(store: Store) -> None:
    job = store.jobs.enqueue("k")
    assert store.jobs.errors(job.id) == []
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    assert store.jobs.complete(claimed.lease, 1) is True
    assert store.jobs.errors(job.id) == []


def test_an_unknown_id_is_unknown_job(store: Store) -> None:
    with pytest.raises(UnknownJob) as caught:
        store.jobs.errors("no-such-job")
    assert caught.value.code == "JD2092"
    assert caught.value.details["job_id"] == "no-such-job"
    with pytest.raises(TypeError):
        store.jobs.errors(7)  # type: ignore[arg-type]


def test_a_refused_failure_writes_no_history(store: Store, clock: FakeClock) -> None:
    job = store.jobs.enqueue("k", max_attempts=5)
    stale = store.jobs.claim(["k"], owner="w", lease_seconds=10)
    assert stale is not None
    clock.advance(11)
    with pytest.raises(LeaseExpired):
        store.jobs.fail(stale.lease, "too late")
    fresh = store.jobs.claim(["k"], owner="w", lease_seconds=10)
    assert fresh is not None
    with pytest.raises(LeaseSuperseded):
        store.jobs.fail(stale.lease, "superseded")
    assert store.jobs.errors(job.id) == []
    assert store.jobs.fail(fresh.lease, "the real one") is True
    assert store.jobs.fail(fresh.lease, "a repeat") is True  # idempotent: no second entry
    assert [(e.attempt, e.error) for e in store.jobs.errors(job.id)] == [(2, "the real one")]


def test_the_sweep_deletes_the_history_with_its_job(store: Store, clock: FakeClock) -> None:
    gone = store.jobs.enqueue("k", id="gone", max_attempts=1)
    kept = store.jobs.enqueue("k", id="kept", max_attempts=2)
    for _ in range(2):
        claimed = store.jobs.claim(["k"], owner="w")
        assert claimed is not None
        assert store.jobs.fail(claimed.lease, f"failed {claimed.id}") is True
    assert len(store.jobs.errors(gone.id)) == 1
    clock.advance(60)
    assert store.jobs.sweep(settled_before=now(store)) == 1  # only the dead one
    with pytest.raises(UnknownJob):
        store.jobs.errors(gone.id)
    assert [e.error for e in store.jobs.errors(kept.id)] == ["failed kept"]
    # an id enqueued again after the sweep starts with a clean history
    store.jobs.enqueue("k", id="gone")
    assert store.jobs.errors("gone") == []


def test_the_history_is_read_inside_a_transaction(store: Store) -> None:
    job = store.jobs.enqueue("k")
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    with store.transaction() as tx:
        assert tx.jobs.fail(claimed.lease, "in a transaction") is True
        assert [e.error for e in tx.jobs.errors(job.id)] == ["in a transaction"]
    assert [e.error for e in store.jobs.errors(job.id)] == ["in a transaction"]


async def refuse_in_a_coroutine(attempt: int) -> None:
    await asyncio.sleep(0)
    raise KeyError(f"missing {attempt}")


def test_an_async_handler_failure_records_its_traceback_and_async_errors_reads_it(
    astore: AsyncStore, store: Store
) -> None:
    async def failing(payload: Any, ctx: AsyncJobContext) -> Any:
        await refuse_in_a_coroutine(ctx.job.attempts)

    async def main() -> list[JobError]:
        job = await astore.jobs.enqueue("a", max_attempts=1)
        worker = astore.jobs.create_worker({"a": failing})
        assert await worker.run_once() is True
        await worker.stop()
        return await astore.jobs.errors(job.id)

    [entry] = asyncio.run(asyncio.wait_for(main(), 30))
    assert (entry.attempt, entry.error) == (1, "KeyError: 'missing 1'")
    assert entry.traceback is not None
    assert "in failing" in entry.traceback
    assert "in refuse_in_a_coroutine" in entry.traceback
    with pytest.raises(UnknownJob):
        asyncio.run(astore.jobs.errors("no-such-job"))


def test_a_lease_naming_another_attempt_records_the_rows_attempt(store: Store) -> None:
    """A lease made by hand with a wrong attempt number: the row's own count decides."""
    job = store.jobs.enqueue("k", max_attempts=3)
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    odd = dataclasses.replace(claimed.lease, attempt=2)
    assert store.jobs.fail(odd, "by hand") is True
    assert [(e.attempt, e.error) for e in store.jobs.errors(job.id)] == [(1, "by hand")]
    failed = store.jobs.get(job.id)
    assert failed is not None
    assert (failed.state, failed.last_error) == ("failed", "by hand")


def test_every_failure_is_kept_when_attempt_numbers_repeat_under_a_frozen_clock(
    store: Store,
) -> None:
    # issue 26 item 14: keyed by (job, attempt, instant), three failures of attempt 1
    # after requeue(reset_attempts=True) at one instant were one entry, and the two
    # backends kept different ones (the first on PostgreSQL, the last on SQLite)
    job = store.jobs.enqueue("k", max_attempts=1)
    for n in range(3):
        claimed = store.jobs.claim(["k"], owner="w")
        assert claimed is not None
        assert claimed.lease.attempt == 1
        assert store.jobs.fail(claimed.lease, f"failure {n}", retry=False)
        assert store.jobs.requeue(job.id, reset_attempts=True)
    entries = store.jobs.errors(job.id)
    assert [(e.attempt, e.error) for e in entries] == [
        (1, "failure 0"),
        (1, "failure 1"),
        (1, "failure 2"),
    ]
    assert len({e.at for e in entries}) == 1  # one instant: the clock never moved


def test_two_failures_sharing_an_instant_are_both_kept(store: Store) -> None:
    job = store.jobs.enqueue("k", max_attempts=5)
    for n in range(2):
        claimed = store.jobs.claim(["k"], owner="w")
        assert claimed is not None
        # fail then requeue at once: the retry is due at once too
        assert store.jobs.fail(claimed.lease, RuntimeError(f"boom {n}"), retry=False)
        assert store.jobs.requeue(job.id)
    assert [e.error for e in store.jobs.errors(job.id)] == [
        "RuntimeError: boom 0",
        "RuntimeError: boom 1",
    ]
