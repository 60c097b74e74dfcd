"""The thread-based worker (SPEC §7) on every backend, with real threads.

Tests wait on events and outcome notifications (with timeouts), never on
sleeps. Where a test is about time, the store runs on the fake clock and the
test moves it; the renewal scheduler ticks on real monotonic time, so those
tests use a short ``lease_seconds`` and wait on the ``on_renewal`` hook.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from jaren_jobs import (
    ClaimedJob,
    JobContext,
    JobSettled,
    Lease,
    NewJob,
    Outcome,
    RunMismatch,
    StopOutcome,
    Store,
    Worker,
    WorkerStats,
    WorkerStopped,
)
from tests.conftest import FakeClock
from tests.harness import Harness

WAIT = 10.0  # generous bound for anything that should happen promptly


class Outcomes:
    """An ``on_outcome`` observer that tests can wait on."""

    def __init__(self) -> None:
        self.events: list[Outcome] = []
        self._cond = threading.Condition()

    def __call__(self, event: Outcome) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def wait_for(self, count: int, timeout: float = WAIT) -> list[Outcome]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.events) >= count, timeout), (
                f"expected {count} outcome(s), got {self.events}"
            )
            return list(self.events)

    def names(self) -> list[str]:
        with self._cond:
            return [e.outcome for e in self.events]


class Counter:
    """A zero-argument hook (``on_idle``) counting its calls; tests wait for a count."""

    def __init__(self) -> None:
        self.count = 0
        self._cond = threading.Condition()

    def __call__(self) -> None:
        with self._cond:
            self.count += 1
            self._cond.notify_all()

    def wait_for(self, count: int, timeout: float = WAIT) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.count >= count, timeout)


class LogEvents(logging.Handler):
    """Sets an event when a record of the ``jaren_jobs`` logger contains ``needle``."""

    def __init__(self, needle: str) -> None:
        super().__init__(logging.DEBUG)
        self.needle = needle
        self.seen = threading.Event()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if self.needle in record.getMessage():
            self.seen.set()


@pytest.fixture
def log_events() -> Iterator[Callable[[str], LogEvents]]:
    logger = logging.getLogger("jaren_jobs")
    installed: list[LogEvents] = []

    def install(needle: str) -> LogEvents:
        handler = LogEvents(needle)
        logger.addHandler(handler)
        installed.append(handler)
        return handler

    yield install
    for handler in installed:
        logger.removeHandler(handler)


def worker_threads(worker: Worker) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(worker.name + "-")]


def join_threads(worker: Worker, timeout: float = WAIT) -> None:
    end = time.monotonic() + timeout
    for thread in worker_threads(worker):
        thread.join(max(0.0, end - time.monotonic()))
    assert worker_threads(worker) == [], "the worker's threads did not exit"


def job_state(store: Store, job_id: str) -> str:
    job = store.jobs.get(job_id)
    assert job is not None
    return job.state


# ---------------------------------------------------------------- options


def noop(payload: Any, ctx: JobContext) -> Any:
    return payload


@pytest.mark.parametrize(
    ("handlers", "options", "error"),
    [
        ([("k", noop)], {}, TypeError),
        ({}, {}, ValueError),
        ({"k": "not callable"}, {}, TypeError),
        ({1: noop}, {}, TypeError),
        ({"": noop}, {}, ValueError),
        ({"k": noop}, {"concurrency": 0}, ValueError),
        ({"k": noop}, {"concurrency": -2}, ValueError),
        ({"k": noop}, {"concurrency": True}, TypeError),
        ({"k": noop}, {"concurrency": 1.5}, TypeError),
        ({"k": noop}, {"concurrency": "2"}, TypeError),
        ({"k": noop}, {"poll_seconds": 0}, ValueError),
        ({"k": noop}, {"poll_seconds": float("nan")}, ValueError),
        ({"k": noop}, {"lease_seconds": -1}, ValueError),
        ({"k": noop}, {"lease_seconds": "30"}, TypeError),
        ({"k": noop}, {"owner": ""}, ValueError),
        ({"k": noop}, {"owner": 7}, TypeError),
        ({"k": noop}, {"renew": "yes"}, TypeError),
        ({"k": noop}, {"on_outcome": "print"}, TypeError),
        ({"k": noop}, {"backoff_base_seconds": 0}, ValueError),
        ({"k": noop}, {"backoff_cap_seconds": float("inf")}, ValueError),
        ({"k": noop}, {"stop_grace_seconds": -1}, ValueError),
        ({"k": noop}, {"no_such_option": 1}, TypeError),
    ],
)
def test_options_are_validated(
    store: Store, handlers: Any, options: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        store.jobs.create_worker(handlers, **options)


async def async_handler(payload: Any, ctx: JobContext) -> Any:
    return payload  # pragma: no cover - never called


async def async_generator_handler(payload: Any, ctx: JobContext) -> Any:
    yield payload  # pragma: no cover - never called


class AsyncCallable:
    async def __call__(self, payload: Any, ctx: JobContext) -> Any:
        return payload  # pragma: no cover - never called


def three_arguments(prefix: str, payload: Any, ctx: JobContext) -> Any:
    return prefix


@pytest.mark.parametrize(
    "handler",
    [
        async_handler,
        async_generator_handler,
        functools.partial(async_handler),
        functools.partial(functools.partial(async_handler), 1),
        AsyncCallable(),
        functools.partial(AsyncCallable()),
    ],
    ids=["async-def", "async-generator", "partial", "nested-partial", "object", "partial-object"],
)
@pytest.mark.requires(
    "sync-api"
)  # the async API takes these (tests/conformance/test_async_worker.py)
def test_an_async_handler_is_refused(store: Store, handler: Any) -> None:
    with pytest.raises(TypeError, match=r"kind 'k'.*async"):
        store.jobs.create_worker({"other": noop, "k": handler})


@pytest.mark.parametrize(
    "handler",
    [
        lambda payload: payload,
        lambda: None,
        three_arguments,
        lambda payload, ctx, *, required: None,
        len,  # a builtin whose signature says it takes one argument
    ],
    ids=["one-argument", "no-argument", "three-arguments", "required-keyword", "builtin"],
)
def test_a_handler_that_cannot_take_payload_and_ctx_is_refused(store: Store, handler: Any) -> None:
    with pytest.raises(TypeError, match=r"kind 'k'.*handler\(payload, ctx\)"):
        store.jobs.create_worker({"k": handler})


class PlainCallable:
    def __call__(self, payload: Any, ctx: JobContext) -> Any:
        return ("object", payload)


@pytest.mark.parametrize(
    ("handler", "result"),
    [
        (lambda *args: "varargs", "varargs"),
        (lambda payload, ctx, extra=1: extra, 1),
        (functools.partial(three_arguments, "partial"), "partial"),
        (PlainCallable(), ["object", 7]),
        (min, 7),  # no signature to inspect: accepted, and min(7, ctx) is its own business
    ],
    ids=["varargs", "defaulted-extra", "partial", "object", "uninspectable-builtin"],
)
def test_a_handler_that_can_take_payload_and_ctx_is_accepted(
    store: Store, handler: Any, result: Any
) -> None:
    worker = store.jobs.create_worker({"k": handler})
    job = store.jobs.enqueue("k", 7)
    assert worker.run_once() is True
    stored = store.jobs.get(job.id)
    assert stored is not None
    if handler is min:  # min(7, ctx) raises TypeError at run time: a failed attempt
        assert stored.state in ("failed", "dead")
    else:
        assert (stored.state, stored.result) == ("done", result)
    worker.stop()


def test_defaults_come_from_the_store(backend: Harness, runtime: Any) -> None:
    defaults = {"lease_seconds": 12.0, "poll_seconds": 0.5, "stop_grace_seconds": 3.0}
    with backend.open(runtime=runtime, defaults=defaults) as store:
        worker = store.jobs.create_worker({"k": noop})
        assert isinstance(worker, Worker)
        assert (worker.lease_seconds, worker.poll_seconds, worker.stop_grace_seconds) == (
            12.0,
            0.5,
            3.0,
        )
        assert worker.owner  # minted through the runtime
        assert worker.kinds == ["k"]
        own = store.jobs.create_worker({"k": noop}, owner="me", lease_seconds=9)
        assert (own.owner, own.lease_seconds) == ("me", 9.0)


def test_stop_is_idempotent_and_safe_before_start(store: Store) -> None:
    worker = store.jobs.create_worker({"k": noop})
    assert worker.stop() == StopOutcome(drained=True, in_flight=0)
    assert worker.stop(0) == StopOutcome(drained=True, in_flight=0)
    with pytest.raises(RuntimeError, match="does not restart"):
        worker.start()
    assert worker.run_once() is False
    with pytest.raises(ValueError):
        worker.stop(-1)


def test_start_twice_is_refused(store: Store) -> None:
    worker = store.jobs.create_worker({"k": noop}, poll_seconds=60)
    worker.start()
    with pytest.raises(RuntimeError, match="already started"):
        worker.start()
    assert worker.stop() == StopOutcome(drained=True, in_flight=0)
    join_threads(worker)


# ---------------------------------------------------------------- one step


def test_run_once_claims_runs_and_completes(store: Store) -> None:
    outcomes = Outcomes()
    seen: list[JobContext] = []

    def handler(payload: Any, ctx: JobContext) -> Any:
        seen.append(ctx)
        assert ctx.lease == ctx.job.lease
        assert not ctx.signal.aborted
        return {"doubled": payload * 2}

    worker = store.jobs.create_worker({"double": handler}, owner="w1", on_outcome=outcomes)
    assert worker.run_once() is False  # nothing to claim
    job = store.jobs.enqueue("double", 21)
    assert worker.run_once() is True
    done = store.jobs.get(job.id)
    assert done is not None
    assert (done.state, done.result, done.attempts) == ("done", {"doubled": 42}, 1)
    assert seen[0].job.id == job.id
    assert seen[0].owner == "w1"
    assert outcomes.events == [Outcome("completed", job.id, "double", attempt=1, generation=1)]
    stats = worker.stats()
    assert isinstance(stats, WorkerStats)
    assert (stats.claims, stats.completions, stats.in_flight) == (1, 1, 0)
    assert worker.leases() == []
    worker.stop()


def test_handler_exceptions_retry_then_dead_letter(store: Store, clock: FakeClock) -> None:
    outcomes = Outcomes()
    calls = []

    def flaky(payload: Any, ctx: JobContext) -> Any:
        calls.append(ctx.job.attempts)
        raise ValueError(f"boom {ctx.job.attempts}")

    worker = store.jobs.create_worker(
        {"flaky": flaky},
        on_outcome=outcomes,
        backoff_base_seconds=10,
        backoff_cap_seconds=10,
    )
    job = store.jobs.enqueue("flaky", max_attempts=2)
    assert worker.run_once() is True
    failed = store.jobs.get(job.id)
    assert failed is not None
    assert failed.state == "failed"
    assert failed.last_error == "ValueError: boom 1"
    # per-worker backoff: d = min(10, 10 * 2**0) = 10; delay = 5 + 0.5 * 5 (ids.random = 0.5)
    assert failed.run_at - failed.updated_at == timedelta(seconds=7.5)
    assert worker.run_once() is False  # not due yet
    clock.advance(7.5)
    assert worker.run_once() is True
    dead = store.jobs.get(job.id)
    assert dead is not None
    assert (dead.state, dead.last_error, dead.attempts) == ("dead", "ValueError: boom 2", 2)
    assert calls == [1, 2]
    assert outcomes.names() == ["failed", "failed"]
    assert outcomes.events[0].reason == "ValueError: boom 1"
    assert worker.stats().failures == 2
    assert worker.stats().completions == 0
    worker.stop()


class Incurable(Exception):
    retryable = False


def test_a_result_json_cannot_carry_fails_the_attempt(store: Store) -> None:
    outcomes = Outcomes()

    def bad(payload: Any, ctx: JobContext) -> Any:
        return {"not json": {1, 2}} if payload == "set" else float("nan")

    worker = store.jobs.create_worker({"bad": bad}, on_outcome=outcomes)
    for payload in ("set", "nan"):
        job = store.jobs.enqueue("bad", payload)
        assert worker.run_once() is True
        stored = store.jobs.get(job.id)
        assert stored is not None
        assert stored.state == "failed"
        assert stored.last_error is not None
        assert stored.last_error.startswith("TypeError")
    assert outcomes.names() == ["failed", "failed"]
    worker.stop()


def test_an_error_text_with_lone_surrogates_retries_then_dead_letters(
    store: Store, clock: FakeClock
) -> None:
    """A file name that is not UTF-8 (through os.fsdecode) in a handler's error never wedges
    the job: the error is recorded escaped, retried, and dead-lettered at max_attempts."""
    outcomes = Outcomes()
    name = os.fsdecode(b"caf\xe9.txt")  # "caf\udce9.txt"

    def broken(payload: Any, ctx: JobContext) -> Any:
        raise FileNotFoundError(f"no such file: {name}")

    worker = store.jobs.create_worker(
        {"broken": broken}, on_outcome=outcomes, backoff_base_seconds=1, backoff_cap_seconds=1
    )
    job = store.jobs.enqueue("broken", max_attempts=2)
    assert worker.run_once() is True
    failed = store.jobs.get(job.id)
    assert failed is not None
    assert (failed.state, failed.attempts) == ("failed", 1)
    assert failed.last_error == "FileNotFoundError: no such file: caf\\udce9.txt"
    clock.advance(5)
    assert worker.run_once() is True
    dead = store.jobs.get(job.id)
    assert dead is not None
    assert (dead.state, dead.attempts, dead.lease_until) == ("dead", 2, None)
    clock.advance(3600)  # nothing left leased to come back
    assert worker.run_once() is False
    assert outcomes.names() == ["failed", "failed"]
    assert outcomes.events[0].reason == "FileNotFoundError: no such file: caf\\udce9.txt"
    worker.stop()


class RaisingLookup(dict[str, Any]):
    """Handlers whose lookup of one kind raises (``[]`` and ``get`` alike)."""

    def __getitem__(self, kind: str) -> Any:
        if kind == "broken":
            raise RuntimeError("the registry is broken for this kind")
        return super().__getitem__(kind)

    def get(self, kind: str, default: Any = None) -> Any:
        return self[kind]


def test_a_handler_lookup_that_raises_fails_the_attempt_not_the_worker(store: Store) -> None:
    outcomes = Outcomes()
    worker = store.jobs.create_worker(
        {"broken": noop, "k": noop}, poll_seconds=3600, on_outcome=outcomes
    )
    # the worker copies the mapping it is given; stand in a lookup that raises
    worker.runner.handlers = RaisingLookup(worker.runner.handlers)
    broken = store.jobs.enqueue("broken", max_attempts=1)
    fine = store.jobs.enqueue("k", "ok")
    assert worker.run_once() is True
    assert worker.run_once() is True
    assert worker.interrupted is None
    assert [(e.job_id, e.outcome) for e in outcomes.events] == [
        (broken.id, "failed"),
        (fine.id, "completed"),
    ]
    assert "registry is broken" in (outcomes.events[0].reason or "")
    assert job_state(store, broken.id) == "dead"
    # and on a started worker's loop: the loop goes on to the next job
    again = store.jobs.enqueue("broken", max_attempts=1)
    worker.start()
    later = store.jobs.enqueue("k", "later")
    events = outcomes.wait_for(4)
    assert {(e.job_id, e.outcome) for e in events[2:]} == {
        (again.id, "failed"),
        (later.id, "completed"),
    }
    assert worker.running
    assert worker.stop() == StopOutcome(drained=True, in_flight=0)


def test_a_raising_observer_never_affects_the_worker(
    store: Store, log_events: Callable[[str], LogEvents]
) -> None:
    logs = log_events("on_outcome observer raised")
    delivered = Outcomes()

    def observer(event: Outcome) -> None:
        delivered(event)
        raise RuntimeError("observer bug")

    worker = store.jobs.create_worker(
        {"k": noop}, concurrency=2, poll_seconds=60, on_outcome=observer
    )
    worker.start()
    ids = [store.jobs.enqueue("k", i).id for i in range(3)]
    events = delivered.wait_for(3)
    assert sorted(e.job_id for e in events) == sorted(ids)
    assert all(job_state(store, i) == "done" for i in ids)
    assert logs.seen.is_set()
    assert any(r.exc_info and r.levelno == logging.ERROR for r in logs.records)
    assert worker.stats().completions == 3
    assert worker.stop() == StopOutcome(drained=True, in_flight=0)


class ObserverBug(BaseException):
    """Neither an Exception nor an interrupt: still must not kill a worker thread."""


@pytest.mark.parametrize("interrupt", [SystemExit, KeyboardInterrupt, ObserverBug])
def test_an_outcome_observer_that_raises_an_interrupt_halts_the_worker_cleanly(
    store: Store, interrupt: type[BaseException], log_events: Callable[[str], LogEvents]
) -> None:
    logs = log_events("observer raised")
    count = 300
    jobs = store.jobs.enqueue_many([NewJob("k", n) for n in range(count)])
    seen = Outcomes()

    def observer(event: Outcome) -> None:
        seen(event)
        raise interrupt("from the observer")

    worker = store.jobs.create_worker(
        {"k": noop}, concurrency=2, poll_seconds=3600, on_outcome=observer
    )
    worker.start()
    seen.wait_for(1)
    # the first raise halts the worker; it stops cleanly, within the grace period
    assert worker.stop(grace_seconds=WAIT) == StopOutcome(drained=True, in_flight=0)
    assert isinstance(worker.interrupted, interrupt)
    assert worker.running is False
    assert logs.seen.is_set()
    assert any(r.levelno == logging.ERROR for r in logs.records)
    join_threads(worker)
    stats = worker.stats()
    # every attempt that began got exactly one outcome, each reported once
    assert len(seen.events) == stats.claims
    assert len({(e.job_id, e.generation) for e in seen.events}) == stats.claims
    assert stats.in_flight == 0
    assert stats.completions == stats.claims
    ran = {e.job_id for e in seen.events}
    counts = store.jobs.counts()
    assert counts.leased == 0  # nothing left to wait out a lease
    for job in jobs:
        row = store.jobs.get(job.id)
        assert row is not None
        if job.id in ran:
            assert (row.state, row.attempts) == ("done", 1)
        else:
            assert (row.state, row.attempts) == ("pending", 0)


def test_an_outcome_observer_interrupt_in_run_once_reaches_the_caller_after_settling(
    store: Store,
) -> None:
    seen = Outcomes()

    def observer(event: Outcome) -> None:
        seen(event)
        raise KeyboardInterrupt

    worker = store.jobs.create_worker({"k": noop}, on_outcome=observer)
    job = store.jobs.enqueue("k", 1)
    other = store.jobs.enqueue("k", 2)
    with pytest.raises(KeyboardInterrupt):
        worker.run_once()
    assert seen.names() == ["completed"]
    assert job_state(store, job.id) == "done"
    assert isinstance(worker.interrupted, KeyboardInterrupt)
    assert worker.run_once() is False  # halted
    assert job_state(store, other.id) == "pending"
    assert worker.stop() == StopOutcome(drained=True, in_flight=0)


def test_an_idle_observer_that_raises_system_exit_halts_the_worker(store: Store) -> None:
    called = threading.Event()

    def on_idle() -> None:
        called.set()
        raise SystemExit(2)

    worker = store.jobs.create_worker(
        {"k": noop}, concurrency=2, poll_seconds=0.01, on_idle=on_idle
    )
    worker.start()
    assert called.wait(WAIT)
    for thread in worker_threads(worker):
        if "-loop-" in thread.name:
            thread.join(WAIT)  # the loops end: the worker stopped claiming
    assert [t for t in worker_threads(worker) if "-loop-" in t.name] == []
    assert isinstance(worker.interrupted, SystemExit)
    job = store.jobs.enqueue("k")
    assert worker.stop() == StopOutcome(drained=True, in_flight=0)
    assert job_state(store, job.id) == "pending"
    join_threads(worker)


def test_a_renewal_observer_that_raises_an_interrupt_halts_and_still_settles(
    store: Store,
) -> None:
    outcomes = Outcomes()
    started = threading.Event()

    def waits(payload: Any, ctx: JobContext) -> Any:
        started.set()
        assert ctx.signal.wait(WAIT)  # the halt aborts it
        return "wound up"

    def on_renewal(lease: Lease) -> None:
        raise KeyboardInterrupt

    worker = store.jobs.create_worker(
        {"k": waits}, lease_seconds=0.3, on_outcome=outcomes, on_renewal=on_renewal
    )
    job = store.jobs.enqueue("k")
    worker.start()
    assert started.wait(WAIT)
    assert outcomes.wait_for(1)[0].outcome == "completed"
    assert isinstance(worker.interrupted, KeyboardInterrupt)
    assert worker.stop() == StopOutcome(drained=True, in_flight=0)
    assert job_state(store, job.id) == "done"
    join_threads(worker)


# ----------------------------------------------------------------- one run, one settlement

Handler = Callable[[Any, JobContext], Any]
UNCHECKED: Any = object()  # a RunOnce field the case does not assert


@dataclasses.dataclass(frozen=True)
class RunOnce:
    """A handler (made for the store under test) run once by ``run_once()``, and what it
    leaves: the job's state, and its attempts, result and last error where given; the one
    outcome reported, and its code and reason where given."""

    handler: Callable[[Store], Handler]
    state: str
    outcome: str = "failed"
    max_attempts: int | None = None
    attempts: int | None = None
    result: Any = UNCHECKED
    error_starts: str = ""
    error_has: str = ""
    code: Any = UNCHECKED
    reason: str | None = None


def raising(error: Exception) -> Callable[[Store], Handler]:
    def make(store: Store) -> Handler:
        def handler(payload: Any, ctx: JobContext) -> Any:
            raise error

        return handler

    return make


async def later(payload: Any) -> Any:
    return 1  # pragma: no cover - never awaited


def settling_through_checkpoints(store: Store) -> Handler:
    def handler(payload: Any, ctx: JobContext) -> Any:
        ctx.checkpoints.save(ctx.job.id, "a", 1)
        assert ctx.checkpoints.load(ctx.job.id) == {"a": 1}
        ctx.checkpoints.complete(ctx.job.id, "from checkpoints")
        return "from return"

    return handler


def failing_its_own_lease(store: Store) -> Handler:
    def handler(payload: Any, ctx: JobContext) -> Any:
        store.jobs.fail(ctx.lease, "given up", retry=False)
        return "ignored"

    return handler


RUN_ONCE = {
    # an error that is not retryable dead-letters at once, whatever max_attempts says
    "not-retryable": RunOnce(
        raising(Incurable("no retry can cure this")), "dead", max_attempts=5, attempts=1, code=None
    ),
    "run-mismatch": RunOnce(
        raising(RunMismatch("the run moved", job_id="x")),
        "dead",
        max_attempts=5,
        attempts=1,
        code="JD2069",
    ),
    "result-with-a-lone-surrogate": RunOnce(
        lambda store: lambda payload, ctx: {"file": os.fsdecode(b"\xff.bin")},
        "dead",
        max_attempts=1,
        result=None,
        error_starts="ValueError: complete(): result",
        error_has="not valid Unicode",
    ),
    # an async def handler is refused by create_worker; a plain function can still hand
    # back a coroutine object, which fails the attempt (and warns of nothing: warnings are
    # errors in this suite)
    "returns-a-coroutine": RunOnce(
        lambda store: lambda payload, ctx: later(payload), "failed", error_has="coroutine"
    ),
    # the handler's own settlement is the one that counts; its return value is ignored
    "settles-through-its-own-checkpoints": RunOnce(
        settling_through_checkpoints, "done", outcome="completed", result="from checkpoints"
    ),
    "fails-its-own-lease": RunOnce(failing_its_own_lease, "dead", reason="given up"),
}


@pytest.mark.parametrize("case", list(RUN_ONCE))
def test_one_run_of_a_handler_settles_its_job_as_the_handler_did(store: Store, case: str) -> None:
    how = RUN_ONCE[case]
    outcomes = Outcomes()
    worker = store.jobs.create_worker({"k": how.handler(store)}, on_outcome=outcomes)
    if how.max_attempts is None:
        job = store.jobs.enqueue("k")
    else:
        job = store.jobs.enqueue("k", max_attempts=how.max_attempts)
    assert worker.run_once() is True
    stored = store.jobs.get(job.id)
    assert stored is not None
    assert stored.state == how.state
    if how.attempts is not None:
        assert stored.attempts == how.attempts
    if how.result is not UNCHECKED:
        assert stored.result == how.result
    if how.error_starts or how.error_has:
        assert stored.last_error is not None
        assert stored.last_error.startswith(how.error_starts)
        assert how.error_has in stored.last_error
    assert outcomes.names() == [how.outcome]
    if how.code is not UNCHECKED:
        assert outcomes.events[0].code == how.code
    if how.reason is not None:
        assert outcomes.events[0].reason == how.reason
    worker.stop()


def test_claim_errors_are_counted_not_raised(backend: Harness, runtime: Any) -> None:
    with backend.open(runtime=runtime) as writable:
        writable.jobs.enqueue("k")
    with backend.reopen(runtime=runtime, readonly=True) as store:
        worker = store.jobs.create_worker({"k": noop})
        assert worker.run_once() is False
        assert worker.stats().claim_errors == 1
        assert worker.stats().claims == 0
        worker.stop()


# ---------------------------------------------------------------- wake-ups and polls


def test_an_enqueue_in_this_process_wakes_an_idle_worker(store: Store) -> None:
    outcomes = Outcomes()
    idle = Counter()
    worker = store.jobs.create_worker(
        {"k": noop}, poll_seconds=3600, on_outcome=outcomes, on_idle=idle
    )
    worker.start()
    assert idle.wait_for(1)
    first = store.jobs.enqueue("k", 1)
    assert outcomes.wait_for(1)[0].job_id == first.id  # an hour-long poll: only a wake does this
    assert idle.wait_for(2)  # idle again after the job
    with store.transaction() as tx:
        second = tx.jobs.enqueue("k", 2)
    assert outcomes.wait_for(2)[1].job_id == second.id
    stats = worker.stats()
    assert stats.wakes >= 2
    assert stats.polls >= 2
    worker.stop()


def test_a_rolled_back_enqueue_wakes_nobody(store: Store) -> None:
    idle = threading.Event()
    worker = store.jobs.create_worker({"k": noop}, poll_seconds=3600, on_idle=idle.set)
    worker.start()
    assert idle.wait(WAIT)

    def enqueue_then_roll_back() -> None:
        with store.transaction() as tx:
            tx.jobs.enqueue("k")
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        enqueue_then_roll_back()
    # a wake runs in the committing thread, so it would already be counted
    assert worker.stats().wakes == 0
    worker.stop()


class Claims:
    """Wraps a worker's claims: which thread claimed, and how many it asked for."""

    def __init__(self, worker: Worker) -> None:
        self.calls: list[tuple[int, int]] = []
        self._cond = threading.Condition()
        self._real = worker.claims.claim
        worker.claims.claim = self  # type: ignore[method-assign]

    def __call__(self, limit: int) -> list[ClaimedJob]:
        with self._cond:
            self.calls.append((threading.get_ident(), limit))
            self._cond.notify_all()
        return self._real(limit)

    def wait_for(self, count: int) -> list[tuple[int, int]]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.calls) >= count, WAIT)
            return list(self.calls)


