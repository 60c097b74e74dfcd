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


def record_executions(settings: dict[str, Any], busy: Event, done: Event) -> None:
    """Run one worker whose handler appends ``<job id> <generation>`` to a file as it starts.

    Each line is one ``os.write`` on an ``O_APPEND`` descriptor, so a SIGKILL
    loses no execution the handler recorded. ``busy`` is set once this
    process has executed ``settings["busy_after"]`` jobs (the parent kills it
    then, mid-stream); with ``settings["drain"]`` the worker instead runs
    until nothing is pending, failed or leased, stops, and sets ``done``.
    """
    import os

    fd = os.open(settings["executions"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    busy_after: int = settings["busy_after"]
    executed = [0]
    lock = threading.Lock()

    def handler(payload: Any, ctx: JobContext) -> Any:
        os.write(fd, f"{ctx.job.id} {ctx.lease.generation}\n".encode())
        with lock:
            executed[0] += 1
            if executed[0] == busy_after:
                busy.set()
        return None

    with open_store(settings["db_path"], durability="normal") as store:
        worker = store.jobs.create_worker(
            {settings["kind"]: handler},
            concurrency=settings["concurrency"],
            lease_seconds=settings["lease_seconds"],
            poll_seconds=0.02,
        )
        worker.start()
        pause = threading.Event()  # never set: a bounded wait between checks
        while True:
            if not settings["drain"]:
                pause.wait(1.0)  # the parent SIGKILLs this process
                continue
            counts = store.jobs.counts()
            if counts.pending + counts.failed + counts.leased == 0:
                break
            pause.wait(0.05)
        worker.stop(10.0)
    os.close(fd)
    done.set()
