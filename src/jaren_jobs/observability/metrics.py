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
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import make_wsgi_app
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

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


class _Tally:
    """One thread's counts since it first fed the metrics: written by that thread alone.

    One writer per tally keeps every count exact without a lock on the hot
    path (an attempt's start and end are a few dict and list updates); a
    scrape sums the tallies. A histogram's row is its bucket counts (not
    cumulative, +Inf last) and then its sum.
    """

    __slots__ = ("attempts", "batches", "created", "delay", "duration", "in_flight", "thread")

    def __init__(self, thread: threading.Thread | None) -> None:
        self.thread = thread
        self.attempts: dict[tuple[str, str, str], int] = {}
        self.duration: dict[tuple[str, str], list[float]] = {}
        self.delay: dict[str, list[float]] = {}
        self.in_flight: dict[str, int] = {}
        self.batches: list[float] = [0] * (len(_BATCH_BUCKETS) + 2)
        # when each series first appeared (its ``_created`` sample), by metric and labels
        self.created: dict[tuple[str, Any], float] = {}


def _row(buckets: tuple[float, ...]) -> list[float]:
    return [0] * (len(buckets) + 2)


def _observe(row: list[float], buckets: tuple[float, ...], value: float) -> None:
    # the first bucket whose bound is >= value (``le``), +Inf past the last
    row[bisect_left(buckets, value)] += 1
    row[-1] += value


def _sum_rows(into: dict[Any, list[float]], rows: dict[Any, list[float]]) -> None:
    for key, live in list(rows.items()):  # one C call: the writer may add keys meanwhile
        row = live[:]
        known = into.get(key)
        if known is None:
            into[key] = row
        else:
            for index, value in enumerate(row):
                known[index] += value


def _sum_counts(into: dict[Any, int], counts: dict[Any, int]) -> None:
    for key, value in list(counts.items()):
        into[key] = into.get(key, 0) + value


