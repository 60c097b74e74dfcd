"""Spawn target for the cross-process forced-cancel tests (importable, so spawn finds it)."""

from __future__ import annotations

import threading
import time
from typing import Any

from jaren_jobs import JobContext, Outcome, open_store

KIND = "force-test"


def hold_until_cancelled(
    target: str, lease_seconds: float, listened: bool, started: Any, reports: Any
) -> None:
    """Run one worker whose handler holds its job until ``ctx.signal`` aborts; report when
    (wall clock) and why, and the attempt's outcome.

    ``started`` is set once the handler runs (and, with ``listened``, once this store's
    listener is connected, so a NOTIFY sent after it cannot be missed). Without
    ``listened`` the store never subscribes to forced-cancel notifications: only the
    renewal can tell the attempt.
    """
    if not listened and target.startswith("postgresql"):
        from jaren_jobs.backends.postgres.store import PostgresBackend

        PostgresBackend.wake_on_cancel_requests = lambda self, wake: None  # type: ignore[method-assign]

    report: dict[str, Any] = {"error": None}
    ended = threading.Event()
    outcomes: list[str] = []

    def record(event: Outcome) -> None:
        outcomes.append(event.outcome)
        ended.set()

    def holds(payload: Any, ctx: JobContext) -> Any:
        started.set()
        if ctx.signal.wait(60):
            report["aborted_at"] = time.time()
            report["reason"] = type(ctx.signal.reason).__name__
        raise RuntimeError("stopped as asked")

    try:
        with open_store(target) as store:
            worker = store.jobs.create_worker(
                {KIND: holds}, lease_seconds=lease_seconds, poll_seconds=0.05, on_outcome=record
            )
            if listened:
                listener = store._backend.db.listener  # type: ignore[attr-defined]
                listener.start(None)
                if not listener.connected.wait(30):
                    raise TimeoutError("the listener never connected")
            worker.start()
            ended.wait(90)
            worker.stop(10.0)
            report["outcomes"] = outcomes
    except BaseException as exc:
        report["error"] = repr(exc)
    reports.put(report)
