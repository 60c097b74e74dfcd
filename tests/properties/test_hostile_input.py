"""Hostile input, property-tested: what JSON can carry round-trips exactly, the rest is refused.

* any JSON value round-trips exactly (types, float signs, key order) through
  ``enqueue`` → ``get``/``claim`` and through ``complete`` → ``result``;
* a value JSON cannot carry, hidden anywhere inside an otherwise valid
  payload or result (NaN, infinities, sets, bytes, objects, non-``str`` keys,
  lone surrogates in strings and keys, 100,000-deep nesting), is
  ``TypeError`` / ``ValueError`` with nothing written (for a result, text
  that cannot be encoded is ``ValueError``, the rest ``TypeError``), and a
  worker whose handler returns one fails the attempt;
* an error text of any shape (lone surrogates anywhere, an unprintable or
  deeply nested error) is recorded, escaped, and never wedges its job;
* a stored payload or result another program left unreadable (bytes that
  are not UTF-8, JSON nested past the decoder's recursion limit) reads as a
  ``CorruptJson`` marker through ``get``, ``page`` and claims;
* kinds, ids and owners made of quotes, emoji, wildcards and SQL fragments
  are stored and matched literally; one holding NUL is ``ValueError``;
* lease tokens never leak into records, log lines or outcome events.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import sqlite3
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaren_jobs import (
    CorruptJson,
    JobContext,
    LeaseSuperseded,
    NewJob,
    Outcome,
    Runtime,
    Store,
    open_store,
)
from jaren_jobs.codec import MAX_DEPTH
from jaren_jobs.jobs import engine_of
from tests.conftest import FakeClock, Sequence

# ------------------------------------------------------------------ strategies

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()  # Hypothesis text never holds a lone surrogate
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)


def lone_surrogate(prefix: str, code: int, suffix: str) -> str:
    return prefix + chr(code) + suffix


surrogate_text = st.builds(
    lone_surrogate, st.text(max_size=3), st.integers(0xD800, 0xDFFF), st.text(max_size=3)
)


class Opaque:
    """An object JSON knows nothing about."""


# (a value JSON cannot carry, the error it must raise as a payload, ... as a result):
# a value JSON cannot hold is a ValueError in a payload and a TypeError in a
# result (SPEC §3); text that cannot be encoded is a ValueError in both (§13)
Poison = tuple[Any, type[Exception], type[Exception]]
poisons: st.SearchStrategy[Poison] = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf]).map(lambda v: (v, ValueError, TypeError)),
    surrogate_text.map(lambda v: (v, ValueError, ValueError)),
    surrogate_text.map(lambda k: ({k: 1}, ValueError, ValueError)),
    st.sets(st.integers(), max_size=3).map(lambda v: (v, TypeError, TypeError)),
    st.frozensets(st.integers(), max_size=3).map(lambda v: (v, TypeError, TypeError)),
    st.binary(max_size=8).map(lambda v: (v, TypeError, TypeError)),
    st.binary(max_size=8).map(lambda v: (bytearray(v), TypeError, TypeError)),
    st.builds(Opaque).map(lambda v: (v, TypeError, TypeError)),
    st.just((object(), TypeError, TypeError)),
    st.just((1 + 2j, TypeError, TypeError)),
    st.tuples(st.integers(), st.integers()).map(lambda k: ({k: "tuple key"}, TypeError, TypeError)),
    st.integers().map(lambda k: ({k: "int key"}, TypeError, TypeError)),
    st.just(({None: "None key"}, TypeError, TypeError)),
    st.just(({1.5: "float key"}, TypeError, TypeError)),
)


def _in_list(before: list[Any], poison: Any, after: list[Any]) -> list[Any]:
    return [*before, poison, *after]


def _in_dict(siblings: dict[str, Any], key: str, poison: Any) -> dict[str, Any]:
    out = {k: v for k, v in siblings.items() if k != key}
    out[key] = poison
    return out


def hide(poison: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Bury one poison somewhere inside an otherwise valid JSON document."""
    return st.recursive(
        poison,
        lambda inner: st.builds(
            _in_list, st.lists(json_values, max_size=2), inner, st.lists(json_values, max_size=2)
        )
        | st.builds(
            _in_dict, st.dictionaries(st.text(max_size=4), json_values, max_size=2),
            st.text(max_size=4), inner,
        ),
        max_leaves=6,
    )  # fmt: skip


