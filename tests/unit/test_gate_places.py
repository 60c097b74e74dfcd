"""A gate of several places (a PostgreSQL store's pool): n threads at once, the rest in order.

The gate alone, no database: the pool's connections are taken through it,
so its places, its fair queue and its refusals are the pool's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from jaren_jobs import GateRefused
from jaren_jobs.gate import Gate

WAIT = 10.0


def _wait_until(predicate: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + WAIT
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        pause.wait(0.002)


class Holder:
    """A thread that takes a place, says so, and gives it back when told."""

    def __init__(self, gate: Gate, name: str, served: list[str]) -> None:
        self.gate = gate
        self.name = name
        self.served = served
        self.inside = threading.Event()
        self.leave = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.gate.acquire(self.name)
        except BaseException as exc:
            self.error = exc
            self.inside.set()
            return
        self.served.append(self.name)
        self.inside.set()
        self.leave.wait(WAIT)
        self.gate.release()

    def done(self) -> None:
        self.leave.set()
        self.thread.join(WAIT)
        assert not self.thread.is_alive()


def test_a_gate_of_two_admits_two_threads_and_queues_the_rest_in_order() -> None:
    gate = Gate(WAIT, capacity=2)
    served: list[str] = []
    first, second = Holder(gate, "a", served), Holder(gate, "b", served)
    assert first.inside.wait(WAIT)
    assert second.inside.wait(WAIT)
    assert gate.waiting() == 0
    waiters = []
    for n, name in enumerate(("c", "d", "e")):
        waiters.append(Holder(gate, name, served))
        _wait_until(lambda n=n: gate.waiting() == n + 1, f"{name} to queue")
    assert not any(w.inside.is_set() for w in waiters)
    first.done()  # one place free: the oldest waiter, and only it, gets in
    assert waiters[0].inside.wait(WAIT)
    assert gate.waiting() == 2
    assert not waiters[1].inside.is_set()
    second.done()
    assert waiters[1].inside.wait(WAIT)
    waiters[0].done()
    assert waiters[2].inside.wait(WAIT)
    for waiter in waiters[1:]:
        waiter.done()
    assert served == ["a", "b", "c", "d", "e"]
    assert all(w.error is None for w in (first, second, *waiters))


def test_a_thread_holding_a_place_is_refused_a_second_one() -> None:
    gate = Gate(WAIT, capacity=3)
    gate.acquire("first")
    try:
        with pytest.raises(GateRefused) as info:
            gate.acquire("second")
        assert info.value.details["reason"] == "reentrant"
        assert not gate.try_acquire()
    finally:
        gate.release()
    assert gate.try_acquire()
    gate.release()


def test_a_waiter_past_the_timeout_is_refused_and_leaves_the_queue() -> None:
    gate = Gate(0.05, capacity=2)
    served: list[str] = []
    holders = [Holder(gate, name, served) for name in ("a", "b")]
    for holder in holders:
        assert holder.inside.wait(WAIT)
    with pytest.raises(GateRefused) as info:
        gate.acquire("late")
    assert info.value.details["reason"] == "timeout"
    assert "all 2 of its connections" in str(info.value)
    assert gate.waiting() == 0
    for holder in holders:
        holder.done()
    gate.acquire("now")  # both places free again
    gate.release()


def test_wait_idle_waits_for_every_place_to_be_given_back() -> None:
    gate = Gate(WAIT, capacity=2)
    served: list[str] = []
    holders = [Holder(gate, name, served) for name in ("a", "b")]
    for holder in holders:
        assert holder.inside.wait(WAIT)
    gate.close()
    assert not gate.wait_idle(0.01)
    holders[0].done()
    assert not gate.wait_idle(0.01)
    holders[1].done()
    assert gate.wait_idle(WAIT)


def test_a_gate_needs_a_place() -> None:
    with pytest.raises(ValueError, match="at least one place"):
        Gate(1.0, capacity=0)
