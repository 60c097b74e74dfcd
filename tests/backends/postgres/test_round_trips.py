"""PostgreSQL's fenced writes: each answers in ONE round trip, written or refused.

A fenced write (renew, complete, fail, leased cancel, checkpoint save, a
batch of completions) is one statement that locks the job's row, writes
under the fence, and hands back the fence row either way: the refusal's
reason comes back with the write that was refused, never from a second
read, and never from a snapshot older than the row the write met.

Round trips are counted on the wire: libpq's protocol trace of the store's
own connection (with psycopg's automatic prepare off, so every statement
carries its text).
"""

from __future__ import annotations

import re
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from jaren_jobs import (
    DuplicateJob,
    JobSettled,
    LeaseExpired,
    LeaseSuperseded,
    NewJob,
    Store,
)
from jaren_jobs.core.commands import ClaimRequest, Failure
from jaren_jobs.core.settle import Completion, SettleBatch
from jaren_jobs.jobs import engine_of
from tests.conftest import FakeClock
from tests.harness import PostgresUrl

psycopg = pytest.importorskip("psycopg", reason="the dev extra installs psycopg")
pq = psycopg.pq

WAIT = 10.0
_SENT = re.compile(r"^F\t\d+\t(?:Parse\t \"[^\"]*\"|Query\t) \"(.*)", re.S)


@contextmanager
def wire(store: Store) -> Iterator[list[str]]:
    """The statements the store's connection sends while inside, as their SQL text."""
    conn = store._backend.db.connection  # type: ignore[attr-defined]
    sent: list[str] = []
    threshold = conn.prepare_threshold
    conn.prepare_threshold = None  # every statement is parsed, so its text is on the wire
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield sent
        finally:
            conn.pgconn.untrace()
            conn.prepare_threshold = threshold
            trace.seek(0)
            for message in trace.read().split("\nF\t"):
                text = message if message.startswith("F\t") else "F\t" + message
                found = _SENT.match(text)
                if found:
                    sent.append(found.group(1))


def _on_tables(sent: list[str]) -> list[str]:
    """The statements that read or write the job tables (not BEGIN, COMMIT, SET …)."""
    return [s for s in sent if "_jaren_job" in s]


def _one_round_trip(sent: list[str]) -> None:
    touching = _on_tables(sent)
    assert len(touching) == 1, "expected one statement on the job tables, got:\n" + "\n---\n".join(
        touching
    )


def test_a_renewal_refused_answers_why_in_its_own_round_trip(
    store: Store, clock: FakeClock
) -> None:
    store.jobs.enqueue("k", id="a")
    claimed = store.jobs.claim(["k"], owner="w", lease_seconds=10)
    assert claimed is not None
    renewed = store.jobs.renew(claimed.lease, lease_seconds=10)
    with wire(store) as sent, pytest.raises(LeaseSuperseded):
        store.jobs.renew(claimed.lease, lease_seconds=10)  # the old token: superseded
    _one_round_trip(sent)
    clock.advance(11)
    with wire(store) as sent, pytest.raises(LeaseExpired):
        store.jobs.renew(renewed, lease_seconds=10)
    _one_round_trip(sent)


def test_a_renewal_that_holds_is_one_round_trip(store: Store) -> None:
    store.jobs.enqueue("k", id="a")
    claimed = store.jobs.claim(["k"], owner="w", lease_seconds=10)
    assert claimed is not None
    with wire(store) as sent:
        store.jobs.renew(claimed.lease, lease_seconds=10)
    _one_round_trip(sent)


@pytest.mark.parametrize("retry", [True, False])
def test_a_failure_is_one_round_trip_written_or_refused(
    store: Store, clock: FakeClock, retry: bool
) -> None:
    store.jobs.enqueue("k", id="a", max_attempts=3)
    claimed = store.jobs.claim(["k"], owner="w", lease_seconds=10)
    assert claimed is not None
    with wire(store) as sent:
        assert store.jobs.fail(claimed.lease, "boom", retry=retry) is True
    _one_round_trip(sent)
    job = store.jobs.get("a")
    assert job is not None
    assert job.state == ("failed" if retry else "dead")
    assert job.last_error == "boom"
    if retry:
        # the backoff of attempt 1 (base 1 s by default, draw 0.5): 0.75 s
        expected = clock.now() + store.defaults.backoff_base_seconds * 0.75
        assert job.run_at.timestamp() == pytest.approx(expected, abs=0.001)
        clock.advance(60)
        again = store.jobs.claim(["k"], owner="w", lease_seconds=10)
        assert again is not None
        clock.advance(11)
        with wire(store) as sent, pytest.raises(LeaseExpired):
            store.jobs.fail(again.lease, "late")
        _one_round_trip(sent)
        # the first attempt's lease, after another claim: superseded
        with wire(store) as sent, pytest.raises(LeaseSuperseded):
            store.jobs.fail(claimed.lease, "again")
        _one_round_trip(sent)
    else:
        # the same attempt again, once its job is dead: idempotent, nothing written
        with wire(store) as sent:
            store.jobs.fail(claimed.lease, "again")
        _one_round_trip(sent)
        job = store.jobs.get("a")
        assert job is not None
        assert (job.state, job.last_error) == ("dead", "boom")