def test_one_idle_loop_polls_for_the_worker(store: Store) -> None:
    idle = Counter()
    worker = store.jobs.create_worker({"k": noop}, concurrency=3, poll_seconds=0.01, on_idle=idle)
    claims = Claims(worker)
    with worker:
        assert idle.wait_for(3)  # each loop claimed once, found nothing, went idle
        since = len(claims.wait_for(0))
        polls = claims.wait_for(since + 12)[since:]
    # the others sleep until something wakes them: one thread polled, one job at a time
    assert len({thread for thread, _ in polls}) == 1, polls
    assert {limit for _, limit in polls} == {1}


def test_a_loop_woken_from_idle_claims_one_job(store: Store) -> None:
    # the cheapest claim first (one lease, one token): what woke it starts soonest;
    # the jobs it will hold ahead come with that job's settlement
    store.jobs.enqueue_many([NewJob("k", n) for n in range(40)])
    idle = Counter()
    outcomes = Outcomes()
    worker = store.jobs.create_worker(
        {"k": noop}, poll_seconds=3600, on_idle=idle, on_outcome=outcomes
    )
    claims = Claims(worker)
    with worker:
        assert idle.wait_for(1)  # drained: the handlers' time measured, the look-ahead grown
        assert len(outcomes.wait_for(40)) == 40
        assert worker.claims.ahead() > 0
        since = len(claims.wait_for(0))
        store.jobs.enqueue("k", "woken")
        assert outcomes.wait_for(41)[-1].outcome == "completed"
        woken = claims.wait_for(since + 1)[since]
    assert woken[1] == 1


