"""A store with a pool of connections (SPEC §10): many threads at once, bounded waits.

A store opened from a PostgreSQL URL serves each call — a root call, or a
whole ``store.transaction()`` — on a connection of its own, taken from a small
pool; a call that finds every connection held waits in the store's fair queue
and is ``GateRefused`` past ``gate_timeout_seconds``. Every store, pooled or
not, refuses a ``pool_size`` it cannot honour before it opens anything.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from jaren_jobs import GateRefused, Runtime, Store
from tests.harness import Harness

WAIT = 10.0  # generous bound for anything a test waits on; never reached when all is well


class Holder:
    """A thread that opens a transaction, enqueues in it, and holds it until told to end."""

    def __init__(self, store: Store, job_id: str) -> None:
        self.store = store
        self.job_id = job_id
        self.inside = threading.Event()
        self.look = threading.Event()
        self.looked = threading.Event()
        self.end = threading.Event()
        self.pid: int | None = None
        self.others: list[str] | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"holder-{job_id}", daemon=True)

    def start(self) -> Holder:
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            with self.store.transaction() as tx:
                tx.jobs.enqueue("held", id=self.job_id)
                self.pid = tx.execute("SELECT pg_backend_pid()").fetchone()[0]
                self.inside.set()
                while not self.end.is_set():
                    if self.look.is_set() and not self.looked.is_set():
                        self.others = sorted(
                            row[0]
                            for row in tx.execute(
                                "SELECT id FROM _jaren_jobs WHERE id <> %s", (self.job_id,)
                            ).fetchall()
                        )
                        self.looked.set()
                    self.end.wait(0.005)
        except BaseException as exc:
            self.error = exc
        finally:
            self.inside.set()
            self.looked.set()

    def finish(self) -> None:
        self.end.set()
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), f"holder {self.job_id} did not finish"
        if self.error is not None:
            raise self.error


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    """Wait for a condition another thread brings about (bounded; fails loudly)."""
    end = time.monotonic() + WAIT
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        pause.wait(0.002)


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


@pytest.mark.requires("pool")
def test_two_threads_hold_transactions_at_once_and_neither_waits(backend: Harness) -> None:
    store = backend.open(pool_size=2, gate_timeout_seconds=WAIT)
    first = Holder(store, "first").start()
    assert first.inside.wait(WAIT)
    # with one connection the second would queue behind the first until it ended;
    # here it gets in while the first is still open
    second = Holder(store, "second").start()
    assert second.inside.wait(WAIT)
    assert first.error is None
    assert second.error is None
    assert first.pid != second.pid  # two server sessions: two connections
    assert store._backend.db.gate.waiting() == 0  # type: ignore[attr-defined]
    # both open at once, and neither sees the other's uncommitted job
    for holder in (first, second):
        holder.look.set()
        assert holder.looked.wait(WAIT)
    assert first.others == []
    assert second.others == []
    first.finish()
    second.finish()
    # each committed alone
    assert {job.id for job in store.jobs.page()} == {"first", "second"}


@pytest.mark.requires("pool")
def test_a_thread_beyond_the_pool_waits_and_is_refused_past_the_gate_timeout(
    backend: Harness,
) -> None:
    store = backend.open(pool_size=2, gate_timeout_seconds=0.2)
    holders = [Holder(store, f"h{n}").start() for n in range(2)]
    for holder in holders:
        assert holder.inside.wait(WAIT)
    thread, box = in_thread(lambda: store.jobs.enqueue("late", id="late"))
    thread.join(WAIT)
    assert not thread.is_alive()
    error = box.get("error")
    assert isinstance(error, GateRefused), box
    assert error.details["reason"] == "timeout"
    assert "2 of its connections" in str(error)
    for holder in holders:
        holder.finish()
    # the refused call wrote nothing; the pool serves again once a connection is free
    assert store.jobs.get("late") is None
    store.jobs.enqueue("late", id="late")
    assert store.jobs.get("late") is not None


@pytest.mark.requires("pool")
def test_a_waiter_gets_the_first_connection_given_back(backend: Harness) -> None:
    store = backend.open(pool_size=2, gate_timeout_seconds=WAIT)
    holders = [Holder(store, f"h{n}").start() for n in range(2)]
    for holder in holders:
        assert holder.inside.wait(WAIT)
    gate = store._backend.db.gate  # type: ignore[attr-defined]
    thread, box = in_thread(lambda: store.jobs.enqueue("late", id="late"))
    wait_until(lambda: gate.waiting() == 1, "the call to queue: both connections are held")
    assert thread.is_alive(), box
    holders[0].finish()
    thread.join(WAIT)
    assert "error" not in box, box
    assert box["result"].id == "late"
    holders[1].finish()
    assert store._backend.db.size <= 2  # type: ignore[attr-defined]


@pytest.mark.requires("pool")
def test_a_thread_in_its_transaction_is_still_refused_a_root_call(backend: Harness) -> None:
    # a free connection elsewhere in the pool does not make store.jobs inside the
    # block a second, independent transaction: it is refused, as on one connection
    store = backend.open(pool_size=3)
    with store.transaction() as tx:
        tx.jobs.enqueue("k", id="inside")
        with pytest.raises(GateRefused) as info:
            store.jobs.enqueue("k", id="beside")
        assert info.value.details["reason"] == "reentrant"
    assert store.jobs.get("inside") is not None
    assert store.jobs.get("beside") is None


@pytest.mark.requires("pool")
def test_many_threads_share_a_small_pool_and_never_exceed_it(backend: Harness) -> None:
    store = backend.open(pool_size=3, gate_timeout_seconds=WAIT)
    threads = 8
    per_thread = 25
    start = threading.Barrier(threads)
    sizes: list[int] = []

    def work(n: int) -> None:
        start.wait(WAIT)
        for i in range(per_thread):
            with store.transaction() as tx:
                tx.jobs.enqueue("k", id=f"{n}-{i}")
                sizes.append(store._backend.db.size)  # type: ignore[attr-defined]
            store.jobs.get(f"{n}-{i}")

    runners = [in_thread(lambda n=n: work(n)) for n in range(threads)]
    for thread, box in runners:
        thread.join(WAIT * 3)
        assert not thread.is_alive()
        assert "error" not in box, box
    assert store.jobs.counts().pending == threads * per_thread
    assert max(sizes) <= 3


def test_a_pool_size_a_store_cannot_honour_is_refused_before_it_opens(
    backend: Harness, runtime: Runtime
) -> None:
    with pytest.raises(TypeError, match="pool_size must be an int"):
        backend.open(runtime=runtime, pool_size="4")
    with pytest.raises(TypeError, match="pool_size must be an int"):
        backend.open(runtime=runtime, pool_size=True)
    with pytest.raises(ValueError, match="pool_size must be between 1 and"):
        backend.open(runtime=runtime, pool_size=0)
    if "pool" in backend.capabilities:
        store = backend.open(runtime=runtime, pool_size=1)
        assert store._backend.db.gate.capacity == 1  # type: ignore[attr-defined]
        return
    with pytest.raises(ValueError, match="only a store opened from a PostgreSQL URL has a pool"):
        backend.open(runtime=runtime, pool_size=2)
    store = backend.open(runtime=runtime, pool_size=1)  # one connection: what it has
    store.jobs.enqueue("k", id="one")
    assert store.jobs.get("one") is not None


# it wraps the harness's sync store in an AsyncStore itself: the async harness's
# store is already one (its bridge), and its other pool tests run through it
@pytest.mark.requires("pool", "sync-api")
def test_two_tasks_transactions_run_at_once_on_a_pooled_async_store(backend: Harness) -> None:
    import asyncio

    from jaren_jobs import AsyncStore

    astore = AsyncStore(backend.open(pool_size=2, gate_timeout_seconds=WAIT))

    async def main() -> list[int]:
        inside = {"a": asyncio.Event(), "b": asyncio.Event()}

        async def hold(job_id: str, other: str) -> int:
            async with astore.transaction() as tx:
                await tx.jobs.enqueue("k", id=job_id)
                rows = await tx.execute("SELECT pg_backend_pid()")
                inside[job_id].set()
                # each task waits for the other INSIDE its transaction: one
                # connection between them would never let the second one in
                await asyncio.wait_for(inside[other].wait(), WAIT)
                return int(rows.fetchone()[0])

        return list(await asyncio.gather(hold("a", "b"), hold("b", "a")))

    pids = asyncio.run(asyncio.wait_for(main(), WAIT * 3))
    assert len(set(pids)) == 2
    assert {job.id for job in astore.store.jobs.page()} == {"a", "b"}
