"""A trickle of jobs: each comes alone and finds the worker idle (the web app's case).

A loop whose queue ran out asks for one more job in its last settlement's
transaction; when that top-up finds nothing, it was the loop's poll, and the
loop goes idle without claiming again. A wake that came meanwhile still makes it
claim at once, and a settlement that leaves its job claimable now wakes the idle
loops. An AsyncWorker writes a lone settlement and its loop's top-up in one
transaction. Thread worker and AsyncWorker, every backend.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from jaren_jobs import AsyncJobContext, AsyncStore, JobContext, Outcome, Store
from tests.conformance.test_async_worker import collecting, run
from tests.conformance.test_worker import Counter, Outcomes
from tests.conformance.test_worker_batching import noop


def counting_claims(worker: Any) -> list[int]:
    """The limits of the worker's own claims (each loop's first of a step), as made."""
    made: list[int] = []
    real = worker.claims.claim

    def claim(limit: int) -> Any:
        made.append(limit)
        return real(limit)

    worker.claims.claim = claim
    return made


def test_a_loop_whose_last_top_up_found_nothing_sleeps_without_claiming_again(
    store: Store,
) -> None:
    """The top-up that ran a loop's queue dry was a claim that found nothing: the loop
    goes idle at once, as after an empty poll, instead of claiming again to find
    nothing. An enqueue still wakes it."""
    outcomes, idle = Outcomes(), Counter()
    worker = store.jobs.create_worker(
        {"k": noop}, concurrency=1, poll_seconds=3600, on_outcome=outcomes, on_idle=idle
    )
    made = counting_claims(worker)
    with worker:
        assert idle.wait_for(1)  # its first claim found nothing
        for n in (1, 2):
            store.jobs.enqueue("k", n)
            assert [e.outcome for e in outcomes.wait_for(n)] == ["completed"] * n
            assert idle.wait_for(n + 1)
    # the first poll, then one claim per wake-up: none after a run (there were two each)
    assert made == [1, 1, 1]


def test_a_retry_due_at_once_wakes_the_idle_loop(store: Store) -> None:
    """A failure whose retry's backoff is under a millisecond makes its job claimable
    now (run_at is in ms): this process's idle loops are woken for it, as for an
    enqueue (a loop whose top-up found nothing would otherwise wait for its next poll,
    an hour here; the clock is the fake one, so nothing else falls due)."""
    outcomes, tries = Outcomes(), Counter()

    def once(payload: Any, ctx: JobContext) -> Any:
        tries()
        if tries.count == 1:
            raise RuntimeError("the first attempt fails")
        return payload

    worker = store.jobs.create_worker(
        {"k": once},
        concurrency=1,
        poll_seconds=3600,
        backoff_base_seconds=1e-6,
        on_outcome=outcomes,
    )
    with worker:
        job = store.jobs.enqueue("k", 1)
        events = outcomes.wait_for(2)
    assert [(e.job_id, e.outcome, e.attempt) for e in events] == [
        (job.id, "failed", 1),
        (job.id, "completed", 2),
    ]


def test_a_wake_during_a_queue_run_that_ran_dry_is_not_slept_through(store: Store) -> None:
    # a loop whose queue run ended on a top-up that found nothing goes idle without
    # claiming again; an enqueue committed while that run went on must still be claimed
    outcomes = Outcomes()
    worker = store.jobs.create_worker(
        {"k": lambda p, ctx: p}, concurrency=1, poll_seconds=3600, on_outcome=outcomes
    )
    loops = worker.loops
    real_run_queue = loops.run_queue
    later: list[str] = []

    def run_queue(jobs: list[Any]) -> bool:
        dry = real_run_queue(jobs)
        if not later:
            # lands after the run's last top-up found nothing, before the loop sleeps
            later.append(store.jobs.enqueue("k", 2).id)
        return dry

    loops.run_queue = run_queue  # type: ignore[method-assign]
    with worker:
        first = store.jobs.enqueue("k", 1)
        # with a one-hour poll, only that enqueue's wake can bring the second job
        events = outcomes.wait_for(2)
    assert [(e.job_id, e.outcome) for e in events] == [
        (first.id, "completed"),
        (later[0], "completed"),
    ]


def test_an_async_queue_run_whose_last_top_up_found_nothing_goes_idle_at_once(
    astore: AsyncStore,
) -> None:
    """As the thread worker's loop (above): a queue run on the event loop
    that ended on a top-up that found nothing leaves its loop idle, with no claim made
    to find nothing again; an enqueue still wakes it."""
    outcomes: list[Outcome] = []
    made: list[int] = []

    async def main() -> None:
        async def handler(payload: Any, ctx: AsyncJobContext) -> Any:
            return payload

        finished, _ = collecting(outcomes, 2)
        idle = Counter()
        worker = astore.jobs.create_worker(
            {"k": handler}, concurrency=1, poll_seconds=3600, on_outcome=finished, on_idle=idle
        )
        claims = counting_claims(worker.worker)
        async with worker:
            assert await asyncio.to_thread(idle.wait_for, 1)
            for n in (1, 2):
                await astore.jobs.enqueue("k", n)
                assert await asyncio.to_thread(idle.wait_for, n + 1)
        made.extend(claims)

    run(main())
    assert [o.outcome for o in outcomes] == ["completed", "completed"]
    assert made == [1, 1, 1]


def test_on_a_trickle_an_async_workers_settlement_and_top_up_share_one_transaction(
    astore: AsyncStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs that come one at a time, each found idle: a settling write that has a job's
    settlement and its loop's top-up (which finds nothing) writes them in one
    transaction, on every backend; a top-up is written apart only from a burst."""
    from jaren_jobs.worker.settler import Settler

    cycles: list[tuple[int, int, int]] = []  # (entries, top-ups, transactions) per write
    real_cycle, real_settle = Settler._settle_cycle, Settler.settle_entries
    local = threading.local()

    def settle_cycle(self: Settler, entries: Any, refills: Any, deferred: Any) -> None:
        local.transactions = 0
        shape = (len(entries), len(refills))
        real_cycle(self, entries, refills, deferred)
        cycles.append((*shape, local.transactions))

    def settle_entries(self: Settler, *args: Any, **kwargs: Any) -> None:
        local.transactions = getattr(local, "transactions", 0) + 1
        real_settle(self, *args, **kwargs)

    monkeypatch.setattr(Settler, "_settle_cycle", settle_cycle)
    monkeypatch.setattr(Settler, "settle_entries", settle_entries)
    outcomes: list[Outcome] = []
    jobs = 20

    async def main() -> None:
        async def handler(payload: Any, ctx: AsyncJobContext) -> Any:
            return payload

        finished, _ = collecting(outcomes, jobs)
        idle = Counter()
        worker = astore.jobs.create_worker(
            {"k": handler}, concurrency=1, poll_seconds=3600, on_outcome=finished, on_idle=idle
        )
        async with worker:
            assert await asyncio.to_thread(idle.wait_for, 1)
            for n in range(1, jobs + 1):
                await astore.jobs.enqueue("k", n)
                assert await asyncio.to_thread(idle.wait_for, n + 1)

    run(main())
    assert [o.outcome for o in outcomes] == ["completed"] * jobs
    both = [transactions for entries, refills, transactions in cycles if entries and refills]
    assert both, cycles  # a settlement and a top-up met in one write (nearly every job)
    assert set(both) == {1}, cycles
