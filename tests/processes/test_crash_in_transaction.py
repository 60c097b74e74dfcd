"""A process that dies inside ``store.transaction()``: its writes and its jobs share one fate.

The child writes a business row and enqueues its job through ``tx.jobs`` in
one transaction, then dies (``os._exit``, a SIGKILL it sends itself, or a
SIGKILL from the parent while it waits) either before the commit or right
after it. After a restart, both exist or neither does, and the file is
immediately writable again.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
from pathlib import Path

import pytest

from jaren_jobs import open_store
from tests.processes.chaos_targets import BUSINESS_TABLE, CREATE_BUSINESS, crash_in_transaction

DEATHS = {"exit": 3, "sigkill": -signal.SIGKILL, "wait-for-kill": -signal.SIGKILL}


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    path = tmp_path / "app.db"
    with open_store(path, durability="full") as store, store.transaction() as tx:
        tx.execute(CREATE_BUSINESS)
    return path


def run_child(db_path: Path, how: str, when: str) -> tuple[int | None, list[tuple[str, int]]]:
    """Run the crashing child; answer its exit code and what others saw before it died."""
    ctx = multiprocessing.get_context("spawn")
    inside = ctx.Event()
    child = ctx.Process(target=crash_in_transaction, args=(str(db_path), how, when, inside))
    child.start()
    seen: list[tuple[str, int]] = []
    try:
        assert inside.wait(60), "the child never reached its transaction"
        if how == "wait-for-kill":
            # while the child sits inside its open transaction, nobody else sees its writes
            connection = sqlite3.connect(db_path, timeout=10)
            try:
                seen = connection.execute(f"SELECT id, total FROM {BUSINESS_TABLE}").fetchall()
                seen += connection.execute('SELECT id, 0 FROM "_jaren_jobs"').fetchall()
            finally:
                connection.close()
            os.kill(child.pid, signal.SIGKILL)
        child.join(60)
    finally:
        if child.is_alive():  # pragma: no cover - only on a hung child
            child.kill()
            child.join(10)
    return child.exitcode, seen


def read_back(db_path: Path) -> tuple[list[tuple[str, int]], list[tuple[str, str, object]]]:
    """Reopen after the crash: the business rows, and the jobs as the library reads them."""
    with open_store(db_path, durability="full") as store:
        with store.transaction() as tx:
            orders = tx.execute(f"SELECT id, total FROM {BUSINESS_TABLE}").fetchall()
        jobs = [(job.id, job.state, job.payload) for job in store.jobs.page()]
    return [tuple(row) for row in orders], jobs


def assert_writable_at_once(db_path: Path) -> None:
    """No lock outlives the dead process: a writer with no busy wait at all succeeds."""
    with open_store(db_path, busy_timeout_seconds=0) as store:
        store.jobs.enqueue("after-restart", id="after-restart")
        claimed = store.jobs.claim(["after-restart"], owner="survivor")
        assert claimed is not None
        assert store.jobs.complete(claimed.lease, "ok") is True


@pytest.mark.parametrize("how", ["exit", "sigkill", "wait-for-kill"])
def test_death_before_commit_leaves_neither_the_write_nor_the_job(db_path: Path, how: str) -> None:
    code, seen = run_child(db_path, how, "before-commit")
    assert code == DEATHS[how]
    assert seen == []  # uncommitted: invisible to another connection while it lived
    orders, jobs = read_back(db_path)
    assert orders == []
    assert jobs == []
    assert_writable_at_once(db_path)


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_death_right_after_commit_keeps_both(db_path: Path, how: str) -> None:
    code, _ = run_child(db_path, how, "after-commit")
    assert code == DEATHS[how]
    orders, jobs = read_back(db_path)
    assert orders == [("order-1", 42)]
    assert jobs == [("ship-order-1", "pending", {"order": "order-1"})]
    assert_writable_at_once(db_path)
