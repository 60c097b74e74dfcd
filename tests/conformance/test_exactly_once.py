"""Exactly-once side effects in the database (docs/reliability.md, the pattern section).

A handler that writes its rows and completes its own job in one
``store.transaction()`` — ``tx.jobs.complete(ctx.lease, result)`` — commits
the write and the settlement together: a stale attempt's transaction is
refused by the fence and takes its rows with it, and the worker's own
settlement after the handler finds the row settled by this very attempt.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from jaren_jobs import (
    JobContext,
    LeaseExpired,
    LeaseSuperseded,
    Outcome,
    Store,
)
from tests.conftest import FakeClock
from tests.harness import Harness

LEASE = 30.0


class Outcomes:
    def __init__(self) -> None:
        self.events: list[Outcome] = []
        self._lock = threading.Lock()

    def __call__(self, event: Outcome) -> None:
        with self._lock:
            self.events.append(event)

    def names(self) -> list[str]:
        with self._lock:
            return [event.outcome for event in self.events]


def _shipments(backend: Harness) -> list[tuple[Any, ...]]:
    return sorted(backend.query("SELECT job_id, item FROM shipments"))


def _make_table(store: Store) -> None:
    with store.transaction() as tx:
        tx.execute("CREATE TABLE shipments (job_id TEXT NOT NULL, item TEXT NOT NULL)")


def _ship_in_one_transaction(store: Store, backend: Harness, payload: Any, ctx: JobContext) -> None:
    """The pattern: the handler's rows and its job's completion commit together."""
    with store.transaction() as tx:
        tx.execute(
            backend.app_sql("INSERT INTO shipments (job_id, item) VALUES (?, ?)"),
            [ctx.job.id, payload["item"]],
        )
        tx.jobs.complete(ctx.lease, {"shipped": payload["item"]})


def test_the_rows_and_the_completion_commit_once_and_the_workers_settlement_agrees(
    store: Store, backend: Harness
) -> None:
    _make_table(store)
    outcomes = Outcomes()
    runs: list[str] = []

    def ship(payload: Any, ctx: JobContext) -> Any:
        runs.append(ctx.job.id)
        _ship_in_one_transaction(store, backend, payload, ctx)
        return "the return value comes too late: the row is settled"

    worker = store.jobs.create_worker({"ship": ship}, on_outcome=outcomes, lease_seconds=LEASE)
    job = store.jobs.enqueue("ship", {"item": "anvil"})
    assert worker.run_once() is True
    stored = store.jobs.get(job.id)
    assert stored is not None
    assert (stored.state, stored.result, stored.attempts) == ("done", {"shipped": "anvil"}, 1)
    # the worker's own completion after the handler met the row this attempt settled
    assert outcomes.names() == ["completed"]
    assert worker.stats().failures == 0
    assert worker.stats().lost_settlements == 0
    assert store.jobs.errors(job.id) == []
    assert runs == [job.id]
    assert _shipments(backend) == [(job.id, "anvil")]
    assert worker.run_once() is False  # nothing left to re-run
    worker.stop()


@pytest.mark.parametrize(
    ("rescued", "refusal"),
    [(True, LeaseSuperseded), (False, LeaseExpired)],
    ids=["reclaimed", "expired"],
)
def test_a_stale_attempts_transaction_is_refused_and_takes_its_rows_with_it(
    store: Store, backend: Harness, clock: FakeClock, rescued: bool, refusal: type[Exception]
) -> None:
    _make_table(store)
    outcomes = Outcomes()
    met: list[BaseException] = []
    rescuer: list[Any] = []

    def ship(payload: Any, ctx: JobContext) -> Any:
        # this attempt stalls past its lease (a long GC pause, a frozen VM)...
        clock.advance(LEASE + 1)
        if rescued:  # ... and another worker has re-claimed the job meanwhile
            rescuer.append(store.jobs.claim(["ship"], owner="rescuer"))
        try:
            _ship_in_one_transaction(store, backend, payload, ctx)
        except Exception as exc:
            met.append(exc)
            raise
        return None

    # no renewal: the stale attempt must not renew its way back into the lease
    worker = store.jobs.create_worker(
        {"ship": ship}, on_outcome=outcomes, lease_seconds=LEASE, renew=False
    )
    job = store.jobs.enqueue("ship", {"item": "anvil"})
    assert worker.run_once() is True
    assert len(met) == 1
    assert isinstance(met[0], refusal), repr(met[0])
    assert _shipments(backend) == []  # the refused transaction rolled its rows back
    assert outcomes.names() == ["lost"]  # the stale attempt speaks for nothing
    stored = store.jobs.get(job.id)
    assert stored is not None
    # still held (by the rescuer), or an expired lease that the next claim takes
    assert stored.state == "leased"
    assert stored.result is None

    if rescued:
        claimed = rescuer[0]
        assert claimed is not None
        assert claimed.id == job.id
    else:  # nobody took it yet: the next claim does
        claimed = store.jobs.claim(["ship"], owner="rescuer")
        assert claimed is not None
        assert claimed.id == job.id
    # the live attempt does the same and is the one whose rows commit
    with store.transaction() as tx:
        tx.execute(
            backend.app_sql("INSERT INTO shipments (job_id, item) VALUES (?, ?)"),
            [job.id, "anvil"],
        )
        assert tx.jobs.complete(claimed.lease, {"shipped": "anvil"}) is True
    assert _shipments(backend) == [(job.id, "anvil")]
    done = store.jobs.get(job.id)
    assert done is not None
    assert (done.state, done.result) == ("done", {"shipped": "anvil"})
    worker.stop()


def test_a_handler_that_raises_after_its_transaction_committed_is_still_done(
    store: Store, backend: Harness
) -> None:
    _make_table(store)
    outcomes = Outcomes()

    def ship(payload: Any, ctx: JobContext) -> Any:
        _ship_in_one_transaction(store, backend, payload, ctx)
        raise RuntimeError("the notification after the commit failed")

    worker = store.jobs.create_worker({"ship": ship}, on_outcome=outcomes, lease_seconds=LEASE)
    job = store.jobs.enqueue("ship", {"item": "anvil"}, max_attempts=3)
    assert worker.run_once() is True
    stored = store.jobs.get(job.id)
    assert stored is not None
    # the committed settlement stands: the raise cannot fail or retry a done job
    assert (stored.state, stored.result, stored.attempts) == ("done", {"shipped": "anvil"}, 1)
    assert outcomes.names() == ["completed"]
    assert worker.run_once() is False
    assert _shipments(backend) == [(job.id, "anvil")]
    worker.stop()
