"""The fast paths of enqueue, enqueue_many and the root write, held to the slow ones.

``enqueue_many`` inserts with multi-row statements under a savepoint and
replays one job at a time when an id is taken; a root write may leave
``busy_timeout`` at 0 between writes (WAL only) and every read path turns it
back on. Each test compares against what one-by-one enqueues on a twin store
do, or against the configured behaviour, on real files.
"""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import threading
import time
import uuid as uuid_module
from collections.abc import Callable, Iterator
from dataclasses import FrozenInstanceError
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import (
    DuplicateJob,
    Job,
    NewJob,
    Runtime,
    StorageError,
    Store,
    open_store,
)
from jaren_jobs.codec import decode_json, encode_json
from jaren_jobs.gate import Gate
from jaren_jobs.runtime import resolve_runtime
from tests.conftest import START, FakeClock, Sequence

AWARE = datetime.fromtimestamp(START, timezone.utc)

PAST_MAX = datetime.max.replace(tzinfo=timezone(-timedelta(hours=1)))
# (NUL in a kind or id is refused, SPEC §10: see the bad items below)
HOSTILE_TEXTS = [
    'x\'); DROP TABLE "_jaren_jobs"; --',
    "\"quoted\" and 'single'",
    "?, ?, :now, @p, $v",  # parameter markers are just text
    "émoji 🚀 and ünïcode",
    "\u202eright-to-left",
    " leading and trailing ",
    "x" * 100_000,
]


def rows(db_path: Path) -> list[tuple[Any, ...]]:
    """Every job row with its rowid, in insertion order, read on a connection of its own."""
    conn = sqlite3.connect(db_path)
    try:
        return conn.execute('SELECT rowid, * FROM "_jaren_jobs" ORDER BY rowid').fetchall()
    finally:
        conn.close()


def snapshot(db_path: Path) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(db_path)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: conn.execute(f'SELECT * FROM "{t}" ORDER BY 1').fetchall() for t in tables}
    finally:
        conn.close()


class Twins:
    """Two stores on two files with identical clocks and identifiers."""

    def __init__(self, tmp_path: Path, uuid: Callable[[], Callable[[], str]] | None = None):
        self.paths = (tmp_path / "batch.db", tmp_path / "single.db")
        self.clocks = (FakeClock(), FakeClock())
        self.ids = (Sequence(), Sequence())
        self.stores: list[Store] = []
        for path, clock, ids in zip(self.paths, self.clocks, self.ids, strict=True):
            runtime = Runtime(now=clock.now, random=ids.random, uuid=uuid() if uuid else ids.uuid)
            self.stores.append(open_store(path, runtime=runtime))

    @property
    def batch(self) -> Store:
        return self.stores[0]

    @property
    def single(self) -> Store:
        return self.stores[1]

    def one_by_one(self, jobs: list[NewJob]) -> list[Job]:
        """What enqueue_many promises, spelled as one enqueue per job in one transaction."""
        with self.single.transaction() as tx:
            return [
                tx.jobs.enqueue(
                    new.kind,
                    new.payload,
                    id=new.id,
                    run_at=new.run_at,
                    delay_seconds=new.delay_seconds,
                    max_attempts=new.max_attempts,
                    priority=new.priority,
                )
                for new in jobs
            ]

    def both(self, jobs: list[NewJob]) -> tuple[Any, Any]:
        """Each store's answer: the jobs, or the error raised (type, str, details)."""
        answers = []
        for run in (lambda: self.batch.jobs.enqueue_many(jobs), lambda: self.one_by_one(jobs)):
            try:
                answers.append(run())
            except Exception as exc:
                answers.append((type(exc), str(exc), dict(getattr(exc, "details", {}))))
        return answers[0], answers[1]

    def assert_same_state(self) -> None:
        assert rows(self.paths[0]) == rows(self.paths[1])
        # the runtime's identifiers were drawn exactly as often on both
        assert self.batch.jobs.enqueue("probe").id == self.single.jobs.enqueue("probe").id

    def close(self) -> None:
        for store in self.stores:
            store.close()


@pytest.fixture
def twins(tmp_path: Path) -> Iterator[Twins]:
    pair = Twins(tmp_path)
    try:
        yield pair
    finally:
        pair.close()


def as_error(answer: Any) -> tuple[Any, str, dict[str, Any]]:
    assert isinstance(answer, tuple), f"expected an error, got {answer!r}"
    return answer


