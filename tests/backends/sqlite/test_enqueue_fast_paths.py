"""The SQLite side of the enqueue fast paths: statement sizes, and a store on ``:memory:``.

``enqueue_many`` splits its multi-row statements to fit the connection's
variable limit. What the fast paths answer on every backend is in
tests/conformance/test_enqueue_fast_paths.py; busy_timeout between writes is
in test_busy.py.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import DuplicateJob, NewJob, Runtime, open_store


def rows(db_path: Path) -> list[tuple[Any, ...]]:
    """Every job row with its rowid, in insertion order, read on a connection of its own."""
    conn = sqlite3.connect(db_path)
    try:
        return conn.execute('SELECT rowid, * FROM "_jaren_jobs" ORDER BY rowid').fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("limit", [999, 20, 8])
def test_a_low_variable_limit_shrinks_the_statements_not_the_batch(
    tmp_path: Path, runtime: Runtime, limit: int
) -> None:
    path = tmp_path / "limited.db"
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, limit)
    try:
        with open_store(connection=conn, runtime=runtime) as store:
            jobs = store.jobs.enqueue_many([NewJob("k", n) for n in range(1_000)])
            assert [job.payload for job in jobs] == list(range(1_000))
            assert [row[1] for row in rows(path)] == [job.id for job in jobs]
            taken = jobs[7].id
            with pytest.raises(DuplicateJob) as info:
                store.jobs.enqueue_many(
                    [NewJob("k", n) for n in range(300)] + [NewJob("k", id=taken)]
                )
            assert info.value.details["job_id"] == taken
            assert store.jobs.counts().pending == 1_000
    finally:
        conn.close()


def test_a_store_on_memory_still_writes_and_reads(runtime: Runtime) -> None:
    with open_store(":memory:", runtime=runtime) as store:
        jobs = store.jobs.enqueue_many([NewJob("k", n) for n in range(300)])
        assert store.jobs.get(jobs[-1].id) == jobs[-1]
        assert store.jobs.counts().pending == 300


def _bytes_written() -> int:
    """What this process has handed to write() so far (Linux's count, any file)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("/proc/self/io has no wchar line")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="counts Linux's bytes written")
@pytest.mark.parametrize("size", [100, 1_000])
def test_a_batch_writes_its_pages_to_the_wal_and_nowhere_else(tmp_path: Path, size: int) -> None:
    # A savepoint, or a multi-row statement that may abort, has SQLite copy each
    # page it first changes into a journal of its own (a temp file past 64 KiB):
    # as many bytes again as the WAL gets, for nothing a root write needs
    path = tmp_path / "q.db"
    with open_store(path) as store:
        for start in range(0, 8_000, 1_000):
            store.jobs.enqueue_many([NewJob("k", n) for n in range(start, start + 1_000)])
        other = sqlite3.connect(path)
        try:
            # an empty WAL: its size afterwards is what the batch wrote to it
            assert other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
        finally:
            other.close()
        before = _bytes_written()
        store.jobs.enqueue_many([NewJob("k", n) for n in range(size)])
        written = _bytes_written() - before
        wal = Path(f"{path}-wal").stat().st_size
    assert wal > 0
    assert written <= wal + 4096, (written, wal)
