"""PostgreSQL's wake-up path: which notifications the listener acts on, and how it waits.

An enqueue in this store wakes the store's workers when it commits (in
process); its NOTIFY, which comes back to the store's own listener, must not
wake them a second time. A NOTIFY from any other connection must.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import jaren_jobs
from tests.conformance.test_worker import Counter
from tests.harness import PostgresUrl

psycopg = pytest.importorskip("psycopg", reason="the dev extra installs psycopg")

WAIT = 10.0


def test_an_own_enqueue_wakes_the_worker_once_and_another_connections_wakes_it(
    pg: PostgresUrl,
) -> None:
    store = pg.open()
    other = pg.open()  # another pool: its connections are not this store's
    started: dict[str, threading.Event] = {n: threading.Event() for n in ("own", "tx", "other")}
    idle = Counter()

    def handler(payload: Any, ctx: Any) -> None:
        started[payload].set()

    # a poll far longer than the test: only wakes start the jobs
    worker = store.jobs.create_worker({"k": handler}, poll_seconds=3600, on_idle=idle)
    worker.start()
    try:
        listener = store._backend.db.listener  # type: ignore[attr-defined]
        assert listener.connected.wait(WAIT)
        assert idle.wait_for(1)
        store.jobs.enqueue("k", "own")  # wakes in process; its NOTIFY is our own
        assert started["own"].wait(WAIT)
        assert idle.wait_for(2)
        # a NOTIFY from a connection that is not the store's, no job: wakes all the same
        with psycopg.connect(pg.url, autocommit=True) as raw:
            raw.execute("SELECT pg_notify(%s, '')", (listener._channel.strip('"'),))
        assert idle.wait_for(3)
        with store.transaction() as tx:
            tx.jobs.enqueue("k", "tx")
        assert started["tx"].wait(WAIT)
        assert idle.wait_for(4)
        # the worker is idle: only the other store's NOTIFY can start this one, and
        # notifications reach the listener in commit order, so the own ones were read
        other.jobs.enqueue("k", "other")
        assert started["other"].wait(WAIT), "another store's NOTIFY did not wake the worker"
        # two in-process wakes (the store's own enqueues), the raw NOTIFY, the other store's
        assert worker.stats().wakes == 4, worker.stats()
        assert listener.ignored == 2
    finally:
        worker.stop()
        other.close()
        store.close()


def test_an_async_stores_own_enqueue_wakes_its_worker_once(pg: PostgresUrl) -> None:
    # the async store enqueues through a pool of its own (AsyncConnections) while its
    # AsyncWorker listens through the sync store's listener: a NOTIFY from that pool is
    # this store's own as much as one from the sync pool
    other = pg.open()  # another pool: its connections are not this store's
    started: dict[str, threading.Event] = {n: threading.Event() for n in ("own", "other")}
    idle = Counter()

    def handler(payload: Any, ctx: Any) -> None:
        started[payload].set()

    async def main() -> tuple[int, int]:
        async with jaren_jobs.open_async_store(pg.url) as store:
            worker = store.jobs.create_worker({"k": handler}, poll_seconds=3600, on_idle=idle)
            async with worker:
                listener = store._store._backend.db.listener  # type: ignore[attr-defined]
                assert await asyncio.to_thread(listener.connected.wait, WAIT)
                assert await asyncio.to_thread(idle.wait_for, 1)
                await store.jobs.enqueue("k", "own")  # wakes in process; its NOTIFY is ours
                assert await asyncio.to_thread(started["own"].wait, WAIT)
                assert await asyncio.to_thread(idle.wait_for, 2)
                # notifications reach the listener in commit order: once the other
                # store's has started its job, the own one was read before it
                await asyncio.to_thread(other.jobs.enqueue, "k", "other")
                assert await asyncio.to_thread(started["other"].wait, WAIT)
                return worker.stats().wakes, listener.ignored

    try:
        wakes, ignored = asyncio.run(asyncio.wait_for(main(), WAIT * 3))
    finally:
        other.close()
    # the own enqueue's wake in process and the other store's NOTIFY: nothing else
    assert (wakes, ignored) == (2, 1)


def test_a_process_that_only_waits_hears_settlements_and_not_enqueues(pg: PostgresUrl) -> None:
    # wait() needs settlements; listening on enqueues too would wake this process's
    # listener for every enqueue of every process, to do nothing
    store = pg.open()
    other = pg.open()
    other.jobs.enqueue("k", id="w")
    claimed = other.jobs.claim(["k"], owner="elsewhere")
    assert claimed is not None
    waited: list[Any] = []
    waiting = threading.Thread(
        target=lambda: waited.append(store.jobs.wait("w", timeout_seconds=WAIT))
    )
    try:
        waiting.start()
        listener = store._backend.db.listener  # type: ignore[attr-defined]
        assert listener.connected.wait(WAIT)
        for _ in range(5):
            other.jobs.enqueue("k")
        # committed after the enqueues: their notifications, if any came, came first
        other.jobs.complete(claimed.lease, "ok")
        waiting.join(WAIT)
        assert [job.state for job in waited] == ["done"]
        assert listener.heard_settled.wait(WAIT)
        assert dict(listener.heard) == {listener.settled_name: 1}, listener.heard
    finally:
        other.close()
        store.close()


def test_a_worker_that_comes_after_a_wait_hears_other_processes_enqueues(
    pg: PostgresUrl,
) -> None:
    store = pg.open()
    other = pg.open()
    other.jobs.enqueue("k", id="w")
    claimed = other.jobs.claim(["k"], owner="elsewhere")
    assert claimed is not None
    started = threading.Event()
    waiting = threading.Thread(
        target=store.jobs.wait, args=("w",), kwargs={"timeout_seconds": WAIT}
    )
    try:
        waiting.start()
        listener = store._backend.db.listener  # type: ignore[attr-defined]
        assert listener.connected.wait(WAIT)  # listening for the wait alone
        # a poll far longer than the test: only a NOTIFY can start the job
        worker = store.jobs.create_worker(
            {"k": lambda payload, ctx: started.set()}, poll_seconds=3600
        )
        with worker:
            assert listener.connected.wait(WAIT)  # on the enqueue channel too, now
            other.jobs.enqueue("k", "x")
            assert started.wait(WAIT), "another store's NOTIFY did not wake the worker"
        other.jobs.complete(claimed.lease, "ok")
        waiting.join(WAIT)
        assert not waiting.is_alive()
    finally:
        other.close()
        store.close()
