"""PostgreSQL's NOTIFY tells a worker of a forced cancel of a job it leased ahead.

A worker leases jobs ahead of its loop; ``cancel(id, force=True)`` from another
process (here another store, whose in-process notice cannot reach the worker,
so only the NOTIFY does) used to mark only started attempts: the held job
started after the cancel answered True, and completed (issue 26 item 9). Now
its handler never runs and it ends cancelled. (On SQLite, with no
notifications, a held job behind a slow one is handed back within the
worker's short budget, and a hand-back of a marked job cancels it:
tests/conformance/test_force_cancel.py.)
"""

from __future__ import annotations

import threading
import time
from typing import Any

from jaren_jobs import JobContext, NewJob, Outcome
from tests.harness import PostgresUrl

WAIT = 10.0


def _until(condition: Any) -> bool:
    end = time.monotonic() + WAIT
    pause = threading.Event()
    while not condition():
        if time.monotonic() > end:
            return False
        pause.wait(0.002)
    return True


def test_a_held_job_force_cancelled_from_another_process_never_starts(
    pg: PostgresUrl,
) -> None:
    store, elsewhere = pg.open(), pg.open()
    jobs = store.jobs.enqueue_many([NewJob("k", n) for n in range(40)])
    payload_of = {job.id: n for n, job in enumerate(jobs)}
    gate, reached = threading.Event(), threading.Event()
    started: list[int] = []
    outcomes: list[Outcome] = []

    def handler(payload: Any, ctx: JobContext) -> Any:
        started.append(payload)
        # the eleventh to start, not a given payload: jobs are claimed in id order
        # (random), and a payload claimed among the last would have none behind it
        if len(started) == 11:
            reached.set()
            assert gate.wait(WAIT)
        return payload

    # a long lease: its renewals (and the budget that hands a stalled batch back) are
    # far away, so only the NOTIFY can tell the worker in time
    worker = store.jobs.create_worker(
        {"k": handler}, poll_seconds=3600, lease_seconds=600, on_outcome=outcomes.append
    )
    worker.start()
    try:
        assert reached.wait(WAIT)
        assert _until(lambda: len(worker.leases()) > worker.stats().in_flight)
        ahead = [lease for lease in worker.leases() if payload_of[lease.job_id] not in started]
        assert ahead, "no job was leased ahead of the eleventh: the test proved nothing"
        target = ahead[0].job_id
        # the worker's listener starts with it, on a thread of its own: a NOTIFY sent
        # before its LISTEN is in force reaches nobody (the holder would learn at its
        # next renewal, 10 minutes away), so the cancel waits for it
        listener = store._backend.db.listener  # type: ignore[attr-defined]
        assert listener.connected.wait(WAIT)
        assert elsewhere.jobs.cancel(target, force=True) is True
        # the listener's notice reaches the worker: wait for it, then let the loop go on
        assert _until(lambda: _forced(worker, target))
        gate.set()
        assert _until(lambda: store.jobs.counts().pending == 0 and not worker.stats().in_flight)
    finally:
        gate.set()
        worker.stop()
        elsewhere.close()
        store.close()
    assert payload_of[target] not in started
    row = pg.open().jobs.get(target)
    assert row is not None
    assert row.state == "cancelled"
    assert [o.outcome for o in outcomes if o.job_id == target] == ["cancelled"]


def _forced(worker: Any, job_id: str) -> bool:
    claims = worker.claims
    with worker.tracker.lock:
        return any(h.job.id == job_id and h.forced is not None for h in claims.held.values())
