"""PostgreSQL workloads: raw psycopg by hand, and jaren_jobs on a URL, side by side.

Selected with ``python -m bench --backend postgres --pg-url URL``. Every
measurement runs in a schema of its own (created, then dropped), so runs never
see each other's rows and the server needs nothing but ``CREATE`` on the
database. The raw baseline does the same work a careful programmer would write
by hand against a table of the same shape: an ``INSERT`` per enqueue, a
``SELECT ... FOR UPDATE SKIP LOCKED`` claim folded into an ``UPDATE``, an
``UPDATE`` by id and token to complete, ``LISTEN``/``NOTIFY`` to wake.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

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
from jaren_jobs import NewJob, Store

WAIT = 600.0
# the idle poll of every latency consumer: a second, so a start much sooner than that
# is a notification's doing, not a poll's
PG_POLL = 1.0
CHANNEL = "raw_jobs_wake"

RAW_TABLE = """
CREATE TABLE raw_jobs (
  id TEXT PRIMARY KEY, kind TEXT NOT NULL, payload TEXT, state TEXT NOT NULL,
  priority INTEGER NOT NULL DEFAULT 0, run_at BIGINT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0, lease_token TEXT, lease_until BIGINT,
  result TEXT, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL)
"""
RAW_INDEX = (
    "CREATE INDEX raw_jobs_claim ON raw_jobs (priority DESC, run_at, created_at, id) "
    "WHERE state = 'pending'"
)
INSERT = (
    "INSERT INTO raw_jobs (id, kind, payload, state, run_at, created_at, updated_at) "
    "VALUES (%s, %s, %s, 'pending', %s, %s, %s)"
)
CLAIM = (
    "UPDATE raw_jobs SET state = 'leased', attempts = attempts + 1, lease_token = %s, "
    "lease_until = %s, updated_at = %s WHERE id = (SELECT id FROM raw_jobs "
    "WHERE state = 'pending' AND run_at <= %s ORDER BY priority DESC, run_at, created_at, id "
    "LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id, payload, lease_token"
)
COMPLETE = (
    "UPDATE raw_jobs SET state = 'done', result = %s, lease_token = NULL, lease_until = NULL, "
    "updated_at = %s WHERE id = %s AND state = 'leased' AND lease_token = %s"
)


# the batched ceiling: claim up to %(limit)s jobs in one statement, complete them in one
CLAIM_BATCH = (
    "UPDATE raw_jobs SET state = 'leased', attempts = attempts + 1, lease_token = %s, "
    "lease_until = %s, updated_at = %s WHERE id IN (SELECT id FROM raw_jobs "
    "WHERE state = 'pending' AND run_at <= %s ORDER BY priority DESC, run_at, created_at, id "
    "LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING id, payload, lease_token"
)
COMPLETE_BATCH = (
    "UPDATE raw_jobs SET state = 'done', result = NULL, lease_token = NULL, "
    "lease_until = NULL, updated_at = %s FROM unnest(%s::text[], %s::text[]) AS d(id, token) "
    "WHERE raw_jobs.id = d.id AND raw_jobs.state = 'leased' AND raw_jobs.lease_token = d.token"
)
BATCH = 100


def now_ms() -> int:
    return int(time.time() * 1000)


def with_search_path(url: str, schema: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "options"]
    query.append(("options", f"-csearch_path={schema}"))
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


@contextlib.contextmanager
def fresh_schema(base: str, name: str) -> Iterator[str]:
    """A new schema for one measurement; yields a URL whose search_path is it."""
    import psycopg

    schema = f"bench_{name}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield with_search_path(base, schema)
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


# ---------------------------------------------------------------- raw psycopg


def raw_connect(url: str, durability: str) -> Any:
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    conn.execute(f"SET synchronous_commit = {'on' if durability == 'full' else 'off'}")
    return conn


def raw_prepare(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(RAW_TABLE)
        conn.execute(RAW_INDEX)


def raw_fill(conn: Any, jobs: int, batch: int = 1_000) -> None:
    now = now_ms()
    for start in range(0, jobs, batch):
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany(
                INSERT,
                [
                    (str(uuid.uuid4()), KIND, json.dumps(new_payload(i)), now, now, now)
                    for i in range(start, min(start + batch, jobs))
                ],
            )


def raw_claim(conn: Any) -> tuple[str, str, str] | None:
    now = now_ms()
    row = conn.execute(CLAIM, (uuid.uuid4().hex, now + 30_000, now, now)).fetchone()
    return None if row is None else (row[0], row[1], row[2])


def raw_complete(conn: Any, job_id: str, token: str) -> None:
    conn.execute(COMPLETE, (None, now_ms(), job_id, token))


def raw_enqueue_one(url: str, durability: str, jobs: int) -> float:
    raw_prepare(url)
    with raw_connect(url, durability) as conn, Timer() as timer:
        for i in range(jobs):
            now = now_ms()
            conn.execute(
                INSERT, (str(uuid.uuid4()), KIND, json.dumps(new_payload(i)), now, now, now)
            )
    return jobs / timer.seconds


def raw_enqueue_batches(url: str, durability: str, jobs: int, batch: int) -> float:
    raw_prepare(url)
    with raw_connect(url, durability) as conn, Timer() as timer:
        raw_fill(conn, jobs, batch)
    return jobs / timer.seconds


def raw_enqueue_many_one(url: str, durability: str, jobs: int) -> float:
    """``executemany`` of ``jobs`` rows in one transaction."""
    raw_prepare(url)
    with raw_connect(url, durability) as conn, Timer() as timer:
        raw_fill(conn, jobs, jobs)
    return jobs / timer.seconds


def raw_claim_complete_one(url: str, durability: str, jobs: int) -> float:
    raw_prepare(url)
    with raw_connect(url, durability) as conn:
        raw_fill(conn, jobs)
        done = 0
        with Timer() as timer:
            while (row := raw_claim(conn)) is not None:
                raw_complete(conn, row[0], row[2])
                done += 1
    assert done == jobs, (done, jobs)
    return jobs / timer.seconds


def raw_claim_batch(conn: Any, limit: int = BATCH) -> list[tuple[str, str, str]]:
    """Claim up to ``limit`` jobs in one statement (its own transaction)."""
    now = now_ms()
    rows = conn.execute(CLAIM_BATCH, (uuid.uuid4().hex, now + 30_000, now, now, limit)).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def raw_complete_batch(conn: Any, rows: list[tuple[str, str, str]]) -> None:
    """Complete ``rows`` in one statement (its own transaction), by id and token."""
    conn.execute(COMPLETE_BATCH, (now_ms(), [r[0] for r in rows], [r[2] for r in rows]))


def raw_drain_batched(url: str, durability: str, jobs: int, concurrency: int) -> float:
    """The ceiling: ``concurrency`` connections (threads) claiming and completing 100 at a time."""
    raw_prepare(url)
    with raw_connect(url, durability) as conn:
        raw_fill(conn, jobs)
    conns = [raw_connect(url, durability) for _ in range(concurrency)]
    done = [0] * concurrency

    def loop(i: int) -> None:
        while rows := raw_claim_batch(conns[i]):
            for row in rows:
                json.loads(row[1])
            raw_complete_batch(conns[i], rows)
            done[i] += len(rows)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(concurrency)]
    with Timer() as timer:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for conn in conns:
        conn.close()
    assert sum(done) == jobs, (done, jobs)
    return jobs / timer.seconds


def raw_batched_process_drainer(spec: dict[str, Any], channels: Channels) -> None:
    """Scale-out child: the batched ceiling, one connection per process."""
    with raw_connect(spec["url"], spec["durability"]) as conn:
        channels.ready.set()
        channels.go.wait()
        while not channels.stop.is_set():
            rows = raw_claim_batch(conn)
            if not rows:
                channels.stop.wait(0.005)
                continue
            raw_complete_batch(conn, rows)
            for row in rows:
                channels.executed(json.loads(row[1])["n"])


def raw_process_drainer(spec: dict[str, Any], channels: Channels) -> None:
    with raw_connect(spec["url"], spec["durability"]) as conn:
        channels.ready.set()
        channels.go.wait()
        while not channels.stop.is_set():
            row = raw_claim(conn)
            if row is None:
                channels.stop.wait(0.005)
                continue
            raw_complete(conn, row[0], row[2])
            channels.executed(json.loads(row[1])["n"])


def raw_processes_setup(url: str, durability: str, jobs: int) -> dict[str, Any]:
    raw_prepare(url)
    with raw_connect(url, durability) as conn:
        raw_fill(conn, jobs)
    return {"url": url, "durability": durability}


def _raw_enqueue_notify(conn: Any, n: int, t: float) -> None:
    now = now_ms()
    with conn.transaction():
        conn.execute(INSERT, (str(uuid.uuid4()), KIND, json.dumps({"n": n, "t": t}), now, now, now))
        conn.execute(f"NOTIFY {CHANNEL}")


def _raw_consume(url: str, durability: str, report: Any, stop: Any, ready: Any) -> None:
    """LISTEN on one connection, claim + complete on another; poll as the fallback."""
    import psycopg

    listener = psycopg.connect(url, autocommit=True)
    listener.execute(f"LISTEN {CHANNEL}")
    with raw_connect(url, durability) as conn:
        ready.set()
        while not stop.is_set():
            while (row := raw_claim(conn)) is not None:
                payload = json.loads(row[1])
                report((payload["n"], time.monotonic() - payload["t"]))
                raw_complete(conn, row[0], row[2])
            for _ in listener.notifies(timeout=PG_POLL, stop_after=1):
                pass
    listener.close()


def raw_latency_local(url: str, durability: str, samples: int) -> list[float]:
    raw_prepare(url)
    started: queue.Queue[tuple[int, float]] = queue.Queue()
    stop, ready = threading.Event(), threading.Event()
    consumer = threading.Thread(
        target=_raw_consume, args=(url, durability, started.put, stop, ready), daemon=True
    )
    consumer.start()
    ready.wait(30)
    latencies = []
    with raw_connect(url, durability) as producer:
        try:
            stop.wait(0.2)
            for n in range(samples):
                _raw_enqueue_notify(producer, n, time.monotonic())
                latencies.append(started.get(timeout=30)[1])
        finally:
            stop.set()
            consumer.join(10)
    return latencies


def raw_latency_consumer(spec: dict[str, Any], reports: Any, ready: Any, stop: Any) -> None:
    _raw_consume(spec["url"], spec["durability"], reports.put, stop, ready)


def raw_latency_remote_setup(url: str, durability: str) -> tuple[dict[str, Any], Any, Any]:
    raw_prepare(url)
    conn = raw_connect(url, durability)
    return (
        {"url": url, "durability": durability},
        lambda n, t: _raw_enqueue_notify(conn, n, t),
        conn.close,
    )


# ---------------------------------------------------------------- jaren_jobs on PostgreSQL


def open_(url: str, durability: str) -> Store:
    return jaren_jobs.open_store(url, durability=durability)  # type: ignore[arg-type]


def fill(store: Store, jobs: int, batch: int = 1_000) -> None:
    for start in range(0, jobs, batch):
        store.jobs.enqueue_many(
            [NewJob(KIND, new_payload(i)) for i in range(start, min(start + batch, jobs))]
        )


def enqueue_one(url: str, durability: str, jobs: int) -> float:
    with open_(url, durability) as store:
        enqueue = store.jobs.enqueue
        with Timer() as timer:
            for i in range(jobs):
                enqueue(KIND, new_payload(i))
    return jobs / timer.seconds


def enqueue_batches(url: str, durability: str, jobs: int, batch: int) -> float:
    with open_(url, durability) as store, Timer() as timer:
        fill(store, jobs, batch)
    return jobs / timer.seconds


def enqueue_many_one(url: str, durability: str, jobs: int) -> float:
    """One ``enqueue_many`` call of ``jobs`` jobs."""
    with open_(url, durability) as store, Timer() as timer:
        store.jobs.enqueue_many([NewJob(KIND, new_payload(i)) for i in range(jobs)])
    return jobs / timer.seconds


def claim_complete_one(url: str, durability: str, jobs: int) -> float:
    with open_(url, durability) as store:
        fill(store, jobs)
        claim, complete, kinds = store.jobs.claim, store.jobs.complete, [KIND]
        done = 0
        with Timer() as timer:
            while (claimed := claim(kinds, owner="bench")) is not None:
                complete(claimed.lease, None)
                done += 1
    assert done == jobs, (done, jobs)
    return jobs / timer.seconds


def drain(url: str, durability: str, jobs: int, concurrency: int) -> float:
    """A worker drains ``jobs`` no-op jobs. Jobs per second.

    Timed as the PostgreSQL peers are (:meth:`bench.pg_peer.PgPeer.drain`):
    from the first job's start, so the worker's start-up and first claim are
    not in it, to the last job's outcome, after its settlement committed (the
    peers' clocks stop at the last execution: that leans their way).
    """
    from bench.workloads import Finished

    first: list[float] = []

    def handler(payload: Any, ctx: Any) -> None:
        if not first:
            first.append(time.perf_counter())

    with open_(url, durability) as store:
        fill(store, jobs)
        finished = Finished(jobs)
        worker = store.jobs.create_worker(
            {KIND: handler}, concurrency=concurrency, on_outcome=finished
        )
        worker.start()
        if not finished.done.wait(WAIT):
            raise TimeoutError(f"bench: the worker drained {finished.count} of {jobs}")
        worker.stop()
        if finished.other:
            raise RuntimeError(f"bench: {finished.other} attempts did not complete")
    return jobs / (finished.at - first[0])


def process_drainer(spec: dict[str, Any], channels: Channels) -> None:
    """Workload 5 and scale-out child: one worker in this process.

    As the PostgreSQL peers' children (:func:`bench.pg_peer.process_drainer`):
    the worker starts before the shared clock and is ready at its first job,
    which it holds until ``go``.
    """
    reached = threading.Event()

    def handler(payload: Any, ctx: Any) -> None:
        if not reached.is_set():
            reached.set()
            channels.ready.set()
            channels.go.wait()
        channels.executed(payload["n"])

    with open_(spec["url"], spec["durability"]) as store:
        worker = store.jobs.create_worker(
            {KIND: handler}, concurrency=spec["concurrency"], poll_seconds=POLL_SECONDS
        )
        worker.start()
        channels.stop.wait()
        worker.stop()


def processes_setup(url: str, durability: str, jobs: int, concurrency: int) -> dict[str, Any]:
    with open_(url, durability) as store:
        fill(store, jobs)
    return {"url": url, "durability": durability, "concurrency": concurrency}


def latency_local(url: str, durability: str, samples: int) -> list[float]:
    started: queue.Queue[float] = queue.Queue()

    def handler(payload: Any, ctx: Any) -> None:
        started.put(time.monotonic() - payload["t"])

    latencies = []
    with open_(url, durability) as store:
        worker = store.jobs.create_worker({KIND: handler}, poll_seconds=PG_POLL)
        worker.start()
        try:
            threading.Event().wait(0.2)
            for n in range(samples):
                store.jobs.enqueue(KIND, {"n": n, "t": time.monotonic()})
                latencies.append(started.get(timeout=30))
        finally:
            worker.stop()
    return latencies


def latency_consumer(spec: dict[str, Any], reports: Any, ready: Any, stop: Any) -> None:
    def handler(payload: Any, ctx: Any) -> None:
        reports.put((payload["n"], time.monotonic() - payload["t"]))

    with open_(spec["url"], spec["durability"]) as store:
        worker = store.jobs.create_worker({KIND: handler}, poll_seconds=PG_POLL)
        worker.start()
        ready.set()
        stop.wait()
        worker.stop()


def latency_remote_setup(url: str, durability: str) -> tuple[dict[str, Any], Any, Any]:
    store = open_(url, durability)

    def enqueue(n: int, t: float) -> None:
        store.jobs.enqueue(KIND, {"n": n, "t": t})

    return {"url": url, "durability": durability}, enqueue, store.close


# ---------------------------------------------------------------- workloads 8 and 9, raw


def raw_idle_cpu(url: str, durability: str, seconds: float, results: Any) -> None:
    """Workload 8 child: a claim statement every 50 ms on an empty queue."""
    try:
        with raw_connect(url, durability) as conn:
            stop = threading.Event()

            def poll() -> None:
                while not stop.wait(POLL_SECONDS):
                    raw_claim(conn)

            thread = threading.Thread(target=poll, daemon=True)
            thread.start()
            time.sleep(0.2)
            before = cpu_seconds()
            time.sleep(seconds)
            used = cpu_seconds() - before
            stop.set()
            thread.join(5)
        results.put(used / seconds)
    except BaseException as exc:  # report, never hang the parent
        results.put(RuntimeError(f"raw psycopg idle_cpu: {exc!r}"))


def raw_idle_listen_cpu(url: str, durability: str, seconds: float, results: Any) -> None:
    """Workload 8 child: workload 6's raw consumer, idle: LISTEN, a claim every PG_POLL."""
    try:
        stop, ready = threading.Event(), threading.Event()
        consumer = threading.Thread(
            target=_raw_consume, args=(url, durability, None, stop, ready), daemon=True
        )
        consumer.start()
        if not ready.wait(30):
            raise RuntimeError("the consumer did not connect")
        time.sleep(0.2)
        before = cpu_seconds()
        time.sleep(seconds)
        used = cpu_seconds() - before
        stop.set()
        consumer.join(PG_POLL + 5)
        results.put(used / seconds)
    except BaseException as exc:  # report, never hang the parent
        results.put(RuntimeError(f"raw psycopg idle_listen_cpu: {exc!r}"))


