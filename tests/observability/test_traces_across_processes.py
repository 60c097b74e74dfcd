"""One trace from a request to the attempt that ran its job in another process (SPEC §17).

The test process enqueues inside a transaction under a request span (and
rolls another enqueue back); a worker in a process of its own runs the jobs,
traced, and writes its spans to a file. The consumer spans must be children
of the producer spans stored with the jobs, in the request's trace — on
SQLite and PostgreSQL, through the sync and the asyncio API on both sides.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jaren_jobs
from tests.observability.support import Traced, traced
from tests.processes.pg_support import base_url, schema_on

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 120

__all__ = ["traced"]  # the fixture, imported


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "queue.db")
        return
    with schema_on(base_url()) as schema:
        yield schema.url


def _rolled_back(store: jaren_jobs.Store) -> None:
    with store.transaction() as tx:
        tx.jobs.enqueue("ok", id="rolled-back")
        raise RuntimeError("the request fails: its transaction rolls back")


async def _rolled_back_async(store: jaren_jobs.AsyncStore) -> None:
    async with store.transaction() as tx:
        await tx.jobs.enqueue("ok", id="rolled-back")
        raise RuntimeError("the request fails: its transaction rolls back")


def enqueue_sync(database: str, traced: Traced) -> dict[str, Any]:
    with jaren_jobs.open_store(database) as store:
        with traced.tracer.start_as_current_span("request") as request:
            with store.transaction() as tx:
                tx.jobs.enqueue("ok", {"n": 1}, id="ok-1")
                tx.jobs.enqueue("flaky", id="flaky-1", max_attempts=3)
            with pytest.raises(RuntimeError, match="rolls back"):
                _rolled_back(store)
        assert store.jobs.get("rolled-back") is None
    return {"request": request}


async def _enqueue_async(database: str, traced: Traced) -> dict[str, Any]:
    async with jaren_jobs.open_async_store(database) as store:
        with traced.tracer.start_as_current_span("request") as request:
            async with store.transaction() as tx:
                await tx.jobs.enqueue("ok", {"n": 1}, id="ok-1")
                await tx.jobs.enqueue("flaky", id="flaky-1", max_attempts=3)
            with pytest.raises(RuntimeError, match="rolls back"):
                await _rolled_back_async(store)
        assert await store.jobs.get("rolled-back") is None
    return {"request": request}


def run_worker(database: str, spans: Path, mode: str, expected: int) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-m", "tests.observability.worker_child", database, str(spans), mode,
         str(expected)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in spans.read_text(encoding="utf-8").splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_request_and_the_attempts_in_another_process_share_one_trace(
    database: str, mode: str, traced: Traced, tmp_path: Path
) -> None:
    if mode == "sync":
        scene = enqueue_sync(database, traced)
    else:
        scene = asyncio.run(_enqueue_async(database, traced))
    request = scene["request"]
    trace_id = f"{request.get_span_context().trace_id:032x}"

    # the producer side: one send span per committed enqueue, children of the request
    sends = traced.spans("send default")
    by_job = {s.attributes["messaging.message.id"]: s for s in sends}
    assert sorted(by_job) == ["flaky-1", "ok-1"]  # the rolled-back enqueue has none
    for span in sends:
        assert span.kind.name == "PRODUCER"
        assert span.parent is not None
        assert span.parent.span_id == request.get_span_context().span_id
        assert span.context.trace_id == request.get_span_context().trace_id
        assert span.attributes["messaging.system"] == "jaren_jobs"
        assert span.attributes["messaging.operation.type"] == "send"
        assert span.attributes["messaging.destination.name"] == "default"

    consumed = run_worker(database, tmp_path / "spans.jsonl", mode, expected=2)
    process = [s for s in consumed if s["name"] == "process default"]
    assert all(s["kind"] == "CONSUMER" for s in process)
    assert all(s["trace_id"] == trace_id for s in process)
    assert "rolled-back" not in {s["attributes"]["messaging.message.id"] for s in process}

    (ok,) = [s for s in process if s["attributes"]["messaging.message.id"] == "ok-1"]
    assert ok["parent_id"] == f"{by_job['ok-1'].context.span_id:016x}"
    assert ok["attributes"]["jaren_jobs.outcome"] == "completed"
    assert ok["attributes"]["jaren_jobs.kind"] == "ok"
    assert ok["attributes"]["jaren_jobs.attempt"] == 1
    assert ok["attributes"]["messaging.operation.type"] == "process"
    assert ok["status"] == "UNSET"

    # failed, then retried: two consumer spans, the exception on the first
    flaky = sorted(
        (s for s in process if s["attributes"]["messaging.message.id"] == "flaky-1"),
        key=lambda s: s["attributes"]["jaren_jobs.attempt"],
    )
    assert [s["attributes"]["jaren_jobs.attempt"] for s in flaky] == [1, 2]
    assert [s["attributes"]["jaren_jobs.outcome"] for s in flaky] == ["failed", "completed"]
    assert {s["parent_id"] for s in flaky} == {f"{by_job['flaky-1'].context.span_id:016x}"}
    first, second = flaky
    assert first["status"] == "ERROR"
    assert first["attributes"]["error.type"] == "RuntimeError"
    (exception,) = [e for e in first["events"] if e["name"] == "exception"]
    assert exception["attributes"]["exception.type"] == "RuntimeError"
    assert exception["attributes"]["exception.message"] == "first attempt fails"
    assert second["status"] == "UNSET"
    assert not [e for e in second["events"] if e["name"] == "exception"]