def test_a_failure_of_the_last_attempt_is_dead_in_one_round_trip(store: Store) -> None:
    store.jobs.enqueue("k", id="a", max_attempts=1)
    claimed = store.jobs.claim(["k"], owner="w", lease_seconds=10)
    assert claimed is not None
    with wire(store) as sent:
        assert store.jobs.fail(claimed.lease, "boom") is True
    _one_round_trip(sent)
    job = store.jobs.get("a")
    assert job is not None
    assert (job.state, job.attempts, job.last_error) == ("dead", 1, "boom")


def test_a_checkpoint_save_is_one_round_trip_written_or_refused(
    store: Store, clock: FakeClock
) -> None:
    store.jobs.enqueue("k", id="a")
    claimed = store.jobs.claim(["k"], owner="w", lease_seconds=10)
    assert claimed is not None
    checkpoints = store.jobs.checkpoints_for(claimed)
    with wire(store) as sent:
        checkpoints.save("a", "n1", {"v": 1})
    _one_round_trip(sent)
    assert checkpoints.load("a") == {"n1": {"v": 1}}
    clock.advance(11)
    with wire(store) as sent, pytest.raises(LeaseExpired):
        checkpoints.save("a", "n2", 2)
    _one_round_trip(sent)
    assert checkpoints.load("a") == {"n1": {"v": 1}}


def test_a_batch_of_completions_with_refusals_is_one_round_trip(
    store: Store, clock: FakeClock
) -> None:
    store.jobs.enqueue_many([])
    for name in "abcd":
        store.jobs.enqueue("k", id=name)
    claimed = store.jobs.claim_many(["k"], owner="w", limit=4, lease_seconds=10)
    assert [c.id for c in claimed] == ["a", "b", "c", "d"]
    store.jobs.cancel("c", lease=claimed[2].lease)
    batch = SettleBatch(tuple(Completion(c.lease, '"ok"') for c in claimed))
    with wire(store) as sent:
        answer = engine_of(store.jobs).settle(batch, "complete()")
    _one_round_trip(sent)
    assert answer.settled[0] is True
    assert answer.settled[1] is True
    assert answer.settled[3] is True
    missed = answer.settled[2]
    assert not isinstance(missed, bool)
    assert missed.row is not None
    assert missed.row.state == "cancelled"


def test_a_fenced_write_that_waited_on_a_row_answers_the_row_it_met(
    pg: PostgresUrl, store: Store
) -> None:
    """A write that waited on another transaction's lock is refused by the row that
    transaction committed, in the same round trip (never a re-read, never the older
    snapshot, which would have matched)."""
    store.jobs.enqueue("k", id="a")
    claimed = store.jobs.claim(["k"], owner="w", lease_seconds=10)
    assert claimed is not None
    other = psycopg.connect(pg.url)  # not autocommit: holds its lock until commit
    try:
        other.execute(
            "UPDATE \"_jaren_jobs\" SET state = 'cancelled', lease_token = NULL WHERE id = 'a'"
        )
        outcome: dict[str, object] = {}
        with wire(store) as sent:

            def complete() -> None:
                try:
                    outcome["answer"] = store.jobs.complete(claimed.lease, 1)
                except Exception as exc:
                    outcome["answer"] = exc

            thread = threading.Thread(target=complete)
            thread.start()
            _wait_for_lock_wait(pg)
            other.commit()
            thread.join(WAIT)
            assert not thread.is_alive()
        _one_round_trip(sent)
        answer = outcome["answer"]
        assert isinstance(answer, JobSettled), answer
        assert answer.details["state"] == "cancelled"
    finally:
        other.close()


