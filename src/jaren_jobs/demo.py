"""``jaren-jobs demo``: enqueue, work and report, on a temporary database.

It shows the three things a queue is for: retries with backoff (``resize``
fails its first attempt now and then), dead letters (a few ``resize`` jobs
never succeed), and a checkpointed DAG job that fails mid-run and resumes
from its checkpoints instead of starting over.
"""

from __future__ import annotations

import io
import json
import logging
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

from jaren_jobs.dag import Task, TaskContext, create_dag_job_runner
from jaren_jobs.records import STATES, NewJob, Outcome
from jaren_jobs.store import open_store

__all__ = ["run_demo"]

# the demo is meant to take a couple of seconds; this only bounds a broken run
FINISH_WITHIN_SECONDS = 60.0

DEMO_DEFAULTS = {
    "poll_seconds": 0.05,
    "lease_seconds": 5.0,
    "backoff_base_seconds": 0.02,
    "backoff_cap_seconds": 0.2,
    "stop_grace_seconds": 2.0,
}

REPORT = {
    "description": "gather three numbers, sum them, and summarise",
    "nodes": {
        "gather": {"task": "gather"},
        "total": {"task": "total", "needs": ["gather"]},
        "summarize": {"task": "summarize", "needs": ["gather", "total"]},
    },
    "output": "summarize",
}


def run_demo(*, db: str | None, jobs: int, out: TextIO, as_json: bool = False) -> int:
    """Run the demo; returns an exit status (1 if it did not finish in time).

    ``db`` names a database to keep (the caller has checked that it holds no
    jobs); without it the demo runs on a temporary file removed at the end.
    ``as_json`` prints one JSON object at the end instead of the running report.
    """
    # the demo fails attempts and dead-letters jobs on purpose and reports
    # them itself; without this, Python's last-resort handler would print
    # each of their WARNING/ERROR log lines (and tracebacks) to stderr. An
    # application's own logging configuration (a root handler) still sees them.
    quiet = logging.NullHandler()
    library = logging.getLogger("jaren_jobs")
    library.addHandler(quiet)
    try:
        if not as_json:
            return _run_demo(db, jobs, out)
        report: dict[str, Any] = {}
        status = _run_demo(db, jobs, io.StringIO(), report)
        out.write(json.dumps(report, sort_keys=True) + "\n")
        return status
    finally:
        library.removeHandler(quiet)


def _run_demo(db: str | None, jobs: int, out: TextIO, report: dict[str, Any] | None = None) -> int:
    if db:
        # a path is bytes: one that is not UTF-8 is shown escaped, never a traceback
        shown = db.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        out.write(f"demo database: {shown} (kept)\n")
        if report is not None:
            report["database"] = shown
        return _run_on(Path(db), jobs, out, report)
    with tempfile.TemporaryDirectory(prefix="jaren-demo-", ignore_cleanup_errors=True) as folder:
        out.write("demo database: a temporary file, removed at exit (--db PATH keeps one)\n")
        if report is not None:
            report["database"] = None
        return _run_on(Path(folder) / "demo.db", jobs, out, report)


