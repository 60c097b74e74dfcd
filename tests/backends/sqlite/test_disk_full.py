"""A full disk, simulated with ``PRAGMA max_page_count``: refusals, never damage.

While the database may not grow, every write that needs room is a
``StorageError`` (with the ``sqlite3`` error as ``__cause__``), nothing is
half-written, earlier jobs are intact and a failing completion leaves the
job leased under the very same lease. Once space returns, the SAME store
carries on: no reopening.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import (
    NewJob,
    Outcome,
    Runtime,
    StorageError,
    Store,
    TransactionAborted,
    open_store,
)
from tests.conftest import FakeClock

BIG = "x" * 60_000  # overflow pages: an insert this size always needs new room
ROOMY = 1_073_741_823  # SQLite's default max_page_count


def pages(store: Store) -> int:
    return int(store.connection.execute("PRAGMA page_count").fetchone()[0])


def set_limit(store: Store, limit: int) -> int:
    # a test reaching under the library: what a full disk looks like to SQLite
    return int(store.connection.execute(f"PRAGMA max_page_count = {int(limit)}").fetchone()[0])


def fill_disk(store: Store) -> None:
    """No page beyond the ones the database already has."""
    assert set_limit(store, pages(store)) == pages(store)


def snapshot(store: Store) -> list[dict[str, Any]]:
    return [job.to_dict() for job in store.jobs.page(limit=10_000)]


def assert_disk_full(error: pytest.ExceptionInfo[StorageError]) -> None:
    assert isinstance(error.value.__cause__, sqlite3.Error)
    assert error.value.details["sqlite_error"] == "SQLITE_FULL"
    assert "full" in str(error.value)


@pytest.fixture
def store(db_path: Path, runtime: Runtime) -> Iterator[Store]:
    s = open_store(db_path, runtime=runtime)
    try:
        yield s
    finally:
        set_limit(s, ROOMY)
        s.close()


def test_enqueue_on_a_full_disk_is_a_storage_error_and_writes_nothing(store: Store) -> None:
    earlier = [store.jobs.enqueue("mail", {"n": n}, id=f"early-{n}") for n in range(5)]
    before = snapshot(store)
    fill_disk(store)

    with pytest.raises(StorageError) as refused:
        store.jobs.enqueue("mail", {"body": BIG}, id="too-big")
    assert_disk_full(refused)
    assert store.jobs.get("too-big") is None

    # small jobs fit into the free room of existing pages until they do not;
    # the enqueue that finds no room leaves nothing behind
    accepted = 0
    with pytest.raises(StorageError) as full:  # noqa: PT012 - the loop ends at the refusal
        for n in range(100_000):
            store.jobs.enqueue("mail", {"n": n}, id=f"small-{n:06d}")
            accepted += 1
    assert_disk_full(full)
    assert store.jobs.get(f"small-{accepted:06d}") is None
    assert store.jobs.counts().pending == len(earlier) + accepted

    # the jobs from before the disk filled are untouched
    assert snapshot(store)[: len(before)] == before
    assert [store.jobs.get(job.id) for job in earlier] == earlier


def test_enqueue_many_on_a_full_disk_is_all_or_nothing(store: Store) -> None:
    store.jobs.enqueue("mail", id="early")
    before = snapshot(store)
    # room for a few of the batch's jobs, not for all of them: it fails midway
    set_limit(store, pages(store) + 4)
    batch = [NewJob("mail", {"body": "y" * 3000}, id=f"batch-{n:02d}") for n in range(40)]
    with pytest.raises(StorageError) as refused:
        store.jobs.enqueue_many(batch)
    assert_disk_full(refused)
    assert [store.jobs.get(new.id) for new in batch if new.id] == [None] * len(batch)
    assert snapshot(store) == before

    set_limit(store, ROOMY)
    assert len(store.jobs.enqueue_many(batch)) == len(batch)
    assert store.jobs.counts().pending == 1 + len(batch)


def test_complete_on_a_full_disk_keeps_the_job_leased_under_the_same_lease(
    store: Store, clock: FakeClock
) -> None:
    store.jobs.enqueue("report", id="r1")
    store.jobs.enqueue("report", id="r2")
    claimed = store.jobs.claim(["report"], owner="w", lease_seconds=60)
    assert claimed is not None
    held = store.jobs.get(claimed.id)
    fill_disk(store)

    with pytest.raises(StorageError) as refused:
        store.jobs.complete(claimed.lease, {"report": BIG})
    assert_disk_full(refused)
    # still leased, by the same attempt, until the same moment
    assert store.jobs.get(claimed.id) == held
    # and the fence still answers for this lease: the refusal changed nothing
    clock.advance(1)
    renewed = store.jobs.renew(claimed.lease, lease_seconds=60)
    assert (renewed.generation, renewed.attempt) == (claimed.lease.generation, 1)

    set_limit(store, ROOMY)
    assert store.jobs.complete(renewed, {"report": BIG}) is True
    done = store.jobs.get(claimed.id)
    assert done is not None
    assert (done.state, done.result, done.attempts) == ("done", {"report": BIG}, 1)
    assert store.jobs.complete(renewed, {"report": BIG}) is True  # idempotent, no write


def test_a_transaction_on_a_full_disk_rolls_back_the_write_and_its_job(store: Store) -> None:
    with store.transaction() as tx:
        tx.execute("CREATE TABLE documents (id TEXT PRIMARY KEY, body TEXT)")
    fill_disk(store)
    with pytest.raises(StorageError) as refused, store.transaction() as tx:  # noqa: PT012
        tx.jobs.enqueue("index", id="index-d1")
        tx.execute("INSERT INTO documents VALUES (?, ?)", ("d1", BIG))
    assert_disk_full(refused)
    assert store.jobs.get("index-d1") is None

    set_limit(store, ROOMY)
    with store.transaction() as tx:
        tx.jobs.enqueue("index", id="index-d1")
        tx.execute("INSERT INTO documents VALUES (?, ?)", ("d1", BIG))
    with store.transaction() as tx:
        rows = tx.execute("SELECT id, length(body) FROM documents").fetchall()
    assert [tuple(row) for row in rows] == [("d1", len(BIG))]
    assert store.jobs.get("index-d1") is not None


def test_a_full_disk_ends_the_transaction_and_nothing_after_it_commits(store: Store) -> None:
    """SQLite rolls the whole transaction back on SQLITE_FULL; a caught error is no way on."""
    with store.transaction() as tx:
        tx.execute("CREATE TABLE documents (id TEXT PRIMARY KEY, body TEXT)")
    fill_disk(store)
    with pytest.raises(TransactionAborted) as ended, store.transaction() as tx:  # noqa: PT012
        tx.jobs.enqueue("index", id="index-d1")
        with pytest.raises(StorageError) as refused:
            tx.execute("INSERT INTO documents VALUES (?, ?)", ("d1", BIG))
        assert_disk_full(refused)
        assert refused.value.details["rolled_back"] is True
        set_limit(store, ROOMY)  # even with room again, the transaction is gone
        with pytest.raises(TransactionAborted):
            tx.jobs.enqueue("index", id="orphan")
        with pytest.raises(TransactionAborted):
            tx.execute("INSERT INTO documents VALUES ('d2', 'small')")
    assert ended.value.code == "JD2093"
    assert store.jobs.get("index-d1") is None
    assert store.jobs.get("orphan") is None
    with store.transaction() as tx:
        assert tx.execute("SELECT count(*) FROM documents").fetchone()[0] == 0
        tx.jobs.enqueue("index", id="index-d1")
    assert store.jobs.get("index-d1") is not None


def test_a_full_disk_inside_tx_jobs_says_the_transaction_is_gone(store: Store) -> None:
    fill_disk(store)
    with pytest.raises(TransactionAborted), store.transaction() as tx:  # noqa: PT012
        with pytest.raises(StorageError) as refused:
            tx.jobs.enqueue("mail", {"body": BIG}, id="too-big")
        assert_disk_full(refused)
        assert "rolled back the whole transaction" in str(refused.value)
        set_limit(store, ROOMY)
        with pytest.raises(TransactionAborted):
            tx.jobs.enqueue("mail", id="orphan")
    assert store.jobs.get("orphan") is None
    assert store.jobs.get("too-big") is None


def test_the_same_store_carries_on_once_space_returns(store: Store) -> None:
    store.jobs.enqueue("mail", {"n": 0}, id="early")
    fill_disk(store)
    for attempt in range(3):  # refused again and again, never wedged
        with pytest.raises(StorageError):
            store.jobs.enqueue("mail", {"body": BIG}, id=f"big-{attempt}")

    set_limit(store, ROOMY)
    job = store.jobs.enqueue("mail", {"body": BIG}, id="big-after")
    assert job.payload == {"body": BIG}
    seen = []
    while (claimed := store.jobs.claim(["mail"], owner="w")) is not None:
        seen.append(claimed.id)
        assert store.jobs.complete(claimed.lease, {"sent": claimed.id}) is True
    assert sorted(seen) == ["big-after", "early"]
    assert store.jobs.counts().done == 2


def test_a_worker_rides_out_a_full_disk(store: Store, clock: FakeClock) -> None:
    """A completion the disk refuses is not lost: the job runs again once space returns."""
    outcomes: list[Outcome] = []
    store.jobs.enqueue("export", id="e1", max_attempts=5)
    worker = store.jobs.create_worker(
        {"export": lambda payload, ctx: {"file": BIG}},
        lease_seconds=30,
        renew=False,
        on_outcome=outcomes.append,
        backoff_base_seconds=1,
    )
    fill_disk(store)
    assert worker.run_once() is True
    assert [o.outcome for o in outcomes] == ["failed"]
    assert outcomes[0].code == StorageError.code
    job = store.jobs.get("e1")
    assert job is not None
    # the failure was recorded ("failed", retried after a backoff), or, if even
    # that found no room, the lease stands until it expires; never settled done
    assert job.state in ("failed", "leased")

    set_limit(store, ROOMY)
    clock.advance(31)  # past the backoff and the lease alike
    assert worker.run_once() is True
    worker.stop(0)
    assert [o.outcome for o in outcomes] == ["failed", "completed"]
    done = store.jobs.get("e1")
    assert done is not None
    assert (done.state, done.result, done.attempts) == ("done", {"file": BIG}, 2)