def test_a_poll_that_finds_due_jobs_wakes_the_loops_it_polled_for(
    store: Store, clock: FakeClock
) -> None:
    # no enqueue wakes anyone here: the jobs become due on the store's clock
    store.jobs.enqueue("k", "a", delay_seconds=60)
    store.jobs.enqueue("k", "b", delay_seconds=60)
    both = threading.Barrier(2, timeout=WAIT)
    ran: list[str] = []

    def handler(payload: Any, ctx: JobContext) -> None:
        both.wait()  # each runs only once the other has started: two loops at once
        ran.append(payload)

    idle = Counter()
    outcomes = Outcomes()
    worker = store.jobs.create_worker(
        {"k": handler}, concurrency=2, poll_seconds=0.01, on_idle=idle, on_outcome=outcomes
    )
    with worker:
        assert idle.wait_for(2)  # both loops idle, one of them polling for both
        clock.advance(61)
        got = outcomes.wait_for(2)
    assert [event.outcome for event in got] == ["completed", "completed"], got
    assert sorted(ran) == ["a", "b"]
    assert worker.stats().wakes == 0  # found by the poll, not by a wake


def test_another_process_enqueue_is_seen_at_the_next_poll(backend: Harness, runtime: Any) -> None:
    outcomes = Outcomes()
    with backend.open(runtime=runtime) as store, backend.open() as other:
        worker = store.jobs.create_worker({"k": noop}, poll_seconds=0.02, on_outcome=outcomes)
        worker.start()
        job = other.jobs.enqueue("k")  # a separate store: no in-process wake reaches the worker
        assert outcomes.wait_for(1)[0].job_id == job.id
        if store.backend == "sqlite":
            assert worker.stats().wakes == 0  # polling found it
        # (PostgreSQL's NOTIFY may wake it first: tests/backends/postgres/test_mechanics.py)
        worker.stop()


