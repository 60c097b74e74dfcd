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

    assert store.jobs.due_counts().to_dict() == {
        "pending_ready": 1,
        "pending_scheduled": 2,
        "failed_ready": 0,
        "failed_scheduled": 1,
        "leased_expired": 0,
    }
    assert store.jobs.due_counts(queue="q2") == DueCounts(pending_scheduled=1)
    # the same jobs, read later on the store's clock: each falls due in turn
    clock.advance(21)  # the retry's backoff (at most 10 s) and the 20 s lease have passed
    assert store.jobs.due_counts() == DueCounts(
        pending_ready=1, pending_scheduled=2, failed_ready=1, leased_expired=1
    )
    clock.advance(60)
    assert store.jobs.due_counts() == DueCounts(pending_ready=3, failed_ready=1, leased_expired=1)
    # counts() is unchanged: the split is a read of its own
    counts = store.jobs.counts()
    assert (counts.pending, counts.failed, counts.leased) == (3, 1, 1)
    with store.transaction() as tx:
        assert tx.jobs.due_counts(queue="default").pending_ready == 2


def test_due_counts_refuse_a_bad_queue(store: Store) -> None:
    with pytest.raises(ValueError, match="queue"):
        store.jobs.due_counts(queue="")
    with pytest.raises(TypeError):
        store.jobs.due_counts(queue=3)  # type: ignore[arg-type]
