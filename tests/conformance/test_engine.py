"""The engine's calls (SPEC §3), deterministic: a fake clock, fixed uuids and draws."""

from __future__ import annotations

import json
import math
import os
from datetime import datetime, timedelta, timezone

import pytest

from jaren_jobs import (
    CancelScope,
    ClaimedJob,
    DuplicateJob,
    Job,
    JobSettled,
    Lease,
    LeaseExpired,
    LeaseRequired,
    LeaseSuperseded,
    NewJob,
    OperationCancelled,
    RunMismatch,
    Runtime,
    Store,
    backoff_seconds,
)
from tests.conftest import START, FakeClock, Sequence
from tests.harness import Harness, app_sql_for

NOW_MS = int(START * 1000)


def at(offset_seconds: float = 0.0) -> datetime:
    """The fake clock's start, shifted, as an aware UTC datetime."""
    return datetime.fromtimestamp(START, timezone.utc) + timedelta(seconds=offset_seconds)


def ms(value: datetime | None) -> int | None:
    if value is None:
        return None
    return round(value.timestamp() * 1000)


def claim_one(store: Store, kind: str = "k", lease_seconds: float = 30.0) -> ClaimedJob:
    claimed = store.jobs.claim([kind], owner="w1", lease_seconds=lease_seconds)
    assert claimed is not None
    return claimed


# ----------------------------------------------------------------- enqueue


def test_enqueue_defaults(store: Store, backend: Harness) -> None:
    job = store.jobs.enqueue("email")
    assert isinstance(job, Job)
    assert job.id == "id-000001"  # minted through the injected runtime
    assert job.kind == "email"
    assert job.payload is None
    assert job.state == "pending"
    assert job.priority == 0
    assert job.attempts == 0
    assert job.max_attempts == 5
    assert job.run_at == at(0)
    assert job.lease_until is None
    assert job.lease_owner is None
    assert job.lease_generation == 0
    assert job.last_error is None
    assert job.result is None
    assert job.created_at == job.updated_at == at(0)
    assert store.jobs.get(job.id) == job
    row = backend.raw_row(job.id)
    assert row is not None
    assert row["run_at"] == row["created_at"] == NOW_MS
    assert row["lease_token"] is None


def test_enqueue_payload_round_trips(store: Store) -> None:
    payload = {"to": "a@b.c", "n": [1, 2.5, None, True], "nested": {"é": "ü"}}
    job = store.jobs.enqueue("email", payload, id="custom")
    assert job.id == "custom"
    again = store.jobs.get("custom")
    assert again is not None
    assert again.payload == payload


def test_enqueue_store_defaults_max_attempts(backend: Harness, runtime: Runtime) -> None:
    with backend.open(runtime=runtime, defaults={"max_attempts": 2}) as s:
        assert s.jobs.enqueue("k").max_attempts == 2
        assert s.jobs.enqueue("k", max_attempts=7).max_attempts == 7


def test_enqueue_run_at_in_the_past_runs_now(store: Store, clock: FakeClock) -> None:
    clock.advance(10)
    job = store.jobs.enqueue("k", run_at=at(-3600))
    assert job.run_at == at(10)
    claimed = store.jobs.claim(["k"], owner="w1")
    assert claimed is not None
    assert claimed.id == job.id


def test_enqueue_run_at_in_the_future_waits(store: Store, clock: FakeClock) -> None:
    job = store.jobs.enqueue("k", run_at=at(60))
    assert job.run_at == at(60)
    clock.set(START + 59.999)
    assert store.jobs.claim(["k"], owner="w1") is None
    clock.set(START + 60)
    claimed = store.jobs.claim(["k"], owner="w1")
    assert claimed is not None
    assert claimed.id == job.id


def test_enqueue_run_at_in_another_timezone(store: Store) -> None:
    plus_two = timezone(timedelta(hours=2))
    job = store.jobs.enqueue("k", run_at=at(30).astimezone(plus_two))
    assert job.run_at == at(30)
    assert job.run_at.utcoffset() == timedelta(0)


def test_enqueue_delay_seconds(store: Store, clock: FakeClock) -> None:
    job = store.jobs.enqueue("k", delay_seconds=2.5)
    assert job.run_at == at(2.5)
    clock.set(START + 2.499)
    assert store.jobs.claim(["k"], owner="w1") is None
    clock.set(START + 2.5)
    assert store.jobs.claim(["k"], owner="w1") is not None


def test_enqueue_delay_zero_runs_now(store: Store) -> None:
    job = store.jobs.enqueue("k", delay_seconds=0)
    assert job.run_at == at(0)


def test_enqueue_max_attempts(store: Store, clock: FakeClock) -> None:
    job = store.jobs.enqueue("k", max_attempts=2)
    assert job.max_attempts == 2
    first = claim_one(store)
    assert store.jobs.fail(first.lease, ValueError("one")) is True
    assert store.jobs.get(job.id).state == "failed"  # type: ignore[union-attr]
    clock.advance(3600)
    second = claim_one(store)
    assert second.attempts == 2
    assert store.jobs.fail(second.lease, ValueError("two")) is True
    final = store.jobs.get(job.id)
    assert final is not None
    assert final.state == "dead"
    assert final.attempts == 2
    assert final.last_error == "ValueError: two"


def test_duplicate_job(store: Store) -> None:
    first = store.jobs.enqueue("k", {"v": 1}, id="same")
    with pytest.raises(DuplicateJob) as info:
        store.jobs.enqueue("other", {"v": 2}, id="same")
    assert info.value.code == "JD2090"
    assert info.value.details["job_id"] == "same"
    assert str(info.value).startswith("JD2090: ")
    assert store.jobs.get("same") == first
    assert store.jobs.counts().pending == 1


def test_duplicate_job_after_settlement(store: Store) -> None:
    store.jobs.enqueue("k", id="same")
    assert store.jobs.complete(claim_one(store).lease) is True
    with pytest.raises(DuplicateJob):
        store.jobs.enqueue("k", id="same")
    assert store.jobs.get("same").state == "done"  # type: ignore[union-attr]


# ----------------------------------------------------------------- enqueue_many


