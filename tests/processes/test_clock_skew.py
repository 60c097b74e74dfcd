"""Clock skew: a process whose clock runs ahead steals a live lease.

Lease expiry compares a stored ``lease_until`` with each process's own
clock, so a process running far ahead sees a live lease as expired and
claims the job. That is the documented limit (clocks must roughly agree);
what must still hold is the fence: the original attempt is refused by name
(``LeaseSuperseded``), reports ``lost``, and the job is settled exactly
once, by the attempt that holds it.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import JobContext, LeaseSuperseded, Outcome, Store, open_store
from tests.processes.chaos_targets import skewed_thief

SKEW_SECONDS = 3600.0  # far beyond any lease below: the thief sees every lease as expired
WAIT = 30.0


class Thief:
    """The second process, with its clock an hour ahead."""

    def __init__(self, db_path: Path, job_id: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.reports: Any = ctx.Queue()
        self.settle = ctx.Event()
        self.process = ctx.Process(
            target=skewed_thief,
            args=(str(db_path), SKEW_SECONDS, job_id, self.reports, self.settle),
        )

    def steal(self) -> dict[str, Any]:
        self.process.start()
        report: dict[str, Any] = self.reports.get(timeout=60)
        assert "error" not in report, report.get("error")
        return report

    def complete(self) -> bool:
        self.settle.set()
        report = self.reports.get(timeout=60)
        assert "error" not in report, report.get("error")
        self.process.join(60)
        assert self.process.exitcode == 0
        return bool(report["completed"])

    def close(self) -> None:
        if self.process.is_alive():
            self.settle.set()
            self.process.join(30)
        if self.process.is_alive():  # pragma: no cover - only on a hung child
            self.process.kill()
            self.process.join(10)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "skew.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[Store]:
    # the original runs on the real clock: the thief's skew is relative to it
    with open_store(db_path) as s:
        yield s


@pytest.fixture
def thief(db_path: Path, store: Store) -> Iterator[Thief]:
    store.jobs.enqueue("skewed", {"n": 1}, id="j1")
    t = Thief(db_path, "j1")
    try:
        yield t
    finally:
        t.close()


class Watched:
    """A worker whose handler blocks until told to return, and whose outcomes are kept."""

    def __init__(self, store: Store, *, lease_seconds: float, until_signal: bool) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()
        self.outcomes: list[Outcome] = []
        self.ctx: JobContext | None = None
        self.signal_reason: Any = None

        def handler(payload: Any, ctx: JobContext) -> Any:
            self.ctx = ctx
            self.started.set()
            if until_signal:
                assert ctx.signal.wait(WAIT), "the lost lease never aborted the signal"
                self.signal_reason = ctx.signal.reason
            else:
                assert self.release.wait(WAIT)
            return {"by": "original"}

        def observe(outcome: Outcome) -> None:
            self.outcomes.append(outcome)
            self.finished.set()

        self.worker = store.jobs.create_worker(
            {"skewed": handler},
            lease_seconds=lease_seconds,
            poll_seconds=0.05,
            owner="original",
            on_outcome=observe,
        )


def assert_settled_once_by_the_thief(store: Store, watched: Watched, thief: Thief) -> None:
    # until the thief settles, the job is its own: the original wrote nothing
    held = store.jobs.get("j1")
    assert held is not None
    assert (held.state, held.lease_owner, held.lease_generation, held.result) == (
        "leased",
        "thief",
        2,
        None,
    )
    assert thief.complete() is True
    done = store.jobs.get("j1")
    assert done is not None
    assert (done.state, done.result, done.attempts, done.lease_generation) == (
        "done",
        {"by": "thief"},
        2,
        2,
    )
    stats = watched.worker.stats()
    assert (stats.claims, stats.completions, stats.failures, stats.lost_settlements) == (1, 0, 0, 1)


def test_the_original_completion_is_refused_as_superseded_and_reported_lost(
    store: Store, thief: Thief
) -> None:
    watched = Watched(store, lease_seconds=30.0, until_signal=False)
    with watched.worker:
        assert watched.started.wait(WAIT)
        assert watched.ctx is not None
        original = watched.ctx.lease
        stolen = thief.steal()
        assert (stolen["generation"], stolen["attempt"]) == (2, 2)

        watched.release.set()  # the original's handler returns and tries to complete
        assert watched.finished.wait(WAIT)
        [outcome] = watched.outcomes
        assert (outcome.outcome, outcome.code, outcome.phase) == (
            "lost",
            LeaseSuperseded.code,
            "completion",
        )
        assert (outcome.job_id, outcome.generation, outcome.attempt) == ("j1", 1, 1)

        # the original lease is refused by name for every settling call, every time
        with pytest.raises(LeaseSuperseded) as refused:
            store.jobs.complete(original, {"by": "original, again"})
        assert refused.value.details["current_generation"] == 2
        with pytest.raises(LeaseSuperseded):
            store.jobs.renew(original)
        with pytest.raises(LeaseSuperseded):
            store.jobs.fail(original, "late failure")
    assert_settled_once_by_the_thief(store, watched, thief)


def test_a_renewal_finds_the_theft_and_aborts_the_running_attempt(
    store: Store, thief: Thief
) -> None:
    # a short lease, so the next renewal meets the thief's lease within a second
    watched = Watched(store, lease_seconds=1.5, until_signal=True)
    with watched.worker:
        assert watched.started.wait(WAIT)
        stolen = thief.steal()
        assert stolen["generation"] == 2
        assert watched.finished.wait(WAIT)
        assert isinstance(watched.signal_reason, LeaseSuperseded)
        [outcome] = watched.outcomes
        assert (outcome.outcome, outcome.code, outcome.generation) == (
            "lost",
            LeaseSuperseded.code,
            1,
        )
    assert_settled_once_by_the_thief(store, watched, thief)
