"""``cancel(id, force=True)`` of a job a worker in another process holds (SPEC §13).

The holder learns of the mark at its next lease renewal (the renewal statement
returns it), on both databases; on PostgreSQL the cancel channel's NOTIFY makes
it renew at once, long before the renewal would have come. Ordered on events.
"""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import open_store
from tests.processes.force_targets import KIND, hold_until_cancelled
from tests.processes.pg_support import Schema

SPAWN = multiprocessing.get_context("spawn")
WAIT = 90.0
pytestmark = pytest.mark.slow


def _cancel_across(target: str, lease_seconds: float, *, listened: bool) -> dict[str, Any]:
    """Enqueue, let a child hold the job, force-cancel it here; the child's report, and
    the seconds from the cancel to the child's abort."""
    with open_store(target) as store:
        job = store.jobs.enqueue(KIND, id="held")
        started, reports = SPAWN.Event(), SPAWN.Queue()
        child = SPAWN.Process(
            target=hold_until_cancelled, args=(target, lease_seconds, listened, started, reports)
        )
        child.start()
        try:
            assert started.wait(WAIT), "the child never ran the job"
            asked = time.time()
            assert store.jobs.cancel(job.id, force=True) is True
            report: dict[str, Any] = reports.get(timeout=WAIT)
        finally:
            child.join(WAIT)
            if child.is_alive():  # pragma: no cover - a hung child fails the test, not the run
                child.kill()
        assert report["error"] is None, report["error"]
        assert report["outcomes"] == ["cancelled"]
        assert report["reason"] == "CancelRequested"
        stored = store.jobs.get(job.id)
        assert stored is not None
        assert (stored.state, stored.attempts) == ("cancelled", 1)
        report["took"] = report["aborted_at"] - asked
        return report


def test_a_holder_in_another_process_learns_at_its_renewal_on_sqlite(tmp_path: Path) -> None:
    # a 1 s lease renews every third of a second: the abort comes within about that
    report = _cancel_across(str(tmp_path / "jobs.db"), 1.0, listened=False)
    assert report["took"] < 1.0


def test_a_holder_in_another_process_learns_at_its_renewal_on_postgres(
    pg_schema: Schema,
) -> None:
    # the child does not subscribe to the cancel channel: the renewal alone tells it
    report = _cancel_across(pg_schema.url, 1.0, listened=False)
    assert report["took"] < 1.0


def test_on_postgres_the_notify_tells_the_holder_long_before_its_renewal(
    pg_schema_any_length: Schema,
) -> None:
    # a 60 s lease renews every 20 s: only the NOTIFY can make the abort this prompt; a
    # spawned child salts hash() differently, so a channel derived per process is not heard
    report = _cancel_across(pg_schema_any_length.url, 60.0, listened=True)
    assert report["took"] < 5.0
