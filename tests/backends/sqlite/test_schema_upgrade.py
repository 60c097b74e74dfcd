"""Schema creation and the forward-only, in-place upgrade of the pre-fence schema."""

from __future__ import annotations

import re
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import (
    JobSettled,
    Lease,
    LeaseExpired,
    LeaseLost,
    LeaseRequired,
    LeaseSuperseded,
    Runtime,
    SchemaError,
    open_store,
)
from jaren_jobs.backends.sqlite import queries as sql
from tests.conftest import START, FakeClock

NOW_MS = int(START * 1000)

# the reference's pre-fence schema, verbatim from SPEC §1
PRE_FENCE = [
    """CREATE TABLE "_jaren_jobs" (id TEXT PRIMARY KEY, kind TEXT NOT NULL, payload TEXT,
  state TEXT NOT NULL, run_at INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
  max_attempts INTEGER NOT NULL, lease_until INTEGER, lease_owner TEXT,
  last_error TEXT, result TEXT, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL)""",
    """CREATE TABLE "_jaren_job_checkpoints" (run_id TEXT NOT NULL, node_id TEXT NOT NULL,
  value TEXT NOT NULL, PRIMARY KEY (run_id, node_id))""",
]

OLD_COLUMNS = (
    "id, kind, payload, state, run_at, attempts, max_attempts, lease_until, lease_owner, "
    "last_error, result, created_at, updated_at"
)

# live rows as the pre-fence library left them
OLD_ROWS: list[tuple[Any, ...]] = [
    ("p1", "mail", '{"to":"a"}', "pending", NOW_MS - 1000, 0, 5, None, None, None, None,
     NOW_MS - 5000, NOW_MS - 5000),
    ("l1", "legacy", '{"n":1}', "leased", NOW_MS - 4000, 1, 3, NOW_MS + 60_000, "old-worker",
     None, None, NOW_MS - 6000, NOW_MS - 4000),
    ("d1", "mail", "null", "done", NOW_MS - 9000, 1, 5, None, None, None, '{"sent":true}',
     NOW_MS - 9000, NOW_MS - 8000),
    ("f1", "mail", "[1,2]", "failed", NOW_MS + 5000, 2, 5, None, None, "Error: smtp down", None,
     NOW_MS - 7000, NOW_MS - 3000),
]  # fmt: skip

OLD_CHECKPOINTS = [("l1", "fetch", '"page"'), ("l1", "parse", "[1,2]"), ("d1", "x", "1")]


