"""The engine's batched write primitives: claim_within, settle_done_many, release_within.

Each batch is held to what the one-row statements do: claims against the
claim order computed in Python and against a twin store claiming row by row;
settlements against a twin store completing one lease at a time. Twins are
two stores on identical fake clocks and identical uuid sequences, driven
through the same steps, compared row for row afterwards. Most cases also
run with the multi-row statements switched off (the path an SQLite older
than 3.33 takes).
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import sqlite3
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import (
    ClaimedJob,
    Job,
    JobSettled,
    Lease,
    LeaseExpired,
    LeaseLost,
    LeaseSuperseded,
    NewJob,
    Outcome,
    Runtime,
    Store,
    open_store,
    testing,
)
from jaren_jobs.backends.sqlite import queries as sql
from jaren_jobs.codec import encode_json
from jaren_jobs.core import rows
from jaren_jobs.records import CorruptJson
from tests.conftest import START, FakeClock, Sequence
from tests.harness import Harness

JOBS = '"_jaren_jobs"'


class Recorder:
    """A deterministic uuid source that remembers every value it handed out."""

    def __init__(self, prefix: str = "id") -> None:
        self.sequence = Sequence(prefix)
        self.produced: list[str] = []

    def uuid(self) -> str:
        value = self.sequence.uuid()
        self.produced.append(value)
        return value


@dataclasses.dataclass
class Twin:
    store: Store
    clock: FakeClock
    uuids: Recorder


@pytest.fixture(params=[True, False], ids=["multi-row", "row-by-row"])
def multi_row(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    # row-by-row is what an SQLite without UPDATE … FROM runs
    monkeypatch.setattr(sql, "MULTI_ROW_UPDATES", request.param)
    return bool(request.param)


def make_twin(path: Path) -> Twin:
    clock = FakeClock()
    uuids = Recorder()
    store = open_store(path, runtime=Runtime(now=clock.now, random=lambda: 0.5, uuid=uuids.uuid))
    return Twin(store, clock, uuids)


@pytest.fixture
def twins(tmp_path: Path) -> Iterator[tuple[Twin, Twin]]:
    first = make_twin(tmp_path / "first.db")
    second = make_twin(tmp_path / "second.db")
    try:
        yield first, second
    finally:
        first.store.close()
        second.store.close()


def all_rows(store: Store) -> list[tuple[Any, ...]]:
    return store.connection.execute(f"SELECT * FROM {JOBS} ORDER BY id").fetchall()


def write(store: Store, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` inside one write transaction of the store (how a worker calls these)."""
    return testing.write(store.jobs, fn, "test")


def claim_within(store: Store, kinds: list[str], limit: int, **options: Any) -> list[ClaimedJob]:
    request = testing.claim_request(store.jobs, kinds, owner=options.pop("owner", "w"), **options)
    return write(store, lambda: testing.claim_within(store.jobs, request, limit, "claim()"))


