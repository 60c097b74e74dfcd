"""``store.join_transaction()``: jobs written inside a transaction the application opened
on its own connection (Django's ``atomic()``, a SQLAlchemy session), never committed by
the library, with this process's wake-ups handed to the caller's on-commit hook.

The application's transaction is begun, committed and rolled back here as the
application does it, on the connection it gave ``open_store(connection=...)``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import pytest

from jaren_jobs import Runtime, StorageError, Store, open_store
from tests.harness import Harness, app_sql_for

pytestmark = pytest.mark.requires("app-connection")


class OnCommit:
    """The caller's on-commit hook: keeps the callbacks until the test 'commits'."""

    def __init__(self) -> None:
        self.pending: list[Callable[[], None]] = []

    def __call__(self, callback: Callable[[], None]) -> None:
        self.pending.append(callback)

    def run(self) -> None:
        pending, self.pending = self.pending, []
        for callback in pending:
            callback()


def begin(conn: Any) -> None:
    """Open the application's transaction as the application does."""
    if isinstance(conn, sqlite3.Connection):
        conn.execute("BEGIN")
    else:
        conn.execute("SELECT 1")  # psycopg out of autocommit: the first statement begins it


def in_transaction(conn: Any) -> bool:
    if isinstance(conn, sqlite3.Connection):
        return conn.in_transaction
    import psycopg

    return bool(conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS)


def add_order(store: Store, conn: Any, order_id: int) -> None:
    sql = app_sql_for(store, "INSERT INTO orders (id, item) VALUES (?, ?)")
    conn.execute(sql, (order_id, f"item-{order_id}"))


def order_ids(backend: Harness) -> list[int]:
    return [row[0] for row in backend.query("SELECT id FROM orders ORDER BY id")]


@pytest.fixture
def app(backend: Harness, runtime: Runtime) -> tuple[Store, Any]:
    """A store on the application's connection, and that connection, with an orders table."""
    store = backend.open(runtime=runtime)
    with store.transaction() as tx:
        tx.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)")
    return store, backend.app_connection(store)


def test_a_joined_enqueue_commits_with_the_application_and_wakes_only_after(
    app: tuple[Store, Any], backend: Harness
) -> None:
    store, conn = app
    hook = OnCommit()
    begin(conn)
    add_order(store, conn, 1)
    with store.join_transaction(on_commit=hook) as tx:
        job = tx.jobs.enqueue("ship", {"order": 1})
    # the library committed nothing: the application's transaction is still open
    assert in_transaction(conn)
    assert backend.job_ids() == []
    assert order_ids(backend) == []
    assert hook.pending, "the wake-up waits for the application's commit"
    conn.commit()
    hook.run()
    assert backend.job_ids() == [job.id]
    assert order_ids(backend) == [1]
    assert store.jobs.get(job.id) is not None


def test_a_joined_enqueue_rolls_back_with_the_application(
    app: tuple[Store, Any], backend: Harness
) -> None:
    store, conn = app
    hook = OnCommit()
    begin(conn)
    add_order(store, conn, 1)
    with store.join_transaction(on_commit=hook) as tx:
        tx.jobs.enqueue("ship", {"order": 1})
        tx.execute(app_sql_for(store, "INSERT INTO orders (id, item) VALUES (?, ?)"), (2, "b"))
    conn.rollback()
    assert backend.job_ids() == []
    assert order_ids(backend) == []
    # the store goes on as before on the same connection
    job = store.jobs.enqueue("later")
    assert backend.job_ids() == [job.id]


def test_an_exception_out_of_the_block_undoes_only_the_block(
    app: tuple[Store, Any], backend: Harness
) -> None:
    store, conn = app
    hook = OnCommit()
    begin(conn)
    add_order(store, conn, 1)
    with store.join_transaction(on_commit=hook) as tx:
        kept = tx.jobs.enqueue("ship", {"order": 1})

    def failing_view() -> None:
        with store.join_transaction(on_commit=hook) as tx:
            tx.jobs.enqueue("ship", {"order": 2})
            with store.transaction() as inner:  # a nested block is a savepoint of the join
                inner.jobs.enqueue("nested")
            raise RuntimeError("the view failed")

    with pytest.raises(RuntimeError):
        failing_view()
    assert in_transaction(conn)
    add_order(store, conn, 3)
    conn.commit()
    hook.run()
    assert backend.job_ids() == [kept.id]
    assert order_ids(backend) == [1, 3]


def test_joining_with_no_open_transaction_is_refused_and_writes_nothing(
    app: tuple[Store, Any], backend: Harness
) -> None:
    store, conn = app
    if not isinstance(conn, sqlite3.Connection):
        conn.autocommit = True  # out of autocommit, psycopg's next statement begins one

    def enqueue() -> None:
        with store.join_transaction(on_commit=OnCommit()) as tx:
            tx.jobs.enqueue("never")

    with pytest.raises(StorageError, match="no open transaction to join") as caught:
        enqueue()
    assert caught.value.details["reason"] == "no-transaction"
    assert backend.job_ids() == []
    assert store.jobs.enqueue("after").kind == "after"  # the connection was given back


def test_on_commit_must_be_callable(app: tuple[Store, Any]) -> None:
    store, _ = app
    with pytest.raises(TypeError, match="on_commit"), store.join_transaction(on_commit=None):  # type: ignore[arg-type]
        pass


def test_a_store_opened_inside_the_applications_transaction_joins_it(
    app: tuple[Store, Any], backend: Harness, runtime: Runtime
) -> None:
    store, conn = app
    begin(conn)
    add_order(store, conn, 1)
    # opening configures nothing a transaction forbids and commits nothing
    joined = open_store(connection=conn, runtime=runtime)
    assert in_transaction(conn)
    hook = OnCommit()
    with joined.join_transaction(on_commit=hook) as tx:
        job = tx.jobs.enqueue("ship")
    assert in_transaction(conn)
    assert order_ids(backend) == []
    conn.commit()
    hook.run()
    assert backend.job_ids() == [job.id]
    assert order_ids(backend) == [1]
    joined.close()


def test_savepoint_names_are_unique_per_use(app: tuple[Store, Any], backend: Harness) -> None:
    """Two joins at the same depth, one inside the other's savepoint of the application,
    never release each other's savepoint."""
    store, conn = app
    hook = OnCommit()
    begin(conn)
    with store.join_transaction(on_commit=hook) as outer:
        outer.jobs.enqueue("a")
        with store.transaction() as inner:
            inner.jobs.enqueue("b")

        def undone() -> None:
            with store.transaction() as inner:
                inner.jobs.enqueue("c")
                raise ValueError

        with pytest.raises(ValueError):
            undone()
    conn.commit()
    assert sorted(row[0] for row in backend.query('SELECT kind FROM "_jaren_jobs"')) == [
        "a",
        "b",
    ]
