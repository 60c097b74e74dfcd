"""Group commit: concurrent settlements share a transaction, each answered as if alone.

The main test builds two identical stores (same fake clock, same ids). On the
control store every settlement runs as a lone ``store.jobs`` call, one after
another; on the other, many threads run the same settlements at once through
a :class:`SettlementBatcher`, with the gate held at the start so that the
calls pile up behind one leader and really share transactions. Valid leases,
renewed-away leases, expired leases, rescued and requeued jobs, repeated
settlements and unknown jobs are mixed in every thread. Every caller must get
exactly the control's answer (the same value, or the same refusal with the
same message), the two tables must end identical — nothing settled twice —
and each answer must arrive only once the settlement is visible to another
connection (committed).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from jaren_jobs import (
    JobSettled,
    Lease,
    LeaseExpired,
    LeaseRequired,
    LeaseSuperseded,
    NewJob,
    Runtime,
    StorageError,
    Store,
    testing,
)
from jaren_jobs.core.settle import SettleBatch
from jaren_jobs.engine.group_commit import SettlementBatcher
from jaren_jobs.jobs import engine_of
from tests.conftest import FakeClock, Sequence
from tests.harness import Harness

# the batcher and jaren_jobs.testing take the sync engine (engine_of(store.jobs)); the AsyncWorker
# settles through this same batcher, which the worker tests run through the async API
pytestmark = pytest.mark.requires("sync-api")

THREADS = 12
WAIT = 30.0


@dataclass(frozen=True)
class Call:
    """One settlement: ``op`` is "complete" or "fail"."""

    op: str
    lease: Lease
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()


def open_twin(backend: Harness) -> tuple[Store, FakeClock]:
    clock = FakeClock()
    ids = Sequence()
    return backend.open(runtime=Runtime(now=clock.now, random=ids.random, uuid=ids.uuid)), clock


def build(store: Store, clock: FakeClock) -> list[list[Call]]:
    """The same jobs, leases and per-thread settlement lists on either twin."""
    jobs = store.jobs
    short = []  # leases that will expire, per thread: (to expire, to rescue, to requeue)
    for t in range(THREADS):
        # one kind each, so no other thread's claim can take them
        short.append(
            tuple(
                jobs.claim([kind], owner=f"crashed-{t}", lease_seconds=1)
                for kind in (
                    jobs.enqueue("expires", {"t": t}).kind,
                    jobs.enqueue("rescued", {"t": t}).kind,
                    jobs.enqueue("requeued", {"t": t}).kind,
                )
            )
        )
    clock.advance(2)  # every short lease is now expired
    calls: list[list[Call]] = []
    for t in range(THREADS):
        expired, to_rescue, to_requeue = short[t]
        assert expired is not None
        assert to_rescue is not None
        assert to_requeue is not None
        assert jobs.requeue(to_requeue.id) is True
        jobs.enqueue_many([NewJob("long", {"t": t, "n": n}) for n in range(4)])
        jobs.enqueue("dies", {"t": t}, max_attempts=1)
        done, retried, renewed, twice = (
            jobs.claim(["long"], owner=f"w-{t}", lease_seconds=600) for _ in range(4)
        )
        dead = jobs.claim(["dies"], owner=f"w-{t}", lease_seconds=600)
        for claimed in (done, retried, renewed, twice, dead):
            assert claimed is not None
        rescuer = jobs.claim(["rescued"], owner=f"rescuer-{t}", lease_seconds=600)
        assert rescuer is not None
        assert rescuer.id == to_rescue.id
        fresh = jobs.renew(renewed.lease, lease_seconds=600)
        ghost = Lease(
            job_id=f"never-{t}",
            token="nothing",
            generation=1,
            attempt=1,
            owner="nobody",
            expires_at=done.lease.expires_at,
        )
        calls.append(
            [
                Call("complete", done.lease, ({"t": t},)),
                Call("fail", retried.lease, (RuntimeError(f"boom {t}"),)),
                Call("fail", dead.lease, (ValueError("fatal"),)),
                Call("complete", renewed.lease),  # superseded by its own renewal
                Call("complete", fresh),  # ...which still settles
                Call("complete", expired.lease),  # expired, never rescued
                Call("fail", to_requeue.lease, (RuntimeError("late"),)),  # requeued: settled
                Call("complete", twice.lease, ("once",)),
                Call("complete", twice.lease, ("twice",)),  # same attempt: idempotent True
                Call("fail", twice.lease, (RuntimeError("after"),)),  # ...still True
                Call("complete", ghost),  # unknown job
                Call("complete", rescuer.lease, ("rescued",)),
                Call("fail", dead.lease, (ValueError("again"),), (("retry", False),)),
            ]
        )
    # the rescued job's first attempt speaks last, long after its lease was taken over
    for t in range(THREADS):
        calls[t].append(Call("complete", short[t][1].lease))
    return calls


def answer_of(call: Callable[[], bool]) -> tuple[str, Any]:
    try:
        return ("value", call())
    except (JobSettled, LeaseSuperseded, LeaseExpired) as exc:
        return (type(exc).__name__, (exc.code, str(exc)))


def run_call(settle: Any, call: Call) -> tuple[str, Any]:
    method = getattr(settle, call.op)
    return answer_of(lambda: method(call.lease, *call.args, **dict(call.kwargs)))


def table(store: Store) -> list[tuple[Any, ...]]:
    with store.transaction() as tx:
        return tx.execute('SELECT * FROM "_jaren_jobs" ORDER BY id').fetchall()


def committed_state(backend: Harness, job_id: str) -> str | None:
    row = backend.raw_row(job_id)
    return None if row is None else str(row["state"])


@pytest.mark.requires("gate")  # the settlements pile up behind a held transaction
def test_concurrent_settlements_answer_exactly_as_lone_calls(backend: Harness) -> None:
    control, control_clock = open_twin(backend.sibling("control"))
    batched, batched_clock = open_twin(backend)
    try:
        control_calls = build(control, control_clock)
        calls = build(batched, batched_clock)
        assert table(control) == table(batched)  # the twins start identical

        expected = [[run_call(control.jobs, c) for c in thread] for thread in control_calls]
        # every kind of answer is in play
        kinds = {a[0] for thread in expected for a in thread}
        assert kinds == {"value", "JobSettled", "LeaseSuperseded", "LeaseExpired"}

        batcher = SettlementBatcher(engine_of(batched.jobs))
        answers: list[list[tuple[str, Any]]] = [[] for _ in range(THREADS)]
        not_durable: list[str] = []
        start = threading.Barrier(THREADS + 1)

        def settle(t: int) -> None:
            start.wait(WAIT)
            for call in calls[t]:
                answer = run_call(batcher, call)
                answers[t].append(answer)
                if answer == ("value", True):
                    state = committed_state(backend, call.lease.job_id)
                    if state == "leased":
                        not_durable.append(call.lease.job_id)

        threads = [threading.Thread(target=settle, args=(t,)) for t in range(THREADS)]
        for thread in threads:
            thread.start()
        # hold the store while the first settlements arrive: one leads (and waits
        # for the gate), the rest queue behind it and must share the next batch
        with batched.transaction():
            start.wait(WAIT)
            deadline = time.monotonic() + WAIT
            while batcher.waiting() < THREADS - 1:
                assert time.monotonic() < deadline, "the settlements never queued"
                time.sleep(0.001)
        for thread in threads:
            thread.join(WAIT)
            assert not thread.is_alive()

        assert answers == expected
        assert not_durable == []
        assert table(batched) == table(control)  # same writes, nothing settled twice
        total = sum(len(thread) for thread in calls)
        assert batcher.settled == total
        assert batcher.retried_alone == 0  # a refusal never fails the batch it is in
        # the leader's batch, then the other THREADS - 1 first calls in ONE transaction
        assert batcher.batches <= total - (THREADS - 2)
    finally:
        control.close()
        batched.close()


@pytest.mark.requires("gate")  # the settlements pile up behind a held transaction
def test_a_failing_batch_is_retried_one_settlement_at_a_time(
    store: Store, backend: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.jobs.enqueue_many([NewJob("k", n) for n in range(4)])
    claims = store.jobs.claim_many(["k"], owner="w", limit=4)
    poisoned = claims[2].id
    engine = engine_of(store.jobs)
    real = engine.settle

    def settle(batch: SettleBatch, what: str) -> Any:
        # a driver failure on any batch that settles the poisoned job, every time
        if any(item.lease.job_id == poisoned for item in batch.settlements):
            raise StorageError(f"{what}: disk I/O error (simulated)")
        return real(batch, what)

    monkeypatch.setattr(engine, "settle", settle)
    batcher = SettlementBatcher(engine)
    answers: dict[str, Any] = {}

    def complete(claimed: Any) -> None:
        answers[claimed.id] = answer_of(lambda: batcher.complete(claimed.lease))

    def raising(claimed: Any) -> None:
        try:
            batcher.complete(claimed.lease)
        except StorageError as exc:
            answers[claimed.id] = ("StorageError", str(exc))

    threads = [
        threading.Thread(target=raising if c.id == poisoned else complete, args=(c,))
        for c in claims
    ]
    with store.transaction():
        threads[0].start()  # the leader (its job is not the poisoned one): alone
        deadline = time.monotonic() + WAIT
        while not batcher.writing():
            assert time.monotonic() < deadline
            time.sleep(0.001)
        for thread in threads[1:]:
            thread.start()
        while batcher.waiting() < 3:
            assert time.monotonic() < deadline
            time.sleep(0.001)
    for thread in threads:
        thread.join(WAIT)
    assert batcher.retried_alone == 3  # the three queued together; the leader was alone
    assert answers[poisoned] == ("StorageError", "JD2099: complete(): disk I/O error (simulated)")
    for claimed in claims:
        expected = "leased" if claimed.id == poisoned else "done"
        assert committed_state(backend, claimed.id) == expected
        if claimed.id != poisoned:
            assert answers[claimed.id] == ("value", True)


def test_an_error_text_with_lone_surrogates_never_fails_its_batch(
    store: Store, backend: Harness
) -> None:
    """One failure whose error text cannot be encoded as it is must not roll back the
    settlements it shares a transaction with (and make them replay one by one)."""
    store.jobs.enqueue_many([NewJob("k", n, id=f"j{n}") for n in range(3)])
    claims = store.jobs.claim_many(["k"], owner="w", limit=3)
    batcher = SettlementBatcher(engine_of(store.jobs))
    group = [
        batcher.failure(claims[0].lease, "plain", retry=False),
        batcher.failure(claims[1].lease, OSError("open " + "caf\udce9.txt"), retry=False),
        batcher.completion(claims[2].lease, {"ok": True}),
    ]
    settled = batcher.submit(SettleBatch(tuple(group)))
    assert [settled.result(n) for n in range(len(group))] == [True, True, True]
    assert (batcher.batches, batcher.retried_alone) == (1, 0)
    assert [committed_state(backend, f"j{n}") for n in range(3)] == ["dead", "dead", "done"]
    bad = store.jobs.get("j1")
    assert bad is not None
    assert bad.last_error == "OSError: open caf\\udce9.txt"


def test_mistakes_are_refused_before_anything_queues(store: Store) -> None:
    store.jobs.enqueue("k")
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    batcher = SettlementBatcher(engine_of(store.jobs))
    with pytest.raises(TypeError):
        batcher.complete(claimed.lease, {1, 2})
    with pytest.raises(LeaseRequired):
        batcher.complete(claimed.id)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        batcher.fail(claimed.lease, RuntimeError("x"), retry="yes")  # type: ignore[arg-type]
    assert (batcher.settled, batcher.batches) == (0, 0)
    job = store.jobs.get(claimed.id)
    assert job is not None
    assert job.state == "leased"
    assert batcher.fail(claimed.lease, RuntimeError("x")) is True  # the lease still works
    after = store.jobs.get(claimed.id)
    assert after is not None
    assert (after.state, after.last_error) == ("failed", "RuntimeError: x")


def test_a_claim_whose_transaction_fails_hands_out_no_job(
    store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.jobs.enqueue_many([NewJob("k", n) for n in range(3)])
    engine = engine_of(store.jobs)
    batcher = SettlementBatcher(engine)
    request = testing.claim_request(engine, ["k"], owner="w")
    scope = testing.scope_of(engine)
    real_write = scope.write

    def write(fn: Callable[[], Any], what: str, signal: Any = None) -> Any:
        def then_fail() -> Any:
            # the claim statements ran, then the unit failed: rolled back where its commit
            # comes after them (SQLite), or an acknowledgement lost where the claim's own
            # statement commits it (PostgreSQL's one-statement claim)
            fn()
            raise StorageError(f"{what}: failed after its statements (simulated)")

        return real_write(then_fail, what, signal)

    monkeypatch.setattr(scope, "write", write)
    # two claims in one batch: the batch fails, then each claim alone
    settled = batcher.submit(SettleBatch(claims=((request, 2), (request, 1))))
    assert isinstance(settled.claimed[0], StorageError)
    assert isinstance(settled.claimed[1], StorageError)
    # jobs whose claim was rolled back are nobody's to run
    assert (settled.jobs(0), settled.jobs(1)) == ([], [])
    monkeypatch.undo()
    # nobody holds them: each is claimable again, at the latest once its lease runs out
    clock.advance(store.defaults.lease_seconds + 1)
    again = store.jobs.claim_many(["k"], owner="w", limit=3)
    assert sorted(job.payload for job in again) == [0, 1, 2]


def test_queued_batches_share_one_settle_call_each_answered_its_own(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.jobs.enqueue_many([NewJob("k", n, id=f"j{n}") for n in range(4)])
    claims = store.jobs.claim_many(["k"], owner="w", limit=4)
    engine = engine_of(store.jobs)
    real = engine.settle
    calls: list[int] = []

    def settle(batch: SettleBatch, what: str) -> Any:
        calls.append(len(batch.settlements))
        return real(batch, what)

    monkeypatch.setattr(engine, "settle", settle)
    batcher = SettlementBatcher(engine)
    stale = store.jobs.renew(claims[3].lease)  # claims[3].lease is superseded now
    assert stale is not None
    answers: dict[int, Any] = {}

    def complete(n: int) -> None:
        answers[n] = answer_of(lambda: batcher.complete(claims[n].lease, n))

    threads = [threading.Thread(target=complete, args=(n,)) for n in range(4)]
    with store.transaction():
        threads[0].start()  # the leader: alone, waiting for the gate
        deadline = time.monotonic() + WAIT
        while not batcher.writing():
            assert time.monotonic() < deadline
            time.sleep(0.001)
        for thread in threads[1:]:
            thread.start()
        while batcher.waiting() < 3:
            assert time.monotonic() < deadline
            time.sleep(0.001)
    for thread in threads:
        thread.join(WAIT)
    assert calls == [1, 3]  # the leader alone, then the three queued in ONE settle call
    assert [answers[n][0] for n in range(4)] == ["value", "value", "value", "LeaseSuperseded"]


def test_two_lanes_write_two_batches_at_once_and_pass_the_queue_on(
    store: Store, backend: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batcher of two lanes (a PostgreSQL worker's) writes two batches at once; a
    call arriving while both write queues, and the first lane to finish writes the
    whole queue in one batch. No lane is lost when both finish with calls queued."""
    store.jobs.enqueue_many([NewJob("k", n, id=f"j{n}") for n in range(10)])
    claims = store.jobs.claim_many(["k"], owner="w", limit=10)
    engine = engine_of(store.jobs)
    real = engine.settle
    lock = threading.Lock()
    inside = threading.Condition(lock)
    release = threading.Event()
    writing = [0]
    calls: list[int] = []
    most = [0]

    def settle(batch: SettleBatch, what: str) -> Any:
        with lock:
            writing[0] += 1
            most[0] = max(most[0], writing[0])
            calls.append(len(batch.settlements))
            inside.notify_all()
        try:
            assert release.wait(WAIT)  # the first two hold their lanes until released
            return real(batch, what)
        finally:
            with lock:
                writing[0] -= 1

    monkeypatch.setattr(engine, "settle", settle)
    batcher = SettlementBatcher(engine, lanes=2)
    answers: dict[int, Any] = {}

    def complete(n: int) -> None:
        answers[n] = answer_of(lambda: batcher.complete(claims[n].lease, n))

    threads = [threading.Thread(target=complete, args=(n,)) for n in range(8)]
    for thread in threads[:2]:
        thread.start()
    with lock:  # both lanes are writing, each its own call
        assert inside.wait_for(lambda: writing[0] == 2, WAIT)
    for thread in threads[2:]:
        thread.start()
    deadline = time.monotonic() + WAIT
    while batcher.waiting() < 6:
        assert time.monotonic() < deadline, "the calls never queued behind two lanes"
        time.sleep(0.001)
    release.set()  # both lanes finish with six calls queued: one of them takes all six
    for thread in threads:
        thread.join(WAIT)
        assert not thread.is_alive()
    assert sorted(calls) == [1, 1, 6]
    assert most[0] == 2
    assert answers == dict.fromkeys(range(8), ("value", True))
    assert [committed_state(backend, f"j{n}") for n in range(8)] == ["done"] * 8
    assert not batcher.writing()  # every lane was given back
    # and both lanes are still there: two more calls are written at once again
    release.clear()
    more = [threading.Thread(target=complete, args=(n,)) for n in (8, 9)]
    for thread in more:
        thread.start()
    with lock:
        assert inside.wait_for(lambda: writing[0] == 2, WAIT)
    release.set()
    for thread in more:
        thread.join(WAIT)
    assert (answers[8], answers[9]) == (("value", True), ("value", True))


def test_a_batcher_needs_a_lane(store: Store) -> None:
    with pytest.raises(ValueError, match="at least one lane"):
        SettlementBatcher(engine_of(store.jobs), lanes=0)
