"""SQLite's own part of tests/conformance/test_async_tx_parts.py: what only SQLite can show.

Moved out of the conformance suite, which holds what every backend promises
(its conftest refuses a ``sqlite`` requirement there); a test marked
``both_apis`` still runs through the asyncio API too, as it did there.
"""

from __future__ import annotations

import time

import pytest

from jaren_jobs import (
    AsyncStore,
    GateRefused,
    Store,
)
from tests.conformance.test_async_store import run


@pytest.mark.both_apis
def test_a_sync_call_inside_the_tasks_own_async_transaction_is_refused_at_once(
    astore: AsyncStore, store: Store
) -> None:
    # SQLite's async transaction holds the store on a lane thread; waiting for it from
    # the loop's thread froze the whole loop until the gate timed out
    async def main() -> float:
        async with astore.transaction() as tx:
            await tx.jobs.enqueue("k", id="mine")
            began = time.monotonic()
            with pytest.raises(GateRefused, match=r"own async store\.transaction"):
                store.jobs.enqueue("k", id="sync")
            with pytest.raises(GateRefused):
                store.jobs.counts()
            return time.monotonic() - began

    took = run(main())
    assert took < 1.0  # not the gate's timeout
    assert store.jobs.get("mine") is not None
    assert store.jobs.get("sync") is None