def _wait_for_lock_wait(pg: PostgresUrl) -> None:
    deadline = time.monotonic() + WAIT
    with psycopg.connect(pg.server_url, autocommit=True) as admin:
        while time.monotonic() < deadline:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE %s",
                ("%_jaren_jobs%",),
            ).fetchone()
            if row is not None and row[0] > 0:
                return
            time.sleep(0.01)
    raise AssertionError("the store's write never waited on the held row")


def test_the_one_round_trip_writes_use_the_primary_key(pg: PostgresUrl) -> None:
    """Each fenced statement reaches its rows by id, whatever the table holds: never a scan."""
    from jaren_jobs.backends.postgres import queries as sql

    store = pg.open()
    for start in range(0, 20_000, 1_000):
        store.jobs.enqueue_many([NewJob("busy", {"n": n}) for n in range(start, start + 1_000)])
    for job in store.jobs.claim_many(["busy"], owner="w", limit=500):
        store.jobs.complete(job.lease)
    store.jobs.claim_many(["busy"], owner="w", limit=500)
    fence = {"id": "x", "token": "t", "now": 2**62}
    statements = {
        "renew": (sql.RENEW, {**fence, "until": 2**62, "new_token": "n"}),
        "complete": (sql.SETTLE_DONE, {**fence, "result": None}),
        "cancel": (sql.CANCEL_LEASED, {**fence, "settled": "c"}),
        "complete, notifying": (sql.SETTLE_DONE_NOTIFY, {**fence, "result": None, "settled": "c"}),
        "fail, notifying": (
            sql.FAIL_NOTIFY,
            {
                **fence,
                "error": "e",
                "retry": True,
                "run_at": 1,
                "attempts": 1,
                "generation": 1,
                "settled": "c",
                "traceback": None,
            },
        ),
        "snooze": (sql.SNOOZE, {**fence, "run_at": 1}),
        "fail": (
            sql.FAIL,
            {
                **fence,
                "error": "e",
                "retry": True,
                "run_at": 1,
                "attempts": 1,
                "generation": 1,
                "traceback": None,
            },
        ),
        "checkpoint": (
            sql.CHECKPOINT_SAVE,
            {**fence, "run_id": "x", "node_id": "n", "value": "1", "generation": 1},
        ),
        "complete many": (
            sql.SETTLE_DONE_MANY,
            {"now": 2**62, "ids": ["x", "y"], "tokens": ["t", "u"], "results": ["1", "2"]},
        ),
        "complete many, notifying": (
            sql.SETTLE_DONE_MANY_NOTIFY,
            {
                "now": 2**62,
                "ids": ["x", "y"],
                "tokens": ["t", "u"],
                "results": ["1", "2"],
                "settled": "c",
            },
        ),
    }
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("ANALYZE _jaren_jobs")
        for name, (statement, params) in statements.items():
            plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + statement, params))
            assert "_jaren_jobs_pkey" in plan, (name, plan)
            assert "Seq Scan" not in plan, (name, plan)


# ----------------------------------------------------------------- round trips at the root

# a Sync or a simple Query waits on the server; so does a Flush, unless it follows a
# Sync (psycopg's end of a pipeline: the results are on their way already)
_WAITS = re.compile(r"^F\t\d+\t(?:Sync|Query)\b|(?<!Sync\n)^F\t\d+\tFlush\b", re.M)


@contextmanager
def round_trips(store: Store) -> Iterator[list[int]]:
    """How many times the store's connection waited on the server while inside (a
    pipeline's statements share one wait)."""
    conn = store._backend.db.connection  # type: ignore[attr-defined]
    counted: list[int] = []
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield counted
        finally:
            conn.pgconn.untrace()
            trace.seek(0)
            counted.append(len(_WAITS.findall(trace.read())))


def _listening(store: Store, pg: PostgresUrl) -> psycopg.Connection[tuple[object, ...]]:
    listener = psycopg.connect(pg.url, autocommit=True)
    channel = store._backend.channel  # type: ignore[attr-defined]
    listener.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
    return listener


def _woken(listener: psycopg.Connection[tuple[object, ...]]) -> int:
    return sum(1 for _ in listener.notifies(timeout=0.5, stop_after=1))


def test_a_lone_enqueue_is_one_round_trip_its_notify_included(
    pg: PostgresUrl, store: Store
) -> None:
    listener = _listening(store, pg)
    try:
        for n in range(3):  # past psycopg's prepare threshold too
            with round_trips(store) as trips:
                store.jobs.enqueue("k", {"n": n})
            assert trips == [1]
            assert _woken(listener) == 1
        store.jobs.enqueue("k", id="taken")
        assert _woken(listener) == 1
        with round_trips(store) as trips, pytest.raises(DuplicateJob):
            store.jobs.enqueue("k", id="taken")
        assert trips == [1]
        assert _woken(listener) == 0  # nothing inserted: nobody woken
    finally:
        listener.close()


