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
  global provider still its placeholder: what a library user pays until
  they install an SDK);
* ``otel``: ``instrument()`` with the SDK, every span recorded, a
  ``BatchSpanProcessor`` and an exporter that discards;
* ``prometheus``: ``register_metrics()`` on a registry of its own;
* ``both``: ``otel`` and ``prometheus``.

And the SDK's own floor, with nothing of jaren_jobs observing: the same SDK
set-up, and one span started and ended around each ``enqueue()`` and inside
each handler, by hand —

* ``sdk-bare``: ``tracer.start_span(name)`` / ``span.end()``, no attributes;
* ``sdk-attrs``: the same spans with the attributes SPEC §17 requires (the
  producer's five and its message id, the consumer's seven and its outcome).

``otel`` minus ``sdk-attrs`` is what jaren_jobs adds to the spans themselves.
It also times the seam alone: the four checks a job meets when nothing observes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
import timeit
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry

import jaren_jobs
from bench import cpu_seconds
from jaren_jobs import Outcome
from jaren_jobs.core.commands import PreparedJob
from jaren_jobs.observability import instrument, uninstrument
from jaren_jobs.observability.metrics import register_metrics, unregister_metrics
from jaren_jobs.observe import hooks

CONFIGS = ("none", "otel-api", "otel", "prometheus", "both")
FLOORS = ("sdk-bare", "sdk-attrs")
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


def _sdk() -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Discard()))
    return provider


def _by_hand(config: str, provider: TracerProvider) -> tuple[Any, Any]:
    """The floor's enqueue and handler: one span of the SDK's around each, by hand."""
    tracer = provider.get_tracer("floor")
    start = tracer.start_span

    if config == "sdk-bare":

        def enqueue(jobs: Any, payload: Any) -> None:
            span = start("send default")
            jobs.enqueue("noop", payload)
            span.end()

        def handler(payload: Any, ctx: Any) -> None:
            start("process default").end()

        return enqueue, handler

    def enqueue_attrs(jobs: Any, payload: Any) -> None:
        span = start(
            "send default",
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": "jaren_jobs",
                "messaging.operation.type": "send",
                "messaging.operation.name": "send",
                "messaging.destination.name": "default",
                "jaren_jobs.kind": "noop",
            },
        )
        job = jobs.enqueue("noop", payload)
        span.set_attribute("messaging.message.id", job.id)
        span.end()

    def handler_attrs(payload: Any, ctx: Any) -> None:
        span = start(
            "process default",
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": "jaren_jobs",
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": "default",
                "messaging.message.id": ctx.job.id,
                "jaren_jobs.kind": "noop",
                "jaren_jobs.attempt": ctx.job.lease.attempt,
            },
        )
        span.set_attribute("jaren_jobs.outcome", "completed")
        span.end()

    return enqueue_attrs, handler_attrs


@contextmanager
def _observed(config: str, store: Any) -> Iterator[tuple[Any, Any]]:
    """``config`` turned on for ``store`` (and off again): the enqueue of one job
    (``enqueue(jobs, payload)``) and the handler to run."""
    provider: Any = None
    registry: CollectorRegistry | None = None
    enqueue_one: Any = lambda jobs, payload: jobs.enqueue("noop", payload)  # noqa: E731
    handler: Any = lambda payload, ctx: None  # noqa: E731
    try:
        if config == "otel-api":
            instrument()  # the global provider: no SDK has been set in this process
        elif config in ("otel", "both"):
            provider = _sdk()
            instrument(tracer_provider=provider)
        elif config in FLOORS:
            provider = _sdk()
            enqueue_one, handler = _by_hand(config, provider)
        if config in ("prometheus", "both"):
            registry = CollectorRegistry()
            register_metrics(store, registry=registry)
        yield enqueue_one, handler
    finally:
        uninstrument()
        if provider is not None:
            provider.shutdown()
        if registry is not None:
            unregister_metrics(registry)


def _measure(config: str, path: Path, jobs: int, durability: str) -> dict[str, float]:
    with (
        jaren_jobs.open_store(path, durability=durability) as store,  # type: ignore[arg-type]
        _observed(config, store) as (enqueue_one, handler),
    ):
        cpu, wall = cpu_seconds(), time.perf_counter()
        for i in range(jobs):
            enqueue_one(store.jobs, {"i": i})
        enqueue_cpu, enqueue_wall = cpu_seconds() - cpu, time.perf_counter() - wall
        done = _Done(jobs)
        worker = store.jobs.create_worker({"noop": handler}, on_outcome=done)
        cpu, wall = cpu_seconds(), time.perf_counter()
        worker.start()
        if not done.event.wait(WAIT):
            raise TimeoutError(f"drained {done.count} of {jobs}")
        drain_cpu, drain_wall = cpu_seconds() - cpu, time.perf_counter() - wall
        worker.stop()
        assert store.jobs.counts().done == jobs
    return {
        "enqueue_us": enqueue_cpu / jobs * 1e6,
        "enqueue_rate": jobs / enqueue_wall,
        "drain_us": drain_cpu / jobs * 1e6,
        "drain_rate": jobs / drain_wall,
    }


def _least_per_loop(run: Callable[[], None], loops: int) -> float:
    spent = []
    for _ in range(2):  # the first also warms what the run builds once
        cpu = time.thread_time()
        run()
        spent.append(time.thread_time() - cpu)
    return min(spent) / loops * 1e6