class _Metrics(Observer, Collector):
    """The counters and histograms of one registry, fed by every worker of the process.

    Each feeding thread keeps a :class:`_Tally` of its own; :meth:`collect`
    sums them into the families prometheus_client exposes. A thread that has
    ended has its tally folded into one of the retired ones at the next scrape, so
    threads coming and going do not grow the list.
    """

    def __init__(self, clock: Callable[[], int]) -> None:
        self._clock = clock  # epoch ms: when a series first appeared (its ``_created``)
        self._local = threading.local()
        self._lock = threading.Lock()  # taken by a thread's first feed and by scrapes
        self._tallies: list[_Tally] = []
        self._retired = _Tally(None)
        # unlabelled: exposed from the start
        self._retired.created["batches", ()] = clock() / 1000

    def _tally(self) -> _Tally:
        try:
            tally: _Tally = self._local.tally
            return tally
        except AttributeError:
            tally = self._local.tally = _Tally(threading.current_thread())
            with self._lock:
                # a new thread is when the ended ones are let go too, scraped or not
                self._retire()
                self._tallies.append(tally)
            return tally

    def _retire(self) -> None:
        """Fold the tallies of threads that ended into the retired one (under the lock)."""
        live: list[_Tally] = []
        for tally in self._tallies:
            if tally.thread is not None and not tally.thread.is_alive():
                # a thread that ended writes no more: its counts join the retired ones
                _fold(self._retired, tally)
            else:
                live.append(tally)
        self._tallies = live

    def attempt_started(self, job: Any, now_ms: int) -> Any:
        tally = self._tally()
        queue = job.queue
        row = tally.delay.get(queue)
        if row is None:
            row = tally.delay[queue] = _row(_DELAY_BUCKETS)
            tally.created["delay", queue] = self._clock() / 1000
        delay = max(0, now_ms - ms_from_datetime(job.run_at)) / 1000
        row[bisect_left(_DELAY_BUCKETS, delay)] += 1
        row[-1] += delay
        in_flight = tally.in_flight
        in_flight[queue] = in_flight.get(queue, 0) + 1
        return time.perf_counter()

    def attempt_ended(
        self, state: Any, job: Any, outcome: Any, error: BaseException | None
    ) -> None:
        spent = time.perf_counter() - state
        tally = self._tally()
        queue, kind = job.queue, job.kind
        in_flight = tally.in_flight
        # an attempt may end in another thread than it started: the sum is what counts
        in_flight[queue] = in_flight.get(queue, 0) - 1
        key = (queue, kind, outcome.outcome)
        attempts = tally.attempts
        count = attempts.get(key)
        if count is None:
            attempts[key] = 1
            tally.created["attempts", key] = self._clock() / 1000
        else:
            attempts[key] = count + 1
        pair = (queue, kind)
        row = tally.duration.get(pair)
        if row is None:
            row = tally.duration[pair] = _row(_DURATION_BUCKETS)
            tally.created["duration", pair] = self._clock() / 1000
        row[bisect_left(_DURATION_BUCKETS, spent)] += 1
        row[-1] += spent

    def settlement_batch(self, size: int) -> None:
        _observe(self._tally().batches, _BATCH_BUCKETS, size)

    def _summed(self) -> _Tally:
        total = _Tally(None)
        with self._lock:
            self._retire()
            for tally in (self._retired, *self._tallies):
                _fold(total, tally)
        return total

    def describe(self) -> Iterator[Metric]:
        # names only: registering reads nothing
        return iter(self._families(_Tally(None), with_created=False))

    def collect(self) -> Iterator[Metric]:
        # prometheus_client's switch of the ``_created`` series (disable_created_metrics())
        with_created = bool(getattr(prometheus_metrics, "_use_created", True))
        return iter(self._families(self._summed(), with_created=with_created))

    @staticmethod
    def _families(total: _Tally, *, with_created: bool) -> list[Metric]:
        created = total.created if with_created else {}
        attempts = CounterMetricFamily(
            "jaren_jobs_attempts",
            "Attempts that ended, by queue, kind and outcome.",
            labels=["queue", "kind", "outcome"],
        )
        for key, count in sorted(total.attempts.items()):
            attempts.add_metric(key, count, created.get(("attempts", key)))
        duration = HistogramMetricFamily(
            "jaren_jobs_attempt_duration_seconds",
            "An attempt's time from its start to its outcome (handler and settlement).",
            labels=["queue", "kind"],
        )
        for pair, row in sorted(total.duration.items()):
            _add_histogram(duration, pair, row, _DURATION_BUCKETS, created.get(("duration", pair)))
        delay = HistogramMetricFamily(
            "jaren_jobs_start_delay_seconds",
            "From when a job was due (run_at) to when an attempt of it started.",
            labels=["queue"],
        )
        for queue, row in sorted(total.delay.items()):
            _add_histogram(delay, (queue,), row, _DELAY_BUCKETS, created.get(("delay", queue)))
        in_flight = GaugeMetricFamily(
            "jaren_jobs_attempts_in_flight",
            "Attempts started and not yet ended, in this process.",
            labels=["queue"],
        )
        for queue, count in sorted(total.in_flight.items()):
            in_flight.add_metric([queue], count)
        batches = HistogramMetricFamily(
            "jaren_jobs_settlement_batch_size",
            "Settlements a worker's settling thread wrote in one transaction.",
            labels=[],
        )
        # unlabelled: present from the start, zeros included
        _add_histogram(batches, (), total.batches, _BATCH_BUCKETS, created.get(("batches", ())))
        return [attempts, duration, delay, in_flight, batches]


def _fold(into: _Tally, tally: _Tally) -> None:
    _sum_counts(into.attempts, tally.attempts)
    _sum_rows(into.duration, tally.duration)
    _sum_rows(into.delay, tally.delay)
    _sum_counts(into.in_flight, tally.in_flight)
    for index, value in enumerate(tally.batches[:]):
        into.batches[index] += value
    for key, at in list(tally.created.items()):
        into.created[key] = min(at, into.created.get(key, at))


def _le(bound: float) -> str:
    # a bucket's ``le`` label, written as prometheus_client's own histograms write it
    text: str = floatToGoString(bound)  # type: ignore[no-untyped-call]
    return text


def _add_histogram(
    family: HistogramMetricFamily,
    labels: Sequence[str],
    row: list[float],
    buckets: tuple[float, ...],
    created: float | None,
) -> None:
    cumulative: list[tuple[str, float]] = []
    running = 0.0
    for bound, count in zip((*buckets, float("inf")), row, strict=False):
        running += count
        cumulative.append((_le(bound), running))
    family.add_metric(labels, cumulative, row[-1])
    if created is not None:  # what prometheus_client's own Histogram exposes beside it
        names = ("queue", "kind")[: len(labels)]
        family.samples.append(
            Sample(f"{family.name}_created", dict(zip(names, labels, strict=True)), created)
        )


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
        metrics = _Metrics(engine_of(sync.jobs).runtime.now_ms)
        gauges = _StoreGauges(sync, cache_seconds)
        target.register(metrics)
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
    for collector in (metrics, gauges):
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
