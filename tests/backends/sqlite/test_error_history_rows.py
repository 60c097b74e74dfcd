"""SQLite's own mechanics of the error history (SPEC §13): its table, and bad bytes in it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from jaren_jobs import open_store
from jaren_jobs.backends.sqlite import queries as sql


def test_a_history_text_that_is_not_utf8_reads_escaped(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with open_store(path) as store:
        job = store.jobs.enqueue("k")
        claimed = store.jobs.claim(["k"], owner="w")
        assert claimed is not None
        assert store.jobs.fail(claimed.lease, "first try") is True
    # another program leaves bytes that are not UTF-8 in the history's texts
    conn = sqlite3.connect(path)
    try:
        conn.execute(
            'UPDATE "_jaren_job_errors" SET error = CAST(? AS TEXT), traceback = CAST(? AS TEXT)',
            (b"OSError: caf\xe9", b"Traceback: \xff"),
        )
        conn.commit()
    finally:
        conn.close()
    with open_store(path, readonly=True) as store:
        [entry] = store.jobs.errors(job.id)
    assert (entry.attempt, entry.error, entry.traceback) == (
        1,
        "OSError: caf\\xe9",
        "Traceback: \\xff",
    )


def test_the_history_table_is_keyed_by_job_and_generation(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    open_store(path).close()
    conn = sqlite3.connect(path)
    try:
        columns = [row[1] for row in conn.execute('PRAGMA table_info("_jaren_job_errors")')]
        keyed = [row[1] for row in conn.execute('PRAGMA table_info("_jaren_job_errors")') if row[5]]
        version = conn.execute('SELECT value FROM "_jaren_meta"').fetchall()
    finally:
        conn.close()
    assert columns == ["job_id", "generation", "attempt", "at", "error", "traceback"]
    assert keyed == ["job_id", "generation"]
    assert version == [(str(sql.SCHEMA_VERSION),)]  # 5 made the table; 7 keyed it anew


def test_a_schema_6_history_is_rekeyed_in_place_keeping_every_entry_in_order(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    with open_store(path) as store:
        job = store.jobs.enqueue("k", max_attempts=5)
    # the history as schema 6 wrote it (keyed by attempt and instant), with entries
    conn = sqlite3.connect(path)
    try:
        conn.execute('DROP TABLE "_jaren_job_errors"')
        conn.execute(
            'CREATE TABLE "_jaren_job_errors" (job_id TEXT NOT NULL, attempt INTEGER NOT NULL, '
            "at INTEGER NOT NULL, error TEXT NOT NULL, traceback TEXT, "
            "PRIMARY KEY (job_id, attempt, at)) WITHOUT ROWID"
        )
        conn.executemany(
            'INSERT INTO "_jaren_job_errors" VALUES (?, ?, ?, ?, ?)',
            [(job.id, 2, 2000, "second", None), (job.id, 1, 1000, "first", "tb")],
        )
        conn.execute("UPDATE \"_jaren_meta\" SET value = '6' WHERE key = 'schema_version'")
        conn.commit()
    finally:
        conn.close()
    with open_store(path) as store:
        claimed = store.jobs.claim(["k"], owner="w")
        assert claimed is not None
        assert store.jobs.fail(claimed.lease, "third")
        history = store.jobs.errors(job.id)
    assert [(e.attempt, e.error, e.traceback) for e in history] == [
        (1, "first", "tb"),
        (2, "second", None),
        (1, "third", None),
    ]
    conn = sqlite3.connect(path)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    finally:
        conn.close()
    assert "_jaren_job_errors_before_7" not in tables
