"""Spawn targets for the periodic-ticks process test (importable, so spawn can find them).

Every process reads ONE fake clock, a ``multiprocessing.Value`` the parent
moves; each runs a worker given the same schedules, which enqueues their ticks.
"""

from __future__ import annotations

import dataclasses
import threading
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from typing import Any

from jaren_jobs import JobContext, Outcome, Periodic, Runtime, open_store

KINDS = ("every", "minute", "dst")


def schedules() -> list[Periodic]:
    """The three schedules every process runs."""
    return [
        Periodic("every", "every", every_seconds=1),
        Periodic("minute", "minute", cron="* * * * *"),
        # every half hour on Berlin's wall clock: the test runs across the
        # autumn overlap, whose repeated 02:00 and 02:30 must not fire again
        Periodic("dst", "dst", cron="*/30 * * * *", timezone="Europe/Berlin"),
    ]


def noop(payload: Any, ctx: JobContext) -> Any:
    return None


def run_ticking_worker(
    target: str,
    clock: Synchronized[float],
    stop: Event,
    reports: Queue[dict[str, Any]],
) -> None:
    """Run a worker with :func:`schedules` on the shared fake clock until ``stop`` is set."""
    outcomes: list[tuple[str, str]] = []
    lock = threading.Lock()

    def record(event: Outcome) -> None:
        with lock:
            outcomes.append((event.outcome, event.job_id))

    def now() -> float:
        return float(clock.value)

    report: dict[str, Any] = {"error": None}
    try:
        with open_store(target, runtime=Runtime(now=now)) as store:
            worker = store.jobs.create_worker(
                dict.fromkeys(KINDS, noop),
                concurrency=2,
                poll_seconds=0.02,
                # the fake clock jumps by many seconds at a time: no lease may
                # lapse in fake time while its job runs
                lease_seconds=24 * 3600,
                on_outcome=record,
                periodic=schedules(),
            )
            worker.start()
            reports.put({"ready": True})
            stop.wait(300)
            stopped = worker.stop(10.0)
            report["stop"] = dataclasses.asdict(stopped)
            with lock:
                report["outcomes"] = list(outcomes)
    except BaseException as exc:
        report["error"] = repr(exc)
    reports.put(report)
