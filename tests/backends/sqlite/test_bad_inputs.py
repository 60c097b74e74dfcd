"""SQLite's own part of tests/conformance/test_bad_inputs.py: what only SQLite can show.

Moved out of the conformance suite, which holds what every backend promises
(its conftest refuses a ``sqlite`` requirement there); a test marked
``both_apis`` still runs through the asyncio API too, as it did there.
"""

from __future__ import annotations

import pytest

from jaren_jobs import SchemaError
from tests.harness import Harness


@pytest.mark.requires("file")
@pytest.mark.both_apis
@pytest.mark.parametrize("content", ["no-tables", "empty-file", "other-tables"])
def test_readonly_store_without_tables(backend: Harness, content: str) -> None:
    if content == "empty-file":
        backend.path.write_bytes(b"")
    elif content == "other-tables":
        backend.execute("CREATE TABLE app_users (id INTEGER PRIMARY KEY)")
    else:
        backend.execute("PRAGMA user_version = 1")  # a real, table-less database
    before = backend.path.read_bytes()
    with pytest.raises(SchemaError) as info:
        backend.open(readonly=True)
    assert info.value.code == "JD0002"
    assert backend.path.read_bytes() == before  # created nothing