# ---------------------------------------------------------------- renewals


def test_renewal_keeps_a_handler_running_three_times_its_lease(
    store: Store, clock: FakeClock
) -> None:
    lease_seconds = 0.3
    outcomes = Outcomes()
    renewals: queue.Queue[Lease] = queue.Queue()
    started = threading.Event()
    release = threading.Event()
    saved: list[Lease] = []
    claimed: list[Lease] = []

    def long(payload: Any, ctx: JobContext) -> Any:
        claimed.append(ctx.job.lease)
        started.set()
        assert release.wait(WAIT)
        # the checkpoint store follows the renewed lease, not the claim's
        assert ctx.lease.token != ctx.job.lease.token
        ctx.checkpoints.save(ctx.job.id, "step", "ok")
        saved.append(ctx.lease)
        return "finished"

    worker = store.jobs.create_worker(
        {"long": long},
        lease_seconds=lease_seconds,
        on_outcome=outcomes,
        on_renewal=renewals.put,
    )
    job = store.jobs.enqueue("long")
    worker.start()
    assert started.wait(WAIT)
    moved = 0.0
    while moved <= 3 * lease_seconds:
        now = clock.advance(0.2)  # less than a lease between two renewals
        moved += 0.2
        while True:  # wait for a renewal made at (or after) the new time
            lease = renewals.get(timeout=WAIT)
            if lease.expires_at.timestamp() >= now + lease_seconds - 0.001:
                break
        [held] = worker.leases()  # the renewal swapped the new lease in
        assert (held.generation, held.attempt) == (1, 1)
        assert held.expires_at >= lease.expires_at
        assert held.token != claimed[0].token
    release.set()
    events = outcomes.wait_for(1)
    assert events == [Outcome("completed", job.id, "long", attempt=1, generation=1)]
    stored = store.jobs.get(job.id)
    assert stored is not None
    assert (stored.state, stored.result, stored.attempts) == ("done", "finished", 1)
    stats = worker.stats()
    assert stats.renewals >= 5
    assert (stats.completions, stats.lost_settlements, stats.failures) == (1, 0, 0)
    assert saved[0].generation == 1
    assert worker.stop().drained is True
    assert outcomes.names() == ["completed"]


