"""Four worker processes, the same three schedules, one fake clock: each tick once (issue 16).

The parent moves a fake clock every process reads (a shared
``multiprocessing.Value``) in steps shorter than a minute, and after each step
waits until the ticks due at that instant exist before moving on — so the set
of jobs the workers must have enqueued is known exactly: the latest tick of
each schedule at each step. The clock runs across Berlin's autumn overlap
(2026-10-25), where a half-hourly schedule must fire the repeated 02:00 and
02:30 once each. Then every worker stops, the clock jumps past many ticks, and
a restart enqueues at most the latest missed tick per schedule.
"""

from __future__ import annotations

import multiprocessing
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import Store, open_store
from tests.processes.periodic_targets import KINDS, run_ticking_worker, schedules
from tests.processes.pg_support import Schema

PROCESSES = 4
STEP_SECONDS = 20.0
STEP_WAIT = 30.0
DEADLINE = 120.0
UTC = timezone.utc
# 02:20 CEST on 2026-10-25; at 03:00 CEST (01:00 UTC) Berlin's clocks go back to 02:00 CET
START = datetime(2026, 10, 25, 0, 20, 3, tzinfo=UTC).timestamp()
END = datetime(2026, 10, 25, 1, 40, tzinfo=UTC).timestamp()
GAP_SECONDS = 70 * 60 + 7.0  # to 02:50:07 UTC: 4,200 seconds, 70 minutes, 2 half hours


def _due_ids(at: float) -> set[str]:
    """The job ids of every schedule's latest tick at or before ``at`` (pure)."""
    moment = datetime.fromtimestamp(at, UTC)
    return {s.job_id(s.latest_at_or_before(moment)) for s in schedules()}


def _ids(store: Store) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {kind: set() for kind in KINDS}
    for kind in KINDS:
        with store.jobs.page(kind=kind, limit=1000) as page:
            found[kind] = {job.id for job in page}
    return found


def _wait_for(store: Store, ids: set[str], waiter: Any) -> None:
    """Until every id exists: the event here is a row appearing in another process."""
    left = STEP_WAIT
    while any(store.jobs.get(i) is None for i in ids):
        assert left > 0, (
            f"ticks never enqueued: {sorted(i for i in ids if store.jobs.get(i) is None)}"
        )
        waiter.wait(0.005)
        left -= 0.005


def _run_phase(
    target: str, clock: Any, start: float, end: float | None, store: Store
) -> tuple[list[dict[str, Any]], set[str]]:
    """Start the processes at ``start``; step the clock to ``end``; stop them; their reports."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    reports: Any = ctx.Queue()
    waiter = ctx.Event()  # never set: a bounded wait between reads
    clock.value = start
    expected = _due_ids(start)
    children = [
        ctx.Process(target=run_ticking_worker, args=(target, clock, stop, reports))
        for _ in range(PROCESSES)
    ]
    for child in children:
        child.start()
    try:
        for _ in children:
            assert reports.get(timeout=DEADLINE) == {"ready": True}
        _wait_for(store, expected, waiter)
        at = start
        while end is not None and at < end:
            at = min(at + STEP_SECONDS, end)
            clock.value = at
            due = _due_ids(at)
            _wait_for(store, due, waiter)
            expected |= due
        stop.set()
        results = [reports.get(timeout=DEADLINE) for _ in children]
    finally:
        stop.set()
        for child in children:
            child.join(DEADLINE)
            if child.is_alive():  # pragma: no cover - only on a hung child
                child.kill()
    assert [child.exitcode for child in children] == [0] * PROCESSES
    assert [r["error"] for r in results] == [None] * PROCESSES
    assert all(r["stop"]["drained"] for r in results)
    return results, expected


def _check_ran_once(results: list[dict[str, Any]], store: Store) -> None:
    completed = Counter(
        job_id for r in results for outcome, job_id in r["outcomes"] if outcome == "completed"
    )
    assert set(completed.values()) <= {1}, completed.most_common(3)
    for kind in KINDS:
        with store.jobs.page(kind=kind, limit=1000) as page:
            for job in page:
                assert job.state in ("done", "pending")  # pending: enqueued as the phase ended


def _scenario(target: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    clock = ctx.Value("d", START)
    with open_store(target) as store:
        results, expected = _run_phase(target, clock, START, END, store)
        found = _ids(store)
        everything = set().union(*found.values())
        # exactly the due ticks: none missed, none twice, no backlog
        assert everything == expected
        assert len(found["every"]) == 1 + round((END - START) / STEP_SECONDS)
        assert len(found["minute"]) == 81  # 00:20 .. 01:40 UTC
        berlin = sorted(int(i.rsplit(":", 1)[1]) // 1000 for i in found["dst"])
        assert [datetime.fromtimestamp(t, UTC).strftime("%H:%M") for t in berlin] == [
            "00:00",  # 02:00 CEST: the first check caught it up
            "00:30",  # 02:30 CEST
            # 02:00 and 02:30 CET (01:00, 01:30 UTC) are the repeated hour: not again
        ]
        _check_ran_once(results, store)

        # a gap with no worker: many missed ticks of each schedule
        restart_at = END + GAP_SECONDS
        results, due = _run_phase(target, clock, restart_at, None, store)
        after = _ids(store)
        new = {kind: after[kind] - found[kind] for kind in KINDS}
        assert {kind: len(ids) for kind, ids in new.items()} == {
            "every": 1,
            "minute": 1,
            "dst": 1,
        }
        # of 03:00 and 03:30 CET (02:00, 02:30 UTC), only the latest
        assert new["dst"] == {
            f"periodic:dst:{int(datetime(2026, 10, 25, 2, 30, tzinfo=UTC).timestamp()) * 1000}"
        }
        assert set().union(*new.values()) == due
        _check_ran_once(results, store)


@pytest.mark.slow
def test_four_processes_enqueue_each_tick_once_on_sqlite(tmp_path: Path) -> None:
    _scenario(str(tmp_path / "periodic.db"))


@pytest.mark.slow
def test_four_processes_enqueue_each_tick_once_on_postgres(pg_schema: Schema) -> None:
    _scenario(pg_schema.url)
