"""SPEC §13: ``requeue(id, reset_attempts=True)`` (fresh attempts, a fence that still holds),
and ``Job.state`` as a ``JobState``."""

from __future__ import annotations

import json

import pytest

from jaren_jobs import ClaimedJob, JobState, LeaseSuperseded, Store
from tests.conftest import FakeClock
from tests.harness import Harness

# past any backoff the default base/cap can draw, so a failed job is claimable again
PAST_BACKOFF = 3600.0


def claim_one(store: Store) -> ClaimedJob:
    claimed = store.jobs.claim(["k"], owner="w1", lease_seconds=30)
    assert claimed is not None
    return claimed


def run_until_dead(store: Store, clock: FakeClock, job_id: str) -> list[ClaimedJob]:
    """Claim and fail the job until it dead-letters; the claims, in order."""
    claims: list[ClaimedJob] = []
    while True:
        job = store.jobs.get(job_id)
        assert job is not None
        if job.state == "dead":
            return claims
        clock.advance(PAST_BACKOFF)
        claimed = claim_one(store)
        assert claimed.id == job_id
        claims.append(claimed)
        assert store.jobs.fail(claimed.lease, "boom") is True


def test_reset_gives_a_dead_job_its_full_attempts_again(store: Store, clock: FakeClock) -> None:
    store.jobs.enqueue("k", id="j", max_attempts=2)
    first = run_until_dead(store, clock, "j")
    assert len(first) == 2
    assert store.jobs.requeue("j", reset_attempts=True) is True
    job = store.jobs.get("j")
    assert job is not None
    assert (job.state, job.attempts, job.max_attempts) == ("pending", 0, 2)
    assert job.last_error == "boom"  # only the count starts over
    again = run_until_dead(store, clock, "j")
    assert [c.attempts for c in again] == [1, 2]  # two more tries, not one
    # the generation never went back: each claim is newer than every earlier one
    generations = [c.lease.generation for c in first + again]
    assert generations == [1, 2, 3, 4]


def test_without_reset_a_dead_job_gets_one_more_try(store: Store, clock: FakeClock) -> None:
    store.jobs.enqueue("k", id="j", max_attempts=2)
    assert len(run_until_dead(store, clock, "j")) == 2
    assert store.jobs.requeue("j") is True
    job = store.jobs.get("j")
    assert job is not None
    assert job.attempts == 2
    again = run_until_dead(store, clock, "j")
    assert [c.attempts for c in again] == [3]


def test_an_old_lease_is_refused_after_a_reset(
    store: Store, clock: FakeClock, backend: Harness
) -> None:
    store.jobs.enqueue("k", id="j", max_attempts=3)
    stale = claim_one(store)
    clock.advance(30)  # the lease runs out; the job is requeued under the holder
    assert store.jobs.requeue("j", reset_attempts=True) is True
    fresh = claim_one(store)
    assert fresh.attempts == 1  # attempts started over ...
    assert fresh.lease.generation == stale.lease.generation + 1  # ... the generation did not
    row = backend.raw_row("j")
    for settle in (
        lambda: store.jobs.complete(stale.lease, "late"),
        lambda: store.jobs.fail(stale.lease, "late"),
        lambda: store.jobs.renew(stale.lease),
    ):
        # refused by name: another attempt, of a newer generation, holds the job
        with pytest.raises(LeaseSuperseded) as info:
            settle()
        assert info.value.code == "JD2066"
    assert backend.raw_row("j") == row  # the refusals wrote nothing
    assert store.jobs.complete(fresh.lease, "r") is True
    job = store.jobs.get("j")
    assert job is not None
    assert (job.state, job.result, job.attempts) == ("done", "r", 1)


def test_reset_on_a_failed_job_and_on_a_pending_one(store: Store, clock: FakeClock) -> None:
    store.jobs.enqueue("k", id="j", max_attempts=3)
    clock.advance(PAST_BACKOFF)
    assert store.jobs.fail(claim_one(store).lease, "boom") is True
    clock.advance(PAST_BACKOFF)
    assert store.jobs.requeue("j", reset_attempts=True) is True  # failed -> pending, count reset
    assert store.jobs.get("j").attempts == 0  # type: ignore[union-attr]
    assert claim_one(store).attempts == 1
    store.jobs.enqueue("k", id="p", max_attempts=3)
    assert store.jobs.requeue("p", reset_attempts=True) is False  # already pending


@pytest.mark.parametrize("bad", [1, 0, "yes", None])
def test_reset_attempts_must_be_a_bool(store: Store, backend: Harness, bad: object) -> None:
    store.jobs.enqueue("k", id="j", max_attempts=1)
    assert store.jobs.fail(claim_one(store).lease, "boom") is True
    row = backend.raw_row("j")
    with pytest.raises(TypeError, match="reset_attempts must be a bool"):
        store.jobs.requeue("j", reset_attempts=bad)  # type: ignore[arg-type]
    assert backend.raw_row("j") == row


# ----------------------------------------------------------------- Job.state is a JobState


def test_every_read_gives_a_job_state_member_equal_to_its_string(
    store: Store, clock: FakeClock
) -> None:
    enqueued = store.jobs.enqueue("k", id="j", max_attempts=1)
    claimed = claim_one(store)
    assert store.jobs.fail(claimed.lease, "boom") is True
    read = store.jobs.get("j")
    assert read is not None
    with store.jobs.page(state="dead") as cursor:
        paged = list(cursor)
    states = [enqueued.state, claimed.state, read.state, paged[0].state]
    assert states == [JobState.PENDING, JobState.LEASED, JobState.DEAD, JobState.DEAD]
    assert all(type(s) is JobState for s in states)
    # and each still is its plain string, for code written before the enum
    assert states == ["pending", "leased", "dead", "dead"]
    assert {read.state: 1}.get("dead") == 1
    assert read.state in {"done", "dead", "cancelled"}
    assert "state='dead'" in repr(read)
    assert f"{read.state}" == "dead"
    shown = read.to_dict()["state"]
    assert (type(shown), shown) == (str, "dead")
    assert json.loads(json.dumps(read.to_dict()))["state"] == "dead"
