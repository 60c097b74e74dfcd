"""What the observability tests share: a real OpenTelemetry SDK with its in-memory exporter.

``traced`` is a fixture; a test module imports it (the conformance suite's
tests/conformance/test_observability.py, and tests/observability/).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from jaren_jobs.observability import instrument, uninstrument


class Traced:
    """The process instrumented: a provider whose spans land in ``exporter``."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("tests")

    def spans(self, name: str | None = None) -> list[Any]:
        found = list(self.exporter.get_finished_spans())
        return found if name is None else [s for s in found if s.name == name]


@pytest.fixture
def traced() -> Iterator[Traced]:
    scene = Traced()
    instrument(tracer_provider=scene.provider)
    try:
        yield scene
    finally:
        uninstrument()
        scene.provider.shutdown()


__all__ = ["Traced", "traced"]
