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
