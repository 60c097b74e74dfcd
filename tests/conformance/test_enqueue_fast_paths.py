"""The fast paths of enqueue and enqueue_many, held to the slow ones.

``enqueue_many`` inserts with multi-row statements under a savepoint and
replays one job at a time when an id is taken. Each test compares against
what one-by-one enqueues on a twin store do, or against the configured
behaviour. The SQLite side (statement sizes under a low variable limit, the
root write's busy_timeout) is in tests/backends/sqlite/test_enqueue_fast_paths.py.
"""

from __future__ import annotations

import json
import uuid as uuid_module
from collections.abc import Callable, Iterator
from dataclasses import FrozenInstanceError
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from jaren_jobs import (
    DuplicateJob,
    Job,
    NewJob,
    Runtime,
    Store,
)
from jaren_jobs.codec import decode_json, encode_json
from jaren_jobs.runtime import resolve_runtime
from tests.conftest import START, FakeClock, Sequence
from tests.harness import Harness

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


class Twins:
    """Two stores on two databases with identical clocks and identifiers."""

    def __init__(self, backend: Harness, uuid: Callable[[], Callable[[], str]] | None = None):
        self.backends = (backend, backend.sibling("single"))
        self.clocks = (FakeClock(), FakeClock())
        self.ids = (Sequence(), Sequence())
        self.stores: list[Store] = []
        for harness, clock, ids in zip(self.backends, self.clocks, self.ids, strict=True):
            runtime = Runtime(now=clock.now, random=ids.random, uuid=uuid() if uuid else ids.uuid)
            self.stores.append(harness.open(runtime=runtime))

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
        assert self.backends[0].job_rows() == self.backends[1].job_rows()
        # the runtime's identifiers were drawn exactly as often on both
        assert self.batch.jobs.enqueue("probe").id == self.single.jobs.enqueue("probe").id

    def close(self) -> None:
        for store in self.stores:
            store.close()


@pytest.fixture
def twins(backend: Harness) -> Iterator[Twins]:
    pair = Twins(backend)
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
def test_a_batch_writes_and_answers_what_one_by_one_enqueues_do(
    backend: Harness, shape: str
) -> None:
    pair = Twins(backend)
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
    assert twins.backends[0].job_rows() == []
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
    before = twins.backends[0].job_rows()
    batched, single = twins.both(jobs)
    assert same_refusal(batched, single)[0] is DuplicateJob
    assert twins.backends[0].job_rows() == before  # nothing written
    twins.assert_same_state()


def test_a_minted_id_that_collides_is_the_one_reported(backend: Harness) -> None:
    # a runtime that mints the same identifier again (a broken or hostile uuid())
    def repeating() -> Callable[[], str]:
        minted = iter(["u-1", "u-2", "u-1", "u-3", "u-4", "u-5", "u-6"])
        return lambda: next(minted)

    pair = Twins(backend, uuid=repeating)
    try:
        jobs = [NewJob("k", 1), NewJob("k", 2), NewJob("k", 3)]
        batched, single = pair.both(jobs)
        assert same_refusal(batched, single)[2] == {"job_id": "u-1"}
        assert pair.backends[0].job_rows() == []
    finally:
        pair.close()


def test_a_minted_id_equal_to_a_later_explicit_id_is_refused(twins: Twins) -> None:
    jobs = [NewJob("k", "minted"), NewJob("k", "explicit", id="id-000001")]
    batched, single = twins.both(jobs)
    assert same_refusal(batched, single)[2] == {"job_id": "id-000001"}
    assert twins.backends[0].job_rows() == []


def test_a_failed_batch_inside_a_transaction_leaves_the_transaction_usable(
    store: Store, backend: Harness
) -> None:
    store.jobs.enqueue("k", id="taken")
    with store.transaction() as tx:
        tx.jobs.enqueue("k", id="kept")
        with pytest.raises(DuplicateJob):
            tx.jobs.enqueue_many([NewJob("k", n) for n in range(50)] + [NewJob("k", id="taken")])
        tx.jobs.enqueue_many([NewJob("k", id="after")])
    assert sorted(row[1] for row in backend.job_rows()) == ["after", "kept", "taken"]


# ----------------------------------------------------------------- statement sizes


def test_a_batch_far_larger_than_one_statement_goes_in_whole_and_in_order(
    store: Store, backend: Harness
) -> None:
    jobs = store.jobs.enqueue_many([NewJob("k", {"n": n}) for n in range(5_000)])
    assert [job.payload["n"] for job in jobs] == list(range(5_000))
    stored = backend.job_rows()
    assert [row[1] for row in stored] == [job.id for job in jobs]  # rowid order = batch order
    assert len({job.id for job in jobs}) == 5_000
    assert store.jobs.counts().pending == 5_000


# ----------------------------------------------------------------- hostile input


@pytest.mark.parametrize("text", HOSTILE_TEXTS, ids=range(len(HOSTILE_TEXTS)))
def test_hostile_ids_and_kinds_round_trip_in_batches_and_alone(backend: Harness, text: str) -> None:
    pair = Twins(backend)
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
    store: Store, backend: Harness, bad: NewJob, error: type[Exception]
) -> None:
    store.jobs.enqueue("k", id="before")
    before = backend.snapshot()
    batch = [NewJob("k", {"n": n}) for n in range(50)] + [bad] + [NewJob("k") for _ in range(50)]
    with pytest.raises(error) as info:
        store.jobs.enqueue_many(batch)
    assert "item 50" in str(info.value)
    assert backend.snapshot() == before
    # refused before the write: no identifier was drawn
    assert store.jobs.enqueue("k").id == "id-000001"


def test_bad_input_alone_is_refused_with_the_same_messages(store: Store, backend: Harness) -> None:
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
    assert backend.snapshot()["_jaren_jobs"] == []


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
