"""Spawn targets for the PostgreSQL process tests (importable, so ``spawn`` finds them).

Like :mod:`tests.processes.chaos_targets`, every target reports through files
(append-only JSON Lines, one ``write()`` per line, so a SIGKILL never tears
one) or multiprocessing primitives: a process the test kills must leave behind
what it wrote before it died. Run as ``python -m tests.processes.pg_targets
worker SETTINGS_JSON`` it is a worker for a process started by a command line
(``ip netns exec``), with files for its ready and stop events.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from jaren_jobs import JobContext, JobsError, Outcome, open_store
from tests.processes.chaos_targets import _LineLog, _ProblemLog

KIND = "pgwork"
EXECUTIONS = "pg_executions"
CREATE_EXECUTIONS = (
    f"CREATE TABLE IF NOT EXISTS {EXECUTIONS} (job_id TEXT NOT NULL, attempt INTEGER NOT NULL, "
    "generation INTEGER NOT NULL, pid INTEGER NOT NULL, incarnation TEXT NOT NULL)"
)


class FileEvent:
    """An event a process started from a command line can share: set = the file exists."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._pause = threading.Event()  # never set: the pacing of wait()

    def set(self) -> None:
        self.path.write_text("1")

    def is_set(self) -> bool:
        return self.path.exists()

    def wait(self, timeout: float | None = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            if end is not None and time.monotonic() >= end:
                return False
            self._pause.wait(0.05)
        return True


def _wait_for(event: Any) -> None:
    """Wait for ``event``, but never outlive a multiprocessing parent."""
    parent = multiprocessing.parent_process()
    while not event.wait(0.5):
        if parent is not None and not parent.is_alive():
            return


def pg_worker(settings: dict[str, Any], ready: Any, stop: Any, started: Any = None) -> None:
    """Run one worker on ``settings["url"]`` until ``stop`` is set (or this process is killed).

    Each execution inserts a row into the executions table, through this
    process's store, before the handler returns; ``started`` (a queue), when
    given, gets ``(job_id, generation, time.monotonic())`` as each handler
    begins. A job whose payload has ``"hold": true`` waits in its handler for
    the file ``settings["release"]`` before it returns. Every outcome goes to
    ``outcomes-<incarnation>.jsonl`` as it happens; a stopped process writes
    ``report-<incarnation>.json`` (stats, stop outcome, WARNING+ log lines).
    """
    folder = Path(settings["folder"])
    incarnation: str = settings["incarnation"]
    pid = os.getpid()
    outcomes = _LineLog(folder / f"outcomes-{incarnation}.jsonl")
    problems = _ProblemLog()
    import logging

    logging.getLogger("jaren_jobs").addHandler(problems)
    report: dict[str, Any] = {"incarnation": incarnation, "pid": pid, "error": None}
    counted: dict[str, int] = {}
    lock = threading.Lock()
    release = FileEvent(settings["release"]) if settings.get("release") else None
    # psycopg's placeholders; "?" lets the same target run on an SQLite file (a dry run)
    mark = settings.get("placeholder", "%s")
    insert = (
        f"INSERT INTO {EXECUTIONS} (job_id, attempt, generation, pid, incarnation) "
        f"VALUES ({', '.join([mark] * 5)})"
    )

    def record(event: Outcome) -> None:
        outcomes.write(
            {
                "outcome": event.outcome,
                "job_id": event.job_id,
                "generation": event.generation,
                "attempt": event.attempt,
                "phase": event.phase,
                "code": event.code,
                "incarnation": incarnation,
            }
        )
        with lock:
            counted[event.outcome] = counted.get(event.outcome, 0) + 1

    try:
        with open_store(settings["url"], durability=settings.get("durability", "full")) as store:

            def execute(payload: Any, ctx: JobContext) -> Any:
                lease = ctx.lease
                if started is not None:
                    started.put((ctx.job.id, lease.generation, time.monotonic()))
                with store.transaction() as tx:
                    tx.execute(
                        insert, (ctx.job.id, lease.attempt, lease.generation, pid, incarnation)
                    )
                payload = payload or {}
                if payload.get("hold") and release is not None:
                    release.wait(60)
                work = payload.get("work_ms", 0)
                if work:
                    ctx.signal.wait(work / 1000)
                return {"by": incarnation, "generation": lease.generation}

            worker = store.jobs.create_worker(
                {KIND: execute},
                concurrency=settings["concurrency"],
                lease_seconds=settings["lease_seconds"],
                poll_seconds=settings["poll_seconds"],
                on_outcome=record,
            )
            worker.start()
            ready.set()
            _wait_for(stop)
            stopped = worker.stop(10.0)
            report["stop"] = dataclasses.asdict(stopped)
            report["stats"] = dataclasses.asdict(worker.stats())
            with lock:
                report["outcomes"] = dict(counted)
    except BaseException:
        report["error"] = traceback.format_exc()
    finally:
        outcomes.close()
    report["problems"] = problems.lines
    (folder / f"report-{incarnation}.json").write_text(json.dumps(report), encoding="utf-8")


def pg_enqueuer(settings: dict[str, Any], ready: Any, stop: Any) -> None:
    """Enqueue one job at a time until ``stop``; log every id it was told was enqueued.

    ``acked.jsonl`` gets an id only after ``enqueue`` returned for it;
    ``refused.jsonl`` gets the ids whose enqueue raised (with the error's
    class and code), which may or may not exist afterwards.
    """
    folder = Path(settings["folder"])
    acked = _LineLog(folder / "acked.jsonl")
    refused = _LineLog(folder / "refused.jsonl")
    pause = threading.Event()
    report: dict[str, Any] = {"error": None, "raw": []}
    try:
        with open_store(settings["url"], durability="full") as store:
            ready.set()
            n = 0
            while not stop.is_set():
                n += 1
                job_id = f"e-{n:06d}"
                try:
                    store.jobs.enqueue(KIND, {"work_ms": 2}, id=job_id, max_attempts=1000)
                except JobsError as exc:
                    refused.write({"id": job_id, "error": type(exc).__name__, "code": exc.code})
                    pause.wait(0.05)  # the server is away: do not spin
                    continue
                except Exception as exc:  # a raw driver error: the test fails on it
                    report["raw"].append(repr(exc))
                    refused.write({"id": job_id, "error": repr(exc), "code": None})
                    continue
                acked.write({"id": job_id, "at": time.monotonic()})
                pause.wait(settings.get("every_seconds", 0.005))
    except BaseException:
        report["error"] = traceback.format_exc()
    finally:
        acked.close()
        refused.close()
    (folder / "report-enqueuer.json").write_text(json.dumps(report), encoding="utf-8")


def main(argv: list[str]) -> int:
    command, settings_text = argv
    if command != "worker":
        raise SystemExit(f"unknown command {command!r}")
    settings = json.loads(settings_text)
    pg_worker(settings, FileEvent(settings["ready"]), FileEvent(settings["stop"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