def test_enqueue_many_inserts_in_order(store: Store) -> None:
    jobs = store.jobs.enqueue_many(
        [
            NewJob("a", {"n": 1}),
            NewJob("b", id="explicit", priority=3),
            NewJob("c", delay_seconds=5, max_attempts=1),
        ]
    )
    assert [j.kind for j in jobs] == ["a", "b", "c"]
    assert jobs[0].id == "id-000001"
    assert jobs[1].id == "explicit"
    assert jobs[1].priority == 3
    assert jobs[2].run_at == at(5)
    assert jobs[2].max_attempts == 1
    for job in jobs:
        assert store.jobs.get(job.id) == job


def test_enqueue_many_empty(store: Store) -> None:
    assert store.jobs.enqueue_many([]) == []
    assert store.jobs.enqueue_many(iter(())) == []
    assert store.jobs.counts().pending == 0


def test_enqueue_many_duplicate_within_batch_writes_nothing(store: Store) -> None:
    with pytest.raises(DuplicateJob) as info:
        store.jobs.enqueue_many([NewJob("k", id="x"), NewJob("k", id="y"), NewJob("k", id="x")])
    assert info.value.details["job_id"] == "x"
    assert store.jobs.get("x") is None
    assert store.jobs.get("y") is None
    assert store.jobs.counts().pending == 0


def test_enqueue_many_duplicate_against_table_writes_nothing(store: Store) -> None:
    store.jobs.enqueue("k", id="taken")
    with pytest.raises(DuplicateJob) as info:
        # the clash is the LAST item: the first two were inserted, then rolled back
        store.jobs.enqueue_many([NewJob("k", id="a"), NewJob("k"), NewJob("k", id="taken")])
    assert info.value.details["job_id"] == "taken"
    assert store.jobs.get("a") is None
    counts = store.jobs.counts()
    assert counts.pending == 1
    assert dict(counts.pending_kinds) == {"k": 1}


def test_enqueue_many_bad_item_writes_nothing(store: Store) -> None:
    with pytest.raises(TypeError):
        store.jobs.enqueue_many([NewJob("k", id="a"), NewJob("k", {1, 2})])
    with pytest.raises(TypeError):
        store.jobs.enqueue_many([NewJob("k", id="a"), ("k", None)])  # type: ignore[list-item]
    assert store.jobs.get("a") is None


# ----------------------------------------------------------------- get / counts


def test_get_unknown_is_none(store: Store) -> None:
    assert store.jobs.get("nope") is None


def test_counts(store: Store, clock: FakeClock) -> None:
    assert store.jobs.counts().to_dict() == {
        "pending": 0,
        "leased": 0,
        "done": 0,
        "failed": 0,
        "dead": 0,
        "cancelled": 0,
        "pending_kinds": {},
    }
    store.jobs.enqueue("a", id="a-pending")
    store.jobs.enqueue("a", id="a-later", delay_seconds=3600)  # pending though not due
    store.jobs.enqueue("b", id="b-done")
    store.jobs.enqueue("c", id="c-failed", max_attempts=3)
    store.jobs.enqueue("d", id="d-dead", max_attempts=1)
    store.jobs.enqueue("e", id="e-cancelled")
    store.jobs.enqueue("f", id="f-leased")
    assert store.jobs.complete(claim_one(store, "b").lease)
    assert store.jobs.fail(claim_one(store, "c").lease, "x")
    assert store.jobs.fail(claim_one(store, "d").lease, "x")
    assert store.jobs.cancel("e-cancelled") is True
    claim_one(store, "f")
    counts = store.jobs.counts()
    assert (counts.pending, counts.leased, counts.done) == (2, 1, 1)
    assert (counts.failed, counts.dead, counts.cancelled) == (1, 1, 1)
    # pending + failed per kind, whether or not run_at has passed
    assert dict(counts.pending_kinds) == {"a": 2, "c": 1}


# ----------------------------------------------------------------- claim


def test_claim_mints_a_lease(store: Store, backend: Harness) -> None:
    job = store.jobs.enqueue("k", {"x": 1})
    claimed = store.jobs.claim(["k"], owner="worker-1", lease_seconds=12.5)
    assert isinstance(claimed, ClaimedJob)
    assert claimed.id == job.id
    assert claimed.payload == {"x": 1}
    assert claimed.state == "leased"
    assert claimed.attempts == 1
    assert claimed.lease_generation == 1
    assert claimed.lease_owner == "worker-1"
    assert claimed.lease_until == at(12.5)
    lease = claimed.lease
    assert isinstance(lease, Lease)
    assert lease.job_id == job.id
    assert lease.generation == 1
    assert lease.attempt == 1
    assert lease.owner == "worker-1"
    assert lease.expires_at == at(12.5)
    row = backend.raw_row(job.id)
    assert row is not None
    assert row["lease_token"] == lease.token
    assert row["state"] == "leased"
    assert row["lease_until"] == NOW_MS + 12_500


def test_claim_uses_default_lease_seconds(backend: Harness, runtime: Runtime) -> None:
    with backend.open(runtime=runtime, defaults={"lease_seconds": 7}) as s:
        s.jobs.enqueue("k")
        claimed = s.jobs.claim(["k"], owner="w")
        assert claimed is not None
        assert claimed.lease.expires_at == at(7)


def test_claim_empty_queue_is_none(store: Store) -> None:
    assert store.jobs.claim(["k"], owner="w1") is None
    store.jobs.enqueue("other")
    assert store.jobs.claim(["k"], owner="w1") is None


def test_claim_order(store: Store, clock: FakeClock) -> None:
    # priority desc, then run_at, then created_at, then id
    store.jobs.enqueue("k", id="low", priority=-1)
    store.jobs.enqueue("k", id="z-mid-created-first", priority=5)
    clock.advance(1)
    store.jobs.enqueue("k", id="a-mid-created-later", priority=5)
    store.jobs.enqueue("k", id="m-past-run-at-clamped", priority=5, run_at=at(-100))
    store.jobs.enqueue("k", id="top", priority=9)
    store.jobs.enqueue("k", id="zero-b")
    store.jobs.enqueue("k", id="zero-a")
    # a past run_at is clamped to now (t=1): it ties with the jobs enqueued beside it
    order = []
    clock.advance(1)
    while (claimed := store.jobs.claim(["k"], owner="w1")) is not None:
        order.append(claimed.id)
    assert order == [
        "top",
        "z-mid-created-first",  # run_at t=0 < t=1
        "a-mid-created-later",  # run_at t=1, created t=1, id "a-…" < "m-…"
        "m-past-run-at-clamped",
        "zero-a",
        "zero-b",
        "low",
    ]


