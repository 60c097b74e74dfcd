"""Spawn targets that enqueue from another process (importable, so ``spawn`` finds them)."""

from __future__ import annotations

from typing import Any

from jaren_jobs import open_store


def enqueue_on_signal(db_path: str, kind: str, ready: Any, go: Any, done: Any) -> None:
    """Open a store, say so, wait for ``go``, enqueue one ``kind`` job, say so."""
    with open_store(db_path) as store:
        ready.set()
        if go.wait(60):
            store.jobs.enqueue(kind, {"from": "another process"}, id="remote-1")
            done.set()


def enqueue_one_key(db: str, key: str, times: int, *, ready: Any, go: Any, output: str) -> None:
    """Enqueue ``times`` jobs under one unique key, as fast as it can; report what came back.

    The report: every answer's job id (in order) and the first error, if any.
    """
    import json
    import traceback

    answers: list[str] = []
    error = None
    try:
        with open_store(db) as store:
            ready.set()
            if not go.wait(60):
                raise RuntimeError("never released")
            for n in range(times):
                job = store.jobs.enqueue("unique", {"n": n}, unique_key=key)
                if job.unique_key != key or job.state not in ("pending", "failed", "leased"):
                    raise AssertionError(f"enqueue answered {job!r}")
                answers.append(job.id)
    except BaseException:
        error = traceback.format_exc()
    with open(output, "w", encoding="utf-8") as out:
        json.dump({"answers": answers, "error": error}, out)


def settle_one_key(db: str, key: str, *, ready: Any, go: Any, stop: Any, output: str) -> None:
    """The checker: while the enqueuers race, count the key's active jobs (never more
    than one) and complete the active one now and then, which frees the key."""
    import json
    import traceback

    from jaren_jobs.backends.sqlite.queries import ACTIVE

    settled: list[str] = []
    most = 0
    rounds = 0
    error = None
    try:
        with open_store(db) as store:
            ready.set()
            if not go.wait(60):
                raise RuntimeError("never released")
            statement = (
                f'SELECT count(*) FROM "_jaren_jobs" WHERE unique_key = ? AND {ACTIVE}'
                if store.backend == "sqlite"
                else f'SELECT count(*) FROM "_jaren_jobs" WHERE unique_key = %s AND {ACTIVE}'
            )
            while not stop.is_set():
                rounds += 1
                with store.transaction() as tx:
                    (active,) = tx.execute(statement, (key,)).fetchone()
                most = max(most, int(active))
                if active > 1:
                    raise AssertionError(f"{active} active jobs hold key {key!r}")
                claimed = store.jobs.claim(["unique"], owner="checker", lease_seconds=600)
                if claimed is not None:
                    store.jobs.complete(claimed.lease)
                    settled.append(claimed.id)
    except BaseException:
        error = traceback.format_exc()
    with open(output, "w", encoding="utf-8") as out:
        json.dump({"settled": settled, "most": most, "rounds": rounds, "error": error}, out)
