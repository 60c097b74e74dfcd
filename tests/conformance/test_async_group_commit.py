"""Concurrent root enqueues of an ``AsyncStore`` share commits (``GroupCommit``), and each
caller still gets exactly the answer it would have had alone."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from jaren_jobs import AsyncStore, DuplicateJob, Job, Store
from jaren_jobs.aio.runner import GroupCommit

WAIT = 30.0


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, WAIT))


def test_concurrent_enqueues_each_keep_their_own_answer(astore: AsyncStore, store: Store) -> None:
    store.jobs.enqueue("k", id="taken")
    with pytest.raises(Exception) as alone:  # what a payload JSON cannot carry raises alone
        store.jobs.enqueue("k", {"bad": object()})
    groups: list[int] = []
    grouped = GroupCommit.run

    def counted(self: GroupCommit, items: list[tuple[Any, ...]]) -> None:
        groups.append(len(items))
        grouped(self, items)

    ids = [f"j{n:02}" for n in range(24)]
    ids[7] = ids[15] = "taken"

    async def main() -> list[Any]:
        calls = [astore.jobs.enqueue("k", {"n": n}, id=i) for n, i in enumerate(ids)]
        calls.append(astore.jobs.enqueue("k", {"bad": object()}, id="unwritable"))
        return await asyncio.gather(*calls, return_exceptions=True)

    GroupCommit.run = counted  # type: ignore[method-assign]
    try:
        results = run(main())
    finally:
        GroupCommit.run = grouped  # type: ignore[method-assign]
    if astore.jobs._enqueues is not None:  # the store's threads (SQLite, an app's connection)
        assert max(groups) > 1  # queued together, they shared a transaction
    else:  # async-native PostgreSQL: each call awaits its own pooled connection, never grouped
        assert groups == []
    for n, (job_id, result) in enumerate(zip(ids, results, strict=False)):
        if job_id == "taken":
            assert isinstance(result, DuplicateJob), result  # its savepoint undone, alone
        else:
            assert isinstance(result, Job), result
            assert (result.id, result.payload, result.state) == (job_id, {"n": n}, "pending")
    assert type(results[-1]) is type(alone.value)
    assert store.jobs.get("unwritable") is None
    assert store.jobs.counts().pending == 23  # "taken" and the 22 new ones
    for job_id in ids:
        stored = store.jobs.get(job_id)
        assert stored is not None


def test_an_enqueue_inside_the_tasks_own_transaction_is_not_grouped(
    astore: AsyncStore, store: Store
) -> None:
    async def main() -> None:
        async with astore.transaction() as tx:
            both = await asyncio.gather(
                tx.jobs.enqueue("k", id="in-tx-1"), tx.jobs.enqueue("k", id="in-tx-2")
            )
            assert [job.id for job in both] == ["in-tx-1", "in-tx-2"]
            raise_it = RuntimeError("roll back")
            raise raise_it

    with pytest.raises(RuntimeError, match="roll back"):
        run(main())
    assert store.jobs.get("in-tx-1") is None  # rolled back with the task's transaction
    assert store.jobs.get("in-tx-2") is None
