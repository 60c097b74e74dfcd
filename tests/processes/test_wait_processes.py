"""``wait()`` across processes (SPEC §12): a spawned process runs the job while the parent
waits, on SQLite (the bounded poll) and on PostgreSQL (LISTEN/NOTIFY).

Ordered on events: the child starts only once the parent's wait has subscribed
(and, on PostgreSQL, its listener is connected). On PostgreSQL the waiter's
fallback poll is pushed far past the bound the test joins the waiter with, and
the wait has no timeout of its own, so only the settlement's NOTIFY can wake
it in time: a wait that returns the job proves it.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import Job, Store, open_store
from jaren_jobs.engine import waiting
from tests.processes.pg_support import Schema
from tests.processes.wait_targets import KIND, run_when_told

SPAWN = multiprocessing.get_context("spawn")
WAIT = 60.0
pytestmark = pytest.mark.slow


def _wait_across(store: Store, target: str, *, listened: bool) -> tuple[Job, bool]:
    job = store.jobs.enqueue(KIND, {"n": 21}, id="remote")
    go, done = SPAWN.Event(), SPAWN.Event()
    child = SPAWN.Process(target=run_when_told, args=(target, job.id, go, done))
    child.start()
    answer: list[Any] = []

    def wait() -> None:
        try:
            answer.append(store.jobs.wait(job.id))
        except BaseException as exc:
            answer.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    end = time.monotonic() + WAIT
    while not store._hub.settle_waiters or (
        listened and not store._backend.db.listener.connected.is_set()  # type: ignore[attr-defined]
    ):
        assert time.monotonic() < end, "the wait never subscribed"
        threading.Event().wait(0.005)
    go.set()
    try:
        waiter.join(WAIT)
        assert not waiter.is_alive(), "the settlement in the other process never woke the wait"
        (result,) = answer
        if isinstance(result, BaseException):
            raise result
        return result, done.wait(WAIT)
    finally:
        child.join(WAIT)
        if child.is_alive():  # pragma: no cover - a hung child fails the test, not the run
            child.kill()


def test_wait_across_processes_on_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    with open_store(path) as store:
        job, finished = _wait_across(store, str(path), listened=False)
    assert (job.state, job.result) == ("done", {"ran in": "another process", "n": 42})
    assert job.attempts == 1  # the snooze gave its attempt back
    assert finished


def test_wait_across_processes_on_postgres_is_woken_by_notify(
    pg_schema: Schema, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the fallback poll would come only long after the test gave up: NOTIFY or nothing
    monkeypatch.setattr(waiting, "_POLL_LISTENED_SECONDS", WAIT * 10)
    with open_store(pg_schema.url) as store:
        job, finished = _wait_across(store, pg_schema.url, listened=True)
    assert (job.state, job.result) == ("done", {"ran in": "another process", "n": 42})
    assert job.attempts == 1
    assert finished
