"""The worker's logs (SPEC §13 "Logs") on every backend, sync and async.

One logger tree under ``jaren_jobs`` (the worker's lines on
``jaren_jobs.worker``): a failed attempt at WARNING with its traceback, a
dead letter at ERROR with it, a lost attempt and a lost renewal at WARNING,
a worker's start and stop at INFO, nothing about a successful job above
DEBUG, and never a lease token in any record (message, arguments or the
formatted traceback). Records are captured with ``caplog``; threads are
ordered by events and outcomes, never by sleeping.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable
from typing import Any

import pytest

from jaren_jobs import AsyncJobContext, AsyncStore, JobContext, Lease, LeaseSuperseded, Store
from tests.conformance.test_worker import Outcomes
from tests.conftest import FakeClock

WAIT = 10.0
WORKER_LOG = "jaren_jobs.worker"


class Tokens:
    """Every lease token a test saw: from its handlers, its claims and its renewals."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._lock = threading.Lock()

    def add(self, lease: Lease | None) -> None:
        if lease is not None:
            with self._lock:
                self.seen.add(lease.token)

    def __call__(self, lease: Lease) -> None:  # an on_renewal observer
        self.add(lease)


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="jaren_jobs")
    return caplog


def texts_of(records: Iterable[logging.LogRecord]) -> list[str]:
    """Everything a record could show: its message, its raw arguments, its traceback."""
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    texts: list[str] = []
    for record in records:
        texts.append(formatter.format(record))  # the message and the formatted exc_info
        texts.append(repr(record.msg))
        texts.extend(repr(arg) for arg in (record.args or ()))
        if record.exc_info and record.exc_info[1] is not None:
            texts.append(formatter.formatException(record.exc_info))
    return texts


def assert_no_token(records: list[logging.LogRecord], tokens: Tokens) -> None:
    assert tokens.seen, "the test saw no lease: the check proves nothing"
    for text in texts_of(records):
        for token in tokens.seen:
            assert token not in text, f"a lease token reached the logs: {text!r}"


def of_job(records: Iterable[logging.LogRecord], job_id: str) -> list[logging.LogRecord]:
    return [r for r in records if repr(job_id) in r.getMessage()]


# ---------------------------------------------------------------- failures


def test_a_failed_attempt_is_a_warning_with_its_traceback(
    store: Store, logs: pytest.LogCaptureFixture
) -> None:
    tokens = Tokens()
    store.jobs.enqueue("k", id="a", max_attempts=3)

    def exploding_handler(payload: Any, ctx: JobContext) -> Any:
        tokens.add(ctx.lease)
        raise ZeroDivisionError(f"division by zero in {ctx.job.id}")

    worker = store.jobs.create_worker({"k": exploding_handler}, on_renewal=tokens)
    assert worker.run_once() is True

    (record,) = [r for r in of_job(logs.records, "a") if r.levelno > logging.DEBUG]
    assert (record.name, record.levelno) == (WORKER_LOG, logging.WARNING)
    message = record.getMessage()
    assert "'k'" in message
    assert "attempt 1 of 3" in message
    assert "retried" in message
    assert "division by zero in a" in message
    assert record.exc_info is not None
    assert record.exc_info[0] is ZeroDivisionError
    assert "exploding_handler" in logging.Formatter().formatException(record.exc_info)
    job = store.jobs.get("a")
    assert job is not None
    assert job.state == "failed"
    assert_no_token(logs.records, tokens)