def same_refusal(batched: Any, single: Any) -> tuple[Any, str, dict[str, Any]]:
    """The batch refused as one-by-one enqueues did: same class and details, its own name."""
    kind, message, details = as_error(batched)
    single_kind, single_message, single_details = as_error(single)
    assert (kind, details) == (single_kind, single_details)
    assert single_message.replace("enqueue()", "enqueue_many()") == message
    return kind, message, details


# ----------------------------------------------------------------- batches equal one by one


def shapes() -> dict[str, list[NewJob]]:
    mixed_payloads: list[Any] = [
        None,
        0,
        -1.5,
        "text",
        True,
        [1, "two", None],
        {"n": 1, "nested": {"deep": [1, {"x": None}]}},
        {"ünï": "çødé 🚀"},
        (1, 2),  # a tuple is stored (and read back) as a JSON array
        10**30,
    ]
    return {
        "one": [NewJob("k", {"n": 1})],
        "two": [NewJob("k", 1), NewJob("k", 2)],
        "hundred": [NewJob("k", {"n": n}) for n in range(100)],
        "odd size 257": [NewJob(f"kind{n % 3}", n) for n in range(257)],
        "payloads": [NewJob("k", p) for p in mixed_payloads],
        "explicit ids": [NewJob("k", n, id=f"job-{n:03d}") for n in range(40)],
        "minted then explicit": [NewJob("k", n) for n in range(5)]
        + [NewJob("k", n, id=f"e{n}") for n in range(5)],
        "explicit then minted": [NewJob("k", id="first"), NewJob("k"), NewJob("k", id="last")],
        "options": [
            NewJob("k", priority=7),
            NewJob("k", priority=-(2**63)),
            NewJob("k", delay_seconds=2.5),
            NewJob("k", run_at=AWARE + timedelta(hours=1)),
            NewJob("k", run_at=AWARE - timedelta(days=3)),  # a past run_at runs now
            NewJob("k", max_attempts=1),
            NewJob("k", max_attempts=2**63 - 1),
        ],
    }


@pytest.mark.parametrize("shape", list(shapes()))
def test_a_batch_writes_and_answers_what_one_by_one_enqueues_do(tmp_path: Path, shape: str) -> None:
    pair = Twins(tmp_path)
    try:
        jobs = shapes()[shape]
        batched, single = pair.both(jobs)
        assert batched == single
        assert [job.kind for job in batched] == [new.kind for new in jobs]
        pair.assert_same_state()
        for job in batched:
            assert pair.batch.jobs.get(job.id) == job  # the record is what was stored
            with pytest.raises(FrozenInstanceError):
                job.state = "done"  # type: ignore[misc]
    finally:
        pair.close()


def test_enqueue_records_what_it_stored(store: Store) -> None:
    for payload in [None, 3, "s", {"a": [1, 2.5, None]}, {"k": "ü"}, [], {}]:
        job = store.jobs.enqueue("k", payload, priority=2, delay_seconds=1.5)
        assert store.jobs.get(job.id) == job
        assert job.to_dict() == store.jobs.get(job.id).to_dict()  # type: ignore[union-attr]
        assert job.run_at == AWARE + timedelta(seconds=1.5)
        assert job.created_at == job.updated_at == AWARE


# ----------------------------------------------------------------- duplicates


def test_an_id_named_twice_in_the_batch_is_refused_before_any_write(twins: Twins) -> None:
    jobs = [NewJob("k"), NewJob("k", id="x"), NewJob("k", id="y"), NewJob("k", id="x")]
    batched, single = twins.both(jobs)
    kind, message, details = as_error(batched)
    assert kind is DuplicateJob
    assert details == {"job_id": "x"}
    assert "twice" in message
    assert as_error(single)[0] is DuplicateJob
    assert rows(twins.paths[0]) == []
    # refused before the write: no identifier was drawn for the first job
    assert twins.batch.jobs.enqueue("probe").id == "id-000001"