def test_an_enqueue_inside_a_transaction_notifies_at_its_commit_only(
    pg: PostgresUrl, store: Store
) -> None:
    listener = _listening(store, pg)
    try:
        with store.transaction() as tx:
            tx.jobs.enqueue("k", id="a")
            assert _woken(listener) == 0
        assert _woken(listener) == 1

        def rolled_back() -> None:
            with store.transaction() as tx:
                tx.jobs.enqueue("k", id="b")
                raise RuntimeError("rolled back")

        with pytest.raises(RuntimeError):
            rolled_back()
        assert _woken(listener) == 0
        assert store.jobs.get("b") is None
    finally:
        listener.close()


def test_an_enqueue_not_due_yet_notifies_nobody_and_a_due_one_does(
    pg: PostgresUrl, store: Store
) -> None:
    """A NOTIFY wakes idle workers to claim now; a job not due yet cannot be claimed by
    them (it starts at a poll after its run_at either way), so its enqueue sends none:
    alone, in a batch, or inside the application's transaction."""
    listener = _listening(store, pg)
    try:
        with round_trips(store) as trips:
            store.jobs.enqueue("k", id="later", delay_seconds=60)
        assert trips == [1]
        assert _woken(listener) == 0
        store.jobs.enqueue_many([NewJob("k", delay_seconds=60) for _ in range(3)])
        assert _woken(listener) == 0
        with store.transaction() as tx:
            tx.jobs.enqueue("k", delay_seconds=60)
        assert _woken(listener) == 0
        # due now (no delay, or a delay of zero): every idle worker is told
        store.jobs.enqueue("k", id="now", delay_seconds=0)
        assert _woken(listener) == 1
        store.jobs.enqueue_many([NewJob("k", delay_seconds=60), NewJob("k")])
        assert _woken(listener) == 1
        with store.transaction() as tx:
            tx.jobs.enqueue("k", delay_seconds=60)
            tx.jobs.enqueue("k")
        assert _woken(listener) == 1
        # one by one (an id minted after a named one), the same rule
        store.jobs.enqueue_many(
            [NewJob("k", id="n1", delay_seconds=60), NewJob("k", delay_seconds=60)]
        )
        assert _woken(listener) == 0
        store.jobs.enqueue_many([NewJob("k", id="n2", delay_seconds=60), NewJob("k")])
        assert _woken(listener) == 1
        # a taken id still answers DuplicateJob, due or not, and writes nothing
        with pytest.raises(DuplicateJob):
            store.jobs.enqueue("k", id="later", delay_seconds=60)
        assert _woken(listener) == 0
        assert {j.state for j in (store.jobs.get("later"), store.jobs.get("now")) if j} == {
            "pending"
        }
    finally:
        listener.close()


def test_the_async_api_notifies_as_the_sync_one_due_or_not(pg: PostgresUrl) -> None:
    """The asyncio session (generated from the sync one) on psycopg's AsyncConnection:
    a job not due yet wakes nobody, a due one wakes at the commit, a rolled-back
    transaction wakes nobody and leaves nothing."""
    import asyncio

    import jaren_jobs
    from jaren_jobs.backends.postgres.store import channel_name

    listener = psycopg.connect(pg.url, autocommit=True)
    listener.execute(
        psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel_name(pg.schema)))
    )

    async def main() -> list[int]:
        woken: list[int] = []
        async with jaren_jobs.open_async_store(pg.url) as store:
            await store.jobs.enqueue("k", id="later", delay_seconds=60)
            woken.append(_woken(listener))
            await store.jobs.enqueue_many([NewJob("k", delay_seconds=60), NewJob("k")])
            woken.append(_woken(listener))

            async def rolled_back() -> None:
                async with store.transaction() as tx:
                    await tx.jobs.enqueue("k", id="undone")
                    raise RuntimeError("rolled back")

            with pytest.raises(RuntimeError):
                await rolled_back()
            woken.append(_woken(listener))
            assert await store.jobs.get("undone") is None
            async with store.transaction() as tx:
                await tx.jobs.enqueue("k", id="done")
                woken.append(_woken(listener))  # not committed yet
            woken.append(_woken(listener))
        return woken

    try:
        assert asyncio.run(main()) == [0, 1, 0, 0, 1]
    finally:
        listener.close()


