"""A worker in a process of its own, traced, writing its finished spans as JSON lines.

``python -m tests.observability.worker_child DATABASE SPANS_FILE sync|async N``: runs
the handlers below until N jobs are settled (done or dead), then exits. Every
span it finished is a line of SPANS_FILE (name, kind, ids, parent, attributes,
status, events).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import jaren_jobs
from jaren_jobs.observability import instrument, uninstrument

PAUSE = 0.02  # between empty polls while a retry's backoff runs out
DEADLINE = 60.0


class JsonLines(SpanExporter):
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed at shutdown
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            for span in spans:
                parent = span.parent
                self._file.write(
                    json.dumps(
                        {
                            "name": span.name,
                            "kind": span.kind.name,
                            "trace_id": f"{span.context.trace_id:032x}",
                            "span_id": f"{span.context.span_id:016x}",
                            "parent_id": None if parent is None else f"{parent.span_id:016x}",
                            "attributes": dict(span.attributes or {}),
                            "status": span.status.status_code.name,
                            "events": [
                                {"name": e.name, "attributes": dict(e.attributes or {})}
                                for e in span.events
                            ],
                        }
                    )
                    + "\n"
                )
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._file.close()


def flaky(payload: Any, ctx: Any) -> Any:
    if ctx.job.attempts == 1:
        raise RuntimeError("first attempt fails")
    return "second time lucky"


def ok(payload: Any, ctx: Any) -> Any:
    return payload


async def aflaky(payload: Any, ctx: Any) -> Any:
    return flaky(payload, ctx)


async def aok(payload: Any, ctx: Any) -> Any:
    return payload


OPTIONS: dict[str, Any] = {"backoff_base_seconds": 0.05, "backoff_cap_seconds": 0.05}


def settled(counts: Any) -> int:
    return int(counts.done + counts.dead + counts.cancelled)


def run_sync(database: str, expected: int) -> None:
    with jaren_jobs.open_store(database) as store:
        worker = store.jobs.create_worker({"ok": ok, "flaky": flaky}, **OPTIONS)
        stop = threading.Event()
        deadline = threading.Timer(DEADLINE, stop.set)
        deadline.start()
        try:
            while settled(store.jobs.counts()) < expected and not stop.is_set():
                if not worker.run_once():
                    stop.wait(PAUSE)
        finally:
            deadline.cancel()
            worker.stop()


async def run_async(database: str, expected: int) -> None:
    async with jaren_jobs.open_async_store(database) as store:
        worker = store.jobs.create_worker({"ok": aok, "flaky": aflaky}, **OPTIONS)
        loop = asyncio.get_running_loop()
        end = loop.time() + DEADLINE
        try:
            while settled(await store.jobs.counts()) < expected and loop.time() < end:
                if not await worker.run_once():
                    await asyncio.sleep(PAUSE)
        finally:
            await worker.stop()


def main(argv: list[str]) -> None:
    database, spans, mode, expected = argv
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLines(spans)))
    instrument(tracer_provider=provider)
    try:
        if mode == "sync":
            run_sync(database, int(expected))
        else:
            asyncio.run(run_async(database, int(expected)))
    finally:
        uninstrument()
        provider.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
