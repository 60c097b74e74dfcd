"""The jaren_jobs benchmark: every figure beside a raw baseline measured in the same run.

Run it with ``python -m bench`` (or ``python bench/run.py``): SQLite, and
PostgreSQL too given ``--pg-url URL`` (or ``$JAREN_JOBS_BENCH_PG_URL``);
``--quick`` for a run of well under a minute, ``--json`` for machine-readable
output, ``--rounds 5`` for the spread. The modules:

* :mod:`bench.raw` — the baseline: the same work written by hand against
  ``sqlite3``, on the library's own table and indexes;
* :mod:`bench.workloads` — the same work through jaren_jobs;
* :mod:`bench.peers` — the same work through huey, persist-queue and
  litequeue (the optional ``bench`` extra);
* :mod:`bench.pg`, :mod:`bench.pg_run` — the PostgreSQL half: raw psycopg
  by hand (one at a time, and the batched ceiling) and jaren_jobs on a URL;
* :mod:`bench.pg_peers` — the same work through procrastinate, pgqueuer,
  chancy and oban (oban needs Python 3.12: on an older one the bench runs it
  in the interpreter ``--oban-python`` names, through :mod:`bench.pg_remote`;
  :mod:`bench.pg_peer` holds what the adapters share, :mod:`bench.pg_oban`
  oban's);
* :mod:`bench.targets` — issue 28's targets, met or missed, and the spread
  of several rounds;
* :mod:`bench.run` — the runner: sizes, ratios, the tables, JSON;
  :mod:`bench.sqlite_run` its SQLite half;
* :mod:`bench.plots` — PNG plots when matplotlib is present.

This module holds what they share: sizes, measuring helpers, and the helpers
that let several OS processes start on a signal and report back.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import resource
import sqlite3
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "KIND",
    "Channels",
    "Package",
    "Sizes",
    "Timer",
    "cpu_seconds",
    "executions_array",
    "measure_heap",
    "median",
    "new_payload",
    "percentile",
    "rss_bytes",
    "wait_until",
]

KIND = "noop"  # the one job kind every workload uses

# the poll interval of every idle worker in the latency and CPU workloads
POLL_SECONDS = 0.05


class Package:
    """What every peer adapter says of itself: its name, the distribution it is, notes."""

    name = ""
    package = ""
    notes: tuple[str, ...] = ()

    def version(self) -> str:
        return importlib.metadata.version(self.package)

    def available(self) -> bool:
        try:
            self.version()
        except importlib.metadata.PackageNotFoundError:
            return False
        return True


@dataclass(frozen=True)
class Sizes:
    """How much work each workload does; ``quick`` and ``full`` are the two presets."""

    enqueue: int  # workload 1
    enqueue_many: int  # workload 2 (jobs in all)
    batch: int  # workload 2 batch size
    claim_complete: int  # workload 3
    drain: int  # workload 4, per concurrency
    concurrencies: tuple[int, ...]  # workload 4
    raw_batch_drain: int  # workload 4's batched raw ceiling
    processes: int  # workload 5
    process_jobs: int  # workload 5
    latency_local: int  # workload 6 samples, in-process
    latency_remote: int  # workload 6 samples, across processes
    # workload 7: (settled, pending) table sizes, claims timed at each
    table_sizes: tuple[tuple[int, int], ...]
    table_claims: int
    idle_seconds: float  # workload 8
    memory_jobs: int  # workload 9 (resident set)
    heap_jobs: int  # workload 9 (Python heap, under tracemalloc)
    rounds: int  # repeats of the short rate workloads (median is reported)
    extra: dict[str, Any] = field(default_factory=dict)
    enqueue_many_one: int = 4_000  # workload 2: one enqueue_many call of this many jobs
    peer_concurrencies: tuple[int, ...] = (1, 4)  # workload 4's concurrencies for peers
    scale_processes: tuple[int, ...] = (1, 2, 4, 8)  # workload 10
    scale_jobs: int = 5_000  # workload 10, per process count
    scale_peers: bool = True  # workload 10 beside the peers (a quick run leaves them out)


QUICK = Sizes(
    enqueue=150,
    enqueue_many=2_000,
    batch=100,
    claim_complete=150,
    drain=200,
    concurrencies=(1, 4, 16),
    raw_batch_drain=2_000,
    processes=4,
    process_jobs=300,
    latency_local=15,
    latency_remote=5,
    table_sizes=((1_000, 1_000), (20_000, 1_000)),
    table_claims=40,
    idle_seconds=0.5,
    memory_jobs=2_000,
    heap_jobs=1_000,
    rounds=1,
    scale_processes=(1, 2),
    scale_jobs=300,
    scale_peers=False,
)

FULL = Sizes(
    enqueue=2_000,
    enqueue_many=50_000,
    batch=100,
    claim_complete=2_000,
    drain=5_000,
    concurrencies=(1, 4, 16),
    raw_batch_drain=20_000,
    processes=4,
    process_jobs=10_000,
    latency_local=200,
    latency_remote=200,
    table_sizes=(
        (1_000, 10_000),
        (100_000, 10_000),
        (1_000_000, 10_000),
        (1_000, 100_000),
        (100_000, 100_000),
        (1_000_000, 100_000),
    ),
    table_claims=300,
    idle_seconds=10.0,
    memory_jobs=100_000,
    heap_jobs=30_000,
    rounds=3,
)


class Timer:
    """Wall time of a block, from ``time.perf_counter``."""

    def __init__(self) -> None:
        self.start = 0.0
        self.seconds = 0.0

    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (``fraction`` in [0, 1]) of ``values``."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no samples")
    rank = max(1, min(len(ordered), round(fraction * len(ordered) + 0.5)))
    return ordered[rank - 1]


def cpu_seconds() -> float:
    """User + system CPU time of this process (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_bytes() -> int:
    """This process's resident set size now (Linux ``/proc``; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # pragma: no cover - not Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure_heap() -> Callable[[], int]:
    """Start ``tracemalloc``; returns a sampler of the bytes Python holds now."""
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()

    def traced() -> int:
        gc.collect()  # count what is live, not cyclic garbage the collector has yet to visit
        return int(tracemalloc.get_traced_memory()[0])

    return traced


def new_payload(index: int) -> dict[str, Any]:
    """The small JSON payload every enqueue carries."""
    return {"n": index}


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` every millisecond until true; ``TimeoutError`` naming ``what``."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise TimeoutError(f"bench: timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.001)


def executions_array(ctx: Any, jobs: int) -> Any:
    """A shared byte per job that one process increments when it runs that job.

    One array per process (lock-free: only its owner writes), so counting
    executions costs every subject the same and never serialises the workers.
    """
    return ctx.Array("B", jobs, lock=False)


def count_executions(arrays: Sequence[Any]) -> tuple[int, int]:
    """(distinct jobs run, total executions) over every process's array."""
    snapshots = [bytes(array) for array in arrays]
    total = sum(sum(snapshot) for snapshot in snapshots)
    merged = 0
    for snapshot in snapshots:
        merged |= int.from_bytes(snapshot, "little")
    width = len(snapshots[0]) if snapshots else 0
    distinct = width - merged.to_bytes(width, "little").count(0)
    return distinct, total


def growth_per_10k(samples: Sequence[tuple[int, int]], jobs: int) -> float:
    """The slope of a least-squares line through ``(jobs done, bytes)`` after 10% warm-up.

    In KiB per 10k jobs: a bounded structure that fills and empties gives a
    slope near 0 either way; a leak a steady rise.
    """
    points = [(n, r) for n, r in samples if n >= jobs * 0.1]
    mean_n = sum(n for n, _ in points) / len(points)
    mean_r = sum(r for _, r in points) / len(points)
    spread = sum((n - mean_n) ** 2 for n, _ in points)
    if spread == 0:
        return 0.0
    slope = sum((n - mean_n) * (r - mean_r) for n, r in points) / spread
    return slope / 1024 * 10_000


def peak_mib(samples: Sequence[tuple[int, int]]) -> float:
    return max(r for _, r in samples) / 2**20


def sqlite_version() -> str:
    return sqlite3.sqlite_version


def filesystem_of(path: Path) -> str:
    """The filesystem type holding ``path`` (from ``/proc/mounts``), or ``unknown``."""
    try:
        with open("/proc/mounts") as mounts:
            rows = [line.split() for line in mounts]
    except OSError:  # pragma: no cover - not Linux
        return "unknown"
    target = str(path.resolve())
    best = ("", "unknown")
    for row in rows:
        inside = len(row) >= 3 and (target == row[1] or target.startswith(row[1].rstrip("/") + "/"))
        if inside and len(row[1]) >= len(best[0]):
            best = (row[1], row[2])
    return best[1]


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=False)


