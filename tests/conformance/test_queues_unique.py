"""Queues and unique jobs (SPEC §12) on every backend, through the sync and async API."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from jaren_jobs import AsyncStore, DuplicateJob, NewJob, Outcome, Store, drain_page
from tests.conftest import FakeClock
from tests.harness import Harness

WAIT = 10.0


def claim(store: Store, kinds: list[str], **options: Any) -> Any:
    return store.jobs.claim(kinds, owner="w", lease_seconds=30, **options)


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, WAIT * 3))


# ----------------------------------------------------------------- queues


def test_a_job_belongs_to_the_default_queue_unless_told(store: Store, backend: Harness) -> None:
    plain = store.jobs.enqueue("k", id="plain")
    mail = store.jobs.enqueue("k", id="mail", queue="emails")
    assert plain.queue == "default"
    assert plain.unique_key is None
    assert mail.queue == "emails"
    assert store.jobs.get("plain") == plain
    assert store.jobs.get("mail") == mail
    row = backend.raw_row("mail")
    assert row is not None
    assert row["queue"] == "emails"
    assert row["unique_key"] is None
    assert mail.to_dict()["queue"] == "emails"
    batch = store.jobs.enqueue_many(
        [NewJob("k", 1, id="b1", queue="bulk"), NewJob("k", 2, id="b2")]
    )
    assert [job.queue for job in batch] == ["bulk", "default"]
    assert [store.jobs.get(j.id) for j in batch] == batch


@pytest.mark.parametrize(
    ("queue", "error"),
    [
        ("", ValueError),
        ("a\x00b", ValueError),
        (5, TypeError),
        (None, TypeError),
        (b"q", TypeError),
    ],
)
def test_a_bad_queue_is_refused_and_writes_nothing(
    store: Store, backend: Harness, queue: object, error: type[Exception]
) -> None:
    before = backend.snapshot()
    with pytest.raises(error, match="queue"):
        store.jobs.enqueue("k", queue=queue)  # type: ignore[arg-type]
    with pytest.raises(error, match="queue"):
        store.jobs.enqueue_many([NewJob("k"), NewJob("k", queue=queue)])  # type: ignore[arg-type]
    assert backend.snapshot() == before


def test_claims_take_only_the_queues_named_in_claim_order(store: Store, clock: FakeClock) -> None:
    store.jobs.enqueue("k", id="d1")
    store.jobs.enqueue("k", id="a1", queue="a")
    clock.advance(1)
    store.jobs.enqueue("k", id="b1", queue="b", priority=5)
    store.jobs.enqueue("k", id="a2", queue="a", priority=1)
    store.jobs.enqueue("other", id="a3", queue="a", priority=9)
    # the priority order holds across the queues named, and only those
    got = store.jobs.claim_many(["k"], owner="w", limit=10, queues=["a", "b"])
    assert [j.id for j in got] == ["b1", "a2", "a1"]
    assert claim(store, ["k"], queues=("a",)) is None
    assert claim(store, ["k", "other"], queues={"a"}).id == "a3"
    # None: every queue
    assert claim(store, ["k"]).id == "d1"


def test_a_claim_by_queue_rescues_expired_leases_of_those_queues_only(
    store: Store, clock: FakeClock
) -> None:
    store.jobs.enqueue("k", id="a", queue="a")
    store.jobs.enqueue("k", id="b", queue="b")
    assert {j.id for j in store.jobs.claim_many(["k"], owner="w", limit=5, lease_seconds=1)} == {
        "a",
        "b",
    }
    clock.advance(2)
    rescued = store.jobs.claim(["k"], owner="w2", queues=["b"])
    assert rescued is not None
    assert rescued.id == "b"
    assert rescued.attempts == 2
    assert store.jobs.claim(["k"], owner="w2", queues=["b"]) is None
    assert claim(store, ["k"], queues=["a"]).id == "a"


def test_an_empty_claim_of_one_queue_does_not_hide_another(store: Store) -> None:
    # the SQLite idle probe remembers an empty claim: per (kinds, queues)
    assert claim(store, ["k"], queues=["a"]) is None
    store.jobs.enqueue("k", id="b", queue="b")
    assert claim(store, ["k"], queues=["a"]) is None
    assert claim(store, ["k"], queues=["b"]).id == "b"


@pytest.mark.parametrize(
    ("queues", "error", "match"),
    [
        ("emails", TypeError, "bare string"),
        (b"emails", TypeError, "bare string"),
        ([], ValueError, "at least one"),
        ([""], ValueError, "non-empty"),
        (["a", 3], TypeError, "str"),
        (["a\x00"], ValueError, "NUL"),
        (7, TypeError, "iterable"),
    ],
)
def test_bad_queues_are_refused(
    store: Store, backend: Harness, queues: object, error: type[Exception], match: str
) -> None:
    store.jobs.enqueue("k", id="j")
    before = backend.snapshot()
    for call in (
        lambda: store.jobs.claim(["k"], owner="w", queues=queues),  # type: ignore[arg-type]
        lambda: store.jobs.claim_many(["k"], owner="w", limit=2, queues=queues),  # type: ignore[arg-type]
        lambda: store.jobs.create_worker({"k": lambda payload, ctx: None}, queues=queues),  # type: ignore[arg-type]
    ):
        with pytest.raises(error, match=match):
            call()
    assert backend.snapshot() == before


def test_a_worker_runs_only_its_queues(store: Store) -> None:
    ran: list[str] = []
    store.jobs.enqueue("k", id="mail", queue="emails")
    store.jobs.enqueue("k", id="bulk", queue="bulk")
    worker = store.jobs.create_worker(
        {"k": lambda payload, ctx: ran.append(ctx.job.id)}, queues=["emails"]
    )
    assert worker.queues == ("emails",)
    assert worker.run_once() is True
    assert worker.run_once() is False
    assert ran == ["mail"]
    assert store.jobs.get("bulk").state == "pending"  # type: ignore[union-attr]
    everyone = store.jobs.create_worker({"k": lambda payload, ctx: ran.append(ctx.job.id)})
    assert everyone.run_once() is True
    assert ran == ["mail", "bulk"]


def test_a_started_worker_drains_its_queue_and_leaves_the_rest(store: Store) -> None:
    store.jobs.enqueue_many([NewJob("k", n, queue="q1") for n in range(20)])
    store.jobs.enqueue_many([NewJob("k", n, queue="q2") for n in range(5)])
    done = threading.Event()
    seen: list[str] = []

    def observe(outcome: Outcome) -> None:
        seen.append(outcome.job_id)
        if len(seen) == 20:
            done.set()

    worker = store.jobs.create_worker(
        {"k": lambda payload, ctx: None}, queues=["q1"], concurrency=2, on_outcome=observe
    )
    worker.start()
    try:
        assert done.wait(WAIT)
    finally:
        assert worker.stop(5).drained
    assert store.jobs.counts(queue="q1").done == 20
    assert store.jobs.counts(queue="q2").pending == 5
    assert {store.jobs.get(i).queue for i in seen} == {"q1"}  # type: ignore[union-attr]


def test_page_filters_by_queue(store: Store) -> None:
    store.jobs.enqueue("k", id="a1", queue="a")
    store.jobs.enqueue("j", id="a2", queue="a")
    store.jobs.enqueue("k", id="b1", queue="b")
    store.jobs.enqueue("k", id="d1")
    assert [j.id for j in store.jobs.page(queue="a")] == ["a1", "a2"]
    assert [j.id for j in store.jobs.page(queue="a", kind="k")] == ["a1"]
    assert [j.id for j in store.jobs.page(queue="default", state="pending")] == ["d1"]
    assert [j.id for j in store.jobs.page(queue="nowhere")] == []
    assert len(list(store.jobs.page())) == 4
    page = drain_page(store.jobs.page(queue="a"), limit=1)
    assert [j.id for j in page.items] == ["a1"]
    assert page.has_more
    with pytest.raises(ValueError, match="queue"):
        store.jobs.page(queue="")
    with pytest.raises(TypeError, match="queue"):
        store.jobs.page(queue=3)  # type: ignore[arg-type]


def test_counts_of_one_queue_keep_the_counts_shape(store: Store) -> None:
    store.jobs.enqueue("k", id="a1", queue="a")
    store.jobs.enqueue("j", id="a2", queue="a")
    store.jobs.enqueue("k", id="b1", queue="b")
    got = claim(store, ["k"], queues=["a"])
    store.jobs.complete(got.lease)
    a = store.jobs.counts(queue="a")
    assert (a.pending, a.done, a.leased) == (1, 1, 0)
    assert dict(a.pending_kinds) == {"j": 1}
    b = store.jobs.counts(queue="b")
    assert (b.pending, b.done) == (1, 0)
    assert dict(b.pending_kinds) == {"k": 1}
    whole = store.jobs.counts()
    assert (whole.pending, whole.done) == (2, 1)
    assert store.jobs.counts(queue="nowhere").to_dict() == {
        "pending": 0,
        "leased": 0,
        "done": 0,
        "failed": 0,
        "dead": 0,
        "cancelled": 0,
        "pending_kinds": {},
    }
    with pytest.raises(ValueError, match="queue"):
        store.jobs.counts(queue="")
    with pytest.raises(TypeError, match="queue"):
        store.jobs.counts(queue=["a"])  # type: ignore[arg-type]


# ----------------------------------------------------------------- unique jobs


def test_a_held_unique_key_writes_nothing_and_answers_the_holder(
    store: Store, backend: Harness, clock: FakeClock
) -> None:
    first = store.jobs.enqueue("report", {"day": 1}, unique_key="report:1")
    assert first.unique_key == "report:1"
    clock.advance(1)
    before = backend.snapshot()
    again = store.jobs.enqueue("report", {"day": 2}, unique_key="report:1", priority=3)
    assert again == first == store.jobs.get(first.id)
    # another kind or queue: the key is one namespace for the whole store
    other = store.jobs.enqueue("other", unique_key="report:1", queue="elsewhere")
    assert other == first
    assert backend.snapshot() == before
    # a key no job holds, and no key at all, enqueue as always
    assert store.jobs.enqueue("report", unique_key="report:2").id != first.id
    assert store.jobs.enqueue("report").unique_key is None


def test_the_key_is_held_while_pending_failed_or_leased_and_freed_after(
    store: Store, clock: FakeClock
) -> None:
    def holder() -> str:
        return store.jobs.enqueue("k", unique_key="u").id

    first = holder()
    claimed = claim(store, ["k"])
    assert claimed.id == first
    assert holder() == first
    store.jobs.fail(claimed.lease, "boom")
    assert store.jobs.get(first).state == "failed"  # type: ignore[union-attr]
    assert holder() == first  # failed, awaiting a retry
    clock.advance(3600)
    claimed = claim(store, ["k"])
    store.jobs.complete(claimed.lease)
    second = holder()  # done: the key is free
    assert second != first
    assert store.jobs.cancel(second) is True
    third = holder()  # cancelled: free
    assert third not in (first, second)
    claimed = claim(store, ["k"])
    store.jobs.fail(claimed.lease, "fatal", retry=False)
    assert store.jobs.get(third).state == "dead"  # type: ignore[union-attr]
    fourth = holder()  # dead: free
    assert fourth not in (first, second, third)
    assert holder() == fourth


def test_an_expired_lease_still_holds_the_key(store: Store, clock: FakeClock) -> None:
    first = store.jobs.enqueue("k", unique_key="u")
    claim(store, ["k"])
    clock.advance(60)  # the lease expired, but no claim moved the row yet
    assert store.jobs.enqueue("k", unique_key="u") == store.jobs.get(first.id)


def test_a_taken_id_is_still_duplicate_job(store: Store, backend: Harness) -> None:
    store.jobs.enqueue("k", id="j", unique_key="u")
    store.jobs.enqueue("k", id="other")
    before = backend.snapshot()
    for key in ("u", "v", None):
        with pytest.raises(DuplicateJob) as info:
            store.jobs.enqueue("k", id="j", unique_key=key)
        assert info.value.details["job_id"] == "j"
    with pytest.raises(DuplicateJob):
        store.jobs.enqueue("k", id="other", unique_key="u")
    assert backend.snapshot() == before
    # a fresh id whose key is held: the holder, not an error
    assert store.jobs.enqueue("k", id="fresh", unique_key="u").id == "j"
    assert store.jobs.get("fresh") is None


@pytest.mark.parametrize(
    ("key", "error"), [("", ValueError), ("a\x00", ValueError), (3, TypeError), (b"k", TypeError)]
)
def test_a_bad_unique_key_is_refused(
    store: Store, backend: Harness, key: object, error: type[Exception]
) -> None:
    before = backend.snapshot()
    with pytest.raises(error, match="unique_key"):
        store.jobs.enqueue("k", unique_key=key)  # type: ignore[arg-type]
    with pytest.raises(error, match="unique_key"):
        store.jobs.enqueue_many([NewJob("k", unique_key=key)])  # type: ignore[arg-type]
    assert backend.snapshot() == before


def test_enqueue_many_deduplicates_each_item_on_its_own(store: Store, backend: Harness) -> None:
    held = store.jobs.enqueue("k", id="held", unique_key="u1")
    jobs = store.jobs.enqueue_many(
        [
            NewJob("k", 0, unique_key="u1"),  # held by an older job
            NewJob("k", 1, unique_key="u2"),
            NewJob("k", 2),
            NewJob("k", 3, unique_key="u2"),  # a duplicate within the batch: the first wins
            NewJob("k", 4, unique_key="u3", queue="q"),
        ]
    )
    assert jobs[0] == held
    assert jobs[1].payload == 1
    assert jobs[3] == jobs[1]
    assert jobs[2].unique_key is None
    assert jobs[4].queue == "q"
    assert jobs[4].unique_key == "u3"
    assert [store.jobs.get(j.id) for j in jobs] == jobs
    assert len(backend.job_ids()) == 4  # held, u2, the keyless one, u3


def test_enqueue_many_with_keys_still_fails_whole_on_a_taken_id(
    store: Store, backend: Harness
) -> None:
    store.jobs.enqueue("k", id="taken")
    store.jobs.enqueue("k", id="held", unique_key="u")
    before = backend.snapshot()
    with pytest.raises(DuplicateJob) as info:
        store.jobs.enqueue_many(
            [NewJob("k", unique_key="u"), NewJob("k", unique_key="new"), NewJob("k", id="taken")]
        )
    assert info.value.details["job_id"] == "taken"
    assert backend.snapshot() == before


def test_a_large_batch_of_keys_deduplicates_as_one_by_one(store: Store) -> None:
    jobs = store.jobs.enqueue_many([NewJob("k", n, unique_key=f"u{n % 50}") for n in range(400)])
    assert len({j.id for j in jobs}) == 50
    for n, job in enumerate(jobs):
        assert job.payload == n % 50
        assert job.unique_key == f"u{n % 50}"
    assert store.jobs.counts().pending == 50


def test_requeue_of_a_job_whose_key_a_newer_job_holds_is_refused(
    store: Store, backend: Harness
) -> None:
    old = store.jobs.enqueue("k", id="old", unique_key="u")
    store.jobs.cancel(old.id)
    new = store.jobs.enqueue("k", id="new", unique_key="u")
    before = backend.snapshot()
    with pytest.raises(DuplicateJob, match="'new'") as info:
        store.jobs.requeue("old")
    assert info.value.details == {"job_id": "old", "held_by": "new"}
    assert backend.snapshot() == before
    # once the newer job settles, the old one may come back (and holds the key again)
    store.jobs.cancel(new.id)
    assert store.jobs.requeue("old") is True
    assert store.jobs.enqueue("k", unique_key="u").id == "old"
    # a failed job holds its own key: requeue is a plain move
    claimed = claim(store, ["k"])
    store.jobs.fail(claimed.lease, "x")
    assert store.jobs.requeue("old") is True


def test_a_transaction_sees_its_own_keys_and_a_rollback_frees_them(
    store: Store, backend: Harness
) -> None:
    class Boom(Exception):
        pass

    seen: list[bool] = []

    def rolled_back() -> None:
        with store.transaction() as tx:
            first = tx.jobs.enqueue("k", unique_key="u")
            seen.append(tx.jobs.enqueue("k", unique_key="u") == first)
            raise Boom

    with pytest.raises(Boom):
        rolled_back()
    assert seen == [True]
    assert backend.job_ids() == []
    with store.transaction() as tx:
        first = tx.jobs.enqueue("k", unique_key="u")
        again = tx.jobs.enqueue("k", unique_key="u")
        # the transaction goes on after a held key (PostgreSQL: nothing aborted it)
        tx.jobs.enqueue("k", id="after")
        assert tx.execute(backend.app_sql("SELECT 1")).fetchone()[0] == 1
    assert again == first
    assert sorted(backend.job_ids()) == sorted([first.id, "after"])
    assert store.jobs.enqueue("k", unique_key="u") == store.jobs.get(first.id)


def test_a_key_held_outside_the_transaction_answers_inside_it(store: Store) -> None:
    held = store.jobs.enqueue("k", unique_key="u")
    with store.transaction() as tx:
        assert tx.jobs.enqueue("k", unique_key="u") == held
        tx.jobs.enqueue("k", id="then")
    assert store.jobs.get("then") is not None


# ----------------------------------------------------------------- the async API


def test_queues_and_keys_through_the_async_api(astore: AsyncStore) -> None:

    async def main() -> None:
        jobs = astore.jobs
        a = await jobs.enqueue("k", id="a", queue="a", unique_key="u")
        assert a.queue == "a"
        assert a.unique_key == "u"
        assert await jobs.enqueue("k", unique_key="u") == a
        await jobs.enqueue("k", id="b", queue="b")
        assert [j.id async for j in jobs.page(queue="b")] == ["b"]
        assert (await jobs.counts(queue="a")).pending == 1
        got = await jobs.claim(["k"], owner="w", queues=["b"])
        assert got is not None
        assert got.id == "b"
        many = await jobs.claim_many(["k"], owner="w", limit=5, queues=["a"])
        assert [j.id for j in many] == ["a"]
        with pytest.raises(TypeError, match="bare string"):
            await jobs.claim(["k"], owner="w", queues="a")  # type: ignore[arg-type]
        async with astore.transaction() as tx:
            made = await tx.jobs.enqueue("k", unique_key="v", queue="c")
            assert await tx.jobs.enqueue("k", unique_key="v") == made
        ran: list[str] = []
        await jobs.enqueue("k", id="c2", queue="c2")
        worker = jobs.create_worker(
            {"k": lambda payload, ctx: ran.append(ctx.job.id)}, queues=["c2"]
        )
        assert await worker.run_once() is True
        assert ran == ["c2"]

    run(main())