def test_without_renewal_the_job_is_reclaimed_and_the_first_attempt_is_lost(
    store: Store, clock: FakeClock
) -> None:
    first_outcomes = Outcomes()
    second_outcomes = Outcomes()
    started = threading.Event()
    release = threading.Event()

    def long(payload: Any, ctx: JobContext) -> Any:
        started.set()
        assert release.wait(WAIT)
        return "first"

    first = store.jobs.create_worker(
        {"long": long}, lease_seconds=0.3, renew=False, on_outcome=first_outcomes, owner="a"
    )
    second = store.jobs.create_worker(
        {"long": lambda payload, ctx: "second"}, on_outcome=second_outcomes, owner="b"
    )
    job = store.jobs.enqueue("long")
    first.start()
    assert started.wait(WAIT)
    clock.advance(0.9)  # three leases later, with no renewal
    assert second.run_once() is True  # rescues the expired lease
    assert second_outcomes.names() == ["completed"]
    release.set()
    lost = first_outcomes.wait_for(1)[0]
    assert lost.outcome == "lost"
    assert lost.phase == "completion"
    assert lost.code == "JD2065"  # the row is settled by another attempt
    assert (lost.attempt, lost.generation) == (1, 1)
    stored = store.jobs.get(job.id)
    assert stored is not None
    assert (stored.state, stored.result, stored.attempts) == ("done", "second", 2)
    stats = first.stats()
    assert (stats.completions, stats.failures, stats.lost_settlements) == (0, 0, 1)
    assert stats.renewals == 0
    first.stop()
    second.stop()
    assert first_outcomes.names() == ["lost"]


