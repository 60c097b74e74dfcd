"""store.jobs.page(): a keyset cursor by id over a real SQLite file (SPEC §3, §5)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from jaren_jobs import (
    CancelScope,
    CorruptJson,
    Cursor,
    CursorAborted,
    DeadlinePassed,
    GateRefused,
    ItemTooLarge,
    Job,
    JobState,
    Runtime,
    StorageError,
    Store,
    StoreClosed,
    UnknownJob,
    drain_page,
)
from jaren_jobs.records import STATES
from tests.conftest import START, FakeClock
from tests.harness import Harness, app_sql_for

WAIT = 5.0


def ids(jobs: Any) -> list[str]:
    return [job.id for job in jobs]


def fill(store: Store, count: int, kinds: tuple[str, ...] = ("a", "b")) -> list[str]:
    made = [
        store.jobs.enqueue(kinds[n % len(kinds)], {"n": n}, id=f"j{n:02d}").id for n in range(count)
    ]
    return sorted(made)


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    """Wait (bounded) until ``predicate`` holds: a condition, never a fixed sleep."""
    end = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


def queued_on_gate(store: Store) -> int:
    # how a test knows a pull is really waiting (rather than not yet started)
    return store._backend.db.gate.waiting()


class HeldTransaction:
    """Another thread's store.transaction(), open until told to finish."""

    def __init__(
        self,
        store: Store,
        work: Callable[[Any], None],
        *,
        later: Callable[[Any], None] | None = None,
        fail: bool = False,
    ) -> None:
        self.open = threading.Event()
        self.finish = threading.Event()
        self.done = threading.Event()
        self.errors: list[BaseException] = []
        self._store = store
        self._work = work
        self._later = later
        self._fail = fail
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            with self._store.transaction() as tx:
                self._work(tx)
                self.open.set()
                assert self.finish.wait(WAIT)
                if self._later is not None:
                    self._later(tx)
                if self._fail:
                    raise RuntimeError("roll it back")
        except RuntimeError as exc:
            if not self._fail:
                self.errors.append(exc)
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            self.open.set()
            self.done.set()

    def __enter__(self) -> HeldTransaction:
        self.thread.start()
        assert self.open.wait(WAIT)
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish.set()
        self.thread.join(WAIT)
        assert not self.thread.is_alive()
        assert self.errors == []


class Pull:
    """``next(cursor)`` on a thread of its own."""

    def __init__(self, cursor: Cursor[Job]) -> None:
        self.result: list[Job | BaseException] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(cursor,))
        self.thread.start()

    def _run(self, cursor: Cursor[Job]) -> None:
        try:
            self.result.append(next(cursor))
        except BaseException as exc:
            self.result.append(exc)
        finally:
            self.done.set()

    def job(self) -> Job:
        assert self.done.wait(WAIT)
        self.thread.join(WAIT)
        (value,) = self.result
        assert isinstance(value, Job), value
        return value


# ----------------------------------------------------------------- filters and keyset


def test_page_lists_every_job_by_id_and_says_how_it_streams(store: Store) -> None:
    made = fill(store, 7)
    cursor = store.jobs.page()
    assert isinstance(cursor, Cursor)
    assert cursor.streaming == "row"
    assert cursor.barrier is None
    with cursor:
        jobs = list(cursor)
    assert ids(jobs) == made
    assert all(isinstance(job, Job) for job in jobs)
    assert jobs[3] == store.jobs.get(jobs[3].id)


def test_page_filters_by_state_and_kind(store: Store, clock: FakeClock) -> None:
    made = fill(store, 10, kinds=("a", "b"))
    first = store.jobs.claim(["a"], owner="w", lease_seconds=60)
    assert first is not None
    store.jobs.complete(first.lease, {"ok": True})
    held = store.jobs.claim(["b"], owner="w", lease_seconds=60)
    assert held is not None
    dead = store.jobs.claim(["a"], owner="w", lease_seconds=60)
    assert dead is not None
    store.jobs.fail(dead.lease, "no", retry=False)
    retried = store.jobs.claim(["b"], owner="w", lease_seconds=60)
    assert retried is not None
    store.jobs.fail(retried.lease, "again")
    store.jobs.cancel(made[-1])

    current = {job_id: store.jobs.get(job_id) for job_id in made}
    seen_states = {job.state for job in current.values() if job is not None}
    assert seen_states == set(STATES)
    for state in (None, *STATES):
        for kind in (None, "a", "b", "c"):
            expected = sorted(
                job_id
                for job_id, job in current.items()
                if job is not None
                and (state is None or job.state == state)
                and (kind is None or job.kind == kind)
            )
            with store.jobs.page(state=state, kind=kind) as cursor:
                got = list(cursor)
            assert ids(got) == expected, (state, kind)
            assert all(job == current[job.id] for job in got)
    # a JobState member is a state like its value
    assert ids(store.jobs.page(state=JobState.DONE)) == [first.id]