def test_claim_order_run_at_before_created_at(store: Store, clock: FakeClock) -> None:
    store.jobs.enqueue("k", id="created-first-runs-later", delay_seconds=10)
    clock.advance(1)
    store.jobs.enqueue("k", id="created-later-runs-first", delay_seconds=2)
    clock.advance(20)
    first = store.jobs.claim(["k"], owner="w1")
    assert first is not None
    assert first.id == "created-later-runs-first"


def test_claim_kinds_filter(store: Store) -> None:
    store.jobs.enqueue("a", id="ja", priority=1)
    store.jobs.enqueue("b", id="jb", priority=2)
    store.jobs.enqueue("c", id="jc", priority=3)
    first = store.jobs.claim(("a", "b"), owner="w1")
    assert first is not None
    assert first.id == "jb"
    second = store.jobs.claim({"a", "b"}, owner="w1")
    assert second is not None
    assert second.id == "ja"
    assert store.jobs.claim(["a", "b"], owner="w1") is None
    assert store.jobs.get("jc").state == "pending"  # type: ignore[union-attr]


def test_claim_kinds_with_sql_metacharacters_are_data(store: Store) -> None:
    weird = 'k\'); DROP TABLE "_jaren_jobs"; --'
    store.jobs.enqueue(weird, id="w")
    claimed = store.jobs.claim([weird], owner="w1")
    assert claimed is not None
    assert claimed.kind == weird


def test_claim_skips_future_run_at(store: Store, clock: FakeClock) -> None:
    store.jobs.enqueue("k", id="later", delay_seconds=5, priority=100)
    store.jobs.enqueue("k", id="now")
    first = store.jobs.claim(["k"], owner="w1")
    assert first is not None
    assert first.id == "now"
    assert store.jobs.claim(["k"], owner="w1") is None
    clock.advance(5)
    second = store.jobs.claim(["k"], owner="w1")
    assert second is not None
    assert second.id == "later"


def test_claim_rescues_an_expired_lease(store: Store, clock: FakeClock) -> None:
    store.jobs.enqueue("k", id="j")
    first = store.jobs.claim(["k"], owner="crashed", lease_seconds=10)
    assert first is not None
    clock.set(START + 9.999)
    assert store.jobs.claim(["k"], owner="rescuer") is None  # still live
    clock.set(START + 10)  # lease_until == now: expired
    second = store.jobs.claim(["k"], owner="rescuer", lease_seconds=10)
    assert second is not None
    assert second.id == "j"
    assert second.lease.generation == first.lease.generation + 1 == 2
    assert second.lease.attempt == second.attempts == 2
    assert second.lease_owner == "rescuer"
    assert second.lease.token != first.lease.token
    assert second.lease.expires_at == at(20)


def test_claim_lease_tokens_are_fresh(store: Store, ids: Sequence) -> None:
    store.jobs.enqueue_many([NewJob("k") for _ in range(3)])
    tokens = [claim_one(store).lease.token for _ in range(3)]
    assert len(set(tokens)) == 3
    # and never a job id: the token is minted by the claim, not derived
    assert not set(tokens) & {"id-000001", "id-000002", "id-000003"}


def test_claim_of_failed_job_after_backoff(store: Store, clock: FakeClock) -> None:
    store.jobs.enqueue("k", id="j")
    first = claim_one(store)
    assert store.jobs.fail(first.lease, "boom")
    assert store.jobs.claim(["k"], owner="w1") is None  # backoff not yet passed
    clock.advance(1)
    again = claim_one(store)
    assert again.id == "j"
    assert again.attempts == 2
    assert again.lease.generation == 2
    assert again.last_error == "boom"


# ----------------------------------------------------------------- claim_many


def test_claim_many_limit_and_order(store: Store) -> None:
    store.jobs.enqueue("k", id="p1", priority=1)
    store.jobs.enqueue("k", id="p3", priority=3)
    store.jobs.enqueue("k", id="p2", priority=2)
    store.jobs.enqueue("k", id="p0")
    claimed = store.jobs.claim_many(["k"], owner="w1", limit=3, lease_seconds=5)
    assert [c.id for c in claimed] == ["p3", "p2", "p1"]
    assert len({c.lease.token for c in claimed}) == 3
    assert all(c.lease.generation == 1 and c.lease.expires_at == at(5) for c in claimed)
    rest = store.jobs.claim_many(["k"], owner="w1", limit=10)
    assert [c.id for c in rest] == ["p0"]
    assert store.jobs.claim_many(["k"], owner="w1", limit=10) == []


# ----------------------------------------------------------------- renew


def test_renew(store: Store, clock: FakeClock, backend: Harness) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = claim_one(store, lease_seconds=10)
    clock.advance(4)
    renewed = store.jobs.renew(claimed.lease, lease_seconds=20)
    assert renewed.token != claimed.lease.token
    assert renewed.expires_at == at(24)
    assert renewed.generation == claimed.lease.generation
    assert renewed.attempt == claimed.lease.attempt
    assert renewed.job_id == "j"
    assert renewed.owner == claimed.lease.owner
    row = backend.raw_row("j")
    assert row is not None
    assert row["lease_token"] == renewed.token
    assert row["lease_until"] == NOW_MS + 24_000
    assert row["attempts"] == 1
    # the old lease now fails every settling call while the job is leased
    for call in (
        lambda: store.jobs.renew(claimed.lease),
        lambda: store.jobs.complete(claimed.lease),
        lambda: store.jobs.fail(claimed.lease, "x"),
        lambda: store.jobs.cancel("j", lease=claimed.lease),
    ):
        with pytest.raises(LeaseSuperseded) as info:
            call()
        assert info.value.code == "JD2066"
    assert backend.raw_row("j") == row
    assert store.jobs.complete(renewed, "ok") is True


def test_renew_default_lease_seconds(store: Store, clock: FakeClock) -> None:
    store.jobs.enqueue("k")
    claimed = claim_one(store, lease_seconds=1)
    clock.advance(0.5)
    assert store.jobs.renew(claimed.lease).expires_at == at(30.5)


