"""The workloads through jaren_jobs' public API, one function per workload.

Each function mirrors the one of the same name in :mod:`bench.raw`, on a
fresh file, and returns the same measure, so the runner can put the two side
by side.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from pathlib import Path
from typing import Any

import jaren_jobs
from bench import (
    KIND,
    POLL_SECONDS,
    Channels,
    Timer,
    cpu_seconds,
    measure_heap,
    new_payload,
    rss_bytes,
)
from jaren_jobs import NewJob, Outcome, Store

WAIT = 600.0  # a drain that takes longer than this is broken, not slow


def open_(path: Path | str, durability: str) -> Store:
    return jaren_jobs.open_store(path, durability=durability)  # type: ignore[arg-type]


def where(text: str) -> Path | str:
    """A child's database from its argument: a PostgreSQL URL as is, else a file path."""
    return text if text.startswith(("postgresql://", "postgres://")) else Path(text)


def fill(store: Store, jobs: int, *, batch: int = 1_000) -> None:
    for start in range(0, jobs, batch):
        store.jobs.enqueue_many(
            [NewJob(KIND, new_payload(i)) for i in range(start, min(start + batch, jobs))]
        )


def noop(payload: Any, ctx: Any) -> None:
    return None


class Finished:
    """An ``on_outcome`` observer: counts outcomes, sets an event at ``target``."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.other = 0
        self.at = 0.0
        self.done = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, event: Outcome) -> None:
        with self._lock:
            if event.outcome != "completed":
                self.other += 1
            self.count += 1
            if self.count == self.target:
                self.at = time.perf_counter()
                self.done.set()


# ---------------------------------------------------------------- workloads 1-3


def enqueue_one(path: Path, durability: str, jobs: int) -> float:
    """Workload 1: ``store.jobs.enqueue`` one at a time. Jobs per second."""
    with open_(path, durability) as store:
        enqueue = store.jobs.enqueue
        with Timer() as timer:
            for i in range(jobs):
                enqueue(KIND, new_payload(i))
    return jobs / timer.seconds


def enqueue_batches(path: Path, durability: str, jobs: int, batch: int) -> float:
    """Workload 2: ``enqueue_many`` with ``batch`` jobs per call. Jobs per second."""
    with open_(path, durability) as store, Timer() as timer:
        for start in range(0, jobs, batch):
            store.jobs.enqueue_many(
                [NewJob(KIND, new_payload(i)) for i in range(start, min(start + batch, jobs))]
            )
    return jobs / timer.seconds


def enqueue_many_one(path: Path, durability: str, jobs: int) -> float:
    """Workload 2's single batch: one ``enqueue_many`` call of ``jobs`` jobs."""
    with open_(path, durability) as store, Timer() as timer:
        store.jobs.enqueue_many([NewJob(KIND, new_payload(i)) for i in range(jobs)])
    return jobs / timer.seconds


def claim_complete_one(path: Path, durability: str, jobs: int) -> float:
    """Workload 3: ``claim`` then ``complete``, one job at a time. Jobs per second."""
    with open_(path, durability) as store:
        fill(store, jobs)
        claim, complete = store.jobs.claim, store.jobs.complete
        kinds = [KIND]
        done = 0
        with Timer() as timer:
            while (claimed := claim(kinds, owner="bench")) is not None:
                complete(claimed.lease, None)
                done += 1
    assert done == jobs, (done, jobs)
    return jobs / timer.seconds


# ---------------------------------------------------------------- workload 4


def drain(path: Path, durability: str, jobs: int, concurrency: int) -> float:
    """Workload 4: a worker at ``concurrency`` draining no-op jobs. Jobs per second."""
    with open_(path, durability) as store:
        fill(store, jobs)
        finished = Finished(jobs)
        worker = store.jobs.create_worker(
            {KIND: noop}, concurrency=concurrency, on_outcome=finished
        )
        start = time.perf_counter()
        worker.start()
        if not finished.done.wait(WAIT):
            raise TimeoutError(f"bench: the worker drained {finished.count} of {jobs}")
        worker.stop()
        if finished.other:
            raise RuntimeError(f"bench: {finished.other} attempts did not complete")
        counts = store.jobs.counts()
        assert counts.done == jobs, counts
    return jobs / (finished.at - start)


def drain_async(
    path: Path | str, durability: str, jobs: int, concurrency: int, *, from_first: bool = False
) -> float:
    """Workload 4's AsyncWorker: no-op ``async def`` jobs at ``concurrency``. Jobs per second.

    The same as :func:`drain` through ``open_async_store``; timed from the
    worker's start, or with ``from_first`` from the first job's start (as the
    PostgreSQL drains are), to the last outcome.
    """
    first: list[float] = []

    async def noop_async(payload: Any, ctx: Any) -> None:
        if not first:
            first.append(time.perf_counter())

    async def main() -> float:
        async with jaren_jobs.open_async_store(path, durability=durability) as store:
            for start in range(0, jobs, 1_000):
                await store.jobs.enqueue_many(
                    [NewJob(KIND, new_payload(i)) for i in range(start, min(start + 1_000, jobs))]
                )
            finished = Finished(jobs)
            worker = store.jobs.create_worker(
                {KIND: noop_async}, concurrency=concurrency, on_outcome=finished
            )
            began = time.perf_counter()
            async with worker:
                if not await asyncio.to_thread(finished.done.wait, WAIT):
                    raise TimeoutError(f"bench: the AsyncWorker drained {finished.count} of {jobs}")
            if finished.other:
                raise RuntimeError(f"bench: {finished.other} attempts did not complete")
        return jobs / (finished.at - (first[0] if from_first else began))

    rate: float = asyncio.run(main())
    return rate


