"""The idle check: an empty claim repeated does not take the write lock, yet misses nothing.

After a root claim finds nothing, the next claim of the same kinds answers
``None`` from ``PRAGMA data_version`` (another connection committed?), the
connection's own change count (this connection wrote?) and the earliest time
something of those kinds comes due without any write (a delayed job, a retry,
a lease expiring). Each test below moves exactly one of those and checks the
claim sees it.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import Runtime, Store, open_store
from tests.conftest import FakeClock
from tests.processes.enqueuers import enqueue_on_signal


def traced(store: Store, call: Callable[[], Any]) -> tuple[Any, list[str]]:
    statements: list[str] = []
    store.connection.set_trace_callback(statements.append)
    try:
        answer = call()
    finally:
        store.connection.set_trace_callback(None)
    return answer, statements


def test_a_repeated_empty_claim_reads_data_version_and_nothing_else(store: Store) -> None:
    store.jobs.enqueue("other-kind")
    assert store.jobs.claim(["k"], owner="w") is None
    answer, statements = traced(store, lambda: store.jobs.claim(["k"], owner="w"))
    assert answer is None
    assert statements == ["PRAGMA data_version"]  # no BEGIN IMMEDIATE: no write lock
    answer, statements = traced(store, lambda: store.jobs.claim_many(["k"], owner="w", limit=4))
    assert answer == []
    assert statements == ["PRAGMA data_version"]


def test_the_first_claim_of_other_kinds_still_runs(store: Store) -> None:
    assert store.jobs.claim(["k"], owner="w") is None
    job = store.jobs.enqueue("j")  # a write: every kind set re-checks anyway
    answer, statements = traced(store, lambda: store.jobs.claim(["j"], owner="w"))
    assert answer is not None
    assert answer.id == job.id
    assert "BEGIN IMMEDIATE" in statements


def test_another_connections_enqueue_is_seen_by_the_next_claim(
    db_path: Path, runtime: Runtime
) -> None:
    with open_store(db_path, runtime=runtime) as store, open_store(db_path) as other:
        assert store.jobs.claim(["k"], owner="w") is None
        assert store.jobs.claim(["k"], owner="w") is None
        job = other.jobs.enqueue("k")
        claimed = store.jobs.claim(["k"], owner="w")
        assert claimed is not None
        assert claimed.id == job.id


@pytest.mark.slow
def test_another_process_enqueue_is_seen_by_the_next_claim(db_path: Path) -> None:
    with open_store(db_path) as store:
        assert store.jobs.claim(["k"], owner="w") is None
        ctx = multiprocessing.get_context("spawn")
        ready, go, done = ctx.Event(), ctx.Event(), ctx.Event()
        child = ctx.Process(target=enqueue_on_signal, args=(str(db_path), "k", ready, go, done))
        child.start()
        try:
            assert ready.wait(60)
            assert store.jobs.claim(["k"], owner="w") is None  # idle, and remembered so
            go.set()
            assert done.wait(60)
            claimed = store.jobs.claim(["k"], owner="w")
        finally:
            child.join(60)
        assert child.exitcode == 0
        assert claimed is not None
        assert claimed.id == "remote-1"


def test_this_connections_own_writes_are_seen(store: Store) -> None:
    assert store.jobs.claim(["k"], owner="w") is None
    # the same connection's commits do not move data_version; its change count does
    with store.transaction() as tx:
        job = tx.jobs.enqueue("k")
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    assert claimed.id == job.id
    assert store.jobs.claim(["k"], owner="w") is None
    # application SQL on the store's connection counts too
    with store.transaction() as tx:
        tx.execute(
            "UPDATE \"_jaren_jobs\" SET state = 'pending', lease_token = NULL WHERE id = ?",
            (job.id,),
        )
    again = store.jobs.claim(["k"], owner="w")
    assert again is not None
    assert again.id == job.id


def test_a_delayed_job_is_claimed_once_due_with_no_write_in_between(
    store: Store, clock: FakeClock
) -> None:
    job = store.jobs.enqueue("k", delay_seconds=10)
    assert store.jobs.claim(["k"], owner="w") is None
    clock.advance(9.999)
    answer, statements = traced(store, lambda: store.jobs.claim(["k"], owner="w"))
    assert answer is None
    assert statements == ["PRAGMA data_version"]
    clock.advance(0.001)
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    assert claimed.id == job.id


def test_a_retry_comes_due_with_no_write_in_between(store: Store, clock: FakeClock) -> None:
    store.jobs.enqueue("k")
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    assert store.jobs.fail(claimed.lease, RuntimeError("boom")) is True
    assert store.jobs.claim(["k"], owner="w") is None
    assert store.jobs.claim(["k"], owner="w") is None
    clock.advance(1.0)  # backoff for retry 1 with draw 0.5: 0.75 s
    retried = store.jobs.claim(["k"], owner="w")
    assert retried is not None
    assert retried.attempts == 2


def test_an_expired_lease_is_rescued_with_no_write_in_between(
    store: Store, clock: FakeClock
) -> None:
    job = store.jobs.enqueue("k")
    assert store.jobs.claim(["k"], owner="crashed", lease_seconds=5) is not None
    assert store.jobs.claim(["k"], owner="rescuer") is None
    clock.advance(4.999)
    assert store.jobs.claim(["k"], owner="rescuer") is None
    clock.advance(0.001)
    rescued = store.jobs.claim(["k"], owner="rescuer")
    assert rescued is not None
    assert rescued.id == job.id
    assert rescued.lease.generation == 2


def test_a_transaction_scope_claim_always_reads_the_table(store: Store) -> None:
    assert store.jobs.claim(["k"], owner="w") is None
    with store.transaction() as tx:
        # inside the application's transaction nothing is skipped: the claim
        # must see this transaction's own uncommitted enqueue
        job = tx.jobs.enqueue("k")
        claimed = tx.jobs.claim(["k"], owner="w")
        assert claimed is not None
        assert claimed.id == job.id