def test_a_dead_letter_is_an_error_with_its_traceback(
    store: Store, clock: FakeClock, logs: pytest.LogCaptureFixture
) -> None:
    tokens = Tokens()
    store.jobs.enqueue("k", id="a", max_attempts=2)

    def doomed_handler(payload: Any, ctx: JobContext) -> Any:
        tokens.add(ctx.lease)
        raise ValueError("never works")

    worker = store.jobs.create_worker(
        {"k": doomed_handler}, backoff_base_seconds=1, backoff_cap_seconds=1
    )
    assert worker.run_once() is True
    clock.advance(5)  # past the retry's backoff
    assert worker.run_once() is True

    loud = [r for r in of_job(logs.records, "a") if r.levelno > logging.DEBUG]
    assert [(r.name, r.levelno) for r in loud] == [
        (WORKER_LOG, logging.WARNING),
        (WORKER_LOG, logging.ERROR),
    ]
    dead = loud[1]
    assert "attempt 2 of 2" in dead.getMessage()
    assert "dead letter" in dead.getMessage()
    assert dead.exc_info is not None
    assert dead.exc_info[0] is ValueError
    assert "doomed_handler" in logging.Formatter().formatException(dead.exc_info)
    job = store.jobs.get("a")
    assert job is not None
    assert job.state == "dead"
    assert_no_token(logs.records, tokens)


# ---------------------------------------------------------------- success


def test_a_successful_job_logs_nothing_above_debug(
    store: Store, logs: pytest.LogCaptureFixture
) -> None:
    tokens = Tokens()
    store.jobs.enqueue("k", id="ok")

    def handler(payload: Any, ctx: JobContext) -> Any:
        tokens.add(ctx.lease)
        return {"fine": True}

    worker = store.jobs.create_worker({"k": handler})
    assert worker.run_once() is True
    job = store.jobs.get("ok")
    assert job is not None
    assert job.state == "done"

    assert [r for r in logs.records if r.levelno > logging.DEBUG] == []
    debug = of_job(logs.records, "ok")
    assert [(r.name, r.levelno) for r in debug] == [(WORKER_LOG, logging.DEBUG)]
    assert "completed" in debug[0].getMessage()
    assert_no_token(logs.records, tokens)


# ---------------------------------------------------------------- lost attempts


def test_a_lost_attempt_is_a_warning_naming_its_refusal(
    store: Store, clock: FakeClock, logs: pytest.LogCaptureFixture
) -> None:
    tokens = Tokens()
    outcomes = Outcomes()
    store.jobs.enqueue("k", id="a")

    def handler(payload: Any, ctx: JobContext) -> Any:
        tokens.add(ctx.lease)
        clock.advance(31)  # the lease runs out, and another worker rescues the job
        rescued = store.jobs.claim(["k"], owner="rescuer")
        assert rescued is not None
        tokens.add(rescued.lease)
        return "too late"

    worker = store.jobs.create_worker(
        {"k": handler}, lease_seconds=30, renew=False, on_outcome=outcomes
    )
    assert worker.run_once() is True
    (event,) = outcomes.wait_for(1)
    assert (event.outcome, event.code) == ("lost", LeaseSuperseded.code)

    (record,) = [r for r in of_job(logs.records, "a") if r.levelno > logging.DEBUG]
    assert (record.name, record.levelno) == (WORKER_LOG, logging.WARNING)
    message = record.getMessage()
    assert "lost" in message
    assert LeaseSuperseded.code in message
    assert "completion" in message
    assert_no_token(logs.records, tokens)


def test_a_lease_lost_at_renewal_is_a_warning(
    store: Store, clock: FakeClock, logs: pytest.LogCaptureFixture
) -> None:
    tokens = Tokens()
    outcomes = Outcomes()
    store.jobs.enqueue("k", id="a")
    started = threading.Event()

    def handler(payload: Any, ctx: JobContext) -> Any:
        tokens.add(ctx.lease)
        clock.advance(2)  # the lease runs out, and another worker rescues the job
        rescued = store.jobs.claim(["k"], owner="rescuer")
        assert rescued is not None
        tokens.add(rescued.lease)
        started.set()
        # the next renewal (a third of the lease later) finds it lost
        assert ctx.signal.wait(WAIT), "the renewal never told the handler"
        return None

    # a 1 s lease is renewed every third of a second: the refusal comes soon
    with store.jobs.create_worker(
        {"k": handler}, lease_seconds=1, on_outcome=outcomes, on_renewal=tokens
    ):
        assert started.wait(WAIT)
        (event,) = outcomes.wait_for(1)
    assert event.outcome == "lost"

    warnings = [
        r
        for r in of_job(logs.records, "a")
        if r.levelno == logging.WARNING and r.name == WORKER_LOG
    ]
    assert any("lost the lease" in r.getMessage() for r in warnings), warnings
    assert any("attempt 1 lost" in r.getMessage() for r in warnings), warnings
    assert_no_token(logs.records, tokens)


