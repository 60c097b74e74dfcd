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


def test_the_history_table_is_keyed_by_job_and_attempt(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    open_store(path).close()
    conn = sqlite3.connect(path)
    try:
        columns = [row[1] for row in conn.execute('PRAGMA table_info("_jaren_job_errors")')]
        keyed = [row[1] for row in conn.execute('PRAGMA table_info("_jaren_job_errors")') if row[5]]
        version = conn.execute('SELECT value FROM "_jaren_meta"').fetchall()
    finally:
        conn.close()
    assert columns == ["job_id", "attempt", "at", "error", "traceback"]
    assert keyed == ["job_id", "attempt", "at"]
    assert version == [(str(sql.SCHEMA_VERSION),)]  # 5 made the table; later versions keep it
