"""The pool of a store opened from a PostgreSQL URL: its connections, seen from the server.

What the pool promises to threads (concurrency, the bounded wait) is in
tests/conformance/test_pool.py; this file checks the connections themselves
in ``pg_stat_activity``: opened as needed, a broken one replaced and never
handed out again, every one closed by ``close()``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from jaren_jobs import StorageError, Store
from tests.harness import PostgresUrl

psycopg = pytest.importorskip("psycopg", reason="the dev extra installs psycopg")

WAIT = 10.0


def _wait_until(predicate: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + WAIT
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        pause.wait(0.005)


def _live(pg: PostgresUrl, pids: set[int]) -> set[int]:
    """Which of ``pids`` are server sessions still connected."""
    with psycopg.connect(pg.server_url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", (list(pids),)
        ).fetchall()
    return {int(pid) for (pid,) in rows}


def _hold_all(store: Store, n: int) -> set[int]:
    """``n`` threads' transactions open at once: the server pids of the connections they hold."""
    inside = threading.Barrier(n + 1)
    leave = threading.Event()
    pids: list[int] = []
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            with store.transaction() as tx:
                pids.append(int(tx.execute("SELECT pg_backend_pid()").fetchone()[0]))
                inside.wait(WAIT)
                assert leave.wait(WAIT)
        except BaseException as exc:
            errors.append(exc)
            inside.abort()

    threads = [threading.Thread(target=hold, daemon=True) for _ in range(n)]
    for thread in threads:
        thread.start()
    try:
        inside.wait(WAIT)
    finally:
        leave.set()
        for thread in threads:
            thread.join(WAIT)
    assert not errors, errors
    assert len(pids) == n
    return set(pids)


def test_connections_are_opened_as_calls_need_them_up_to_the_pool_size(pg: PostgresUrl) -> None:
    store = pg.open(pool_size=3)
    db = store._backend.db  # type: ignore[attr-defined]
    assert db.size == 1  # opening used one
    for n in range(20):  # one thread at a time keeps using the one it gave back
        store.jobs.enqueue("k", id=f"j{n}")
    assert db.size == 1
    pids = _hold_all(store, 3)
    assert len(pids) == 3
    assert db.size == 3
    assert _live(pg, pids) == pids


def test_a_killed_idle_connection_is_replaced_before_use_and_the_pool_stays_full_size(
    pg: PostgresUrl,
) -> None:
    # SPEC §10: an idle pooled connection the server closed is replaced before use, so
    # no call fails for a connection it did not use (it used to fail the next call)
    store = pg.open(pool_size=3)
    db = store._backend.db  # type: ignore[attr-defined]
    pids = _hold_all(store, 3)
    # the connection the next call will take (the last given back)
    victim = int(db.connection.info.backend_pid)
    assert victim in pids
    with psycopg.connect(pg.server_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (victim,))
    _wait_until(lambda: victim not in _live(pg, {victim}), "the server to end the session")
    store.jobs.enqueue("k", id="kept")
    for n in range(5):
        store.jobs.enqueue("k", id=f"after-{n}")
    assert store.jobs.get("kept") is not None
    again = _hold_all(store, 3)
    assert victim not in again
    assert len(again) == 3
    assert db.size == 3
    assert _live(pg, again) == again


def test_when_every_idle_connection_dies_at_once_no_call_fails(
    pg: PostgresUrl,
) -> None:
    # what a server restart does to an idle pool: every session ended, unseen until
    # taken; each is noticed when taken (its socket has the server's goodbye to read)
    # and replaced, so the next call goes on, on a fresh connection
    store = pg.open(pool_size=3)
    pids = _hold_all(store, 3)
    with psycopg.connect(pg.server_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (list(pids),)
        )
    _wait_until(lambda: not _live(pg, pids), "the server to end every session")
    store.jobs.enqueue("k", id="first")
    for n in range(3):
        store.jobs.enqueue("k", id=f"after-{n}")
    assert pg.job_ids() == ["after-0", "after-1", "after-2", "first"]
    assert not _hold_all(store, 3) & pids


def test_a_transaction_whose_connection_dies_fails_and_the_connection_is_not_reused(
    pg: PostgresUrl,
) -> None:
    store = pg.open(pool_size=2)
    pids: list[int] = []

    def doomed() -> None:
        with store.transaction() as tx:
            tx.jobs.enqueue("k", id="doomed")
            pids.append(int(tx.execute("SELECT pg_backend_pid()").fetchone()[0]))
            with psycopg.connect(pg.server_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
            tx.jobs.enqueue("k", id="after-the-kill")

    with pytest.raises(StorageError):
        doomed()
    [pid] = pids
    assert store.jobs.get("doomed") is None
    assert store.jobs.get("after-the-kill") is None
    assert pid not in _hold_all(store, 2)


def test_close_closes_every_connection_of_the_pool(pg: PostgresUrl) -> None:
    store = pg.open(pool_size=4)
    pids = _hold_all(store, 4)
    worker = store.jobs.create_worker({"k": lambda payload, ctx: None})
    worker.start()
    listener = store._backend.db.listener  # type: ignore[attr-defined]
    assert listener.connected.wait(WAIT)
    pids.add(int(listener._conn.info.backend_pid))  # its LISTEN connection, beside the pool
    assert _live(pg, pids) == pids
    assert len(pids) == 5
    store.close()
    assert store.closed
    assert not worker.running
    _wait_until(lambda: not _live(pg, pids), "every session of the store to end")


def test_a_store_on_the_application_s_connection_has_exactly_that_one(pg: PostgresUrl) -> None:
    from jaren_jobs import open_store

    conn = psycopg.connect(pg.url)
    try:
        store = open_store(connection=conn)
        db = store._backend.db  # type: ignore[attr-defined]
        assert db.gate.capacity == 1
        store.jobs.enqueue("k", id="one")
        assert db.connection is conn
        assert db.size == 1
        store.close()
        assert not conn.closed  # the application's, to close
    finally:
        conn.close()
