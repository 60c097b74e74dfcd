"""Spawn targets for the multi-process tests (importable, so ``spawn`` can find them)."""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import Any

from jaren_jobs import open_store

KIND = "work"


def claim_until_empty(
    db_path: str,
    owner: str,
    ready: Any,
    go: Any,
    out_path: str,
    *,
    lease_seconds: float,
    claimed_one: Any,
    peers_claimed: list[Any],
) -> None:
    """Claim and complete jobs until none is claimable; record every claim to ``out_path``.

    ``ready``/``go`` are multiprocessing events: this process says it has opened
    its store, then waits until the parent releases every claimer at once.
    After its first claim it sets ``claimed_one`` and holds that lease until
    every peer has claimed too, so the processes provably hold live leases
    at the same time (however SQLite hands out its write lock afterwards).
    """
    records: list[dict[str, Any]] = []
    report: dict[str, Any] = {"owner": owner, "records": records, "error": None}
    try:
        with open_store(db_path) as store:
            ready.set()
            if not go.wait(60):
                raise RuntimeError("the start signal never came")
            while True:
                claimed = store.jobs.claim([KIND], owner=owner, lease_seconds=lease_seconds)
                if claimed is None:
                    break
                lease = claimed.lease
                record = {
                    "job_id": claimed.id,
                    "generation": lease.generation,
                    "attempt": lease.attempt,
                    "token": lease.token,
                    "claimed_at": time.time(),
                    "expires_at": lease.expires_at.timestamp(),
                    "lease_owner": claimed.lease_owner,
                }
                if not records:
                    claimed_one.set()
                    for peer in peers_claimed:
                        if not peer.wait(60):
                            raise RuntimeError("a peer never made its first claim")
                record["completed"] = store.jobs.complete(lease, {"by": owner})
                records.append(record)
    except BaseException:
        report["error"] = traceback.format_exc()
    Path(out_path).write_text(json.dumps(report), encoding="utf-8")
