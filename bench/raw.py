"""The baseline: the same work written by hand against ``sqlite3``.

Every baseline runs on the library's own table and indexes (the file is
created by ``open_store`` and closed again), with the minimal statement a
hand-written queue would use: an INSERT per job, a claim that reads only the
ready branch (no rescue of expired leases, no fence), and a completion
guarded by the token alone. Ids are ``uuid4`` strings and payloads JSON, as
they would be in any queue; the connection has the same journal mode,
``synchronous`` and ``busy_timeout`` as the store. What this costs is what
SQLite itself costs for that data; the ratio of jaren_jobs to it is the price
of everything the library adds.
"""

from __future__ import annotations

import json
import queue
import sqlite3
import threading
import time
import uuid
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

JOBS = '"_jaren_jobs"'

INSERT = f"""INSERT INTO {JOBS}
  (id, kind, payload, state, priority, run_at, attempts, max_attempts, lease_generation,
   created_at, updated_at)
  VALUES (?, ?, ?, 'pending', 0, ?, 0, 5, 0, ?, ?)"""

CLAIM = f"""UPDATE {JOBS} SET state = 'leased', lease_owner = :owner, lease_until = :until,
    lease_generation = lease_generation + 1, lease_token = :token, attempts = attempts + 1,
    updated_at = :now
  WHERE id = (SELECT id FROM {JOBS} WHERE state IN ('pending', 'failed') AND kind = :kind
    AND run_at <= :now ORDER BY priority DESC, run_at, created_at, id LIMIT 1)
  RETURNING id, payload, lease_token"""

CLAIM_BATCH = f"""UPDATE {JOBS} SET state = 'leased', lease_owner = :owner, lease_until = :until,
    lease_generation = lease_generation + 1, lease_token = :token, attempts = attempts + 1,
    updated_at = :now
  WHERE id IN (SELECT id FROM {JOBS} WHERE state IN ('pending', 'failed') AND kind = :kind
    AND run_at <= :now ORDER BY priority DESC, run_at, created_at, id LIMIT :limit)
  RETURNING id, payload, lease_token"""

COMPLETE = f"""UPDATE {JOBS} SET state = 'done', result = ?, lease_until = NULL,
    lease_token = NULL, settled_generation = lease_generation, updated_at = ?
  WHERE id = ? AND lease_token = ?"""

SETTLED_ROW = f"""INSERT INTO {JOBS}
  (id, kind, payload, state, priority, run_at, attempts, max_attempts, lease_generation,
   settled_generation, result, created_at, updated_at)
  VALUES (?, ?, ?, 'done', 0, ?, 1, 5, 1, 1, 'null', ?, ?)"""


def now_ms() -> int:
    return int(time.time() * 1000)


def prepare(path: Path) -> None:
    """Create the library's tables and indexes in ``path`` (and nothing else)."""
    jaren_jobs.open_store(path).close()


def connect(path: Path, durability: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=5.0)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = " + ("FULL" if durability == "full" else "NORMAL"))
    conn.execute("PRAGMA busy_timeout = 5000")
    return conn


def fill(conn: sqlite3.Connection, jobs: int, *, start: int = 0) -> None:
    """Add ``jobs`` pending jobs in one transaction (setup, never timed)."""
    now = now_ms()
    rows = [
        (str(uuid.uuid4()), KIND, json.dumps(new_payload(start + i)), now, now, now)
        for i in range(jobs)
    ]
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(INSERT, rows)
    conn.execute("COMMIT")


def claim_one(conn: sqlite3.Connection, owner: str) -> tuple[Any, ...] | None:
    now = now_ms()
    conn.execute("BEGIN IMMEDIATE")
    try:
        row: tuple[Any, ...] | None = conn.execute(
            CLAIM,
            {
                "owner": owner,
                "until": now + 30_000,
                "token": str(uuid.uuid4()),
                "now": now,
                "kind": KIND,
            },
        ).fetchone()
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return row


def complete_one(conn: sqlite3.Connection, job_id: str, token: str) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(COMPLETE, ("null", now_ms(), job_id, token))
    conn.execute("COMMIT")


# ---------------------------------------------------------------- workloads 1-3


def enqueue_one(path: Path, durability: str, jobs: int) -> float:
    """Workload 1: one INSERT per transaction. Jobs per second."""
    prepare(path)
    conn = connect(path, durability)
    with Timer() as timer:
        for i in range(jobs):
            now = now_ms()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                INSERT, (str(uuid.uuid4()), KIND, json.dumps(new_payload(i)), now, now, now)
            )
            conn.execute("COMMIT")
    conn.close()
    return jobs / timer.seconds


def enqueue_batches(path: Path, durability: str, jobs: int, batch: int) -> float:
    """Workload 2: ``executemany`` of ``batch`` rows per transaction. Jobs per second."""
    prepare(path)
    conn = connect(path, durability)
    with Timer() as timer:
        for start in range(0, jobs, batch):
            now = now_ms()
            rows = [
                (str(uuid.uuid4()), KIND, json.dumps(new_payload(i)), now, now, now)
                for i in range(start, min(start + batch, jobs))
            ]
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(INSERT, rows)
            conn.execute("COMMIT")
    conn.close()
    return jobs / timer.seconds


