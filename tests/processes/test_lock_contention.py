"""Eight processes hammering one file: no errors at the defaults, no phantoms ever.

Each process enqueues (single jobs and small batches), claims and completes
as fast as it can for a few seconds. With the default settings nobody may
see an error; with a tiny busy timeout the failures must be
``StorageError`` (never a raw ``sqlite3`` error) and must write nothing,
while every job a caller was told was enqueued is there exactly once.
The share of the write lock each process got is printed: SQLite's busy
handler is not fair, and this is where that shows.
"""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import open_store
from tests.processes.chaos_targets import contend

PROCESSES = 8
SECONDS = 3.0


def hammer(tmp_path: Path, busy_timeout: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the contending processes; answer their reports and the store's rows by id."""
    db_path = tmp_path / "contended.db"
    open_store(db_path).close()  # create the tables once, before the race
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    readies = [ctx.Event() for _ in range(PROCESSES)]
    outputs = [tmp_path / f"p{i}.json" for i in range(PROCESSES)]
    processes = [
        ctx.Process(
            target=contend,
            args=(
                {
                    "name": f"p{i}",
                    "db_path": str(db_path),
                    "seconds": SECONDS,
                    "busy_timeout": busy_timeout,
                },
                readies[i],
                go,
                str(outputs[i]),
            ),
        )
        for i in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    try:
        for ready in readies:
            assert ready.wait(60), "a contender never opened its store"
        go.set()
        for process in processes:
            process.join(60)
    finally:
        for process in processes:
            if process.is_alive():  # pragma: no cover - only on a hung child
                process.kill()
                process.join(10)
    assert [p.exitcode for p in processes] == [0] * PROCESSES
    reports = [json.loads(path.read_text()) for path in outputs]
    for report in reports:
        assert report["error"] is None, f"{report['name']}:\n{report['error']}"
        assert report["raw"] == [], f"{report['name']} met raw errors: {report['raw'][:5]}"

    connection = sqlite3.connect(db_path)
    try:
        rows = connection.execute(
            'SELECT id, state, result, lease_token FROM "_jaren_jobs"'
        ).fetchall()
    finally:
        connection.close()
    by_id = {row[0]: row for row in rows}
    assert len(by_id) == len(rows)
    return reports, by_id


def check_no_phantoms(reports: list[dict[str, Any]], by_id: dict[str, Any]) -> None:
    """Every acknowledged enqueue is there exactly once; every refused one left nothing."""
    enqueued = [job_id for r in reports for job_id in r["enqueued"]]
    refused = [job_id for r in reports for job_id in r["refused"]]
    assert len(enqueued) == len(set(enqueued))
    assert set(enqueued) == set(by_id), "the store holds jobs nobody was told about, or lost some"
    assert [job_id for job_id in refused if job_id in by_id] == []
    # each completion a process was told about is the store's one completion of that job
    completed = Counter(job_id for r in reports for job_id in r["completed"])
    assert max(completed.values(), default=1) == 1
    for r in reports:
        for job_id in r["completed"]:
            _, state, result, token = by_id[job_id]
            assert (state, token) == ("done", None)
            assert json.loads(result) == {"by": r["name"]}
    done = {job_id for job_id, row in by_id.items() if row[1] == "done"}
    assert done == set(completed)


def share_line(reports: list[dict[str, Any]]) -> str:
    done = [len(r["completed"]) for r in reports]
    enqueued = [len(r["enqueued"]) for r in reports]
    slowest = max(r["slowest_seconds"] for r in reports)
    spread = min(done) / max(statistics.mean(done), 1)
    return (
        f"completions per process {done} (min/mean {spread:.2f}), enqueued per process "
        f"{enqueued}, slowest single call {slowest * 1000:.0f} ms"
    )


@pytest.mark.slow
def test_eight_busy_processes_see_no_errors_at_the_default_settings(tmp_path: Path) -> None:
    began = time.monotonic()
    reports, by_id = hammer(tmp_path, busy_timeout=5.0)
    errors = {r["name"]: r["errors"] for r in reports if r["errors"]}
    assert errors == {}, f"ordinary contention surfaced as errors: {errors}"
    check_no_phantoms(reports, by_id)
    # no process starves: SQLite's own busy handler, measured the same way, has
    # left single processes with 1 completion beside others with 19,000
    done = [len(r["completed"]) for r in reports]
    assert min(done) >= 0.25 * statistics.mean(done), f"a process starved: {share_line(reports)}"
    print(f"\ndefault settings, {PROCESSES} processes, {time.monotonic() - began:.1f}s: ")
    print(share_line(reports))


@pytest.mark.slow
def test_a_tiny_busy_timeout_fails_with_storage_errors_and_no_phantoms(tmp_path: Path) -> None:
    reports, by_id = hammer(tmp_path, busy_timeout=0.001)
    failures = Counter()
    for report in reports:
        failures.update(report["errors"])
    assert set(failures) <= {"StorageError"}, failures
    assert failures["StorageError"] > 0, "a 1 ms busy timeout never failed: nothing was proved"
    check_no_phantoms(reports, by_id)
    print(f"\nbusy_timeout 1 ms: {failures['StorageError']} StorageErrors; {share_line(reports)}")
