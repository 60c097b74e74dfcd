"""PostgreSQL's own mechanics: migrations, plans, SKIP LOCKED, LISTEN/NOTIFY, reconnection.

Every test works in a schema of its own on the test server (the PostgreSQL
harness makes and drops it). Behaviour shared with SQLite is in
tests/conformance/; this file holds what only PostgreSQL has.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import jaren_jobs
from jaren_jobs import NewJob, SchemaError, StorageError, Store
from tests.harness import PostgresUrl

psycopg = pytest.importorskip("psycopg", reason="the dev extra installs psycopg")

WAIT = 10.0


def _server_pid(store: Store) -> int:
    return int(store._backend.db.connection.info.backend_pid)  # type: ignore[attr-defined]


def _terminate(pg: PostgresUrl, pid: int) -> None:
    with psycopg.connect(pg.server_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


# ----------------------------------------------------------------- migrations


def test_every_migration_from_empty_gives_the_current_schema(pg: PostgresUrl) -> None:
    from jaren_jobs.backends.postgres.schema import MIGRATIONS, SCHEMA_VERSION

    pg.open()
    columns = pg.query(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = ? AND table_name = '_jaren_jobs' ORDER BY ordinal_position",
        (pg.schema,),
    )
    assert [name for name, _ in columns] == [
        "id", "kind", "payload", "state", "priority", "run_at", "attempts", "max_attempts",
        "lease_until", "lease_owner", "lease_generation", "lease_token", "settled_generation",
        "claim_key", "last_error", "result", "created_at", "updated_at", "seq",
        "queue", "unique_key", "cancel_requested_at", "trace_context",
    ]  # fmt: skip
    # times are bigint epoch ms, payloads JSON text (byte-exact)
    kinds = dict(columns)
    assert kinds["run_at"] == kinds["created_at"] == kinds["cancel_requested_at"] == "bigint"
    assert kinds["payload"] == kinds["result"] == "text"
    indexes = {row[0] for row in pg.query("SELECT indexname FROM pg_indexes WHERE schemaname = ?",
                                          (pg.schema,))}  # fmt: skip
    assert {
        "_jaren_jobs_ready", "_jaren_jobs_leased",
        "_jaren_jobs_ready_queue", "_jaren_jobs_unique", "_jaren_jobs_queue_state",
    } <= indexes  # fmt: skip
    assert not indexes & {"_jaren_jobs_unleased", "_jaren_jobs_settled"}  # schema 8
    # the text keys sort bytewise, as every other key does
    collations = dict(pg.query(
        "SELECT column_name, collation_name FROM information_schema.columns "
        "WHERE table_schema = ? AND table_name = '_jaren_jobs'", (pg.schema,)))  # fmt: skip
    assert collations["queue"] == collations["unique_key"] == collations["kind"] == "C"
    assert pg.query("SELECT value FROM _jaren_meta WHERE key = 'schema_version'") == [
        (str(SCHEMA_VERSION),)
    ]
    assert SCHEMA_VERSION == len(MIGRATIONS) >= 1
    # opening again changes nothing
    before = pg.snapshot()
    pg.reopen()
    assert pg.snapshot() == before


def test_many_stores_opening_a_fresh_schema_at_once_create_it_once(pg: PostgresUrl) -> None:
    errors: list[BaseException] = []
    stores: list[Store] = []
    lock = threading.Lock()
    start = threading.Barrier(6)

    def open_one() -> None:
        try:
            start.wait(WAIT)
            store = jaren_jobs.open_store(pg.url)
            with lock:
                stores.append(store)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 3)
    try:
        assert errors == []
        assert len(stores) == 6
        assert pg.query("SELECT count(*) FROM _jaren_meta") == [(1,)]
        stores[0].jobs.enqueue("k", id="one")
        assert stores[5].jobs.get("one") is not None
    finally:
        for store in stores:
            store.close()


def test_a_read_only_store_creates_nothing(pg: PostgresUrl) -> None:
    with pytest.raises(SchemaError):
        jaren_jobs.open_store(pg.url, readonly=True)
    assert pg.query(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = ?", (pg.schema,)
    ) == [(0,)]
    pg.open().jobs.enqueue("k", id="there")
    reader = pg.open(readonly=True)
    assert reader.jobs.get("there") is not None
    with pytest.raises(StorageError, match="read-only"):
        reader.jobs.enqueue("k", id="refused")
    assert pg.job_ids() == ["there"]


@pytest.mark.parametrize(("durability", "expected"), [("full", "on"), ("normal", "off")])
def test_durability_is_synchronous_commit(pg: PostgresUrl, durability: str, expected: str) -> None:
    store = pg.open(durability=durability)
    [(shown,)] = store._backend.db.connection.execute("SHOW synchronous_commit").fetchall()  # type: ignore[attr-defined]
    assert shown == expected


# ----------------------------------------------------------------- plans


def _plan(pg: PostgresUrl, statement: str, params: dict[str, Any]) -> str:
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("ANALYZE _jaren_jobs")
        rows = conn.execute("EXPLAIN " + statement, params).fetchall()
    return "\n".join(row[0] for row in rows)


def test_the_claim_and_the_fence_use_their_indexes(pg: PostgresUrl) -> None:
    from jaren_jobs.backends.postgres import queries as sql

    store = pg.open()
    for start in range(0, 20_000, 1_000):
        store.jobs.enqueue_many(
            [NewJob("busy", {"n": n}) for n in range(start, start + 1_000)]
            + [NewJob("other", {"n": n}) for n in range(50)]
        )
    done = store.jobs.claim_many(["busy"], owner="w", limit=500)
    for job in done:
        store.jobs.complete(job.lease)
    now = 2**62
    claim = _plan(pg, sql.claim_lock(1), {"k0": "busy", "now": now, "limit": 8})
    assert "_jaren_jobs_ready" in claim
    assert "_jaren_jobs_leased" in claim  # the rescue branch reads only expired leases
    assert "Seq Scan" not in claim
    fence = _plan(pg, sql.SETTLE_DONE, {"id": "x", "token": "t", "now": now, "result": None})
    assert "_jaren_jobs_pkey" in fence
    assert "Seq Scan" not in fence


def test_claims_by_queue_and_unique_keys_use_their_indexes(pg: PostgresUrl) -> None:
    from jaren_jobs.backends.postgres import queries as sql

    store = pg.open()
    for start in range(0, 20_000, 1_000):
        store.jobs.enqueue_many(
            [NewJob("busy", {"n": n}, queue=f"q{n % 8}") for n in range(start, start + 1_000)]
            + [NewJob("busy", {"n": n}, unique_key=f"u{start + n}") for n in range(50)]
        )
    now = 2**62
    params = {"k0": "busy", "q0": "q3", "q1": "q5", "now": now, "limit": 8}
    claim = _plan(pg, sql.claim_lock(1, 2), params)
    # one walk of the queue-first index per (queue, kind), in claim order (no sort under it)
    assert claim.count("_jaren_jobs_ready_queue") == 2, claim
    assert "_jaren_jobs_leased" in claim
    assert "Seq Scan" not in claim
    branches = claim.split("CTE ")[1:]
    for branch in branches:
        if "_jaren_jobs_ready_queue" in branch:
            assert "Sort" not in branch, claim
    unique = _plan(
        pg,
        sql.ENQUEUE_UNIQUE,
        {
            "id": "x", "kind": "busy", "payload": "null", "priority": 0, "run_at": now,
            "max_attempts": 5, "now": now, "queue": "default", "key": "u7",
            "trace": None,
        },
    )  # fmt: skip
    assert "_jaren_jobs_unique" in unique, unique
    assert "Seq Scan" not in unique
    requeue = _plan(pg, sql.REQUEUE, {"id": "x", "now": now, "reset": False})
    assert "Seq Scan" not in requeue
    assert "_jaren_jobs_unique" in requeue, requeue
    counted = store.jobs.counts(queue="q3")
    assert counted.pending == 20_000 // 8


def test_a_requeue_racing_a_new_holder_of_its_key_is_refused_not_aborted(pg: PostgresUrl) -> None:
    """The holder commits while the requeue's update waits on it: a unique violation the
    session turns into the same refusal, and the store goes on."""
    from jaren_jobs import DuplicateJob

    store = pg.open()
    store.jobs.enqueue("k", id="old", unique_key="u")
    store.jobs.cancel("old")
    other = jaren_jobs.open_store(pg.url)
    answers: list[BaseException | bool] = []
    try:
        with other.transaction() as tx:
            tx.jobs.enqueue("k", id="new", unique_key="u")

            def requeue() -> None:
                try:
                    answers.append(store.jobs.requeue("old"))
                except BaseException as exc:
                    answers.append(exc)

            thread = threading.Thread(target=requeue)
            thread.start()
            deadline = time.monotonic() + WAIT
            # the requeue's update waits on the uncommitted holder's index entry
            while not pg.query(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%_jaren_jobs%'"
            ):
                assert time.monotonic() < deadline, "the requeue never waited on the holder"
                time.sleep(0.01)
        thread.join(WAIT)
        assert len(answers) == 1
        refused = answers[0]
        assert isinstance(refused, DuplicateJob), refused
        assert refused.details["held_by"] == "new"
        assert store.jobs.get("old").state == "cancelled"  # type: ignore[union-attr]
        assert store.jobs.get("new").state == "pending"  # type: ignore[union-attr]
        assert store.jobs.enqueue("k", unique_key="u").id == "new"
    finally:
        other.close()


def test_an_enqueue_that_waited_on_an_uncommitted_holder_answers_it(pg: PostgresUrl) -> None:
    """The holder commits while the insert waits on it: the statement's snapshot does not
    show it, so the session reads it again, and answers it (nothing written, no error)."""
    store = pg.open()
    other = jaren_jobs.open_store(pg.url)
    answers: list[Any] = []
    try:
        with other.transaction() as tx:
            tx.jobs.enqueue("k", id="first", unique_key="u")

            def enqueue() -> None:
                try:
                    answers.append(store.jobs.enqueue("k", id="second", unique_key="u"))
                except BaseException as exc:
                    answers.append(exc)

            thread = threading.Thread(target=enqueue)
            thread.start()
            deadline = time.monotonic() + WAIT
            while not pg.query(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%_jaren_jobs%'"
            ):
                assert time.monotonic() < deadline, "the enqueue never waited on the holder"
                time.sleep(0.01)
        thread.join(WAIT)
        assert len(answers) == 1
        assert getattr(answers[0], "id", answers[0]) == "first"
        assert store.jobs.get("second") is None
        # and if the holder rolls back instead, the waiting enqueue makes its own job
        store.jobs.cancel("first")
        with pytest.raises(ZeroDivisionError), other.transaction() as tx:  # noqa: PT012
            tx.jobs.enqueue("k", id="third", unique_key="u")
            thread = threading.Thread(target=enqueue)
            thread.start()
            deadline = time.monotonic() + WAIT
            while not pg.query(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%_jaren_jobs%'"
            ):
                assert time.monotonic() < deadline, "the enqueue never waited on the holder"
                time.sleep(0.01)
            1 / 0  # noqa: B018
        thread.join(WAIT)
        assert getattr(answers[1], "id", answers[1]) == "second"
        assert store.jobs.get("third") is None
    finally:
        other.close()


# ----------------------------------------------------------------- SKIP LOCKED


def test_a_claim_skips_rows_another_transaction_holds_and_never_waits(pg: PostgresUrl) -> None:
    store = pg.open(gate_timeout_seconds=60)
    store.jobs.enqueue("k", id="first", priority=9)
    store.jobs.enqueue("k", id="second")
    with psycopg.connect(pg.url) as holder:
        # another worker's claim in flight: it holds the best row
        holder.execute("SELECT id FROM _jaren_jobs WHERE id = 'first' FOR UPDATE")
        began = time.monotonic()
        claimed = store.jobs.claim(["k"], owner="w")
        assert time.monotonic() - began < 5  # skipped, never waited on the lock
        assert claimed is not None
        assert claimed.id == "second"
        holder.rollback()
    again = store.jobs.claim(["k"], owner="w")
    assert again is not None
    assert again.id == "first"


# ----------------------------------------------------------------- LISTEN / NOTIFY


def test_an_enqueue_in_another_store_wakes_an_idle_worker_and_the_listener_comes_back(
    pg: PostgresUrl,
) -> None:
    worker_store = pg.open()
    other = pg.open()
    started: dict[str, threading.Event] = {"a": threading.Event(), "b": threading.Event()}

    def handler(payload: Any, ctx: Any) -> None:
        started[payload].set()

    # a poll far longer than the test: only a notification can start the jobs promptly
    worker = worker_store.jobs.create_worker({"k": handler}, poll_seconds=300)
    worker.start()
    try:
        listener = worker_store._backend.db.listener  # type: ignore[attr-defined]
        assert listener.connected.wait(WAIT)
        other.jobs.enqueue("k", "a")
        assert started["a"].wait(WAIT), "the notification never woke the worker"
        # the listening connection is killed: it comes back, and wakes again
        pid = int(listener._conn.info.backend_pid)
        _terminate(pg, pid)
        deadline = time.monotonic() + WAIT
        while listener.reconnections == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert listener.reconnections >= 1
        assert listener.connected.wait(WAIT)
        other.jobs.enqueue("k", "b")
        assert started["b"].wait(WAIT), "the listener did not come back"
    finally:
        worker.stop()


def test_one_notification_per_enqueue_statement(pg: PostgresUrl) -> None:
    store = pg.open()
    with psycopg.connect(pg.url, autocommit=True) as listening:
        from jaren_jobs.backends.postgres.store import channel_name

        listening.execute(f'LISTEN "{channel_name(pg.schema)}"')
        store.jobs.enqueue_many([NewJob("k", n) for n in range(100)])
        got = list(listening.notifies(timeout=2.0, stop_after=5))
    assert len(got) == 1


# ----------------------------------------------------------------- faults


def test_a_connection_killed_while_idle_is_replaced_and_no_call_fails(pg: PostgresUrl) -> None:
    # SPEC §10: a call never fails for a connection it did not use (the call that is
    # using one when it breaks fails: tests/backends/postgres/test_pool.py)
    store = pg.open()
    store.jobs.enqueue("k", id="before")
    pid = _server_pid(store)
    _terminate(pg, pid)
    with psycopg.connect(pg.server_url, autocommit=True) as admin:
        gone = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
        pause = threading.Event()
        while admin.execute(gone, (pid,)).fetchone()[0]:  # the server ends it, then we go on
            pause.wait(0.01)
    store.jobs.enqueue("k", id="after")
    assert pg.job_ids() == ["after", "before"]
    assert _server_pid(store) != pid


# ----------------------------------------------------------------- the command line


def test_the_cli_takes_a_postgres_url_in_db_and_in_the_environment(pg: PostgresUrl) -> None:
    import json
    import os
    import subprocess
    import sys

    store = pg.open()
    store.jobs.enqueue("send", {"to": "ada"}, id="one")
    store.jobs.enqueue("send", {"to": "bob"}, id="two")

    def cli(*args: str, env_db: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "JAREN_JOBS_DB"}
        if env_db is not None:
            env["JAREN_JOBS_DB"] = env_db
        return subprocess.run(
            [sys.executable, "-m", "jaren_jobs", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )

    counts = cli("--db", pg.url, "counts", "--json")
    assert counts.returncode == 0, counts.stderr
    assert json.loads(counts.stdout)["pending"] == 2
    listed = cli("ls", "--json", env_db=pg.url)
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["id"] for line in listed.stdout.splitlines()] == ["one", "two"]
    cancelled = cli("--db", pg.url, "cancel", "one")
    assert cancelled.returncode == 0, cancelled.stderr
    assert store.jobs.get("one").state == "cancelled"  # type: ignore[union-attr]
    # a schema without the tables: a clear refusal, and nothing created by a read
    empty = pg.sibling("empty")
    refused = cli("--db", empty.url, "counts")  # type: ignore[attr-defined]
    assert refused.returncode != 0
    assert "Traceback" not in refused.stderr
    assert "no jaren_jobs tables" in refused.stderr
    assert empty.query(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = ?",
        (empty.schema,),  # type: ignore[attr-defined]
    ) == [(0,)]