# ---------------------------------------------------------------- start and stop


def test_a_workers_start_and_stop_are_info(store: Store, logs: pytest.LogCaptureFixture) -> None:
    tokens = Tokens()
    outcomes = Outcomes()
    store.jobs.enqueue("k", id="a", queue="mail")

    def handler(payload: Any, ctx: JobContext) -> Any:
        tokens.add(ctx.lease)

    worker = store.jobs.create_worker(
        {"k": handler}, concurrency=2, owner="w-logs", queues=["mail"], on_outcome=outcomes
    )
    worker.start()
    outcomes.wait_for(1)
    stopped = worker.stop()
    assert stopped.drained

    info = [r for r in logs.records if r.levelno == logging.INFO and r.name == WORKER_LOG]
    assert len(info) == 2, info
    started_line, stopped_line = (r.getMessage() for r in info)
    assert "'w-logs'" in started_line
    assert "started" in started_line
    assert "concurrency 2" in started_line
    assert "['mail']" in started_line
    assert "'w-logs'" in stopped_line
    assert "stopped" in stopped_line
    assert repr(stopped) in stopped_line
    # a second stop() reports again without a second line
    assert worker.stop() == stopped
    assert len([r for r in logs.records if r.levelno == logging.INFO]) == 2
    assert [r for r in logs.records if r.levelno > logging.INFO] == []
    assert_no_token(logs.records, tokens)


def test_the_workers_records_are_on_jaren_jobs_worker(
    store: Store, logs: pytest.LogCaptureFixture
) -> None:
    store.jobs.enqueue("k", id="a", max_attempts=1)
    store.jobs.enqueue("k", id="b")

    def handler(payload: Any, ctx: JobContext) -> Any:
        if ctx.job.id == "a":
            raise RuntimeError("boom")

    worker = store.jobs.create_worker({"k": handler})
    assert worker.run_once()
    assert worker.run_once()
    # the worker's lines are on its own child logger, not on the root of the tree
    assert {r.name for r in logs.records} == {WORKER_LOG}
    assert {r.levelname for r in logs.records} == {"DEBUG", "ERROR"}


# ---------------------------------------------------------------- asyncio


def test_an_async_handlers_failure_and_dead_letter_are_logged(
    astore: AsyncStore, store: Store, clock: FakeClock, logs: pytest.LogCaptureFixture
) -> None:
    tokens = Tokens()

    async def main() -> None:
        await astore.jobs.enqueue("k", id="a", max_attempts=2)
        await astore.jobs.enqueue("ok", id="b")

        async def async_failing_handler(payload: Any, ctx: AsyncJobContext) -> Any:
            tokens.add(ctx.lease)
            raise KeyError("missing")

        async def fine(payload: Any, ctx: AsyncJobContext) -> Any:
            tokens.add(ctx.lease)
            return 1

        worker = astore.jobs.create_worker(
            {"k": async_failing_handler, "ok": fine},
            backoff_base_seconds=1,
            backoff_cap_seconds=1,
        )
        assert await worker.run_once() is True
        assert await worker.run_once() is True
        clock.advance(5)
        assert await worker.run_once() is True

    asyncio.run(asyncio.wait_for(main(), WAIT * 3))

    loud = [r for r in of_job(logs.records, "a") if r.levelno > logging.DEBUG]
    assert [(r.name, r.levelno) for r in loud] == [
        (WORKER_LOG, logging.WARNING),
        (WORKER_LOG, logging.ERROR),
    ]
    for record in loud:
        assert record.exc_info is not None
        assert record.exc_info[0] is KeyError
        assert "async_failing_handler" in logging.Formatter().formatException(record.exc_info)
    assert [r for r in of_job(logs.records, "b") if r.levelno > logging.DEBUG] == []
    job = store.jobs.get("a")
    assert job is not None
    assert job.state == "dead"
    assert_no_token(logs.records, tokens)