def build_pre_fence(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        for statement in PRE_FENCE:
            conn.execute(statement)
        conn.executemany(
            f'INSERT INTO "_jaren_jobs" ({OLD_COLUMNS}) VALUES ({", ".join("?" * 13)})', OLD_ROWS
        )
        conn.executemany(
            'INSERT INTO "_jaren_job_checkpoints" (run_id, node_id, value) VALUES (?, ?, ?)',
            OLD_CHECKPOINTS,
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def query(path: Path, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(statement, params).fetchall()
    finally:
        conn.close()


def schema_of(path: Path) -> list[tuple[str, str, str, str]]:
    """The library's objects in sqlite_master, SQL compared modulo whitespace."""

    def normal(text: str | None) -> str:
        text = re.sub(r"\s+", " ", text or "").strip()
        return re.sub(r"\s*([(),])\s*", r"\1", text)

    rows = query(
        path,
        "SELECT type, name, tbl_name, sql FROM sqlite_master "
        "WHERE tbl_name LIKE '\\_jaren\\_%' ESCAPE '\\' ORDER BY type, name",
    )
    return [(t, n, tbl, normal(s)) for t, n, tbl, s in rows]


def at(offset_seconds: float) -> datetime:
    return datetime.fromtimestamp(START, timezone.utc) + timedelta(seconds=offset_seconds)


@pytest.fixture
def old_db(db_path: Path) -> Path:
    build_pre_fence(db_path)
    return db_path


def test_upgrade_keeps_every_row(old_db: Path, runtime: Runtime) -> None:
    with open_store(old_db, runtime=runtime) as store:
        assert store.jobs.get("p1") is not None
    assert query(old_db, f'SELECT {OLD_COLUMNS} FROM "_jaren_jobs" ORDER BY id') == sorted(OLD_ROWS)
    new_columns = query(
        old_db,
        'SELECT id, priority, lease_generation, lease_token, settled_generation FROM "_jaren_jobs"'
        " ORDER BY id",
    )
    assert new_columns == [(job_id, 0, 0, None, None) for job_id in ("d1", "f1", "l1", "p1")]
    checkpoints = query(
        old_db,
        'SELECT run_id, node_id, value, generation FROM "_jaren_job_checkpoints" ORDER BY 1, 2',
    )
    assert checkpoints == [(*row, 0) for row in sorted(OLD_CHECKPOINTS)]
    assert query(old_db, 'SELECT key, value FROM "_jaren_meta"') == [
        ("schema_version", str(sql.SCHEMA_VERSION))
    ]
    indexes = {
        r[0]
        for r in query(
            old_db, "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
        )
    }
    assert {
        "_jaren_jobs_ready",
        "_jaren_jobs_leased",
        "_jaren_jobs_state_id",
        "_jaren_jobs_state_newest",
    } <= indexes
    assert not indexes & set(sql.DROPPED_INDEXES)  # schema 1's and 3's, replaced


def test_upgraded_rows_read_back_as_jobs(old_db: Path, runtime: Runtime) -> None:
    with open_store(old_db, runtime=runtime) as store:
        leased = store.jobs.get("l1")
        assert leased is not None
        assert leased.state == "leased"
        assert leased.payload == {"n": 1}
        assert leased.lease_owner == "old-worker"
        assert leased.lease_until == at(60)
        assert leased.lease_generation == 0
        assert leased.attempts == 1
        assert leased.priority == 0
        done = store.jobs.get("d1")
        assert done is not None
        assert (done.state, done.result, done.payload) == ("done", {"sent": True}, None)
        failed = store.jobs.get("f1")
        assert failed is not None
        assert (failed.state, failed.last_error, failed.run_at) == (
            "failed",
            "Error: smtp down",
            at(5),
        )
        counts = store.jobs.counts()
        assert (counts.pending, counts.leased, counts.done, counts.failed) == (1, 1, 1, 1)
        assert dict(counts.pending_kinds) == {"mail": 2}


def _forged(token: Any, generation: int = 0) -> Lease:
    return Lease(
        job_id="l1",
        token=token,
        generation=generation,
        attempt=1,
        owner="old-worker",
        expires_at=at(60),
    )


FORGED_TOKENS: list[Any] = ["", "old-worker", "l1", "00000000-0000-4000-8000-000000000000", None]


def test_pre_fence_lease_cannot_be_settled(old_db: Path, runtime: Runtime) -> None:
    with open_store(old_db, runtime=runtime) as store:
        before = query(old_db, 'SELECT * FROM "_jaren_jobs" WHERE id = ?', ("l1",))
        for token in FORGED_TOKENS:
            for generation in (0, 1):
                lease = _forged(token, generation)
                for call in (
                    lambda ls: store.jobs.complete(ls, "stolen"),
                    store.jobs.renew,
                    lambda ls: store.jobs.fail(ls, "x"),
                    lambda ls: store.jobs.cancel("l1", lease=ls),
                ):
                    with pytest.raises(LeaseLost) as info:
                        call(lease)
                    if token is not None:
                        # a token, but not the row's (it has none): another holds it
                        assert type(info.value) is LeaseSuperseded
        # nor without a lease, while its old lease_until lasts
        with pytest.raises(LeaseRequired):
            store.jobs.cancel("l1")
        with pytest.raises(LeaseRequired):
            store.jobs.requeue("l1")
        assert query(old_db, 'SELECT * FROM "_jaren_jobs" WHERE id = ?', ("l1",)) == before


def test_pre_fence_lease_is_rescued_by_a_claim(
    old_db: Path, runtime: Runtime, clock: FakeClock
) -> None:
    with open_store(old_db, runtime=runtime) as store:
        assert store.jobs.claim(["legacy"], owner="new-worker") is None  # still "live"
        clock.set(START + 59.999)
        assert store.jobs.claim(["legacy"], owner="new-worker") is None
        clock.set(START + 60)  # its lease_until passed
        rescued = store.jobs.claim(["legacy"], owner="new-worker", lease_seconds=10)
        assert rescued is not None
        assert rescued.id == "l1"
        assert rescued.lease.generation == 1
        assert rescued.attempts == 2
        assert rescued.payload == {"n": 1}
        assert rescued.lease_owner == "new-worker"
        # the generation-0 forgeries stay refused; the minted lease settles it
        for token in FORGED_TOKENS:
            with pytest.raises(LeaseLost):
                store.jobs.complete(_forged(token), "stolen")
        assert store.jobs.complete(rescued.lease, "rescued") is True
        job = store.jobs.get("l1")
        assert job is not None
        assert (job.state, job.result, job.lease_generation) == ("done", "rescued", 1)
        with pytest.raises(JobSettled):
            store.jobs.complete(_forged("x"), "late")


def test_pre_fence_lease_expires_for_the_old_schema_too(
    old_db: Path, runtime: Runtime, clock: FakeClock
) -> None:
    # after lease_until the forged lease is refused as expired or superseded, never accepted
    with open_store(old_db, runtime=runtime) as store:
        clock.set(START + 120)
        with pytest.raises((LeaseSuperseded, LeaseExpired)):
            store.jobs.complete(_forged("x"), "late")
        assert store.jobs.requeue("l1") is True
        job = store.jobs.get("l1")
        assert job is not None
        assert (job.state, job.attempts) == ("pending", 1)


def test_upgraded_queue_works(old_db: Path, runtime: Runtime, clock: FakeClock) -> None:
    with open_store(old_db, runtime=runtime) as store:
        first = store.jobs.claim(["mail"], owner="w")
        assert first is not None
        assert first.id == "p1"
        assert first.lease.generation == 1
        assert store.jobs.complete(first.lease) is True
        assert store.jobs.claim(["mail"], owner="w") is None  # f1 waits for its run_at
        clock.set(START + 5)
        retried = store.jobs.claim(["mail"], owner="w")
        assert retried is not None
        assert (retried.id, retried.attempts, retried.lease.generation) == ("f1", 3, 1)
        store.jobs.enqueue("mail", id="new", priority=1)
        assert store.jobs.get("new") is not None
        # sweep takes the old settled row and its checkpoints
        assert store.jobs.sweep(settled_before=at(-1)) == 1
        assert store.jobs.get("d1") is None
    assert (
        query(old_db, 'SELECT run_id FROM "_jaren_job_checkpoints" WHERE run_id = ?', ("d1",)) == []
    )


def test_opening_twice_is_a_no_op(old_db: Path, runtime: Runtime) -> None:
    with open_store(old_db, runtime=runtime):
        pass
    schema = schema_of(old_db)
    rows = query(old_db, 'SELECT * FROM "_jaren_jobs" ORDER BY id')
    watcher = sqlite3.connect(old_db)
    try:
        version = watcher.execute("PRAGMA data_version").fetchone()[0]
        with open_store(old_db, runtime=runtime):
            pass
        with open_store(old_db, runtime=runtime, readonly=True):
            pass
        # data_version moves when another connection commits: nobody did
        assert watcher.execute("PRAGMA data_version").fetchone()[0] == version
    finally:
        watcher.close()
    assert schema_of(old_db) == schema
    assert query(old_db, 'SELECT * FROM "_jaren_jobs" ORDER BY id') == rows


def test_fresh_and_upgraded_schemas_are_identical(tmp_path: Path, old_db: Path) -> None:
    fresh = tmp_path / "fresh.db"
    with open_store(fresh):
        pass
    with open_store(old_db):
        pass
    fresh_schema = schema_of(fresh)
    assert fresh_schema == schema_of(old_db)
    names = {name for _, name, _, _ in fresh_schema}
    assert {"_jaren_jobs", "_jaren_job_checkpoints", "_jaren_meta"} <= names
    columns = [r[1] for r in query(fresh, "SELECT * FROM pragma_table_info('_jaren_jobs')")]
    for column in (
        "priority",
        "lease_generation",
        "lease_token",
        "settled_generation",
        "claim_key",
    ):
        assert column in columns


def test_newer_schema_version_is_refused(db_path: Path) -> None:
    with open_store(db_path) as store:
        store.jobs.enqueue("k", id="j")
    conn = sqlite3.connect(db_path)
    newer = sql.SCHEMA_VERSION + 1
    conn.execute(f"UPDATE \"_jaren_meta\" SET value = '{newer}' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    schema = schema_of(db_path)
    for readonly in (False, True):
        with pytest.raises(SchemaError) as info:
            open_store(db_path, readonly=readonly)
        assert info.value.code == "JD0002"
        assert info.value.details["version"] == newer
        assert "upgrade jaren_jobs" in str(info.value)
    assert schema_of(db_path) == schema
    assert query(db_path, 'SELECT id FROM "_jaren_jobs"') == [("j",)]


@pytest.mark.parametrize("value", ["two", "", "2.0", "0x2"])
def test_a_schema_version_that_is_not_a_number_is_a_schema_error(db_path: Path, value: str) -> None:
    with open_store(db_path) as store:
        store.jobs.enqueue("k", id="j")
    conn = sqlite3.connect(db_path)
    conn.execute("UPDATE \"_jaren_meta\" SET value = ? WHERE key = 'schema_version'", (value,))
    conn.commit()
    conn.close()
    schema = schema_of(db_path)
    for readonly in (False, True):
        with pytest.raises(SchemaError) as info:
            open_store(db_path, readonly=readonly)
        assert info.value.code == "JD0002"
        assert repr(value) in str(info.value)
        assert "_jaren_meta" in str(info.value)
        assert info.value.details["version"] == value
    assert schema_of(db_path) == schema
    assert query(db_path, 'SELECT value FROM "_jaren_meta"') == [(value,)]


def test_readonly_store_refuses_a_pre_fence_schema(old_db: Path) -> None:
    schema = schema_of(old_db)
    with pytest.raises(SchemaError) as info:
        open_store(old_db, readonly=True)
    assert info.value.code == "JD0002"
    assert schema_of(old_db) == schema  # upgraded nothing
    with open_store(old_db):
        pass
    with open_store(old_db, readonly=True) as reader:
        assert reader.jobs.get("l1") is not None


def test_upgrade_is_one_transaction(old_db: Path) -> None:
    # a concurrent reader sees the old shape or the new one, never half of it:
    # the upgrade holds one write transaction from the first ALTER to the version
    statements: list[str] = []
    conn = sqlite3.connect(old_db, isolation_level=None, check_same_thread=False)
    conn.set_trace_callback(statements.append)
    try:
        with open_store(connection=conn):
            pass
    finally:
        conn.close()
    writes = [
        i
        for i, s in enumerate(statements)
        if s.lstrip().upper().startswith(("ALTER", "CREATE", "INSERT"))
    ]
    begins = [i for i, s in enumerate(statements) if s.strip().upper() == "BEGIN IMMEDIATE"]
    commits = [i for i, s in enumerate(statements) if s.strip().upper() == "COMMIT"]
    assert len(begins) == 1
    assert len(commits) == 1
    assert writes
    assert begins[0] < min(writes)
    assert max(writes) < commits[0]


def test_schema_1_is_upgraded_to_the_current_indexes(db_path: Path) -> None:
    # a file written by the previous release: schema 1, a (state, kind) index of every row
    with open_store(db_path) as store:
        store.jobs.enqueue("k", id="pending")
        store.jobs.enqueue("k", id="leased")
        store.jobs.enqueue("k", id="done")
        claimed = store.jobs.claim(["k"], owner="w")
        assert claimed is not None
        assert store.jobs.complete(claimed.lease) is True
        assert store.jobs.claim(["k"], owner="w") is not None
    conn = sqlite3.connect(db_path)
    conn.execute('CREATE INDEX "_jaren_jobs_state" ON "_jaren_jobs" (state, kind)')
    conn.execute("UPDATE \"_jaren_meta\" SET value = '1' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()

    with open_store(db_path) as store:
        counts = store.jobs.counts()
        assert (counts.pending, counts.leased, counts.done) == (1, 1, 1)
    indexes = {r[0] for r in query(db_path, "SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "_jaren_jobs_state_id" in indexes
    assert "_jaren_jobs_state" not in indexes
    assert query(db_path, 'SELECT value FROM "_jaren_meta"') == [(str(sql.SCHEMA_VERSION),)]


def test_schema_2_is_upgraded_in_place_to_name_the_settling_claim(
    db_path: Path, runtime: Runtime
) -> None:
    # a file written by the previous release: schema 2, no claim_key column
    with open_store(db_path, runtime=runtime) as store:
        store.jobs.enqueue("k", id="done")
        store.jobs.enqueue("k", id="leased")
        store.jobs.enqueue("k", id="pending")
        claimed = store.jobs.claim(["k"], owner="w")
        assert claimed is not None
        assert store.jobs.complete(claimed.lease, "ok") is True
        live = store.jobs.claim(["k"], owner="w")
        assert live is not None
    conn = sqlite3.connect(db_path)
    conn.execute('ALTER TABLE "_jaren_jobs" DROP COLUMN claim_key')
    conn.execute("UPDATE \"_jaren_meta\" SET value = '2' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    before = query(db_path, 'SELECT * FROM "_jaren_jobs" ORDER BY id')

    with open_store(db_path, runtime=runtime) as store:
        assert query(db_path, 'SELECT value FROM "_jaren_meta"') == [(str(sql.SCHEMA_VERSION),)]
        after = query(db_path, 'SELECT * FROM "_jaren_jobs" ORDER BY id')
        assert [row[:-1] for row in after] == before  # every row kept, the column added last
        assert [row[-1] for row in after] == [None, None, None]
        # a row settled before the upgrade names no claim: no lease is its settler
        with pytest.raises(JobSettled):
            store.jobs.complete(claimed.lease, "again")
        # a lease held across the upgrade still settles (the fence is the token);
        # its row names no claim, so a repeat is refused rather than guessed at
        assert store.jobs.complete(live.lease, "ok") is True
        with pytest.raises(JobSettled):
            store.jobs.complete(live.lease, "ok")
        # claims from the upgraded schema on are idempotent by claim
        fresh = store.jobs.claim(["k"], owner="w")
        assert fresh is not None
        assert store.jobs.complete(fresh.lease) is True
        assert store.jobs.complete(fresh.lease) is True


# ----------------------------------------------------------------- schema 3 -> 4 (SPEC §12)

# round 1's schema (version 3), verbatim as its library left it
ROUND_1 = [
    """CREATE TABLE "_jaren_jobs" (
  id TEXT PRIMARY KEY, kind TEXT NOT NULL, payload TEXT,
  state TEXT NOT NULL, run_at INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
  max_attempts INTEGER NOT NULL, lease_until INTEGER, lease_owner TEXT,
  last_error TEXT, result TEXT, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
  priority INTEGER NOT NULL DEFAULT 0, lease_generation INTEGER NOT NULL DEFAULT 0,
  lease_token TEXT, settled_generation INTEGER, claim_key BLOB)""",
    """CREATE TABLE "_jaren_job_checkpoints" (
  run_id TEXT NOT NULL, node_id TEXT NOT NULL,
  value TEXT NOT NULL, generation INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (run_id, node_id))""",
    """CREATE TABLE "_jaren_meta" (key TEXT PRIMARY KEY, value TEXT NOT NULL)""",
    """CREATE INDEX "_jaren_jobs_ready" ON "_jaren_jobs"
      (kind, priority DESC, run_at, created_at, id) WHERE state IN ('pending', 'failed')""",
    """CREATE INDEX "_jaren_jobs_leased" ON "_jaren_jobs"
      (lease_until) WHERE state = 'leased'""",
    """CREATE INDEX "_jaren_jobs_settled" ON "_jaren_jobs"
      (updated_at, id) WHERE state IN ('done', 'dead', 'cancelled')""",
    """CREATE INDEX "_jaren_jobs_unleased" ON "_jaren_jobs"
      (state, kind) WHERE state <> 'leased'""",
    """INSERT INTO "_jaren_meta" VALUES ('schema_version', '3')""",
]


def build_round_1(path: Path) -> None:
    from tests.backends import round1

    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        for statement in ROUND_1:
            conn.execute(statement)
        names = ", ".join(round1.COLUMNS)
        marks = ", ".join("?" * len(round1.COLUMNS))
        conn.executemany(f'INSERT INTO "_jaren_jobs" ({names}) VALUES ({marks})', round1.ROWS)
        conn.executemany(
            'INSERT INTO "_jaren_job_checkpoints" VALUES (?, ?, ?, ?)', round1.CHECKPOINTS
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def test_round_1_live_rows_upgrade_in_place_to_queues_and_unique_keys(
    db_path: Path, runtime: Runtime, clock: FakeClock
) -> None:
    from tests.backends import round1

    build_round_1(db_path)
    with open_store(db_path, runtime=runtime) as store:
        assert query(db_path, 'SELECT value FROM "_jaren_meta"') == [(str(sql.SCHEMA_VERSION),)]
        # 5: the error history table, empty after the upgrade
        assert query(db_path, 'SELECT count(*) FROM "_jaren_job_errors"') == [(0,)]
        indexes = {
            r[0] for r in query(db_path, "SELECT name FROM sqlite_master WHERE type = 'index'")
        }
        assert {"_jaren_jobs_ready_queue", "_jaren_jobs_unique"} <= indexes
        round1.check_upgraded(store, lambda statement: query(db_path, statement), clock)


def test_round_1_schema_upgraded_equals_a_fresh_one(tmp_path: Path, runtime: Runtime) -> None:
    old, fresh = tmp_path / "old.db", tmp_path / "fresh.db"
    build_round_1(old)
    open_store(old, runtime=runtime).close()
    open_store(fresh, runtime=runtime).close()
    assert schema_of(old) == schema_of(fresh)


# ----------------------------------------------------------------- schema 5 -> 6 (SPEC §13)


def test_schema_5_is_upgraded_in_place_with_the_cancel_mark(
    db_path: Path, runtime: Runtime, clock: FakeClock
) -> None:
    # a file written by the previous release: schema 5, no cancel_requested_at
    with open_store(db_path, runtime=runtime) as store:
        store.jobs.enqueue("k", id="live")
        store.jobs.enqueue("k", id="pending")
        live = store.jobs.claim(["k"], owner="w", lease_seconds=10)
        assert live is not None
    conn = sqlite3.connect(db_path)
    conn.execute('ALTER TABLE "_jaren_jobs" DROP COLUMN cancel_requested_at')
    conn.execute("UPDATE \"_jaren_meta\" SET value = '5' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    before = query(db_path, 'SELECT * FROM "_jaren_jobs" ORDER BY id')

    with open_store(db_path, runtime=runtime) as store:
        assert query(db_path, 'SELECT value FROM "_jaren_meta"') == [(str(sql.SCHEMA_VERSION),)]
        after = query(db_path, 'SELECT * FROM "_jaren_jobs" ORDER BY id')
        assert [row[:-1] for row in after] == before  # every row kept, the column added last
        assert [row[-1] for row in after] == [None, None]
        # a lease held across the upgrade is marked, and cancelled once it runs out
        assert store.jobs.cancel("live", force=True) is True
        clock.advance(11)
        job = store.jobs.get("live")
        assert job is not None
        assert (job.state, job.cancel_requested) == ("cancelled", True)
        assert store.jobs.claim(["k"], owner="w") is not None  # the pending one, not "live"


# ----------------------------------------------------------------- schema 9 -> 10

# the two indexes schema 9 had beside the ones it keeps, verbatim
SCHEMA_9_ONLY = [
    """CREATE INDEX "_jaren_jobs_settled" ON "_jaren_jobs"
      (updated_at, id) WHERE state IN ('done', 'dead', 'cancelled')""",
    """CREATE INDEX "_jaren_jobs_unleased" ON "_jaren_jobs"
      (state, kind) WHERE state <> 'leased'""",
]


def test_schema_9_drops_the_indexes_other_indexes_serve(
    tmp_path: Path, runtime: Runtime, clock: FakeClock
) -> None:
    # every enqueue or settlement maintained them; counts and sweeps read the
    # state indexes and the ready index instead
    path, fresh = tmp_path / "nine.db", tmp_path / "fresh.db"
    with open_store(path, runtime=runtime) as store:
        for name in ("done", "dead", "leased", "failed", "pending"):
            store.jobs.enqueue("k", id=name, max_attempts=1 if name == "dead" else 2)
            clock.advance(1)
        for name in ("done", "dead", "leased", "failed"):
            claimed = store.jobs.claim(["k"], owner="w")
            assert claimed is not None
            assert claimed.id == name
            if name == "done":
                store.jobs.complete(claimed.lease)
            elif name != "leased":
                store.jobs.fail(claimed.lease, "no", backoff_base_seconds=60)
            clock.advance(1)
    conn = sqlite3.connect(path)
    for statement in SCHEMA_9_ONLY:
        conn.execute(statement)
    conn.execute("UPDATE \"_jaren_meta\" SET value = '9' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    before = query(path, 'SELECT * FROM "_jaren_jobs" ORDER BY id')

    with open_store(path, runtime=runtime) as store:
        assert query(path, 'SELECT value FROM "_jaren_meta"') == [(str(sql.SCHEMA_VERSION),)]
        assert query(path, 'SELECT * FROM "_jaren_jobs" ORDER BY id') == before
        counts = store.jobs.counts()
        assert (counts.pending, counts.failed, counts.leased, counts.done, counts.dead) == (
            1,
            1,
            1,
            1,
            1,
        )
        assert counts.pending_kinds == {"k": 2}
        newest = [job.id for job in store.jobs.page(order="newest")]
        assert newest == ["failed", "leased", "dead", "done", "pending"]  # last change first
        clock.advance(1)
        assert (
            store.jobs.sweep(
                settled_before=datetime.fromtimestamp(clock.now(), timezone.utc), limit=1
            )
            == 1
        )
        assert store.jobs.get("done") is None  # the oldest settled row first
    indexes = {r[0] for r in query(path, "SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert not indexes & {"_jaren_jobs_settled", "_jaren_jobs_unleased"}
    open_store(fresh, runtime=runtime).close()
    assert schema_of(path) == schema_of(fresh)


# ----------------------------------------------------------------- schema 10 -> 11


def test_schema_10_gains_the_queue_state_index_with_its_rows(
    tmp_path: Path, runtime: Runtime, clock: FakeClock
) -> None:
    # counts(queue=...) read every row of the table before it
    path, fresh = tmp_path / "ten.db", tmp_path / "fresh.db"
    with open_store(path, runtime=runtime) as store:
        for n in range(9):
            store.jobs.enqueue("k", id=f"j{n}", queue=("q1", "q2", "q3")[n % 3])
            clock.advance(1)
        claimed = store.jobs.claim(["k"], owner="w", queues=["q1"])
        assert claimed is not None
        store.jobs.complete(claimed.lease)
        before = {q: store.jobs.counts(queue=q) for q in ("q1", "q2", "q3")}
    conn = sqlite3.connect(path)
    conn.execute('DROP INDEX "_jaren_jobs_queue_state"')
    conn.execute("UPDATE \"_jaren_meta\" SET value = '10' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()

    with open_store(path, runtime=runtime) as store:
        assert query(path, 'SELECT value FROM "_jaren_meta"') == [(str(sql.SCHEMA_VERSION),)]
        after = {q: store.jobs.counts(queue=q) for q in ("q1", "q2", "q3")}
        assert after == before
        assert (after["q1"].done, after["q1"].pending, after["q2"].pending) == (1, 2, 3)
    # the index holds every unleased row (an integrity check reads it against the table)
    assert query(path, "PRAGMA integrity_check") == [("ok",)]
    open_store(fresh, runtime=runtime).close()
    assert schema_of(path) == schema_of(fresh)
