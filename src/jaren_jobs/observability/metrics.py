"""Prometheus metrics (SPEC §17): what the workers did, and what the store holds.

Counters and histograms are fed by every worker of the process through the
observation seam (:mod:`jaren_jobs.observe`); the gauges of the store
(jobs by queue and state, the oldest ready job's age, expired leases) are
read when the registry is scraped, by ONE statement whose answer is reused
for ``cache_seconds``, so a scrape's cost on the database is bounded
whatever the scrape rate. Labels are the queue, the kind, the state and the
outcome: never an id, an owner or a lease token.

Needs ``prometheus_client`` (the extra ``jaren_jobs[prometheus]``).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import make_wsgi_app
from prometheus_client.registry import Collector

from jaren_jobs.aio.store import AsyncStore
from jaren_jobs.codec import ms_from_datetime
from jaren_jobs.errors import JobsError
from jaren_jobs.jobs import engine_of
from jaren_jobs.observe import Observer, add, remove
from jaren_jobs.records import STATES
from jaren_jobs.store import Store

__all__ = [
    "MetricsServer",
    "exposition",
    "register_metrics",
    "serve_metrics",
    "unregister_metrics",
]

_log = logging.getLogger("jaren_jobs.observability")

#: how long one gauge query's answer is reused by later scrapes
CACHE_SECONDS = 2.0

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
_DELAY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class _Metrics(Observer):
    """The counters and histograms of one registry, fed by every worker of the process."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.attempts = Counter(
            "jaren_jobs_attempts",
            "Attempts that ended, by queue, kind and outcome.",
            ["queue", "kind", "outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            "jaren_jobs_attempt_duration_seconds",
            "An attempt's time from its start to its outcome (handler and settlement).",
            ["queue", "kind"],
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        self.delay = Histogram(
            "jaren_jobs_start_delay_seconds",
            "From when a job was due (run_at) to when an attempt of it started.",
            ["queue"],
            buckets=_DELAY_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "jaren_jobs_attempts_in_flight",
            "Attempts started and not yet ended, in this process.",
            ["queue"],
            registry=registry,
        )
        self.batches = Histogram(
            "jaren_jobs_settlement_batch_size",
            "Settlements a worker's settling thread wrote in one transaction.",
            buckets=_BATCH_BUCKETS,
            registry=registry,
        )
        # labelled children by label values: a dict lookup per attempt, not labels()
        self._children: dict[tuple[Any, ...], Any] = {}

    def collectors(self) -> tuple[Any, ...]:
        return (self.attempts, self.duration, self.delay, self.in_flight, self.batches)

    def _child(self, metric: Any, *values: str) -> Any:
        key = (id(metric), *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def attempt_started(self, job: Any, now_ms: int) -> Any:
        queue = job.queue
        due = ms_from_datetime(job.run_at)
        self._child(self.delay, queue).observe(max(0, now_ms - due) / 1000)
        self._child(self.in_flight, queue).inc()
        return time.perf_counter()

    def attempt_ended(
        self, state: Any, job: Any, outcome: Any, error: BaseException | None
    ) -> None:
        queue, kind = job.queue, job.kind
        self._child(self.in_flight, queue).dec()
        self._child(self.attempts, queue, kind, outcome.outcome).inc()
        self._child(self.duration, queue, kind).observe(time.perf_counter() - state)

    def settlement_batch(self, size: int) -> None:
        self.batches.observe(size)


class _StoreGauges(Collector):
    """The store's gauges, read at scrape time: one statement per ``cache_seconds``."""

    def __init__(self, store: Any, cache_seconds: float) -> None:
        self._engine = engine_of(store.jobs)
        self._cache_seconds = cache_seconds
        self._lock = threading.Lock()
        self._read_at = -float("inf")
        self._rows: list[tuple[Any, ...]] = []
        self._now_ms = 0

    def _read(self) -> tuple[list[tuple[Any, ...]], int]:
        with self._lock:
            if time.monotonic() - self._read_at >= self._cache_seconds:
                now = self._engine.runtime.now_ms()
                try:
                    rows = self._engine.session.queue_gauges(now, "metrics scrape")
                except JobsError as exc:
                    # a scrape never fails over the store: its gauges are left out
                    _log.warning("jaren_jobs: metrics scrape could not read the store: %s", exc)
                    return [], 0
                self._rows, self._now_ms, self._read_at = rows, now, time.monotonic()
            return self._rows, self._now_ms

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # names only: registering reads nothing from the store
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rows, now = self._read()
        jobs, oldest, expired = self._families()
        counts: dict[tuple[str, str], int] = {}
        earliest: dict[str, int] = {}
        leases: dict[str, int] = {}
        for queue, state, count, ready_at, expired_count in rows:
            counts[(queue, state)] = counts.get((queue, state), 0) + int(count)
            leases[queue] = leases.get(queue, 0) + int(expired_count or 0)
            if ready_at is not None:
                earliest[queue] = min(int(ready_at), earliest.get(queue, int(ready_at)))
        for queue in sorted(leases):
            for state in STATES:  # every state of a queue, zeros too: a panel has no gaps
                jobs.add_metric([queue, state], counts.get((queue, state), 0))
            ready_at = earliest.get(queue)
            oldest.add_metric([queue], 0.0 if ready_at is None else max(0, now - ready_at) / 1000)
            expired.add_metric([queue], leases[queue])
        yield from (jobs, oldest, expired)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "jaren_jobs_jobs",
                "Jobs in the store, by queue and state.",
                labels=["queue", "state"],
            ),
            GaugeMetricFamily(
                "jaren_jobs_oldest_ready_age_seconds",
                "How long the oldest ready job (pending or failed, run_at passed) has waited.",
                labels=["queue"],
            ),
            GaugeMetricFamily(
                "jaren_jobs_expired_leases",
                "Leased jobs whose lease ran out (their holder is gone or late).",
                labels=["queue"],
            ),
        )


