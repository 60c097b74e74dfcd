"""``store.jobs`` and ``tx.jobs`` show SPEC §3's calls, and nothing else of the engine."""

from __future__ import annotations

from pathlib import Path

from jaren_jobs import open_store

# the calls of SPEC §3's table for store.jobs (the contract: docs/contract.md)
DOCUMENTED = {
    "enqueue",
    "enqueue_many",
    "get",
    "errors",
    "counts",
    "claim",
    "claim_many",
    "renew",
    "complete",
    "fail",
    "cancel",
    "requeue",
    "sweep",
    "page",
    "checkpoints_for",
    "create_worker",
    # SPEC §12: wait() is the contract's; snooze() is the engine call behind
    # jaren_jobs.Snooze, added so a snooze can be made without a worker
    "snooze",
    "wait",
    # SPEC §14: `jaren-jobs counts` tells ready-now from scheduled-later through it
    "due_counts",
    # SPEC §15's dashboard (issue 30): its "run now" action and its throughput chart
    # (docs/api.md); the contract (docs/contract.md) does not name them yet
    "run_now",
    "settled_buckets",
    # and the queues its per-queue table counts
    "queues",
}


def _public(obj: object) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def test_store_jobs_and_tx_jobs_show_the_documented_calls_only(tmp_path: Path) -> None:
    with open_store(tmp_path / "s.db") as store:
        shown = _public(store.jobs)
        assert shown == DOCUMENTED
        with store.transaction() as tx:
            assert _public(tx.jobs) == shown
