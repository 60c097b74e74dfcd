"""SQLite's own part of tests/conformance/test_store.py: what only SQLite can show.

Moved out of the conformance suite, which holds what every backend promises
(its conftest refuses a ``sqlite`` requirement there); a test marked
``both_apis`` still runs through the asyncio API too, as it did there.
"""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest

from jaren_jobs import (
    NewJob,
    Runtime,
    StorageError,
    Store,
    StoreClosed,
    TransactionAborted,
)
from tests.conformance.test_store import WAIT, assert_aborted, order_ids
from tests.harness import Harness

# Statements after which SQLite itself rolls the whole transaction back.
ROLLBACK_CAUSES = {
    "insert-or-rollback": "INSERT OR ROLLBACK INTO orders (id, item) VALUES (1, 'again')",
    "on-conflict-rollback": "INSERT INTO seats (n) VALUES (1)",
    "raise-rollback": "INSERT INTO audit (note) VALUES ('refused')",
}


@pytest.fixture
def rollback_store(app_store: Store) -> Store:
    """``app_store`` plus tables whose constraint or trigger rolls a transaction back."""
    with app_store.transaction() as tx:
        tx.execute("CREATE TABLE seats (n INTEGER PRIMARY KEY ON CONFLICT ROLLBACK)")
        tx.execute("INSERT INTO seats (n) VALUES (1)")
        tx.execute("CREATE TABLE audit (note TEXT)")
        tx.execute(
            "CREATE TRIGGER audit_refuses BEFORE INSERT ON audit "
            "BEGIN SELECT RAISE(ROLLBACK, 'audit refused'); END"
        )
    return app_store


# ----------------------------------------------------------------- os.fork()
#
# A child made by os.fork() has a copy of the parent's SQLite connection (whose
# locks it does not hold) and of the gate's state (whose holders and waiters
# are parent threads that do not exist in the child). The store refuses it all
# at once. The children below run a real os.fork(); each answers through a
# pipe and leaves with os._exit, so nothing of pytest runs twice. Python 3.12+
# warns that a fork with threads running may deadlock: these tests fork with
# threads on purpose (that is the case they pin), so they silence exactly it.

FORK_WARNING = "ignore:This process .* is multi-threaded:DeprecationWarning"
needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()")


def in_forked_child(body: Callable[[], Any], timeout: float = WAIT) -> Any:
    """Run ``body`` in a child of a real ``os.fork()``; its JSON answer, or fail loudly."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: whatever happens, never return into pytest
        code = 70
        try:
            os.close(read_end)
            try:
                answer: Any = {"answer": body()}
            except BaseException as exc:
                answer = {"raised": repr(exc), "traceback": traceback.format_exc()}
            with os.fdopen(write_end, "w") as out:
                json.dump(answer, out)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            ready = select.select([read_end], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                os.kill(pid, signal.SIGKILL)
                raise AssertionError(f"the forked child did not answer within {timeout}s")
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), status
    assert os.WEXITSTATUS(status) == 0, status
    reply = json.loads(b"".join(chunks))
    assert "answer" in reply, reply.get("traceback", reply)
    return reply["answer"]


def refusal(call: Callable[[], Any]) -> list[Any]:
    """In the child: ``[code, message, seconds]`` of the StoreClosed ``call`` raised."""
    started = time.monotonic()
    try:
        call()
    except StoreClosed as exc:
        return [exc.code, str(exc), time.monotonic() - started]
    except BaseException as exc:
        return ["not StoreClosed", repr(exc), time.monotonic() - started]
    return ["no refusal", None, time.monotonic() - started]


def enter_transaction(store: Store) -> None:
    with store.transaction() as tx:
        tx.execute("SELECT 1")


def assert_refused_as_forked(found: dict[str, list[Any]]) -> None:
    for name, (code, message, seconds) in found.items():
        assert code == "JD2091", (name, code, message)
        assert "fork" in message, (name, message)
        assert seconds < 2.0, (name, seconds)  # at once: never a wait for a parent thread


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
