"""Merging callers' settle batches into one (``core.settle.merge``): pure, no store."""

from __future__ import annotations

from datetime import UTC, datetime

from jaren_jobs.core.commands import ClaimRequest, Failure
from jaren_jobs.core.settle import Completion, SettleBatch, merge
from jaren_jobs.records import Lease


def lease(job_id: str) -> Lease:
    return Lease(
        job_id=job_id,
        token=f"t-{job_id}",
        generation=1,
        attempt=1,
        owner="w",
        expires_at=datetime(2030, 1, 1, tzinfo=UTC),
    )


A = ClaimRequest(kinds=("a",), owner="w", lease_ms=1000)
B = ClaimRequest(kinds=("b",), owner="w", lease_ms=1000)


def test_a_lone_batch_is_its_own_merge() -> None:
    batch = SettleBatch((Completion(lease("j1"), "null"),), claims=((A, 2),))
    merged, places = merge([batch])
    assert merged is batch
    assert places == [[(0, 0)]]


def test_settlements_and_releases_keep_queue_order_and_claims_of_a_request_sum() -> None:
    fail = Failure(lease=lease("j2"), message="x", retry=True, base=1.0, cap=2.0)
    first = SettleBatch((Completion(lease("j1"), "1"),), releases=(lease("r1"),), claims=((A, 2),))
    second = SettleBatch((fail,), claims=((B, 1), (A, 3)))
    third = SettleBatch((Completion(lease("j1"), "2"),), releases=(lease("r2"),), claims=((A, 0),))
    merged, places = merge([first, second, third])
    assert merged.settlements == (first.settlements[0], fail, third.settlements[0])
    assert merged.releases == (lease("r1"), lease("r2"))
    # one claim per request, in first-asked order; each caller's slice after the earlier ones
    assert merged.claims == ((A, 5), (B, 1))
    assert places == [[(0, 0)], [(1, 0), (0, 2)], [(-1, 0)]]
    assert len(merged) == 3 + 1 + 2


def test_claims_of_one_request_in_one_batch_become_one_claim() -> None:
    """A worker's settling write asks for every loop's next jobs: one claim, not one per loop."""
    batch = SettleBatch(claims=((A, 2), (A, 1), (B, 1), (A, 3)))
    merged, places = merge([batch])
    assert merged.claims == ((A, 6), (B, 1))
    assert places == [[(0, 0), (0, 2), (1, 0), (0, 3)]]
