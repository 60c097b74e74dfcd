"""What metrics and traces cost (SPEC §17): the no-op drain with none / otel / prometheus / both.

    python -m bench.observability [--jobs 4000] [--rounds 5] [--durability normal]

Each configuration enqueues ``--jobs`` no-op jobs one ``enqueue()`` at a time
(with its instrumentation on, so each attempt's span has a producer span to
join) and drains them with one started worker, on a fresh SQLite file. The
cost is CPU time per job (this process, every thread: the worker's loop and
settling threads, a span processor's export thread), which other processes
on a shared machine disturb far less than wall time; the wall-clock drain
rate is shown beside it. Rounds rotate the order; each figure is a median.

* ``none``: nothing observes (the seam's empty-tuple checks only);
* ``otel-api``: ``instrument()`` with no SDK configured (OpenTelemetry's
  no-op tracer: what a library user pays until they install an SDK);
* ``otel``: ``instrument()`` with the SDK, every span recorded, a
  ``BatchSpanProcessor`` and an exporter that discards;
* ``prometheus``: ``register_metrics()`` on a registry of its own;
* ``both``: ``otel`` and ``prometheus``.

It also times the seam alone: the four checks a job meets when nothing observes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
import timeit
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

import jaren_jobs
from bench import cpu_seconds
from jaren_jobs import Outcome
from jaren_jobs.observability import instrument, uninstrument
from jaren_jobs.observability.metrics import register_metrics, unregister_metrics
from jaren_jobs.observe import hooks

CONFIGS = ("none", "otel-api", "otel", "prometheus", "both")
WAIT = 300.0


class _Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


class _Done:
    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.event = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, outcome: Outcome) -> None:
        with self.lock:
            self.count += 1
            if self.count == self.target:
                self.event.set()


def _measure(config: str, path: Path, jobs: int, durability: str) -> dict[str, float]:
    provider: Any = None
    registry: CollectorRegistry | None = None
    with jaren_jobs.open_store(path, durability=durability) as store:  # type: ignore[arg-type]
        if config == "otel-api":
            provider = NoOpTracerProvider()
            instrument(tracer_provider=provider)
        elif config in ("otel", "both"):
            provider = TracerProvider()
            provider.add_span_processor(BatchSpanProcessor(_Discard()))
            instrument(tracer_provider=provider)
        if config in ("prometheus", "both"):
            registry = CollectorRegistry()
            register_metrics(store, registry=registry)
        try:
            cpu, wall = cpu_seconds(), time.perf_counter()
            enqueue = store.jobs.enqueue
            for i in range(jobs):
                enqueue("noop", {"i": i})
            enqueue_cpu, enqueue_wall = cpu_seconds() - cpu, time.perf_counter() - wall
            done = _Done(jobs)
            worker = store.jobs.create_worker({"noop": lambda p, c: None}, on_outcome=done)
            cpu, wall = cpu_seconds(), time.perf_counter()
            worker.start()
            if not done.event.wait(WAIT):
                raise TimeoutError(f"drained {done.count} of {jobs}")
            drain_cpu, drain_wall = cpu_seconds() - cpu, time.perf_counter() - wall
            worker.stop()
            assert store.jobs.counts().done == jobs
        finally:
            if provider is not None:
                uninstrument()
                if isinstance(provider, TracerProvider):
                    provider.shutdown()
            if registry is not None:
                unregister_metrics(registry)
    return {
        "enqueue_us": enqueue_cpu / jobs * 1e6,
        "enqueue_rate": jobs / enqueue_wall,
        "drain_us": drain_cpu / jobs * 1e6,
        "drain_rate": jobs / drain_wall,
    }


def seam_seconds() -> float:
    """The checks one job meets when nothing observes (seconds): enqueue, attempt start,
    attempt end, settlement batch — each one test of an empty tuple (or None)."""
    loops = 200_000
    spent = timeit.timeit("if hooks.observers: pass", globals={"hooks": hooks}, number=loops)
    return spent / loops * 4


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.observability", description=__doc__)
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--durability", default="normal")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            shift = round_ % len(CONFIGS)
            for config in CONFIGS[shift:] + CONFIGS[:shift]:
                path = Path(folder) / f"{config}-{round_}.db"
                runs[config].append(_measure(config, path, args.jobs, args.durability))

    def median(config: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[config])

    print(
        f"{args.jobs} no-op jobs, enqueue() one by one then a 1-thread worker's drain, SQLite "
        f"({args.durability}); CPU µs per job (all threads), median of {args.rounds} rounds"
    )
    print(
        f"{'config':<12}{'drain µs/job':>13}{'cost':>9}{'drain jobs/s':>14}"
        f"{'enqueue µs/job':>16}{'cost':>9}"
    )
    base_drain, base_enqueue = median("none", "drain_us"), median("none", "enqueue_us")
    for config in CONFIGS:
        drain, enqueue = median(config, "drain_us"), median(config, "enqueue_us")
        print(
            f"{config:<12}{drain:>13.1f}{_cost(base_drain, drain):>9}"
            f"{median(config, 'drain_rate'):>14,.0f}"
            f"{enqueue:>16.1f}{_cost(base_enqueue, enqueue):>9}"
        )
    seam = seam_seconds()
    print(
        f"the seam with nothing observing: {seam * 1e9:.0f} ns per job "
        f"({seam * 1e6 / base_drain * 100:.2f}% of a drained job's {base_drain:.0f} µs of CPU)"
    )
    return 0


def _cost(base: float, value: float) -> str:
    return f"{(value / base - 1) * 100:+.1f}%"


if __name__ == "__main__":
    raise SystemExit(main())