def _hooks_alone(config: str, path: Path, loops: int) -> tuple[float, float]:
    """CPU µs of the observation work alone, per enqueue and per attempt (this thread).

    What the engine's and the worker's call sites run — for ``none`` their
    checks only — on one real job (claimed, with the trace context its traced
    enqueue stored), repeated ``loops`` times; the floors' spans made by hand
    instead. Free of the drain's SQLite work, so far steadier on a shared
    machine; the span processor's export thread is not in it (the drain's
    figures have it).
    """
    with (
        jaren_jobs.open_store(path) as store,
        _observed(config, store) as (enqueue_one, handler),
    ):
        enqueue_one(store.jobs, {})
        job = store.jobs.claim(["noop"], owner="bench")
        assert job is not None
        outcome = Outcome("completed", job.id, "noop", 1, job.lease.generation)
        item = PreparedJob(None, "noop", "{}", None, None, 3, 0, "default", None, False)
        ctx = SimpleNamespace(job=job)  # what the floor's handler reads

        class _Answered:  # the floor's enqueue wraps this: the insert's answer, ready
            @staticmethod
            def enqueue(kind: str, payload: Any) -> Any:
                return job

        def hooked_enqueues() -> None:
            for _ in range(loops):
                if hooks.observers:
                    _, sends = hooks.sending((item,))
                    if sends is not None:
                        ends: list[Any] = []
                        sends.sent((job,), ends.append)
                        for end in ends:
                            end()

        def floor_enqueues() -> None:
            for _ in range(loops):
                enqueue_one(_Answered, None)

        def attempts() -> None:
            for _ in range(loops):
                observed = None
                if hooks.observers:
                    observed = hooks.attempt_started(job, 0)
                if observed is None:
                    handler(None, ctx)
                else:
                    hooks.call(observed, handler, None, ctx)
                    hooks.attempt_ended(observed, job, outcome, None)
                if hooks.observers:
                    hooks.settlement_batch(1)

        enqueues = floor_enqueues if config in FLOORS else hooked_enqueues
        return _least_per_loop(enqueues, loops), _least_per_loop(attempts, loops)


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
    parser.add_argument("--loops", type=int, default=5000, help="repeats of the hooks alone")
    args = parser.parse_args(argv)
    every = CONFIGS + FLOORS
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in every}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            shift = round_ % len(every)
            for config in every[shift:] + every[:shift]:
                path = Path(folder) / f"{config}-{round_}.db"
                runs[config].append(_measure(config, path, args.jobs, args.durability))

    def median(config: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[config])

    def spread(config: str, key: str) -> str:
        values = [run[key] for run in runs[config]]
        return f"{min(values):.0f}-{max(values):.0f}"

    print(
        f"{args.jobs} no-op jobs, enqueue() one by one then a 1-thread worker's drain, SQLite "
        f"({args.durability}); CPU µs per job (all threads), median of {args.rounds} rounds "
        "(range: the rounds' lowest and highest)"
    )
    print(
        f"{'config':<12}{'drain µs/job':>13}{'range':>9}{'cost':>9}{'drain jobs/s':>14}"
        f"{'enqueue µs/job':>16}{'range':>9}{'cost':>9}"
    )
    base_drain, base_enqueue = median("none", "drain_us"), median("none", "enqueue_us")
    for config in every:
        drain, enqueue = median(config, "drain_us"), median(config, "enqueue_us")
        print(
            f"{config:<12}{drain:>13.1f}{spread(config, 'drain_us'):>9}"
            f"{_cost(base_drain, drain):>9}{median(config, 'drain_rate'):>14,.0f}"
            f"{enqueue:>16.1f}{spread(config, 'enqueue_us'):>9}{_cost(base_enqueue, enqueue):>9}"
        )
    floor_drain = median("sdk-attrs", "drain_us") - base_drain
    floor_enqueue = median("sdk-attrs", "enqueue_us") - base_enqueue
    print(
        f"the SDK's floor (sdk-attrs - none): {floor_drain:.1f} µs per attempt's span, "
        f"{floor_enqueue:.1f} µs per enqueue's; jaren_jobs' tracing above it (otel - sdk-attrs): "
        f"{median('otel', 'drain_us') - median('sdk-attrs', 'drain_us'):+.1f} µs per attempt, "
        f"{median('otel', 'enqueue_us') - median('sdk-attrs', 'enqueue_us'):+.1f} µs per enqueue"
    )
    # rounds rotate the order here too, and the least of a configuration's rounds
    # is kept: another process's load only ever adds to a figure
    alone: dict[str, list[tuple[float, float]]] = {c: [] for c in every}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            shift = round_ % len(every)
            for config in every[shift:] + every[:shift]:
                path = Path(folder) / f"{config}-{round_}.db"
                alone[config].append(_hooks_alone(config, path, args.loops))
    print(
        "the observation work alone (the call sites' hooks on one real job, repeated "
        f"{args.loops} times; this thread's CPU, the least of {args.rounds} rounds): "
        "µs per enqueue, per attempt, and above none"
    )
    base_alone = min(e for e, _ in alone["none"]), min(a for _, a in alone["none"])
    for config in every:
        enqueue_alone = min(e for e, _ in alone[config])
        attempt_alone = min(a for _, a in alone[config])
        print(
            f"  {config:<12}{enqueue_alone:>8.2f}{attempt_alone:>8.2f}"
            f"{enqueue_alone - base_alone[0]:>+10.2f}{attempt_alone - base_alone[1]:>+8.2f}"
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
