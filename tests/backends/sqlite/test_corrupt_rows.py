"""SQLite's own part of tests/conformance/test_corrupt_rows.py: what only SQLite can show.

Moved out of the conformance suite, which holds what every backend promises
(its conftest refuses a ``sqlite`` requirement there); a test marked
``both_apis`` still runs through the asyncio API too, as it did there.
"""

from __future__ import annotations

from typing import Any

import pytest

from jaren_jobs import Store
from tests.conformance import test_corrupt_rows as conformance
from tests.harness import Harness


@pytest.mark.both_apis
def test_a_last_error_that_is_not_utf8_is_shown_escaped_and_the_job_still_runs(
    store: Store, backend: Harness
) -> None:
    store.jobs.enqueue("k", id="j")
    claimed = store.jobs.claim(["k"], owner="w")
    assert claimed is not None
    assert store.jobs.fail(claimed.lease, "first try")
    backend.write_raw_row("j", last_error=b"OSError: caf\xe9")
    assert store.jobs.requeue("j") is True
    got = store.jobs.get("j")
    assert got is not None
    assert got.last_error == "OSError: caf\\xe9"
    again = store.jobs.claim(["k"], owner="w")
    assert again is not None
    assert again.last_error == "OSError: caf\\xe9"
    assert store.jobs.complete(again.lease, 1) is True


# the conformance suite's poison-row tests, with the poison only SQLite can hold (text
# that is not UTF-8): the same bodies, run here rather than copied


@pytest.mark.both_apis
@pytest.mark.parametrize("column", ["payload", "result"])
def test_a_not_utf8_text_reads_as_a_marker_from_get_and_page(
    store: Store, backend: Harness, column: str
) -> None:
    conformance.test_a_poison_text_reads_as_a_marker_from_get_and_page(
        store, backend, column, "not-utf8"
    )


@pytest.mark.both_apis
def test_a_batch_claim_over_a_not_utf8_row_claims_every_row(store: Store, backend: Harness) -> None:
    conformance.test_a_batch_claim_over_a_poison_row_claims_every_row(store, backend, "not-utf8")


@pytest.mark.both_apis
def test_a_worker_fails_a_not_utf8_row_and_its_kind_goes_on(
    store: Store, backend: Harness, clock: Any
) -> None:
    conformance.test_a_worker_fails_a_poison_row_and_its_kind_goes_on(
        store, backend, clock, "not-utf8"
    )
