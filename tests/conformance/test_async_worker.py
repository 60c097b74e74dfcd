"""``AsyncWorker`` on every backend (SPEC §11): async handlers on the loop, plain ones on
threads, and the handler's task cancelled when its job is cancelled or stop's grace ends.

Ordered with events (asyncio's and threading's), never by sleeping.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import threading
import time
from typing import Any

import pytest

from jaren_jobs import AsyncJobContext, AsyncStore, AsyncWorker, NewJob, Outcome, Store
from tests.conftest import FakeClock
from tests.harness import Harness

WAIT = 10.0


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, WAIT * 3))


def collecting(outcomes: list[Outcome], count: int) -> tuple[Any, asyncio.Event]:
    """On the running loop: an ``on_outcome`` that collects into ``outcomes`` (from the
    worker's threads), and an event set once ``count`` have arrived."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()

    def finished(outcome: Outcome) -> None:
        outcomes.append(outcome)
        if len(outcomes) == count:
            loop.call_soon_threadsafe(done.set)

    return finished, done


def test_async_handlers_run_on_the_loop_and_plain_ones_on_threads(
    astore: AsyncStore, store: Store
) -> None:
    seen: dict[str, list[Any]] = {"async": [], "plain": []}
    outcomes: list[Outcome] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()
        finished, all_done = collecting(outcomes, 40)

        async def on_loop(payload: Any, ctx: AsyncJobContext) -> Any:
            assert asyncio.get_running_loop() is loop
            seen["async"].append(ctx.job.id)
            await asyncio.sleep(0)  # a real await inside the handler
            return {"doubled": payload["n"] * 2}

        def on_thread(payload: Any, ctx: Any) -> Any:
            assert threading.get_ident() != loop_thread  # never stalls the loop
            seen["plain"].append(ctx.job.id)
            return payload["n"]

        await astore.jobs.enqueue_many(
            [NewJob("a", {"n": n}, id=f"a{n:02}") for n in range(20)]
            + [NewJob("p", {"n": n}, id=f"p{n:02}") for n in range(20)]
        )
        worker = astore.jobs.create_worker(
            {"a": on_loop, "p": on_thread}, concurrency=4, poll_seconds=0.05, on_outcome=finished
        )
        async with worker:
            await asyncio.wait_for(all_done.wait(), WAIT)
        assert not worker.running

    run(main())
    assert sorted(seen["async"]) == [f"a{n:02}" for n in range(20)]
    assert sorted(seen["plain"]) == [f"p{n:02}" for n in range(20)]
    assert {o.outcome for o in outcomes} == {"completed"}
    assert store.jobs.get("a07").result == {"doubled": 14}  # type: ignore[union-attr]
    assert store.jobs.get("p07").result == 7  # type: ignore[union-attr]
    assert store.jobs.counts().done == 40


def test_an_async_handler_awaits_its_checkpoints(astore: AsyncStore, store: Store) -> None:
    async def main() -> None:
        async def steps(payload: Any, ctx: AsyncJobContext) -> Any:
            assert await ctx.checkpoints.load(ctx.job.id) is None
            await ctx.checkpoints.save(ctx.job.id, "first", 1)
            return await ctx.checkpoints.load(ctx.job.id)

        await astore.jobs.enqueue("steps", id="s")
        worker = astore.jobs.create_worker({"steps": steps})
        assert await worker.run_once()
        assert not await worker.run_once()  # nothing left

    run(main())
    assert store.jobs.get("s").result == {"first": 1}  # type: ignore[union-attr]


def test_a_job_cancelled_mid_handler_cancels_the_handlers_task(
    astore: AsyncStore, store: Store
) -> None:
    outcomes: list[Outcome] = []
    cancelled_inside: list[bool] = []

    async def main() -> None:
        started = asyncio.Event()

        async def forever(payload: Any, ctx: AsyncJobContext) -> Any:
            started.set()
            try:
                await asyncio.Event().wait()  # only a cancellation ends it
            except asyncio.CancelledError:
                cancelled_inside.append(True)
                raise

        await astore.jobs.enqueue("slow", id="victim")
        worker = astore.jobs.create_worker(
            {"slow": forever}, poll_seconds=0.05, on_outcome=outcomes.append
        )
        async with worker:
            await asyncio.wait_for(started.wait(), WAIT)
            [lease] = worker.leases()
            assert await astore.jobs.cancel("victim", lease=lease)
            deadline = time.monotonic() + WAIT
            while not outcomes and time.monotonic() < deadline:
                await asyncio.sleep(0.01)

    run(main())
    assert cancelled_inside == [True]
    assert [o.outcome for o in outcomes] == ["cancelled"]
    assert store.jobs.get("victim").state == "cancelled"  # type: ignore[union-attr]


def test_stop_cancels_a_handler_still_running_when_the_grace_period_ends(
    astore: AsyncStore, store: Store, clock: FakeClock
) -> None:
    stop_took: list[float] = []
    asked: list[bool] = []
    cancelled: list[bool] = []

    async def main() -> None:
        started = asyncio.Event()

        async def stubborn(payload: Any, ctx: AsyncJobContext) -> Any:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                asked.append(ctx.signal.aborted)  # the stop had asked it first
                cancelled.append(True)
                raise

        await astore.jobs.enqueue("slow", id="stuck")
        worker = astore.jobs.create_worker(
            {"slow": stubborn}, poll_seconds=0.05, lease_seconds=30, renew=False
        )
        await worker.start()
        await asyncio.wait_for(started.wait(), WAIT)
        began = time.monotonic()
        outcome = await worker.stop(grace_seconds=0.2)
        stop_took.append(time.monotonic() - began)
        assert outcome.in_flight == 1
        assert not outcome.drained

    run(main())
    assert stop_took[0] < 5.0  # the grace period bounds it, not the handler
    assert cancelled == [True]
    assert asked == [True]
    # cancelled before the bar, its task raised while it could still settle:
    # handed back (SPEC §12), pending now, the attempt not spent
    stuck = store.jobs.get("stuck")
    assert stuck is not None
    assert (stuck.state, stuck.attempts, stuck.lease_until) == ("pending", 0, None)
    again = store.jobs.claim(["slow"], owner="other")
    assert again is not None
    assert again.id == "stuck"
    assert again.lease.attempt == 1


def test_stop_returns_within_its_bound_past_a_handler_that_ignores_cancellation(
    astore: AsyncStore, store: Store, clock: FakeClock
) -> None:
    outcomes: list[Outcome] = []
    swallowed: list[bool] = []
    stop_took: list[float] = []

    async def main() -> None:
        started, release, ended = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def deaf(payload: Any, ctx: AsyncJobContext) -> Any:
            started.set()
            try:
                while not release.is_set():
                    try:
                        await release.wait()
                    except asyncio.CancelledError:
                        swallowed.append(True)  # ignored: it goes on waiting
                return "too late"
            finally:
                ended.set()

        await astore.jobs.enqueue("slow", id="deaf")
        worker = astore.jobs.create_worker(
            {"slow": deaf},
            poll_seconds=0.05,
            lease_seconds=30,
            renew=False,
            on_outcome=outcomes.append,
        )
        await worker.start()
        await asyncio.wait_for(started.wait(), WAIT)
        began = time.monotonic()
        outcome = await worker.stop(grace_seconds=0.2)
        stop_took.append(time.monotonic() - began)
        assert (outcome.drained, outcome.in_flight) == (False, 1)
        assert not worker.running
        # still the first attempt's until its lease expires: nobody else may claim it
        assert await astore.jobs.claim(["slow"], owner="other") is None
        # the handler ends after stop() returned: barred from settling, it writes nothing
        release.set()
        await asyncio.wait_for(ended.wait(), WAIT)
        for _ in range(20):
            await asyncio.sleep(0)  # its task's done callbacks run now, if any ran at all

    run(main())
    assert stop_took[0] < 5.0  # the grace period bounds it, not the handler
    assert swallowed  # its task was cancelled, and it ignored that
    late = store.jobs.get("deaf")
    assert late is not None
    assert (late.state, late.attempts, late.result) == ("leased", 1, None)
    assert [o.outcome for o in outcomes if o.outcome == "completed"] == []
    # once the abandoned lease expires the job is claimed again, and the new attempt settles it
    clock.advance(31)
    again = store.jobs.claim(["slow"], owner="other")
    assert again is not None
    assert (again.id, again.lease.attempt) == ("deaf", 2)
    assert store.jobs.complete(again.lease, "second life") is True
    assert store.jobs.get("deaf").result == "second life"  # type: ignore[union-attr]


def test_an_async_generator_handler_is_refused(astore: AsyncStore) -> None:
    async def main() -> None:
        async def not_a_handler(payload: Any, ctx: Any) -> Any:
            yield payload

        with pytest.raises(TypeError, match="async generator"):
            astore.jobs.create_worker({"k": not_a_handler})

    run(main())


def test_create_worker_outside_a_loop_says_it_needs_one(astore: AsyncStore) -> None:
    async def handler(payload: Any, ctx: Any) -> Any:
        return None

    with pytest.raises(RuntimeError, match="coroutine"):
        astore.jobs.create_worker({"k": handler})


def test_stop_awaited_by_its_own_handler_is_refused(astore: AsyncStore, store: Store) -> None:
    errors: list[BaseException] = []

    async def main() -> None:
        holder: list[AsyncWorker] = []

        async def handler(payload: Any, ctx: AsyncJobContext) -> Any:
            try:
                await asyncio.wait_for(holder[0].stop(), WAIT)
            except RuntimeError as exc:
                errors.append(exc)
            return "ok"

        loop, settled = asyncio.get_running_loop(), asyncio.Event()

        def observe(outcome: Outcome) -> None:
            if outcome.job_id == "second":
                loop.call_soon_threadsafe(settled.set)

        worker = astore.jobs.create_worker({"k": handler}, poll_seconds=3600, on_outcome=observe)
        holder.append(worker)
        await astore.jobs.enqueue("k", id="first")
        assert await worker.run_once() is True  # a handler driven by run_once() too
        async with worker:
            await astore.jobs.enqueue("k", id="second")  # wakes the started worker
            await asyncio.wait_for(settled.wait(), WAIT)

    run(main())
    assert len(errors) == 2
    assert "own handlers" in str(errors[0])
    assert [store.jobs.get(i).state for i in ("first", "second")] == ["done", "done"]  # type: ignore[union-attr]


def test_a_lease_lost_at_renewal_cancels_the_handlers_task(
    astore: AsyncStore, store: Store, clock: FakeClock
) -> None:
    outcomes: list[Outcome] = []
    reasons: list[Any] = []

    async def main() -> None:
        loop, ended = asyncio.get_running_loop(), asyncio.Event()

        def observe(outcome: Outcome) -> None:
            outcomes.append(outcome)
            loop.call_soon_threadsafe(ended.set)

        async def waits(payload: Any, ctx: AsyncJobContext) -> Any:
            if ctx.job.lease.attempt > 1:
                return "second life"  # the expired job, claimed again
            clock.advance(5)  # the 0.3 s lease is long gone when the renewal tries
            try:
                await asyncio.Event().wait()  # only a cancellation ends it
            except asyncio.CancelledError:
                reasons.append(ctx.signal.reason)
                raise

        await astore.jobs.enqueue("k", id="held")
        worker = astore.jobs.create_worker(
            {"k": waits}, lease_seconds=0.3, poll_seconds=0.05, on_outcome=observe
        )
        async with worker:  # a started worker: its queue runs on this loop
            await asyncio.wait_for(ended.wait(), WAIT)

    run(main())
    assert [reason.code for reason in reasons] == ["JD2067"]  # the renewal found it expired
    assert (outcomes[0].outcome, outcomes[0].code, outcomes[0].attempt) == ("lost", "JD2067", 1)


def test_renewals_are_a_task_on_the_loop_not_a_thread(astore: AsyncStore, store: Store) -> None:
    renewed_on: list[str] = []
    seen: dict[str, Any] = {}

    async def main() -> None:
        loop, twice, ended = asyncio.get_running_loop(), asyncio.Event(), asyncio.Event()

        def on_renewal(lease: Any) -> None:
            renewed_on.append(threading.current_thread().name)
            if len(renewed_on) == 2:
                loop.call_soon_threadsafe(twice.set)

        async def holds(payload: Any, ctx: AsyncJobContext) -> Any:
            first = ctx.lease
            await asyncio.wait_for(twice.wait(), WAIT)  # renewed while it awaits
            seen["threads"] = [thread.name for thread in threading.enumerate()]
            seen["leases"] = (first, ctx.lease)
            return "held"

        await astore.jobs.enqueue("k", id="long")
        worker = astore.jobs.create_worker(
            {"k": holds},
            lease_seconds=0.3,
            poll_seconds=0.05,
            on_renewal=on_renewal,
            on_outcome=lambda _: loop.call_soon_threadsafe(ended.set),
        )
        seen["name"], seen["loop"] = worker.name, threading.current_thread().name
        async with worker:
            await asyncio.wait_for(ended.wait(), WAIT)
        seen["renewals"] = worker.stats().renewals

    run(main())
    assert f"{seen['name']}-renewals" not in seen["threads"]  # no renewal thread was started
    first, last = seen["leases"]
    assert (last.attempt, last.generation) == (first.attempt, first.generation)
    assert last != first  # the handler's ctx.lease follows the renewals
    assert seen["renewals"] >= 2
    # the renewal ran on the loop (async-native) or on the store's own thread (SQLite)
    assert all(name == seen["loop"] or name.startswith("jaren_jobs-async") for name in renewed_on)
    job = store.jobs.get("long")
    assert job is not None
    assert (job.state, job.result, job.attempts) == ("done", "held", 1)


def test_one_queue_runs_async_and_plain_jobs_each_where_it_belongs(
    astore: AsyncStore, store: Store
) -> None:
    where: dict[str, str] = {}
    outcomes: list[Outcome] = []

    async def main() -> None:
        loop, all_done = asyncio.get_running_loop(), asyncio.Event()

        def finished(outcome: Outcome) -> None:
            outcomes.append(outcome)
            if len(outcomes) == 30:
                loop.call_soon_threadsafe(all_done.set)

        async def on_loop(payload: Any, ctx: AsyncJobContext) -> Any:
            where[ctx.job.id] = threading.current_thread().name
            await asyncio.sleep(0)
            return payload

        def on_thread(payload: Any, ctx: Any) -> Any:
            where[ctx.job.id] = threading.current_thread().name
            return payload

        # one loop (concurrency 1), kinds interleaved: its queues hold both kinds
        await astore.jobs.enqueue_many(
            [NewJob("a" if n % 2 else "p", n, id=f"j{n:02}") for n in range(30)]
        )
        worker = astore.jobs.create_worker(
            {"a": on_loop, "p": on_thread}, poll_seconds=0.05, on_outcome=finished
        )
        async with worker:
            await asyncio.wait_for(all_done.wait(), WAIT)
        loop_name = threading.current_thread().name
        for n in range(30):
            name = where[f"j{n:02}"]
            if n % 2:
                assert name == loop_name, (n, name)
            else:
                assert name.startswith(f"{worker.name}-loop-"), (n, name)

    run(main())
    assert sorted(o.job_id for o in outcomes) == [f"j{n:02}" for n in range(30)]  # once each
    assert {o.outcome for o in outcomes} == {"completed"}
    assert store.jobs.counts().done == 30


def test_stop_during_a_queue_run_hands_back_the_unstarted_jobs_unspent(
    astore: AsyncStore, store: Store
) -> None:
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def observe(outcome: Outcome) -> None:
        with lock:
            outcomes.append(outcome)

    async def main() -> None:
        tenth = asyncio.Event()
        ran = [0]

        async def handler(payload: Any, ctx: AsyncJobContext) -> Any:
            ran[0] += 1
            if ran[0] == 10:
                tenth.set()
            await asyncio.sleep(0)
            return payload

        await astore.jobs.enqueue_many([NewJob("k", n, id=f"j{n:03}") for n in range(300)])
        worker = astore.jobs.create_worker(
            {"k": handler}, concurrency=4, poll_seconds=0.05, on_outcome=observe
        )
        await worker.start()
        await asyncio.wait_for(tenth.wait(), WAIT)
        stopped = await worker.stop(grace_seconds=WAIT)
        assert stopped.drained
        assert worker.leases() == []
        assert worker.stats().in_flight == 0

    run(main())
    done = {o.job_id for o in outcomes if o.outcome == "completed"}
    assert len(done) == len(outcomes) >= 10  # exactly one outcome per attempt, all completed
    assert len(done) < 300  # the stop came before the queue ran dry
    for job in store.jobs.page(limit=300):
        if job.id in done:
            assert job.state == "done"
        else:  # leased with a batch and never started: handed back, no attempt spent
            assert (job.state, job.attempts, job.lease_until) == ("pending", 0, None), job


def test_an_async_handler_that_blocks_the_loop_past_its_lease_keeps_it_and_runs_once(
    real_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    # issue 26 item 12: renewals are a task on the loop, so a handler blocking the loop
    # past its lease lost it; its completion was refused and the job ran again and again
    from tests.conftest import BridgeStore

    underneath = real_store.astore.store if isinstance(real_store, BridgeStore) else real_store
    astore = AsyncStore(underneath)
    runs: list[int] = []
    outcomes: list[Outcome] = []

    async def blocks_the_loop(payload: Any, ctx: AsyncJobContext) -> Any:
        runs.append(ctx.job.attempts)
        time.sleep(1.2)  # the fault under test: a blocking call on the loop, 4 leases long
        return "finished"

    async def main() -> None:
        ended = asyncio.Event()
        loop = asyncio.get_running_loop()

        def seen(outcome: Outcome) -> None:
            outcomes.append(outcome)
            loop.call_soon_threadsafe(ended.set)

        await astore.jobs.enqueue("k", id="blocking", max_attempts=2)
        worker = astore.jobs.create_worker(
            {"k": blocks_the_loop}, lease_seconds=0.3, poll_seconds=0.05, on_outcome=seen
        )
        async with worker:
            await asyncio.wait_for(ended.wait(), WAIT)

    with caplog.at_level("WARNING", logger="jaren_jobs"):
        run(main())
    assert [o.outcome for o in outcomes] == ["completed"]
    assert runs == [1]
    job = underneath.jobs.get("blocking")
    assert job is not None
    assert (job.state, job.result, job.attempts) == ("done", "finished", 1)
    warned = [
        r.getMessage() for r in caplog.records if "event loop has been blocked" in r.getMessage()
    ]
    assert warned, caplog.text
    assert "blocks_the_loop" in warned[0]


# a handler's own state, as a task of its own would keep it (issue 28: handlers run in the
# queue run's task, each in a context of its own)
_SEEN_BY: contextvars.ContextVar[str] = contextvars.ContextVar("test_seen_by", default="nobody")


def test_each_async_handler_runs_in_a_context_of_its_own(astore: AsyncStore) -> None:
    found: list[tuple[str, str, str, str]] = []
    outcomes: list[Outcome] = []

    async def main() -> None:
        finished, all_done = collecting(outcomes, 30)

        async def child() -> str:
            return _SEEN_BY.get()

        async def handler(payload: Any, ctx: AsyncJobContext) -> Any:
            before = _SEEN_BY.get()  # what the last handler set must not show here
            _SEEN_BY.set(ctx.job.id)
            if payload % 2:
                await asyncio.sleep(0)  # suspended: the value survives it
            made = await asyncio.create_task(child())  # a task it makes copies its context
            found.append((ctx.job.id, before, _SEEN_BY.get(), made))
            return payload

        await astore.jobs.enqueue_many([NewJob("k", n, id=f"j{n:02}") for n in range(30)])
        worker = astore.jobs.create_worker(
            {"k": handler}, concurrency=1, poll_seconds=0.05, on_outcome=finished
        )
        async with worker:
            await asyncio.wait_for(all_done.wait(), WAIT)
        assert _SEEN_BY.get() == "nobody"  # nor in the caller's

    run(main())
    assert {o.outcome for o in outcomes} == {"completed"}
    assert sorted(found) == [(f"j{n:02}", "nobody", f"j{n:02}", f"j{n:02}") for n in range(30)]


def test_a_cancellation_an_async_handler_swallows_stays_its_own(
    astore: AsyncStore, store: Store
) -> None:
    # the worker cancels the task running the handler; the handler may catch it and end.
    # The jobs after it must run as if nothing happened: not cancelled, and a timeout of
    # theirs (bound to the task running them) must fire in them, as theirs
    outcomes: list[Outcome] = []
    later: list[Any] = []

    async def main() -> None:
        started = asyncio.Event()
        finished, all_done = collecting(outcomes, 6)

        async def swallows(payload: Any, ctx: AsyncJobContext) -> Any:
            started.set()
            try:
                await asyncio.Event().wait()  # only a cancellation ends it
            except asyncio.CancelledError:
                return "kept going"  # swallowed
            return "never"

        async def after(payload: Any, ctx: AsyncJobContext) -> Any:
            task = asyncio.current_task()
            assert task is not None
            if sys.version_info >= (3, 11):
                later.append(("cancelling", task.cancelling()))
                try:
                    async with asyncio.timeout(0.01):
                        await asyncio.Event().wait()
                except TimeoutError:
                    later.append(("timed out", ctx.job.id))
            await asyncio.sleep(0)
            return "ran"

        await astore.jobs.enqueue("first", id="victim")
        worker = astore.jobs.create_worker(
            {"first": swallows, "later": after},
            concurrency=1,
            poll_seconds=0.05,
            on_outcome=finished,
        )
        async with worker:
            await asyncio.wait_for(started.wait(), WAIT)
            await astore.jobs.enqueue_many([NewJob("later", n, id=f"l{n}") for n in range(5)])
            [lease] = [lease for lease in worker.leases() if lease.job_id == "victim"]
            assert await astore.jobs.cancel("victim", lease=lease)
            await asyncio.wait_for(all_done.wait(), WAIT)

    run(main())
    assert sorted((o.job_id, o.outcome) for o in outcomes) == [
        (f"l{n}", "completed") for n in range(5)
    ] + [("victim", "cancelled")]
    assert [store.jobs.get(f"l{n}").result for n in range(5)] == ["ran"] * 5  # type: ignore[union-attr]
    if sys.version_info >= (3, 11):
        assert sorted(later) == sorted(
            [("cancelling", 0)] * 5 + [("timed out", f"l{n}") for n in range(5)]
        )


def test_an_async_handlers_error_and_its_cancellation_are_its_outcome(
    astore: AsyncStore, store: Store
) -> None:
    outcomes: list[Outcome] = []

    async def main() -> None:
        finished, all_done = collecting(outcomes, 3)

        async def handler(payload: Any, ctx: AsyncJobContext) -> Any:
            if payload == "raise now":
                raise ValueError("raised before any await")
            await asyncio.sleep(0)
            if payload == "raise later":
                raise KeyError("raised after an await")
            raise asyncio.CancelledError  # as if its own task were cancelled

        await astore.jobs.enqueue_many(
            [
                NewJob("k", p, id=p.replace(" ", "-"), max_attempts=1)
                for p in ("raise now", "raise later", "cancelled")
            ]
        )
        worker = astore.jobs.create_worker(
            {"k": handler}, concurrency=1, poll_seconds=0.05, on_outcome=finished
        )
        async with worker:
            await asyncio.wait_for(all_done.wait(), WAIT)

    run(main())
    by_job = {o.job_id: o for o in outcomes}
    assert {job: o.outcome for job, o in by_job.items()} == {
        "raise-now": "failed",
        "raise-later": "failed",
        "cancelled": "failed",
    }
    assert {store.jobs.get(job).state for job in by_job} == {"dead"}  # type: ignore[union-attr]
    assert "raised before any await" in (by_job["raise-now"].reason or "")
    assert "raised after an await" in (by_job["raise-later"].reason or "")
    assert "HandlerCancelled" in (by_job["cancelled"].reason or ""), by_job["cancelled"]


def test_stop_cancels_a_handler_that_first_suspends_after_the_grace_period_ended(
    astore: AsyncStore, store: Store
) -> None:
    # a handler is tracked for stop's grace end from its first suspension (a handler that
    # never suspends cannot be cancelled): one still in its first step when the grace
    # period ends must be cancelled at that first await, as one already waiting is
    cancelled: list[bool] = []
    started = threading.Event()
    gate = threading.Event()
    graced = threading.Event()

    async def stubborn(payload: Any, ctx: AsyncJobContext) -> Any:
        started.set()
        gate.wait(WAIT)  # the fault under test's timing: the loop held in the first step
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main() -> None:
        await astore.jobs.enqueue("slow", id="stuck")
        worker = astore.jobs.create_worker(
            {"slow": stubborn}, poll_seconds=0.05, lease_seconds=30, renew=False
        )
        grace_ended = worker.grace_ended

        def observed() -> None:
            grace_ended()
            graced.set()

        worker.grace_ended = observed  # type: ignore[method-assign]

        def stop_while_it_steps() -> None:
            started.wait(WAIT)
            # the thread worker's stop, as AsyncWorker.stop() runs it (the loop is held)
            stopper = threading.Thread(target=worker.worker.stop, args=(0.05,), daemon=True)
            stopper.start()
            graced.wait(WAIT)
            gate.set()  # only now does the handler reach its first await
            stopper.join(WAIT)

        await worker.start()
        helper = threading.Thread(target=stop_while_it_steps, daemon=True)
        helper.start()
        await asyncio.to_thread(helper.join, WAIT)
        await worker.stop()
        assert graced.is_set()

    run(main())
    assert cancelled == [True]
    stuck = store.jobs.get("stuck")
    assert stuck is not None
    assert (stuck.state, stuck.attempts, stuck.lease_until) == ("pending", 0, None)


def test_an_async_workers_top_ups_travel_apart_from_its_settlements_on_two_lanes(
    astore: AsyncStore, backend: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its queue runs share one thread and post their settlements in bursts: where two
    transactions can write at once (a PostgreSQL pool), a top-up is written in a
    transaction of its own, ahead of a burst of settlements posted with it (a few ride
    with it); on one lane (SQLite) they share one. Either way every job settles
    exactly once."""
    from jaren_jobs.engine.group_commit import SettlementBatcher
    from jaren_jobs.worker.settler import APART_FROM

    written: list[tuple[int, int]] = []  # (settlements, jobs claimed) per transaction
    real = SettlementBatcher._transaction

    def transaction(self: SettlementBatcher, groups: Any) -> None:
        real(self, groups)
        settled = sum(len(group.batch.settlements) for group in groups)
        written.append((settled, sum(n for g in groups for _, n in g.batch.claims)))

    monkeypatch.setattr(SettlementBatcher, "_transaction", transaction)
    count = 1_000
    outcomes: list[Outcome] = []

    async def main() -> None:
        finished, done = collecting(outcomes, count)

        async def handler(payload: Any, ctx: AsyncJobContext) -> Any:
            return payload

        await astore.jobs.enqueue_many([NewJob("k", n) for n in range(count)])
        worker = astore.jobs.create_worker(
            {"k": handler}, concurrency=4, poll_seconds=3600, on_outcome=finished
        )
        async with worker:
            await asyncio.wait_for(done.wait(), WAIT * 2)

    run(main())
    mixed = [(settled, claimed) for settled, claimed in written if settled and claimed]
    if backend.name in ("postgres", "postgres-async"):  # a pool: two lanes
        assert [settled for settled, _ in mixed if settled >= APART_FROM] == []
    else:
        assert mixed  # one lane: a top-up rides with the settlements
    assert any(claimed for _, claimed in written)
    assert sorted(o.job_id for o in outcomes) == sorted({o.job_id for o in outcomes})
    assert {o.outcome for o in outcomes} == {"completed"}