def enqueue_many_one(path: Path, durability: str, jobs: int) -> float:
    """Workload 2's single batch: ``executemany`` of ``jobs`` rows in one transaction."""
    prepare(path)
    conn = connect(path, durability)
    with Timer() as timer:
        now = now_ms()
        rows = [
            (str(uuid.uuid4()), KIND, json.dumps(new_payload(i)), now, now, now)
            for i in range(jobs)
        ]
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(INSERT, rows)
        conn.execute("COMMIT")
    conn.close()
    return jobs / timer.seconds


def claim_complete_one(path: Path, durability: str, jobs: int) -> float:
    """Workload 3: a claim transaction, then a completion transaction, per job."""
    prepare(path)
    conn = connect(path, durability)
    fill(conn, jobs)
    done = 0
    with Timer() as timer:
        while True:
            row = claim_one(conn, "raw")
            if row is None:
                break
            json.loads(row[1])
            complete_one(conn, row[0], row[2])
            done += 1
    conn.close()
    assert done == jobs, (done, jobs)
    return jobs / timer.seconds


def claim_batch(conn: sqlite3.Connection, batch: int = 100) -> list[Any]:
    """Claim up to ``batch`` jobs in one transaction (one multi-row UPDATE)."""
    now = now_ms()
    conn.execute("BEGIN IMMEDIATE")
    try:
        rows = conn.execute(
            CLAIM_BATCH,
            {
                "owner": "raw",
                "until": now + 30_000,
                "token": str(uuid.uuid4()),
                "now": now,
                "kind": KIND,
                "limit": batch,
            },
        ).fetchall()
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return rows


def complete_batch(conn: sqlite3.Connection, rows: list[Any]) -> None:
    """Complete ``rows`` in one transaction."""
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(COMPLETE, [("null", now_ms(), r[0], r[2]) for r in rows])
    conn.execute("COMMIT")


def drain_batched(path: Path, durability: str, jobs: int, batch: int = 100) -> float:
    """Workload 4's ceiling: claim ``batch`` in one transaction, complete them in one."""
    prepare(path)
    conn = connect(path, durability)
    fill(conn, jobs)
    done = 0
    with Timer() as timer:
        while rows := claim_batch(conn, batch):
            for row in rows:
                json.loads(row[1])
            complete_batch(conn, rows)
            done += len(rows)
    conn.close()
    assert done == jobs, (done, jobs)
    return jobs / timer.seconds


def batched_process_drainer(spec: dict[str, Any], channels: Channels) -> None:
    """Scale-out child: the batched ceiling, 100 jobs per transaction, in each process."""
    conn = connect(Path(spec["path"]), spec["durability"])
    channels.ready.set()
    channels.go.wait()
    while not channels.stop.is_set():
        rows = claim_batch(conn)
        if not rows:
            channels.stop.wait(0.005)
            continue
        complete_batch(conn, rows)
        for row in rows:
            channels.executed(json.loads(row[1])["n"])
    conn.close()


# ---------------------------------------------------------------- workload 5


def process_drainer(spec: dict[str, Any], channels: Channels) -> None:
    """Workload 5 child: claim + complete one at a time until told to stop."""
    conn = connect(Path(spec["path"]), spec["durability"])
    channels.ready.set()
    channels.go.wait()
    while not channels.stop.is_set():
        row = claim_one(conn, "raw")
        if row is None:
            channels.stop.wait(0.005)
            continue
        n = json.loads(row[1])["n"]
        complete_one(conn, row[0], row[2])
        channels.executed(n)
    conn.close()


def processes_setup(path: Path, durability: str, jobs: int) -> dict[str, Any]:
    prepare(path)
    conn = connect(path, durability)
    fill(conn, jobs)
    conn.close()
    return {"path": str(path), "durability": durability}


# ---------------------------------------------------------------- workload 6


def latency_local(path: Path, durability: str, samples: int) -> list[float]:
    """In-process: a consumer thread woken by the enqueuing thread after its commit."""
    prepare(path)
    producer = connect(path, durability)
    consumer = connect(path, durability)
    wake = threading.Event()
    stop = threading.Event()
    started: queue.Queue[float] = queue.Queue()

    def consume() -> None:
        while not stop.is_set():
            wake.wait(POLL_SECONDS)
            wake.clear()
            while (row := claim_one(consumer, "raw")) is not None:
                started.put(time.monotonic() - json.loads(row[1])["t"])
                complete_one(consumer, row[0], row[2])

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    latencies = []
    try:
        for n in range(samples):
            now = now_ms()
            payload = json.dumps({"n": n, "t": time.monotonic()})
            producer.execute("BEGIN IMMEDIATE")
            producer.execute(INSERT, (str(uuid.uuid4()), KIND, payload, now, now, now))
            producer.execute("COMMIT")
            wake.set()
            latencies.append(started.get(timeout=30))
    finally:
        stop.set()
        wake.set()
        thread.join(10)
    producer.close()
    consumer.close()
    return latencies


