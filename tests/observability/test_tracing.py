"""The tracing switch and the ``traceparent`` codec (SPEC §17), once; the spans on every
harness are tests/conformance/test_observability.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jaren_jobs
from jaren_jobs.observability import instrument, uninstrument
from jaren_jobs.observability.tracing import format_traceparent, parse_traceparent
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


def test_parse_traceparent_round_trips() -> None:
    text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    parsed = parse_traceparent(text)
    assert parsed is not None
    assert format_traceparent(parsed) == text
    assert parse_traceparent(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01") is None
    assert parse_traceparent(None) is None
    # a later version's first four fields read as version 00's
    assert parse_traceparent(text.replace("00-", "01-", 1) + "-more") is not None


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