def test_keyset_continuation_and_limit(store: Store) -> None:
    made = fill(store, 9)
    assert ids(store.jobs.page(limit=4)) == made[:4]
    assert ids(store.jobs.page(after=made[2])) == made[3:]
    assert ids(store.jobs.page(after=made[2], limit=2)) == made[3:5]
    assert ids(store.jobs.page(after="j025")) == made[3:]  # need not be an existing id
    assert ids(store.jobs.page(after=made[-1])) == []
    assert ids(store.jobs.page(kind="a", after=made[1], limit=2)) == ["j02", "j04"]

    # draining page after page visits every job once, in order
    seen: list[str] = []
    after: str | None = None
    while True:
        page = drain_page(store.jobs.page(after=after), limit=4, after=after)
        seen += ids(page.items)
        after = page.continuation
        if not page.has_more:
            break
    assert seen == made


def test_newest_order_walks_by_updated_at_then_id_descending_and_continues(
    store: Store, clock: FakeClock
) -> None:
    # j00..j05 enqueued at one instant (ties: by id, descending), then three
    # changed later, each a second after the other
    made = fill(store, 6)
    clock.advance(1)
    store.jobs.cancel("j01")
    clock.advance(1)
    held = store.jobs.claim(["a"], owner="w", lease_seconds=60)  # j00, the lowest a
    assert held is not None
    assert held.id == "j00"
    clock.advance(1)
    store.jobs.cancel("j03")
    newest = ["j03", "j00", "j01", "j05", "j04", "j02"]
    assert ids(store.jobs.page(order="newest")) == newest
    got = list(store.jobs.page(order="newest"))
    assert [job.updated_at for job in got] == sorted((job.updated_at for job in got), reverse=True)
    assert sorted(ids(got)) == made
    # continuation past an id, through ties, with a filter, and page after page
    assert ids(store.jobs.page(order="newest", after="j01")) == newest[3:]
    assert ids(store.jobs.page(order="newest", after="j05", limit=2)) == ["j04", "j02"]
    assert ids(store.jobs.page(order="newest", state="cancelled")) == ["j03", "j01"]
    assert ids(store.jobs.page(order="newest", kind="b", after="j03")) == ["j01", "j05"]
    seen: list[str] = []
    after: str | None = None
    while True:
        page = drain_page(store.jobs.page(order="newest", after=after), limit=4, after=after)
        seen += ids(page.items)
        after = page.continuation
        if not page.has_more:
            break
    assert seen == newest
    # inside a transaction too (its own uncommitted change comes first)
    clock.advance(1)
    with store.transaction() as tx:
        tx.jobs.cancel("j02")
        assert ids(tx.jobs.page(order="newest", limit=2)) == ["j02", "j03"]
    # the id order is unchanged
    assert ids(store.jobs.page()) == made
    # in newest order an after id is a position: it must name a job
    with pytest.raises(UnknownJob, match="j99"), store.jobs.page(order="newest", after="j99") as c:
        list(c)
    for bad in ("oldest", ""):
        with pytest.raises(ValueError, match="order"):
            store.jobs.page(order=bad)
    with pytest.raises(TypeError, match="order"):
        store.jobs.page(order=1)  # type: ignore[arg-type]


def test_bad_filters_are_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="state"):
        store.jobs.page(state="running")
    with pytest.raises(ValueError, match="kind"):
        store.jobs.page(kind="")
    for limit in (0, -3):
        with pytest.raises(ValueError, match="limit"):
            store.jobs.page(limit=limit)
    # a filter of the wrong type is an argument mistake and a bad filter alike
    for bad in ({"state": 3}, {"kind": 3}, {"after": 3}, {"limit": "10"}, {"limit": True}):
        with pytest.raises(TypeError):
            store.jobs.page(**bad)
        with pytest.raises(ValueError):
            store.jobs.page(**bad)
    with pytest.raises(TypeError):
        store.jobs.page(signal=object())
    with pytest.raises(TypeError):
        store.jobs.page(deadline="soon")
    with pytest.raises(ValueError):
        store.jobs.page(deadline=datetime(2030, 1, 1))


def test_page_on_a_closed_store(backend: Harness, runtime: Runtime) -> None:
    store = backend.open(runtime=runtime)
    fill(store, 3)
    cursor = store.jobs.page()
    assert next(cursor).id == "j00"
    store.close()
    with pytest.raises(StoreClosed):
        store.jobs.page()
    with pytest.raises(StoreClosed):
        next(cursor)
    cursor.close()  # releasing after the store closed is quiet
    assert cursor.settled