def traced(store: Store, fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    statements: list[str] = []
    store.connection.set_trace_callback(statements.append)
    try:
        result = fn()
    finally:
        store.connection.set_trace_callback(None)
    return result, statements


# ----------------------------------------------------------------- claims


def populate(twin: Twin) -> None:
    """A backlog mixing every kind of row a claim must take or leave, all deterministic."""
    jobs, clock = twin.store.jobs, twin.clock
    draw = random.Random(7)
    for batch in range(12):
        jobs.enqueue_many(
            [
                NewJob(
                    draw.choice(["a", "b", "other"]),
                    {"batch": batch, "n": n, "text": "héllo ✓"},
                    priority=draw.choice([-1, 0, 0, 2, 5]),
                    # a few are not due yet
                    delay_seconds=draw.choice([0, 0, 0, 0, 30, 3600]),
                )
                for n in range(25)
            ]
        )
        clock.advance(0.25)
    # failed rows: some due again by the time the batch claims, some not
    for n, claimed in enumerate(jobs.claim_many(["a", "b"], owner="failing", limit=20)):
        # retried after 3.75 s or 45 s (the draw is 0.5): due or not when the batch claims
        jobs.fail(claimed.lease, RuntimeError("boom"), backoff_base_seconds=(5, 60)[n % 2])
    # leases that stay live, a settled job, then leases that will have expired
    jobs.claim_many(["a", "b"], owner="alive", limit=10, lease_seconds=600)
    done = jobs.claim(["a"], owner="w")
    assert done is not None
    jobs.complete(done.lease, "ok")
    jobs.claim_many(["a", "b", "other"], owner="crashed", limit=15, lease_seconds=1)
    clock.advance(20)


def expected_order(store: Store, kinds: list[str], now: int) -> list[tuple[str, int, int]]:
    """Claimable (id, generation, attempts) in claim order, computed in Python."""
    found = store.connection.execute(
        f"SELECT id, kind, state, priority, run_at, created_at, lease_until, lease_generation, "
        f"attempts FROM {JOBS}"
    ).fetchall()
    ready = [
        r
        for r in found
        if r[1] in kinds
        and r[4] <= now
        and (r[2] in ("pending", "failed") or (r[2] == "leased" and r[6] <= now))
    ]
    ready.sort(key=lambda r: (-r[3], r[4], r[5], r[0]))
    return [(r[0], r[7], r[8]) for r in ready]


@pytest.mark.parametrize("limit", [1, 2, 16, 64, 200])
def test_claim_within_takes_jobs_in_claim_order_each_with_its_own_token(
    twins: tuple[Twin, Twin], multi_row: bool, limit: int
) -> None:
    batch, one_by_one = twins
    for twin in twins:
        populate(twin)
    kinds = ["a", "b"]
    now = int(batch.clock.now() * 1000)
    expected = expected_order(batch.store, kinds, now)
    assert len(expected) > 64  # the backlog is deep enough to fill the bigger batches
    # the backlog holds every kind of row, claimable or not
    mix = batch.store.connection.execute(
        f"SELECT state, kind IN ('a', 'b'), run_at <= ?, coalesce(lease_until <= ?, 0), "
        f"count(*) FROM {JOBS} GROUP BY 1, 2, 3, 4",
        (now, now),
    ).fetchall()
    kinds_of = {(state, mine, due, lapsed) for state, mine, due, lapsed, _ in mix}
    for wanted in [
        ("pending", 1, 1, 0),  # ready
        ("pending", 1, 0, 0),  # delayed
        ("pending", 0, 1, 0),  # another kind
        ("failed", 1, 1, 0),  # retry due
        ("failed", 1, 0, 0),  # retry not due yet
        ("leased", 1, 1, 1),  # expired lease: rescued
        ("leased", 0, 1, 1),  # expired lease of another kind
        ("leased", 1, 1, 0),  # live lease
        ("done", 1, 1, 0),
    ]:
        assert wanted in kinds_of, (wanted, mix)

    produced_before = len(batch.uuids.produced)
    claimed = claim_within(batch.store, kinds, limit, owner="batch", lease_seconds=45)
    tokens = batch.uuids.produced[produced_before:]

    assert [(c.id, c.lease_generation - 1, c.attempts - 1) for c in claimed] == expected[:limit]
    # every lease its own fresh token, straight from runtime.uuid, in claim order
    assert [c.lease.token for c in claimed] == tokens[: len(claimed)]
    assert len({c.lease.token for c in claimed}) == len(claimed)
    if multi_row or len(claimed) == limit:
        assert len(tokens) == len(claimed)  # (row by row, a last empty probe mints one)
    for job in claimed:
        assert job.state == "leased"
        assert job.lease_owner == "batch"
        assert job.lease.owner == "batch"
        assert job.lease.job_id == job.id
        assert job.lease.generation == job.lease_generation
        assert job.lease.attempt == job.attempts
        assert (job.lease_until, job.lease.expires_at) == (
            job.updated_at + timedelta(seconds=45),
        ) * 2
        assert job.kind in kinds
    # the stored rows are exactly what claiming one job at a time leaves
    if multi_row:
        one_by_one_claims = []
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sql, "MULTI_ROW_UPDATES", False)
            one_by_one_claims = claim_within(
                one_by_one.store, kinds, limit, owner="batch", lease_seconds=45
            )
        assert one_by_one_claims == claimed
        assert all_rows(one_by_one.store) == all_rows(batch.store)
        stored = batch.store.connection.execute(
            f"SELECT count(*) FROM {JOBS} WHERE settled_generation IS NOT NULL AND state = 'leased'"
        ).fetchone()
        assert stored == (0,)
    # and every claimed lease settles
    for job in claimed:
        assert batch.store.jobs.complete(job.lease, {"id": job.id}) is True
        stored_job = batch.store.jobs.get(job.id)
        assert stored_job is not None
        assert stored_job.state == "done"


def test_a_batch_claim_is_two_statements_whatever_its_size(store: Store) -> None:
    store.jobs.enqueue_many([NewJob("k", n) for n in range(100)])
    claimed, statements = traced(store, lambda: claim_within(store, ["k"], 64))
    assert len(claimed) == 64
    jobs_statements = [s for s in statements if "_jaren_jobs" in s]
    assert len(jobs_statements) == 2, jobs_statements
    assert jobs_statements[0].lstrip().startswith("SELECT")
    assert jobs_statements[1].lstrip().startswith("UPDATE")


