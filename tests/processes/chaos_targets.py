"""Spawn targets for the chaos and fault tests (importable, so ``spawn`` can find them).

Every target reports through files or multiprocessing primitives only: a
process the test SIGKILLs must leave behind whatever it wrote before it died,
and nothing a dead process held may be needed by the parent.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import os
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from jaren_jobs import (
    JobContext,
    JobsError,
    NewJob,
    Outcome,
    Runtime,
    StorageError,
    open_store,
)

# ------------------------------------------------------------------ chaos workers

CHAOS_KIND = "chaos"
EXECUTIONS_TABLE = "chaos_executions"
CREATE_EXECUTIONS = (
    f"CREATE TABLE IF NOT EXISTS {EXECUTIONS_TABLE} "
    "(job_id TEXT NOT NULL, attempt INTEGER NOT NULL, generation INTEGER NOT NULL, "
    "pid INTEGER NOT NULL, incarnation TEXT NOT NULL)"
)


class _LineLog:
    """Append-only JSON Lines, one ``write()`` per line, so a SIGKILL never tears one."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record) + "\n").encode("utf-8")
        with self._lock:
            os.write(self._fd, data)

    def close(self) -> None:
        os.close(self._fd)


class _ProblemLog(logging.Handler):
    """Keeps every WARNING-or-worse record the library logs, for the parent to inspect."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname}: {record.getMessage()}")


def _wait_for(event: Any) -> None:
    """Wait for ``event``, but never outlive the parent (an orphan would run forever)."""
    parent = multiprocessing.parent_process()
    while not event.wait(0.5):
        if parent is not None and not parent.is_alive():
            return


def chaos_worker(settings: dict[str, Any], ready: Any, stop: Any, started: Any = None) -> None:
    """Run one worker until ``stop`` is set (or until the supervisor kills this process).

    The one worker target of the process tests, on either database: it opens
    ``settings["url"]`` (PostgreSQL, :func:`tests.processes.pg_targets.pg_worker`) or
    ``settings["db_path"]`` (an SQLite file) and runs the jobs of ``settings["kind"]``.
    Every execution of the handler is recorded, in its own short transaction
    through this process's store, in the executions table *before* the
    handler returns; ``started`` (a queue), when given, gets ``(job_id,
    generation, time.monotonic())`` as each handler begins. A job whose payload
    has ``"hold": true`` waits in its handler for the file ``settings["release"]``;
    one with ``"work_ms"`` works that long. Every outcome is appended to
    ``outcomes-<incarnation>.jsonl`` as it happens (so a killed process leaves its
    outcomes behind). A process that is stopped rather than killed writes
    ``report-<incarnation>.json``: its stats, its stop outcome and anything the
    library logged at WARNING or worse.
    """
    folder = Path(settings["folder"])
    incarnation: str = settings["incarnation"]
    pid = os.getpid()
    outcomes = _LineLog(folder / f"outcomes-{incarnation}.jsonl")
    problems = _ProblemLog()
    logging.getLogger("jaren_jobs").addHandler(problems)
    report: dict[str, Any] = {"incarnation": incarnation, "pid": pid, "error": None}
    counted: dict[str, int] = {}
    counted_lock = threading.Lock()
    release = FileEvent(settings["release"]) if settings.get("release") else None
    # the driver's placeholders: "?" for SQLite, "%s" for psycopg
    mark = settings.get("placeholder", "?")
    insert = (
        f"INSERT INTO {settings.get('executions', EXECUTIONS_TABLE)} "
        f"(job_id, attempt, generation, pid, incarnation) VALUES ({', '.join([mark] * 5)})"
    )

    def record_outcome(event: Outcome) -> None:
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
        with counted_lock:
            counted[event.outcome] = counted.get(event.outcome, 0) + 1

    try:
        target = settings["url"] if "url" in settings else settings["db_path"]
        with open_store(target, durability=settings.get("durability", "full")) as store:

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
                # a little work, so kills land inside attempts as well as between them
                work = payload.get("work_ms", 0)
                if work:
                    ctx.signal.wait(work / 1000)
                return {"by": incarnation, "generation": lease.generation}

            worker = store.jobs.create_worker(
                {settings.get("kind", CHAOS_KIND): execute},
                concurrency=settings["concurrency"],
                lease_seconds=settings["lease_seconds"],
                poll_seconds=settings["poll_seconds"],
                on_outcome=record_outcome,
            )
            worker.start()
            ready.set()
            _wait_for(stop)
            stopped = worker.stop(10.0)
            report["stop"] = dataclasses.asdict(stopped)
            report["stats"] = dataclasses.asdict(worker.stats())
            with counted_lock:
                report["outcomes"] = dict(counted)
    except BaseException:
        report["error"] = traceback.format_exc()
    finally:
        outcomes.close()
    report["problems"] = problems.lines
    (folder / f"report-{incarnation}.json").write_text(json.dumps(report), encoding="utf-8")


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


# ------------------------------------------------------------------ a crash inside a transaction

BUSINESS_TABLE = "orders"
CREATE_BUSINESS = (
    f"CREATE TABLE IF NOT EXISTS {BUSINESS_TABLE} (id TEXT PRIMARY KEY, total INTEGER)"
)


def _die(how: str) -> None:
    if how == "exit":
        os._exit(3)  # no cleanup, no atexit, no close: what a crash leaves
    elif how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "wait-for-kill":
        threading.Event().wait(120)  # the parent SIGKILLs this process while it waits
    else:
        raise ValueError(how)
    os._exit(4)  # pragma: no cover - only if the kill did not kill


def crash_in_transaction(db_path: str, how: str, when: str, inside: Any) -> None:
    """Write an order and enqueue its job in one transaction; die before or after commit.

    ``when`` is ``"before-commit"`` (die inside the ``with`` block, after both
    writes) or ``"after-commit"`` (die right after the block, without closing).
    ``inside`` is set once both writes are made, before the process dies.
    """
    store = open_store(db_path, durability="full")
    with store.transaction() as tx:
        tx.execute(f"INSERT INTO {BUSINESS_TABLE} (id, total) VALUES (?, ?)", ("order-1", 42))
        tx.jobs.enqueue("ship", {"order": "order-1"}, id="ship-order-1")
        inside.set()
        if when == "before-commit":
            _die(how)
    _die(how)


# ------------------------------------------------------------------ lock contention


def contend(settings: dict[str, Any], ready: Any, go: Any, out_path: str) -> None:
    """Enqueue, claim and complete as fast as possible until the time is up.

    Every call's fate is written to ``out_path``: the ids this process was
    told were enqueued, the ids whose enqueue raised (and how), the jobs it
    completed, the errors by class, and the slowest single call.
    """
    name: str = settings["name"]
    seconds: float = settings["seconds"]
    enqueued: list[str] = []
    refused: list[str] = []
    completed: list[str] = []
    errors: dict[str, int] = {}
    raw: list[str] = []
    slowest = 0.0
    calls = 0
    report: dict[str, Any] = {"name": name, "error": None}

    def failed(exc: BaseException) -> None:
        key = type(exc).__name__
        errors[key] = errors.get(key, 0) + 1
        if not isinstance(exc, JobsError):
            raw.append(repr(exc))
        elif isinstance(exc, StorageError) and not isinstance(exc.__cause__, Exception):
            raw.append(f"StorageError without a driver cause: {exc}")

    try:
        with open_store(
            settings["db_path"], busy_timeout_seconds=settings["busy_timeout"]
        ) as store:
            ready.set()
            if not go.wait(60):
                raise TimeoutError("the start signal never came")
            end = time.monotonic() + seconds
            n = 0
            while time.monotonic() < end:
                n += 1
                job_id = f"{name}-{n:06d}"
                began = time.monotonic()
                try:
                    if n % 10 == 0:
                        batch = [
                            NewJob("contend", {"n": n, "i": i}, id=f"{job_id}-{i}")
                            for i in range(5)
                        ]
                        store.jobs.enqueue_many(batch)
                        enqueued.extend(new.id for new in batch if new.id is not None)
                    else:
                        store.jobs.enqueue("contend", {"n": n}, id=job_id)
                        enqueued.append(job_id)
                except JobsError as exc:
                    if n % 10 == 0:
                        refused.extend(f"{job_id}-{i}" for i in range(5))
                    else:
                        refused.append(job_id)
                    failed(exc)
                except Exception as exc:  # a raw driver error: the test fails on it
                    refused.append(job_id)
                    failed(exc)
                slowest = max(slowest, time.monotonic() - began)
                began = time.monotonic()
                try:
                    claimed = store.jobs.claim(["contend"], owner=name, lease_seconds=60)
                    if claimed is not None:
                        store.jobs.complete(claimed.lease, {"by": name})
                        completed.append(claimed.id)
                except Exception as exc:
                    failed(exc)
                slowest = max(slowest, time.monotonic() - began)
                calls += 2
    except BaseException:
        report["error"] = traceback.format_exc()
    report.update(
        enqueued=enqueued,
        refused=refused,
        completed=completed,
        errors=errors,
        raw=raw,
        slowest_seconds=slowest,
        calls=calls,
    )
    Path(out_path).write_text(json.dumps(report), encoding="utf-8")


# ------------------------------------------------------------------ clock skew


def skewed_thief(db_path: str, skew_seconds: float, job_id: str, stolen: Any, settle: Any) -> None:
    """Claim with a clock ``skew_seconds`` ahead, hold the lease until ``settle``, complete.

    Reports through ``stolen`` (a queue): first the claimed lease's
    generation (or an error), then whether the completion was accepted.
    """
    try:
        runtime = Runtime(now=lambda: time.time() + skew_seconds)
        with open_store(db_path, runtime=runtime) as store:
            claimed = store.jobs.claim(["skewed"], owner="thief", lease_seconds=30)
            if claimed is None or claimed.id != job_id:
                stolen.put({"error": f"claimed {claimed!r} instead of {job_id!r}"})
                return
            stolen.put({"generation": claimed.lease.generation, "attempt": claimed.lease.attempt})
            if not settle.wait(60):
                stolen.put({"error": "never told to settle"})
                return
            stolen.put({"completed": store.jobs.complete(claimed.lease, {"by": "thief"})})
    except BaseException:
        stolen.put({"error": traceback.format_exc()})
