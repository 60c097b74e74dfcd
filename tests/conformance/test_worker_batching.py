"""The worker's batching: a busy loop leases and settles in batches; stopping claims nothing.

A loop leases a batch in one transaction: one job at first, doubling after
each batch that ran within its time budget, up to as many jobs as the
measured handler time lets the loop start within a short horizon. Each
returned attempt goes to the worker's settling thread, which commits
whatever the loops posted while it wrote last, in one transaction; after
the last job, the idle check answers the next claim without any transaction.
A worker that is stopping settles what ran and hands back, unstarted and
without spending an attempt, the jobs it had leased but not started.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from jaren_jobs import AsyncJobContext, AsyncStore, Job, JobContext, NewJob, Outcome, Store
from tests.conformance.test_async_worker import collecting, run
from tests.conformance.test_worker import WAIT, Outcomes, job_state
from tests.harness import Harness


def test_a_stopping_worker_settles_without_leasing_another_job(store: Store) -> None:
    first = store.jobs.enqueue("k", "first")
    second = store.jobs.enqueue("k", "second")
    started = threading.Event()
    outcomes = Outcomes()

    def handler(payload: Any, ctx: JobContext) -> Any:
        started.set()
        assert ctx.signal.wait(WAIT)  # returns once stop() has begun
        return payload

    worker = store.jobs.create_worker({"k": handler}, on_outcome=outcomes)
    worker.start()
    assert started.wait(WAIT)
    result = worker.stop(grace_seconds=WAIT)
    assert result.drained is True
    events: list[Outcome] = outcomes.wait_for(1)
    assert [(e.job_id, e.outcome) for e in events] == [(first.id, "completed")]
    assert worker.stats().claims == 1
    left = store.jobs.get(second.id)
    assert left is not None
    assert (left.state, left.attempts) == ("pending", 0)  # never leased


def wait_until(condition: Callable[[], bool], timeout: float = WAIT) -> bool:
    """Poll ``condition`` (a worker state with no event of its own) until it holds."""
    end = time.monotonic() + timeout
    pause = threading.Event()  # never set: a short bounded wait between looks
    while not condition():
        if time.monotonic() > end:
            return False
        pause.wait(0.002)
    return True


def leased_ahead(worker: Any) -> bool:
    """Whether the worker holds a lease for a job it has not started.

    Read in one snapshot under the worker's lock: comparing ``leases()`` with a later
    ``stats().in_flight`` would count an attempt that ended between the two reads.
    """
    claims = worker.claims
    with worker.tracker.lock:
        return bool(claims.held_leases())


def fast_then(block_at: int, gate: threading.Event, reached: threading.Event) -> Any:
    """A handler: instant, except that job number ``block_at`` waits for ``gate``."""

    def handler(payload: Any, ctx: JobContext) -> Any:
        if payload == block_at:
            reached.set()
            assert gate.wait(WAIT)
        return payload

    return handler


def test_stop_hands_back_the_leased_jobs_a_loop_had_not_started(store: Store) -> None:
    count = 200
    store.jobs.enqueue_many([NewJob("k", n) for n in range(count)])
    reached = threading.Event()
    outcomes = Outcomes()

    def handler(payload: Any, ctx: JobContext) -> Any:
        if payload == 100:
            reached.set()
            # return only once stop() has begun: released any earlier, the loop
            # would run its leased-ahead jobs before the stop reached it
            assert ctx.signal.wait(WAIT)
        return payload

    worker = store.jobs.create_worker({"k": handler}, poll_seconds=3600, on_outcome=outcomes)
    worker.start()
    try:
        assert reached.wait(WAIT)
        # the loop tops its queue up while job 100 runs: wait for that lease
        assert wait_until(lambda: leased_ahead(worker))
        held = worker.leases()
        in_flight = worker.stats().in_flight
    finally:
        result = worker.stop(grace_seconds=WAIT)
    assert result.drained is True
    # started attempts without an outcome yet (the batch settles together),
    # and beyond them the batch's leases not started yet: all are held
    assert in_flight >= 1
    assert len(held) > in_flight
    events = outcomes.events
    assert all(e.outcome == "completed" for e in events)
    ran = {e.job_id for e in events}
    assert len(ran) == worker.stats().claims == worker.stats().completions
    rows = [job for job in store.jobs.page(limit=1000) if isinstance(job, Job)]
    assert len(rows) == count
    for job in rows:
        if job.id in ran:
            assert (job.state, job.attempts) == ("done", 1)
        else:
            # handed back: claimable at once, and no attempt spent on it
            assert (job.state, job.attempts, job.lease_owner) == ("pending", 0, None)
    handed_back = [job for job in rows if job.id not in ran and job.lease_generation > 0]
    assert handed_back, "the stop released nothing: the batch was not prefetched"
    again = store.jobs.claim(["k"], owner="next")
    assert again is not None
    assert again.attempts == 1


def test_a_slow_job_in_a_batch_hands_the_rest_back(store: Store) -> None:
    count = 150
    store.jobs.enqueue_many([NewJob("k", n) for n in range(count)])
    slow = 100
    seen: list[int] = []

    def handler(payload: Any, ctx: JobContext) -> Any:
        seen.append(payload)
        if payload == slow:
            # far longer than the batch's time budget (4 x 20 ms)
            assert not ctx.signal.wait(0.3)
        return payload

    outcomes = Outcomes()
    worker = store.jobs.create_worker({"k": handler}, poll_seconds=3600, on_outcome=outcomes)
    with worker:
        events = outcomes.wait_for(count)
    assert sorted(seen) == list(range(count))  # each ran once
    assert {e.outcome for e in events} == {"completed"}
    rows = [job for job in store.jobs.page(limit=1000) if isinstance(job, Job)]
    assert all((job.state, job.attempts) == ("done", 1) for job in rows)
    # the jobs after the slow one were leased with it, handed back, and leased
    # again: a generation moved on, an attempt did not
    assert any(job.lease_generation == 2 for job in rows)


def test_jobs_before_a_slow_one_settle_while_it_runs(store: Store) -> None:
    count = 150
    jobs = store.jobs.enqueue_many([NewJob("k", n) for n in range(count)])
    gate, reached = threading.Event(), threading.Event()
    outcomes = Outcomes()
    worker = store.jobs.create_worker(
        {"k": fast_then(100, gate, reached)}, poll_seconds=3600, on_outcome=outcomes
    )
    worker.start()
    try:
        assert reached.wait(WAIT)
        # the hundred jobs before it ran in batches with it; none waits for it
        events = outcomes.wait_for(100)
        assert not gate.is_set()
        assert {e.job_id for e in events} == {job.id for job in jobs[:100]}
        assert all(job_state(store, job.id) == "done" for job in jobs[:100])
    finally:
        gate.set()
        worker.stop(grace_seconds=WAIT)


def test_jobs_behind_a_slow_one_are_handed_to_other_loops(store: Store) -> None:
    count = 150
    jobs = store.jobs.enqueue_many([NewJob("k", n) for n in range(count)])
    gate, reached = threading.Event(), threading.Event()
    outcomes = Outcomes()
    worker = store.jobs.create_worker(
        {"k": fast_then(100, gate, reached)},
        concurrency=2,
        poll_seconds=0.05,
        lease_seconds=1.2,  # the renewal thread looks every 0.1 s
        on_outcome=outcomes,
    )
    worker.start()
    try:
        assert reached.wait(WAIT)
        # every other job runs while job 100 holds its loop: the unstarted
        # rest of its batch was handed back and the other loop took it
        events = outcomes.wait_for(count - 1)
        assert not gate.is_set()
    finally:
        gate.set()
        worker.stop(grace_seconds=WAIT)
    blocked = jobs[100].id
    assert blocked not in {e.job_id for e in events}
    for job in jobs:
        row = store.jobs.get(job.id)
        assert row is not None
        # handed back, never expired: no job spent a second attempt
        assert (row.state, row.attempts) == ("done", 1), row


def test_loops_never_run_far_ahead_of_the_settling_thread(store: Store) -> None:
    from jaren_jobs import worker as worker_module

    count, loops = 20_000, 16
    store.jobs.enqueue_many([NewJob("k", n) for n in range(count)])
    peak = [0]
    outcomes = Outcomes()
    worker = store.jobs.create_worker(
        {"k": lambda p, ctx: None}, concurrency=loops, poll_seconds=3600, on_outcome=outcomes
    )
    original = outcomes.__call__

    def observe(event: Outcome) -> None:
        # attempts that ran and wait for their settlement, plus the running ones
        peak[0] = max(peak[0], worker.stats().in_flight)
        original(event)

    worker.observers.on_outcome = observe
    with worker:
        outcomes.wait_for(count, timeout=120)
    # started attempts without an outcome: each loop's running one, the
    # posted backlog (at most 256, plus one per loop that posted as it filled)
    # and the groups the settling threads are writing (at most as many again,
    # each: one thread on SQLite, two on a PostgreSQL pool)
    limit = worker_module._POSTED_LIMIT
    assert limit == 256
    lanes = len(worker.settler.threads)
    assert 0 < peak[0] <= (1 + lanes) * (limit + loops) + loops
    assert store.jobs.counts().done == count


def test_a_database_that_writes_two_transactions_at_once_settles_on_two_threads(
    store: Store, backend: Harness
) -> None:
    """PostgreSQL's pool writes two batches at once (one's statements run while the
    other's commit waits for the disk); SQLite, or the application's one connection,
    one. Whichever, every job settles exactly once."""
    count = 3_000
    store.jobs.enqueue_many([NewJob("k", n) for n in range(count)])
    outcomes = Outcomes()
    worker = store.jobs.create_worker(
        {"k": lambda p, ctx: p}, concurrency=4, poll_seconds=3600, on_outcome=outcomes
    )
    with worker:
        events: list[Outcome] = outcomes.wait_for(count, timeout=120)
        threads = worker.settler.threads
        assert all(thread.is_alive() for thread in threads)
    two = backend.name in ("postgres", "postgres-async")  # a pool of four connections
    assert len(threads) == (2 if two else 1)
    assert not any(thread.is_alive() for thread in threads)  # stop() ended each
    assert sorted(e.job_id for e in events) == sorted({e.job_id for e in events})
    assert {e.outcome for e in events} == {"completed"}
    assert store.jobs.counts().done == count


def test_a_job_cancelled_while_leased_with_a_batch_never_starts(store: Store) -> None:
    count = 200
    jobs = store.jobs.enqueue_many([NewJob("k", n) for n in range(count)])
    payload_of = {job.id: n for n, job in enumerate(jobs)}
    started: set[int] = set()
    cancelled: set[str] = set()
    holder: list[Any] = []
    outcomes = Outcomes()

    def handler(payload: Any, ctx: JobContext) -> Any:
        started.add(payload)
        if payload % 10 == 0:
            # cancel, with its lease, one job this worker holds and has not started
            for lease in holder[0].leases():
                if payload_of[lease.job_id] not in started and lease.job_id not in cancelled:
                    assert store.jobs.cancel(lease.job_id, lease=lease) is True
                    cancelled.add(lease.job_id)
                    break
        return payload

    worker = store.jobs.create_worker({"k": handler}, poll_seconds=3600, on_outcome=outcomes)
    holder.append(worker)
    with worker:
        # every job either ran to its outcome or was cancelled before it started
        assert wait_until(lambda: len(outcomes.events) + len(cancelled) >= count)
        assert worker.stop(grace_seconds=WAIT).drained
    assert cancelled, "no job was ever leased ahead of its loop: the test proved nothing"
    # a cancelled job's handler never ran; it was never started, so it has no outcome
    assert not {payload_of[job_id] for job_id in cancelled} & started
    assert len(started) == count - len(cancelled)
    assert {e.job_id for e in outcomes.events} == {j.id for j in jobs} - cancelled
    assert {e.outcome for e in outcomes.events} == {"completed"}
    stats = worker.stats()
    assert stats.claims == stats.completions == count - len(cancelled)
    assert stats.cancellations == 0
    for job_id in cancelled:
        row = store.jobs.get(job_id)
        assert row is not None
        assert (row.state, row.result) == ("cancelled", None)


def test_a_cancelled_unstarted_job_is_not_handed_back_by_a_stop(store: Store) -> None:
    count = 200
    jobs = store.jobs.enqueue_many([NewJob("k", n) for n in range(count)])
    payload_of = {job.id: n for n, job in enumerate(jobs)}
    gate, reached = threading.Event(), threading.Event()
    started: list[int] = []
    slow = fast_then(100, gate, reached)

    def handler(payload: Any, ctx: JobContext) -> Any:
        started.append(payload)
        return slow(payload, ctx)

    outcomes = Outcomes()
    # no renewal thread: nothing hands the rest of the batch back while job 100 runs
    worker = store.jobs.create_worker(
        {"k": handler}, poll_seconds=3600, renew=False, on_outcome=outcomes
    )
    worker.start()
    try:
        assert reached.wait(WAIT)
        assert wait_until(lambda: leased_ahead(worker))
        ahead = [lease for lease in worker.leases() if payload_of[lease.job_id] > 100]
        for lease in ahead:
            assert store.jobs.cancel(lease.job_id, lease=lease) is True
        # a cancelled lease is no longer the worker's to list
        listed = {(lease.job_id, lease.generation) for lease in worker.leases()}
        assert not listed & {(lease.job_id, lease.generation) for lease in ahead}
    finally:
        stopping = threading.Thread(target=worker.stop, kwargs={"grace_seconds": WAIT})
        stopping.start()
        # job 100 finishes only once the stop has begun (else the worker may go on to 101)
        assert wait_until(lambda: not worker.running)
        gate.set()
        stopping.join(WAIT)
    assert ahead, "no job was leased ahead of job 100: the test proved nothing"
    assert max(started) == 100
    for lease in ahead:
        row = store.jobs.get(lease.job_id)
        assert row is not None
        assert row.state == "cancelled"
    assert worker.stats().claims == len(outcomes.events) == len(started)


def test_jobs_handed_back_wake_an_idle_worker(store: Store) -> None:
    gate, reached = threading.Event(), threading.Event()
    first_outcomes, second_outcomes = Outcomes(), Outcomes()
    first = store.jobs.create_worker(
        {"k": fast_then(-1, gate, reached)},
        poll_seconds=3600,
        lease_seconds=3.0,  # its renewal thread looks for stalled queues every 0.25 s
        on_outcome=first_outcomes,
    )
    with first:
        store.jobs.enqueue_many([NewJob("k", n) for n in range(10)])
        first_outcomes.wait_for(10)  # fast jobs: it now holds jobs ahead
        # woken, it claims a fast job alone; its settlement's top-up brings the slow
        # job and jobs behind it, and more come while the slow job runs: none is pending
        store.jobs.enqueue_many(
            [NewJob("k", 0), NewJob("k", -1)] + [NewJob("k", n) for n in range(8)]
        )
        assert reached.wait(WAIT)
        assert wait_until(lambda: leased_ahead(first))
        idle = threading.Event()
        second = store.jobs.create_worker(
            {"k": noop}, poll_seconds=3600, on_outcome=second_outcomes, on_idle=idle.set
        )
        with second:
            assert idle.wait(WAIT)  # found nothing: an hour until its next poll
            assert leased_ahead(first), "the first worker handed its jobs back too early"
            # the stall check hands them back; only a wake can bring them to it
            events = second_outcomes.wait_for(1)
            gate.set()
    assert events[0].outcome == "completed"


def test_a_job_claimed_alone_runs_with_no_job_leased_behind_it(store: Store) -> None:
    """An idle loop woken for work claims one job, and asks for no more while it runs
    (its length is not known yet; the next jobs come with its settlement): the jobs
    enqueued with it stay claimable, and another worker runs them at once, on their
    first lease, while it runs."""
    gate, reached = threading.Event(), threading.Event()
    first_outcomes, second_outcomes = Outcomes(), Outcomes()
    first = store.jobs.create_worker(
        {"k": fast_then(-1, gate, reached)}, poll_seconds=3600, on_outcome=first_outcomes
    )
    with first:
        store.jobs.enqueue_many([NewJob("k", n) for n in range(10)])
        first_outcomes.wait_for(10)  # fast jobs: it now holds jobs ahead when it can
        assert wait_until(lambda: not first.stats().in_flight)
        slow, *behind = store.jobs.enqueue_many(
            [NewJob("k", -1)] + [NewJob("k", n) for n in range(8)]
        )
        assert reached.wait(WAIT)  # woken, it claimed the slow job alone: it runs
        second = store.jobs.create_worker(
            {"k": noop}, poll_seconds=3600, on_outcome=second_outcomes
        )
        with second:
            events = second_outcomes.wait_for(8)
        assert not leased_ahead(first)
        gate.set()
        assert first_outcomes.wait_for(11)[-1].job_id == slow.id
    assert sorted(e.job_id for e in events) == sorted(job.id for job in behind)
    for job in behind:
        stored = store.jobs.get(job.id)
        assert stored is not None
        assert (stored.state, stored.lease_generation) == ("done", 1)


def test_an_async_job_claimed_alone_runs_with_no_job_leased_behind_it(
    astore: AsyncStore,
) -> None:
    """As the thread worker's (above), through an AsyncWorker's queue runs: the jobs
    enqueued with the job its loop claimed alone stay claimable while it runs."""
    gate, reached = threading.Event(), threading.Event()
    first_outcomes: list[Outcome] = []
    second_outcomes: list[Outcome] = []
    behind: list[Job] = []
    held: list[bool] = []

    async def handler(payload: Any, ctx: AsyncJobContext) -> Any:
        if payload == -1:
            reached.set()
            assert await asyncio.to_thread(gate.wait, WAIT)
        return payload

    async def fast(payload: Any, ctx: AsyncJobContext) -> Any:
        return payload

    async def main() -> None:
        warmed, warm_done = collecting(first_outcomes, 10)
        first = astore.jobs.create_worker({"k": handler}, poll_seconds=3600, on_outcome=warmed)
        async with first:
            await astore.jobs.enqueue_many([NewJob("k", n) for n in range(10)])
            await warm_done.wait()  # fast jobs: it now holds jobs ahead when it can
            assert await asyncio.to_thread(wait_until, lambda: not first.stats().in_flight)
            _, *rest = await astore.jobs.enqueue_many(
                [NewJob("k", -1)] + [NewJob("k", n) for n in range(8)]
            )
            behind.extend(rest)
            assert await asyncio.to_thread(reached.wait, WAIT)  # claimed alone: it runs
            finished, done = collecting(second_outcomes, 8)
            second = astore.jobs.create_worker({"k": fast}, poll_seconds=3600, on_outcome=finished)
            async with second:
                await done.wait()
            held.append(leased_ahead(first.worker))
            gate.set()
        for job in behind:
            stored = await astore.jobs.get(job.id)
            assert stored is not None
            assert (stored.state, stored.lease_generation) == ("done", 1)

    run(main())
    assert held == [False]
    assert sorted(o.job_id for o in second_outcomes) == sorted(job.id for job in behind)


def noop(payload: Any, ctx: JobContext) -> Any:
    return payload


def test_a_drained_job_leaves_no_reference_cycle_behind(store: Store) -> None:
    """A job's objects (its held lease, attempt, signal, record) are freed as it
    ends, by reference counting: none waits for the cycle collector, whose passes
    over a busy worker's young objects cost CPU per job (a held job and the
    cancel hook the hub kept for it referred to each other: 13 objects per job)."""
    import gc

    count = 500
    store.jobs.enqueue_many([NewJob("k", n) for n in range(count)])
    outcomes = Outcomes()
    worker = store.jobs.create_worker(
        {"k": lambda p, ctx: p}, concurrency=4, poll_seconds=3600, on_outcome=outcomes
    )
    gc.collect()
    gc.disable()
    try:
        with worker:
            outcomes.wait_for(count, timeout=120)
        found = gc.collect()
    finally:
        gc.enable()
    # what a worker's start and stop leave (threads, a connection's state), not per job
    assert found < count, f"{found} objects in reference cycles after {count} jobs"