def latency_consumer(spec: dict[str, Any], reports: Any, ready: Any, stop: Any) -> None:
    """Across processes: poll every 50 ms, checking ``PRAGMA data_version`` first."""
    conn = connect(Path(spec["path"]), spec["durability"])
    seen = None
    ready.set()
    while not stop.is_set():
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if version != seen:
            seen = version
            while (row := claim_one(conn, "raw")) is not None:
                payload = json.loads(row[1])
                reports.put((payload["n"], time.monotonic() - payload["t"]))
                complete_one(conn, row[0], row[2])
            # our own commits moved data_version: re-read it so they do not count
            seen = conn.execute("PRAGMA data_version").fetchone()[0]
        stop.wait(POLL_SECONDS)
    conn.close()


def latency_remote_setup(path: Path, durability: str) -> tuple[dict[str, Any], Any]:
    prepare(path)
    conn = connect(path, durability)

    def enqueue(n: int, t: float) -> None:
        now = now_ms()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(INSERT, (str(uuid.uuid4()), KIND, json.dumps({"n": n, "t": t}), now, now, now))
        conn.execute("COMMIT")

    return {"path": str(path), "durability": durability}, enqueue


# ---------------------------------------------------------------- workload 7


def add_settled(path: Path, count: int, *, start: int) -> None:
    """Grow the table by ``count`` done rows with raw ``executemany`` (setup, untimed)."""
    conn = connect(path, "normal")
    old = now_ms() - 86_400_000
    payload = json.dumps(new_payload(0))
    chunk = 50_000
    for first in range(start, start + count, chunk):
        rows = [
            (f"settled-{i:08d}", KIND, payload, old, old, old)
            for i in range(first, min(first + chunk, start + count))
        ]
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(SETTLED_ROW, rows)
        conn.execute("COMMIT")
    conn.close()


def add_pending(path: Path, count: int) -> None:
    conn = connect(path, "normal")
    old = now_ms() - 3_600_000
    payload = json.dumps(new_payload(0))
    chunk = 50_000
    for first in range(0, count, chunk):
        rows = [
            (str(uuid.uuid4()), KIND, payload, old + i, old, old)
            for i in range(first, min(first + chunk, count))
        ]
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(INSERT, rows)
        conn.execute("COMMIT")
    conn.close()


def claim_cost(conn: sqlite3.Connection) -> float:
    """One raw claim transaction's wall time in seconds (the job stays leased)."""
    start = time.perf_counter()
    row = claim_one(conn, "raw")
    elapsed = time.perf_counter() - start
    assert row is not None
    return elapsed


# ---------------------------------------------------------------- workloads 8 and 9


def idle_cpu(path_text: str, durability: str, seconds: float, results: Any) -> None:
    """Workload 8 child: a thread attempting a claim transaction every 50 ms on an empty queue."""
    try:
        conn = connect(Path(path_text), durability)
        stop = threading.Event()

        def poll() -> None:
            while not stop.wait(POLL_SECONDS):
                claim_one(conn, "raw")

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        time.sleep(0.2)
        before = cpu_seconds()
        time.sleep(seconds)
        used = cpu_seconds() - before
        stop.set()
        thread.join(5)
        conn.close()
        results.put(used / seconds)
    except BaseException as exc:  # report, never hang the parent
        results.put(RuntimeError(f"raw idle_cpu: {exc!r}"))


def memory(path_text: str, durability: str, jobs: int, heap: bool, results: Any) -> None:
    """Workload 9 child: drain ``jobs`` jobs (100 per transaction), sampling RSS or heap."""
    try:
        conn = connect(Path(path_text), durability)
        fill(conn, jobs)
        measure = measure_heap() if heap else rss_bytes
        samples: list[tuple[int, int]] = [(0, measure())]
        done = 0
        step = max(1, jobs // 10)
        while True:
            now = now_ms()
            conn.execute("BEGIN IMMEDIATE")
            rows = conn.execute(
                CLAIM_BATCH,
                {
                    "owner": "raw",
                    "until": now + 30_000,
                    "token": str(uuid.uuid4()),
                    "now": now,
                    "kind": KIND,
                    "limit": 100,
                },
            ).fetchall()
            conn.execute("COMMIT")
            if not rows:
                break
            for row in rows:
                json.loads(row[1])
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(COMPLETE, [("null", now_ms(), r[0], r[2]) for r in rows])
            conn.execute("COMMIT")
            before = done
            done += len(rows)
            if done // step != before // step:
                samples.append((done, measure()))
        conn.close()
        results.put(samples)
    except BaseException as exc:
        results.put(RuntimeError(f"raw memory: {exc!r}"))
