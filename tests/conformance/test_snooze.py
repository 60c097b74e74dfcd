"""Snoozing and the stop hand-back (SPEC §12) on every backend, sync and async.

A snooze puts the job back to ``pending`` at ``now + delay`` without spending
the attempt, and is fenced like any settlement. A handler that raises because
its worker is stopping is handed back the same way. Time is the fake clock's;
threads are ordered by events, never by sleeping.
"""

from __future__ import annotations

import asyncio
import math
import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from jaren_jobs import (
    AsyncJobContext,
    AsyncStore,
    JobContext,
    JobSettled,
    LeaseExpired,
    LeaseRequired,
    LeaseSuperseded,
    Outcome,
    Snooze,
    Store,
)
from tests.conformance.test_worker import Outcomes
from tests.conftest import FakeClock

WAIT = 10.0


def now(store: Store) -> datetime:
    """The store's clock now, as a job's times are (aware UTC, whole milliseconds)."""
    return datetime.fromtimestamp(round(store.runtime.now() * 1000) / 1000, timezone.utc)


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, WAIT * 3))


# ---------------------------------------------------------------- the engine call


def test_a_snooze_keeps_the_attempts_and_runs_again_at_now_plus_delay(
    store: Store, clock: FakeClock
) -> None:
    store.jobs.enqueue("k", id="a", max_attempts=3)
    claimed = store.jobs.claim(["k"], owner="w", lease_seconds=30)
    assert claimed is not None
    assert claimed.attempts == 1
    snoozed_at = now(store)
    assert store.jobs.snooze(claimed.lease, 45) is True

    job = store.jobs.get("a")
    assert job is not None
    assert job.state == "pending"
    assert job.attempts == 0  # as before the claim: the attempt was given back
    assert job.run_at == snoozed_at + timedelta(seconds=45)
    assert (job.lease_until, job.lease_owner) == (None, None)
    assert job.lease_generation == claimed.lease.generation  # still fenced

    assert store.jobs.claim(["k"], owner="w") is None  # not due yet
    clock.advance(44.999)
    assert store.jobs.claim(["k"], owner="w") is None
    clock.advance(0.001)
    again = store.jobs.claim(["k"], owner="w")
    assert again is not None
    assert (again.lease.attempt, again.lease.generation) == (1, claimed.lease.generation + 1)


def test_a_zero_snooze_is_claimable_at_once(store: Store) -> None:
    store.jobs.enqueue("k", id="a")
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    assert store.jobs.snooze(claimed.lease, 0) is True
    again = store.jobs.claim(["k"], owner="w")
    assert again is not None
    assert again.lease.attempt == 1


def test_the_snoozed_lease_settles_nothing_after_the_next_claim(
    store: Store, clock: FakeClock
) -> None:
    store.jobs.enqueue("k", id="a")
    first = store.jobs.claim(["k"], owner="w")
    assert first is not None
    assert store.jobs.snooze(first.lease, 5) is True
    # the same attempt again: idempotent, nothing written
    assert store.jobs.snooze(first.lease, 500) is True
    job = store.jobs.get("a")
    assert job is not None
    assert job.run_at == now(store) + timedelta(seconds=5)
    clock.advance(5)
    second = store.jobs.claim(["k"], owner="w")
    assert second is not None
    with pytest.raises(LeaseSuperseded):
        store.jobs.snooze(first.lease, 1)
    with pytest.raises(LeaseSuperseded):
        store.jobs.complete(first.lease, "stale")
    assert store.jobs.complete(second.lease, "ok") is True
    done = store.jobs.get("a")
    assert done is not None
    assert (done.state, done.result, done.attempts) == ("done", "ok", 1)


