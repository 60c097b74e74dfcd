"""``run_now(id)``: a queued job waiting on its ``run_at`` or a retry's backoff is due now.

A pending or failed job whose ``run_at`` is ahead gets ``run_at`` = now and
nothing else; it is ``False`` for one that is due already; a claimed job is
``LeaseRequired``; a settled or unknown one is ``JobSettled``. Every refusal
writes nothing. In-process workers are woken (checked with a worker whose
poll would otherwise wait for minutes).
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from jaren_jobs import (
    CancelScope,
    ClaimedJob,
    JobSettled,
    LeaseRequired,
    OperationCancelled,
    Store,
)
from tests.conftest import FakeClock
from tests.harness import Harness

WAIT = 10.0
HOUR = 3600.0


def at(clock: FakeClock) -> datetime:
    return datetime.fromtimestamp(clock.now(), tz=timezone.utc)


def claim_one(store: Store, lease_seconds: float = 30) -> ClaimedJob:
    claimed = store.jobs.claim(["k"], owner="w", lease_seconds=lease_seconds)
    assert claimed is not None
    return claimed


def test_a_delayed_job_is_due_at_once_and_nothing_else_changes(
    store: Store, clock: FakeClock
) -> None:
    before = store.jobs.enqueue("k", {"n": 1}, id="later", delay_seconds=HOUR, priority=3)
    clock.advance(5)
    assert store.jobs.claim(["k"], owner="w") is None  # not due yet
    assert store.jobs.run_now("later") is True
    job = store.jobs.get("later")
    assert job is not None
    now = before.created_at + timedelta(seconds=5)
    assert (job.state, job.run_at, job.updated_at) == ("pending", now, now)
    assert (job.attempts, job.priority, job.payload) == (0, 3, {"n": 1})
    # due now: a second call moves nothing, and the next claim takes it
    assert store.jobs.run_now("later") is False
    assert store.jobs.get("later") == job
    assert claim_one(store).id == "later"


def test_a_failed_job_skips_its_backoff_keeping_its_attempts_and_error(
    store: Store, clock: FakeClock
) -> None:
    store.jobs.enqueue("k", id="j", max_attempts=3)
    assert store.jobs.fail(claim_one(store).lease, "boom") is True
    failed = store.jobs.get("j")
    assert failed is not None
    assert failed.state == "failed"
    assert failed.run_at > at(clock)  # waiting on the backoff
    assert store.jobs.claim(["k"], owner="w") is None
    assert store.jobs.run_now("j") is True
    job = store.jobs.get("j")
    assert job is not None
    assert (job.state, job.attempts, job.last_error) == ("failed", 1, "boom")
    assert job.run_at == at(clock)
    again = claim_one(store)
    assert (again.id, again.attempts) == ("j", 2)
    assert [e.error for e in store.jobs.errors("j")] == ["boom"]


def test_a_due_job_is_false_and_untouched(store: Store, backend: Harness) -> None:
    store.jobs.enqueue("k", id="due")
    row = backend.raw_row("due")
    assert store.jobs.run_now("due") is False
    assert backend.raw_row("due") == row


def test_a_claimed_job_is_lease_required_and_untouched(
    store: Store, backend: Harness, clock: FakeClock
) -> None:
    store.jobs.enqueue("k", id="held")
    claim_one(store, lease_seconds=10)
    row = backend.raw_row("held")
    with pytest.raises(LeaseRequired) as info:
        store.jobs.run_now("held")
    assert info.value.code == "JD2068"
    assert "claimed" in str(info.value)
    clock.advance(11)  # the lease ran out: the next claim takes it up, still no run_now
    with pytest.raises(LeaseRequired):
        store.jobs.run_now("held")
    assert backend.raw_row("held") == row


def test_settled_and_unknown_jobs_are_job_settled(store: Store, backend: Harness) -> None:
    store.jobs.enqueue("k", id="done")
    assert store.jobs.complete(claim_one(store).lease) is True
    store.jobs.enqueue("k", id="dead", max_attempts=1)
    assert store.jobs.fail(claim_one(store).lease, "boom") is True
    store.jobs.enqueue("k", id="cancelled", delay_seconds=HOUR)
    assert store.jobs.cancel("cancelled") is True
    for job_id in ("done", "dead", "cancelled"):
        row = backend.raw_row(job_id)
        with pytest.raises(JobSettled) as info:
            store.jobs.run_now(job_id)
        assert info.value.code == "JD2065"
        assert info.value.details["state"] == job_id
        assert backend.raw_row(job_id) == row
    with pytest.raises(JobSettled, match="unknown"):
        store.jobs.run_now("nobody")


@pytest.mark.parametrize(
    ("bad", "error"), [(None, TypeError), (7, TypeError), ("", ValueError), ("a\x00b", ValueError)]
)
def test_a_bad_id_is_refused_before_any_write(
    store: Store, backend: Harness, bad: Any, error: type[Exception]
) -> None:
    store.jobs.enqueue("k", id="later", delay_seconds=HOUR)
    row = backend.raw_row("later")
    with pytest.raises(error, match="run_now"):
        store.jobs.run_now(bad)
    assert backend.raw_row("later") == row


def test_an_aborted_signal_or_a_passed_deadline_refuses(
    store: Store, backend: Harness, clock: FakeClock
) -> None:
    store.jobs.enqueue("k", id="later", delay_seconds=HOUR)
    row = backend.raw_row("later")
    scope = CancelScope()
    scope.abort("shutting down")
    with pytest.raises(OperationCancelled, match="shutting down"):
        store.jobs.run_now("later", signal=scope.signal)
    with pytest.raises(OperationCancelled, match="deadline"):
        store.jobs.run_now("later", deadline=at(clock) - timedelta(seconds=1))
    assert backend.raw_row("later") == row
    assert store.jobs.run_now("later", signal=CancelScope().signal) is True


def test_inside_a_transaction_it_commits_or_rolls_back_with_it(
    store: Store, backend: Harness
) -> None:
    store.jobs.enqueue("k", id="later", delay_seconds=HOUR)
    row = backend.raw_row("later")
    moved = []

    def undone() -> None:
        with store.transaction() as tx:
            moved.append(tx.jobs.run_now("later"))
            raise RuntimeError("undo")

    with pytest.raises(RuntimeError, match="undo"):
        undone()
    assert moved == [True]
    assert backend.raw_row("later") == row
    with store.transaction() as tx:
        assert tx.jobs.run_now("later") is True
    assert store.jobs.claim(["k"], owner="w") is not None


def test_a_worker_waiting_out_its_poll_is_woken(store: Store) -> None:
    ran = threading.Event()

    def handler(payload: Any, ctx: Any) -> None:
        ran.set()

    store.jobs.enqueue("k", id="later", delay_seconds=HOUR)
    # a poll of ten minutes: only the wake can bring the worker to the job in time
    with store.jobs.create_worker({"k": handler}, poll_seconds=600):
        assert not ran.wait(0.2)  # not due: the worker has nothing to do
        assert store.jobs.run_now("later") is True
        assert ran.wait(WAIT)
