"""How long the dashboard takes to answer on a big table (issue 30): not a test.

    python -m bench.dashboard                                # SQLite, 1M settled + 100k pending
    python -m bench.dashboard --settled 100000 --pending 10000
    python -m bench.dashboard --postgres postgresql://...    # a schema of its own, dropped after
    python -m bench.dashboard --under-load                   # and again beside a busy worker

The jobs are enqueued through ``enqueue_many`` (3 in 10,000 of a rare kind in a
rare queue, so that filters matching almost nothing are measured too); the
settled ones are then marked ``done`` (90 %), ``dead`` and ``cancelled`` (5 %
each), last changed over the past 48 hours, by one UPDATE through
``store.transaction()`` (claiming and completing a million jobs one by one would
take the benchmark's whole budget and measure nothing the dashboard does). On
PostgreSQL every page is measured twice: right after that bulk write, and after
the ``VACUUM (ANALYZE)`` that autovacuum runs soon after such a write (a steady
queue's table is mostly vacuumed). Each page is answered by the dashboard's core
(no HTTP in between), five times; the report gives the median and the worst.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jaren_jobs import NewJob, Store, open_store
from jaren_jobs.dashboard.core import Dashboard, Request
from jaren_jobs.dashboard.overview import throughput

KINDS = ("email", "report", "resize", "sync", "webhook")
QUEUES = ("default", "bulk", "critical")
BATCH = 20_000

PAGES = (
    ("overview (HTML)", "/", ""),
    ("overview (JSON)", "/api/overview", ""),
    ("counts (JSON)", "/api/counts", ""),
    ("per-queue counts (JSON, 3 queues)", "/api/queues", ""),
    ("jobs, first page", "/jobs", ""),
    ("jobs state=pending", "/jobs", "state=pending"),
    ("jobs state=dead", "/api/jobs", "state=dead"),
    ("jobs state=leased (none)", "/api/jobs", "state=leased"),
    ("jobs state=done kind=report", "/api/jobs", "state=done&kind=report"),
    ("jobs queue=critical state=pending", "/api/jobs", "queue=critical&state=pending"),
    ("jobs kind=sync newest first", "/jobs", "kind=sync&order=newest"),
    ("jobs state=done newest first", "/api/jobs", "state=done&order=newest"),
    # the rare kind and queue: 1 job in 10,000 (every state), and names no job has
    ("jobs kind=audit (rare)", "/api/jobs", "kind=audit"),
    ("jobs kind=audit newest first", "/api/jobs", "kind=audit&order=newest"),
    ("jobs state=dead kind=audit", "/api/jobs", "state=dead&kind=audit"),
    ("jobs queue=rare (rare)", "/api/jobs", "queue=rare"),
    ("jobs queue=rare state=pending", "/api/jobs", "queue=rare&state=pending"),
    ("jobs queue=rare newest first", "/api/jobs", "queue=rare&order=newest"),
    ("jobs kind=nosuch (none)", "/api/jobs", "kind=nosuch"),
    ("jobs queue=nosuch newest first (none)", "/api/jobs", "queue=nosuch&order=newest"),
)


def rare_or_not(n: int) -> tuple[str, str]:
    """The job's kind and queue: 3 in 10,000 (one done, one dead, one cancelled
    among the settled) are of a rare kind in a rare queue."""
    if n % 10_000 in (0, 1, 7):
        return "audit", "rare"
    return KINDS[n % 5], QUEUES[n % 3]


def fill(store: Store, settled: int, pending: int) -> None:
    started = time.perf_counter()
    for prefix, count in (("s", settled), ("p", pending)):
        for start in range(0, count, BATCH):
            store.jobs.enqueue_many(
                NewJob(kind, {"n": n}, id=f"{prefix}{n:08d}", queue=queue)
                for n in range(start, min(count, start + BATCH))
                for kind, queue in (rare_or_not(n),)
            )
    now_ms = int(time.time() * 1000)
    number = "CAST(substr(id, 2) AS BIGINT)"
    with store.transaction() as tx:
        tx.execute(
            'UPDATE "_jaren_jobs" SET '
            f"state = CASE WHEN {number} % 20 = 0 THEN 'dead' "
            f"WHEN {number} % 20 = 1 THEN 'cancelled' ELSE 'done' END, "
            "attempts = 1, lease_generation = 1, "
            f"updated_at = {now_ms} - ({number} % 7200) * 24000 "
            "WHERE id >= 's' AND id < 't'"
        )
    took = time.perf_counter() - started
    print(f"filled {settled:,} settled + {pending:,} pending in {took:.0f} s")


def now() -> datetime:
    return datetime.now(timezone.utc)


def measure(store: Store) -> list[tuple[str, float, float]]:
    dashboard = Dashboard(store)
    rows = []
    parts = (
        ("  counts()", store.jobs.counts),
        ("  due_counts()", store.jobs.due_counts),
        ("  counts(queue='bulk')", lambda: store.jobs.counts(queue="bulk")),
        ("  queues()", store.jobs.queues),
        ("  overview's chart (settled_buckets)", lambda: throughput(store, now())),
    )
    for name, call in parts:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            call()
            times.append((time.perf_counter() - started) * 1000)
        rows.append((name, statistics.median(times), max(times)))
    for name, path, query in PAGES:
        times = []
        for _ in range(5):
            started = time.perf_counter()
            answer = dashboard.handle(Request("GET", path, "", query, {}))
            times.append((time.perf_counter() - started) * 1000)
            assert answer.status == 200, (name, answer.body[:300])
        rows.append((name, statistics.median(times), max(times)))
    return rows


def busy(target: str, durability: str, stop: Any, settled: Any) -> None:
    """A worker draining no-op jobs at concurrency 4, fed by ``enqueue_many`` so that
    about 1,000 are always queued: the load the dashboard is measured under (a
    process of its own, as an application's workers would be)."""
    import threading

    options: dict[str, Any] = {} if target.startswith("postgres") else {"durability": durability}
    with open_store(target, **options) as store:
        room = threading.Semaphore(1_000)

        def count(outcome: Any) -> None:
            room.release()
            with settled.get_lock():
                settled.value += 1

        worker = store.jobs.create_worker(
            {"load": lambda payload, ctx: None}, concurrency=4, on_outcome=count
        )
        worker.start()
        try:
            while not stop.is_set():
                for _ in range(200):
                    room.acquire()
                store.jobs.enqueue_many(NewJob("load", None) for _ in range(200))
        finally:
            worker.stop()


def under_load(target: str, durability: str, store: Store) -> tuple[list[Any], float]:
    """``measure(store)`` while ``busy`` runs in another process; and its jobs/s."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    stop, settled = context.Event(), context.Value("q", 0)
    process = context.Process(target=busy, args=(target, durability, stop, settled))
    process.start()
    try:
        while settled.value < 2_000:  # running at its pace before the first page
            time.sleep(0.05)
        before, started = settled.value, time.perf_counter()
        rows = measure(store)
        rate = (settled.value - before) / (time.perf_counter() - started)
    finally:
        stop.set()
        process.join(60)
    return rows, rate


def report(label: str, rows: list[tuple[str, float, float]]) -> None:
    print(f"\n{label}")
    print(f"  {'page':<36} {'median ms':>10} {'worst ms':>10}")
    for name, median, worst in rows:
        print(f"  {name:<36} {median:>10.1f} {worst:>10.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard")
    parser.add_argument("--settled", type=int, default=1_000_000)
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--postgres", metavar="URL", help="a server to measure on instead")
    parser.add_argument(
        "--under-load",
        action="store_true",
        help="measure again while a worker process drains no-op jobs as fast as it can",
    )
    args = parser.parse_args(argv)
    label = f"{args.settled:,} settled + {args.pending:,} pending"
    if args.postgres:
        import psycopg

        schema = f"bench_{secrets.token_hex(4)}"
        with psycopg.connect(args.postgres, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        separator = "&" if "?" in args.postgres else "?"
        url = f"{args.postgres}{separator}options=-csearch_path%3D{schema}"
        try:
            store: Any = open_store(url)
            with store:
                fill(store, args.settled, args.pending)
                report(f"PostgreSQL, {label}, right after the bulk write", measure(store))
                # what autovacuum does within a minute or so of such a write: sets
                # the visibility map (index-only scans stop visiting the table)
                # and the planner's statistics
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute('VACUUM (ANALYZE) "_jaren_jobs"')
                report(f"PostgreSQL, {label}, after VACUUM (ANALYZE)", measure(store))
                if args.under_load:
                    rows, rate = under_load(url, "", store)
                    report(f"PostgreSQL, {label}, under a worker settling {rate:,.0f} jobs/s", rows)
        finally:
            with psycopg.connect(args.postgres, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        return 0
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "bench.db")
        with open_store(path, durability="normal") as store:
            fill(store, args.settled, args.pending)
            report(f"SQLite, {label}", measure(store))
            if args.under_load:
                rows, rate = under_load(path, "normal", store)
                report(f"SQLite, {label}, under a worker settling {rate:,.0f} jobs/s", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
