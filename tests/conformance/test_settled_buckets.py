"""``settled_buckets()``: the jobs each settled state gained per bucket of a window.

Counted by each job's last change (its settlement), oldest bucket first, at
most ``limit`` per state read the most recent first (``truncated`` says which
states reached it); nothing outside the window, nothing unsettled.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from jaren_jobs import SettledBuckets, Store
from tests.conftest import FakeClock


def at(clock: FakeClock) -> datetime:
    return datetime.fromtimestamp(clock.now(), tz=timezone.utc)


def settle(store: Store, job_id: str, how: str) -> None:
    store.jobs.enqueue("k", id=job_id, max_attempts=1)
    if how == "cancelled":
        assert store.jobs.cancel(job_id) is True
        return
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    assert claimed.id == job_id
    if how == "done":
        assert store.jobs.complete(claimed.lease) is True
    else:
        assert store.jobs.fail(claimed.lease, "boom") is True  # one attempt: dead


def test_each_settlement_lands_in_the_bucket_of_its_instant(store: Store, clock: FakeClock) -> None:
    since = at(clock)
    settle(store, "before", "done")  # at since: the first bucket
    clock.advance(65)  # bucket 1 of 60 s buckets
    settle(store, "d1", "done")
    settle(store, "x1", "dead")
    clock.advance(60)  # bucket 2
    settle(store, "d2", "done")
    settle(store, "c2", "cancelled")
    store.jobs.enqueue("other", id="queued")  # not settled: never counted
    clock.advance(600)
    settle(store, "outside", "done")  # past the window's end
    got = store.jobs.settled_buckets(since=since, bucket_seconds=60, buckets=3)
    assert isinstance(got, SettledBuckets)
    assert (got.done, got.dead, got.cancelled) == ((1, 1, 1), (0, 1, 0), (0, 0, 1))
    assert (got.since, got.bucket_seconds, got.truncated) == (since, 60.0, frozenset())
    assert got.to_dict() == {
        "since": since.isoformat(),
        "bucket_seconds": 60.0,
        "done": [1, 1, 1],
        "dead": [0, 1, 0],
        "cancelled": [0, 0, 1],
        "truncated": [],
    }
    # a window that starts later leaves the earlier settlements out
    later = store.jobs.settled_buckets(
        since=since + timedelta(seconds=60), bucket_seconds=60, buckets=2
    )
    assert (later.done, later.dead) == ((1, 1), (1, 0))


def test_a_requeued_job_is_no_longer_counted(store: Store, clock: FakeClock) -> None:
    since = at(clock)
    settle(store, "x", "dead")
    assert store.jobs.settled_buckets(since=since, bucket_seconds=10, buckets=1).dead == (1,)
    assert store.jobs.requeue("x") is True
    assert store.jobs.settled_buckets(since=since, bucket_seconds=10, buckets=1).dead == (0,)


def test_the_limit_reads_the_most_recent_and_says_truncated(store: Store, clock: FakeClock) -> None:
    since = at(clock)
    for n in range(5):
        settle(store, f"d{n}", "done")
        clock.advance(10)  # one per 10 s bucket
    settle(store, "x", "dead")
    got = store.jobs.settled_buckets(since=since, bucket_seconds=10, buckets=6, limit=3)
    # the three most recent done jobs, the two oldest left out
    assert got.done == (0, 0, 1, 1, 1, 0)
    assert got.dead == (0, 0, 0, 0, 0, 1)
    assert got.truncated == frozenset({"done"})


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"since": datetime(2030, 1, 1)}, ValueError, "since"),  # naive
        ({"since": "2030-01-01"}, TypeError, "since"),
        ({"bucket_seconds": 0}, ValueError, "bucket_seconds"),
        ({"bucket_seconds": float("nan")}, ValueError, "bucket_seconds"),
        ({"buckets": 0}, ValueError, "buckets"),
        ({"buckets": 10_001}, ValueError, "buckets"),
        ({"buckets": 2.0}, TypeError, "buckets"),
        ({"limit": 0}, ValueError, "limit"),
        ({"limit": True}, TypeError, "limit"),
    ],
)
def test_bad_arguments_are_refused(
    store: Store, clock: FakeClock, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    call: dict[str, Any] = {"since": at(clock), "bucket_seconds": 60, "buckets": 12}
    with pytest.raises(error, match=match):
        store.jobs.settled_buckets(**{**call, **options})