def test_renew_expired_lease(store: Store, clock: FakeClock) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = claim_one(store, lease_seconds=10)
    clock.advance(10)
    with pytest.raises(LeaseExpired) as info:
        store.jobs.renew(claimed.lease)
    assert info.value.code == "JD2067"


def test_renew_of_settled_job(store: Store) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = claim_one(store)
    assert store.jobs.complete(claimed.lease)
    with pytest.raises(JobSettled):
        store.jobs.renew(claimed.lease)


# ----------------------------------------------------------------- complete / fail and the fence


def test_complete(store: Store, clock: FakeClock, backend: Harness) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = claim_one(store)
    clock.advance(2)
    assert store.jobs.complete(claimed.lease, {"sent": True}) is True
    job = store.jobs.get("j")
    assert job is not None
    assert job.state == "done"
    assert job.result == {"sent": True}
    assert job.lease_until is None
    assert job.updated_at == at(2)
    assert job.attempts == 1
    row = backend.raw_row("j")
    assert row is not None
    assert row["lease_token"] is None
    assert row["settled_generation"] == 1


def test_complete_refusals(store: Store, clock: FakeClock, backend: Harness) -> None:
    store.jobs.enqueue("k", id="j")
    first = claim_one(store, lease_seconds=10)

    # LeaseExpired: the token matches, the lease ran out, nobody re-claimed yet
    clock.advance(10)
    before = backend.raw_row("j")
    with pytest.raises(LeaseExpired) as expired:
        store.jobs.complete(first.lease, "late")
    assert expired.value.code == "JD2067"
    assert expired.value.details["job_id"] == "j"
    with pytest.raises(LeaseExpired):
        store.jobs.fail(first.lease, "late")
    assert backend.raw_row("j") == before

    # LeaseSuperseded: another attempt holds it now
    second = claim_one(store, lease_seconds=10)
    before = backend.raw_row("j")
    with pytest.raises(LeaseSuperseded) as superseded:
        store.jobs.complete(first.lease, "late")
    assert superseded.value.code == "JD2066"
    assert superseded.value.details["current_generation"] == 2
    with pytest.raises(LeaseSuperseded):
        store.jobs.fail(first.lease, "late")
    assert backend.raw_row("j") == before

    # JobSettled: the other attempt settled it
    assert store.jobs.complete(second.lease, "second") is True
    before = backend.raw_row("j")
    with pytest.raises(JobSettled) as settled:
        store.jobs.complete(first.lease, "late")
    assert settled.value.code == "JD2065"
    with pytest.raises(JobSettled):
        store.jobs.fail(first.lease, "late")
    assert backend.raw_row("j") == before
    assert store.jobs.get("j").result == "second"  # type: ignore[union-attr]


def test_complete_of_unknown_job(store: Store) -> None:
    forged = Lease(job_id="ghost", token="t", generation=1, attempt=1, owner="w", expires_at=at(9))
    with pytest.raises(JobSettled) as info:
        store.jobs.complete(forged)
    assert info.value.details["job_id"] == "ghost"
    with pytest.raises(JobSettled):
        store.jobs.fail(forged, "x")
    with pytest.raises(JobSettled):
        store.jobs.renew(forged)
    assert store.jobs.get("ghost") is None


def test_resettlement_by_same_attempt_is_idempotent(store: Store, backend: Harness) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = claim_one(store)
    assert store.jobs.complete(claimed.lease, "first") is True
    row = backend.raw_row("j")
    assert store.jobs.complete(claimed.lease, "second") is True
    assert store.jobs.fail(claimed.lease, "late") is True
    assert store.jobs.fail(claimed.lease, "late", retry=False) is True
    assert backend.raw_row("j") == row  # wrote nothing
    assert store.jobs.get("j").result == "first"  # type: ignore[union-attr]


def test_resettlement_after_fail_is_idempotent(store: Store, backend: Harness) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = claim_one(store)
    assert store.jobs.fail(claimed.lease, "boom") is True
    row = backend.raw_row("j")
    assert store.jobs.fail(claimed.lease, "boom again") is True
    assert store.jobs.complete(claimed.lease, "result") is True
    assert backend.raw_row("j") == row


def test_resettlement_with_pre_renewal_lease(
    store: Store, clock: FakeClock, backend: Harness
) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = claim_one(store, lease_seconds=10)
    renewed = store.jobs.renew(claimed.lease)
    assert store.jobs.complete(renewed, "done") is True
    row = backend.raw_row("j")
    # the attempt's older lease counts too: same generation
    assert store.jobs.complete(claimed.lease, "other") is True
    assert store.jobs.fail(claimed.lease, "x") is True
    clock.advance(3600)  # long after both leases would have run out
    assert store.jobs.complete(renewed) is True
    assert store.jobs.complete(claimed.lease) is True
    assert backend.raw_row("j") == row


def test_resettlement_is_per_attempt(store: Store, clock: FakeClock) -> None:
    store.jobs.enqueue("k", id="j")
    first = claim_one(store)
    assert store.jobs.fail(first.lease, "one") is True
    clock.advance(5)
    second = claim_one(store)
    assert store.jobs.complete(second.lease) is True
    # the first attempt settled it once, but the row was since settled by another
    with pytest.raises(JobSettled):
        store.jobs.fail(first.lease, "one")
    assert store.jobs.complete(second.lease) is True


# how an attempt can settle its job (the old life's: a state a sweep removes)
ENDINGS = {
    "complete": lambda store, lease: store.jobs.complete(lease, "ok"),
    "dead": lambda store, lease: store.jobs.fail(lease, "boom", retry=False),
    "retry": lambda store, lease: store.jobs.fail(lease, "boom"),
    "cancel": lambda store, lease: store.jobs.cancel(lease.job_id, lease=lease),
}


