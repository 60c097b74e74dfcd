"""Two real processes claiming from one file: the fence holds across processes."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import NewJob, open_store
from tests.processes.claimers import KIND, claim_until_empty

JOBS = 2000
LEASE_SECONDS = 600.0  # far longer than the run: no lease may expire, so no rescue is legal


@pytest.mark.slow
def test_two_processes_claim_each_job_exactly_once(tmp_path: Path) -> None:
    db_path = tmp_path / "shared.db"
    with open_store(db_path) as store:
        store.jobs.enqueue_many([NewJob(KIND, {"n": n}, id=f"job-{n:05d}") for n in range(JOBS)])
        assert store.jobs.counts().pending == JOBS

    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    owners = ["proc-a", "proc-b"]
    readies = {owner: ctx.Event() for owner in owners}
    first_claims = {owner: ctx.Event() for owner in owners}
    outputs = {owner: tmp_path / f"{owner}.json" for owner in owners}
    processes = [
        ctx.Process(
            target=claim_until_empty,
            args=(str(db_path), owner, readies[owner], go, str(outputs[owner])),
            kwargs={
                "lease_seconds": LEASE_SECONDS,
                "claimed_one": first_claims[owner],
                "peers_claimed": [first_claims[o] for o in owners if o != owner],
            },
            name=owner,
        )
        for owner in owners
    ]
    for process in processes:
        process.start()
    try:
        for owner in owners:
            assert readies[owner].wait(60), f"{owner} never opened its store"
        started = time.monotonic()
        go.set()  # both are ready: release them together
        for process in processes:
            process.join(120)
        elapsed = time.monotonic() - started
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(10)
    for process in processes:
        assert process.exitcode == 0, f"{process.name} exited with {process.exitcode}"

    reports = {owner: json.loads(outputs[owner].read_text()) for owner in owners}
    for owner, report in reports.items():
        assert report["error"] is None, f"{owner} failed:\n{report['error']}"
    records: list[dict[str, Any]] = [
        {**r, "process": owner} for owner, report in reports.items() for r in report["records"]
    ]

    # every claim was a first claim of its job, completed by the lease it minted
    assert len(records) == JOBS
    per_job = Counter(r["job_id"] for r in records)
    assert set(per_job) == {f"job-{n:05d}" for n in range(JOBS)}
    assert max(per_job.values()) == 1
    assert all(r["completed"] is True for r in records)
    assert all(r["generation"] == 1 and r["attempt"] == 1 for r in records)
    assert len({r["token"] for r in records}) == JOBS
    assert all(r["lease_owner"] == r["process"] for r in records)
    # no job was claimed by one while the other's lease on it was live
    by_job: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_job.setdefault(r["job_id"], []).append(r)
    for claims in by_job.values():
        claims.sort(key=lambda r: r["claimed_at"])
        for earlier, later in itertools.pairwise(claims):
            assert later["claimed_at"] >= earlier["expires_at"]

    # both processes really worked at the same time
    counts = {owner: len(report["records"]) for owner, report in reports.items()}
    assert all(n > 0 for n in counts.values()), counts
    spans = {
        owner: (
            min(r["claimed_at"] for r in report["records"]),
            max(r["claimed_at"] for r in report["records"]),
        )
        for owner, report in reports.items()
    }
    (a_start, a_end), (b_start, b_end) = spans.values()
    assert a_start < b_end, spans
    assert b_start < a_end, spans
    timeline = [r["process"] for r in sorted(records, key=lambda r: r["claimed_at"])]
    switches = sum(1 for x, y in itertools.pairwise(timeline) if x != y)

    # the store agrees: every job done exactly once, by the attempt that claimed it
    conn = sqlite3.connect(db_path)
    try:
        rows = conn.execute(
            'SELECT id, state, attempts, lease_generation, result FROM "_jaren_jobs"'
        ).fetchall()
    finally:
        conn.close()
    assert len(rows) == JOBS
    owner_of = {r["job_id"]: r["process"] for r in records}
    for job_id, state, attempts, generation, result in rows:
        assert (state, attempts, generation) == ("done", 1, 1)
        assert json.loads(result) == {"by": owner_of[job_id]}

    print(
        f"\n{JOBS} jobs, 2 processes: {elapsed:.2f}s, claims per process {counts}, "
        f"{switches} switches between processes"
    )