def test_enqueue_many_is_one_round_trip_and_a_taken_id_writes_nothing(
    pg: PostgresUrl, store: Store
) -> None:
    listener = _listening(store, pg)
    try:
        with round_trips(store) as trips:
            store.jobs.enqueue_many([NewJob("k", {"n": n}) for n in range(50)])
        assert trips == [1]
        assert _woken(listener) == 1
        store.jobs.enqueue("k", id="taken")
        assert _woken(listener) == 1
        with pytest.raises(DuplicateJob):
            store.jobs.enqueue_many([NewJob("k", id="fresh"), NewJob("k", id="taken")])
        assert store.jobs.get("fresh") is None
        assert _woken(listener) == 0
    finally:
        listener.close()


def test_a_lone_claim_and_a_lone_complete_are_one_round_trip_each(store: Store) -> None:
    for n in range(8):
        store.jobs.enqueue("k", id=f"j{n}")
    claims: list[int] = []
    completions: list[int] = []
    for n in range(8):  # past psycopg's prepare threshold too
        with round_trips(store) as trips:
            claimed = store.jobs.claim(["k"], owner="w", lease_seconds=10)
        claims += trips
        assert claimed is not None
        assert claimed.id == f"j{n}"
        with round_trips(store) as trips:
            store.jobs.complete(claimed.lease, n)
        completions += trips
        job = store.jobs.get(claimed.id)
        assert job is not None
        assert (job.state, job.attempts) == ("done", 1)
    # one each; once, psycopg's prepare of the statement (its 5th use) is one more
    assert sorted(claims) == [1] * 7 + [2], claims
    assert sorted(completions) == [1] * 7 + [2], completions
    with round_trips(store) as trips:
        assert store.jobs.claim(["k"], owner="w") is None
    assert trips == [1]


def test_a_batch_settled_with_its_next_claim_is_one_round_trip(store: Store) -> None:
    store.jobs.enqueue_many([NewJob("k", id=f"j{n}") for n in range(8)])
    claimed = store.jobs.claim_many(["k"], owner="w", limit=4, lease_seconds=10)
    request = engine_of(store.jobs)
    ask = ClaimRequest(("k",), "w", 10_000, None)
    batch = SettleBatch(tuple(Completion(c.lease, '"ok"') for c in claimed), claims=((ask, 4),))
    with round_trips(store) as trips:
        answer = request.settle(batch, "worker")
    assert trips == [1]  # BEGIN, the completions, the claim, COMMIT: one pipeline
    assert answer.settled == (True, True, True, True)
    assert [c.id for c in answer.claimed[0]] == ["j4", "j5", "j6", "j7"]
    states = [store.jobs.get(f"j{n}") for n in range(8)]
    assert [j.state for j in states if j is not None] == ["done"] * 4 + ["leased"] * 4


def test_a_batch_with_a_refusal_and_a_failure_still_settles_each_and_claims(
    store: Store, clock: FakeClock
) -> None:
    """The shapes the one-round-trip batch leaves to the statement-by-statement path (a
    failure beside the completions) and a refusal inside it answer as before."""
    store.jobs.enqueue_many([NewJob("k", id=f"j{n}") for n in range(6)])
    claimed = store.jobs.claim_many(["k"], owner="w", limit=3, lease_seconds=10)
    store.jobs.cancel("j1", lease=claimed[1].lease)
    engine = engine_of(store.jobs)
    ask = ClaimRequest(("k",), "w", 10_000, None)
    batch = SettleBatch(
        (Completion(claimed[0].lease, "1"), Completion(claimed[1].lease, "2")), claims=((ask, 2),)
    )
    with round_trips(store) as trips:
        answer = engine.settle(batch, "worker")
    assert trips == [1]
    assert answer.settled[0] is True
    refused = answer.settled[1]
    assert not isinstance(refused, bool)
    assert refused.row is not None
    assert refused.row.state == "cancelled"
    assert [c.id for c in answer.claimed[0]] == ["j3", "j4"]
    mixed = SettleBatch(
        (
            Failure(claimed[2].lease, "boom", True, 1.0, 60.0, None),
            Completion(answer.claimed[0][0].lease, "3"),
        ),
        claims=((ask, 1),),
    )
    with round_trips(store) as trips:
        answer = engine.settle(mixed, "worker")
    # BEGIN with the failure, the completion, the claim with COMMIT
    assert trips == [3]
    assert answer.settled == (True, True)
    assert [c.id for c in answer.claimed[0]] == ["j5"]
