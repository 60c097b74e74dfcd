"""sweep(states=...): only some of the settled states, e.g. keep the dead letters (SPEC §14)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from jaren_jobs import JobState, Store
from tests.conftest import START, FakeClock


def at(offset: float) -> datetime:
    return datetime.fromtimestamp(START + offset, tz=timezone.utc)


def settle_three(store: Store, clock: FakeClock) -> None:
    """done-0/1, dead-0/1, cancelled-0/1, a second apart in that order; one pending."""
    for n in range(2):
        store.jobs.enqueue("ok", id=f"done-{n}")
        store.jobs.enqueue("bad", id=f"dead-{n}", max_attempts=1)
        store.jobs.enqueue("x", id=f"cancelled-{n}")
    store.jobs.enqueue("x", id="pending")
    for n in range(2):
        claimed = store.jobs.claim(["ok"], owner="w")
        assert claimed is not None
        store.jobs.complete(claimed.lease)
        clock.advance(1)
        claimed = store.jobs.claim(["bad"], owner="w")
        assert claimed is not None
        store.jobs.fail(claimed.lease, "boom")
        clock.advance(1)
        store.jobs.cancel(f"cancelled-{n}")
        clock.advance(1)


def left(store: Store) -> list[str]:
    with store.jobs.page(limit=100) as cursor:
        return [job.id for job in cursor]


def test_sweep_states_spares_the_states_not_named(store: Store, clock: FakeClock) -> None:
    settle_three(store, clock)
    clock.advance(60)
    assert store.jobs.sweep(settled_before=at(1000), states=["done"]) == 2
    assert left(store) == ["cancelled-0", "cancelled-1", "dead-0", "dead-1", "pending"]
    # several states, oldest first across them, bounded by the limit
    assert store.jobs.sweep(settled_before=at(1000), states={"cancelled", "dead"}, limit=3) == 3
    assert left(store) == ["cancelled-1", "pending"]
    assert store.jobs.errors("cancelled-1") == []
    assert store.jobs.sweep(settled_before=at(1000), states=[JobState.CANCELLED]) == 1
    assert left(store) == ["pending"]


def test_sweep_states_refuses_unsettled_or_empty_states_and_deletes_nothing(
    store: Store, clock: FakeClock
) -> None:
    settle_three(store, clock)
    for bad in (["pending"], ["done", "leased"], [], ["running"]):
        with pytest.raises(ValueError, match="states"):
            store.jobs.sweep(settled_before=at(1000), states=bad)
    for wrong in ("done", [3]):
        with pytest.raises(TypeError, match="states"):
            store.jobs.sweep(settled_before=at(1000), states=wrong)  # type: ignore[arg-type]
    assert len(left(store)) == 7