def test_a_batch_claim_of_fewer_jobs_than_its_limit(store: Store, multi_row: bool) -> None:
    store.jobs.enqueue_many([NewJob("k", n) for n in range(3)])
    claimed = claim_within(store, ["k"], 50)
    assert [c.payload for c in claimed] == [0, 1, 2]
    assert claim_within(store, ["k"], 50) == []


def test_an_empty_batch_claim_remembers_when_to_look_again(
    store: Store, clock: FakeClock, multi_row: bool
) -> None:
    store.jobs.enqueue("k", delay_seconds=10)
    assert claim_within(store, ["k"], 16) == []
    # the idle check now knows: nothing until the delayed job comes due, no write lock taken
    _, statements = traced(store, lambda: store.jobs.claim_many(["k"], owner="w", limit=16))
    assert not any("BEGIN" in s for s in statements), statements
    clock.advance(10)
    assert len(claim_within(store, ["k"], 16)) == 1


def test_a_batch_claim_rescues_expired_leases_and_leaves_live_ones(
    store: Store, clock: FakeClock, multi_row: bool
) -> None:
    store.jobs.enqueue_many([NewJob("k", n) for n in range(6)])
    crashed = claim_within(store, ["k"], 3, owner="crashed", lease_seconds=1)
    alive = claim_within(store, ["k"], 2, owner="alive", lease_seconds=600)
    assert [c.payload for c in crashed + alive] == [0, 1, 2, 3, 4]
    clock.advance(2)
    rescued = claim_within(store, ["k"], 10, owner="rescuer")
    # the expired leases first (oldest run_at), then the one pending job; no live lease
    assert [c.payload for c in rescued] == [0, 1, 2, 5]
    for old, new in zip(crashed, rescued[:3], strict=True):
        assert (new.attempts, new.lease_generation) == (old.attempts + 1, old.lease_generation + 1)
        assert new.lease.token != old.lease.token
        with pytest.raises(LeaseSuperseded):
            store.jobs.complete(old.lease)
    for job in alive:
        assert store.jobs.complete(job.lease) is True


def test_the_candidates_of_a_batch_claim_are_rechecked_in_the_update(store: Store) -> None:
    # the update repeats the claimability guard: a live lease named by a
    # stale candidate list is never taken over
    store.jobs.enqueue_many([NewJob("k", n) for n in range(2)])
    live = store.jobs.claim(["k"], owner="alive")
    assert live is not None
    # inside a transaction of the store's: on an application's connection in sqlite3's
    # legacy mode, an UPDATE run bare would leave a transaction open behind the store
    with store.transaction() as tx:
        (rowid,) = tx.execute(f"SELECT rowid FROM {JOBS} WHERE id = ?", (live.id,))
        params = (
            "thief",
            0,
            testing.now_ms(store.jobs),
            rowid[0],
            "stolen",
            rows.claim_key("stolen"),
        )
        assert tx.execute(sql.claim_rows(1), params).fetchall() == []
    assert store.jobs.complete(live.lease) is True


# ----------------------------------------------------------------- settlements


def lone_answer(store: Store, lease: Lease, result: Any) -> int | LeaseLost:
    """What a lone complete() says, in settle_done_many's terms."""
    before = store.connection.total_changes
    try:
        assert store.jobs.complete(lease, result) is True
    except LeaseLost as refusal:
        return refusal
    return 1 if store.connection.total_changes > before else 0


def same_answer(got: int | LeaseLost, want: int | LeaseLost) -> bool:
    if isinstance(want, LeaseLost):
        return (
            type(got) is type(want) and str(got) == str(want) and got.details == want.details  # type: ignore[union-attr]
        )
    return got == want


UNICODE_RESULTS: list[Any] = [
    {"text": "日本語 ✓ ü", "emoji": "🎉🧪", "quote": '"\\'},
    "line\nbreak\ttab\u2028sep\x00nul",
    ["\u00e9", "e\u0301", 1.5, -0.0, 10**18, None, True],
    None,
]


def claim1(store: Store, kind: str = "k", lease_seconds: float = 600) -> ClaimedJob:
    claimed = store.jobs.claim([kind], owner="w", lease_seconds=lease_seconds)
    assert claimed is not None
    return claimed