@pytest.mark.parametrize("second", ["complete", "retry", "cancel"])
@pytest.mark.parametrize("first", ["complete", "dead", "cancel"])
def test_resettlement_does_not_survive_a_sweep_and_reuse_of_the_id(
    store: Store, clock: FakeClock, backend: Harness, first: str, second: str
) -> None:
    store.jobs.enqueue("k", id="j")
    old = claim_one(store)
    old_renewed = store.jobs.renew(old.lease)
    assert ENDINGS[first](store, old_renewed) is True
    clock.advance(10)
    assert store.jobs.sweep(settled_before=at(5)) == 1
    store.jobs.enqueue("k", id="j")
    new = claim_one(store)
    assert new.lease.generation == old.lease.generation  # the generation starts again
    new_renewed = store.jobs.renew(new.lease)
    assert ENDINGS[second](store, new_renewed) is True
    row = backend.raw_row("j")

    # neither of the old attempt's leases settled this life of the job
    for stale in (old.lease, old_renewed):
        with pytest.raises(JobSettled):
            store.jobs.complete(stale, "stale")
        with pytest.raises(JobSettled):
            store.jobs.fail(stale, "stale")
        with pytest.raises(JobSettled):
            store.jobs.fail(stale, "stale", retry=False)
        with pytest.raises(JobSettled):
            store.jobs.cancel("j", lease=stale)
        with pytest.raises(JobSettled):
            store.jobs.renew(stale)
    assert backend.raw_row("j") == row
    # the attempt that did settle it still answers idempotently, with either lease
    for own in (new.lease, new_renewed):
        assert store.jobs.complete(own, "again") is True
        assert store.jobs.fail(own, "again") is True
        assert store.jobs.cancel("j", lease=own) is False
    assert backend.raw_row("j") == row


def test_the_settling_attempt_is_not_readable_from_the_job(store: Store, backend: Harness) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = claim_one(store)
    assert store.jobs.complete(claimed.lease) is True
    stored = backend.raw_row("j")
    assert stored is not None
    # what names the settling attempt is a digest: no token, live or spent, is kept
    assert claimed.lease.token not in {str(value) for value in stored.values()}
    job = store.jobs.get("j")
    assert job is not None
    assert claimed.lease.token not in repr(job)
    assert claimed.lease.token not in json.dumps(job.to_dict())
    assert claimed.lease.token not in repr(claimed.lease)


# ----------------------------------------------------------------- fail: backoff, dead-lettering


@pytest.mark.parametrize(
    "case",
    [
        (0.5, 1.0, 600.0, 1, 0.75),  # d = 1: 0.5 fixed + 0.5 * 0.5
        (0.0, 1.0, 600.0, 1, 0.5),  # half of d is fixed
        (0.999, 1.0, 600.0, 1, 0.9995),  # stored as 999 ms: rounded down
        (0.25, 2.0, 600.0, 3, 5.0),  # d = 2 * 2**2 = 8: 4 + 0.25 * 4
        (0.5, 2.0, 5.0, 4, 3.75),  # d = min(5, 16) = 5: 2.5 + 1.25
    ],
    ids=["draw-half", "draw-zero", "draw-near-one", "third-retry", "capped"],
)
def test_fail_backoff_with_jitter(
    backend: Harness, clock: FakeClock, case: tuple[float, float, float, int, float]
) -> None:
    draw, base, cap, failures, last_delay = case
    ids = Sequence(draw=draw)
    runtime = Runtime(now=clock.now, random=ids.random, uuid=ids.uuid)
    defaults = {"backoff_base_seconds": base, "backoff_cap_seconds": cap, "max_attempts": 10}
    with backend.open(runtime=runtime, defaults=defaults) as s:
        s.jobs.enqueue("k", id="j")
        delay = 0.0
        for retry in range(1, failures + 1):
            clock.advance(1000)  # past any earlier backoff
            claimed = s.jobs.claim(["k"], owner="w")
            assert claimed is not None
            assert claimed.attempts == retry
            now_ms = math.floor(clock.now() * 1000)
            assert s.jobs.fail(claimed.lease, f"failure {retry}") is True
            d = min(cap, base * 2 ** (retry - 1))
            delay = d / 2 + draw * d / 2
            job = s.jobs.get("j")
            assert job is not None
            assert job.state == "failed"
            assert job.last_error == f"failure {retry}"
            assert ms(job.run_at) == now_ms + math.floor(delay * 1000)
            # not claimable a millisecond early
            clock.set((ms(job.run_at) - 1) / 1000)  # type: ignore[operator]
            assert s.jobs.claim(["k"], owner="w") is None
        assert delay == pytest.approx(last_delay)
        assert backoff_seconds(failures, base, cap, draw) == pytest.approx(last_delay)


def test_backoff_seconds_formula() -> None:
    assert backoff_seconds(1, 1.0, 600.0, 0.5) == 0.75
    assert backoff_seconds(3, 2.0, 600.0, 0.25) == 5.0  # d = 8
    assert backoff_seconds(4, 2.0, 5.0, 0.5) == 3.75  # d = min(5, 16)
    assert backoff_seconds(10_000, 1.0, 600.0, 1.0) == 600.0  # no overflow far out
    assert backoff_seconds(1, 1.0, 600.0, 0.0) == 0.5


def test_fail_per_call_backoff_override(store: Store, clock: FakeClock) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = claim_one(store)
    assert store.jobs.fail(claimed.lease, "x", backoff_base_seconds=10, backoff_cap_seconds=20)
    # draw 0.5 (the fixture's), d = 10: 5 + 2.5
    assert store.jobs.get("j").run_at == at(7.5)  # type: ignore[union-attr]


def test_fail_dead_letters_at_max_attempts(store: Store, backend: Harness) -> None:
    store.jobs.enqueue("k", id="j", max_attempts=1)
    claimed = claim_one(store)
    assert store.jobs.fail(claimed.lease, RuntimeError("gone")) is True
    job = store.jobs.get("j")
    assert job is not None
    assert job.state == "dead"
    assert job.last_error == "RuntimeError: gone"
    assert job.lease_until is None
    row = backend.raw_row("j")
    assert row is not None
    assert row["lease_token"] is None
    assert store.jobs.claim(["k"], owner="w1") is None


def test_fail_without_retry_dead_letters(store: Store) -> None:
    store.jobs.enqueue("k", id="j", max_attempts=5)
    claimed = claim_one(store)
    assert store.jobs.fail(claimed.lease, "fatal", retry=False) is True
    job = store.jobs.get("j")
    assert job is not None
    assert job.state == "dead"
    assert job.attempts == 1
    assert job.last_error == "fatal"


