"""Unique jobs across processes (SPEC §12): 8 spawned processes enqueue one key 1,000 times
each, racing, while a checker process counts the key's active jobs and settles them.

Of concurrent enqueues with one key exactly one job exists; every enqueue answers that
job (never an error); each settlement frees the key, and the next enqueue makes a new one.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import open_store

PROCESSES = 8
TIMES = 1_000
KEY = "the-one-key"


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "unique.db")
    else:
        yield request.getfixturevalue("pg_schema").url


def _rows(db: str) -> list[tuple[Any, ...]]:
    with open_store(db) as store, store.transaction() as tx:
        mark = "?" if store.backend == "sqlite" else "%s"
        return list(
            tx.execute(
                f'SELECT id, state FROM "_jaren_jobs" WHERE unique_key = {mark} ORDER BY id',
                (KEY,),
            ).fetchall()
        )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_processes_racing_on_one_key_make_one_job_at_a_time(db: str, tmp_path: Path) -> None:
    from tests.processes.enqueuers import enqueue_one_key, settle_one_key

    open_store(db).close()  # the tables exist before the race
    ctx = multiprocessing.get_context("spawn")
    go, stop = ctx.Event(), ctx.Event()
    readies = [ctx.Event() for _ in range(PROCESSES + 1)]
    outputs = [tmp_path / f"enqueuer-{n}.json" for n in range(PROCESSES)]
    checked = tmp_path / "checker.json"
    enqueuers = [
        ctx.Process(
            target=enqueue_one_key,
            args=(db, KEY, TIMES),
            kwargs={"ready": readies[n], "go": go, "output": str(outputs[n])},
            name=f"enqueuer-{n}",
        )
        for n in range(PROCESSES)
    ]
    checker = ctx.Process(
        target=settle_one_key,
        args=(db, KEY),
        kwargs={"ready": readies[-1], "go": go, "stop": stop, "output": str(checked)},
        name="checker",
    )
    everyone = [*enqueuers, checker]
    for process in everyone:
        process.start()
    try:
        for ready in readies:
            assert ready.wait(120), "a process never opened its store"
        go.set()
        for process in enqueuers:
            process.join(480)
        stop.set()
        checker.join(120)
    finally:
        for process in everyone:
            if process.is_alive():
                process.kill()
                process.join(10)
    for process in everyone:
        assert process.exitcode == 0, f"{process.name} exited with {process.exitcode}"

    reports = [json.loads(path.read_text()) for path in outputs]
    for report in reports:
        assert report["error"] is None, report["error"]
        assert len(report["answers"]) == TIMES
    check = json.loads(checked.read_text())
    assert check["error"] is None, check["error"]
    assert check["most"] <= 1
    assert check["rounds"] > 0

    rows = dict(_rows(db))
    answered = {job_id for report in reports for job_id in report["answers"]}
    settled = check["settled"]
    # every answer is a job that exists; every job with the key was some enqueue's answer
    assert answered == set(rows)
    # each settlement freed the key once: the jobs made are the ones settled, plus at most
    # the one still active; and no two of them were ever active together
    assert len(settled) == len(set(settled))
    active = [job_id for job_id, state in rows.items() if state in ("pending", "failed", "leased")]
    assert len(active) <= 1
    assert sorted(rows) == sorted(settled + active)
    assert all(rows[job_id] == "done" for job_id in settled)
    # the settlements did free the key while the race ran
    assert len(settled) >= 1
    print(f"{len(rows)} jobs made, {len(settled)} settled, {check['rounds']} checks")

    # after it settles, a new one can be made; while it is held, the same one answers
    with open_store(db) as store:
        held = store.jobs.enqueue("unique", unique_key=KEY)
        assert store.jobs.enqueue("unique", unique_key=KEY) == held
        claimed = store.jobs.claim(["unique"], owner="end")
        assert claimed is not None
        assert claimed.id == held.id
        store.jobs.complete(claimed.lease)
        fresh = store.jobs.enqueue("unique", unique_key=KEY)
        assert fresh.id != held.id
        assert fresh.state == "pending"