def settlement_scenario(twin: Twin) -> tuple[list[Lease], list[Any]]:
    """Leases in every state a settlement can meet, and the result each is settled with."""
    store, clock = twin.store, twin.clock
    jobs = store.jobs
    jobs.enqueue_many([NewJob("k", n, id=f"job-{n:02d}") for n in range(12)])
    jobs.enqueue("x", id="lapsed")
    valid = jobs.claim_many(["k"], owner="w", limit=4, lease_seconds=600)  # job-00 … 03
    stale = claim1(store, lease_seconds=1)  # job-04: expires, re-claimed
    cancelled = claim1(store, lease_seconds=1)  # job-05: expires, re-claimed, cancelled
    mine = claim1(store)  # job-06: already settled by this attempt
    theirs = claim1(store, lease_seconds=1)  # job-07: settled by the next attempt
    dup = claim1(store)  # job-08: named twice
    dup_stale = claim1(store, lease_seconds=1)  # job-09: stale lease, then the current one
    dup_current_first = claim1(store, lease_seconds=1)  # job-10: current, then stale
    renewed = claim1(store)  # job-11: its first lease, then the renewed one
    lapsed = claim1(store, "x", lease_seconds=1)  # expires, nobody re-claims it
    assert [c.id for c in (stale, dup_current_first)] == ["job-04", "job-10"]
    new_lease = jobs.renew(renewed.lease, lease_seconds=600)
    assert jobs.complete(mine.lease, "first") is True
    clock.advance(2)
    reclaimed = {c.id: c for c in jobs.claim_many(["k"], owner="w2", limit=9)}
    assert set(reclaimed) == {"job-04", "job-05", "job-07", "job-09", "job-10"}
    assert jobs.complete(reclaimed["job-07"].lease, "theirs") is True
    assert jobs.cancel("job-05", lease=reclaimed["job-05"].lease) is True
    ghost = Lease("no-such-job", "token", 1, 1, "w", valid[0].lease.expires_at)
    leases = [
        valid[0].lease,  # 1
        stale.lease,  # LeaseSuperseded
        cancelled.lease,  # JobSettled
        valid[1].lease,  # 1
        mine.lease,  # 0
        theirs.lease,  # JobSettled
        dup.lease,  # 1
        dup.lease,  # 0: applied after the item before it
        dup_stale.lease,  # LeaseSuperseded
        reclaimed["job-09"].lease,  # 1
        reclaimed["job-10"].lease,  # 1
        dup_current_first.lease,  # JobSettled: the item before it settled the job
        ghost,  # JobSettled: unknown
        renewed.lease,  # LeaseSuperseded: renewed away
        new_lease,  # 1
        lapsed.lease,  # LeaseExpired
        valid[2].lease,  # 1
        valid[3].lease,  # 1
    ]
    results: list[Any] = [UNICODE_RESULTS[i % len(UNICODE_RESULTS)] for i in range(len(leases))]
    return leases, results


EXPECTED_ANSWERS = [
    1,
    LeaseSuperseded,
    JobSettled,
    1,
    0,
    JobSettled,
    1,
    0,
    LeaseSuperseded,
    1,
    1,
    JobSettled,
    JobSettled,
    LeaseSuperseded,
    1,
    LeaseExpired,
    1,
    1,
]


def test_settle_done_many_answers_as_lone_completes_would(
    twins: tuple[Twin, Twin], multi_row: bool
) -> None:
    batch, lone = twins
    leases, results = settlement_scenario(batch)
    lone_leases, _ = settlement_scenario(lone)
    assert all_rows(batch.store) == all_rows(lone.store)  # identical twins so far
    assert [(lease.job_id, lease.token) for lease in leases] == [
        (lease.job_id, lease.token) for lease in lone_leases
    ]

    texts = [encode_json(result, "result") for result in results]
    now = testing.now_ms(batch.store.jobs)
    answers, statements = traced(
        batch.store,
        lambda: write(
            batch.store,
            lambda: testing.settle_done_many(
                batch.store.jobs, list(zip(leases, texts, strict=True)), now, "complete()"
            ),
        ),
    )
    multi_statements = [s for s in statements if "VALUES" in s]
    assert len(multi_statements) == (1 if multi_row else 0)

    wanted = [
        lone_answer(lone.store, lease, r) for lease, r in zip(lone_leases, results, strict=True)
    ]
    assert len(answers) == len(wanted)
    for index, (got, want) in enumerate(zip(answers, wanted, strict=True)):
        assert same_answer(got, want), (index, got, want)
    # the rows, results included, are byte for byte what lone completes store
    assert all_rows(batch.store) == all_rows(lone.store)

    assert [a if isinstance(a, int) else type(a) for a in answers] == EXPECTED_ANSWERS
    assert answers[12].details["job_id"] == "no-such-job"  # type: ignore[union-attr]


