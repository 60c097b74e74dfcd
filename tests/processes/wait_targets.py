"""Spawn targets for the cross-process wait() tests (importable, so ``spawn`` finds them)."""

from __future__ import annotations

from typing import Any

from jaren_jobs import Snooze, open_store

KIND = "wait-test"


def run_when_told(target: str, job_id: str, go: Any, done: Any) -> None:
    """Open a store, wait for ``go``, run the job through a worker (snoozing it once
    first, so the waiter sees a settlement that settles nothing), say so."""
    with open_store(target) as store:
        seen: list[str] = []

        def handler(payload: Any, ctx: Any) -> Any:
            seen.append(ctx.job.id)
            if len(seen) == 1:
                raise Snooze(0)
            return {"ran in": "another process", "n": payload["n"] * 2}

        if not go.wait(60):
            return
        worker = store.jobs.create_worker({KIND: handler})
        while store.jobs.get(job_id).state != "done":  # type: ignore[union-attr]
            worker.run_once()
        done.set()