@st.composite
def hidden_poisons(draw: st.DrawFn) -> Poison:
    value, error, result_error = draw(poisons)
    return draw(hide(st.just(value))), error, result_error


# identifiers built from what breaks naive SQL, LIKE patterns, C strings and terminals
FRAGMENTS = [
    "'", '"', "`", "\\", ";", "--", "/*", "*/", "%", "_", "*", "?", "[", "]",
    "'; DROP TABLE _jaren_jobs; --", '" OR 1=1 --', "') OR ('1'='1", "\x1f", "\n", "\r\t",
    " ", "😀", "👩\u200d💻", "é", "e\u0301", "\u202e", "\ufeff", "Ω", "a", "A", "0",
]  # fmt: skip
# NUL is refused in a kind, id or owner (SPEC §10): it is tested on its own below
identifiers = st.lists(
    st.sampled_from(FRAGMENTS)
    | st.text(
        st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), min_size=1, max_size=3
    ),
    min_size=1,
    max_size=4,
).map("".join)

# ------------------------------------------------------------------ helpers

_files = itertools.count()
_names = itertools.count()


def open_fresh(directory: Path) -> Store:
    clock = FakeClock()
    seq = Sequence()
    return open_store(
        directory / f"hostile-{next(_files)}.db",
        runtime=Runtime(now=clock.now, random=seq.random, uuid=seq.uuid),
    )


