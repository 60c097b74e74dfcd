"""``python -m bench.asyncio_lag``: the event loop's lag under the asyncio API, and its rates.

A 1 ms ticker runs on the loop and records how late each tick fires:

1. while an ``AsyncWorker`` drains no-op ``async def`` jobs;
2. while request-like tasks enqueue at full speed (``await store.jobs.enqueue``):
   eight tasks at once, whose enqueues share commits, then one task alone.

Beside them, in the same run: the async enqueue rate and the async worker's
rate, and the sync API's rates for the same work (one at a time from one
thread; the thread worker draining plain no-op handlers), and the loop's lag
while that thread worker drains beside it in the same process: the baseline
for the AsyncWorker's, since a worker's threads share the GIL with the loop;
and, as the floor under both, the loop's lag beside one thread running pure
Python. Prints JSON, with
the load average at the end of the run; ``--jobs N`` sets the size (default
10,000), ``--repeat N`` runs it N times (a list). Durability FULL, as users
run it.

``--db`` picks the backend: by default an SQLite file in a temporary folder;
a ``postgresql://`` URL runs the same workloads on that server, each half in a
fresh schema (:func:`bench.pg.fresh_schema`, dropped afterwards). The JSON says
which backend ran (``"backend"``), and so does a line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jaren_jobs
from jaren_jobs import Outcome


def _percentiles(lags: list[float]) -> dict[str, float]:
    ordered = sorted(lags)
    if not ordered:
        return {"p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0, "ticks": 0}
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000, 3),
        "max_ms": round(ordered[-1] * 1000, 3),
        "ticks": len(ordered),
    }


async def _ticker(stop: asyncio.Event, lags: list[float]) -> None:
    period = 0.001
    while not stop.is_set():
        due = time.perf_counter() + period
        await asyncio.sleep(period)
        lags.append(max(0.0, time.perf_counter() - due))


def _counting(total: int, done: Callable[[], object]) -> Callable[[Outcome], None]:
    """An ``on_outcome`` observer that calls ``done()`` at the ``total``-th outcome (from
    whichever thread reports it)."""
    seen = [0]
    lock = threading.Lock()

    def counted(_: Outcome) -> None:
        with lock:
            seen[0] += 1
            if seen[0] == total:
                done()

    return counted


def _thread_worker(store: jaren_jobs.Store, on_outcome: Callable[[Outcome], None]) -> Any:
    """The thread Worker the sync figures drain with: plain no-op handlers."""
    return store.jobs.create_worker(
        {"noop": lambda payload, ctx: None},
        concurrency=16,
        poll_seconds=0.05,
        on_outcome=on_outcome,
    )


async def _async_figures(path: str, jobs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with jaren_jobs.open_async_store(path) as store:
        # 2. enqueue at full speed from 8 concurrent "request handlers"
        stop, lags = asyncio.Event(), list[float]()
        ticker = asyncio.create_task(_ticker(stop, lags))
        began = time.perf_counter()

        async def handler(share: int, offset: int) -> None:
            for n in range(share):
                await store.jobs.enqueue("noop", {"n": offset + n})

        shares = 8
        await asyncio.gather(*(handler(jobs // shares, k * jobs) for k in range(shares)))
        elapsed = time.perf_counter() - began
        stop.set()
        await ticker
        out["async enqueue, 8 tasks"] = {
            "jobs_per_s": round(jobs // shares * shares / elapsed),
            "loop_lag": _percentiles(lags),
        }

        # the same from ONE task: each call alone, so no enqueues share a commit; the
        # round trip to the store's thread is what this one adds to the sync call
        alone = max(1, jobs // 8)
        began = time.perf_counter()
        for n in range(alone):
            await store.jobs.enqueue("noop", {"n": -1 - n})
        out["async enqueue, one task"] = {
            "jobs_per_s": round(alone / (time.perf_counter() - began)),
        }

        # 1. an AsyncWorker draining them
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        total = jobs // shares * shares + alone
        counted = _counting(total, lambda: loop.call_soon_threadsafe(done.set))

        async def noop(payload: Any, ctx: Any) -> None:
            return None

        stop, lags = asyncio.Event(), list[float]()
        ticker = asyncio.create_task(_ticker(stop, lags))
        worker = store.jobs.create_worker(
            {"noop": noop}, concurrency=16, poll_seconds=0.05, on_outcome=counted
        )
        began = time.perf_counter()
        async with worker:
            await done.wait()
        elapsed = time.perf_counter() - began
        stop.set()
        await ticker
        out["AsyncWorker, concurrency 16, no-op async jobs"] = {
            "jobs_per_s": round(total / elapsed),
            "loop_lag": _percentiles(lags),
        }
    return out


def _sync_figures(path: str, jobs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with jaren_jobs.open_store(path) as store:
        began = time.perf_counter()
        for n in range(jobs):
            store.jobs.enqueue("noop", {"n": n})
        rate = round(jobs / (time.perf_counter() - began))
        out["sync enqueue, one thread"] = {"jobs_per_s": rate}
        done = threading.Event()
        worker = _thread_worker(store, _counting(jobs, done.set))
        began = time.perf_counter()
        worker.start()
        done.wait(600)
        elapsed = time.perf_counter() - began
        worker.stop()
        out["thread Worker, concurrency 16, no-op jobs"] = {"jobs_per_s": round(jobs / elapsed)}
        store.jobs.enqueue_many(jaren_jobs.NewJob("noop", {"n": n}) for n in range(jobs))
        out["thread Worker beside the loop"] = asyncio.run(_thread_worker_lag(store, jobs))
    return out


async def _thread_worker_lag(store: jaren_jobs.Store, jobs: int) -> dict[str, Any]:
    """The baseline for the AsyncWorker's loop lag: the loop's ticker while the *thread*
    Worker drains in the same process (its threads share the GIL with the loop, and
    nothing of it runs on the loop)."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    worker = _thread_worker(store, _counting(jobs, lambda: loop.call_soon_threadsafe(done.set)))
    stop, lags = asyncio.Event(), list[float]()
    ticker = asyncio.create_task(_ticker(stop, lags))
    began = time.perf_counter()
    worker.start()
    await done.wait()
    elapsed = time.perf_counter() - began
    stop.set()
    await ticker
    await asyncio.to_thread(worker.stop)
    return {"jobs_per_s": round(jobs / elapsed), "loop_lag": _percentiles(lags)}