# ---------------------------------------------------------------- workload 5


def process_drainer(spec: dict[str, Any], channels: Channels) -> None:
    """Workload 5 child: one worker per process on the shared file."""

    def handler(payload: Any, ctx: Any) -> None:
        channels.executed(payload["n"])

    with open_(Path(spec["path"]), spec["durability"]) as store:
        worker = store.jobs.create_worker(
            {KIND: handler}, concurrency=spec["concurrency"], poll_seconds=POLL_SECONDS
        )
        channels.ready.set()
        channels.go.wait()
        worker.start()
        channels.stop.wait()
        worker.stop()


def processes_setup(path: Path, durability: str, jobs: int, concurrency: int) -> dict[str, Any]:
    with open_(path, durability) as store:
        fill(store, jobs)
    return {"path": str(path), "durability": durability, "concurrency": concurrency}


# ---------------------------------------------------------------- workload 6


def latency_local(path: Path, durability: str, samples: int) -> list[float]:
    """In-process: an idle worker (50 ms poll) woken by the enqueue's commit."""
    started: queue.Queue[float] = queue.Queue()

    def handler(payload: Any, ctx: Any) -> None:
        started.put(time.monotonic() - payload["t"])

    latencies = []
    with open_(path, durability) as store:
        worker = store.jobs.create_worker({KIND: handler}, poll_seconds=POLL_SECONDS)
        worker.start()
        try:
            time.sleep(POLL_SECONDS * 2)
            for n in range(samples):
                store.jobs.enqueue(KIND, {"n": n, "t": time.monotonic()})
                latencies.append(started.get(timeout=30))
        finally:
            worker.stop()
    return latencies


def latency_consumer(spec: dict[str, Any], reports: Any, ready: Any, stop: Any) -> None:
    """Across processes: the worker sees another process's enqueue at its next poll."""

    def handler(payload: Any, ctx: Any) -> None:
        reports.put((payload["n"], time.monotonic() - payload["t"]))

    with open_(Path(spec["path"]), spec["durability"]) as store:
        worker = store.jobs.create_worker({KIND: handler}, poll_seconds=POLL_SECONDS)
        worker.start()
        ready.set()
        stop.wait()
        worker.stop()


def latency_remote_setup(path: Path, durability: str) -> tuple[dict[str, Any], Any, Any]:
    store = open_(path, durability)

    def enqueue(n: int, t: float) -> None:
        store.jobs.enqueue(KIND, {"n": n, "t": t})

    return {"path": str(path), "durability": durability}, enqueue, store.close


# ---------------------------------------------------------------- workload 7


def claim_cost(store: Store) -> float:
    """One ``claim`` call's wall time in seconds (the job stays leased)."""
    start = time.perf_counter()
    claimed = store.jobs.claim([KIND], owner="bench")
    elapsed = time.perf_counter() - start
    assert claimed is not None
    return elapsed


# ---------------------------------------------------------------- workloads 8 and 9


def idle_cpu(path_text: str, durability: str, seconds: float, poll: float, results: Any) -> None:
    """Workload 8 child: an idle worker polling every ``poll`` seconds on an empty queue."""
    try:
        with open_(where(path_text), durability) as store:
            worker = store.jobs.create_worker({KIND: noop}, poll_seconds=poll)
            worker.start()
            time.sleep(0.2)
            before = cpu_seconds()
            polls = worker.stats().polls
            time.sleep(seconds)
            used = cpu_seconds() - before
            polls = worker.stats().polls - polls
            worker.stop()
        if polls < int(seconds / poll / 2):
            raise RuntimeError(f"the worker polled only {polls} times in {seconds:g}s")
        results.put(used / seconds)
    except BaseException as exc:
        results.put(RuntimeError(f"jaren_jobs idle_cpu: {exc!r}"))


def memory(path_text: str, durability: str, jobs: int, heap: bool, results: Any) -> None:
    """Workload 9 child: a worker at concurrency 4 drains ``jobs`` jobs.

    Samples the resident set size, or with ``heap`` the bytes Python has
    allocated (``tracemalloc``), every tenth of the way.
    """
    try:
        measure = measure_heap() if heap else rss_bytes
        samples: list[tuple[int, int]] = []
        step = max(1, jobs // 10)
        lock = threading.Lock()
        with open_(where(path_text), durability) as store:
            fill(store, jobs)
            finished = Finished(jobs)

            def observe(event: Outcome) -> None:
                finished(event)
                with lock:  # outcomes arrive from four loops
                    due = (len(samples)) * step
                    if finished.count >= due and len(samples) <= 10:
                        samples.append((finished.count, measure()))

            worker = store.jobs.create_worker({KIND: noop}, concurrency=4, on_outcome=observe)
            samples.append((0, measure()))
            worker.start()
            if not finished.done.wait(WAIT):
                raise TimeoutError(f"drained {finished.count} of {jobs}")
            worker.stop()
            with lock:
                samples.append((jobs, measure()))
        results.put(samples)
    except BaseException as exc:
        results.put(RuntimeError(f"jaren_jobs memory: {exc!r}"))