@pytest.mark.parametrize(
    "jobs",
    [
        pytest.param([NewJob("k", id="a"), NewJob("k", id="taken"), NewJob("k")], id="middle"),
        pytest.param([NewJob("k"), NewJob("k"), NewJob("k", id="taken")], id="last-after-minted"),
        pytest.param([NewJob("k", id="taken"), NewJob("k"), NewJob("k")], id="first"),
        pytest.param(
            [
                NewJob("k", id="a"),
                NewJob("k"),
                NewJob("k", id="also-taken"),
                NewJob("k", id="taken"),
            ],
            id="two-taken-first-wins",
        ),
        pytest.param(
            [NewJob("k", n) for n in range(4_999)] + [NewJob("k", id="taken")], id="at-5000"
        ),
        pytest.param(
            [NewJob("k", id=f"n{n}") for n in range(300)] + [NewJob("k", id="also-taken")],
            id="explicit-300",
        ),
    ],
)
def test_an_existing_id_fails_the_batch_exactly_as_one_by_one_would(
    twins: Twins, jobs: list[NewJob]
) -> None:
    for store in twins.stores:
        store.jobs.enqueue("k", id="taken")
        store.jobs.enqueue("k", id="also-taken")
    before = rows(twins.paths[0])
    batched, single = twins.both(jobs)
    assert same_refusal(batched, single)[0] is DuplicateJob
    assert rows(twins.paths[0]) == before  # nothing written
    twins.assert_same_state()


def test_a_minted_id_that_collides_is_the_one_reported(tmp_path: Path) -> None:
    # a runtime that mints the same identifier again (a broken or hostile uuid())
    def repeating() -> Callable[[], str]:
        minted = iter(["u-1", "u-2", "u-1", "u-3", "u-4", "u-5", "u-6"])
        return lambda: next(minted)

    pair = Twins(tmp_path, uuid=repeating)
    try:
        jobs = [NewJob("k", 1), NewJob("k", 2), NewJob("k", 3)]
        batched, single = pair.both(jobs)
        assert same_refusal(batched, single)[2] == {"job_id": "u-1"}
        assert rows(pair.paths[0]) == []
    finally:
        pair.close()


def test_a_minted_id_equal_to_a_later_explicit_id_is_refused(twins: Twins) -> None:
    jobs = [NewJob("k", "minted"), NewJob("k", "explicit", id="id-000001")]
    batched, single = twins.both(jobs)
    assert same_refusal(batched, single)[2] == {"job_id": "id-000001"}
    assert rows(twins.paths[0]) == []


def test_a_failed_batch_inside_a_transaction_leaves_the_transaction_usable(
    store: Store, db_path: Path
) -> None:
    store.jobs.enqueue("k", id="taken")
    with store.transaction() as tx:
        tx.jobs.enqueue("k", id="kept")
        with pytest.raises(DuplicateJob):
            tx.jobs.enqueue_many([NewJob("k", n) for n in range(50)] + [NewJob("k", id="taken")])
        tx.jobs.enqueue_many([NewJob("k", id="after")])
    assert sorted(row[1] for row in rows(db_path)) == ["after", "kept", "taken"]


# ----------------------------------------------------------------- statement sizes


def test_a_batch_far_larger_than_one_statement_goes_in_whole_and_in_order(
    store: Store, db_path: Path
) -> None:
    jobs = store.jobs.enqueue_many([NewJob("k", {"n": n}) for n in range(5_000)])
    assert [job.payload["n"] for job in jobs] == list(range(5_000))
    stored = rows(db_path)
    assert [row[1] for row in stored] == [job.id for job in jobs]  # rowid order = batch order
    assert len({job.id for job in jobs}) == 5_000
    assert store.jobs.counts().pending == 5_000


@pytest.mark.parametrize("limit", [999, 20, 8])
def test_a_low_variable_limit_shrinks_the_statements_not_the_batch(
    tmp_path: Path, runtime: Runtime, limit: int
) -> None:
    path = tmp_path / "limited.db"
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, limit)
    try:
        with open_store(connection=conn, runtime=runtime) as store:
            jobs = store.jobs.enqueue_many([NewJob("k", n) for n in range(1_000)])
            assert [job.payload for job in jobs] == list(range(1_000))
            assert [row[1] for row in rows(path)] == [job.id for job in jobs]
            taken = jobs[7].id
            with pytest.raises(DuplicateJob) as info:
                store.jobs.enqueue_many(
                    [NewJob("k", n) for n in range(300)] + [NewJob("k", id=taken)]
                )
            assert info.value.details["job_id"] == taken
            assert store.jobs.counts().pending == 1_000
    finally:
        conn.close()


# ----------------------------------------------------------------- hostile input


