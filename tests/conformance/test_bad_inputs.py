"""Bad inputs: each answered by a specific error, and nothing written.

Every case runs against a store holding a pending job, two claimed jobs and a
settled one, and compares a snapshot of every table before and after.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from jaren_jobs import (
    ClaimedJob,
    Lease,
    LeaseRequired,
    LeaseSuperseded,
    NewJob,
    Runtime,
    StorageError,
    Store,
    StoreClosed,
)
from tests.async_bridge import BridgeStore
from tests.conftest import START
from tests.harness import Harness

AWARE = datetime.fromtimestamp(START, timezone.utc)
NAIVE = datetime(2027, 1, 15, 8, 0, 0)
PAST_MAX = datetime.max.replace(tzinfo=timezone(timedelta(hours=-5)))


def deep_list(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def deep_dict(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


class Opaque:
    """An object JSON cannot carry."""


@dataclass
class World:
    store: Store
    claimed: ClaimedJob  # job "leased-1"
    other: ClaimedJob  # job "leased-2"

    @property
    def lease(self) -> Lease:
        return self.claimed.lease

    def forged(self, **changes: Any) -> Lease:
        fields = {
            "job_id": self.lease.job_id,
            "token": "made-up-token",
            "generation": self.lease.generation,
            "attempt": self.lease.attempt,
            "owner": self.lease.owner,
            "expires_at": self.lease.expires_at,
        }
        fields.update(changes)
        return Lease(**fields)


def populate(store: Store) -> World:
    store.jobs.enqueue("k", {"n": 1}, id="pending-1")
    store.jobs.enqueue("x", id="leased-1", priority=2)
    store.jobs.enqueue("x", id="leased-2", priority=1)
    store.jobs.enqueue("d", id="done-1")
    claimed = store.jobs.claim(["x"], owner="worker-1")
    other = store.jobs.claim(["x"], owner="worker-1")
    done = store.jobs.claim(["d"], owner="worker-1")
    assert claimed is not None
    assert other is not None
    assert done is not None
    assert claimed.id == "leased-1"
    assert other.id == "leased-2"
    assert store.jobs.complete(done.lease, {"ok": True})
    return World(store, claimed, other)


@pytest.fixture
def world(store: Store) -> World:
    return populate(store)


Call = Callable[[World], object]

# (id, call, expected error type, a phrase the message must carry). Split below
# into the cases the stored rows decide (every harness) and the argument checks
# refused before a statement reaches the database (once per API).
CASES: list[tuple[str, Call, type[BaseException], str]] = [
    # ---- kind
    ("kind-empty", lambda w: w.store.jobs.enqueue(""), ValueError, "kind"),
    ("kind-int", lambda w: w.store.jobs.enqueue(3), TypeError, "kind"),
    ("kind-none", lambda w: w.store.jobs.enqueue(None), TypeError, "kind"),
    ("kind-bytes", lambda w: w.store.jobs.enqueue(b"k"), TypeError, "kind"),
    ("kind-surrogate", lambda w: w.store.jobs.enqueue("k\ud800"), ValueError, "kind"),
    ("kind-nul", lambda w: w.store.jobs.enqueue("k\x00"), ValueError, "NUL"),
    ("kind-nul-inside", lambda w: w.store.jobs.enqueue("a\x00b"), ValueError, "kind"),
    # ---- payload
    ("payload-set", lambda w: w.store.jobs.enqueue("k", {1, 2}), TypeError, "set"),
    ("payload-bytes", lambda w: w.store.jobs.enqueue("k", b"raw"), TypeError, "bytes"),
    ("payload-object", lambda w: w.store.jobs.enqueue("k", Opaque()), TypeError, "Opaque"),
    ("payload-nested-set", lambda w: w.store.jobs.enqueue("k", {"a": [{1}]}), TypeError, "$.a[0]"),
    ("payload-int-key", lambda w: w.store.jobs.enqueue("k", {1: "a"}), TypeError, "key"),
    ("payload-tuple-key", lambda w: w.store.jobs.enqueue("k", {(1,): "a"}), TypeError, "key"),
    ("payload-nan", lambda w: w.store.jobs.enqueue("k", float("nan")), ValueError, "NaN"),
    ("payload-inf", lambda w: w.store.jobs.enqueue("k", [float("inf")]), ValueError, "inf"),
    ("payload-neg-inf", lambda w: w.store.jobs.enqueue("k", {"a": -float("inf")}), ValueError, ""),
    ("payload-surrogate", lambda w: w.store.jobs.enqueue("k", "\udc80"), ValueError, "Unicode"),
    ("payload-surrogate-key", lambda w: w.store.jobs.enqueue("k", {"\ud800": 1}), ValueError, ""),
    ("payload-deep-list", lambda w: w.store.jobs.enqueue("k", deep_list(100_000)), ValueError, ""),
    ("payload-deep-dict", lambda w: w.store.jobs.enqueue("k", deep_dict(100_000)), ValueError, ""),
    # ---- result
    ("result-set", lambda w: w.store.jobs.complete(w.lease, {1}), TypeError, "result"),
    ("result-object", lambda w: w.store.jobs.complete(w.lease, Opaque()), TypeError, "result"),
    ("result-nan", lambda w: w.store.jobs.complete(w.lease, float("nan")), TypeError, "NaN"),
    ("result-inf", lambda w: w.store.jobs.complete(w.lease, [float("inf")]), TypeError, ""),
    ("result-int-key", lambda w: w.store.jobs.complete(w.lease, {2: 1}), TypeError, "key"),
    ("result-deep", lambda w: w.store.jobs.complete(w.lease, deep_list(100_000)), TypeError, ""),
    # a lone surrogate is text that cannot be encoded, not a value JSON lacks
    ("result-surrogate", lambda w: w.store.jobs.complete(w.lease, "\udc80"), ValueError, "Unicode"),
    (
        "result-surrogate-key",
        lambda w: w.store.jobs.complete(w.lease, [{"ok": 1}, {"\ud800": 1}]),
        ValueError,
        "result",
    ),
    # ---- max_attempts / priority
    ("max-attempts-0", lambda w: w.store.jobs.enqueue("k", max_attempts=0), ValueError, ">= 1"),
    ("max-attempts-neg", lambda w: w.store.jobs.enqueue("k", max_attempts=-2), ValueError, ""),
    ("max-attempts-1.5", lambda w: w.store.jobs.enqueue("k", max_attempts=1.5), TypeError, "int"),
    ("max-attempts-str", lambda w: w.store.jobs.enqueue("k", max_attempts="3"), TypeError, "int"),
    ("max-attempts-bool", lambda w: w.store.jobs.enqueue("k", max_attempts=True), TypeError, ""),
    ("priority-str", lambda w: w.store.jobs.enqueue("k", priority="1"), TypeError, "priority"),
    ("priority-float", lambda w: w.store.jobs.enqueue("k", priority=1.0), TypeError, "priority"),
    ("priority-huge", lambda w: w.store.jobs.enqueue("k", priority=2**63), ValueError, "64"),
    # ---- run_at / delay_seconds
    ("run-at-naive", lambda w: w.store.jobs.enqueue("k", run_at=NAIVE), ValueError, "aware"),
    ("run-at-float", lambda w: w.store.jobs.enqueue("k", run_at=START), TypeError, "datetime"),
    # datetime.max five hours west of UTC is past datetime.max in UTC
    (
        "run-at-past-max-utc",
        lambda w: w.store.jobs.enqueue("k", run_at=PAST_MAX),
        ValueError,
        "run_at",
    ),
    (
        "many-run-at-past-max-utc",
        lambda w: w.store.jobs.enqueue_many([NewJob("k"), NewJob("k", run_at=PAST_MAX)]),
        ValueError,
        "item 1: run_at",
    ),
    (
        "run-at-and-delay",
        lambda w: w.store.jobs.enqueue("k", run_at=AWARE, delay_seconds=1),
        ValueError,
        "not both",
    ),
    ("delay-negative", lambda w: w.store.jobs.enqueue("k", delay_seconds=-1), ValueError, ">= 0"),
    ("delay-nan", lambda w: w.store.jobs.enqueue("k", delay_seconds=float("nan")), ValueError, ""),
    ("delay-inf", lambda w: w.store.jobs.enqueue("k", delay_seconds=float("inf")), ValueError, ""),
    ("delay-str", lambda w: w.store.jobs.enqueue("k", delay_seconds="5"), TypeError, ""),
    # ---- id
    ("id-empty", lambda w: w.store.jobs.enqueue("k", id=""), ValueError, "id"),
    ("id-int", lambda w: w.store.jobs.enqueue("k", id=7), TypeError, "id"),
    ("id-nul", lambda w: w.store.jobs.enqueue("k", id="j\x00"), ValueError, "NUL"),
    (
        "many-id-nul",
        lambda w: w.store.jobs.enqueue_many([NewJob("k", id="ok"), NewJob("k", id="\x00")]),
        ValueError,
        "item 1: id",
    ),
    # ---- enqueue_many: one bad item spoils the batch
    (
        "many-bad-payload",
        lambda w: w.store.jobs.enqueue_many([NewJob("k", id="ok"), NewJob("k", float("nan"))]),
        ValueError,
        "item 1",
    ),
    (
        "many-not-newjob",
        lambda w: w.store.jobs.enqueue_many([NewJob("k", id="ok"), {"kind": "k"}]),
        TypeError,
        "NewJob",
    ),
    ("many-str", lambda w: w.store.jobs.enqueue_many("kk"), TypeError, ""),
    # ---- a lease is required: an id or an owner does not say which attempt speaks
    ("complete-id", lambda w: w.store.jobs.complete("leased-1"), LeaseRequired, "lease"),
    ("complete-owner", lambda w: w.store.jobs.complete("worker-1"), LeaseRequired, ""),
    ("complete-none", lambda w: w.store.jobs.complete(None), LeaseRequired, ""),
    ("complete-claimed-job", lambda w: w.store.jobs.complete(w.claimed), LeaseRequired, ""),
    ("fail-id", lambda w: w.store.jobs.fail("leased-1", "x"), LeaseRequired, ""),
    ("renew-id", lambda w: w.store.jobs.renew("leased-1"), LeaseRequired, ""),
    (
        "renew-dict",
        lambda w: w.store.jobs.renew({"job_id": "leased-1", "token": w.lease.token}),
        LeaseRequired,
        "",
    ),
    (
        "cancel-owner-as-lease",
        lambda w: w.store.jobs.cancel("leased-1", lease="worker-1"),
        LeaseRequired,
        "",
    ),
    ("cancel-claimed-no-lease", lambda w: w.store.jobs.cancel("leased-1"), LeaseRequired, ""),
    (
        "cancel-other-jobs-lease",
        lambda w: w.store.jobs.cancel("leased-1", lease=w.other.lease),
        LeaseRequired,
        "leased-2",
    ),
    (
        "cancel-pending-with-other-lease",
        lambda w: w.store.jobs.cancel("pending-1", lease=w.other.lease),
        LeaseRequired,
        "",
    ),
    # ---- a forged lease: the right job, a made-up token
    ("forged-complete", lambda w: w.store.jobs.complete(w.forged(), "x"), LeaseSuperseded, ""),
    ("forged-fail", lambda w: w.store.jobs.fail(w.forged(), "x"), LeaseSuperseded, ""),
    ("forged-renew", lambda w: w.store.jobs.renew(w.forged()), LeaseSuperseded, ""),
    (
        "forged-cancel",
        lambda w: w.store.jobs.cancel("leased-1", lease=w.forged()),
        LeaseSuperseded,
        "",
    ),
    (
        "forged-next-generation",
        lambda w: w.store.jobs.complete(w.forged(generation=w.lease.generation + 1)),
        LeaseSuperseded,
        "",
    ),
    (
        "forged-empty-token",
        lambda w: w.store.jobs.complete(w.forged(token="")),
        LeaseSuperseded,
        "",
    ),
    # a text no caller checked (a lease put together by hand) is still a clear refusal
    (
        "forged-unencodable-token",
        lambda w: w.store.jobs.complete(w.forged(token="tok\udc80")),
        ValueError,
        "UTF-8",
    ),
    (
        "forged-unencodable-job-id",
        lambda w: w.store.jobs.fail(w.forged(job_id="\ud800"), "x"),
        ValueError,
        "UTF-8",
    ),
    # ---- kinds
    ("claim-bare-str", lambda w: w.store.jobs.claim("k", owner="o"), TypeError, "bare"),
    (
        "claim-many-bare-str",
        lambda w: w.store.jobs.claim_many("k", owner="o", limit=2),
        TypeError,
        "",
    ),
    ("claim-empty-list", lambda w: w.store.jobs.claim([], owner="o"), ValueError, "kind"),
    ("claim-empty-kind", lambda w: w.store.jobs.claim([""], owner="o"), ValueError, ""),
    ("claim-int-kind", lambda w: w.store.jobs.claim([3], owner="o"), TypeError, ""),
    ("claim-nul-kind", lambda w: w.store.jobs.claim(["k", "x\x00"], owner="o"), ValueError, "NUL"),
    ("claim-dict-kinds", lambda w: w.store.jobs.claim({"k": 1}, owner="o"), TypeError, ""),
    # ---- owner, lease_seconds, limit
    ("claim-owner-empty", lambda w: w.store.jobs.claim(["k"], owner=""), ValueError, "owner"),
    ("claim-owner-none", lambda w: w.store.jobs.claim(["k"], owner=None), TypeError, "owner"),
    ("claim-owner-nul", lambda w: w.store.jobs.claim(["k"], owner="o\x00"), ValueError, "owner"),
    (
        "claim-many-owner-nul",
        lambda w: w.store.jobs.claim_many(["k"], owner="\x00", limit=2),
        ValueError,
        "NUL",
    ),
    (
        "claim-lease-zero",
        lambda w: w.store.jobs.claim(["k"], owner="o", lease_seconds=0),
        ValueError,
        "lease_seconds",
    ),
    (
        "claim-lease-negative",
        lambda w: w.store.jobs.claim(["k"], owner="o", lease_seconds=-5),
        ValueError,
        "",
    ),
    (
        "claim-lease-nan",
        lambda w: w.store.jobs.claim(["k"], owner="o", lease_seconds=float("nan")),
        ValueError,
        "",
    ),
    (
        "claim-many-lease-zero",
        lambda w: w.store.jobs.claim_many(["k"], owner="o", limit=1, lease_seconds=0),
        ValueError,
        "",
    ),
    (
        "claim-many-limit-zero",
        lambda w: w.store.jobs.claim_many(["k"], owner="o", limit=0),
        ValueError,
        "limit",
    ),
    (
        "claim-many-limit-float",
        lambda w: w.store.jobs.claim_many(["k"], owner="o", limit=2.0),
        TypeError,
        "",
    ),
    ("renew-lease-zero", lambda w: w.store.jobs.renew(w.lease, lease_seconds=0), ValueError, ""),
    ("renew-lease-neg", lambda w: w.store.jobs.renew(w.lease, lease_seconds=-1), ValueError, ""),
    ("fail-retry-str", lambda w: w.store.jobs.fail(w.lease, "x", retry="no"), TypeError, "retry"),
    # ---- sweep
    ("sweep-no-horizon", lambda w: w.store.jobs.sweep(), TypeError, "settled_before"),
    ("sweep-naive", lambda w: w.store.jobs.sweep(settled_before=NAIVE), ValueError, "aware"),
    ("sweep-str", lambda w: w.store.jobs.sweep(settled_before="2027"), TypeError, ""),
    (
        "sweep-limit-zero",
        lambda w: w.store.jobs.sweep(settled_before=AWARE + timedelta(days=1), limit=0),
        ValueError,
        "",
    ),
    # ---- cancel / requeue arguments
    ("cancel-id-int", lambda w: w.store.jobs.cancel(5), TypeError, ""),
    ("requeue-id-empty", lambda w: w.store.jobs.requeue(""), ValueError, ""),
    ("get-id-nul", lambda w: w.store.jobs.get("pending-1\x00"), ValueError, "NUL"),
    ("cancel-id-nul", lambda w: w.store.jobs.cancel("pending-1\x00"), ValueError, "NUL"),
    ("requeue-id-nul", lambda w: w.store.jobs.requeue("pending-1\x00"), ValueError, "NUL"),
    (
        "cancel-signal-not-a-signal",
        lambda w: w.store.jobs.cancel("pending-1", signal=True),
        TypeError,
        "signal",
    ),
    (
        "requeue-deadline-naive",
        lambda w: w.store.jobs.requeue("pending-1", deadline=NAIVE),
        ValueError,
        "deadline",
    ),
    ("get-int", lambda w: w.store.jobs.get(5), TypeError, ""),
]


# what the stored rows decide (a fence row, a job's state) or a transaction refuses:
# these run on every harness
DATABASE_CASE_IDS = frozenset(
    {
        "cancel-claimed-no-lease",
        "forged-complete",
        "forged-fail",
        "forged-renew",
        "forged-cancel",
        "forged-next-generation",
        "forged-empty-token",
        "forged-unencodable-token",
        "forged-unencodable-job-id",
    }
)
DATABASE_CASES = [c for c in CASES if c[0] in DATABASE_CASE_IDS]
# argument checks, refused before any statement: the same code on every backend, so
# once per API (test_pure_bad_input_... asserts that no statement reached the database)
PURE_CASES = [c for c in CASES if c[0] not in DATABASE_CASE_IDS]
assert len(DATABASE_CASES) == len(DATABASE_CASE_IDS)


@pytest.mark.parametrize(
    ("call", "error", "phrase"),
    [c[1:] for c in DATABASE_CASES],
    ids=[c[0] for c in DATABASE_CASES],
)
def test_bad_input_is_refused_and_writes_nothing(
    world: World,
    backend: Harness,
    call: Call,
    error: type[BaseException],
    phrase: str,
) -> None:
    before = backend.snapshot()
    with pytest.raises(error) as info:
        call(world)
    # the exact class, not a broader one: a LeaseSuperseded is not "some LeaseLost"
    assert type(info.value) is error
    assert phrase in str(info.value)
    assert backend.snapshot() == before
    # the store is still usable, and the refused lease still speaks for its job
    assert world.store.jobs.complete(world.claimed.lease, "after") is True


@pytest.mark.once_per_api
@pytest.mark.parametrize(
    ("call", "error", "phrase"), [c[1:] for c in PURE_CASES], ids=[c[0] for c in PURE_CASES]
)
def test_pure_bad_input_is_refused_and_writes_nothing(
    world: World,
    backend: Harness,
    call: Call,
    error: type[BaseException],
    phrase: str,
) -> None:
    before = backend.snapshot()
    statements: list[str] = []
    with statements_seen(world.store, statements):
        with pytest.raises(error) as info:
            call(world)
        sent = list(statements)
        assert type(info.value) is error
        assert phrase in str(info.value)
        assert backend.snapshot() == before
        assert world.store.jobs.complete(world.claimed.lease, "after") is True
    # refused before any statement (else the case belongs in DATABASE_CASES): the same
    # code on every backend, which is why it runs once per API
    assert sent == []
    assert statements, "the trace saw no statement of complete(): it watches nothing"


@contextlib.contextmanager
def statements_seen(store: Store, into: list[str]) -> Iterator[None]:
    """Every statement ``store`` sends while inside (``once_per_api`` runs on the SQLite
    harnesses, tests/conftest.py, whose connection has a trace callback)."""
    sync = store.astore.store if isinstance(store, BridgeStore) else store
    connection = sync.connection  # type: ignore[attr-defined]
    connection.set_trace_callback(into.append)
    try:
        yield
    finally:
        connection.set_trace_callback(None)


def test_refused_result_leaves_the_job_leased(world: World) -> None:
    with pytest.raises(TypeError):
        world.store.jobs.complete(world.lease, {"when": datetime.now(timezone.utc)})
    job = world.store.jobs.get("leased-1")
    assert job is not None
    assert job.state == "leased"
    assert job.result is None
    assert world.store.jobs.complete(world.lease, {"when": "now"}) is True
    done = world.store.jobs.get("leased-1")
    assert done is not None
    assert (done.state, done.result) == ("done", {"when": "now"})


def test_bad_input_inside_a_transaction_writes_nothing(world: World, backend: Harness) -> None:
    before = backend.snapshot()
    with world.store.transaction() as tx:
        with pytest.raises(ValueError):
            tx.jobs.enqueue("k", float("nan"))
        with pytest.raises(LeaseRequired):
            tx.jobs.complete("leased-1")
    assert backend.snapshot() == before


# ----------------------------------------------------------------- a closed store


def _closed_calls(lease: Lease) -> list[tuple[str, Callable[[Store], object]]]:
    later = AWARE + timedelta(days=1)
    return [
        ("enqueue", lambda s: s.jobs.enqueue("k")),
        ("enqueue_many", lambda s: s.jobs.enqueue_many([NewJob("k")])),
        ("get", lambda s: s.jobs.get("pending-1")),
        ("counts", lambda s: s.jobs.counts()),
        ("claim", lambda s: s.jobs.claim(["k"], owner="o")),
        ("claim_many", lambda s: s.jobs.claim_many(["k"], owner="o", limit=2)),
        ("renew", lambda s: s.jobs.renew(lease)),
        ("complete", lambda s: s.jobs.complete(lease, "r")),
        ("fail", lambda s: s.jobs.fail(lease, "e")),
        ("cancel", lambda s: s.jobs.cancel("pending-1")),
        ("cancel-leased", lambda s: s.jobs.cancel("leased-1", lease=lease)),
        ("requeue", lambda s: s.jobs.requeue("pending-1")),
        ("sweep", lambda s: s.jobs.sweep(settled_before=later)),
        ("transaction", lambda s: s.transaction().__enter__()),
    ]


CLOSED_CALL_NAMES = [name for name, _ in _closed_calls(None)]


@pytest.mark.parametrize("name", CLOSED_CALL_NAMES)
def test_closed_store_refuses_every_call(backend: Harness, runtime: Runtime, name: str) -> None:
    store = backend.open(runtime=runtime)
    world = populate(store)
    store.close()
    assert store.closed
    before = backend.snapshot()
    call = dict(_closed_calls(world.lease))[name]
    with pytest.raises(StoreClosed) as info:
        call(store)
    assert info.value.code == "JD2091"
    assert backend.snapshot() == before
    assert store.close() == []  # idempotent


def test_closed_transaction_view_refuses(backend: Harness, runtime: Runtime) -> None:
    store = backend.open(runtime=runtime)
    with store.transaction() as tx:
        pass
    store.close()
    with pytest.raises(StoreClosed):
        tx.jobs.enqueue("k")


# ----------------------------------------------------------------- a read-only store


@pytest.fixture
def readonly(backend: Harness, runtime: Runtime) -> Iterator[tuple[Store, World]]:
    writer = backend.open(runtime=runtime)
    world = populate(writer)
    reader = backend.open(runtime=runtime, readonly=True)
    try:
        yield reader, world
    finally:
        reader.close()
        writer.close()


def _readonly_writes(lease: Lease) -> list[tuple[str, Callable[[Store], object]]]:
    later = AWARE + timedelta(days=1)
    return [
        ("enqueue", lambda s: s.jobs.enqueue("k")),
        ("enqueue_many", lambda s: s.jobs.enqueue_many([NewJob("k"), NewJob("k")])),
        ("claim", lambda s: s.jobs.claim(["k"], owner="o")),
        ("claim_many", lambda s: s.jobs.claim_many(["k"], owner="o", limit=2)),
        ("renew", lambda s: s.jobs.renew(lease)),
        ("complete", lambda s: s.jobs.complete(lease, "r")),
        ("fail", lambda s: s.jobs.fail(lease, "e")),
        ("cancel", lambda s: s.jobs.cancel("pending-1")),
        ("cancel-leased", lambda s: s.jobs.cancel("leased-1", lease=lease)),
        ("requeue", lambda s: s.jobs.requeue("pending-1")),
        ("sweep", lambda s: s.jobs.sweep(settled_before=later)),
    ]


READONLY_WRITE_NAMES = [name for name, _ in _readonly_writes(None)]


@pytest.mark.parametrize("name", READONLY_WRITE_NAMES)
def test_readonly_store_refuses_writes(
    readonly: tuple[Store, World], backend: Harness, name: str
) -> None:
    reader, world = readonly
    assert reader.readonly
    before = backend.snapshot()
    call = dict(_readonly_writes(world.lease))[name]
    with pytest.raises(StorageError) as info:
        call(reader)
    assert info.value.code == "JD2099"
    assert isinstance(info.value.__cause__, backend.driver_error)
    assert "read-only" in str(info.value) or "readonly" in str(info.value)
    assert backend.snapshot() == before
    # the reader still reads, and the writer still writes
    assert reader.jobs.get("leased-1") is not None


def test_readonly_store_reads(readonly: tuple[Store, World]) -> None:
    reader, world = readonly
    job = reader.jobs.get("done-1")
    assert job is not None
    assert (job.state, job.result) == ("done", {"ok": True})
    assert reader.jobs.get("nope") is None
    counts = reader.jobs.counts()
    assert (counts.pending, counts.leased, counts.done) == (1, 2, 1)
    # and sees what the writer commits later
    assert world.store.jobs.complete(world.lease) is True
    assert reader.jobs.get("leased-1").state == "done"


def test_readonly_transaction_write_is_storage_error(
    readonly: tuple[Store, World], backend: Harness
) -> None:
    reader, _ = readonly
    before = backend.snapshot()
    with pytest.raises(StorageError) as info, reader.transaction() as tx:
        tx.jobs.enqueue("k")
    assert isinstance(info.value.__cause__, backend.driver_error)
    assert backend.snapshot() == before