# per registry: its metrics observer, the store whose gauges it reads, and those gauges
_registered: dict[int, tuple[CollectorRegistry, _Metrics, Any, _StoreGauges]] = {}
_lock = threading.Lock()


def register_metrics(
    store: Any, *, registry: CollectorRegistry | None = None, cache_seconds: float = CACHE_SECONDS
) -> None:
    """Add jaren_jobs' metrics (SPEC §17) to ``registry`` (the default one when ``None``).

    ``store`` is a :class:`~jaren_jobs.Store` or an :class:`~jaren_jobs.AsyncStore`;
    its gauges are read at scrape time (one statement, reused for
    ``cache_seconds``). The attempt counters and histograms count every
    worker of the process. A registry holds one store's gauges: registering
    the same store again does nothing, another store is a ``ValueError``.
    """
    target = REGISTRY if registry is None else registry
    if isinstance(store, AsyncStore):
        sync = store.store  # scrapes read from the scraping thread, never the loop
    elif isinstance(store, Store):
        sync = store
    else:
        raise TypeError(
            f"register_metrics() takes a jaren_jobs Store or AsyncStore, got {type(store).__name__}"
        )
    with _lock:
        known = _registered.get(id(target))
        if known is not None and known[0] is target:
            if known[2] is sync:
                return
            raise ValueError(
                "register_metrics(): this registry already holds the gauges of another store; "
                "give each store a registry of its own"
            )
        metrics = _Metrics(target)
        gauges = _StoreGauges(sync, cache_seconds)
        target.register(gauges)
        _registered[id(target)] = (target, metrics, sync, gauges)
        add(metrics)


def unregister_metrics(registry: CollectorRegistry | None = None) -> None:
    """Take jaren_jobs' metrics out of ``registry`` again (not there: nothing happens)."""
    target = REGISTRY if registry is None else registry
    with _lock:
        known = _registered.pop(id(target), None)
    if known is None:
        return
    _, metrics, _, gauges = known
    remove(metrics)
    for collector in (*metrics.collectors(), gauges):
        target.unregister(collector)


# the dashboard's registries: one per store, made at its first /metrics
_exposed: weakref.WeakKeyDictionary[Any, CollectorRegistry] = weakref.WeakKeyDictionary()
_exposing = threading.Lock()


def exposition(store: Any) -> tuple[bytes, str]:
    """The text a ``/metrics`` endpoint answers for ``store``, and its content type.

    The store's metrics go in a registry of their own, made at the first call
    and kept while the store lives (the dashboard's ``/metrics``).
    """
    with _exposing:  # two first requests at once make one registry
        registry = _exposed.get(store)
        if registry is None:
            registry = CollectorRegistry()
            register_metrics(store, registry=registry)
            _exposed[store] = registry
            weakref.finalize(store, unregister_metrics, registry)
    return generate_latest(registry), CONTENT_TYPE_LATEST


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None


class MetricsServer:
    """A ``/metrics`` endpoint on a thread of its own (see :func:`serve_metrics`)."""

    def __init__(self, server: WSGIServer) -> None:
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="jaren_jobs-metrics", daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self._server.server_address[0]
        return f"http://{host if isinstance(host, str) else host.decode()}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def serve_metrics(
    registry: CollectorRegistry, *, port: int, host: str = "127.0.0.1"
) -> MetricsServer:
    """Serve ``registry`` at ``http://host:port/metrics`` (port 0: any free port)."""
    app = make_wsgi_app(registry)
    return MetricsServer(make_server(host, port, app, handler_class=_Quiet))