@pytest.mark.parametrize("text", HOSTILE_TEXTS, ids=range(len(HOSTILE_TEXTS)))
def test_hostile_ids_and_kinds_round_trip_in_batches_and_alone(tmp_path: Path, text: str) -> None:
    pair = Twins(tmp_path)
    try:
        jobs = [
            NewJob(text, {text: text}, id=text),
            NewJob(text, text),
            NewJob("plain", [text], id=text + "#2"),
        ]
        batched, single = pair.both(jobs)
        assert batched == single
        assert batched[0].id == text
        assert batched[0].kind == text
        assert batched[0].payload == {text: text}
        assert pair.batch.jobs.get(text) == batched[0]
        assert pair.batch.jobs.counts().pending_kinds == {text: 2, "plain": 1}
        pair.assert_same_state()
    finally:
        pair.close()


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (NewJob("k", {"a": {1, 2}}), TypeError),  # a set
        (NewJob("k", {1: "int key"}), TypeError),
        (NewJob("k", b"bytes"), TypeError),
        (NewJob("k", [1.0, float("nan")]), ValueError),
        (NewJob("k", {"x": float("inf")}), ValueError),
        (NewJob("k", "lone \ud800 surrogate"), ValueError),
        (NewJob("k\udc00"), ValueError),
        (NewJob(""), ValueError),
        (NewJob(7), TypeError),  # type: ignore[arg-type]
        (NewJob("k", id=""), ValueError),
        (NewJob("k", id="bad \udfff"), ValueError),
        (NewJob("nul\x00inside"), ValueError),
        (NewJob("k", id="nul\x00inside"), ValueError),
        (NewJob("k", run_at=PAST_MAX), ValueError),  # later than any UTC datetime
        (NewJob("k", id=5), TypeError),  # type: ignore[arg-type]
        (NewJob("k", priority=True), TypeError),
        (NewJob("k", priority=2**63), ValueError),
        (NewJob("k", max_attempts=0), ValueError),
        (NewJob("k", delay_seconds=-1), ValueError),
        (NewJob("k", delay_seconds=1, run_at=AWARE), ValueError),
        (NewJob("k", run_at=datetime(2027, 1, 1)), ValueError),  # naive
    ],
)
def test_one_bad_item_in_the_middle_writes_nothing(
    store: Store, db_path: Path, bad: NewJob, error: type[Exception]
) -> None:
    store.jobs.enqueue("k", id="before")
    before = snapshot(db_path)
    batch = [NewJob("k", {"n": n}) for n in range(50)] + [bad] + [NewJob("k") for _ in range(50)]
    with pytest.raises(error) as info:
        store.jobs.enqueue_many(batch)
    assert "item 50" in str(info.value)
    assert snapshot(db_path) == before
    # refused before the write: no identifier was drawn
    assert store.jobs.enqueue("k").id == "id-000001"


def test_bad_input_alone_is_refused_with_the_same_messages(store: Store, db_path: Path) -> None:
    cases: list[tuple[Callable[[], Any], type[Exception], str]] = [
        (
            lambda: store.jobs.enqueue("k", {"a": {1}}),
            TypeError,
            "enqueue(): payload holds a set at $.a",
        ),
        (lambda: store.jobs.enqueue("k", float("nan")), ValueError, "enqueue(): payload holds nan"),
        (lambda: store.jobs.enqueue("k", "\ud800"), ValueError, "enqueue(): payload at $ is not"),
        (lambda: store.jobs.enqueue(""), ValueError, "enqueue(): kind must be a non-empty"),
        (lambda: store.jobs.enqueue(None), TypeError, "enqueue(): kind must be a non-empty str"),  # type: ignore[arg-type]
        (lambda: store.jobs.enqueue("k", id="\ud800"), ValueError, "enqueue(): id is not valid"),
    ]
    for call, error, start in cases:
        with pytest.raises(error) as info:
            call()
        assert str(info.value).startswith(start), str(info.value)
    assert snapshot(db_path)["_jaren_jobs"] == []


# ----------------------------------------------------------------- JSON and identifiers


@pytest.mark.parametrize(
    "value",
    [
        None,
        0,
        -7,
        2.5,
        -0.0,
        1e300,
        "ü",
        "",
        True,
        [],
        {},
        [1, [2, [3]]],
        {"a": {"b": [None]}},
        {"x": 'quote " and \\ backslash'},
        [0.1, 10**40],
        "\u2028",
    ],
)
def test_encode_json_writes_what_json_dumps_writes(value: Any) -> None:
    expected = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    assert encode_json(value, "x") == expected
    assert decode_json(expected) == json.loads(expected)


