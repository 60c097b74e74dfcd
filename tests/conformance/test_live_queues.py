"""store.jobs.queues(): the queues that hold live jobs, sorted and bounded (the
dashboard's per-queue table, SPEC §15)."""

from __future__ import annotations

import pytest

from jaren_jobs import NewJob, Store
from tests.conftest import FakeClock


def test_queues_are_those_of_queued_and_leased_jobs_sorted(store: Store, clock: FakeClock) -> None:
    assert store.jobs.queues() == []
    store.jobs.enqueue("k", id="ready", queue="mail")
    store.jobs.enqueue("k", id="later", queue="reports", delay_seconds=3600)
    store.jobs.enqueue("held", id="held", queue="billing")
    store.jobs.enqueue("done", id="done", queue="archive")
    store.jobs.enqueue("retry", id="retry", queue="zeta", max_attempts=3)
    held = store.jobs.claim(["held"], owner="w", queues=["billing"])
    assert held is not None
    done = store.jobs.claim(["done"], owner="w", queues=["archive"])
    assert done is not None
    store.jobs.complete(done.lease)
    retry = store.jobs.claim(["retry"], owner="w", queues=["zeta"])
    assert retry is not None
    store.jobs.fail(retry.lease, "x", backoff_base_seconds=60)
    # pending (due or not), failed and leased count; a queue of settled jobs only does not
    assert store.jobs.queues() == ["billing", "mail", "reports", "zeta"]
    assert store.jobs.queues(limit=2) == ["billing", "mail"]
    # a leased job's queue stays until its job settles
    store.jobs.complete(held.lease)
    assert store.jobs.queues() == ["mail", "reports", "zeta"]
    with pytest.raises(LookupError), store.transaction() as tx:  # noqa: PT012 - rolled back
        tx.jobs.enqueue("k", id="in-tx", queue="alpha")
        assert tx.jobs.queues() == ["alpha", "mail", "reports", "zeta"]  # its own writes
        raise LookupError("roll it back")
    assert store.jobs.queues() == ["mail", "reports", "zeta"]


def test_queues_past_many_jobs_name_each_queue_once(store: Store) -> None:
    names = [f"q{n:02d}" for n in range(30)]
    store.jobs.enqueue_many(NewJob("k", n, queue=names[n % 30]) for n in range(300))
    assert store.jobs.queues() == names
    assert store.jobs.queues(limit=7) == names[:7]
    assert store.jobs.queues(limit=30) == names


def test_queues_refuse_a_bad_limit(store: Store) -> None:
    for bad in (0, -1):
        with pytest.raises(ValueError, match="limit"):
            store.jobs.queues(limit=bad)
    for wrong in ("3", 2.5, None, True):
        with pytest.raises(TypeError, match="limit"):
            store.jobs.queues(limit=wrong)  # type: ignore[arg-type]
