"""SPEC §13: ``cancel(id, force=True)`` stops a running job without its lease.

The holder's signal aborts (at once in its own process, by its next renewal
from another store), the job ends ``cancelled`` unless the attempt completes
first, and a holder that died leaves a job that is cancelled when its lease
expires, never re-claimed. Ordered with events, never by sleeping.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from jaren_jobs import (
    AsyncJobContext,
    AsyncStore,
    CancelRequested,
    ClaimedJob,
    JobContext,
    JobSettled,
    LeaseExpired,
    OperationCancelled,
    Outcome,
    Snooze,
    Store,
    testing,
)
from tests.conftest import FakeClock
from tests.harness import Harness

WAIT = 10.0


class Outcomes:
    """An ``on_outcome`` observer that tests can wait on."""

    def __init__(self) -> None:
        self.events: list[Outcome] = []
        self._cond = threading.Condition()

    def __call__(self, event: Outcome) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def wait_for(self, count: int) -> list[Outcome]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.events) >= count, WAIT), self.events
            return list(self.events)


def claim_one(store: Store, lease_seconds: float = 30) -> ClaimedJob:
    claimed = store.jobs.claim(["k"], owner="w1", lease_seconds=lease_seconds)
    assert claimed is not None
    return claimed


def at(clock: FakeClock, seconds: float) -> datetime:
    """The fake clock's now plus ``seconds``, as an aware datetime."""
    return datetime.fromtimestamp(clock.now() + seconds, tz=timezone.utc)


def state_of(store: Store, job_id: str) -> str:
    job = store.jobs.get(job_id)
    assert job is not None
    return str(job.state)


