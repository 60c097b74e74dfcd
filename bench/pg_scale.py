"""PostgreSQL workloads 7 to 9: claim cost against table size, an idle worker's CPU, memory.

The SQLite runner's workloads of the same numbers (:mod:`bench.workloads`,
:mod:`bench.raw`), on a URL: the table is grown server-side with
``generate_series`` (the library's own table and indexes, created by
``open_store``), the idle worker listens and polls as it would in production,
and the memory drain runs in a fresh process.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import jaren_jobs
from bench import KIND, cpu_seconds, measure_heap, rss_bytes
from bench.pg import PG_POLL, now_ms, raw_connect
from bench.workloads import WAIT, Finished, noop

__all__ = ["add_rows", "claim_cost", "idle_cpu", "memory", "raw_claim_cost"]

# the library's table as open_store creates it; the columns a row needs
_ADD = """INSERT INTO "_jaren_jobs"
  (id, kind, payload, state, priority, run_at, attempts, max_attempts, lease_generation,
   result, created_at, updated_at, queue)
  SELECT md5(%(tag)s || g::text), %(kind)s, '{"n": 1}', %(state)s, 0, %(at)s + g, %(attempts)s,
         5, %(attempts)s, %(result)s, %(at)s + g, %(at)s + g, 'default'
  FROM generate_series(1, %(count)s) AS g"""

# what a careful programmer writes against the same table: the ready branch
# only, no fence beyond the token, no rescue of expired leases
_RAW_CLAIM = """UPDATE "_jaren_jobs" SET state = 'leased', attempts = attempts + 1,
  lease_generation = lease_generation + 1, lease_token = %(token)s, lease_until = %(until)s,
  lease_owner = 'raw', updated_at = %(now)s
  WHERE id = (SELECT id FROM "_jaren_jobs" WHERE state IN ('pending', 'failed')
              AND kind = %(kind)s AND run_at <= %(now)s
              ORDER BY priority DESC, run_at, created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
  RETURNING id, payload"""


def add_rows(url: str, state: str, count: int, *, start: int) -> None:
    """``count`` rows in ``state`` (``pending`` or ``done``), numbered from ``start``."""
    import psycopg

    settled = state != "pending"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            _ADD,  # a constant: no SQL built from input
            {
                "tag": f"{state}-{start}-",
                "kind": KIND,
                "state": state,
                # settled rows are older than the pending ones, as in a live table
                "at": (now_ms() - 86_400_000 if settled else now_ms() - 60_000) + start,
                "attempts": 1 if settled else 0,
                "result": "null" if settled else None,
                "count": count,
            },
        )
        conn.execute('ANALYZE "_jaren_jobs"')


def claim_cost(store: jaren_jobs.Store) -> float:
    """One ``claim`` call's wall time in seconds (the job stays leased)."""
    start = time.perf_counter()
    claimed = store.jobs.claim([KIND], owner="bench")
    elapsed = time.perf_counter() - start
    assert claimed is not None
    return elapsed


def raw_claim_cost(conn: Any) -> float:
    """One raw claim statement's wall time in seconds, on the library's table."""
    now = now_ms()
    params = {"token": uuid.uuid4().hex, "until": now + 30_000, "now": now, "kind": KIND}
    start = time.perf_counter()
    row = conn.execute(_RAW_CLAIM, params).fetchone()
    elapsed = time.perf_counter() - start
    assert row is not None
    return elapsed


def claim_costs(url: str, durability: str, claims: int) -> tuple[list[float], list[float]]:
    """Interleaved claim timings (jaren_jobs, raw) on the table as it stands."""
    ours: list[float] = []
    raws: list[float] = []
    conn = raw_connect(url, durability)
    try:
        with jaren_jobs.open_store(url, durability=durability) as store:  # type: ignore[arg-type]
            for _ in range(3):  # warm both sessions alike
                claim_cost(store)
                raw_claim_cost(conn)
            for _ in range(claims):
                ours.append(claim_cost(store))
                raws.append(raw_claim_cost(conn))
    finally:
        conn.close()
    return ours, raws


def idle_cpu(url: str, durability: str, seconds: float, results: Any) -> None:
    """Workload 8 child: an idle worker on an empty queue (LISTEN, and its poll every second:
    on PostgreSQL a notification wakes it, so production keeps the default poll)."""
    try:
        with jaren_jobs.open_store(url, durability=durability) as store:  # type: ignore[arg-type]
            worker = store.jobs.create_worker({KIND: noop}, poll_seconds=PG_POLL)
            worker.start()
            time.sleep(0.2)
            before = cpu_seconds()
            polls = worker.stats().polls
            time.sleep(seconds)
            used = cpu_seconds() - before
            polls = worker.stats().polls - polls
            worker.stop()
        # LISTEN wakes it; its polls are a fallback, spaced as it sees fit
        if polls < 1:
            raise RuntimeError(f"the worker never polled in {seconds:g}s")
        results.put(used / seconds)
    except BaseException as exc:
        results.put(RuntimeError(f"jaren_jobs idle_cpu: {exc!r}"))


def raw_idle_cpu(url: str, durability: str, seconds: float, results: Any) -> None:
    """Workload 8 raw child: a claim statement every second on an empty queue."""
    try:
        conn = raw_connect(url, durability)
        pause = __import__("threading").Event()
        before = cpu_seconds()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            now = now_ms()
            params = {"token": uuid.uuid4().hex, "until": now + 30_000, "now": now, "kind": KIND}
            conn.execute(_RAW_CLAIM, params).fetchone()
            pause.wait(PG_POLL)
        results.put((cpu_seconds() - before) / seconds)
        conn.close()
    except BaseException as exc:
        results.put(RuntimeError(f"raw idle_cpu: {exc!r}"))


def memory(url: str, durability: str, jobs: int, heap: bool, results: Any) -> None:
    """Workload 9 child: a worker at concurrency 4 drains ``jobs`` jobs, sampled every tenth."""
    import threading

    try:
        measure = measure_heap() if heap else rss_bytes
        samples: list[tuple[int, int]] = []
        step = max(1, jobs // 10)
        lock = threading.Lock()
        with jaren_jobs.open_store(url, durability=durability) as store:  # type: ignore[arg-type]
            for start in range(0, jobs, 1_000):
                store.jobs.enqueue_many(
                    [
                        jaren_jobs.NewJob(KIND, {"n": i})
                        for i in range(start, min(start + 1_000, jobs))
                    ]
                )
            finished = Finished(jobs)

            def observe(event: jaren_jobs.Outcome) -> None:
                finished(event)
                with lock:  # outcomes arrive from the settling thread, one at a time
                    due = len(samples) * step
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
