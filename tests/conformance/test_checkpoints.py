"""Per-attempt checkpoints (SPEC §6): generation-stamped, fenced, pruned with the completion."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import Any

import pytest

from jaren_jobs import (
    CheckpointStore,
    ClaimedJob,
    JobSettled,
    LeaseExpired,
    LeaseLost,
    LeaseRequired,
    LeaseSuperseded,
    StorageError,
    Store,
)
from tests.conftest import FakeClock
from tests.harness import CHECKPOINTS, Harness, app_sql_for

LEASE = 10.0


def claim(store: Store, kind: str = "dag") -> ClaimedJob:
    claimed = store.jobs.claim([kind], owner="worker-1", lease_seconds=LEASE)
    assert claimed is not None
    return claimed


def stored(backend: Harness, run_id: str | None = None) -> dict[tuple[str, str], tuple[Any, int]]:
    """The checkpoint rows as committed, read on a connection of their own."""
    found = backend.checkpoint_rows()
    return {
        (run, node): (json.loads(value), generation)
        for run, node, value, generation in found
        if run_id is None or run == run_id
    }


def job_state(store: Store, job_id: str) -> str:
    job = store.jobs.get(job_id)
    assert job is not None
    return job.state


@pytest.fixture
def job_id(store: Store) -> str:
    return store.jobs.enqueue("dag", {"input": 1}, id="run-1").id


def test_load_is_none_when_nothing_is_recorded(store: Store, job_id: str) -> None:
    checkpoints = store.jobs.checkpoints_for(claim(store))
    assert isinstance(checkpoints, CheckpointStore)
    assert checkpoints.load(job_id) is None


def test_rows_are_stamped_with_the_attempts_generation(
    store: Store, job_id: str, backend: Harness
) -> None:
    claimed = claim(store)
    assert claimed.lease.generation == 1
    checkpoints = store.jobs.checkpoints_for(claimed)
    checkpoints.save(job_id, "fetch", {"body": "é"})
    checkpoints.save(job_id, "parse", [1, 2, 3])
    checkpoints.save(job_id, "parse", [4])  # a node saved again keeps its last value
    assert stored(backend) == {
        (job_id, "fetch"): ({"body": "é"}, 1),
        (job_id, "parse"): ([4], 1),
    }
    assert checkpoints.load(job_id) == {"fetch": {"body": "é"}, "parse": [4]}


def test_a_superseded_attempt_can_neither_save_nor_complete(
    store: Store, job_id: str, clock: FakeClock, backend: Harness
) -> None:
    first = store.jobs.checkpoints_for(claim(store))
    first.save(job_id, "a", 1)
    clock.advance(LEASE)
    second_claim = claim(store)
    assert second_claim.lease.generation == 2
    second = store.jobs.checkpoints_for(second_claim)
    second.save(job_id, "b", 2)
    before = stored(backend)

    with pytest.raises(LeaseSuperseded) as saving:
        first.save(job_id, "a", "stale")
    assert saving.value.code == "JD2066"
    with pytest.raises(LeaseSuperseded):
        first.complete(job_id, "stale result")

    # a stale complete pruned nothing, settled nothing
    assert stored(backend) == before == {(job_id, "a"): (1, 1), (job_id, "b"): (2, 2)}
    assert job_state(store, job_id) == "leased"
    assert second.complete(job_id, "fresh result") is True
    job = store.jobs.get(job_id)
    assert job is not None
    assert (job.state, job.result) == ("done", "fresh result")
    assert stored(backend) == {}


def test_an_expired_attempt_can_neither_save_nor_complete(
    store: Store, job_id: str, clock: FakeClock, backend: Harness
) -> None:
    checkpoints = store.jobs.checkpoints_for(claim(store))
    checkpoints.save(job_id, "a", 1)
    clock.advance(LEASE)  # lease_until == now: expired
    with pytest.raises(LeaseExpired) as saving:
        checkpoints.save(job_id, "b", 2)
    assert saving.value.code == "JD2067"
    with pytest.raises(LeaseExpired):
        checkpoints.complete(job_id, "late")
    assert stored(backend) == {(job_id, "a"): (1, 1)}
    assert job_state(store, job_id) == "leased"


def test_a_settled_job_takes_no_more_checkpoints(store: Store, job_id: str) -> None:
    claimed = claim(store)
    checkpoints = store.jobs.checkpoints_for(claimed)
    store.jobs.cancel(job_id, lease=claimed.lease)
    with pytest.raises(JobSettled):
        checkpoints.save(job_id, "a", 1)


def test_a_reclaimed_attempt_loads_its_predecessors_values(
    store: Store, job_id: str, clock: FakeClock
) -> None:
    first = store.jobs.checkpoints_for(claim(store))
    first.save(job_id, "a", 1)
    first.save(job_id, "b", 2)
    clock.advance(LEASE)
    second = store.jobs.checkpoints_for(claim(store))
    assert second.load(job_id) == {"a": 1, "b": 2}
    second.save(job_id, "b", 3)
    second.save(job_id, "c", 4)
    clock.advance(LEASE)
    third = store.jobs.checkpoints_for(claim(store))
    assert third.generation == 3
    assert third.load(job_id) == {"a": 1, "b": 3, "c": 4}
    # load sees generations up to its own: the first attempt cannot read
    # what a later one wrote
    assert first.load(job_id) == {"a": 1}


def test_a_retry_after_a_failure_resumes_from_the_failed_attempts_values(
    store: Store, job_id: str, clock: FakeClock
) -> None:
    claimed = claim(store)
    first = store.jobs.checkpoints_for(claimed)
    first.save(job_id, "a", 1)
    store.jobs.fail(claimed.lease, RuntimeError("flaky"))
    # a repeated settlement from the same attempt answers True, but must
    # not prune what the retry resumes from
    assert first.complete(job_id, "too late") is True
    assert job_state(store, job_id) == "failed"
    clock.advance(3600)
    retry = store.jobs.checkpoints_for(claim(store))
    assert retry.load(job_id) == {"a": 1}


def test_an_attempt_from_before_a_sweep_is_not_the_new_lifes_attempt(
    store: Store, job_id: str, clock: FakeClock, backend: Harness
) -> None:
    old = store.jobs.checkpoints_for(claim(store))
    old.save(job_id, "a", "old life")
    assert old.complete(job_id, "old result") is True
    clock.advance(1)
    horizon = datetime.fromtimestamp(clock.now(), timezone.utc)
    assert store.jobs.sweep(settled_before=horizon) == 1
    store.jobs.enqueue("dag", {"input": 2}, id=job_id)
    claimed = claim(store)
    new = store.jobs.checkpoints_for(claimed)
    assert new.generation == old.generation  # the generation starts again
    new.save(job_id, "a", "new life")
    store.jobs.fail(claimed.lease, RuntimeError("flaky"))
    before = stored(backend)

    # the old attempt settled the old life only: no True for this one
    with pytest.raises(JobSettled):
        old.complete(job_id, "stale")
    with pytest.raises(JobSettled):
        old.save(job_id, "b", "stale")
    assert stored(backend) == before == {(job_id, "a"): ("new life", 1)}
    assert job_state(store, job_id) == "failed"
    assert new.complete(job_id, "again") is True  # the new life's own attempt: idempotent
    assert stored(backend) == before


def test_a_completed_run_prunes_its_rows_up_to_its_generation_only(
    store: Store, job_id: str, clock: FakeClock, backend: Harness
) -> None:
    other = store.jobs.enqueue("other", None, id="run-2").id
    other_checkpoints = store.jobs.checkpoints_for(claim(store, "other"))
    other_checkpoints.save(other, "x", "kept")

    first = store.jobs.checkpoints_for(claim(store))
    first.save(job_id, "a", 1)
    clock.advance(LEASE)
    second = store.jobs.checkpoints_for(claim(store))
    second.save(job_id, "b", 2)
    # a row of a later generation (written directly: no live attempt can
    # hold one) is beyond this completion's reach
    with store.transaction() as tx:
        tx.execute(
            app_sql_for(
                store,
                'INSERT INTO "_jaren_job_checkpoints" (run_id, node_id, value, generation) '
                "VALUES (?, 'later', '\"newer\"', 3)",
            ),
            (job_id,),
        )
    assert second.complete(job_id, {"out": 2}) is True
    assert stored(backend) == {(job_id, "later"): ("newer", 3), (other, "x"): ("kept", 1)}
    # completing twice from the same attempt is idempotent
    assert second.complete(job_id, {"out": 2}) is True
    with pytest.raises(JobSettled):
        second.save(job_id, "c", 3)


def test_a_failure_inside_complete_leaves_the_job_leased_and_the_checkpoints_intact(
    store: Store, job_id: str, backend: Harness
) -> None:
    claimed = claim(store)
    checkpoints = store.jobs.checkpoints_for(claimed)
    checkpoints.save(job_id, "a", 1)
    checkpoints.save(job_id, "b", 2)
    # make the prune fail after the completion statement has run
    with backend.refusing(store, "DELETE", CHECKPOINTS, "prune refused"):
        with pytest.raises(StorageError, match="prune refused") as caught:
            checkpoints.complete(job_id, "result")
        assert isinstance(caught.value.__cause__, backend.driver_error)

        job = store.jobs.get(job_id)
        assert job is not None
        assert job.state == "leased"
        assert job.result is None
        assert job.lease_generation == claimed.lease.generation
        assert stored(backend) == {(job_id, "a"): (1, 1), (job_id, "b"): (2, 1)}
        assert checkpoints.load(job_id) == {"a": 1, "b": 2}

    assert checkpoints.complete(job_id, "result") is True
    assert job_state(store, job_id) == "done"
    assert stored(backend) == {}


def test_a_value_json_cannot_carry_is_refused_before_any_write(
    store: Store, job_id: str, backend: Harness, clock: FakeClock
) -> None:
    claimed = claim(store)
    checkpoints = store.jobs.checkpoints_for(claimed)
    for bad in ({1, 2}, b"bytes", object(), {1: "int key"}):
        with pytest.raises(TypeError):
            checkpoints.save(job_id, "a", bad)
    for bad in (math.nan, math.inf, [-math.inf]):
        with pytest.raises(ValueError):
            checkpoints.save(job_id, "a", bad)
    assert stored(backend) == {}
    with pytest.raises(TypeError):
        checkpoints.complete(job_id, {"when": object()})
    with pytest.raises(TypeError):
        checkpoints.complete(job_id, math.nan)
    assert job_state(store, job_id) == "leased"
    # refused before the fence is even read: a stale attempt gets the same answer
    clock.advance(LEASE)
    with pytest.raises(TypeError):
        checkpoints.save(job_id, "a", {1, 2})


def test_checkpoints_bind_to_one_run_and_take_a_claimed_job(store: Store, job_id: str) -> None:
    checkpoints = store.jobs.checkpoints_for(claim(store))
    assert checkpoints.job_id == job_id
    with pytest.raises(ValueError):
        checkpoints.load("run-2")
    with pytest.raises(ValueError):
        checkpoints.save("run-2", "a", 1)
    with pytest.raises(TypeError):
        checkpoints.save(7, "a", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        checkpoints.save(job_id, 7, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        checkpoints.save(job_id, "", 1)
    job = store.jobs.get(job_id)
    with pytest.raises(LeaseRequired):
        store.jobs.checkpoints_for(job)  # type: ignore[arg-type]


def test_checkpoints_inside_a_transaction_commit_or_roll_back_with_it(
    store: Store, job_id: str, backend: Harness
) -> None:
    claimed = claim(store)

    def save_then_fail() -> None:
        with store.transaction() as tx:
            tx.jobs.checkpoints_for(claimed).save(job_id, "a", 1)
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        save_then_fail()
    assert stored(backend) == {}
    with store.transaction() as tx:
        inside = tx.jobs.checkpoints_for(claimed)
        inside.save(job_id, "a", 1)
        assert inside.load(job_id) == {"a": 1}
    assert stored(backend) == {(job_id, "a"): (1, 1)}


def test_the_refusals_are_lease_lost(store: Store, job_id: str, clock: FakeClock) -> None:
    checkpoints = store.jobs.checkpoints_for(claim(store))
    clock.advance(LEASE)
    with pytest.raises(LeaseLost):
        checkpoints.save(job_id, "a", 1)