def test_a_stale_attempts_snooze_is_refused_by_name(store: Store, clock: FakeClock) -> None:
    store.jobs.enqueue("k", id="a", max_attempts=5)
    # superseded: a renewal replaced the lease
    claimed = store.jobs.claim(["k"], owner="w", lease_seconds=10)
    assert claimed is not None
    renewed = store.jobs.renew(claimed.lease, lease_seconds=10)
    with pytest.raises(LeaseSuperseded):
        store.jobs.snooze(claimed.lease, 1)
    # expired: the token matches, the lease ran out
    clock.advance(11)
    with pytest.raises(LeaseExpired):
        store.jobs.snooze(renewed, 1)
    job = store.jobs.get("a")
    assert job is not None
    assert (job.state, job.attempts) == ("leased", 1)  # a refusal writes nothing
    # settled: another attempt took it over and completed it
    other = store.jobs.claim(["k"], owner="other")
    assert other is not None
    assert store.jobs.complete(other.lease, "theirs") is True
    with pytest.raises(JobSettled):
        store.jobs.snooze(renewed, 1)
    # unknown: swept
    store.jobs.sweep(settled_before=now(store) + timedelta(seconds=1))
    with pytest.raises(JobSettled):
        store.jobs.snooze(other.lease, 1)


def test_snooze_refuses_bad_input_and_writes_nothing(store: Store) -> None:
    store.jobs.enqueue("k", id="a")
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    before = store.jobs.get("a")
    with pytest.raises(LeaseRequired):
        store.jobs.snooze("a", 1)  # type: ignore[arg-type]
    for bad, error in [
        (-1, ValueError),
        (math.inf, ValueError),
        (math.nan, ValueError),
        (True, TypeError),
        ("1", TypeError),
        (None, TypeError),
    ]:
        with pytest.raises(error):
            store.jobs.snooze(claimed.lease, bad)  # type: ignore[arg-type]
        with pytest.raises(error):
            Snooze(bad)  # type: ignore[arg-type]
    assert store.jobs.get("a") == before


def test_a_snooze_inside_a_rolled_back_transaction_leaves_the_lease(store: Store) -> None:
    store.jobs.enqueue("k", id="a")
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None

    class Undo(Exception):
        pass

    def snooze_then_undo() -> None:
        with store.transaction() as tx:
            assert tx.jobs.snooze(claimed.lease, 5) is True
            raise Undo

    with pytest.raises(Undo):
        snooze_then_undo()
    job = store.jobs.get("a")
    assert job is not None
    assert (job.state, job.attempts) == ("leased", 1)
    assert store.jobs.complete(claimed.lease) is True


# ---------------------------------------------------------------- the worker


def test_a_handler_that_raises_snooze_is_snoozed_not_failed(store: Store, clock: FakeClock) -> None:
    outcomes = Outcomes()
    store.jobs.enqueue("k", id="a", max_attempts=1)
    calls: list[int] = []

    def handler(payload: Any, ctx: JobContext) -> Any:
        calls.append(ctx.job.attempts)
        if len(calls) <= 5:
            raise Snooze(10)
        return "finally"

    worker = store.jobs.create_worker({"k": handler}, on_outcome=outcomes)
    for _ in range(5):
        assert worker.run_once() is True
        job = store.jobs.get("a")
        assert job is not None
        assert (job.state, job.attempts) == ("pending", 0)
        assert job.run_at == now(store) + timedelta(seconds=10)
        assert worker.run_once() is False  # not due
        clock.advance(10)
    assert worker.run_once() is True
    job = store.jobs.get("a")
    assert job is not None
    # max_attempts=1, snoozed five times, and still it ran to the end
    assert (job.state, job.result, job.attempts) == ("done", "finally", 1)
    assert calls == [1] * 6
    events = outcomes.wait_for(6)
    assert [e.outcome for e in events] == ["snoozed"] * 5 + ["completed"]
    assert all(e.attempt == 1 for e in events)
    assert [e.generation for e in events] == [1, 2, 3, 4, 5, 6]
    stats = worker.stats()
    assert (stats.snoozes, stats.completions, stats.failures) == (5, 1, 0)