async def _busy_thread_lag(seconds: float) -> dict[str, Any]:
    """The floor under any worker whose threads share the process: the loop's ticker while
    one thread runs pure Python (CPython hands the GIL to a waiting thread only at the
    switch interval, 5 ms by default, unless the holder blocks)."""
    halt = threading.Event()

    def busy() -> None:
        while not halt.is_set():
            sum(range(1000))

    stop, lags = asyncio.Event(), list[float]()
    ticker = asyncio.create_task(_ticker(stop, lags))
    thread = threading.Thread(target=busy, name="busy-python")
    thread.start()
    try:
        await asyncio.sleep(seconds)
    finally:
        halt.set()
        stop.set()
        await ticker
        thread.join()
    return {"seconds": seconds, "loop_lag": _percentiles(lags)}


def _is_postgres(db: str | None) -> bool:
    return db is not None and db.startswith(("postgresql://", "postgres://"))


@contextlib.contextmanager
def _databases(db: str | None) -> Iterator[tuple[str, str]]:
    """Two empty databases (the async half's, the sync half's) on the backend ``db`` names."""
    if _is_postgres(db):
        from bench.pg import fresh_schema

        assert db is not None
        with fresh_schema(db, "alag_async") as first, fresh_schema(db, "alag_sync") as second:
            yield first, second
        return
    with tempfile.TemporaryDirectory() as folder:
        yield os.path.join(folder, "async.db"), os.path.join(folder, "sync.db")


def _run(jobs: int, db: str | None) -> dict[str, Any]:
    with _databases(db) as (async_db, sync_db):
        figures: dict[str, Any] = {"backend": "postgres" if _is_postgres(db) else "sqlite"}
        figures.update(asyncio.run(_async_figures(async_db, jobs)))
        figures.update(_sync_figures(sync_db, jobs))
    figures["one busy Python thread beside the loop"] = asyncio.run(
        _busy_thread_lag(min(2.0, max(0.2, jobs / 5000)))
    )
    sync_enqueue = figures["sync enqueue, one thread"]["jobs_per_s"]
    sync_worker = figures["thread Worker, concurrency 16, no-op jobs"]["jobs_per_s"]
    figures["ratios"] = {
        "async enqueue / sync enqueue": round(
            figures["async enqueue, 8 tasks"]["jobs_per_s"] / sync_enqueue, 2
        ),
        "async enqueue one task / sync enqueue": round(
            figures["async enqueue, one task"]["jobs_per_s"] / sync_enqueue, 2
        ),
        "AsyncWorker / thread Worker": round(
            figures["AsyncWorker, concurrency 16, no-op async jobs"]["jobs_per_s"] / sync_worker, 2
        ),
    }
    figures["load_average"] = [round(load, 2) for load in os.getloadavg()]
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.asyncio_lag")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs one after another (the ratios of each)"
    )
    parser.add_argument(
        "--db",
        default=None,
        help="a postgresql:// URL (each half in a fresh schema); default: SQLite in a temp dir",
    )
    args = parser.parse_args(argv)
    if args.db is not None and not _is_postgres(args.db):
        parser.error("--db takes a postgresql:// URL (leave it out for SQLite in a temp dir)")
    backend = "postgres" if _is_postgres(args.db) else "sqlite (a file in a temp dir)"
    print(f"bench.asyncio_lag: backend {backend}", file=sys.stderr)
    runs = [_run(args.jobs, args.db) for _ in range(args.repeat)]
    print(json.dumps(runs[0] if len(runs) == 1 else runs, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