def test_an_attempt_whose_job_was_swept_and_reused_is_lost_not_completed(
    store: Store, clock: FakeClock
) -> None:
    outcomes = Outcomes()
    started = threading.Event()
    release = threading.Event()

    def long(payload: Any, ctx: JobContext) -> Any:
        started.set()
        assert release.wait(WAIT)
        return "stale"

    worker = store.jobs.create_worker(
        {"long": long}, lease_seconds=0.3, renew=False, on_outcome=outcomes, owner="a"
    )
    store.jobs.enqueue("long", id="reused")
    worker.start()
    assert started.wait(WAIT)
    clock.advance(0.9)  # the lease runs out; another claimer rescues and finishes the job
    rescue = store.jobs.claim(["long"], owner="b")
    assert rescue is not None
    assert store.jobs.complete(rescue.lease, "rescued") is True
    clock.advance(1)
    horizon = store.jobs.get("reused").updated_at + timedelta(milliseconds=1)  # type: ignore[union-attr]
    assert store.jobs.sweep(settled_before=horizon) == 1
    # the id's second life, settled at the very generation the worker's attempt holds
    store.jobs.enqueue("long", id="reused")
    again = store.jobs.claim(["long"], owner="b")
    assert again is not None
    assert again.lease.generation == 1
    assert store.jobs.complete(again.lease, "second life") is True
    release.set()
    event = outcomes.wait_for(1)[0]
    assert (event.outcome, event.phase, event.code) == ("lost", "completion", "JD2065")
    assert (event.attempt, event.generation) == (1, 1)
    stored = store.jobs.get("reused")
    assert stored is not None
    assert (stored.state, stored.result) == ("done", "second life")
    assert worker.stats().lost_settlements == 1
    worker.stop()


def test_a_lease_lost_at_renewal_aborts_the_signal(store: Store, clock: FakeClock) -> None:
    outcomes = Outcomes()
    reasons: list[Any] = []

    def waits(payload: Any, ctx: JobContext) -> Any:
        clock.advance(5)  # the 0.3 s lease is long gone when the renewal tries
        assert ctx.signal.wait(WAIT)
        reasons.append(ctx.signal.reason)
        return "too late"

    worker = store.jobs.create_worker(
        {"k": waits}, lease_seconds=0.3, on_outcome=outcomes, concurrency=1
    )
    job = store.jobs.enqueue("k")
    assert worker.run_once() is True
    assert outcomes.names() == ["lost"]
    event = outcomes.events[0]
    assert (event.phase, event.code) == ("completion", "JD2067")
    assert reasons[0].code == "JD2067"
    assert job_state(store, job.id) == "leased"  # nobody settled it; expiry will rescue it
    assert worker.stats().lost_settlements == 1
    worker.stop()


