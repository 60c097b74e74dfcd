"""Workers in several OS processes on one database file (spawn context)."""

from __future__ import annotations

import multiprocessing
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import NewJob, open_store
from tests.processes.worker_targets import drain_with_worker

JOBS = 5000
PROCESSES = 2
CONCURRENCY = 4
DEADLINE = 120.0


@pytest.mark.slow
def test_two_processes_drain_five_thousand_jobs_exactly_once(tmp_path: Path) -> None:
    db_path = tmp_path / "shared.db"
    with open_store(db_path, durability="normal") as store:
        created = store.jobs.enqueue_many(NewJob("noop", i) for i in range(JOBS))
    all_ids = {job.id for job in created}
    assert len(all_ids) == JOBS

    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    reports: Any = ctx.Queue()
    settings = {
        "db_path": str(db_path),
        "kind": "noop",
        "concurrency": CONCURRENCY,
        "deadline_seconds": DEADLINE,
    }
    children = [
        ctx.Process(
            target=drain_with_worker,
            args=(settings, go, reports),
        )
        for _ in range(PROCESSES)
    ]
    for child in children:
        child.start()
    try:
        # start both workers together, so they really contend for the same rows
        for _ in children:
            assert reports.get(timeout=DEADLINE) == {"ready": True}
        go.set()
        results = [reports.get(timeout=DEADLINE) for _ in children]
    finally:
        for child in children:
            child.join(DEADLINE)
            if child.is_alive():  # pragma: no cover - only on a hung child
                child.kill()
    assert [child.exitcode for child in children] == [0] * PROCESSES
    assert [r["error"] for r in results] == [None] * PROCESSES

    # the store: every job done, once, by its first attempt; nothing leased
    connection = sqlite3.connect(db_path)
    try:
        rows = connection.execute(
            'SELECT state, attempts, lease_token, COUNT(*) FROM "_jaren_jobs" '
            "GROUP BY state, attempts, lease_token IS NULL"
        ).fetchall()
    finally:
        connection.close()
    assert rows == [("done", 1, None, JOBS)]

    # the workers: outcomes add up, and each job was completed by exactly one of them
    completed: Counter[str] = Counter()
    for result in results:
        stats = result["stats"]
        names = Counter(outcome for outcome, _, _ in result["outcomes"])
        assert names == Counter({"completed": stats["completions"]})
        assert stats["claims"] == stats["completions"]
        assert (stats["failures"], stats["lost_settlements"], stats["in_flight"]) == (0, 0, 0)
        assert result["stop"] == {"drained": True, "in_flight": 0}
        completed.update(job_id for _, job_id, _ in result["outcomes"])
        assert stats["completions"] > 0, "both processes should have taken part"
    assert set(completed) == all_ids
    assert max(completed.values()) == 1
    assert sum(r["stats"]["completions"] for r in results) == JOBS
