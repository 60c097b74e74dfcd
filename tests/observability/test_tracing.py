"""The tracing switch and the ``traceparent`` codec (SPEC §17), once; the spans on every
harness are tests/conformance/test_observability.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.trace import NoOpTracerProvider

import jaren_jobs
from jaren_jobs.observability import instrument, uninstrument
from jaren_jobs.observability.tracing import format_traceparent, parse_traceparent
from jaren_jobs.observe import hooks
from tests.observability.support import Traced

# ---------------------------------------------------------------- the switch (once)


def test_instrument_is_idempotent_and_uninstrument_stops_it(tmp_path: Path) -> None:
    first, second = Traced(), Traced()
    try:
        with jaren_jobs.open_store(tmp_path / "q.db") as store:
            instrument(tracer_provider=first.provider)
            instrument(tracer_provider=first.provider)
            store.jobs.enqueue("k", id="one")
            assert len(first.spans("send default")) == 1  # not two: installed once
            instrument(tracer_provider=second.provider)  # replaces the first
            store.jobs.enqueue("k", id="two")
            assert len(first.spans()) == 1
            assert len(second.spans()) == 1
            uninstrument()
            uninstrument()
            store.jobs.enqueue("k", id="three")
            assert store.jobs.claim(["k"], owner="w") is not None
            assert len(first.spans()) + len(second.spans()) == 2
    finally:
        uninstrument()


_VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_parse_traceparent_round_trips() -> None:
    parsed = parse_traceparent(_VALID)
    assert parsed is not None
    assert parsed.is_remote
    assert format_traceparent(parsed) == _VALID
    assert parse_traceparent(_VALID.encode()) is None
    assert parse_traceparent(None) is None
    # a later version's first four fields read as version 00's
    later = parse_traceparent("cc" + _VALID[2:] + "-more")
    assert later is not None
    assert format_traceparent(later) == _VALID
    assert parse_traceparent("cc" + _VALID[2:]) is not None
    # only the sampled flag is kept
    unsampled = parse_traceparent(_VALID[:-2] + "fe")
    assert unsampled is not None
    assert int(unsampled.trace_flags) == 0


@pytest.mark.parametrize(
    "text",
    [
        _VALID.upper(),  # lowercase hex only
        _VALID.replace("4bf9", "4BF9"),
        _VALID.replace("4bf9", "0x4b"),  # what int(text, 16) would accept
        _VALID.replace("4bf9", "4_f9"),
        _VALID.replace("4bf9", " bf9"),
        _VALID.replace("-00f0", "-+0f0"),
        _VALID.replace("4bf9", "\u0664bf9"),  # a digit int() reads, not ASCII
        _VALID[:-1],  # short
        _VALID.replace("-", "_"),
        _VALID.replace("36-00", "3-600"),  # a dash one place off
        _VALID + "-more",  # version 00 has no fifth field
        _VALID + "0",
        "ff" + _VALID[2:],  # version ff is invalid
        "cc" + _VALID[2:] + "more",  # a later version's fields follow a dash
        "cc" + _VALID[2:] + "-more\nlines",
        "00-" + "0" * 32 + "-00f067aa0ba902b7-01",  # an all-zero id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",
        _VALID[:53] + "0g",
        "",
    ],
)
def test_parse_traceparent_refuses_what_is_not_one(text: str) -> None:
    assert parse_traceparent(text) is None


def test_no_sdk_records_nothing_until_the_application_configures_one() -> None:
    # instrument() before the application sets its SDK (the global provider is
    # OpenTelemetry's placeholder): nothing is traced, and once the SDK is set the
    # next enqueue and attempt are. A process of its own: a global provider is set once.
    code = """
import jaren_jobs
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from jaren_jobs.observability import instrument

instrument()
store = jaren_jobs.open_store(":memory:")
store.jobs.enqueue("k", id="before")
assert store.jobs.claim(["k"], owner="w").trace_context is None
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
store.jobs.enqueue("k", id="after")
worker = store.jobs.create_worker({"k": lambda p, c: None})
while worker.run_once():
    pass
worker.stop()
spans = {(s.name, s.attributes["messaging.message.id"]): s for s in exporter.get_finished_spans()}
assert sorted(spans) == [("process default", "after"), ("send default", "after")], sorted(spans)
process, send = spans["process default", "after"], spans["send default", "after"]
assert process.parent.span_id == send.context.span_id
assert process.attributes["jaren_jobs.outcome"] == "completed"
store.close()
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


def test_a_no_op_provider_leaves_the_process_unobserved(tmp_path: Path) -> None:
    # a tracer that can never record: instrument() installs nothing, so the seam
    # costs what it costs with nothing observing
    before = hooks.observers
    try:
        instrument(tracer_provider=NoOpTracerProvider())
        assert hooks.observers == before
        with jaren_jobs.open_store(tmp_path / "q.db") as store:
            store.jobs.enqueue("k", id="j")
            claimed = store.jobs.claim(["k"], owner="w")
            assert claimed is not None
            assert claimed.trace_context is None
        # and a later instrument() with a real provider replaces it
        scene = Traced()
        instrument(tracer_provider=scene.provider)
        assert len(hooks.observers) == len(before) + 1
    finally:
        uninstrument()
    assert hooks.observers == before


def test_import_jaren_jobs_imports_neither_extra() -> None:
    code = (
        "import sys, jaren_jobs, jaren_jobs.observability\n"
        "store = jaren_jobs.open_store(':memory:')\n"
        "store.jobs.enqueue('k')\n"
        "store.close()\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in "
        "('opentelemetry', 'prometheus_client')]\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