def raw_memory(url: str, durability: str, jobs: int, heap: bool, results: Any) -> None:
    """Workload 9 child: the batched loop drains ``jobs`` jobs, sampling RSS or heap."""
    try:
        with raw_connect(url, durability) as conn:
            raw_fill(conn, jobs)
            measure = measure_heap() if heap else rss_bytes
            samples: list[tuple[int, int]] = [(0, measure())]
            done = 0
            step = max(1, jobs // 10)
            while rows := raw_claim_batch(conn):
                for row in rows:
                    json.loads(row[1])
                raw_complete_batch(conn, rows)
                before = done
                done += len(rows)
                if done // step != before // step:
                    samples.append((done, measure()))
        results.put(samples)
    except BaseException as exc:
        results.put(RuntimeError(f"raw psycopg memory: {exc!r}"))


# ---------------------------------------------------------------- workload 7

LIBRARY_JOBS = '"_jaren_jobs"'
# the raw claim on the library's own table and index, as bench.raw's CLAIM on SQLite's
LIBRARY_CLAIM = f"""UPDATE {LIBRARY_JOBS} SET state = 'leased', lease_owner = %s,
    lease_until = %s, lease_generation = lease_generation + 1, lease_token = %s,
    attempts = attempts + 1, updated_at = %s
  WHERE id = (SELECT id FROM {LIBRARY_JOBS} WHERE state IN ('pending', 'failed')
    AND kind = %s AND run_at <= %s ORDER BY priority DESC, run_at, created_at, id
    LIMIT 1 FOR UPDATE SKIP LOCKED)
  RETURNING id, payload, lease_token"""


def add_library_rows(url: str, count: int, *, settled: bool, start: int = 0) -> None:
    """Grow the library's table by ``count`` done (or pending) rows in one statement (untimed).

    Then ``VACUUM ANALYZE``, as autovacuum would have by the time a real table
    held that many rows: the claim is timed on a table in its steady state.
    """
    import psycopg

    old = now_ms() - (86_400_000 if settled else 3_600_000)
    if settled:
        statement = f"""INSERT INTO {LIBRARY_JOBS} (id, kind, payload, state, priority, run_at,
            attempts, max_attempts, lease_generation, settled_generation, result,
            created_at, updated_at)
          SELECT 'settled-' || lpad(g::text, 8, '0'), %s, '{{"n": 0}}', 'done', 0, %s, 1, 5,
            1, 1, 'null', %s, %s FROM generate_series(%s::bigint, %s::bigint) AS g"""
    else:
        statement = f"""INSERT INTO {LIBRARY_JOBS} (id, kind, payload, state, priority, run_at,
            attempts, max_attempts, lease_generation, created_at, updated_at)
          SELECT 'pending-' || lpad(g::text, 8, '0'), %s, '{{"n": 0}}', 'pending', 0, %s + g, 0,
            5, 0, %s, %s FROM generate_series(%s::bigint, %s::bigint) AS g"""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement, (KIND, old, old, old, start, start + count - 1))
        conn.execute(f"VACUUM ANALYZE {LIBRARY_JOBS}")


def library_claim_cost(conn: Any) -> float:
    """One raw claim statement's wall time in seconds (the job stays leased)."""
    now = now_ms()
    start = time.perf_counter()
    row = conn.execute(
        LIBRARY_CLAIM, ("raw", now + 30_000, uuid.uuid4().hex, now, KIND, now)
    ).fetchone()
    elapsed = time.perf_counter() - start
    assert row is not None
    return elapsed