def _run_on(path: Path, jobs: int, out: TextIO, report: dict[str, Any] | None) -> int:
    tty = out.isatty()
    runs: Counter[str] = Counter()
    runs_lock = threading.Lock()

    def send_email(payload: dict[str, Any], ctx: Any) -> str:
        return f"sent to {payload['to']}"

    def resize(payload: dict[str, Any], ctx: Any) -> dict[str, int]:
        n = payload["n"]
        if n % 50 == 7:
            raise ValueError(f"image {n} is corrupt")  # never succeeds: dead letter
        if n % 5 == 0 and ctx.job.attempts == 1:
            raise TimeoutError(f"image service timed out on image {n}")  # retried
        return {"width": 64, "height": 64}

    def counted(name: str) -> None:
        with runs_lock:
            runs[name] += 1

    def gather(inputs: dict[str, Any], ctx: TaskContext) -> list[int]:
        counted("gather")
        return list(inputs["input"]["numbers"])

    def total(inputs: dict[str, Any], ctx: TaskContext) -> int:
        counted("total")
        return sum(inputs["gather"])

    def summarize(inputs: dict[str, Any], ctx: TaskContext) -> str:
        counted("summarize")
        if ctx.job.attempts == 1:
            raise ConnectionError("the report service dropped the connection")
        return f"{len(inputs['gather'])} numbers, total {inputs['total']}"

    outcomes: Counter[str] = Counter()
    outcome_lock = threading.Lock()
    progressed = threading.Event()

    def on_outcome(event: Outcome) -> None:
        with outcome_lock:
            outcomes[event.outcome] += 1
        progressed.set()

    with open_store(path, defaults=DEMO_DEFAULTS) as store:
        batch = [
            NewJob("send_email", {"to": f"user{n}@example.com"})
            if n % 2 == 0
            else NewJob("resize", {"n": n}, max_attempts=3)
            for n in range(jobs)
        ]
        store.jobs.enqueue_many(batch)
        store.jobs.enqueue("report", {"input": {"numbers": [3, 4, 5]}}, id="report-1")
        total_jobs = jobs + 1
        out.write(f"enqueued {total_jobs} jobs\n")

        worker = store.jobs.create_worker(
            {"send_email": send_email, "resize": resize}, concurrency=4, on_outcome=on_outcome
        )
        runner = create_dag_job_runner(
            store,
            documents={"report": REPORT},
            tasks={"gather": gather, "total": total, "summarize": Task(summarize, version=1)},
            on_outcome=on_outcome,
        )
        worker.start()
        runner.start()
        last_line = ""
        printed_hundreds = 0  # not a terminal: one plain line per hundred settled
        give_up = time.monotonic() + FINISH_WITHIN_SECONDS
        finished = False
        try:
            while time.monotonic() < give_up:
                progressed.wait(0.2)
                progressed.clear()
                counts = store.jobs.counts()
                settled = counts.done + counts.dead + counts.cancelled
                with outcome_lock:
                    line = (
                        f"settled {settled}/{total_jobs}  completed {outcomes['completed']}"
                        f"  failed attempts {outcomes['failed']}  dead {counts.dead}"
                    )
                if tty:
                    # pad over a longer previous line
                    out.write("\r" + line.ljust(len(last_line)))
                    out.flush()
                elif settled == total_jobs or settled // 100 > printed_hundreds:
                    printed_hundreds = settled // 100
                    out.write(line + "\n")
                last_line = line
                if settled == total_jobs:
                    finished = True
                    break
        finally:
            worker.stop()
            runner.stop()
        if tty:
            out.write("\n")
        counts = store.jobs.counts()
        if report is not None:
            # what the text says, as JSON (``jaren-jobs demo --json``)
            report.update(
                finished=finished,
                jobs=total_jobs,
                counts={state: getattr(counts, state) for state in STATES},
                failed_attempts=outcomes["failed"],
                completed_attempts=outcomes["completed"],
            )
        if not finished:
            out.write(f"the demo did not finish within {FINISH_WITHIN_SECONDS:.0f} s\n")
            return 1

        out.write("\nstate      jobs\n")
        for state in ("pending", "leased", "done", "failed", "dead", "cancelled"):
            out.write(f"{state:<10} {getattr(counts, state)}\n")
        dag = store.jobs.get("report-1")
        with store.jobs.page(state="dead", limit=1) as cursor:
            dead = next(iter(cursor), None)
        if report is not None:
            report["dead_letter_example"] = None if dead is None else dead.to_dict()
            report["dag"] = {
                "attempts": None if dag is None else dag.attempts,
                "result": None if dag is None else dag.result,
                "runs": dict(runs),
            }
        out.write(
            f"\nretries: {outcomes['failed']} attempts failed and were retried with backoff "
            "or dead-lettered\n"
        )
        if dead is not None:
            out.write(
                f"dead letters: {counts.dead} jobs used all {dead.max_attempts} attempts; "
                f"e.g. {dead.id}: {dead.last_error}\n"
            )
        if dag is not None:
            out.write(
                f"DAG resume: 'report' failed in 'summarize' on attempt 1 and resumed on "
                f"attempt {dag.attempts}: gather ran {runs['gather']}x, total ran "
                f"{runs['total']}x, summarize ran {runs['summarize']}x -> {dag.result!r}\n"
            )
    return 0
