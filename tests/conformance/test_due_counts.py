"""store.jobs.due_counts(): queued jobs ready now or scheduled later, leases run out (SPEC §14)."""

from __future__ import annotations

import pytest

from jaren_jobs import DueCounts, Store
from tests.conftest import FakeClock


def test_due_counts_split_the_queued_jobs_at_the_runtime_clocks_now(
    store: Store, clock: FakeClock
) -> None:
    assert store.jobs.due_counts() == DueCounts()
    store.jobs.enqueue("a", id="ready")
    store.jobs.enqueue("a", id="later", delay_seconds=60)
    store.jobs.enqueue("a", id="other-queue", queue="q2", delay_seconds=30)
    store.jobs.enqueue("b", id="retry", max_attempts=3)
    store.jobs.enqueue("c", id="held")
    retry = store.jobs.claim(["b"], owner="w")
    assert retry is not None
    store.jobs.fail(retry.lease, "x", backoff_base_seconds=10)  # failed, due in ~10 s
    held = store.jobs.claim(["c"], owner="w", lease_seconds=20)
    assert held is not None
    store.jobs.enqueue("done", id="settled")
    settled = store.jobs.claim(["done"], owner="w")
    assert settled is not None
    store.jobs.complete(settled.lease)

    ready = store.jobs.get("ready")
    assert ready is not None
    oldest = ready.run_at  # the only ready job: the longest waiting
    assert store.jobs.due_counts().to_dict() == {
        "pending_ready": 1,
        "pending_scheduled": 2,
        "failed_ready": 0,
        "failed_scheduled": 1,
        "leased_expired": 0,
        "oldest_ready_at": oldest.isoformat(timespec="milliseconds"),
    }
    assert store.jobs.due_counts(queue="q2") == DueCounts(pending_scheduled=1)
    # the same jobs, read later on the store's clock: each falls due in turn
    clock.advance(21)  # the retry's backoff (at most 10 s) and the 20 s lease have passed
    assert store.jobs.due_counts() == DueCounts(
        pending_ready=1,
        pending_scheduled=2,
        failed_ready=1,
        leased_expired=1,
        oldest_ready_at=oldest,
    )
    clock.advance(60)
    assert store.jobs.due_counts() == DueCounts(
        pending_ready=3, failed_ready=1, leased_expired=1, oldest_ready_at=oldest
    )
    # a queue whose only ready job is in it since the delay of 30 s ran out
    other = store.jobs.get("other-queue")
    assert other is not None
    assert store.jobs.due_counts(queue="q2") == DueCounts(
        pending_ready=1, oldest_ready_at=other.run_at
    )
    # counts() is unchanged: the split is a read of its own
    counts = store.jobs.counts()
    assert (counts.pending, counts.failed, counts.leased) == (3, 1, 1)
    with store.transaction() as tx:
        assert tx.jobs.due_counts(queue="default").pending_ready == 2


def test_the_oldest_ready_job_is_the_earliest_ready_run_at_of_pending_and_failed_jobs(
    store: Store, clock: FakeClock
) -> None:
    store.jobs.enqueue("b", id="retry", max_attempts=3)
    retry = store.jobs.claim(["b"], owner="w")
    assert retry is not None
    store.jobs.fail(retry.lease, "x", backoff_base_seconds=5)
    failed = store.jobs.get("retry")
    assert failed is not None
    store.jobs.enqueue("a", id="later", delay_seconds=3600)
    assert store.jobs.due_counts().oldest_ready_at is None  # nothing is ready yet
    clock.advance(11)  # the retry's backoff (at most 5 s) has passed
    store.jobs.enqueue("a", id="fresh")
    # the failed job has waited longer than the fresh pending one
    assert store.jobs.due_counts().oldest_ready_at == failed.run_at
    assert failed.run_at.timestamp() < clock.now()
    # once the longest-waiting job is claimed, the next one is the oldest
    again = store.jobs.claim(["b"], owner="w")
    assert again is not None
    fresh = store.jobs.get("fresh")
    assert fresh is not None
    assert store.jobs.due_counts().oldest_ready_at == fresh.run_at


def test_due_counts_refuse_a_bad_queue(store: Store) -> None:
    with pytest.raises(ValueError, match="queue"):
        store.jobs.due_counts(queue="")
    with pytest.raises(TypeError):
        store.jobs.due_counts(queue=3)  # type: ignore[arg-type]
