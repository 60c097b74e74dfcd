"""SQLite's own part of tests/conformance/test_group_commit.py: what only SQLite can show.

Moved out of the conformance suite, which holds what every backend promises
(its conftest refuses a ``sqlite`` requirement there); a test marked
``both_apis`` still runs through the asyncio API too, as it did there.
"""

from __future__ import annotations

from jaren_jobs import (
    NewJob,
    Store,
    testing,
)
from jaren_jobs.core.settle import SettleBatch
from jaren_jobs.engine.group_commit import SettlementBatcher
from jaren_jobs.jobs import engine_of
from tests.conformance.test_group_commit import committed_state
from tests.harness import Harness


def test_a_lone_settlement_waits_for_nobody(store: Store) -> None:
    store.jobs.enqueue("k")
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    batcher = SettlementBatcher(engine_of(store.jobs))
    statements: list[str] = []
    store.connection.set_trace_callback(statements.append)
    try:
        assert batcher.complete(claimed.lease, {"ok": 1}) is True
    finally:
        store.connection.set_trace_callback(None)
    writes = [s for s in statements if not s.startswith("PRAGMA")]
    assert writes[0] == "BEGIN IMMEDIATE"
    assert writes[-1] == "COMMIT"
    assert batcher.batches == 1
    job = store.jobs.get(claimed.id)
    assert job is not None
    assert (job.state, job.result) == ("done", {"ok": 1})


# counts the statements through sqlite3's trace callback
def test_one_settle_call_writes_completions_failures_releases_and_claims(
    store: Store, backend: Harness
) -> None:
    store.jobs.enqueue_many([NewJob("k", n, id=f"j{n}") for n in range(6)])
    claims = store.jobs.claim_many(["k"], owner="w", limit=4)  # j0..j3
    batcher = SettlementBatcher(engine_of(store.jobs))
    request = testing.claim_request(store.jobs, ["k"], owner="w")
    batch = SettleBatch(
        (
            batcher.completion(claims[0].lease, {"ok": 0}),
            batcher.failure(claims[1].lease, RuntimeError("boom"), retry=False),
            batcher.completion(claims[0].lease, {"ok": "again"}),  # same attempt: idempotent
        ),
        releases=(claims[2].lease, claims[3].lease),
        claims=((request, 1),),
    )
    statements: list[str] = []
    store.connection.set_trace_callback(statements.append)
    try:
        settled = batcher.submit(batch)
    finally:
        store.connection.set_trace_callback(None)
    # ONE transaction for all of it
    assert statements.count("BEGIN IMMEDIATE") == 1
    assert statements.count("COMMIT") == 1
    assert batcher.batches == 1
    assert [settled.result(n) for n in range(3)] == [True, True, True]
    assert settled.wrote == [True, True, False]
    assert settled.release_error is None
    (next_job,) = settled.jobs(0)
    # released jobs are claimable again at once: the claim, last in the batch, takes one
    assert next_job.id in {"j2", "j3"}
    states = {f"j{n}": committed_state(backend, f"j{n}") for n in range(6)}
    released = "j3" if next_job.id == "j2" else "j2"
    assert states == {
        "j0": "done",
        "j1": "dead",
        next_job.id: "leased",
        released: "pending",
        "j4": "pending",
        "j5": "pending",
    }