def test_settle_done_many_reports_an_expired_lease(
    store: Store, clock: FakeClock, multi_row: bool
) -> None:
    store.jobs.enqueue_many([NewJob("k", n) for n in range(5)])
    short = store.jobs.claim(["k"], owner="w", lease_seconds=1)
    long = store.jobs.claim_many(["k"], owner="w", limit=4, lease_seconds=600)
    assert short is not None
    clock.advance(5)
    now = testing.now_ms(store.jobs)
    items = [(long[0].lease, "2"), (short.lease, "1"), *((c.lease, "3") for c in long[1:])]
    answers = write(store, lambda: testing.settle_done_many(store.jobs, items, now, "complete()"))
    assert isinstance(answers[1], LeaseExpired)
    assert answers[1].details["expired_ms"] == 4000
    assert answers[:1] + answers[2:] == [1, 1, 1, 1]
    results = [store.jobs.get(c.id).result for c in long]  # type: ignore[union-attr]
    assert results == [2, 3, 3, 3]
    assert store.jobs.get(short.id).state == "leased"  # type: ignore[union-attr]


def test_settle_done_many_refuses_an_attempt_from_before_a_sweep(
    store: Store, clock: FakeClock, multi_row: bool
) -> None:
    ids = [f"j{n}" for n in range(6)]
    store.jobs.enqueue_many([NewJob("k", id=job_id) for job_id in ids])
    old = store.jobs.claim_many(["k"], owner="w", limit=len(ids))
    for claimed in old:
        assert store.jobs.complete(claimed.lease, "old life") is True
    clock.advance(1)
    horizon = datetime.fromtimestamp(clock.now(), timezone.utc)
    assert store.jobs.sweep(settled_before=horizon) == len(ids)
    store.jobs.enqueue_many([NewJob("k", id=job_id) for job_id in ids])
    new = store.jobs.claim_many(["k"], owner="w", limit=len(ids))
    assert [c.lease.generation for c in new] == [c.lease.generation for c in old]
    for claimed in new[:3]:  # this life's first three are settled by their own attempts
        assert store.jobs.complete(claimed.lease, "new life") is True
    before = all_rows(store)

    now = testing.now_ms(store.jobs)
    items = [(c.lease, '"stale"') for c in old] + [(c.lease, '"again"') for c in new[:3]]
    answers = write(store, lambda: testing.settle_done_many(store.jobs, items, now, "complete()"))
    # the old attempts settled nothing of this life: refused, the leased three included
    assert [type(a) for a in answers[:3]] == [JobSettled] * 3
    assert [type(a) for a in answers[3:6]] == [LeaseSuperseded] * 3
    assert answers[6:] == [0, 0, 0]  # this life's own attempts: already settled, no write
    assert all_rows(store) == before


@pytest.mark.parametrize("size", [0, 1, 3, 4, 5, 64])
def test_settle_done_many_stores_results_byte_identical(
    store: Store, multi_row: bool, size: int
) -> None:
    store.jobs.enqueue_many([NewJob("k", n) for n in range(size)])
    claimed = store.jobs.claim_many(["k"], owner="w", limit=max(size, 1))
    assert len(claimed) == size
    texts = [
        encode_json(UNICODE_RESULTS[n % len(UNICODE_RESULTS)], "result") + ("" if n % 2 else " ")
        for n in range(size)
    ]
    now = testing.now_ms(store.jobs)
    items = [(c.lease, text) for c, text in zip(claimed, texts, strict=True)]
    assert write(store, lambda: testing.settle_done_many(store.jobs, items, now, "x")) == [1] * size
    for job, text in zip(claimed, texts, strict=True):
        stored = store.connection.execute(
            f"SELECT result, CAST(result AS BLOB), state, settled_generation, updated_at, "
            f"lease_token, lease_until FROM {JOBS} WHERE id = ?",
            (job.id,),
        ).fetchone()
        assert stored == (text, text.encode("utf-8"), "done", job.lease_generation, now, None, None)


def _reads_of_the_job_row(statements: list[str]) -> list[str]:
    return [s for s in statements if s.lstrip().startswith("SELECT") and JOBS in s]


def _worker_settlement_traced(
    store: Store,
    clock: FakeClock,
    handler: Callable[[Any, Any, Callable[[], None]], Any],
    **options: Any,
) -> tuple[Outcome, list[str]]:
    """Run one attempt of ``handler``; trace from the handler's return to its outcome."""
    statements: list[str] = []
    outcomes: list[Outcome] = []

    def traced_return(payload: Any, ctx: Any) -> Any:
        return handler(payload, ctx, lambda: store.connection.set_trace_callback(statements.append))

    options = {"renew": False, **options}
    worker = store.jobs.create_worker({"k": traced_return}, on_outcome=outcomes.append, **options)
    store.jobs.enqueue("k")
    try:
        assert worker.run_once() is True
    finally:
        store.connection.set_trace_callback(None)
        worker.stop()
    assert len(outcomes) == 1
    return outcomes[0], statements