def test_last_error_of_a_jobs_error_starts_with_its_code(store: Store) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = claim_one(store)
    assert store.jobs.fail(claimed.lease, RunMismatch("the document moved"), retry=False)
    job = store.jobs.get("j")
    assert job is not None
    assert job.last_error is not None
    assert job.last_error.startswith("JD2069: ")
    assert "the document moved" in job.last_error


class _HostileError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no description for you")


class _HostileObject:
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class _SurrogateRepr:
    def __repr__(self) -> str:
        return "<error \udfff>"


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ValueError("bad value"), "ValueError: bad value"),
        (KeyError("missing"), "KeyError: 'missing'"),
        (RuntimeError(), "RuntimeError"),
        ("plain text", "plain text"),
        (42, "42"),
        (_HostileError("x"), "_HostileError"),
        (_HostileObject(), "_HostileObject"),
        # lone surrogates (a non-UTF-8 file name through os.fsdecode, surrogateescape)
        # cannot be stored as they are: they are kept escaped
        ("bad \udc80 byte", "bad \\udc80 byte"),
        (
            OSError("cannot open " + os.fsdecode(b"caf\xe9.txt")),
            "OSError: cannot open caf\\udce9.txt",
        ),
        (RunMismatch("node \ud800 moved"), "JD2069: node \\ud800 moved"),
        (_SurrogateRepr(), "<error \\udfff>"),
    ],
    ids=[
        "value-error",
        "key-error",
        "empty-message",
        "str",
        "int",
        "hostile-exc",
        "hostile-obj",
        "str-lone-surrogate",
        "fsdecoded-name",
        "jobs-error-surrogate",
        "repr-surrogate",
    ],
)
def test_last_error_describes_anything(store: Store, error: object, expected: str) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = claim_one(store)
    assert store.jobs.fail(claimed.lease, error, retry=False) is True
    job = store.jobs.get("j")
    assert job is not None
    assert job.state == "dead"
    assert isinstance(job.last_error, str)
    assert expected in job.last_error
    job.last_error.encode("utf-8")  # storable, printable text


# ----------------------------------------------------------------- cancel


def test_cancel_queued(store: Store, clock: FakeClock) -> None:
    store.jobs.enqueue("k", id="pending")
    store.jobs.enqueue("k", id="failed")
    assert store.jobs.fail(claim_one(store).lease, "x")
    assert store.jobs.get("failed").state == "failed"  # type: ignore[union-attr]
    clock.advance(1)
    assert store.jobs.cancel("pending") is True
    assert store.jobs.cancel("failed") is True
    for job_id in ("pending", "failed"):
        job = store.jobs.get(job_id)
        assert job is not None
        assert job.state == "cancelled"
        assert job.updated_at == at(1)
    assert store.jobs.claim(["k"], owner="w1") is None
    # already cancelled
    assert store.jobs.cancel("pending") is False
    assert store.jobs.cancel("failed") is False


def test_cancel_claimed_without_lease(store: Store, clock: FakeClock, backend: Harness) -> None:
    store.jobs.enqueue("k", id="j")
    claim_one(store, lease_seconds=10)
    row = backend.raw_row("j")
    with pytest.raises(LeaseRequired) as info:
        store.jobs.cancel("j")
    assert info.value.code == "JD2068"
    clock.advance(60)  # even when the lease has expired
    with pytest.raises(LeaseRequired):
        store.jobs.cancel("j")
    assert backend.raw_row("j") == row


def test_cancel_with_current_lease(store: Store, clock: FakeClock, backend: Harness) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = claim_one(store, lease_seconds=10)
    clock.advance(3)
    assert store.jobs.cancel("j", lease=claimed.lease) is True
    job = store.jobs.get("j")
    assert job is not None
    assert job.state == "cancelled"
    assert job.lease_until is None
    assert job.updated_at == at(3)
    row = backend.raw_row("j")
    assert row is not None
    assert row["lease_token"] is None
    # the same attempt asking again: it already settled it
    assert store.jobs.cancel("j", lease=claimed.lease) is False
    # and a lease-less cancel sees it already cancelled
    assert store.jobs.cancel("j") is False


def test_cancel_with_renewed_lease(store: Store) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = claim_one(store)
    renewed = store.jobs.renew(claimed.lease)
    with pytest.raises(LeaseSuperseded):
        store.jobs.cancel("j", lease=claimed.lease)
    assert store.jobs.cancel("j", lease=renewed) is True


def test_cancel_with_stale_lease(store: Store, clock: FakeClock, backend: Harness) -> None:
    store.jobs.enqueue("k", id="j")
    first = claim_one(store, lease_seconds=10)
    clock.advance(10)
    with pytest.raises(LeaseExpired):
        store.jobs.cancel("j", lease=first.lease)
    second = claim_one(store, lease_seconds=10)
    row = backend.raw_row("j")
    with pytest.raises(LeaseSuperseded):
        store.jobs.cancel("j", lease=first.lease)
    assert backend.raw_row("j") == row
    assert store.jobs.complete(second.lease) is True
    with pytest.raises(JobSettled):
        store.jobs.cancel("j", lease=first.lease)
    assert store.jobs.get("j").state == "done"  # type: ignore[union-attr]


def test_cancel_after_same_attempt_settled(store: Store, backend: Harness) -> None:
    store.jobs.enqueue("a", id="done")
    store.jobs.enqueue("b", id="dead", max_attempts=1)
    done = claim_one(store, "a")
    dead = claim_one(store, "b")
    assert store.jobs.complete(done.lease) is True
    assert store.jobs.fail(dead.lease, "x") is True
    rows = (backend.raw_row("done"), backend.raw_row("dead"))
    assert store.jobs.cancel("done", lease=done.lease) is False
    assert store.jobs.cancel("dead", lease=dead.lease) is False
    assert (backend.raw_row("done"), backend.raw_row("dead")) == rows


def test_cancel_unknown_or_settled(store: Store) -> None:
    with pytest.raises(JobSettled) as info:
        store.jobs.cancel("ghost")
    assert info.value.code == "JD2065"
    store.jobs.enqueue("a", id="done")
    store.jobs.enqueue("b", id="dead", max_attempts=1)
    assert store.jobs.complete(claim_one(store, "a").lease)
    assert store.jobs.fail(claim_one(store, "b").lease, "x")
    for job_id in ("done", "dead"):
        with pytest.raises(JobSettled):
            store.jobs.cancel(job_id)
    assert store.jobs.get("done").state == "done"  # type: ignore[union-attr]
    assert store.jobs.get("dead").state == "dead"  # type: ignore[union-attr]