def test_two_live_cursors_interleave_without_sharing_a_statement(store: Store) -> None:
    made = fill(store, 8)
    every = store.jobs.page()
    only_b = store.jobs.page(kind="b")
    got_every: list[str] = []
    got_b: list[str] = []
    for _ in range(4):
        got_every.append(next(every).id)
        got_b.append(next(only_b).id)
    got_every += ids(every)
    assert list(only_b) == []
    assert got_every == made
    assert got_b == [job_id for job_id in made if int(job_id[1:]) % 2 == 1]
    every.close()
    only_b.close()


# ----------------------------------------------------------------- per-pull admission


def test_a_paused_consumer_blocks_no_transaction(real_store: Store) -> None:
    made = fill(real_store, 4)
    cursor = real_store.jobs.page()
    assert next(cursor).id == made[0]
    committed = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            with real_store.transaction() as tx:
                tx.jobs.enqueue("a", id="j00x")
                tx.jobs.cancel(made[2])
            committed.set()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    # the cursor is mid-iteration, and the transaction still commits
    assert committed.wait(WAIT), errors
    thread.join(WAIT)
    assert errors == []
    rest = list(cursor)
    assert ids(rest) == ["j00x", *made[1:]]
    assert rest[2].state == "cancelled"


@pytest.mark.requires("gate")
def test_a_pull_during_a_transaction_waits_for_its_commit(real_store: Store) -> None:
    made = fill(real_store, 4)
    cursor = real_store.jobs.page()
    assert next(cursor).id == made[0]

    def work(tx: Any) -> None:
        tx.jobs.cancel(made[1])

    def later(tx: Any) -> None:
        # written after the pull queued: only a pull that waited for the
        # commit can see it
        tx.jobs.enqueue("a", id="j00x")

    with HeldTransaction(real_store, work, later=later):
        pull = Pull(cursor)
        wait_for(lambda: queued_on_gate(real_store) == 1, "the pull to queue on the gate")
        assert not pull.done.is_set()
    assert pull.job().id == "j00x"
    rest = list(cursor)
    assert ids(rest) == made[1:]
    assert rest[0].state == "cancelled"


@pytest.mark.requires("gate")
def test_a_pull_during_a_transaction_that_rolls_back_reads_the_committed_state(
    real_store: Store,
) -> None:
    made = fill(real_store, 3)
    cursor = real_store.jobs.page()
    assert next(cursor).id == made[0]

    def work(tx: Any) -> None:
        tx.jobs.cancel(made[1])
        tx.jobs.enqueue("a", id="j00x")

    with HeldTransaction(real_store, work, fail=True):
        pull = Pull(cursor)
        wait_for(lambda: queued_on_gate(real_store) == 1, "the pull to queue on the gate")
    job = pull.job()
    assert job.id == made[1]  # j00x never committed
    assert job.state == "pending"
    assert ids(cursor) == made[2:]


@pytest.mark.requires("gate")
def test_a_pull_that_waits_too_long_is_refused_and_the_cursor_lives_on(
    backend: Harness,
) -> None:
    store = backend.open(gate_timeout_seconds=0.05)
    try:
        made = fill(store, 3)
        cursor = store.jobs.page()
        assert next(cursor).id == made[0]
        with HeldTransaction(store, lambda tx: None):
            with pytest.raises(GateRefused):
                next(cursor)
            assert not cursor.settled
        assert ids(cursor) == made[1:]
    finally:
        store.close()


def test_a_root_cursor_inside_this_threads_transaction_is_refused_at_once(store: Store) -> None:
    made = fill(store, 3)
    cursor = store.jobs.page()
    assert next(cursor).id == made[0]
    with store.transaction(), pytest.raises(GateRefused, match=r"tx\.jobs"):
        next(cursor)
    assert ids(cursor) == made[1:]


@pytest.mark.requires("gate")
def test_an_abort_while_queued_abandons_the_pull(real_store: Store) -> None:
    made = fill(real_store, 3)
    scope = CancelScope()
    cursor = real_store.jobs.page(signal=scope.signal)
    assert next(cursor).id == made[0]
    with HeldTransaction(real_store, lambda tx: None):
        pull = Pull(cursor)
        wait_for(lambda: queued_on_gate(real_store) == 1, "the pull to queue on the gate")
        scope.abort("the client left")
        assert pull.done.wait(WAIT)
        assert isinstance(pull.result[0], GateRefused)
        assert cursor.settled  # the abort let go of the cursor at once
    with pytest.raises(CursorAborted):
        next(cursor)
    cursor.close()


# ----------------------------------------------------------------- transactions