@pytest.mark.requires("gate")  # the completion waits behind a transaction on the gate
def test_a_completion_stuck_behind_an_application_transaction_is_retried_not_failed(
    backend: Harness, runtime: Any, log_events: Callable[[str], LogEvents]
) -> None:
    logs = log_events("completing job")
    outcomes = Outcomes()
    started, release = threading.Event(), threading.Event()
    holding, end = threading.Event(), threading.Event()

    def handler(payload: Any, ctx: JobContext) -> Any:
        started.set()
        assert release.wait(WAIT)
        return "kept"

    with backend.open(runtime=runtime, gate_timeout_seconds=0.05) as store:

        def long_transaction() -> None:
            with store.transaction() as tx:  # holds the store's gate until told
                tx.execute("SELECT 1")
                holding.set()
                assert end.wait(WAIT)

        worker = store.jobs.create_worker({"k": handler}, poll_seconds=3600, on_outcome=outcomes)
        job = store.jobs.enqueue("k", max_attempts=1)
        worker.start()
        assert started.wait(WAIT)
        application = threading.Thread(target=long_transaction)
        application.start()
        try:
            assert holding.wait(WAIT)
            release.set()
            assert logs.seen.wait(WAIT)  # the completion's wait for the gate timed out
            assert outcomes.events == []
        finally:
            end.set()
            application.join(WAIT)
        assert outcomes.wait_for(1)[0].outcome == "completed"
        stored = store.jobs.get(job.id)
        assert stored is not None
        assert (stored.state, stored.result, stored.attempts) == ("done", "kept", 1)
        assert worker.stop() == StopOutcome(drained=True, in_flight=0)


def test_leases_are_listed_newest_first(store: Store) -> None:
    started = {"a": threading.Event(), "b": threading.Event()}
    release = threading.Event()
    contexts: dict[str, JobContext] = {}

    def hold(payload: Any, ctx: JobContext) -> Any:
        contexts[payload] = ctx
        started[payload].set()
        assert release.wait(WAIT)

    worker = store.jobs.create_worker({"k": hold}, concurrency=2, poll_seconds=3600, renew=False)
    worker.start()
    store.jobs.enqueue("k", "a")
    assert started["a"].wait(WAIT)
    store.jobs.enqueue("k", "b")
    assert started["b"].wait(WAIT)
    leases = worker.leases()
    assert [lease.token for lease in leases] == [
        contexts["b"].lease.token,
        contexts["a"].lease.token,
    ]
    assert worker.stats().in_flight == 2
    release.set()
    assert worker.stop().drained is True
    assert worker.leases() == []


# ---------------------------------------------------------------- cancel


def test_cancel_of_a_running_job_aborts_its_signal(store: Store) -> None:
    outcomes = Outcomes()
    started = threading.Event()
    reasons: list[Any] = []

    def waits(payload: Any, ctx: JobContext) -> Any:
        started.set()
        assert ctx.signal.wait(WAIT)
        reasons.append(ctx.signal.reason)
        return "result nobody records"

    worker = store.jobs.create_worker({"k": waits}, on_outcome=outcomes, poll_seconds=3600)
    job = store.jobs.enqueue("k")
    worker.start()
    assert started.wait(WAIT)
    [lease] = worker.leases()
    assert store.jobs.cancel(job.id, lease=lease) is True
    event = outcomes.wait_for(1)[0]
    assert event.outcome == "cancelled"
    assert (event.job_id, event.attempt, event.generation) == (job.id, 1, 1)
    assert isinstance(reasons[0], JobSettled)
    stored = store.jobs.get(job.id)
    assert stored is not None
    assert (stored.state, stored.result) == ("cancelled", None)
    stats = worker.stats()
    assert (stats.cancellations, stats.completions, stats.failures) == (1, 0, 0)
    assert worker.stop().drained is True
    assert outcomes.names() == ["cancelled"]


def test_a_cancel_without_a_local_abort_is_still_a_cancellation(
    backend: Harness, runtime: Any
) -> None:
    # another process cancels with the attempt's lease: no abort reaches this
    # worker, so its completion is a no-op of its own attempt's generation,
    # and the row (not the race) decides the outcome
    outcomes = Outcomes()
    signals: list[bool] = []
    with backend.open(runtime=runtime) as store, backend.open() as elsewhere:

        def cancelled_elsewhere(payload: Any, ctx: JobContext) -> Any:
            assert elsewhere.jobs.cancel(ctx.job.id, lease=ctx.lease) is True
            signals.append(ctx.signal.aborted)
            return "done anyway"

        worker = store.jobs.create_worker({"k": cancelled_elsewhere}, on_outcome=outcomes)
        job = store.jobs.enqueue("k")
        assert worker.run_once() is True
        assert signals == [False]  # nothing told this process
        assert outcomes.names() == ["cancelled"]
        stored = store.jobs.get(job.id)
        assert stored is not None
        assert (stored.state, stored.result) == ("cancelled", None)
        assert worker.stats().cancellations == 1
        worker.stop()


# ---------------------------------------------------------------- stop


def test_stop_drains_a_handler_that_honours_its_signal(store: Store) -> None:
    outcomes = Outcomes()
    started = threading.Event()
    reasons: list[Any] = []

    def polite(payload: Any, ctx: JobContext) -> Any:
        started.set()
        assert ctx.signal.wait(WAIT)
        reasons.append(ctx.signal.reason)
        return "wound up"

    worker = store.jobs.create_worker({"k": polite}, on_outcome=outcomes, poll_seconds=3600)
    job = store.jobs.enqueue("k")
    worker.start()
    assert started.wait(WAIT)
    assert worker.stop(WAIT) == StopOutcome(drained=True, in_flight=0)
    assert isinstance(reasons[0], WorkerStopped)
    assert outcomes.names() == ["completed"]  # reported before stop() returned
    assert job_state(store, job.id) == "done"
    join_threads(worker)