# ----------------------------------------------------------------- requeue


def test_requeue_failed_dead_cancelled(store: Store, clock: FakeClock) -> None:
    store.jobs.enqueue("k", id="failed", priority=3)
    store.jobs.enqueue("k", id="dead", priority=2, max_attempts=1)
    store.jobs.enqueue("k", id="cancelled", priority=1)
    assert store.jobs.fail(claim_one(store).lease, "x")
    assert store.jobs.fail(claim_one(store).lease, "x")
    assert store.jobs.cancel("cancelled") is True
    clock.advance(7)
    for job_id in ("failed", "dead", "cancelled"):
        before = store.jobs.get(job_id)
        assert before is not None
        assert store.jobs.requeue(job_id) is True
        job = store.jobs.get(job_id)
        assert job is not None
        assert job.state == "pending"
        assert job.run_at == at(7)
        assert job.updated_at == at(7)
        assert job.attempts == before.attempts  # history kept
        assert job.last_error == before.last_error
        assert job.lease_until is None
        assert job.lease_owner is None
        # already pending
        assert store.jobs.requeue(job_id) is False
    # claimable now, and the attempt count carries on
    again = claim_one(store)
    assert again.id == "failed"
    assert again.attempts == 2
    assert again.lease.generation == 2


def test_requeue_lease_expired(store: Store, clock: FakeClock, backend: Harness) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = claim_one(store, lease_seconds=10)
    clock.advance(10)
    assert store.jobs.requeue("j") is True
    job = store.jobs.get("j")
    assert job is not None
    assert job.state == "pending"
    assert job.attempts == 1
    assert job.run_at == at(10)
    row = backend.raw_row("j")
    assert row is not None
    assert row["lease_token"] is None
    # the attempt whose lease ran out no longer speaks for the job
    with pytest.raises(JobSettled):
        store.jobs.complete(claimed.lease)
    with pytest.raises(JobSettled):
        store.jobs.fail(claimed.lease, "x")
    with pytest.raises(JobSettled):
        store.jobs.renew(claimed.lease)
    assert backend.raw_row("j") == row
    assert claim_one(store).lease.generation == 2


def test_requeue_live_lease(store: Store, backend: Harness) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = claim_one(store)
    row = backend.raw_row("j")
    with pytest.raises(LeaseRequired) as info:
        store.jobs.requeue("j")
    assert info.value.code == "JD2068"
    assert backend.raw_row("j") == row
    assert store.jobs.complete(claimed.lease) is True


def test_requeue_done_or_unknown(store: Store) -> None:
    with pytest.raises(JobSettled):
        store.jobs.requeue("ghost")
    store.jobs.enqueue("k", id="j")
    assert store.jobs.complete(claim_one(store).lease, "r")
    with pytest.raises(JobSettled) as info:
        store.jobs.requeue("j")
    assert info.value.details["state"] == "done"
    job = store.jobs.get("j")
    assert job is not None
    assert (job.state, job.result) == ("done", "r")


def test_requeue_pending(store: Store) -> None:
    store.jobs.enqueue("k", id="j", delay_seconds=60)
    assert store.jobs.requeue("j") is False
    assert store.jobs.get("j").run_at == at(60)  # type: ignore[union-attr]


# ----------------------------------------------------------------- sweep


def _checkpoint(store: Store, run_id: str, node_id: str) -> None:
    with store.transaction() as tx:
        tx.execute(
            app_sql_for(
                store,
                'INSERT INTO "_jaren_job_checkpoints" (run_id, node_id, value, generation) '
                "VALUES (?, ?, '1', 1)",
            ),
            (run_id, node_id),
        )


def _checkpoint_runs(backend: Harness) -> list[str]:
    return sorted({run for run, _, _, _ in backend.checkpoint_rows()})


def test_sweep(store: Store, clock: FakeClock, backend: Harness) -> None:
    # settled at t=0, 1, 2 (done, dead, cancelled), plus unsettled ones at t=0
    store.jobs.enqueue("k", id="s0-done")
    store.jobs.enqueue("k", id="s1-dead", max_attempts=1)
    store.jobs.enqueue("k", id="s2-cancelled")
    store.jobs.enqueue("other", id="pending")
    store.jobs.enqueue("other", id="failed")
    store.jobs.enqueue("other", id="leased")
    assert store.jobs.fail(store.jobs.claim(["other"], owner="w").lease, "x")  # type: ignore[union-attr]
    store.jobs.claim(["other"], owner="w", lease_seconds=3600)
    assert store.jobs.complete(claim_one(store).lease)
    clock.advance(1)
    assert store.jobs.fail(claim_one(store).lease, "x")
    clock.advance(1)
    assert store.jobs.cancel("s2-cancelled") is True
    for job_id in ("s0-done", "s1-dead", "s2-cancelled", "pending", "leased"):
        _checkpoint(store, job_id, "node")
    states = {j: store.jobs.get(j).state for j in ("pending", "failed", "leased")}  # type: ignore[union-attr]
    assert sorted(states.values()) == ["failed", "leased", "pending"]

    clock.advance(100)
    # the horizon is strict: updated_at < horizon
    assert store.jobs.sweep(settled_before=at(0)) == 0
    # oldest first, bounded by the limit
    assert store.jobs.sweep(settled_before=at(2), limit=1) == 1
    assert store.jobs.get("s0-done") is None
    assert store.jobs.get("s1-dead") is not None
    assert "s0-done" not in _checkpoint_runs(backend)
    assert store.jobs.sweep(settled_before=at(2)) == 1
    assert store.jobs.get("s1-dead") is None
    assert store.jobs.get("s2-cancelled") is not None
    assert store.jobs.sweep(settled_before=at(100)) == 1
    assert store.jobs.sweep(settled_before=at(100)) == 0
    # unsettled jobs and their checkpoints stay
    assert _checkpoint_runs(backend) == ["leased", "pending"]
    counts = store.jobs.counts()
    assert (counts.pending, counts.failed, counts.leased) == (1, 1, 1)
    assert (counts.done, counts.dead, counts.cancelled) == (0, 0, 0)