def same(a: Any, b: Any) -> bool:
    """Exact JSON equality: types (``1`` is not ``1.0`` is not ``True``), float signs, key order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def test_same_is_strict() -> None:
    assert same({"a": [1, 2.5, None]}, {"a": [1, 2.5, None]})
    assert not same(1, 1.0)
    assert not same(1, True)
    assert not same(0.0, -0.0)
    assert not same({"a": 1, "b": 2}, {"b": 2, "a": 1})
    assert not same([1], [1, 1])


def rows_in(store: Store) -> int:
    with store.transaction() as tx:
        return int(tx.execute('SELECT COUNT(*) FROM "_jaren_jobs"').fetchone()[0])


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    store = open_fresh(tmp_path_factory.mktemp("hostile"))
    try:
        yield store
    finally:
        store.close()


PROPERTY = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# ------------------------------------------------------------------ round trips


@PROPERTY
@given(payload=json_values, result=json_values)
def test_any_json_value_round_trips_exactly(shared: Store, payload: Any, result: Any) -> None:
    kind = f"round-trip-{next(_names)}"  # this example's own kind: its claim finds its job
    job = shared.jobs.enqueue(kind, payload)
    assert same(job.payload, payload)
    fetched = shared.jobs.get(job.id)
    assert fetched is not None
    assert same(fetched.payload, payload)
    [batched] = shared.jobs.enqueue_many([NewJob(kind + "-batch", payload)])
    assert same(batched.payload, payload)

    claimed = shared.jobs.claim([kind], owner="w")
    assert claimed is not None
    assert claimed.id == job.id
    assert same(claimed.payload, payload)
    assert shared.jobs.complete(claimed.lease, result) is True
    done = shared.jobs.get(job.id)
    assert done is not None
    assert done.state == "done"
    assert same(done.result, result)
    assert same(done.payload, payload)
    # and the JSON form of the record carries both unchanged
    assert same(json.loads(json.dumps(done.to_dict()))["result"], result)


def nested(depth: int, leaf: Any, *, as_dict: bool = False) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"k": value} if as_dict else [value]
    return value


def test_deep_but_reasonable_nesting_round_trips(shared: Store) -> None:
    for payload in (nested(200, "leaf"), nested(200, 7, as_dict=True)):
        job = shared.jobs.enqueue("deep", payload)
        fetched = shared.jobs.get(job.id)
        assert fetched is not None
        assert fetched.payload == payload


# ------------------------------------------------------------------ refusals


@PROPERTY
@given(hidden=hidden_poisons(), good=json_values)
def test_a_value_json_cannot_carry_is_refused_with_nothing_written(
    shared: Store, hidden: Poison, good: Any
) -> None:
    payload, error, result_error = hidden
    n = next(_names)
    before = rows_in(shared)

    with pytest.raises(error):
        shared.jobs.enqueue("poisoned", payload, id=f"poisoned-{n}")
    with pytest.raises(error):
        shared.jobs.enqueue_many(
            [NewJob("poisoned", good, id=f"fine-{n}"), NewJob("poisoned", payload, id=f"bad-{n}")]
        )
    with pytest.raises(error), shared.transaction() as tx:  # noqa: PT012 - the whole transaction
        tx.jobs.enqueue("poisoned", good, id=f"tx-fine-{n}")
        tx.jobs.enqueue("poisoned", payload, id=f"tx-bad-{n}")
    for job_id in (f"poisoned-{n}", f"fine-{n}", f"bad-{n}", f"tx-fine-{n}", f"tx-bad-{n}"):
        assert shared.jobs.get(job_id) is None
    assert rows_in(shared) == before

    # a result JSON cannot carry is refused, and the job stays leased under the same lease
    kind = f"result-{n}"
    shared.jobs.enqueue(kind, good, id=f"result-{n}")
    claimed = shared.jobs.claim([kind], owner="w")
    assert claimed is not None
    held = shared.jobs.get(claimed.id)
    with pytest.raises(result_error) as info:
        shared.jobs.complete(claimed.lease, payload)
    assert type(info.value) is result_error
    assert shared.jobs.get(claimed.id) == held
    assert shared.jobs.complete(claimed.lease, good) is True

    # a handler returning it fails its attempt (dead-lettered: max_attempts=1), never wedged
    shared.jobs.enqueue(kind, good, id=f"handled-{n}", max_attempts=1)
    worker = shared.jobs.create_worker({kind: lambda value, ctx: payload})
    try:
        assert worker.run_once() is True
    finally:
        worker.stop()
    handled = shared.jobs.get(f"handled-{n}")
    assert handled is not None
    assert (handled.state, handled.result, handled.lease_until) == ("dead", None, None)
    assert handled.last_error is not None
    assert handled.last_error.startswith(result_error.__name__ + ": complete(): result")


@pytest.mark.parametrize("as_dict", [False, True], ids=["lists", "dicts"])
def test_nesting_a_hundred_thousand_deep_is_refused_not_a_crash(
    shared: Store, as_dict: bool
) -> None:
    payload = nested(100_000, "bottom", as_dict=as_dict)
    before = rows_in(shared)
    with pytest.raises(ValueError, match="nested more than"):
        shared.jobs.enqueue("deep", payload, id=f"too-deep-{as_dict}")
    assert shared.jobs.get(f"too-deep-{as_dict}") is None
    assert rows_in(shared) == before

    shared.jobs.enqueue("deep-result", id=f"deep-result-{as_dict}")
    claimed = shared.jobs.claim(["deep-result"], owner="w")
    assert claimed is not None
    with pytest.raises(TypeError, match="nested more than"):
        shared.jobs.complete(claimed.lease, payload)
    assert shared.jobs.complete(claimed.lease, "shallow") is True


@pytest.mark.parametrize(
    ("field", "value"),
    [("kind", "bad\ud800kind"), ("id", "\udfffid"), ("owner", "own\udbffer")],
)
def test_a_lone_surrogate_in_an_identifier_is_refused(
    shared: Store, field: str, value: str
) -> None:
    calls = {
        "kind": lambda: shared.jobs.enqueue(value),
        "id": lambda: shared.jobs.enqueue("k", id=value),
        "owner": lambda: shared.jobs.claim(["k"], owner=value),
    }
    before = rows_in(shared)
    with pytest.raises(ValueError, match="not valid Unicode"):
        calls[field]()
    assert rows_in(shared) == before


# ------------------------------------------------------------------ error texts


def escaped(text: str) -> str:
    """What a stored text keeps of ``text``: lone surrogates as backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class Described(Exception):
    """An exception whose message is whatever the example drew."""


