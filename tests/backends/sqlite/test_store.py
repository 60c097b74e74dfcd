"""SQLite's own part of tests/conformance/test_store.py: what only SQLite can show.

Moved out of the conformance suite, which holds what every backend promises
(its conftest refuses a ``sqlite`` requirement there); a test marked
``both_apis`` still runs through the asyncio API too, as it did there.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from jaren_jobs import (
    NewJob,
    Runtime,
    StorageError,
    Store,
    TransactionAborted,
)
from tests.conformance.test_store import (
    FORK_WARNING,
    ROLLBACK_CAUSES,
    WAIT,
    assert_aborted,
    assert_refused_as_forked,
    enter_transaction,
    in_forked_child,
    needs_fork,
    order_ids,
    refusal,
)
from tests.harness import Harness


@pytest.mark.both_apis  # conflict clauses and RAISE(ROLLBACK)
@pytest.mark.parametrize("cause", sorted(ROLLBACK_CAUSES))
def test_a_transaction_sqlite_rolled_back_refuses_every_later_call(
    rollback_store: Store, backend: Harness, cause: str
) -> None:
    store = rollback_store
    committed: list[str] = []

    def checkout() -> None:
        with store.transaction() as tx:
            tx.execute("INSERT INTO orders (id, item) VALUES (1, 'book')")
            tx.jobs.enqueue("ship", {"order": 1}, id="ship-1")
            tx.after_commit(lambda: committed.append("ship-1"))
            with pytest.raises(StorageError) as first:
                tx.execute(ROLLBACK_CAUSES[cause])
            assert not isinstance(first.value, TransactionAborted)
            assert "rolled back" in str(first.value)
            # the application caught it and carries on: nothing may run outside
            # the transaction it believes it is in
            assert_aborted(lambda: tx.jobs.enqueue("ship", {"order": 2}, id="orphan"))
            assert_aborted(lambda: tx.jobs.enqueue_many([NewJob("ship", id="orphan-many")]))
            assert_aborted(lambda: tx.execute("INSERT INTO orders (id, item) VALUES (2, 'x')"))
            assert_aborted(lambda: tx.executemany("INSERT INTO orders VALUES (?, ?)", [(3, "y")]))
            assert_aborted(lambda: tx.jobs.get("ship-1"))
            assert_aborted(tx.jobs.counts)
            assert_aborted(lambda: tx.jobs.claim(["ship"], owner="w"))

            def nested() -> None:
                with store.transaction() as inner:
                    inner.jobs.enqueue("ship", id="orphan-nested")

            assert_aborted(nested)

    assert_aborted(checkout)  # the block itself ends in the error, never in a COMMIT
    assert committed == []
    assert backend.job_ids() == []
    assert order_ids(backend) == []
    # the store is not wedged: the gate is free, a new transaction commits
    assert store.jobs.get("orphan") is None
    with store.transaction() as tx:
        tx.execute("INSERT INTO orders (id, item) VALUES (1, 'book')")
        tx.jobs.enqueue("ship", {"order": 1}, id="ship-1")
    assert backend.job_ids() == ["ship-1"]
    assert order_ids(backend) == [1]


@pytest.mark.both_apis
def test_a_rollback_inside_a_nested_transaction_ends_the_outer_one(
    rollback_store: Store, backend: Harness
) -> None:
    store = rollback_store

    def checkout() -> None:
        with store.transaction() as outer:
            outer.execute("INSERT INTO orders (id, item) VALUES (1, 'book')")

            def step() -> None:
                with store.transaction() as inner:
                    inner.jobs.enqueue("ship", id="ship-1")
                    with pytest.raises(StorageError):
                        inner.execute(ROLLBACK_CAUSES["raise-rollback"])
                    assert_aborted(lambda: inner.jobs.enqueue("ship", id="orphan-inner"))

            assert_aborted(step)  # the savepoint block ends in the error too
            assert_aborted(lambda: outer.jobs.enqueue("ship", id="orphan-outer"))
            assert_aborted(lambda: outer.execute("INSERT INTO orders (id, item) VALUES (2, 'x')"))

    assert_aborted(checkout)
    assert backend.job_ids() == []
    assert order_ids(backend) == []


@needs_fork
# sqlite3's trace callback counts the statements; sync-api: a child of fork() has none of
# its parent's other threads, an event loop's among them (asyncio does not survive a fork)
@pytest.mark.filterwarnings(FORK_WARNING)
@pytest.mark.parametrize("holder", ["nobody", "a parent transaction", "the gate's own lock"])
def test_a_forked_child_is_refused_at_once_and_never_touches_the_connection(
    backend: Harness, runtime: Runtime, holder: str
) -> None:
    # a long gate timeout: a child that queued for a parent thread would hang
    store = backend.open(runtime=runtime, gate_timeout_seconds=60)
    store.jobs.enqueue("k", id="before")
    statements: list[str] = []
    store.connection.set_trace_callback(statements.append)
    holding = threading.Event()
    done = threading.Event()

    def hold() -> None:
        if holder == "a parent transaction":
            with store.transaction() as tx:
                tx.jobs.enqueue("k", id="parent-tx")
                holding.set()
                assert done.wait(3 * WAIT)  # past the child's own bound
        else:  # the gate's mutex, as a thread forked in the middle of acquire() holds it
            gate = store._backend.db.gate
            with gate._mutex:  # the state a fork can catch in the middle of acquire()
                holding.set()
                assert done.wait(3 * WAIT)  # past the child's own bound

    thread = threading.Thread(target=hold, daemon=True)
    if holder != "nobody":
        thread.start()
        assert holding.wait(WAIT)

    def child() -> dict[str, Any]:
        ran_before = len(statements)
        found = {
            "enqueue": refusal(lambda: store.jobs.enqueue("k", id="child")),
            "get": refusal(lambda: store.jobs.get("before")),
            "counts": refusal(store.jobs.counts),
            "claim": refusal(lambda: store.jobs.claim(["k"], owner="child")),
            "page": refusal(lambda: list(store.jobs.page())),
            "transaction": refusal(lambda: enter_transaction(store)),
            "connection": refusal(lambda: store.connection),
            # the gate itself, held (or its lock held) by a parent thread the child lacks
            "gate": refusal(lambda: store._backend.db.gate.acquire("the gate")),
        }
        started = time.monotonic()
        outcomes = store.close()
        return {
            "found": found,
            "close": [len(outcomes), store.closed, time.monotonic() - started],
            "after_close": refusal(lambda: store.jobs.get("before")),
            "statements": statements[ran_before:],
        }

    try:
        answer = in_forked_child(child)
    finally:
        done.set()
        if holder != "nobody":
            thread.join(WAIT)
    assert_refused_as_forked(answer["found"])
    assert answer["close"][:2] == [0, True]
    assert answer["close"][2] < 2.0
    assert answer["after_close"][0] == "JD2091"
    assert answer["statements"] == []  # not one statement on the parent's connection

    # the parent's store is untouched by all of it, the child's close() included
    try:
        assert not store.closed
        store.connection.set_trace_callback(None)
        store.jobs.enqueue("k", id="after")
        claimed = store.jobs.claim(["k"], owner="parent")
        assert claimed is not None
        assert store.jobs.complete(claimed.lease) is True
        expected = ["after", "before"] + (["parent-tx"] if holder == "a parent transaction" else [])
        assert backend.job_ids() == sorted(expected)  # read on a connection of its own
    finally:
        store.close()


@needs_fork
# sqlite3's trace callback counts the statements; sync-api: as above, no loop after a fork
@pytest.mark.filterwarnings(FORK_WARNING)
def test_a_fork_inside_a_transaction_leaves_it_to_the_parent(
    app_store: Store, backend: Harness
) -> None:
    statements: list[str] = []
    app_store.connection.set_trace_callback(statements.append)
    block = app_store.transaction()  # a with block, entered and left by hand around the fork
    tx = block.__enter__()
    tx.execute("INSERT INTO orders (id, item) VALUES (1, 'book')")
    tx.jobs.enqueue("ship", id="ship-1")

    def child() -> dict[str, Any]:
        ran_before = len(statements)
        found = {
            "tx.execute": refusal(lambda: tx.execute("INSERT INTO orders VALUES (2, 'child')")),
            "tx.jobs": refusal(lambda: tx.jobs.enqueue("ship", id="child")),
            "nested": refusal(lambda: enter_transaction(app_store)),
            # the block the child inherited ends in the refusal: never a COMMIT
            # (or a ROLLBACK) on the parent's connection, never a gate error
            "block end": refusal(lambda: block.__exit__(None, None, None)),
        }
        return {"found": found, "statements": statements[ran_before:]}

    try:
        answer = in_forked_child(child)
    finally:
        block.__exit__(None, None, None)
    app_store.connection.set_trace_callback(None)
    assert_refused_as_forked(answer["found"])
    assert answer["statements"] == []
    # the parent's transaction committed as if nothing had happened
    assert order_ids(backend) == [1]
    assert backend.job_ids() == ["ship-1"]