def test_sweep_limit_takes_the_oldest(store: Store, clock: FakeClock) -> None:
    for index in range(5):
        store.jobs.enqueue("k", id=f"j{index}")
    # settle in reverse id order, one second apart: age order differs from id order
    for job_id in ("j4", "j3", "j2", "j1", "j0"):
        assert store.jobs.cancel(job_id) is True
        clock.advance(1)
    assert store.jobs.sweep(settled_before=at(60), limit=2) == 2
    assert store.jobs.get("j4") is None
    assert store.jobs.get("j3") is None
    assert store.jobs.get("j2") is not None
    assert store.jobs.sweep(settled_before=at(60)) == 3
    assert store.jobs.sweep(settled_before=at(60)) == 0


# ----------------------------------------------------------------- signals and deadlines


def _refusing_calls(store: Store, job_id: str) -> list[tuple[str, object]]:
    return [
        ("cancel", lambda **kw: store.jobs.cancel(job_id, **kw)),
        ("requeue", lambda **kw: store.jobs.requeue(job_id, **kw)),
        ("sweep", lambda **kw: store.jobs.sweep(settled_before=at(10_000), **kw)),
    ]


@pytest.mark.parametrize("call", ["cancel", "requeue", "sweep"])
def test_aborted_signal_refuses(store: Store, backend: Harness, call: str) -> None:
    store.jobs.enqueue("q", id="queued")
    store.jobs.enqueue("f", id="failed")
    store.jobs.enqueue("d", id="done")
    assert store.jobs.fail(claim_one(store, "f").lease, "x")
    assert store.jobs.complete(claim_one(store, "d").lease)
    job_id = "failed" if call == "requeue" else "queued"
    before = [backend.raw_row(j) for j in ("queued", "failed", "done")]
    scope = CancelScope()
    scope.abort("shutting down")
    fn = dict(_refusing_calls(store, job_id))[call]
    with pytest.raises(OperationCancelled) as info:
        fn(signal=scope.signal)  # type: ignore[operator]
    assert info.value.code == "JD2081"
    assert "shutting down" in str(info.value)
    assert [backend.raw_row(j) for j in ("queued", "failed", "done")] == before
    # a live signal lets the call through
    assert fn(signal=CancelScope().signal)  # type: ignore[operator]


@pytest.mark.parametrize("call", ["cancel", "requeue", "sweep"])
def test_passed_deadline_refuses(
    store: Store, clock: FakeClock, backend: Harness, call: str
) -> None:
    store.jobs.enqueue("q", id="queued")
    store.jobs.enqueue("f", id="failed")
    store.jobs.enqueue("d", id="done")
    assert store.jobs.fail(claim_one(store, "f").lease, "x")
    assert store.jobs.complete(claim_one(store, "d").lease)
    job_id = "failed" if call == "requeue" else "queued"
    clock.advance(5)
    before = [backend.raw_row(j) for j in ("queued", "failed", "done")]
    fn = dict(_refusing_calls(store, job_id))[call]
    for deadline in (at(5), at(4)):  # at the deadline counts as passed
        with pytest.raises(OperationCancelled) as info:
            fn(deadline=deadline)  # type: ignore[operator]
        assert info.value.code == "JD2081"
    assert [backend.raw_row(j) for j in ("queued", "failed", "done")] == before
    assert fn(deadline=at(6))  # type: ignore[operator]


# ----------------------------------------------------------------- records


def test_job_to_dict(store: Store, clock: FakeClock) -> None:
    clock.advance(0.1234)
    store.jobs.enqueue("k", {"a": [1]}, id="j", priority=2, max_attempts=3)
    claimed = claim_one(store, lease_seconds=1.5)
    data = claimed.to_dict()
    assert data == {
        "queue": "default",
        "unique_key": None,
        "cancel_requested": False,
        "id": "j",
        "kind": "k",
        "payload": {"a": [1]},
        "state": "leased",
        "priority": 2,
        "attempts": 1,
        "max_attempts": 3,
        "run_at": "2027-01-15T08:00:00.123+00:00",
        "lease_until": "2027-01-15T08:00:01.623+00:00",
        "lease_owner": "w1",
        "lease_generation": 1,
        "last_error": None,
        "result": None,
        "created_at": "2027-01-15T08:00:00.123+00:00",
        "updated_at": "2027-01-15T08:00:00.123+00:00",
    }
    text = json.dumps(data)
    assert claimed.lease.token not in text
    assert "token" not in text
    job = store.jobs.get("j")
    assert job is not None
    assert job.to_dict() == data
    assert claimed.lease.token not in json.dumps(job.to_dict())


def test_job_to_dict_times_are_utc_with_milliseconds(store: Store, clock: FakeClock) -> None:
    clock.set(START + 0.5)  # whole milliseconds still print three digits
    job = store.jobs.enqueue("k", id="j", run_at=at(3600))
    data = job.to_dict()
    assert data["created_at"] == "2027-01-15T08:00:00.500+00:00"
    assert data["run_at"] == "2027-01-15T09:00:00.000+00:00"
    assert data["lease_until"] is None
    for key in ("created_at", "updated_at", "run_at"):
        parsed = datetime.fromisoformat(data[key])
        assert parsed.utcoffset() == timedelta(0)


def test_lease_repr_never_shows_the_token(store: Store) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = claim_one(store)
    token = claimed.lease.token
    renewed = store.jobs.renew(claimed.lease)
    for text in (
        repr(claimed.lease),
        str(claimed.lease),
        repr(renewed),
        repr(claimed),
        str(claimed),
        f"{claimed.lease!r}",
    ):
        assert token not in text
        assert renewed.token not in text
    assert "job_id='j'" in repr(claimed.lease)
    assert "generation=1" in repr(claimed.lease)


def test_refusal_messages_never_show_the_token(store: Store, clock: FakeClock) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = claim_one(store, lease_seconds=1)
    clock.advance(1)
    with pytest.raises(LeaseExpired) as info:
        store.jobs.complete(claimed.lease)
    assert claimed.lease.token not in str(info.value)
    assert claimed.lease.token not in repr(dict(info.value.details))