# ---------------------------------------------------------------- several processes

PROCESS_TIMEOUT = 600.0


@dataclass
class Channels:
    """What a workload-5 child shares with the parent (pickled when it is spawned).

    ``executions[n]`` counts this child's runs of job ``n``; ``last.value`` is
    the ``time.monotonic()`` of its latest execution; ``ready`` says it has
    opened its consumer; ``go`` starts the clock; ``stop`` ends it.
    """

    executions: Any
    last: Any
    ready: Any
    go: Any
    stop: Any
    errors: Any  # driver errors the consumer met and retried (peers only)

    def executed(self, n: int) -> None:
        self.executions[n] += 1
        self.last.value = time.monotonic()


def drain_in_processes(
    target: Callable[[dict[str, Any], Channels], None],
    spec: dict[str, Any],
    *,
    jobs: int,
    processes: int,
) -> tuple[float, int, int]:
    """Start ``processes`` copies of ``target`` on one queue of ``jobs`` jobs; time the drain.

    Each child gets ``(spec, channels)``: it opens its consumer, sets
    ``ready``, waits for ``go``, then runs jobs, calling
    ``channels.executed(n)`` for each, until ``stop``. The drain ends at the
    last execution the children recorded, so the parent can poll coarsely
    without stealing a core from them. Returns (jobs per second, duplicate
    executions, driver errors the children retried).
    """
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    arrays = [executions_array(ctx, jobs) for _ in range(processes)]
    lasts = [ctx.Value("d", 0.0, lock=False) for _ in range(processes)]
    errors = [ctx.Value("i", 0, lock=False) for _ in range(processes)]
    ready = [ctx.Event() for _ in range(processes)]
    go = ctx.Event()
    stop = ctx.Event()
    children = [
        ctx.Process(
            target=target,
            args=(spec, Channels(arrays[i], lasts[i], ready[i], go, stop, errors[i])),
            daemon=True,
        )
        for i in range(processes)
    ]
    for child in children:
        child.start()
    try:
        for event in ready:
            if not event.wait(60):
                raise TimeoutError("bench: a worker process did not get ready in 60 s")
        start = time.monotonic()
        go.set()
        end = start + PROCESS_TIMEOUT
        while count_executions(arrays)[0] < jobs:
            if time.monotonic() > end:
                raise TimeoutError("bench: the worker processes did not drain the queue")
            if not all(child.is_alive() for child in children):
                raise RuntimeError("bench: a worker process died while draining")
            time.sleep(0.02)
        finished = max(last.value for last in lasts)
    finally:
        stop.set()
        for child in children:
            child.join(30)
            if child.is_alive():  # pragma: no cover - a wedged peer
                child.terminate()
                child.join(5)
    distinct, total = count_executions(arrays)
    return (
        jobs / max(finished - start, 1e-9),
        total - distinct,
        sum(e.value for e in errors),
    )