def test_a_refused_worker_settlement_is_decided_from_its_answer_alone(
    store: Store, clock: FakeClock
) -> None:
    # another attempt rescued and completed the job: the worker's completion is
    # refused (JD2065) and the fence row its write answered decides the outcome;
    # nothing reads the row a second time
    def rescued_meanwhile(payload: Any, ctx: Any, trace: Callable[[], None]) -> Any:
        clock.advance(400)
        rescue = store.jobs.claim(["k"], owner="rescuer")
        assert rescue is not None
        assert store.jobs.complete(rescue.lease, "rescued") is True
        trace()
        return "stale"

    outcome, statements = _worker_settlement_traced(store, clock, rescued_meanwhile)
    assert (outcome.outcome, outcome.phase, outcome.code) == ("lost", "completion", "JD2065")
    reads = _reads_of_the_job_row(statements)
    assert len(reads) == 1, statements  # the fence row the missed UPDATE answered with
    assert reads[0].startswith("SELECT state, lease_token, lease_until")


@pytest.mark.parametrize(
    ("settle", "expected"),
    [
        ("complete", ("completed", None)),
        ("fail", ("failed", "given up")),
        # through another store: no local abort tells the worker, its own write does
        ("cancel elsewhere", ("cancelled", "cancelled")),
    ],
)
def test_an_attempt_that_settled_its_own_job_is_decided_from_the_answer_alone(
    store: Store,
    backend: Harness,
    clock: FakeClock,
    settle: str,
    expected: tuple[str, str | None],
) -> None:
    # the handler settled its job with its own lease: the worker's settlement
    # is an idempotent repeat, and the fence row it met says how it ended
    elsewhere = backend.open()

    def settles_itself(payload: Any, ctx: Any, trace: Callable[[], None]) -> Any:
        if settle == "complete":
            assert store.jobs.complete(ctx.lease, "by hand") is True
        elif settle == "fail":
            assert store.jobs.fail(ctx.lease, "given up", retry=False) is True
        else:
            assert elsewhere.jobs.cancel(ctx.job.id, lease=ctx.lease) is True
        trace()
        return "ignored"

    outcome, statements = _worker_settlement_traced(store, clock, settles_itself)
    assert (outcome.outcome, outcome.reason) == expected
    assert len(_reads_of_the_job_row(statements)) == 1, statements  # the fence row alone


def test_a_renewal_that_finds_its_own_settlement_is_decided_from_its_answer_alone(
    store: Store, clock: FakeClock
) -> None:
    # the handler completed its job with its own lease; the next renewal is
    # refused (JobSettled), and the fence row the renewal met says the attempt
    # completed: one read of the row, not a second one to ask again
    def completes_then_waits(payload: Any, ctx: Any, trace: Callable[[], None]) -> Any:
        assert store.jobs.complete(ctx.lease, "by hand") is True
        trace()
        assert ctx.signal.wait(10.0)  # the renewal found the lease gone
        assert isinstance(ctx.signal.reason, JobSettled)
        return "ignored"

    outcome, statements = _worker_settlement_traced(
        store, clock, completes_then_waits, renew=True, lease_seconds=0.3
    )
    assert outcome.outcome == "completed"
    reads = _reads_of_the_job_row(statements)
    assert len(reads) == 1, statements  # the fence row the missed renewal answered with
    assert reads[0].startswith("SELECT state, lease_token, lease_until")


# ----------------------------------------------------------------- releases


def test_release_within_hands_never_started_jobs_back(
    store: Store, clock: FakeClock, multi_row: bool
) -> None:
    store.jobs.enqueue_many([NewJob("k", n, priority=n % 2) for n in range(10)])
    before = {j.id: j for j in store.jobs.page()}
    claimed = claim_within(store, ["k"], 8, lease_seconds=60)
    assert [c.payload for c in claimed] == [1, 3, 5, 7, 9, 0, 2, 4]
    clock.advance(1)
    now = testing.now_ms(store.jobs)
    released = claimed[3:]
    assert (
        write(
            store, lambda: testing.release_within(store.jobs, [c.lease for c in released], now, "x")
        )
        == 5
    )
    for job in released:
        row = store.jobs.get(job.id)
        assert row is not None
        old = before[job.id]
        assert (row.state, row.attempts, row.run_at) == ("pending", old.attempts, old.run_at)
        assert (row.lease_until, row.lease_owner, row.lease_generation) == (
            None,
            None,
            job.lease_generation,  # kept: the released lease stays superseded
        )
        assert row.updated_at == old.updated_at + timedelta(seconds=1)
        stored = store.connection.execute(
            f"SELECT lease_token, settled_generation FROM {JOBS} WHERE id = ?", (job.id,)
        ).fetchone()
        assert stored == (None, None)
    # a released lease settles nothing
    with pytest.raises(JobSettled):
        store.jobs.complete(released[0].lease)
    # the jobs are claimable again at once, in their old places, on a new generation
    again = claim_within(store, ["k"], 10)
    assert [c.id for c in again] == [c.id for c in released] + [
        j for j in before if j not in {c.id for c in claimed}
    ]
    assert [c.payload for c in again] == [7, 9, 0, 2, 4, 6, 8]
    for old_claim, new_claim in zip(released, again[:5], strict=True):
        assert new_claim.lease_generation == old_claim.lease_generation + 1
        assert new_claim.attempts == old_claim.attempts  # no attempt was spent
        with pytest.raises(LeaseSuperseded):
            store.jobs.complete(old_claim.lease)
    for job in [*claimed[:3], *again]:
        assert store.jobs.complete(job.lease) is True