@pytest.mark.parametrize(
    "text", [" 1", "1 ", "\ufeff1", "{} x", "", "nul", "[1,]", '"abc', "1e999", "[1] [2]", "\n{}\n"]
)
def test_decode_json_answers_or_raises_as_json_loads_does(text: str) -> None:
    try:
        expected: Any = json.loads(text)
    except ValueError as exc:
        expected = exc
    if isinstance(expected, ValueError):
        with pytest.raises(ValueError) as info:
            decode_json(text)
        assert str(info.value) == str(expected)
    else:
        assert decode_json(text) == expected


def test_platform_identifiers_are_random_uuid4s() -> None:
    runtime = resolve_runtime(None)
    minted = [runtime.uuid() for _ in range(2_000)] + runtime.uuids(2_000) + runtime.uuids(1)
    for text in minted:
        parsed = uuid_module.UUID(text)
        assert parsed.version == 4
        assert parsed.variant == uuid_module.RFC_4122
        assert str(parsed) == text
    assert len(set(minted)) == len(minted)
    assert runtime.uuids(0) == []


def test_injected_identifiers_are_drawn_one_call_each(ids: Sequence, runtime: Runtime) -> None:
    resolved = resolve_runtime(runtime)
    assert resolved.uuids(3) == ["id-000001", "id-000002", "id-000003"]
    assert ids.uuid() == "id-000004"


# ----------------------------------------------------------------- locks and busy_timeout


def hold_write_lock(db_path: str, locked: Any, release: Any) -> None:
    """Another process's write in progress: BEGIN IMMEDIATE and an uncommitted row."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            'INSERT INTO "_jaren_jobs" (id, kind, payload, state, run_at, max_attempts, '
            "created_at, updated_at) VALUES ('uncommitted', 'k', 'null', 'pending', 0, 5, 0, 0)"
        )
        locked.set()
        release.wait(60)
        conn.execute("ROLLBACK")
    finally:
        conn.close()


@pytest.fixture
def locked_by_another_process(db_path: Path) -> Iterator[Callable[[], None]]:
    """The store's file, write-locked by another process until the callable releases it."""
    open_store(db_path).close()
    ctx = multiprocessing.get_context("spawn")
    locked, release = ctx.Event(), ctx.Event()
    process = ctx.Process(target=hold_write_lock, args=(str(db_path), locked, release))
    process.start()
    try:
        assert locked.wait(30), "the other process never took the write lock"
        yield release.set
    finally:
        release.set()
        process.join(30)
    assert process.exitcode == 0


def test_a_locked_database_is_the_librarys_error_after_busy_timeout(
    db_path: Path, runtime: Runtime, locked_by_another_process: Callable[[], None]
) -> None:
    with open_store(db_path, runtime=runtime, busy_timeout_seconds=0.3) as store:
        before = snapshot(db_path)
        for attempt in (
            lambda: store.jobs.enqueue("k", id="single"),
            lambda: store.jobs.enqueue_many([NewJob("k", n) for n in range(20)]),
            lambda: store.jobs.enqueue_many([NewJob("k", id="one")]),
        ):
            started = time.monotonic()
            with pytest.raises(StorageError) as info:
                attempt()
            waited = time.monotonic() - started
            assert info.value.code == "JD2099"
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)
            assert "busy_timeout" in str(info.value)
            assert 0.25 <= waited < 5, waited
        # reads go on during the other process's write, and do not see it
        assert store.jobs.get("uncommitted") is None
        assert store.jobs.counts().pending == 0
        assert list(store.jobs.page()) == []
        locked_by_another_process()
        # the lock released: writes go through, and the failed ones left nothing
        assert snapshot(db_path) == before
        assert store.jobs.enqueue("k", id="single").id == "single"
        assert len(store.jobs.enqueue_many([NewJob("k", n) for n in range(20)])) == 20


def test_a_write_waits_out_a_short_lock_and_succeeds(
    db_path: Path, runtime: Runtime, locked_by_another_process: Callable[[], None]
) -> None:
    with open_store(db_path, runtime=runtime, busy_timeout_seconds=10) as store:
        store.jobs.get("warm")  # a read first: busy_timeout is on
        releaser = threading.Timer(0.3, locked_by_another_process)
        releaser.start()
        try:
            started = time.monotonic()
            job = store.jobs.enqueue("k", id="waited")
            assert time.monotonic() - started >= 0.2
        finally:
            releaser.join()
        assert store.jobs.get("waited") == job
        assert store.jobs.get("uncommitted") is None  # the other write rolled back


