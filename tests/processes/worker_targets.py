"""Spawn targets for the multi-process worker tests (importable, so spawn can find them)."""

from __future__ import annotations

import dataclasses
import threading
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

from jaren_jobs import JobContext, Outcome, open_store


def noop(payload: Any, ctx: JobContext) -> Any:
    return None


def drain_with_worker(settings: dict[str, Any], go: Event, reports: Queue[dict[str, Any]]) -> None:
    """Run one worker until no job is pending or leased; report what it did.

    ``settings``: ``db_path``, ``kind``, ``concurrency``, ``deadline_seconds``.
    """
    db_path: str = settings["db_path"]
    kind: str = settings["kind"]
    concurrency: int = settings["concurrency"]
    deadline_seconds: float = settings["deadline_seconds"]
    outcomes: list[tuple[str, str, int]] = []
    lock = threading.Lock()

    def record(event: Outcome) -> None:
        with lock:
            outcomes.append((event.outcome, event.job_id, event.generation))

    report: dict[str, Any] = {"error": None}
    try:
        with open_store(db_path, durability="normal") as store:
            worker = store.jobs.create_worker(
                {kind: noop}, concurrency=concurrency, poll_seconds=0.02, on_outcome=record
            )
            reports.put({"ready": True})
            if not go.wait(deadline_seconds):
                raise TimeoutError("the parent never said go")
            worker.start()
            pause = threading.Event()  # never set: a bounded wait between checks
            waited = 0.0
            while waited < deadline_seconds:
                counts = store.jobs.counts()
                if counts.pending + counts.failed + counts.leased == 0:
                    break
                pause.wait(0.05)
                waited += 0.05
            stopped = worker.stop(10.0)
            report["stop"] = dataclasses.asdict(stopped)
            report["stats"] = dataclasses.asdict(worker.stats())
            with lock:
                report["outcomes"] = list(outcomes)
    except BaseException as exc:
        report["error"] = repr(exc)
    reports.put(report)
