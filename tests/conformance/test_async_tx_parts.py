"""Gathered parts of one ``async with store.transaction()`` block (SPEC §11).

Tasks a block makes may use its ``tx``: each ``tx.jobs`` call, each statement
and each nested block runs whole, one after another, so one part's refusal or
rollback never undoes another part's acknowledged write — on both databases
(issue 26, items 1, 2, 11 and 13: PostgreSQL shared one savepoint name between
gathered calls, and one name per depth between gathered nested blocks).
Interleavings are forced with ``asyncio.Event``, never hoped for.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from jaren_jobs import (
    AsyncStore,
    DuplicateJob,
    NewJob,
    Store,
    TransactionEnded,
)
from tests.conformance.test_async_store import make_orders, order_ids, run
from tests.harness import Harness


def test_a_refused_gathered_enqueue_undoes_no_sibling(astore: AsyncStore, store: Store) -> None:
    store.jobs.enqueue("k", id="dup")

    async def main() -> list[Any]:
        async with astore.transaction() as tx:
            return await asyncio.gather(
                tx.jobs.enqueue("k", id="a1"),
                tx.jobs.enqueue("k", id="dup"),
                tx.jobs.enqueue("k", id="a2"),
                return_exceptions=True,
            )

    first, refused, second = run(main())
    assert isinstance(refused, DuplicateJob)
    assert (first.id, second.id) == ("a1", "a2")
    assert store.jobs.get("a1") is not None
    assert store.jobs.get("a2") is not None


def test_the_applications_write_and_its_job_survive_a_gathered_refusal(
    astore: AsyncStore, store: Store, backend: Harness
) -> None:
    insert = make_orders(store, backend)
    store.jobs.enqueue("ship", id="dup")

    async def main() -> None:
        async with astore.transaction() as tx:

            async def order() -> None:
                await tx.execute(insert, (1, "book"))
                await tx.jobs.enqueue("ship", {"order": 1}, id="ship-1")

            results = await asyncio.gather(
                order(),
                tx.jobs.enqueue("ship", id="dup"),
                tx.jobs.enqueue_many([NewJob("ship", id="m1"), NewJob("ship", id="dup")]),
                return_exceptions=True,
            )
            assert results[0] is None
            assert isinstance(results[1], DuplicateJob)
            assert isinstance(results[2], DuplicateJob)  # all or nothing: m1 neither

    run(main())
    assert order_ids(backend) == [1]
    assert store.jobs.get("ship-1") is not None
    assert store.jobs.get("m1") is None


def test_a_requeue_refused_by_a_unique_key_undoes_no_sibling(
    astore: AsyncStore, store: Store
) -> None:
    # a cancelled job whose key another job holds now: requeue meets the unique index
    old = store.jobs.enqueue("k", id="old", unique_key="key")
    assert store.jobs.cancel(old.id)
    store.jobs.enqueue("k", id="holder", unique_key="key")

    async def main() -> list[Any]:
        async with astore.transaction() as tx:
            return await asyncio.gather(
                tx.jobs.enqueue("k", id="b1"),
                tx.jobs.requeue("old"),
                tx.jobs.enqueue("k", id="b2"),
                return_exceptions=True,
            )

    first, refused, second = run(main())
    assert isinstance(refused, DuplicateJob)
    assert (first.id, second.id) == ("b1", "b2")
    assert store.jobs.get("b1") is not None
    assert store.jobs.get("b2") is not None
    assert store.jobs.get("old").state == "cancelled"  # type: ignore[union-attr]


def test_gathered_nested_blocks_run_one_after_another_and_one_rollback_undoes_only_itself(
    astore: AsyncStore, store: Store, backend: Harness
) -> None:
    insert = make_orders(store, backend)

    async def main() -> list[Any]:
        async with astore.transaction() as tx:
            inside = asyncio.Event()

            async def part(n: int, fail: bool) -> int:
                async with astore.transaction() as nested:
                    assert nested.depth == 1
                    await nested.execute(insert, (n, f"item-{n}"))
                    await nested.jobs.enqueue("ship", {"order": n}, id=f"ship-{n}")
                    if n == 1:
                        inside.set()
                        # the others wait for this block to end: they never run inside it
                        await asyncio.sleep(0)
                    if fail:
                        raise RuntimeError(f"part {n} failed")
                return n

            async def second() -> int:
                await inside.wait()  # starts while part 1's block is open
                return await part(2, fail=True)

            results = await asyncio.gather(
                part(1, fail=False), second(), part(3, fail=False), return_exceptions=True
            )
            await tx.jobs.enqueue("after", id="after")
            return results

    results = run(main())
    assert results[0] == 1
    assert isinstance(results[1], RuntimeError)
    assert results[2] == 3
    assert order_ids(backend) == [1, 3]
    assert store.jobs.get("ship-1") is not None
    assert store.jobs.get("ship-2") is None
    assert store.jobs.get("ship-3") is not None
    assert store.jobs.get("after") is not None


def test_a_nested_block_in_a_gathered_task_holds_back_its_siblings_calls(
    astore: AsyncStore, store: Store, backend: Harness
) -> None:
    # a sibling's write made while a nested block is open would land inside its
    # savepoint, and go with its rollback
    insert = make_orders(store, backend)

    async def main() -> None:
        async with astore.transaction() as tx:
            opened = asyncio.Event()

            async def failing_part() -> None:
                async with astore.transaction() as nested:
                    await nested.execute(insert, (1, "lost"))
                    opened.set()
                    for _ in range(5):
                        await asyncio.sleep(0)  # the sibling is queued by now
                    raise RuntimeError("rolled back")

            async def sibling() -> None:
                await opened.wait()
                await tx.execute(insert, (2, "kept"))
                await tx.jobs.enqueue("k", id="kept")

            results = await asyncio.gather(failing_part(), sibling(), return_exceptions=True)
            assert isinstance(results[0], RuntimeError)
            assert results[1] is None

    run(main())
    assert order_ids(backend) == [2]
    assert store.jobs.get("kept") is not None


def test_a_tx_call_awaited_after_its_block_ended_is_refused_and_writes_nothing(
    astore: AsyncStore, store: Store
) -> None:
    async def main() -> None:
        release = asyncio.Event()

        async def late(tx: Any) -> Any:
            await release.wait()
            return await tx.jobs.enqueue("k", id="late")

        async with astore.transaction() as tx:
            task = asyncio.ensure_future(late(tx))
            await tx.jobs.enqueue("k", id="inside")
        release.set()
        with pytest.raises(TransactionEnded) as caught:
            await task
        assert caught.value.code == "JD2094"
        with pytest.raises(TransactionEnded):
            await tx.execute("SELECT 1")

    run(main())
    assert store.jobs.get("inside") is not None
    assert store.jobs.get("late") is None


def test_a_call_in_flight_when_the_block_ends_finishes_before_the_commit(
    astore: AsyncStore, store: Store
) -> None:
    # never a failure reported for a write that committed, nor a write after the commit
    async def main() -> Any:
        started = asyncio.Event()

        async with astore.transaction() as tx:

            async def part() -> Any:
                started.set()
                return await tx.jobs.enqueue("k", id="in-flight")

            task = asyncio.ensure_future(part())
            await started.wait()
        return await task

    job = run(main())
    assert job.id == "in-flight"
    assert store.jobs.get("in-flight") is not None