def remote_latency(
    target: Callable[..., None],
    spec: dict[str, Any],
    enqueue: Callable[[int, float], None],
    *,
    samples: int,
    spacing_seconds: float = POLL_SECONDS,
) -> list[float]:
    """Enqueue-to-start latency into a consumer running in another process.

    ``target(spec, reports, ready, stop)`` runs the consumer; for each job it
    starts it puts ``(n, time.monotonic() - t)`` on ``reports``, where ``t``
    is the enqueue time carried in the payload (``CLOCK_MONOTONIC`` is
    system-wide on Linux). ``enqueue(n, t)`` adds job ``n``. Between samples
    the parent waits a random fraction of ``spacing_seconds`` so enqueues do
    not phase-lock with the consumer's polls.
    """
    import multiprocessing
    import random

    ctx = multiprocessing.get_context("spawn")
    reports = ctx.Queue()
    ready = ctx.Event()
    stop = ctx.Event()
    child = ctx.Process(target=target, args=(spec, reports, ready, stop), daemon=True)
    child.start()
    latencies: list[float] = []
    try:
        if not ready.wait(60):
            raise TimeoutError("bench: the consumer process did not get ready in 60 s")
        time.sleep(spacing_seconds * 2)  # let it settle into its idle poll
        for n in range(samples):
            enqueue(n, time.monotonic())
            got, latency = reports.get(timeout=30)
            if got != n:
                raise RuntimeError(f"bench: expected job {n} to start, got {got}")
            latencies.append(latency)
            time.sleep(random.random() * spacing_seconds)
    finally:
        stop.set()
        child.join(30)
        if child.is_alive():  # pragma: no cover - a wedged peer
            child.terminate()
            child.join(5)
        reports.close()
    return latencies


def in_subprocess(target: Callable[..., None], *args: Any, timeout: float = 900.0) -> Any:
    """Run ``target(*args, results)`` in a fresh spawned process; return what it put."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=target, args=(*args, results), daemon=True)
    child.start()
    try:
        answer = results.get(timeout=timeout)
    finally:
        child.join(30)
        if child.is_alive():  # pragma: no cover
            child.terminate()
            child.join(5)
    if isinstance(answer, BaseException):
        raise answer
    return answer
