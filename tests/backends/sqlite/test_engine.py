"""SQLite's own part of tests/conformance/test_engine.py: what only SQLite can show.

Moved out of the conformance suite, which holds what every backend promises
(its conftest refuses a ``sqlite`` requirement there); a test marked
``both_apis`` still runs through the asyncio API too, as it did there.
"""

from __future__ import annotations

import pytest

from jaren_jobs import (
    NewJob,
    Store,
)


@pytest.mark.both_apis  # sqlite3's trace callback counts the statements
def test_claim_many_is_one_transaction(store: Store) -> None:
    store.jobs.enqueue_many([NewJob("k") for _ in range(4)])
    statements: list[str] = []
    store.connection.set_trace_callback(statements.append)
    try:
        claimed = store.jobs.claim_many(["k"], owner="w1", limit=4)
    finally:
        store.connection.set_trace_callback(None)
    assert len(claimed) == 4
    begins = [s for s in statements if s.strip().upper().startswith("BEGIN")]
    commits = [s for s in statements if s.strip().upper() == "COMMIT"]
    updates = [s for s in statements if s.lstrip().upper().startswith("UPDATE")]
    # one UPDATE mints all four leases (sql.CLAIM_CANDIDATES)
    assert (len(begins), len(commits), len(updates)) == (1, 1, 1)
    assert statements.index(begins[0]) < statements.index(updates[0])
    assert statements.index(updates[-1]) < statements.index(commits[0])