def test_release_within_skips_leases_it_no_longer_holds(
    store: Store, clock: FakeClock, multi_row: bool
) -> None:
    store.jobs.enqueue_many([NewJob("k", n, id=f"job-{n}") for n in range(7)])
    held = claim_within(store, ["k"], 2, lease_seconds=600)  # job-0, job-1
    settled = claim1(store)  # job-2
    renewed = claim1(store)  # job-3
    expired = claim1(store, lease_seconds=1)  # job-4
    superseded = claim1(store, lease_seconds=1)  # job-5
    assert store.jobs.complete(settled.lease) is True
    fresh_lease = store.jobs.renew(renewed.lease, lease_seconds=600)
    clock.advance(2)
    reclaimed = store.jobs.claim_many(["k"], owner="w2", limit=1)
    assert [c.id for c in reclaimed] == ["job-4"]  # job-4 then job-5 by claim order
    superseded_again = store.jobs.claim_many(["k"], owner="w2", limit=1)
    assert [c.id for c in superseded_again] == ["job-5"]
    expired_only = claim1(store, lease_seconds=1)  # job-6
    clock.advance(2)
    ghost = Lease("no-such-job", "t", 1, 1, "w", held[0].lease.expires_at)
    before = all_rows(store)
    now = testing.now_ms(store.jobs)
    stale = [settled.lease, renewed.lease, expired.lease, superseded.lease, expired_only.lease]
    assert write(store, lambda: testing.release_within(store.jobs, [*stale, ghost], now, "x")) == 0
    assert all_rows(store) == before  # nothing written
    mixed = [held[0].lease, *stale, held[0].lease, fresh_lease, held[1].lease, ghost]
    assert write(store, lambda: testing.release_within(store.jobs, mixed, now, "x")) == 3
    states = dict(store.connection.execute(f"SELECT id, state FROM {JOBS}").fetchall())
    assert states == {
        "job-0": "pending",
        "job-1": "pending",
        "job-2": "done",
        "job-3": "pending",
        "job-4": "leased",
        "job-5": "leased",
        "job-6": "leased",  # expired, not released: a rescue claims it
    }
    assert write(store, lambda: testing.release_within(store.jobs, [], now, "x")) == 0


# ----------------------------------------------------------------- records


def test_rows_map_to_records_equal_to_constructed_ones(store: Store) -> None:
    store.jobs.enqueue("k", {"n": 1, "text": "ü"}, id="one")
    (claimed,) = claim_within(store, ["k"], 1)
    row = store.connection.execute(
        f"SELECT {sql.JOB_COLUMNS} FROM {JOBS} WHERE id = 'one'"
    ).fetchone()
    fields = {f.name: getattr(claimed, f.name) for f in dataclasses.fields(Job)}
    assert rows.job_from_row(row) == Job(**fields)
    built = rows.claimed_from_row(row)
    assert built == ClaimedJob(**fields, lease=claimed.lease)
    assert built.lease == Lease(
        job_id="one",
        token=claimed.lease.token,
        generation=1,
        attempt=1,
        owner="w",
        expires_at=claimed.lease_until,  # type: ignore[arg-type]
    )
    assert rows.lease_from_row(row) == built.lease
    # the records behave as records: frozen, replaceable, field order kept
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.state = "done"  # type: ignore[misc]
    assert dataclasses.replace(built, state="done").state == "done"
    assert list(vars(built)) == [f.name for f in dataclasses.fields(ClaimedJob)]
    assert list(vars(built.lease)) == [f.name for f in dataclasses.fields(Lease)]
    assert "token" not in repr(built.lease)
    for cls in (Job, ClaimedJob, Lease, Outcome):  # Outcome: the worker assembles it too
        assert not hasattr(cls, "__post_init__")
        assert "__slots__" not in vars(cls)