class ReprOnly:
    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


hostile_texts = st.one_of(st.text(max_size=20), surrogate_text, hide(surrogate_text).map(repr))


@st.composite
def error_objects(draw: st.DrawFn) -> tuple[object, str | None]:
    """Something a handler raised or passed to fail(), and the text last_error must hold
    (``None``: any storable text, for a description that cannot be computed)."""
    text = draw(hostile_texts)
    shape = draw(st.sampled_from(["str", "exception", "repr", "deep", "deep-exception"]))
    if shape == "str":
        return text, escaped(text)
    if shape == "exception":
        return Described(text), escaped(f"Described: {text}" if text else "Described")
    if shape == "repr":
        return ReprOnly(text), escaped(text)
    depth = draw(st.sampled_from([MAX_DEPTH + 1, 999, 1_001, 5_000, 100_000]))
    deep = nested(depth, text, as_dict=draw(st.booleans()))
    return (deep, None) if shape == "deep" else (Described(deep), None)


@PROPERTY
@given(error=error_objects(), retry=st.booleans())
def test_any_error_text_is_recorded_escaped_and_never_wedges_its_job(
    shared: Store, error: tuple[object, str | None], retry: bool
) -> None:
    value, expected = error
    n = next(_names)
    kind = f"error-{n}"
    shared.jobs.enqueue(kind, id=f"error-{n}", max_attempts=2)
    claimed = shared.jobs.claim([kind], owner="w")
    assert claimed is not None
    assert shared.jobs.fail(claimed.lease, value, retry=retry) is True
    failed = shared.jobs.get(claimed.id)
    assert failed is not None
    assert failed.state == ("failed" if retry else "dead")
    assert failed.last_error is not None
    failed.last_error.encode("utf-8")
    if expected is not None:
        assert failed.last_error == expected

    # the same error raised by a handler: recorded the same way, and dead-lettered
    shared.jobs.enqueue(kind, id=f"raised-{n}", max_attempts=1)
    outcomes: list[Outcome] = []

    def handler(payload: Any, ctx: JobContext) -> Any:
        raise value if isinstance(value, Exception) else Described(value)

    worker = shared.jobs.create_worker({kind: handler}, on_outcome=outcomes.append)
    try:
        assert worker.run_once() is True
    finally:
        worker.stop()
    raised = shared.jobs.get(f"raised-{n}")
    assert raised is not None
    assert (raised.state, raised.lease_until) == ("dead", None)
    assert raised.last_error is not None
    raised.last_error.encode("utf-8")
    assert [o.outcome for o in outcomes] == ["failed"]
    assert outcomes[0].reason == raised.last_error


@settings(PROPERTY, max_examples=60)
@given(texts=st.lists(st.tuples(hostile_texts, st.booleans()), min_size=2, max_size=6))
def test_error_texts_never_fail_the_group_commit_they_share(
    shared: Store, texts: list[tuple[str, bool]]
) -> None:
    """Failures with any error text and completions, settled in one transaction: none of
    them makes the batch roll back and replay one by one."""
    from jaren_jobs.core.settle import SettleBatch
    from jaren_jobs.engine.group_commit import SettlementBatcher

    kind = f"group-{next(_names)}"
    shared.jobs.enqueue_many(NewJob(kind, max_attempts=1) for _ in texts)
    claims = shared.jobs.claim_many([kind], owner="w", limit=len(texts))
    assert len(claims) == len(texts)
    batcher = SettlementBatcher(engine_of(shared.jobs))
    group = []
    for claimed, (text, failing) in zip(claims, texts, strict=True):
        if failing:
            group.append(batcher.failure(claimed.lease, text))
            continue
        if escaped(text) != text:  # a result that cannot be encoded never queues
            with pytest.raises(ValueError):
                batcher.completion(claimed.lease, {"text": text})
        group.append(batcher.completion(claimed.lease, {"n": len(group)}))
    settled = batcher.submit(SettleBatch(tuple(group)))
    assert [settled.result(n) for n in range(len(group))] == [True] * len(texts)
    assert (batcher.batches, batcher.retried_alone) == (1, 0)
    for n, (claimed, (text, failing)) in enumerate(zip(claims, texts, strict=True)):
        job = shared.jobs.get(claimed.id)
        assert job is not None
        if failing:
            assert (job.state, job.last_error) == ("dead", escaped(text))
        else:
            assert (job.state, job.result) == ("done", {"n": n})


