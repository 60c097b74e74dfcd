"""Metrics and traces (SPEC §17), each an optional extra.

* ``jaren_jobs[otel]``: :func:`instrument` / :func:`uninstrument` — OpenTelemetry
  spans for every enqueue and every attempt (:mod:`.tracing`).
* ``jaren_jobs[prometheus]``: :func:`register_metrics` — Prometheus counters,
  histograms and gauges (:mod:`.metrics`).

Importing this package imports neither OpenTelemetry nor ``prometheus_client``:
each is imported by the first call that needs it, and a missing one is an
``ImportError`` naming the extra to install. ``import jaren_jobs`` imports
neither, nor this package.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider
    from prometheus_client import CollectorRegistry

__all__ = ["instrument", "register_metrics", "uninstrument"]

_EXTRAS = {"tracing": ("otel", "opentelemetry-api"), "metrics": ("prometheus", "prometheus_client")}


def _load(name: str) -> ModuleType:
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ImportError as exc:
        extra, package = _EXTRAS[name]
        raise ImportError(
            f"jaren_jobs.observability needs {package} for this: pip install 'jaren_jobs[{extra}]'"
        ) from exc


def instrument(*, tracer_provider: TracerProvider | None = None) -> None:
    """Trace every enqueue and attempt of every store in this process (process-wide,
    idempotent); ``tracer_provider`` defaults to OpenTelemetry's global one."""
    _load("tracing").instrument(tracer_provider=tracer_provider)


def uninstrument() -> None:
    """Stop tracing (idempotent)."""
    if f"{__name__}.tracing" in sys.modules:  # never traced: nothing to import
        _load("tracing").uninstrument()


def register_metrics(store: Any, *, registry: CollectorRegistry | None = None) -> None:
    """Add the metrics of SPEC §17 for ``store`` (a Store or AsyncStore) to ``registry``
    (prometheus_client's default registry when ``None``)."""
    _load("metrics").register_metrics(store, registry=registry)
