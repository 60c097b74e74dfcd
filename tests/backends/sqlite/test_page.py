"""SQLite's own part of tests/conformance/test_page.py: what only SQLite can show.

Moved out of the conformance suite, which holds what every backend promises
(its conftest refuses a ``sqlite`` requirement there); a test marked
``both_apis`` still runs through the asyncio API too, as it did there.
"""

from __future__ import annotations

import pytest

from jaren_jobs import Store
from tests.conformance.test_page import fill, ids
from tests.harness import Harness


@pytest.mark.both_apis
def test_nothing_is_held_between_pulls(real_store: Store, backend: Harness) -> None:
    made = fill(real_store, 5)
    cursor = real_store.jobs.page()
    assert next(cursor).id == made[0]
    # a held statement would pin a read snapshot and make this checkpoint busy
    [(busy, _, _)] = backend.query("PRAGMA wal_checkpoint(TRUNCATE)")
    assert busy == 0
    assert ids(cursor) == made[1:]