def test_snoozes_and_completions_settle_together_in_the_workers_batches(store: Store) -> None:
    outcomes = Outcomes()
    count = 40
    store.jobs.enqueue_many([])
    for n in range(count):
        store.jobs.enqueue("k", {"n": n}, id=f"j{n:02}", max_attempts=1)
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def handler(payload: Any, ctx: JobContext) -> Any:
        with lock:
            seen[ctx.job.id] = seen.get(ctx.job.id, 0) + 1
            first = seen[ctx.job.id] == 1
        if first:
            raise Snooze(0)
        return payload["n"]

    worker = store.jobs.create_worker({"k": handler}, concurrency=4, on_outcome=outcomes)
    with worker:
        events = outcomes.wait_for(2 * count)
    names = [e.outcome for e in events]
    assert names.count("snoozed") == count
    assert names.count("completed") == count
    for n in range(count):
        job = store.jobs.get(f"j{n:02}")
        assert job is not None
        assert (job.state, job.result, job.attempts) == ("done", n, 1)


def test_a_stale_attempts_snooze_in_the_worker_is_lost_by_name(
    store: Store, clock: FakeClock
) -> None:
    outcomes = Outcomes()
    store.jobs.enqueue("k", id="a")
    taken: list[Any] = []

    def handler(payload: Any, ctx: JobContext) -> Any:
        clock.advance(31)  # the lease runs out, and another worker rescues the job
        taken.append(store.jobs.claim(["k"], owner="rescuer"))
        raise Snooze(5)

    worker = store.jobs.create_worker(
        {"k": handler}, lease_seconds=30, renew=False, on_outcome=outcomes
    )
    assert worker.run_once() is True
    (event,) = outcomes.wait_for(1)
    assert (event.outcome, event.phase, event.code) == ("lost", "snooze", LeaseSuperseded.code)
    assert taken[0] is not None
    job = store.jobs.get("a")
    assert job is not None
    assert (job.state, job.attempts) == ("leased", 2)  # the rescuer's attempt holds it


def _long_handler(started: threading.Event) -> Any:
    def handler(payload: Any, ctx: JobContext) -> Any:
        started.set()
        assert ctx.signal.wait(WAIT), "the stop never reached the handler"
        raise RuntimeError("interrupted by the stop")

    return handler


def test_a_handler_stopped_five_times_is_handed_back_never_dead(store: Store) -> None:
    store.jobs.enqueue("long", id="a", max_attempts=2)
    for round_ in range(5):
        outcomes = Outcomes()
        started = threading.Event()
        worker = store.jobs.create_worker(
            {"long": _long_handler(started)}, on_outcome=outcomes, stop_grace_seconds=WAIT
        )
        worker.start()
        assert started.wait(WAIT)
        stopped_at = now(store)
        result = worker.stop()
        assert result.drained
        (event,) = outcomes.wait_for(1)
        assert (event.outcome, event.code) == ("snoozed", "JD2091"), event
        assert event.attempt == 1
        assert event.generation == round_ + 1
        assert "handed back" in (event.reason or "")
        assert worker.stats().snoozes == 1
        assert worker.stats().failures == 0
        job = store.jobs.get("a")
        assert job is not None
        assert (job.state, job.attempts, job.last_error) == ("pending", 0, None)
        assert job.run_at == stopped_at
    final = store.jobs.claim(["long"], owner="last")
    assert final is not None
    assert final.lease.attempt == 1


def test_a_handler_that_raises_while_cancelled_is_cancelled_not_handed_back(
    store: Store,
) -> None:
    outcomes = Outcomes()
    store.jobs.enqueue("long", id="a")
    started = threading.Event()
    leases: list[Any] = []

    def handler(payload: Any, ctx: JobContext) -> Any:
        leases.append(ctx.lease)
        started.set()
        assert ctx.signal.wait(WAIT)
        raise RuntimeError("interrupted by the cancel")

    with store.jobs.create_worker({"long": handler}, on_outcome=outcomes):
        assert started.wait(WAIT)
        assert store.jobs.cancel("a", lease=leases[0]) is True
        (event,) = outcomes.wait_for(1)
    assert event.outcome == "cancelled"
    job = store.jobs.get("a")
    assert job is not None
    assert job.state == "cancelled"


