"""The asyncio API (SPEC §11) on every backend: the same calls, awaited; transactions per task.

Each test drives its own event loop with ``asyncio.run``; tasks are ordered
with ``asyncio.Event`` and by watching the store's gate, never by sleeping.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import jaren_jobs
from jaren_jobs import (
    AsyncStore,
    DuplicateJob,
    GateRefused,
    Job,
    LeaseSuperseded,
    NewJob,
    Runtime,
    StorageError,
    Store,
    StoreClosed,
)
from tests.conftest import FakeClock
from tests.harness import Harness

WAIT = 10.0


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, WAIT * 3))


def make_orders(store: Store, backend: Harness) -> str:
    with store.transaction() as tx:
        tx.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)")
    return backend.app_sql("INSERT INTO orders (id, item) VALUES (?, ?)")


def order_ids(backend: Harness) -> list[int]:
    return [r[0] for r in backend.query("SELECT id FROM orders ORDER BY id")]


def test_every_call_answers_as_the_sync_api_does(
    astore: AsyncStore, store: Store, clock: FakeClock
) -> None:
    async def main() -> None:
        jobs = astore.jobs
        made = await jobs.enqueue("k", {"n": 1}, id="a", priority=5)
        assert isinstance(made, Job)
        assert made == store.jobs.get("a")
        with pytest.raises(DuplicateJob):
            await jobs.enqueue("k", id="a")
        with pytest.raises(TypeError):
            await jobs.enqueue("k", {1, 2})  # a set is not JSON: refused, nothing written
        many = await jobs.enqueue_many([NewJob("k", id="b"), NewJob("k", id="c")])
        assert [job.id for job in many] == ["b", "c"]
        assert (await jobs.get("b")) == store.jobs.get("b")
        assert (await jobs.counts()).pending == 3

        claimed = await jobs.claim(["k"], owner="w")
        assert claimed is not None
        assert claimed.id == "a"  # highest priority first
        renewed = await jobs.renew(claimed.lease, lease_seconds=60)
        with pytest.raises(LeaseSuperseded):
            await jobs.complete(claimed.lease, "stale")  # the renewal superseded it
        assert await jobs.complete(renewed, {"ok": True})
        assert (await jobs.get("a")).result == {"ok": True}  # type: ignore[union-attr]

        batch = await jobs.claim_many(["k"], owner="w", limit=5)
        assert [job.id for job in batch] == ["b", "c"]
        assert await jobs.fail(batch[0].lease, RuntimeError("boom"), retry=False)
        assert await jobs.cancel("c", lease=batch[1].lease)
        assert await jobs.requeue("b")
        assert (await jobs.get("b")).state == "pending"  # type: ignore[union-attr]

        seen = [job.id async for job in jobs.page(limit=10)]
        assert seen == ["a", "b", "c"]
        async with jobs.page(state="done") as cursor:
            assert [job.id async for job in cursor] == ["a"]

        clock.advance(3600)
        swept = await jobs.sweep(settled_before=_now(store))
        assert swept == 2  # a (done) and c (cancelled)

        again = await jobs.claim(["k"], owner="w")
        assert again is not None
        checkpoints = jobs.checkpoints_for(again)
        assert checkpoints.job_id == "b"
        assert await checkpoints.load("b") is None
        await checkpoints.save("b", "step-1", [1, 2])
        assert await checkpoints.load("b") == {"step-1": [1, 2]}
        assert await checkpoints.complete("b", "all done")
        assert (await jobs.get("b")).state == "done"  # type: ignore[union-attr]

    run(main())


def _now(store: Store) -> datetime:
    return datetime.fromtimestamp(store.runtime.now(), timezone.utc) + timedelta(seconds=1)


def test_open_async_store_is_awaitable_and_an_async_context_manager(
    backend: Harness, runtime: Runtime
) -> None:
    def where() -> dict[str, Any]:
        # as the backend's user opens it: a path or URL, or a connection of their own
        connect = getattr(backend, "connect", None)
        if connect is not None:
            return {"connection": connect()}
        return {"path": getattr(backend, "url", None) or backend.db_path}

    opened: dict[str, Any] = {}

    async def main() -> None:
        async with jaren_jobs.open_async_store(**where(), runtime=runtime) as store:
            opened["backend"] = store.backend
            await store.jobs.enqueue("k", id="in-context")
        assert store.closed
        again = await jaren_jobs.open_async_store(**where(), runtime=runtime)
        try:
            assert (await again.jobs.get("in-context")) is not None
        finally:
            await again.close()
        assert again.closed

    run(main())
    assert opened["backend"] in ("sqlite", "postgres")
    assert backend.job_ids() == ["in-context"]


def test_a_transaction_commits_or_rolls_back_with_the_applications_writes(
    astore: AsyncStore, store: Store, backend: Harness
) -> None:
    insert = make_orders(store, backend)

    async def main() -> None:
        async with astore.transaction() as tx:
            await tx.execute(insert, (1, "book"))
            await tx.jobs.enqueue("ship", {"order": 1}, id="ship-1")
            assert (await tx.jobs.get("ship-1")) is not None  # visible inside
            assert backend.job_ids() == []  # not outside, until the commit

        async def declined() -> None:
            async with astore.transaction() as tx:
                await tx.execute(insert, (2, "pen"))
                await tx.jobs.enqueue("ship", {"order": 2}, id="ship-2")
                raise RuntimeError("payment declined")

        with pytest.raises(RuntimeError, match="declined"):
            await declined()
        async with astore.transaction() as tx:
            rows = await tx.execute(backend.app_sql("SELECT id, item FROM orders ORDER BY id"))
            assert rows.fetchall() == [(1, "book")]

    run(main())
    assert backend.job_ids() == ["ship-1"]
    assert order_ids(backend) == [1]


def test_nested_transactions_of_one_task_are_savepoints(
    astore: AsyncStore, backend: Harness
) -> None:
    async def main() -> None:
        async with astore.transaction() as outer:
            await outer.jobs.enqueue("k", id="outer-job")

            async def inner_step() -> None:
                async with astore.transaction() as inner:
                    assert inner.depth == 1
                    await inner.jobs.enqueue("k", id="inner-job")
                    raise ValueError("inner failure")

            with pytest.raises(ValueError, match="inner"):
                await inner_step()
            async with astore.transaction() as second:
                await second.jobs.enqueue("k", id="second-job")

    run(main())
    assert backend.job_ids() == ["outer-job", "second-job"]


def test_two_tasks_transactions_never_mix_and_each_ends_alone(
    astore: AsyncStore, store: Store, backend: Harness
) -> None:
    insert = make_orders(store, backend)

    async def main() -> None:
        first_wrote, second_started = asyncio.Event(), asyncio.Event()

        async def first() -> None:
            async with astore.transaction() as tx:
                await tx.execute(insert, (1, "first's"))
                await tx.jobs.enqueue("ship", id="first-job")
                first_wrote.set()
                await second_started.wait()  # an await inside the transaction
                raise RuntimeError("first's payment declined")

        async def second() -> None:
            await first_wrote.wait()
            second_started.set()
            # on SQLite this waits (off the loop) for first's transaction to end
            async with astore.transaction() as tx:
                await tx.execute(insert, (2, "second's"))
                await tx.jobs.enqueue("ship", id="second-job")
                # it never sees first's rows: uncommitted, then rolled back
                assert (await tx.jobs.get("first-job")) is None
                rows = await tx.execute(backend.app_sql("SELECT id FROM orders"))
                assert rows.fetchall() == [(2,)]

        results = await asyncio.gather(first(), second(), return_exceptions=True)
        assert isinstance(results[0], RuntimeError)
        assert results[1] is None

    run(main())
    assert backend.job_ids() == ["second-job"]
    assert order_ids(backend) == [2]


def test_a_task_cancelled_inside_a_transaction_leaves_nothing(
    astore: AsyncStore, store: Store, backend: Harness
) -> None:
    insert = make_orders(store, backend)

    async def main() -> None:
        inside = asyncio.Event()

        async def checkout() -> None:
            async with astore.transaction() as tx:
                await tx.execute(insert, (1, "book"))
                await tx.jobs.enqueue("ship", id="ship-1")
                inside.set()
                await asyncio.Event().wait()  # never set: only the cancellation ends it

        task = asyncio.create_task(checkout())
        await inside.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # what it held is released: the next transaction commits at once
        async with astore.transaction() as tx:
            await tx.jobs.enqueue("k", id="after")

    run(main())
    assert backend.job_ids() == ["after"]
    assert order_ids(backend) == []


@pytest.mark.requires("gate")
def test_a_call_waiting_for_the_store_never_blocks_the_loop(
    astore: AsyncStore, store: Store
) -> None:
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store.transaction():
            holding.set()
            assert release.wait(WAIT)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(WAIT)
    ticks: list[int] = []

    async def main() -> None:
        enqueue = asyncio.create_task(astore.jobs.enqueue("k", id="waited"))
        # the loop goes on while the enqueue waits for the other thread's commit
        for n in range(20):
            await asyncio.sleep(0)
            ticks.append(n)
        assert not enqueue.done()
        release.set()
        job = await enqueue
        assert job.id == "waited"

    try:
        run(main())
    finally:
        release.set()
        holder.join(WAIT)
    assert len(ticks) == 20


def test_a_cursor_pulls_off_the_loop_and_closes_once(astore: AsyncStore) -> None:
    async def main() -> None:
        await astore.jobs.enqueue_many([NewJob("k", id=f"j{n}") for n in range(5)])
        cursor = astore.jobs.page(limit=2)
        first = await cursor.__anext__()
        assert first.id == "j0"
        await cursor.close()
        assert cursor.settled
        with pytest.raises(StopAsyncIteration):
            await cursor.__anext__()
        with pytest.raises(ValueError):
            astore.jobs.page(state="no-such-state")  # a bad filter raises at once

    run(main())


def test_a_transaction_is_used_only_by_the_task_that_opened_it(
    astore: AsyncStore, backend: Harness
) -> None:
    async def main() -> None:
        handed: asyncio.Event = asyncio.Event()
        box: list[Any] = []

        async def stray() -> None:
            await handed.wait()
            tx = box[0]
            # another task is refused, never joins it (its write would commit with it)
            with pytest.raises(StorageError, match="task that opened it"):
                await tx.jobs.enqueue("k", id="stray")
            with pytest.raises(StorageError, match="task that opened it"):
                await tx.execute(backend.app_sql("SELECT 1"))

        other = asyncio.create_task(stray())  # made before, outside the transaction
        async with astore.transaction() as tx:
            await tx.jobs.enqueue("k", id="mine")
            box.append(tx)
            handed.set()
            await other
            # the tasks this task makes inside the block are its own (before Python 3.12,
            # wait_for makes one per call; gather makes one per coroutine)
            await asyncio.wait_for(tx.jobs.enqueue("k", id="child"), WAIT)
            mine, _ = await asyncio.gather(
                tx.jobs.get("mine"), tx.execute(backend.app_sql("SELECT 1"))
            )
            assert mine is not None
        # once it ended, any task is told so (as the sync API says after the block)
        with pytest.raises(StorageError, match="ended"):
            await asyncio.create_task(tx.jobs.get("mine"))

    run(main())
    assert backend.job_ids() == ["child", "mine"]


@pytest.mark.requires("gate")
def test_a_root_call_inside_the_tasks_own_transaction_is_refused_at_once(
    astore: AsyncStore, backend: Harness
) -> None:
    async def main() -> None:
        async with astore.transaction() as tx:
            await tx.jobs.enqueue("k", id="in-tx")
            # store.jobs would wait for the gate this task's transaction holds: refused
            # at once as the sync API's same-thread call is, not after the gate timeout
            with pytest.raises(GateRefused, match=r"tx\.jobs") as refused:
                await asyncio.wait_for(astore.jobs.enqueue("k", id="root"), WAIT)
            assert refused.value.details["reason"] == "reentrant"
            with pytest.raises(GateRefused) as closing:
                await asyncio.wait_for(astore.close(), WAIT)
            assert closing.value.details["reason"] == "reentrant"
            assert not astore.closed
        # the refused close left the store open and usable
        assert (await astore.jobs.get("in-tx")) is not None
        await astore.close()
        assert astore.closed
        assert await astore.close() == []  # idempotent
        with pytest.raises(StoreClosed):
            await astore.jobs.get("in-tx")  # the store's own refusal, threads gone or not

    run(main())
    assert backend.job_ids() == ["in-tx"]