class Statements:
    """Every statement the store's connection runs (sqlite3's trace callback)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.seen: list[str] = []
        conn.set_trace_callback(self.seen.append)

    def take(self) -> list[str]:
        seen = list(self.seen)
        self.seen.clear()  # the callback holds this list
        return seen


def busy_pragmas(statements: list[str]) -> list[str]:
    return [s for s in statements if s.upper().startswith("PRAGMA BUSY_TIMEOUT")]


def test_back_to_back_writes_set_no_pragma_and_a_read_restores_busy_timeout(
    db_path: Path, runtime: Runtime
) -> None:
    with open_store(db_path, runtime=runtime, busy_timeout_seconds=4.0) as store:
        conn = store.connection
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 4000
        trace = Statements(conn)
        store.jobs.enqueue("k", id="a")
        assert busy_pragmas(trace.take()) == ["PRAGMA busy_timeout = 0"]
        store.jobs.enqueue("k", id="b")
        store.jobs.enqueue_many([NewJob("k", n) for n in range(10)])
        claimed = store.jobs.claim(["k"], owner="w")
        assert claimed is not None
        assert store.jobs.complete(claimed.lease) is True
        assert busy_pragmas(trace.take()) == []  # writes only: the lock is polled at 0
        assert store.jobs.get("a") is not None
        statements = trace.take()
        # the read turned busy_timeout back on before it read anything
        assert busy_pragmas(statements) == ["PRAGMA busy_timeout = 4000"]
        assert statements[0] == "PRAGMA busy_timeout = 4000"
        store.jobs.counts()
        assert list(store.jobs.page(limit=2))
        assert busy_pragmas(trace.take()) == []  # reads only: already on
        # a cursor pull after a write (its statement opened before it) turns it on too
        with store.jobs.page(limit=5) as jobs:
            next(jobs)
            store.jobs.enqueue("k", id="between")
            trace.take()
            next(jobs)
            assert trace.take()[0] == "PRAGMA busy_timeout = 4000"
        store.jobs.enqueue("k", id="c")
        # the application's own SQL runs with the busy_timeout it was given
        with store.transaction() as tx:
            assert tx.execute("PRAGMA busy_timeout").fetchone()[0] == 4000
            tx.jobs.enqueue("k", id="in-tx")
        store.jobs.enqueue("k", id="d")
        # and the connection handed out says so too
        assert store.connection.execute("PRAGMA busy_timeout").fetchone()[0] == 4000


def test_an_applications_connection_keeps_its_busy_timeout_between_calls(
    db_path: Path, runtime: Runtime
) -> None:
    conn = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    try:
        with open_store(connection=conn, runtime=runtime, busy_timeout_seconds=2.5) as store:
            store.jobs.enqueue("k")
            store.jobs.enqueue_many([NewJob("k", n) for n in range(5)])
            claimed = store.jobs.claim(["k"], owner="w")
            assert claimed is not None
            store.jobs.complete(claimed.lease)
            # read on the raw connection, not through the store
            assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 2500
    finally:
        conn.close()


def test_a_store_on_memory_still_writes_and_reads(runtime: Runtime) -> None:
    with open_store(":memory:", runtime=runtime) as store:
        jobs = store.jobs.enqueue_many([NewJob("k", n) for n in range(300)])
        assert store.jobs.get(jobs[-1].id) == jobs[-1]
        assert store.jobs.counts().pending == 300


def test_handing_out_the_connection_never_waits_for_the_gate(store: Store) -> None:
    store.jobs.enqueue("k")  # a write: busy_timeout left at 0
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with store.transaction():
            inside.set()
            leave.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert inside.wait(10)
        started = time.monotonic()
        assert store.connection is not None
        assert time.monotonic() - started < 1  # not the 30 s gate timeout
    finally:
        leave.set()
        holder.join(10)
    assert store.connection.execute("PRAGMA busy_timeout").fetchone()[0] == 5000


def test_try_acquire_takes_only_a_free_gate() -> None:
    gate = Gate(1.0)
    assert gate.try_acquire() is True
    assert gate.try_acquire() is False  # held, even by this very thread
    taken: list[bool] = []
    other = threading.Thread(target=lambda: taken.append(gate.try_acquire()))
    other.start()
    other.join(10)
    assert taken == [False]
    gate.release()
    assert gate.try_acquire() is True
    gate.release()
    gate.close()
    assert gate.try_acquire() is False