def test_a_handler_that_fails_on_its_own_still_fails(store: Store) -> None:
    outcomes = Outcomes()
    store.jobs.enqueue("k", id="a", max_attempts=1)

    def handler(payload: Any, ctx: JobContext) -> Any:
        raise RuntimeError("a real failure")

    worker = store.jobs.create_worker({"k": handler}, on_outcome=outcomes)
    assert worker.run_once() is True
    (event,) = outcomes.wait_for(1)
    assert event.outcome == "failed"
    job = store.jobs.get("a")
    assert job is not None
    assert job.state == "dead"


# ---------------------------------------------------------------- asyncio


def test_snooze_through_the_async_api(astore: AsyncStore, store: Store, clock: FakeClock) -> None:

    async def main() -> None:
        await astore.jobs.enqueue("k", id="a", max_attempts=1)
        claimed = await astore.jobs.claim(["k"], owner="w")
        assert claimed is not None
        assert await astore.jobs.snooze(claimed.lease, 3) is True
        clock.advance(3)
        again = await astore.jobs.claim(["k"], owner="w")
        assert again is not None
        with pytest.raises(LeaseSuperseded):
            await astore.jobs.snooze(claimed.lease, 3)

    run(main())
    job = store.jobs.get("a")
    assert job is not None
    assert (job.state, job.attempts) == ("leased", 1)


def test_an_async_handler_snoozes_and_is_handed_back_on_stop(
    astore: AsyncStore, store: Store
) -> None:
    events: list[Outcome] = []

    async def main() -> None:
        await astore.jobs.enqueue("s", id="snoozer", max_attempts=1)
        await astore.jobs.enqueue("long", id="long", max_attempts=1)
        loop = asyncio.get_running_loop()
        both = asyncio.Event()
        snoozed = asyncio.Event()
        started = asyncio.Event()

        def seen(outcome: Outcome) -> None:
            events.append(outcome)
            if outcome.job_id == "snoozer":
                loop.call_soon_threadsafe(snoozed.set)
            if len(events) == 2:
                loop.call_soon_threadsafe(both.set)

        async def snoozer(payload: Any, ctx: AsyncJobContext) -> Any:
            raise Snooze(3600)

        async def long(payload: Any, ctx: AsyncJobContext) -> Any:
            loop.call_soon_threadsafe(started.set)
            assert await asyncio.to_thread(ctx.signal.wait, WAIT)
            raise RuntimeError("stopping")

        worker = astore.jobs.create_worker(
            {"s": snoozer, "long": long}, concurrency=2, on_outcome=seen
        )
        await worker.start()
        await asyncio.wait_for(started.wait(), WAIT)
        await asyncio.wait_for(snoozed.wait(), WAIT)
        await worker.stop(grace_seconds=WAIT)
        await asyncio.wait_for(both.wait(), WAIT)

    run(main())
    attempts = sorted((e.job_id, e.generation, e.outcome) for e in events)
    assert len({(job_id, generation) for job_id, generation, _ in attempts}) == len(attempts)
    assert [(j, o) for j, _, o in attempts if j == "snoozer"] == [("snoozer", "snoozed")]
    # "long" was handed back by the stop. A claim of the other loop that was under way
    # when stop() began may have taken it again once it was back (SPEC §7: an in-flight
    # attempt like any other); that attempt is stopped and handed back too
    assert [o for j, _, o in attempts if j == "long"] in (["snoozed"], ["snoozed", "snoozed"])
    for job_id in ("long", "snoozer"):
        job = store.jobs.get(job_id)
        assert job is not None
        assert (job.state, job.attempts) == ("pending", 0)