# ------------------------------------------------------------------ rows another program wrote

not_utf8 = st.binary(min_size=1, max_size=24).filter(lambda raw: not _decodes(raw))


def _decodes(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@st.composite
def unreadable_texts(draw: st.DrawFn) -> str | bytes:
    """Stored text json.loads cannot turn into a value: bytes that are not UTF-8 (inside
    otherwise valid JSON), or valid JSON nested past the decoder's recursion limit."""
    if draw(st.booleans()):
        before = json.dumps(draw(json_values))
        return before.encode() + draw(not_utf8) if draw(st.booleans()) else draw(not_utf8)
    # (Hypothesis raises the recursion limit while a test runs: far past it, then)
    depth = draw(st.integers(20_000, 60_000))
    leaf = json.dumps(draw(json_scalars))
    if draw(st.booleans()):
        return "[" * depth + leaf + "]" * depth
    return '{"k":' * depth + leaf + "}" * depth


def write_raw(path: Path, column: str, job_id: str, value: str | bytes) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute(
            f'UPDATE "_jaren_jobs" SET {column} = CAST(? AS TEXT) WHERE id = ?', (value, job_id)
        )
        conn.commit()
    finally:
        conn.close()


@settings(PROPERTY, max_examples=60)
@given(stored=unreadable_texts(), column=st.sampled_from(["payload", "result"]))
def test_an_unreadable_stored_text_reads_as_a_marker_everywhere(
    shared: Store, stored: str | bytes, column: str
) -> None:
    assert shared.path is not None
    n = next(_names)
    kind = f"poison-{n}"
    shared.jobs.enqueue_many(NewJob(kind, {"n": i}, id=f"poison-{n}-{i}") for i in range(3))
    target = f"poison-{n}-1"
    write_raw(Path(shared.path), column, target, stored)

    got = shared.jobs.get(target)
    assert got is not None
    marker = getattr(got, column)
    assert isinstance(marker, CorruptJson)
    marker.text.encode("utf-8")
    json.dumps(got.to_dict())
    paged = {job.id: job for job in shared.jobs.page(kind=kind)}
    assert paged[target] == got
    claimed = shared.jobs.claim_many([kind], owner="w", limit=3)
    assert sorted(job.id for job in claimed) == sorted(paged)
    for job in claimed:
        assert isinstance(getattr(job, column), CorruptJson) == (job.id == target)
        assert shared.jobs.complete(job.lease, "ok") is True


# ------------------------------------------------------------------ NUL in identifiers


@PROPERTY
@given(
    before=identifiers,
    after=st.text(max_size=3),
    field=st.sampled_from(["kind", "id", "owner", "claim kind", "batch id"]),
)
def test_a_nul_in_a_kind_id_or_owner_is_refused_with_nothing_written(
    shared: Store, before: str, after: str, field: str
) -> None:
    value = before + "\x00" + after
    calls = {
        "kind": lambda: shared.jobs.enqueue(value),
        "id": lambda: shared.jobs.enqueue("k", id=value),
        "owner": lambda: shared.jobs.claim(["k"], owner=value),
        "claim kind": lambda: shared.jobs.claim_many(["k", value], owner="w", limit=2),
        "batch id": lambda: shared.jobs.enqueue_many([NewJob("k"), NewJob("k", id=value)]),
    }
    rows = rows_in(shared)
    with pytest.raises(ValueError, match=r"NUL|Unicode"):
        calls[field]()
    assert rows_in(shared) == rows


# ------------------------------------------------------------------ numbers the store cannot hold

HUGE_INT = 2**70  # beyond SQLite's 64-bit INTEGER
HUGE_SECONDS = 1e300
FAR_SECONDS = 1e13  # ~317,000 years: fits SQLite, not a datetime


@pytest.mark.parametrize(
    "call",
    [
        "enqueue max_attempts",
        "enqueue delay_seconds huge",
        "enqueue delay_seconds far",
        "enqueue_many max_attempts",
        "claim lease_seconds",
        "claim_many lease_seconds",
        "renew lease_seconds",
        "fail backoff",
        "sweep limit",
    ],
)
def test_numbers_the_store_cannot_hold_are_value_errors_with_nothing_written(
    tmp_path: Path, call: str
) -> None:
    """A number too large for an SQLite INTEGER (or a datetime) is an argument mistake."""
    from datetime import datetime, timezone

    with open_fresh(tmp_path) as store:
        store.jobs.enqueue("held", id="held")
        claimed = store.jobs.claim(["held"], owner="w", lease_seconds=60)
        assert claimed is not None
        store.jobs.enqueue("queued", id="queued")
        before = [job.to_dict() for job in store.jobs.page()]
        calls = {
            "enqueue max_attempts": lambda: store.jobs.enqueue("k", max_attempts=HUGE_INT),
            "enqueue delay_seconds huge": lambda: store.jobs.enqueue(
                "k", delay_seconds=HUGE_SECONDS
            ),
            "enqueue delay_seconds far": lambda: store.jobs.enqueue("k", delay_seconds=FAR_SECONDS),
            "enqueue_many max_attempts": lambda: store.jobs.enqueue_many(
                [NewJob("k"), NewJob("k", max_attempts=HUGE_INT)]
            ),
            "claim lease_seconds": lambda: store.jobs.claim(
                ["queued"], owner="w", lease_seconds=HUGE_SECONDS
            ),
            "claim_many lease_seconds": lambda: store.jobs.claim_many(
                ["queued"], owner="w", limit=2, lease_seconds=FAR_SECONDS
            ),
            "renew lease_seconds": lambda: store.jobs.renew(
                claimed.lease, lease_seconds=HUGE_SECONDS
            ),
            "fail backoff": lambda: store.jobs.fail(
                claimed.lease, "x", backoff_base_seconds=HUGE_SECONDS,
                backoff_cap_seconds=HUGE_SECONDS,
            ),
            "sweep limit": lambda: store.jobs.sweep(
                settled_before=datetime.now(timezone.utc), limit=HUGE_INT
            ),
        }  # fmt: skip
        with pytest.raises(ValueError):
            calls[call]()
        assert [job.to_dict() for job in store.jobs.page()] == before
        assert store.jobs.complete(claimed.lease) is True  # the lease still speaks


def test_store_defaults_the_store_cannot_hold_are_refused_at_open(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        open_store(tmp_path / "d.db", defaults={"lease_seconds": HUGE_SECONDS})
    with pytest.raises(ValueError):
        open_store(tmp_path / "d.db", defaults={"max_attempts": HUGE_INT})


def test_a_claim_may_name_many_kinds(tmp_path: Path) -> None:
    """A worker with hundreds of handlers claims like one with a few (SQLite caps a
    compound SELECT at 500 terms; the claim must not depend on that)."""
    kinds = [f"kind-{n:04d}" for n in range(1000)]
    with open_fresh(tmp_path) as store:
        store.jobs.enqueue(kinds[-1], id="last")
        store.jobs.enqueue(kinds[0], id="first", priority=-1)
        claimed = store.jobs.claim(kinds, owner="w")
        assert claimed is not None
        assert claimed.id == "last"  # priority order holds across every kind
        assert [c.id for c in store.jobs.claim_many(kinds, owner="w", limit=5)] == ["first"]


# ------------------------------------------------------------------ identifiers, literally


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    kinds=st.lists(identifiers, min_size=1, max_size=4, unique=True),
    ids=st.lists(identifiers, min_size=1, max_size=8, unique=True),
    owner=identifiers,
    data=st.data(),
)
def test_hostile_kinds_and_ids_are_stored_and_matched_literally(
    tmp_path: Path, kinds: list[str], ids: list[str], owner: str, data: st.DataObject
) -> None:
    kind_of = {job_id: data.draw(st.sampled_from(kinds)) for job_id in ids}
    with open_fresh(tmp_path) as store:
        store.jobs.enqueue_many(NewJob(kind_of[i], {"id": i}, id=i) for i in ids[::2])
        for job_id in ids[1::2]:
            store.jobs.enqueue(kind_of[job_id], {"id": job_id}, id=job_id)

        for job_id in ids:
            job = store.jobs.get(job_id)
            assert job is not None
            assert (job.id, job.kind, job.payload) == (job_id, kind_of[job_id], {"id": job_id})
        # no job can hold a NUL in its id: asking for one is a ValueError (SPEC §10), never
        # a match on a prefix nor a driver's refusal
        with pytest.raises(ValueError, match="NUL"):
            store.jobs.get("".join(ids) + "\x00")
        # administration by id matches literally too: cancel one, requeue it
        target = ids[-1]
        assert store.jobs.cancel(target) is True
        assert [j.id for j in store.jobs.page(state="cancelled")] == [target]
        assert store.jobs.requeue(target) is True
        assert [j.id for j in store.jobs.page(state="cancelled")] == []

        # UTF-8 byte order is code point order: SQLite's id order is Python's
        assert [job.id for job in store.jobs.page()] == sorted(ids)
        wanted = Counter(kind_of.values())
        assert dict(store.jobs.counts().pending_kinds) == dict(wanted)
        for kind in kinds:
            paged = [job.id for job in store.jobs.page(kind=kind)]
            assert paged == sorted(i for i in ids if kind_of[i] == kind)

        for kind in kinds:
            got: list[str] = []
            while (claimed := store.jobs.claim([kind], owner=owner)) is not None:
                assert (claimed.kind, claimed.lease_owner) == (kind, owner)
                assert claimed.lease.owner == owner
                got.append(claimed.id)
                assert store.jobs.complete(claimed.lease, {"kind": kind}) is True
            assert sorted(got) == sorted(i for i in ids if kind_of[i] == kind)
        assert store.jobs.counts().done == len(ids)
        # the tables survived every fragment
        assert rows_in(store) == len(ids)


# ------------------------------------------------------------------ lease tokens stay secret


class RecordingIds(Sequence):
    """Deterministic uuids, all remembered: with explicit job ids and owners, every
    uuid the runtime mints is a lease token."""

    def __init__(self) -> None:
        super().__init__(prefix="tok")
        self.minted: list[str] = []

    def uuid(self) -> str:
        value = f"secret-{super().uuid()}-{len(self.minted):04d}"
        self.minted.append(value)
        return value


def test_lease_tokens_never_reach_records_logs_or_outcomes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="jaren_jobs")
    clock = FakeClock()
    ids = RecordingIds()
    texts: list[str] = []
    outcomes: list[Outcome] = []
    finished = threading.Event()
    others_reported = threading.Event()
    store = open_store(
        tmp_path / "tokens.db", runtime=Runtime(now=clock.now, random=ids.random, uuid=ids.uuid)
    )

    def works(payload: Any, ctx: JobContext) -> Any:
        texts.extend([repr(ctx), repr(ctx.job), repr(ctx.lease), str(ctx.lease)])
        return {"ok": True}

    def breaks(payload: Any, ctx: JobContext) -> Any:
        raise RuntimeError("broken on purpose")

    def stolen(payload: Any, ctx: JobContext) -> Any:
        # the lease runs out on the store's clock and a second claimant takes it;
        # the next renewal is refused, which the worker logs. (The other two
        # settle first: the jump would expire their leases too.)
        assert others_reported.wait(30)
        clock.advance(60)
        thief = store.jobs.claim(["stolen"], owner="thief", lease_seconds=600)
        assert thief is not None
        texts.extend([repr(thief), repr(thief.lease), json.dumps(thief.to_dict())])
        assert ctx.signal.wait(30), "the renewal never noticed the theft"
        return "too late"

    def observe(outcome: Outcome) -> None:
        outcomes.append(outcome)
        if len(outcomes) == 2:
            others_reported.set()
        if len(outcomes) == 3:
            finished.set()

    try:
        store.jobs.enqueue("works", id="job-works")
        store.jobs.enqueue("breaks", id="job-breaks", max_attempts=1)
        # claimed last: the clock jump it makes would expire any job leased
        # in the same batch after it
        store.jobs.enqueue("stolen", id="job-stolen", priority=-1)
        worker = store.jobs.create_worker(
            {"works": works, "breaks": breaks, "stolen": stolen},
            owner="worker-1",
            lease_seconds=0.3,  # renewals every 0.1 s of real time
            on_outcome=observe,
        )
        with worker:
            assert finished.wait(30)
            texts.extend(repr(lease) for lease in worker.leases())
        for job in store.jobs.page():
            texts.extend([repr(job), json.dumps(job.to_dict())])
    finally:
        store.close()

    assert sorted(o.outcome for o in outcomes) == ["completed", "failed", "lost"]
    lost = next(o for o in outcomes if o.outcome == "lost")
    assert (lost.job_id, lost.code) == ("job-stolen", LeaseSuperseded.code)
    texts.extend(repr(o) for o in outcomes)
    texts.extend(str(getattr(o, name)) for o in outcomes for name in vars(o))
    texts.append(caplog.text)
    texts.extend(record.getMessage() for record in caplog.records)
    assert "lost the lease" in caplog.text  # the renewal's refusal was logged

    assert len(ids.minted) >= 4  # three claims, renewals, the thief's claim
    leaked = {token for token in ids.minted for text in texts if token in text}
    assert leaked == set()


