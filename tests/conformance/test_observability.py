"""Spans of enqueues and attempts (SPEC §17) on every harness: SQLite and PostgreSQL, sync
and async, with the real OpenTelemetry SDK's in-memory exporter.

The trace from a request into another process is
tests/observability/test_traces_across_processes.py; here are the send spans of
batches, the stored context a claim hands back, the outcomes as attributes
(failed, lost, snoozed), a malformed stored ``traceparent``, and no lease token.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from jaren_jobs import AsyncStore, JobContext, NewJob, Snooze, Store, create_dag_job_runner
from jaren_jobs.observability.tracing import format_traceparent
from tests.conformance.test_worker import Outcomes
from tests.conftest import FakeClock
from tests.harness import Harness
from tests.observability.support import Traced, traced

WAIT = 10.0

__all__ = ["traced"]  # the fixture, imported


def attrs(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


def drain(store: Store, handlers: dict[str, Any], **options: Any) -> Outcomes:
    outcomes = Outcomes()
    worker = store.jobs.create_worker(handlers, on_outcome=outcomes, **options)
    try:
        while worker.run_once():
            pass
    finally:
        worker.stop()
    return outcomes


def test_enqueue_many_sends_one_span_per_job_and_stores_its_context(
    store: Store, traced: Traced
) -> None:
    store.jobs.enqueue_many(
        [NewJob("a", id="a1"), NewJob("b", id="b1"), NewJob("a", id="m1", queue="mail")]
    )
    sends = {attrs(s)["messaging.message.id"]: s for s in traced.spans()}
    assert sorted(sends) == ["a1", "b1", "m1"]
    assert [sends[i].name for i in ("a1", "b1", "m1")] == [
        "send default",
        "send default",
        "send mail",
    ]
    for job_id, kind, queue in (
        ("a1", "a", "default"),
        ("b1", "b", "default"),
        ("m1", "a", "mail"),
    ):
        assert sends[job_id].kind.name == "PRODUCER"
        assert attrs(sends[job_id]) == {
            "messaging.system": "jaren_jobs",
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": queue,
            "messaging.message.id": job_id,
            "jaren_jobs.kind": kind,
        }
    # each job carries its send span's context, and each attempt is that span's child
    drain(store, {"a": lambda p, c: None, "b": lambda p, c: None})
    process = traced.spans("process default") + traced.spans("process mail")
    assert len(process) == 3
    for span in process:
        send = sends[attrs(span)["messaging.message.id"]]
        assert span.parent.span_id == send.context.span_id
        assert span.context.trace_id == send.context.trace_id


def test_a_send_span_ends_at_the_commit_of_its_transaction(store: Store, traced: Traced) -> None:
    with store.transaction() as tx:
        tx.jobs.enqueue("k", id="inside")
        assert traced.spans() == []  # not sent yet: no worker can see the job
    (send,) = traced.spans("send default")
    assert attrs(send)["messaging.message.id"] == "inside"


def test_a_claim_hands_back_the_stored_traceparent(store: Store, traced: Traced) -> None:
    store.jobs.enqueue("k", id="j")
    (send,) = traced.spans("send default")
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    assert claimed.trace_context == format_traceparent(send.get_span_context())
    assert "trace_context" not in claimed.to_dict()  # the public record is unchanged
    assert "trace" not in repr(claimed)


def test_an_untraced_enqueue_stores_no_context(store: Store) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    assert claimed.trace_context is None


def test_a_failed_attempt_records_its_exception_and_a_snooze_is_no_error(
    store: Store, traced: Traced
) -> None:
    class Boom(Exception):
        pass

    def fails(payload: Any, ctx: JobContext) -> Any:
        raise Boom("no luck")

    def snoozes(payload: Any, ctx: JobContext) -> Any:
        raise Snooze(3600)

    store.jobs.enqueue("fails", id="f", max_attempts=1)
    store.jobs.enqueue("snoozes", id="s")
    outcomes = drain(store, {"fails": fails, "snoozes": snoozes})
    assert sorted(outcomes.names()) == ["failed", "snoozed"]
    spans = {attrs(s)["messaging.message.id"]: s for s in traced.spans("process default")}
    failed, snoozed = spans["f"], spans["s"]
    assert attrs(failed)["jaren_jobs.outcome"] == "failed"
    assert attrs(failed)["error.type"].endswith("Boom")
    assert failed.status.status_code.name == "ERROR"
    (event,) = failed.events
    assert event.name == "exception"
    assert event.attributes["exception.message"] == "no luck"
    assert attrs(snoozed)["jaren_jobs.outcome"] == "snoozed"
    assert "error.type" not in attrs(snoozed)
    assert snoozed.status.status_code.name == "UNSET"
    assert not snoozed.events


def test_a_lost_attempt_names_the_refusal(store: Store, clock: FakeClock, traced: Traced) -> None:
    first_outcomes = Outcomes()
    started = threading.Event()
    release = threading.Event()

    def long(payload: Any, ctx: JobContext) -> Any:
        started.set()
        assert release.wait(WAIT)
        return "first"

    first = store.jobs.create_worker(
        {"long": long}, lease_seconds=0.3, renew=False, on_outcome=first_outcomes, owner="a"
    )
    second = store.jobs.create_worker({"long": lambda payload, ctx: "second"}, owner="b")
    store.jobs.enqueue("long", id="j")
    first.start()
    try:
        assert started.wait(WAIT)
        clock.advance(0.9)  # the lease ran out, unrenewed
        assert second.run_once() is True  # rescues it, and completes it
        release.set()
        assert first_outcomes.wait_for(1)[0].outcome == "lost"
    finally:
        release.set()
        first.stop()
        second.stop()
    spans = sorted(traced.spans("process default"), key=lambda s: attrs(s)["jaren_jobs.attempt"])
    assert [attrs(s)["jaren_jobs.outcome"] for s in spans] == ["lost", "completed"]
    lost = spans[0]
    assert attrs(lost)["error.type"] == "JobSettled"  # the second attempt settled the row
    assert lost.status.status_code.name == "ERROR"


@pytest.mark.parametrize(
    "stored",
    [
        "not a traceparent",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # an all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # an all-zero span id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # the forbidden version
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",  # upper case
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  # v00 has 4 fields
        "",
    ],
)
def test_a_malformed_stored_traceparent_is_ignored_with_a_debug_line(
    backend: Harness, store: Store, traced: Traced, caplog: pytest.LogCaptureFixture, stored: str
) -> None:
    store.jobs.enqueue("k", id="j")
    backend.write_raw_row("j", trace_context=stored)
    with caplog.at_level(logging.DEBUG, logger="jaren_jobs.observability"):
        outcomes = drain(store, {"k": lambda p, c: "fine"})
    assert outcomes.names() == ["completed"]
    (span,) = traced.spans("process default")
    assert span.parent is None  # a trace of its own
    assert attrs(span)["jaren_jobs.outcome"] == "completed"
    lines = [r for r in caplog.records if r.name == "jaren_jobs.observability"]
    assert len(lines) == 1
    assert lines[0].levelno == logging.DEBUG
    assert "'j'" in lines[0].getMessage()
    assert "not a W3C traceparent" in lines[0].getMessage()


def test_a_foreign_writers_valid_traceparent_is_joined(
    backend: Harness, store: Store, traced: Traced
) -> None:
    foreign = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    store.jobs.enqueue("k", id="j")
    backend.write_raw_row("j", trace_context=foreign)
    drain(store, {"k": lambda p, c: None})
    (span,) = traced.spans("process default")
    assert span.parent is not None
    assert f"{span.context.trace_id:032x}" == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert f"{span.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert span.parent.is_remote


def test_no_lease_token_in_any_span(store: Store, traced: Traced) -> None:
    tokens: list[str] = []

    def keeps(payload: Any, ctx: JobContext) -> Any:
        tokens.append(ctx.lease.token)
        raise RuntimeError(f"failing with the lease {ctx.lease!r}")

    store.jobs.enqueue("k", id="j", max_attempts=1)
    drain(store, {"k": keeps})
    (token,) = tokens
    texts: list[str] = []
    for span in traced.spans():
        texts.append(span.name)
        texts += [str(v) for v in attrs(span).values()]
        for event in span.events:
            texts += [str(v) for v in (event.attributes or {}).values()]
        texts.append(str(span.status.description))
    assert len(texts) > 10
    assert not [t for t in texts if token in t]


def test_a_dag_runs_nodes_appear_as_events_of_its_attempt(store: Store, traced: Traced) -> None:
    document = {
        "nodes": {"fetch": {"task": "fetch"}, "count": {"task": "count", "needs": ["fetch"]}},
        "output": "count",
    }
    tasks = {
        "fetch": lambda inputs, ctx: inputs["input"]["text"],
        "count": lambda inputs, ctx: len(inputs["fetch"].split()),
    }
    store.jobs.enqueue("wordcount", {"input": {"text": "to be or not"}}, id="run")
    runner = create_dag_job_runner(store, documents={"wordcount": document}, tasks=tasks)
    try:
        while runner.run_once():
            pass
    finally:
        runner.stop()
    assert store.jobs.get("run").result == 4
    (span,) = traced.spans("process default")
    assert attrs(span)["jaren_jobs.outcome"] == "completed"
    nodes = [e.attributes["jaren_jobs.node"] for e in span.events if e.name == "checkpoint"]
    assert nodes == ["fetch", "count"]


def test_a_plain_handlers_own_spans_are_children_of_its_attempt(
    store: Store, traced: Traced
) -> None:
    def traced_handler(payload: Any, ctx: JobContext) -> Any:
        with traced.tracer.start_as_current_span("resize the image"):
            return "done"

    store.jobs.enqueue("k", id="j")
    drain(store, {"k": traced_handler})
    (process,) = traced.spans("process default")
    (work,) = traced.spans("resize the image")
    assert work.parent is not None
    assert work.parent.span_id == process.context.span_id
    assert work.context.trace_id == process.context.trace_id


def test_an_async_handlers_own_spans_are_children_of_its_attempt(
    astore: AsyncStore, traced: Traced
) -> None:
    async def traced_handler(payload: Any, ctx: Any) -> Any:
        await asyncio.sleep(0)
        with traced.tracer.start_as_current_span("resize the image"):
            return "done"

    async def scenario() -> None:
        await astore.jobs.enqueue("k", id="j")
        async with astore.jobs.create_worker({"k": traced_handler}) as worker:
            await astore.jobs.wait("j", timeout_seconds=WAIT)
        assert worker.stats().completions == 1  # stopped: every outcome reported

    asyncio.run(scenario())
    (process,) = traced.spans("process default")
    (work,) = traced.spans("resize the image")
    assert work.parent is not None
    assert work.parent.span_id == process.context.span_id


class _RollBack(Exception):
    pass


def test_a_rolled_back_enqueue_sends_no_span_and_runs_no_attempt(
    store: Store, traced: Traced
) -> None:
    try:
        with store.transaction() as tx:
            tx.jobs.enqueue("k", id="gone")
            raise _RollBack
    except _RollBack:
        pass
    with store.transaction() as tx:
        tx.jobs.enqueue("k", id="kept")
        try:
            with store.transaction() as inner:  # a savepoint, rolled back alone
                inner.jobs.enqueue("k", id="gone-too")
                raise _RollBack
        except _RollBack:
            pass
    sends = [attrs(s)["messaging.message.id"] for s in traced.spans("send default")]
    assert sends == ["kept"]
    drain(store, {"k": lambda p, c: None})
    process = [attrs(s)["messaging.message.id"] for s in traced.spans("process default")]
    assert process == ["kept"]