def test_a_transaction_cursor_sees_its_own_uncommitted_rows(store: Store) -> None:
    made = fill(store, 3)
    seen: list[Job] = []

    def look_then_roll_back() -> None:
        with store.transaction() as tx:
            tx.jobs.enqueue("a", id="j01x")
            tx.jobs.cancel(made[2])
            with tx.jobs.page() as cursor:
                seen.extend(cursor)
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        look_then_roll_back()
    assert ids(seen) == [made[0], made[1], "j01x", made[2]]
    assert seen[-1].state == "cancelled"
    with store.jobs.page() as cursor:
        after = list(cursor)
    assert ids(after) == made
    assert after[-1].state == "pending"


def test_a_transaction_cursor_refuses_once_its_transaction_ended(store: Store) -> None:
    made = fill(store, 3)
    with store.transaction() as tx:
        cursor = tx.jobs.page()
        assert next(cursor).id == made[0]
    with pytest.raises(StorageError, match="ended"):
        next(cursor)
    assert cursor.settled
    with pytest.raises(StopIteration):
        next(cursor)


# ----------------------------------------------------------------- failures and cancellation


def test_a_corrupt_stored_payload_is_named_and_paging_goes_on(store: Store) -> None:
    made = fill(store, 3)
    with store.transaction() as tx:
        tx.execute(
            app_sql_for(store, 'UPDATE "_jaren_jobs" SET payload = ? WHERE id = ?'),
            ("{not json", made[1]),
        )
    with store.jobs.page() as cursor:
        jobs = list(cursor)
    assert [job.id for job in jobs] == made
    bad = jobs[1]
    assert isinstance(bad.payload, CorruptJson)
    assert bad.payload.text == "{not json"
    assert bad.to_dict()["payload"]["corrupt_json"] == "{not json"
    assert not isinstance(jobs[0].payload, CorruptJson)
    got = store.jobs.get(made[1])
    assert got is not None
    assert isinstance(got.payload, CorruptJson)
    # the store is still usable: nothing was left open
    with store.transaction() as tx:
        tx.jobs.enqueue("a", id="zz")


def test_an_aborted_signal_refuses_every_pull(store: Store) -> None:
    fill(store, 3)
    scope = CancelScope()
    scope.abort("never mind")
    cursor = store.jobs.page(signal=scope.signal)
    for _ in range(2):
        with pytest.raises(CursorAborted):
            next(cursor)

    live = CancelScope()
    cursor = store.jobs.page(signal=live.signal)
    assert next(cursor).id == "j00"
    live.abort("enough")
    assert cursor.settled
    with pytest.raises(CursorAborted):
        next(cursor)


def test_a_deadline_is_read_on_the_store_clock(store: Store, clock: FakeClock) -> None:
    made = fill(store, 3)
    deadline = datetime.fromtimestamp(START, timezone.utc) + timedelta(seconds=5)
    cursor = store.jobs.page(deadline=deadline)
    assert next(cursor).id == made[0]
    clock.set(START + 4.999)
    assert next(cursor).id == made[1]
    clock.set(START + 5)  # at the deadline is past it
    with pytest.raises(DeadlinePassed):
        next(cursor)
    assert cursor.settled

    past = store.jobs.page(deadline=datetime.fromtimestamp(START - 1, timezone.utc))
    with pytest.raises(DeadlinePassed):
        next(past)


def test_drain_page_over_jobs_refuses_an_item_too_large_without_advancing(store: Store) -> None:
    store.jobs.enqueue("a", "small", id="j1")
    big = store.jobs.enqueue("a", "é" * 500, id="j2")
    store.jobs.enqueue("a", "small", id="j3")
    big_bytes = len(
        json.dumps(big.to_dict(), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    )
    first = drain_page(store.jobs.page(), limit=10, max_bytes=big_bytes - 1)
    assert ids(first.items) == ["j1"]
    assert first.has_more
    assert first.continuation == "j1"
    with pytest.raises(ItemTooLarge) as caught:
        drain_page(
            store.jobs.page(after=first.continuation),
            limit=10,
            max_bytes=big_bytes - 1,
            after=first.continuation,
        )
    assert caught.value.details["continuation"] == "j1"
    assert caught.value.details["item_id"] == "j2"
    # the same bound meets the same refusal; a larger one reads on
    with pytest.raises(ItemTooLarge):
        drain_page(store.jobs.page(after="j1"), limit=10, max_bytes=big_bytes - 1, after="j1")
    rest = drain_page(store.jobs.page(after="j1"), limit=1, max_bytes=big_bytes, after="j1")
    assert ids(rest.items) == ["j2"]
    assert rest.has_more
    assert rest.continuation == "j2"


def test_drain_page_peeks_past_its_limit_within_a_larger_cursor(store: Store) -> None:
    many = fill(store, 25)
    page = drain_page(store.jobs.page(limit=100), limit=10)
    assert ids(page.items) == many[:10]
    assert page.has_more
    last = drain_page(store.jobs.page(after=many[19]), limit=10, after=many[19])
    assert ids(last.items) == many[20:]
    assert not last.has_more
    assert last.continuation == many[-1]