def test_stored_json_decodes_whatever_its_spacing(store: Store) -> None:
    store.jobs.enqueue("k", id="j")
    cases = {
        "null": None,
        ' {"a": [1, 2]} ': {"a": [1, 2]},
        "\t7\n": 7,
        '"null"': "null",
        "NaN": None,  # json.loads takes it: a float nan
        "": CorruptJson,
        "{": CorruptJson,
        "1 2": CorruptJson,
        "\ufeff1": CorruptJson,
    }
    for text, want in cases.items():
        store.connection.execute(f"UPDATE {JOBS} SET payload = ? WHERE id = 'j'", (text,))
        got = store.jobs.get("j")
        assert got is not None
        if want is CorruptJson:
            assert isinstance(got.payload, CorruptJson), text
            assert got.payload.text == text
            with pytest.raises(ValueError, match=re.escape(got.payload.error)):
                json.loads(text)
        elif text == "NaN":
            assert got.payload != got.payload
        else:
            assert got.payload == want, text
    store.connection.execute(f"UPDATE {JOBS} SET payload = ? WHERE id = 'j'", (b"\x01",))
    got = store.jobs.get("j")
    assert got is not None
    assert isinstance(got.payload, CorruptJson)


def test_the_time_cache_stays_bounded(store: Store) -> None:
    store.jobs.enqueue("k", id="j")
    for offset in range(3000):
        store.connection.execute(
            f"UPDATE {JOBS} SET updated_at = ? WHERE id = 'j'", (int(START * 1000) + offset,)
        )
        got = store.jobs.get("j")
        assert got is not None
        assert round(got.updated_at.timestamp() * 1000) == int(START * 1000) + offset
    assert len(rows._TIMES) <= rows._TIMES_MAX


def test_the_batch_statements_need_what_this_sqlite_has() -> None:
    # this SQLite has UPDATE … FROM: the multi-row path must be on
    assert sqlite3.sqlite_version_info >= (3, 33, 0)
    assert sql.MULTI_ROW_UPDATES is True


# ----------------------------------------------------------------- sizes


@pytest.mark.parametrize("max_variables", [None, 40])
def test_batches_past_one_statement_split_and_pad(
    tmp_path: Path, max_variables: int | None
) -> None:
    # 300 rows take a 256-row statement and a padded 64-row one; an
    # application that lowered SQLite's parameter limit gets smaller statements
    clock = FakeClock()
    uuids = Recorder()
    conn = sqlite3.connect(tmp_path / "limited.db", isolation_level=None, check_same_thread=False)
    if max_variables is not None:
        conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, max_variables)
    store = open_store(
        connection=conn, runtime=Runtime(now=clock.now, random=lambda: 0.5, uuid=uuids.uuid)
    )
    try:
        store.jobs.enqueue_many([NewJob("k", n, id=f"job-{n:03d}") for n in range(310)])
        before = len(uuids.produced)
        claimed, statements = traced(store, lambda: claim_within(store, ["k"], 300))
        assert [c.payload for c in claimed] == list(range(300))
        assert [c.lease.token for c in claimed] == uuids.produced[before:]
        updates = [s for s in statements if s.lstrip().startswith("UPDATE")]
        # under 40 parameters: 3 shared + 8 rows of (rowid, token, claim key)
        assert len(updates) == (2 if max_variables is None else -(-300 // 8))
        now = testing.now_ms(store.jobs)
        items = [(c.lease, encode_json([c.id], "r")) for c in claimed]
        answers = write(store, lambda: testing.settle_done_many(store.jobs, items[:150], now, "x"))
        assert answers == [1] * 150
        released = write(
            store, lambda: testing.release_within(store.jobs, [c.lease for c in claimed], now, "x")
        )
        assert released == 150
        counts = store.jobs.counts()
        assert (counts.done, counts.pending, counts.leased) == (150, 160, 0)
        stored = dict(store.connection.execute(f"SELECT id, result FROM {JOBS}").fetchall())
        assert all(stored[c.id] == f'["{c.id}"]' for c in claimed[:150])
    finally:
        store.close()
        conn.close()


def test_a_small_release_runs_row_by_row_with_the_same_answers(
    store: Store, multi_row: bool
) -> None:
    store.jobs.enqueue_many([NewJob("k", n) for n in range(3)])
    first, second, third = claim_within(store, ["k"], 3)
    now = testing.now_ms(store.jobs)
    released, statements = traced(
        store,
        lambda: write(store, lambda: testing.release_within(store.jobs, [first.lease], now, "x")),
    )
    assert released == 1
    assert not any("VALUES" in s for s in statements)  # below SETTLE_MANY_MIN: one-row
    assert (
        write(
            store, lambda: testing.release_within(store.jobs, [first.lease, second.lease], now, "x")
        )
        == 1
    )
    states = [store.jobs.get(j.id).state for j in (first, second, third)]  # type: ignore[union-attr]
    assert states == ["pending", "pending", "leased"]
    assert store.jobs.get(first.id).attempts == 0  # type: ignore[union-attr]
