"""The gate on SQLite: one connection serves a store's threads in arrival order (SPEC §1).

Threads are ordered with events and by watching the gate's queue, never by
sleeping: a thread counts as "waiting on the gate" once it is in the queue.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import CancelScope, GateRefused, Runtime, Store, open_store
from jaren_jobs.gate import Gate
from tests.conformance.test_store import Call, queued, wait_until


def test_gate_serves_waiters_in_arrival_order(store: Store, db_path: Path) -> None:
    # ids are minted under the gate, so the id each waiter's job gets records
    # the order in which the gate served them
    calls: list[Call] = []
    with store.transaction() as tx:
        tx.execute("SELECT 1")
        for index in range(5):
            call = Call(lambda i=index: store.jobs.enqueue(f"waiter-{i}"), f"waiter-{index}")
            calls.append(call.start())
            wait_until(lambda n=index + 1: queued(store) == n, f"waiter {index} to queue")
        assert not any(c.done.is_set() for c in calls)
    jobs = [c.join() for c in calls]
    assert [j.kind for j in jobs] == [f"waiter-{i}" for i in range(5)]
    assert [j.id for j in jobs] == [f"id-{i:06d}" for i in range(1, 6)]
    assert queued(store) == 0


def test_gate_handover_beats_a_newcomer(store: Store) -> None:
    # a release hands the gate to the oldest waiter; a thread arriving after
    # the release but before the waiter wakes must queue behind it
    with store.transaction():
        first = Call(lambda: store.jobs.enqueue("first"), "first").start()
        wait_until(lambda: queued(store) == 1, "the first waiter to queue")
    newcomer = store.jobs.enqueue("newcomer")
    assert first.join().id == "id-000001"
    assert newcomer.id == "id-000002"


def test_gate_timeout(db_path: Path, runtime: Runtime) -> None:
    with open_store(db_path, runtime=runtime, gate_timeout_seconds=0.2) as store:
        with store.transaction() as tx:
            tx.jobs.enqueue("k", id="j")
            started = time.monotonic()
            waiter = Call(lambda: store.jobs.get("j"), "waiter").start()
            with pytest.raises(GateRefused) as info:
                waiter.join()
            assert time.monotonic() - started >= 0.2
            assert info.value.details["reason"] == "timeout"
            assert info.value.code == "JD2064"
            assert queued(store) == 0  # it left the queue
        assert store.jobs.get("j") is not None


class ForeignSignal:
    """A signal the library did not make: it can only be polled."""

    def __init__(self) -> None:
        self.aborted = False
        self.reason: Any = None


@pytest.mark.parametrize("kind", ["cancel-scope", "foreign"])
def test_gate_abandoned_through_a_signal(store: Store, db_path: Path, kind: str) -> None:
    store.jobs.enqueue("k", id="j")
    scope = CancelScope()
    foreign = ForeignSignal()
    signal: Any = scope.signal if kind == "cancel-scope" else foreign
    calls = [
        ("cancel", lambda: store.jobs.cancel("j", signal=signal)),
        ("requeue", lambda: store.jobs.requeue("j", signal=signal)),
    ]
    with store.transaction():
        waiters: list[Call] = []
        for count, (name, fn) in enumerate(calls, start=1):
            waiters.append(Call(fn, name).start())
            wait_until(lambda n=count: queued(store) == n, f"{name} to queue")
        if kind == "cancel-scope":
            scope.abort("user went away")
        else:
            foreign.reason = "user went away"
            foreign.aborted = True
        for waiter in waiters:
            with pytest.raises(GateRefused) as info:
                waiter.join()
            assert info.value.details["reason"] == "aborted"
            assert "user went away" in str(info.value)
        assert queued(store) == 0
    job = store.jobs.get("j")
    assert job is not None
    assert job.state == "pending"  # nothing was written


def test_gate_abandonment_keeps_the_queue_order(store: Store) -> None:
    store.jobs.enqueue("k", id="j")
    scope = CancelScope()
    with store.transaction():
        first = Call(lambda: store.jobs.enqueue("first"), "first").start()
        wait_until(lambda: queued(store) == 1, "first to queue")
        quitter = Call(lambda: store.jobs.cancel("j", signal=scope.signal), "quitter").start()
        wait_until(lambda: queued(store) == 2, "quitter to queue")
        last = Call(lambda: store.jobs.enqueue("last"), "last").start()
        wait_until(lambda: queued(store) == 3, "last to queue")
        scope.abort("gone")
        with pytest.raises(GateRefused):
            quitter.join()
        assert queued(store) == 2
    assert first.join().id == "id-000001"
    assert last.join().id == "id-000002"
    assert store.jobs.get("j").state == "pending"  # type: ignore[union-attr]


def test_try_acquire_takes_only_a_free_gate() -> None:
    gate = Gate(1.0)
    assert gate.try_acquire() is True
    assert gate.try_acquire() is False  # held, even by this very thread
    taken: list[bool] = []
    other = threading.Thread(target=lambda: taken.append(gate.try_acquire()))
    other.start()
    other.join(10)
    assert taken == [False]
    gate.release()
    assert gate.try_acquire() is True
    gate.release()
    gate.close()
    assert gate.try_acquire() is False