# a plain handler cannot await the AsyncWorker's stop(); an async handler that does is refused
# (test_async_worker.py)
@pytest.mark.requires("sync-api")
def test_stop_from_inside_a_handler_is_refused(store: Store) -> None:
    errors: list[BaseException] = []
    holder: list[Worker] = []

    def handler(payload: Any, ctx: JobContext) -> Any:
        try:
            holder[0].stop()
        except RuntimeError as exc:
            errors.append(exc)
        return "ok"

    worker = store.jobs.create_worker({"k": handler})
    holder.append(worker)
    first = store.jobs.enqueue("k")
    assert worker.run_once() is True  # a handler driven by run_once() is refused too
    assert len(errors) == 1
    assert job_state(store, first.id) == "done"  # and the worker went on to complete it
    outcomes = Outcomes()
    threaded = store.jobs.create_worker({"k": handler}, on_outcome=outcomes, poll_seconds=3600)
    holder[0] = threaded
    threaded.start()
    store.jobs.enqueue("k")
    assert outcomes.wait_for(1)[0].outcome == "completed"
    assert len(errors) == 2
    assert "own threads" in str(errors[1])
    assert threaded.stop().drained is True
    worker.stop()


def test_store_close_stops_a_running_worker_first(backend: Harness, runtime: Any) -> None:
    outcomes = Outcomes()
    started = threading.Event()

    def polite(payload: Any, ctx: JobContext) -> Any:
        started.set()
        ctx.signal.wait(WAIT)
        return "closed cleanly"

    store = backend.open(runtime=runtime)
    worker = store.jobs.create_worker({"k": polite}, on_outcome=outcomes, concurrency=2)
    job = store.jobs.enqueue("k")
    worker.start()
    assert started.wait(WAIT)
    assert store.close(grace_seconds=WAIT) == [StopOutcome(drained=True, in_flight=0)]
    assert outcomes.names() == ["completed"]
    join_threads(worker)
    with backend.reopen(runtime=runtime) as reopened:
        assert job_state(reopened, job.id) == "done"
    assert store.close() == []  # idempotent; the worker is no longer the store's


def test_store_close_reports_what_it_could_not_drain(backend: Harness, runtime: Any) -> None:
    started = threading.Event()
    release = threading.Event()
    outcomes = Outcomes()

    def stubborn(payload: Any, ctx: JobContext) -> Any:
        started.set()
        release.wait(WAIT)
        return "late"

    store = backend.open(runtime=runtime)
    worker = store.jobs.create_worker({"k": stubborn}, on_outcome=outcomes)
    store.jobs.enqueue("k")
    worker.start()
    assert started.wait(WAIT)
    assert store.close(grace_seconds=0.05) == [StopOutcome(drained=False, in_flight=1)]
    assert store.closed
    release.set()
    assert outcomes.wait_for(1)[0].code == "JD2091"
    join_threads(worker)


# ---------------------------------------------------------------- interrupts


def test_keyboard_interrupt_in_run_once_propagates_and_leaves_the_attempt_unsettled(
    store: Store, clock: FakeClock, log_events: Callable[[str], LogEvents]
) -> None:
    logs = log_events("KeyboardInterrupt")
    outcomes = Outcomes()

    def interrupted(payload: Any, ctx: JobContext) -> Any:
        raise KeyboardInterrupt

    worker = store.jobs.create_worker({"k": interrupted}, on_outcome=outcomes)
    job = store.jobs.enqueue("k")
    other = store.jobs.enqueue("k")
    with pytest.raises(KeyboardInterrupt):
        worker.run_once()
    assert isinstance(worker.interrupted, KeyboardInterrupt)
    assert logs.seen.is_set()
    assert outcomes.names() == ["lost"]
    assert outcomes.events[0].job_id == job.id
    assert "KeyboardInterrupt" in (outcomes.events[0].reason or "")
    assert worker.stats().completions == 0
    assert worker.stats().failures == 0
    assert job_state(store, job.id) == "leased"  # left for lease-expiry recovery
    assert worker.run_once() is False  # the worker halted: no more claims
    assert job_state(store, other.id) == "pending"
    assert worker.stop() == StopOutcome(drained=True, in_flight=0)

    clock.advance(31)
    rescuer = store.jobs.create_worker({"k": noop})
    assert rescuer.run_once() is True
    assert rescuer.run_once() is True
    assert job_state(store, job.id) == "done"
    assert store.jobs.get(job.id).attempts == 2  # type: ignore[union-attr]
    rescuer.stop()


def test_system_exit_in_a_worker_thread_halts_the_worker_and_leaves_the_thread(
    store: Store, monkeypatch: pytest.MonkeyPatch, log_events: Callable[[str], LogEvents]
) -> None:
    logs = log_events("SystemExit")
    outcomes = Outcomes()
    escaped: list[type[BaseException]] = []
    hooked = threading.Event()

    def excepthook(args: threading.ExceptHookArgs) -> None:
        escaped.append(args.exc_type)
        hooked.set()

    monkeypatch.setattr(threading, "excepthook", excepthook)

    def exits(payload: Any, ctx: JobContext) -> Any:
        raise SystemExit(3)

    worker = store.jobs.create_worker(
        {"k": exits}, concurrency=2, poll_seconds=3600, on_outcome=outcomes
    )
    job = store.jobs.enqueue("k")
    worker.start()
    assert hooked.wait(WAIT)  # the exception left the worker thread, not swallowed
    assert escaped == [SystemExit]
    for thread in worker_threads(worker):  # both loops end: the worker stopped claiming
        if "-loop-" in thread.name:
            thread.join(WAIT)
    assert [t for t in worker_threads(worker) if "-loop-" in t.name] == []
    assert worker.running is False
    assert logs.seen.is_set()
    assert outcomes.names() == ["lost"]
    assert job_state(store, job.id) == "leased"
    later = store.jobs.enqueue("k")
    assert worker.stop() == StopOutcome(drained=True, in_flight=0)
    assert worker_threads(worker) == []  # stop() ended the renewal scheduler too
    assert job_state(store, later.id) == "pending"
    assert worker.stats().claims == 1


def test_a_wake_during_an_empty_claim_is_not_slept_through(store: Store) -> None:
    worker = store.jobs.create_worker({"k": lambda p, ctx: None}, poll_seconds=3600)
    second_step = threading.Event()
    steps = 0
    loops = worker.loops
    real_step = loops._step

    def step(*, chain: bool = False, **after: bool) -> int:
        nonlocal steps
        steps += 1
        if steps == 1:
            # an in-process enqueue lands while this claim finds nothing
            loops.wake()
            return 0  # what a step that claimed nothing comes to
        second_step.set()
        return real_step(chain=chain, **after)

    loops._step = step  # type: ignore[method-assign]
    with worker:
        # with a one-hour poll, only the wake can bring the second claim
        assert second_step.wait(WAIT)
