"""Periodic jobs on every backend (SPEC §12): each tick enqueued once, by any worker.

A fake clock drives the schedules through ``run_once()``; a started worker's
ticker thread is waited for with events, never by sleeping.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timezone
from typing import Any

import pytest

from jaren_jobs import AsyncStore, Job, JobContext, Outcome, Periodic, Store
from tests.conftest import START, FakeClock

UTC = timezone.utc
WAIT = 10.0
MINUTE = 60.0
# the fake clock's first whole minute at or after START
FIRST_MINUTE = (int(START) // 60 + 1) * 60.0


def at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def tick_id(name: str, epoch: float) -> str:
    return f"periodic:{name}:{int(epoch * 1000)}"


def jobs_of(store: Store, kind: str) -> list[Job]:
    with store.jobs.page(kind=kind, limit=1000) as page:
        return list(page)


def noop(payload: Any, ctx: JobContext) -> None:
    return None


def to_minute(clock: FakeClock, epoch: float) -> None:
    clock.advance(epoch - clock.now())


# ------------------------------------------------------------ run_once


def test_run_once_enqueues_the_due_tick_once_and_its_run_at_is_the_tick(
    store: Store, clock: FakeClock
) -> None:
    ran: list[str] = []

    def beat(payload: Any, ctx: JobContext) -> None:
        ran.append(ctx.job.id)

    schedule = Periodic("beat", "beat", every_seconds=MINUTE, payload={"n": 1})
    worker = store.jobs.create_worker({"beat": beat}, periodic=[schedule])
    to_minute(clock, FIRST_MINUTE)
    assert worker.run_once() is True  # the tick's job, enqueued and then run
    first = store.jobs.get(tick_id("beat", FIRST_MINUTE))
    assert first is not None
    assert (first.kind, first.payload, first.state) == ("beat", {"n": 1}, "done")
    assert first.run_at == at(FIRST_MINUTE)
    assert ran == [first.id]
    # the same instant again, and later within the minute: nothing new
    assert worker.run_once() is False
    clock.advance(59.9)
    assert worker.run_once() is False
    assert [job.id for job in jobs_of(store, "beat")] == [first.id]
    # the next minute: its tick
    to_minute(clock, FIRST_MINUTE + MINUTE)
    assert worker.run_once() is True
    second = store.jobs.get(tick_id("beat", FIRST_MINUTE + MINUTE))
    assert second is not None
    assert second.run_at == at(FIRST_MINUTE + MINUTE)
    assert len(jobs_of(store, "beat")) == 2
    worker.stop()


def test_the_first_check_enqueues_the_latest_tick_at_or_before_now(
    store: Store, clock: FakeClock
) -> None:
    # started mid-minute: the minute's tick is the one a gap may have missed
    to_minute(clock, FIRST_MINUTE + 25)
    worker = store.jobs.create_worker(
        {"other": noop}, periodic=[Periodic("m", "minutely", cron="* * * * *")]
    )
    worker.run_once()
    (job,) = jobs_of(store, "minutely")
    assert job.id == tick_id("m", FIRST_MINUTE)
    # enqueued late, its run_at is still its tick (SPEC §12)
    assert job.run_at == at(FIRST_MINUTE)
    assert job.state == "pending"  # no handler for it here: another worker runs it
    worker.stop()


def test_a_tick_is_enqueued_once_even_after_its_job_settled(store: Store, clock: FakeClock) -> None:
    schedule = Periodic("once", "once", every_seconds=MINUTE)
    to_minute(clock, FIRST_MINUTE)
    first = store.jobs.create_worker({"once": noop}, periodic=[schedule])
    assert first.run_once() is True
    first.stop()
    done = store.jobs.get(tick_id("once", FIRST_MINUTE))
    assert done is not None
    assert done.state == "done"
    # a new worker (a restart) at the same instant: the id is taken, forever
    again = store.jobs.create_worker({"once": noop}, periodic=[schedule])
    assert again.run_once() is False
    assert len(jobs_of(store, "once")) == 1
    again.stop()


def test_two_workers_on_one_store_enqueue_each_tick_once(store: Store, clock: FakeClock) -> None:
    schedules = [
        Periodic("fast", "fast", every_seconds=MINUTE),
        Periodic("cron", "cron", cron="*/2 * * * *"),
    ]
    one = store.jobs.create_worker({"x": noop}, periodic=schedules)
    two = store.jobs.create_worker({"x": noop}, periodic=list(reversed(schedules)))
    to_minute(clock, FIRST_MINUTE)
    for step in range(10):
        for worker in (one, two) if step % 2 else (two, one):
            worker.run_once()
            worker.run_once()
        clock.advance(MINUTE)
    fast = sorted(job.id for job in jobs_of(store, "fast"))
    assert fast == sorted(tick_id("fast", FIRST_MINUTE + n * MINUTE) for n in range(10))
    cron = sorted(job.id for job in jobs_of(store, "cron"))
    expected = [
        FIRST_MINUTE + n * MINUTE for n in range(10) if (FIRST_MINUTE + n * MINUTE) % 120 == 0
    ]
    if FIRST_MINUTE % 120:  # the first check caught up on the even minute before
        expected.insert(0, FIRST_MINUTE - MINUTE)
    assert cron == sorted(tick_id("cron", t) for t in expected)
    for job in jobs_of(store, "fast") + jobs_of(store, "cron"):
        tick = int(job.id.rsplit(":", 1)[1]) / 1000
        # each at its tick, the caught-up one too
        assert job.run_at == at(tick)
    one.stop()
    two.stop()


def test_after_a_gap_only_the_latest_missed_tick_is_enqueued(
    store: Store, clock: FakeClock
) -> None:
    schedule = Periodic("gap", "gap", every_seconds=MINUTE)
    to_minute(clock, FIRST_MINUTE)
    before = store.jobs.create_worker({"gap": noop}, periodic=[schedule])
    before.run_once()
    before.stop()
    # ten and a half minutes with no worker: ticks 1..10 were missed
    clock.advance(10.5 * MINUTE)
    after = store.jobs.create_worker({"gap": noop}, periodic=[schedule])
    after.run_once()
    ids = sorted(job.id for job in jobs_of(store, "gap"))
    assert ids == [tick_id("gap", FIRST_MINUTE), tick_id("gap", FIRST_MINUTE + 10 * MINUTE)]
    # and a running worker whose checks come late catches up the same way
    clock.advance(5 * MINUTE)
    after.run_once()
    assert len(jobs_of(store, "gap")) == 3
    assert store.jobs.get(tick_id("gap", FIRST_MINUTE + 15 * MINUTE)) is not None
    after.stop()


def test_a_cron_schedule_in_a_zone_follows_its_wall_clock(store: Store, clock: FakeClock) -> None:
    # START is 2027-01-15 08:00 UTC; 09:00 in Berlin is 08:00 UTC in winter
    schedule = Periodic("berlin", "report", cron="0 9 * * *", timezone="Europe/Berlin")
    tick = schedule.next_after(at(clock.now()))
    assert tick == datetime(2027, 1, 16, 8, 0, tzinfo=UTC)
    worker = store.jobs.create_worker({"x": noop}, periodic=[schedule])
    to_minute(clock, tick.timestamp())
    worker.run_once()
    ids = {job.id for job in jobs_of(store, "report")}
    assert tick_id("berlin", tick.timestamp()) in ids
    worker.stop()


# ------------------------------------------------------------ skipping


def test_by_default_a_tick_is_enqueued_while_the_previous_run_is_unsettled(
    store: Store, clock: FakeClock
) -> None:
    schedule = Periodic("pile", "pile", every_seconds=MINUTE)
    worker = store.jobs.create_worker({"x": noop}, periodic=[schedule])
    to_minute(clock, FIRST_MINUTE)
    for _ in range(3):
        worker.run_once()
        clock.advance(MINUTE)
    assert [job.state for job in jobs_of(store, "pile")] == ["pending"] * 3
    worker.stop()


def test_skip_while_unsettled_skips_ticks_until_the_previous_run_settles(
    store: Store, clock: FakeClock
) -> None:
    schedule = Periodic("slow", "slow", every_seconds=MINUTE, skip_while_unsettled=True)
    # this worker enqueues the ticks; the test plays the one that runs them
    worker = store.jobs.create_worker({"x": noop}, periodic=[schedule])
    to_minute(clock, FIRST_MINUTE)
    worker.run_once()
    assert [job.id for job in jobs_of(store, "slow")] == [tick_id("slow", FIRST_MINUTE)]
    claimed = store.jobs.claim(["slow"], owner="runner", lease_seconds=3600)
    assert claimed is not None
    for minute in (1, 2, 3):  # leased, then still leased: skipped (no job written)
        to_minute(clock, FIRST_MINUTE + minute * MINUTE)
        worker.run_once()
    assert len(jobs_of(store, "slow")) == 1
    assert store.jobs.complete(claimed.lease) is True
    to_minute(clock, FIRST_MINUTE + 4 * MINUTE)
    worker.run_once()
    assert sorted(job.id for job in jobs_of(store, "slow")) == [
        tick_id("slow", FIRST_MINUTE),
        tick_id("slow", FIRST_MINUTE + 4 * MINUTE),
    ]
    # the run of minute 4 is pending: minute 5 is skipped again
    to_minute(clock, FIRST_MINUTE + 5 * MINUTE)
    worker.run_once()
    assert len(jobs_of(store, "slow")) == 2
    worker.stop()


# ------------------------------------------------------------ a started worker


def test_a_started_worker_enqueues_ticks_from_its_ticker_thread(
    store: Store, clock: FakeClock
) -> None:
    settled: list[Outcome] = []
    once, both = threading.Event(), threading.Event()

    def observe(outcome: Outcome) -> None:
        # the settlement committed: only now may the fake clock move on (a
        # lease that outlived it in fake time would be re-claimed)
        settled.append(outcome)
        (once if len(settled) == 1 else both).set()

    to_minute(clock, FIRST_MINUTE)
    worker = store.jobs.create_worker(
        {"beat": noop},
        poll_seconds=0.05,
        on_outcome=observe,
        periodic=[Periodic("live", "beat", every_seconds=MINUTE)],
    ).start()
    try:
        # the first tick is enqueued and run without run_once()
        assert once.wait(WAIT)
        to_minute(clock, FIRST_MINUTE + MINUTE)
        assert both.wait(WAIT)
    finally:
        stopped = worker.stop()
    assert stopped.drained
    assert [(o.outcome, o.job_id) for o in settled] == [
        ("completed", tick_id("live", FIRST_MINUTE)),
        ("completed", tick_id("live", FIRST_MINUTE + MINUTE)),
    ]
    assert not [t for t in threading.enumerate() if t.name == f"{worker.name}-ticks"]


def test_async_worker_run_once_enqueues_the_due_tick(
    astore: AsyncStore, store: Store, clock: FakeClock
) -> None:
    ran: list[str] = []

    async def beat(payload: Any, ctx: Any) -> None:
        ran.append(ctx.job.id)

    async def main() -> None:
        worker = astore.jobs.create_worker(
            {"beat": beat}, periodic=[Periodic("aio", "beat", every_seconds=MINUTE)]
        )
        async with worker:
            pass
        again = astore.jobs.create_worker(
            {"beat": beat}, periodic=[Periodic("aio2", "beat", every_seconds=MINUTE)]
        )
        assert await again.run_once() is True
        await again.stop()

    to_minute(clock, FIRST_MINUTE)
    asyncio.run(asyncio.wait_for(main(), WAIT * 3))
    assert tick_id("aio2", FIRST_MINUTE) in ran


def test_a_clock_that_jumps_ahead_and_is_corrected_delays_no_later_tick(
    store: Store, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    # SPEC §12; issue 26 item 6: the ticker kept its next due time from the jump
    schedule = Periodic("ntp", "ntp", every_seconds=MINUTE)
    worker = store.jobs.create_worker({"other": noop}, periodic=[schedule])
    to_minute(clock, FIRST_MINUTE)
    worker.run_once()
    # a day's excursion ahead, seen by one check, then corrected back
    clock.advance(24 * 60 * MINUTE)
    worker.run_once()
    to_minute(clock, FIRST_MINUTE + 30)
    with caplog.at_level("WARNING", logger="jaren_jobs"):
        worker.run_once()
    assert any("moved back" in r.getMessage() for r in caplog.records), caplog.text
    # every minute of the hour after the correction has its tick, each once
    for minute in range(1, 61):
        to_minute(clock, FIRST_MINUTE + minute * MINUTE)
        worker.run_once()
        worker.run_once()
    ids = {job.id for job in jobs_of(store, "ntp")}
    expected = {tick_id("ntp", FIRST_MINUTE + m * MINUTE) for m in range(61)}
    assert expected <= ids
    # and nothing else but the one tick the excursion enqueued
    assert ids - expected == {tick_id("ntp", FIRST_MINUTE + 24 * 60 * MINUTE)}
    worker.stop()


def test_an_async_worker_ticks_on_after_the_clock_is_corrected(
    astore: AsyncStore, store: Store, clock: FakeClock
) -> None:
    async def main() -> None:
        worker = astore.jobs.create_worker(
            {"other": noop}, periodic=[Periodic("antp", "antp", every_seconds=MINUTE)]
        )
        to_minute(clock, FIRST_MINUTE)
        await worker.run_once()
        clock.advance(24 * 60 * MINUTE)
        await worker.run_once()
        to_minute(clock, FIRST_MINUTE + MINUTE)
        await worker.run_once()
        await worker.stop()

    asyncio.run(asyncio.wait_for(main(), WAIT * 3))
    assert store.jobs.get(tick_id("antp", FIRST_MINUTE + MINUTE)) is not None


# ------------------------------------------------------------ mistakes


def test_two_schedules_with_one_name_are_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="two schedules are named 'same'"):
        store.jobs.create_worker(
            {"x": noop},
            periodic=[
                Periodic("same", "a", every_seconds=5),
                Periodic("same", "b", cron="@daily"),
            ],
        )


@pytest.mark.parametrize(
    "periodic",
    [Periodic("p", "k", every_seconds=5), "p", [{"name": "p"}], 5],
)
def test_periodic_must_be_a_list_of_periodic(store: Store, periodic: Any) -> None:
    with pytest.raises(TypeError, match="periodic"):
        store.jobs.create_worker({"x": noop}, periodic=periodic)
