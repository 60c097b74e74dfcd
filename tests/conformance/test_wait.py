"""``store.jobs.wait`` (SPEC §12) on every backend, sync and async.

``wait(id)`` returns the job once it is done, dead or cancelled; past its
timeout it is ``DeadlinePassed``; an unknown id is ``UnknownJob`` (JD2092, a
``LookupError``); an aborted signal is ``OperationCancelled``. A waiter is
known to be waiting once it has subscribed to the store's settlements (the
engine hub's waiters): tests order on that, never on sleeps. Other processes:
``tests/processes/test_wait_processes.py``.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from jaren_jobs import (
    AsyncStore,
    CancelScope,
    DeadlinePassed,
    GateRefused,
    Job,
    JobsError,
    OperationCancelled,
    Store,
    UnknownJob,
)
from jaren_jobs.engine import waiting

WAIT = 10.0


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, WAIT * 3))


def waiters(store: Store) -> int:
    return len(store._hub.settle_waiters)


def until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    """Block until ``predicate()`` holds: a waiter subscribing raises no event of its own,
    so it is checked every millisecond, up to a bound that fails the test."""
    end = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        assert time.monotonic() < end, "never happened"
        pause.wait(0.001)


class Waiter:
    """``store.jobs.wait`` in a thread of its own; ``result()`` re-raises what it raised."""

    def __init__(self, store: Store, job_id: str, **kwargs: Any) -> None:
        self._answer: list[Any] = []
        self._before = waiters(store)
        self._store = store
        self._thread = threading.Thread(target=self._run, args=(job_id, kwargs), daemon=True)
        self._thread.start()

    def _run(self, job_id: str, kwargs: dict[str, Any]) -> None:
        try:
            self._answer.append(self._store.jobs.wait(job_id, **kwargs))
        except BaseException as exc:
            self._answer.append(exc)

    def subscribed(self) -> Waiter:
        until(lambda: waiters(self._store) > self._before or bool(self._answer))
        return self

    def result(self) -> Any:
        self._thread.join(WAIT * 2)
        assert not self._thread.is_alive(), "wait() never returned"
        (answer,) = self._answer
        if isinstance(answer, BaseException):
            raise answer
        return answer


def test_wait_returns_the_job_a_completion_settled(store: Store) -> None:
    store.jobs.enqueue("k", id="a")
    waiter = Waiter(store, "a", timeout_seconds=WAIT).subscribed()
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    assert store.jobs.complete(claimed.lease, {"answer": 42}) is True
    job = waiter.result()
    assert isinstance(job, Job)
    assert (job.id, job.state, job.result) == ("a", "done", {"answer": 42})
    assert waiters(store) == 0  # a finished wait holds nothing


def test_in_process_settlements_wake_the_waiter_without_its_poll(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no poll before the test gives up: only the settlement's own wake-up can end it
    for name in ("_POLL_FIRST_SECONDS", "_POLL_MOST_SECONDS", "_POLL_LISTENED_SECONDS"):
        monkeypatch.setattr(waiting, name, WAIT * 60)
    for job_id in ("a-complete", "b-checkpoints", "c-cancel"):
        store.jobs.enqueue("k", id=job_id)
    first = Waiter(store, "a-complete").subscribed()
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    assert claimed.id == "a-complete"
    store.jobs.complete(claimed.lease, 1)
    assert first.result().state == "done"
    second = Waiter(store, "b-checkpoints").subscribed()
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    assert claimed.id == "b-checkpoints"
    store.jobs.checkpoints_for(claimed).complete("b-checkpoints", 2)
    assert second.result().result == 2
    third = Waiter(store, "c-cancel").subscribed()
    store.jobs.cancel("c-cancel")
    assert third.result().state == "cancelled"


def test_wait_returns_a_dead_job_and_a_cancelled_one(store: Store) -> None:
    store.jobs.enqueue("k", id="dies", max_attempts=1)
    store.jobs.enqueue("k", id="gone")
    dies = Waiter(store, "dies", timeout_seconds=WAIT).subscribed()
    gone = Waiter(store, "gone", timeout_seconds=WAIT).subscribed()
    assert store.jobs.cancel("gone") is True
    assert gone.result().state == "cancelled"
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    assert claimed.id == "dies"
    assert store.jobs.fail(claimed.lease, "boom") is True
    dead = dies.result()
    assert (dead.state, dead.last_error) == ("dead", "boom")


def test_wait_returns_a_job_settled_by_a_worker(store: Store) -> None:
    store.jobs.enqueue("k", {"n": 2}, id="a")
    waiter = Waiter(store, "a", timeout_seconds=WAIT).subscribed()
    with store.jobs.create_worker({"k": lambda payload, ctx: payload["n"] * 21}):
        job = waiter.result()
    assert (job.state, job.result) == ("done", 42)


def test_wait_keeps_waiting_through_a_retry_and_a_snooze(store: Store) -> None:
    store.jobs.enqueue("k", id="a", max_attempts=2)
    waiter = Waiter(store, "a", timeout_seconds=WAIT).subscribed()
    first = store.jobs.claim(["k"], owner="w")
    assert first is not None
    assert store.jobs.snooze(first.lease, 0) is True
    second = store.jobs.claim(["k"], owner="w")
    assert second is not None
    assert store.jobs.fail(second.lease, "once") is True
    assert store.jobs.get("a").state == "failed"  # type: ignore[union-attr]
    assert waiters(store) == 1  # still waiting: a retry and a snooze settle nothing
    assert store.jobs.requeue("a") is True
    third = store.jobs.claim(["k"], owner="w")
    assert third is not None
    assert store.jobs.complete(third.lease, "third time") is True
    assert waiter.result().result == "third time"


def test_wait_on_a_settled_job_returns_at_once(store: Store) -> None:
    store.jobs.enqueue("k", id="a")
    assert store.jobs.cancel("a") is True
    assert store.jobs.wait("a").state == "cancelled"
    assert store.jobs.wait("a", timeout_seconds=0).state == "cancelled"


def test_wait_past_its_timeout_is_deadline_passed(store: Store) -> None:
    store.jobs.enqueue("k", id="a")
    with pytest.raises(DeadlinePassed) as caught:
        store.jobs.wait("a", timeout_seconds=0)
    assert caught.value.details["job_id"] == "a"
    assert caught.value.details["state"] == "pending"
    with pytest.raises(DeadlinePassed):
        store.jobs.wait("a", timeout_seconds=0.05)
    assert waiters(store) == 0


def test_wait_on_an_unknown_id_is_unknown_job(store: Store) -> None:
    with pytest.raises(UnknownJob) as caught:
        store.jobs.wait("nobody", timeout_seconds=WAIT)
    error = caught.value
    assert isinstance(error, LookupError)
    assert isinstance(error, JobsError)
    assert error.code == "JD2092"
    assert error.details["job_id"] == "nobody"
    assert str(error).startswith("JD2092: ")


def test_wait_with_an_aborted_signal_is_operation_cancelled(store: Store) -> None:
    store.jobs.enqueue("k", id="a")
    scope = CancelScope()
    scope.abort("not any more")
    with pytest.raises(OperationCancelled):
        store.jobs.wait("a", signal=scope.signal)
    # aborted while it waits: it gives up at once, without a timeout
    live = CancelScope()
    waiter = Waiter(store, "a", signal=live.signal).subscribed()
    live.abort("the request went away")
    with pytest.raises(OperationCancelled) as caught:
        waiter.result()
    assert caught.value.details["state"] == "pending"
    assert waiters(store) == 0


def test_wait_refuses_bad_arguments(store: Store) -> None:
    store.jobs.enqueue("k", id="a")
    for bad_id, error in [(1, TypeError), ("", ValueError), (None, TypeError)]:
        with pytest.raises(error):
            store.jobs.wait(bad_id)  # type: ignore[arg-type]
    for bad, error in [
        (-1, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (True, TypeError),
        ("1", TypeError),
    ]:
        with pytest.raises(error):
            store.jobs.wait("a", timeout_seconds=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.jobs.wait("a", signal="soon")  # type: ignore[arg-type]


def test_wait_inside_a_transaction_is_refused(store: Store) -> None:
    store.jobs.enqueue("k", id="a")
    with store.transaction() as tx:
        with pytest.raises(GateRefused, match=r"inside store\.transaction"):
            tx.jobs.wait("a", timeout_seconds=0)
        with pytest.raises(GateRefused, match=r"inside store\.transaction"):
            store.jobs.wait("a", timeout_seconds=0)


def test_a_settlement_in_a_transaction_wakes_the_waiter_once_committed(store: Store) -> None:
    store.jobs.enqueue("k", id="a")
    waiter = Waiter(store, "a", timeout_seconds=WAIT).subscribed()
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    with store.transaction() as tx:
        assert tx.jobs.complete(claimed.lease, "in a tx") is True
    assert waiter.result().result == "in a tx"


# ---------------------------------------------------------------- asyncio


def test_await_wait_never_blocks_the_loop(astore: AsyncStore, store: Store) -> None:
    ticks: list[int] = []

    async def main() -> Job:
        await astore.jobs.enqueue("k", id="a")
        loop = asyncio.get_running_loop()
        ticking = asyncio.Event()

        async def ticker() -> None:
            while True:
                ticks.append(1)
                ticking.set()
                await asyncio.sleep(0.001)

        def settle_elsewhere() -> None:
            until(lambda: waiters(store) == 1)
            # the loop keeps running other tasks while the wait is under way
            mark = len(ticks)
            until(lambda: len(ticks) >= mark + 5)
            claimed = store.jobs.claim(["k"], owner="w")
            assert claimed is not None
            store.jobs.complete(claimed.lease, "from a thread")

        tick = asyncio.ensure_future(ticker())
        settler = loop.run_in_executor(None, settle_elsewhere)
        try:
            await ticking.wait()
            job = await astore.jobs.wait("a", timeout_seconds=WAIT)
        finally:
            tick.cancel()
        await settler
        return job

    job = run(main())
    assert (job.state, job.result) == ("done", "from a thread")
    assert waiters(store) == 0


def test_await_wait_refuses_as_the_sync_call_does(astore: AsyncStore, store: Store) -> None:

    async def main() -> None:
        await astore.jobs.enqueue("k", id="a")
        with pytest.raises(UnknownJob):
            await astore.jobs.wait("nobody")
        with pytest.raises(DeadlinePassed):
            await astore.jobs.wait("a", timeout_seconds=0.02)
        scope = CancelScope()
        waiting = asyncio.ensure_future(astore.jobs.wait("a", signal=scope.signal))
        while waiters(store) == 0:
            await asyncio.sleep(0)  # let the wait subscribe
        scope.abort("no longer")
        with pytest.raises(OperationCancelled):
            await waiting
        with pytest.raises(TypeError):
            await astore.jobs.wait("a", timeout_seconds=True)  # type: ignore[arg-type]
        async with astore.transaction() as tx:
            with pytest.raises(GateRefused):
                await tx.jobs.wait("a")
        # a cancelled task leaves nothing subscribed
        task = asyncio.ensure_future(astore.jobs.wait("a"))
        while waiters(store) == 0:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
    assert waiters(store) == 0