# ------------------------------------------------------------------ the CLI imports what you name

USER_MODULE = "def double(payload, ctx):\n    return payload * 2\n\nH = {'double': double}\n"
# modules beside it that must never be imported: each would leave a marker
BYSTANDER = "import pathlib\npathlib.Path(__file__).with_suffix('.imported').write_text('!')\n"
# runs the CLI as `python -m jaren_jobs` would, and lists what it imported on the way out
BOOTSTRAP = """
import atexit, json, runpy, sys
before = set(sys.modules)
listing = sys.argv[1]
def report():
    with open(listing, "w") as out:
        json.dump(sorted(set(sys.modules) - before), out)
atexit.register(report)
sys.argv = ["jaren_jobs", *sys.argv[2:]]
runpy.run_module("jaren_jobs", run_name="__main__", alter_sys=True)
"""


def test_the_cli_worker_imports_only_the_module_it_is_named(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    db = tmp_path / "cli.db"
    open_store(db).close()
    (tmp_path / "userjobs.py").write_text(USER_MODULE)
    for name in ("bystander", "jobs", "handlers", "tasks", "jaren_jobs_plugins"):
        (tmp_path / f"{name}.py").write_text(BYSTANDER)
    listing = tmp_path / "imported.json"
    env = {k: v for k, v in os.environ.items() if k not in ("JAREN_JOBS_DB", "PYTHONPATH")}
    process = subprocess.Popen(
        [sys.executable, "-c", BOOTSTRAP, str(listing), "--db", str(db), "worker", "userjobs:H",
         "--poll", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        ready = process.stdout.readline()
        assert ready.startswith("worker "), (ready, process.poll())
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:  # pragma: no cover - only on a hung worker
            process.kill()
            process.wait(10)
    assert process.returncode == 0, stderr
    imported = {name.split(".")[0] for name in json.loads(listing.read_text())}
    foreign = imported - set(sys.stdlib_module_names) - {"jaren_jobs", "typing_extensions"}
    assert foreign == {"userjobs"}, sorted(imported)
    assert list(tmp_path.glob("*.imported")) == []