def test_a_job_no_live_attempt_holds_is_cancelled_at_once(store: Store, clock: FakeClock) -> None:
    store.jobs.enqueue("k", id="queued")
    assert store.jobs.cancel("queued", force=True) is True
    assert state_of(store, "queued") == "cancelled"
    assert store.jobs.cancel("queued", force=True) is False  # already cancelled
    # a lease that ran out: no live holder can settle it, so it is cancelled now
    store.jobs.enqueue("k", id="expired")
    stale = claim_one(store, lease_seconds=5)
    clock.advance(6)
    assert store.jobs.cancel("expired", force=True) is True
    job = store.jobs.get("expired")
    assert job is not None
    assert (job.state, job.cancel_requested) == ("cancelled", False)
    with pytest.raises(JobSettled):  # that attempt settled nothing: never idempotent
        store.jobs.complete(stale.lease, "late")
    # settled or unknown: refused by name, as without force
    store.jobs.enqueue("k", id="done")
    store.jobs.complete(claim_one(store).lease, 1)
    with pytest.raises(JobSettled):
        store.jobs.cancel("done", force=True)
    with pytest.raises(JobSettled):
        store.jobs.cancel("nobody", force=True)
    with pytest.raises(TypeError, match="force"):
        store.jobs.cancel("done", force=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not both"):
        store.jobs.cancel("done", lease=stale.lease, force=True)


def test_a_running_handler_sees_its_signal_abort_and_the_job_ends_cancelled(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    outcomes = Outcomes()
    started = threading.Event()
    reasons: list[Any] = []
    runs: list[int] = []

    def waits(payload: Any, ctx: JobContext) -> Any:
        runs.append(ctx.job.attempts)
        started.set()
        assert ctx.signal.wait(WAIT)
        reasons.append(ctx.signal.reason)
        raise RuntimeError("stopped as asked")

    worker = store.jobs.create_worker({"k": waits}, on_outcome=outcomes, poll_seconds=0.05)
    job = store.jobs.enqueue("k", max_attempts=5)
    with caplog.at_level(logging.INFO, logger="jaren_jobs.worker"):
        worker.start()
        assert started.wait(WAIT)
        assert store.jobs.cancel(job.id, force=True) is True
        [event] = outcomes.wait_for(1)
        assert worker.stop().drained is True
    assert (event.outcome, event.job_id, event.attempt) == ("cancelled", job.id, 1)
    assert isinstance(reasons[0], CancelRequested)
    assert isinstance(reasons[0], OperationCancelled)
    stored = store.jobs.get(job.id)
    assert stored is not None
    assert (stored.state, stored.attempts) == ("cancelled", 1)  # never retried
    assert runs == [1]
    aborted = [r for r in caplog.records if "force=True" in r.getMessage()]
    assert aborted
    assert aborted[0].levelno == logging.INFO
    assert worker.stats().cancellations == 1


def test_a_handler_that_completes_anyway_stands_done(store: Store) -> None:
    outcomes = Outcomes()
    started = threading.Event()
    go_on = threading.Event()

    def stubborn(payload: Any, ctx: JobContext) -> Any:
        started.set()
        assert go_on.wait(WAIT)
        return {"finished": ctx.signal.aborted}

    worker = store.jobs.create_worker({"k": stubborn}, on_outcome=outcomes, poll_seconds=0.05)
    job = store.jobs.enqueue("k")
    worker.start()
    assert started.wait(WAIT)
    assert store.jobs.cancel(job.id, force=True) is True
    assert store.jobs.cancel(job.id, force=True) is False  # marked already: asked nothing new
    marked = store.jobs.get(job.id)
    assert marked is not None
    assert (marked.state, marked.cancel_requested) == ("leased", True)
    assert marked.to_dict()["cancel_requested"] is True
    go_on.set()
    [event] = outcomes.wait_for(1)
    assert worker.stop().drained is True
    assert event.outcome == "completed"
    stored = store.jobs.get(job.id)
    assert stored is not None
    assert (stored.state, stored.result) == ("done", {"finished": True})
    with pytest.raises(JobSettled):
        store.jobs.cancel(job.id, force=True)


def test_a_completion_first_stands_and_a_later_force_cancel_is_refused(store: Store) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = claim_one(store)
    assert store.jobs.complete(claimed.lease, "ok") is True
    with pytest.raises(JobSettled):
        store.jobs.cancel("j", force=True)
    assert state_of(store, "j") == "done"


def test_a_failure_or_snooze_of_a_marked_job_cancels_it(store: Store) -> None:
    store.jobs.enqueue("k", id="failing", max_attempts=5)
    claimed = claim_one(store)
    assert store.jobs.cancel("failing", force=True) is True
    assert store.jobs.fail(claimed.lease, "boom") is True
    job = store.jobs.get("failing")
    assert job is not None
    assert (job.state, job.attempts) == ("cancelled", 1)  # not a retry, not dead
    store.jobs.enqueue("k", id="snoozing")
    claimed = claim_one(store)
    assert store.jobs.cancel("snoozing", force=True) is True
    assert store.jobs.snooze(claimed.lease, 0) is True
    assert state_of(store, "snoozing") == "cancelled"
    assert store.jobs.claim(["k"], owner="w2") is None


@pytest.mark.requires("sync-api")  # the worker's hand-back runs inside a write of its own
def test_a_hand_back_of_a_marked_job_cancels_it(store: Store) -> None:
    # a worker that stops hands back the jobs it held but never started: a
    # marked one must never run again
    store.jobs.enqueue("k", id="held")
    claimed = claim_one(store)
    assert store.jobs.cancel("held", force=True) is True
    now = testing.now_ms(store.jobs)
    released = testing.write(
        store.jobs, lambda: testing.release_within(store.jobs, [claimed.lease], now, "t"), "t"
    )
    assert released == 1
    job = store.jobs.get("held")
    assert job is not None
    assert (job.state, job.attempts) == ("cancelled", 0)
    assert store.jobs.claim(["k"], owner="w2") is None


def test_a_dead_holder_leaves_a_job_cancelled_at_lease_expiry(
    store: Store, clock: FakeClock
) -> None:
    store.jobs.enqueue("k", id="j")
    store.jobs.enqueue("k", id="other", run_at=at(clock, 3600))
    claimed = claim_one(store, lease_seconds=10)  # its holder never speaks again
    assert store.jobs.cancel("j", force=True) is True
    before = store.jobs.counts()
    assert (before.leased, before.cancelled) == (1, 0)
    clock.advance(11)
    job = store.jobs.get("j")
    assert job is not None
    assert (job.state, job.cancel_requested) == ("cancelled", True)
    counts = store.jobs.counts()
    assert (counts.leased, counts.cancelled, counts.pending) == (0, 1, 1)
    queue = store.jobs.counts(queue="default")
    assert (queue.leased, queue.cancelled) == (0, 1)
    assert [j.id for j in store.jobs.page(state="cancelled")] == ["j"]
    assert list(store.jobs.page(state="leased")) == []
    assert [j.state for j in store.jobs.page()] == ["cancelled", "pending"]
    assert store.jobs.claim(["k"], owner="w2") is None  # never rescued
    assert store.jobs.wait("j", timeout_seconds=WAIT).state == "cancelled"
    with pytest.raises(LeaseExpired):
        store.jobs.complete(claimed.lease, "too late")
    # a write that meets it makes the row what it effectively is
    assert store.jobs.cancel("j") is False
    assert store.jobs.cancel("j", force=True) is False
    assert state_of(store, "j") == "cancelled"
    assert store.jobs.claim(["k"], owner="w2") is None


def test_a_sweep_ages_an_expired_marked_job_from_its_lease_expiry(
    store: Store, clock: FakeClock
) -> None:
    store.jobs.enqueue("k", id="j")
    claim_one(store, lease_seconds=10)
    assert store.jobs.cancel("j", force=True) is True
    expiry = at(clock, 10)
    clock.advance(60)
    assert store.jobs.sweep(settled_before=expiry) == 0  # expired exactly then: not before
    assert store.jobs.sweep(settled_before=expiry + timedelta(milliseconds=1)) == 1
    assert store.jobs.get("j") is None


def test_requeue_of_an_expired_marked_job_runs_it_again_unmarked(
    store: Store, clock: FakeClock
) -> None:
    store.jobs.enqueue("k", id="j")
    claim_one(store, lease_seconds=10)
    assert store.jobs.cancel("j", force=True) is True
    clock.advance(11)
    assert store.jobs.requeue("j") is True  # a cancelled job may be requeued
    again = claim_one(store)
    assert (again.id, again.attempts, again.cancel_requested) == ("j", 2, False)
    assert store.jobs.complete(again.lease, "ran") is True
    assert state_of(store, "j") == "done"


def test_a_worker_of_another_store_learns_of_the_mark_at_its_renewal(
    backend: Harness, runtime: Any
) -> None:
    # another store has no in-process path to the attempt: the renewal (or
    # PostgreSQL's NOTIFY, which makes the renewal come sooner) carries it
    outcomes = Outcomes()
    started = threading.Event()
    reasons: list[Any] = []
    with backend.open(runtime=runtime) as store, backend.open(runtime=runtime) as elsewhere:

        def waits(payload: Any, ctx: JobContext) -> Any:
            started.set()
            assert ctx.signal.wait(WAIT)
            reasons.append(ctx.signal.reason)
            raise RuntimeError("stopped as asked")

        worker = store.jobs.create_worker(
            {"k": waits}, on_outcome=outcomes, poll_seconds=0.05, lease_seconds=0.6
        )
        job = store.jobs.enqueue("k")
        worker.start()
        assert started.wait(WAIT)
        assert elsewhere.jobs.cancel(job.id, force=True) is True
        [event] = outcomes.wait_for(1)
        assert worker.stop().drained is True
    assert event.outcome == "cancelled"
    assert isinstance(reasons[0], CancelRequested)


@pytest.mark.parametrize("ending", ["raises", "snoozes"])
def test_a_handler_ending_before_its_worker_hears_of_the_mark_is_cancelled(
    backend: Harness, runtime: Any, ending: str
) -> None:
    # marked from another store, and the handler fails (or snoozes) before the renewal
    # (30 s away) could tell its worker: the store writes ``cancelled`` and the outcome
    # says so, from the row the write answered (not "failed, will be retried")
    outcomes = Outcomes()
    started, go = threading.Event(), threading.Event()
    with backend.open(runtime=runtime) as store, backend.open(runtime=runtime) as elsewhere:

        def ends(payload: Any, ctx: JobContext) -> Any:
            started.set()
            assert go.wait(WAIT)
            if ending == "snoozes":
                raise Snooze(60)
            raise RuntimeError("gave up on its own")

        worker = store.jobs.create_worker(
            {"k": ends}, on_outcome=outcomes, poll_seconds=0.05, lease_seconds=30
        )
        job = store.jobs.enqueue("k")
        worker.start()
        assert started.wait(WAIT)
        assert elsewhere.jobs.cancel(job.id, force=True) is True
        go.set()
        [event] = outcomes.wait_for(1)
        assert worker.stop().drained is True
        assert state_of(store, job.id) == "cancelled"
        errors = store.jobs.errors(job.id)
    assert (event.outcome, event.attempt) == ("cancelled", 1)
    assert worker.stats().cancellations == 1
    assert worker.stats().failures == 0
    if ending == "raises":  # the failure is in the job's error history all the same
        assert [(e.attempt, "gave up on its own" in e.error) for e in errors] == [(1, True)]


def test_an_async_handlers_task_is_cancelled_by_a_forced_cancel(
    astore: AsyncStore, store: Store
) -> None:
    outcomes: list[Outcome] = []
    cancelled_inside: list[bool] = []

    async def main() -> None:
        started = asyncio.Event()
        ended = asyncio.Event()
        loop = asyncio.get_running_loop()

        async def forever(payload: Any, ctx: AsyncJobContext) -> Any:
            started.set()
            try:
                await asyncio.Event().wait()  # only a cancellation ends it
            except asyncio.CancelledError:
                cancelled_inside.append(True)
                raise

        def finished(outcome: Outcome) -> None:
            outcomes.append(outcome)
            loop.call_soon_threadsafe(ended.set)

        await astore.jobs.enqueue("slow", id="victim")
        worker = astore.jobs.create_worker(
            {"slow": forever}, poll_seconds=0.05, on_outcome=finished
        )
        async with worker:
            await asyncio.wait_for(started.wait(), WAIT)
            assert await astore.jobs.cancel("victim", force=True) is True
            await asyncio.wait_for(ended.wait(), WAIT)

    asyncio.run(asyncio.wait_for(main(), WAIT * 3))
    assert cancelled_inside == [True]
    assert [o.outcome for o in outcomes] == ["cancelled"]
    assert state_of(store, "victim") == "cancelled"


def test_a_marked_lease_that_ran_out_is_paged_as_cancelled_in_both_orders(
    store: Store, clock: FakeClock
) -> None:
    # a stored cancelled job, a live lease, and a lease marked by a forced cancel
    # that then ran out (it reads as cancelled, as of when its lease expired)
    for n in range(3):
        store.jobs.enqueue("a", {"n": n}, id=f"j{n:02d}")
    clock.advance(1)
    store.jobs.cancel("j01")
    clock.advance(1)
    live = store.jobs.claim(["a"], owner="w", lease_seconds=600)
    marked = store.jobs.claim(["a"], owner="w", lease_seconds=5)
    assert (live and live.id, marked and marked.id) == ("j00", "j02")
    assert store.jobs.cancel("j02", force=True) is True
    clock.advance(10)
    for order in ("id", "newest"):
        cancelled = list(store.jobs.page(state="cancelled", order=order))
        assert sorted(job.id for job in cancelled) == ["j01", "j02"]
        assert {str(job.state) for job in cancelled} == {"cancelled"}
        assert _ids(store.jobs.page(state="leased", order=order)) == ["j00"]
    # newest first: the marked job changed last (its mark), then j01
    assert _ids(store.jobs.page(state="cancelled", order="newest")) == ["j02", "j01"]
    assert _ids(store.jobs.page(order="newest", limit=2)) == ["j02", "j00"]


def _ids(jobs: Any) -> list[str]:
    return [job.id for job in jobs]
