"""The fence classification, over every combination of what a row and a lease can say.

``core.fence.classify`` is pure: a fence row (or none), a lease and the
time in, a verdict or a named refusal out. Each combination of state, token,
generation, the settling attempt and expiry is checked against the
rule of SPEC §3 as written there, case by case.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timezone

import pytest

from jaren_jobs import JobSettled, Lease, LeaseExpired, LeaseLost, LeaseSuperseded
from jaren_jobs.backend import Missed
from jaren_jobs.core.fence import (
    FenceRow,
    Verdict,
    classify,
    refusal,
    renewal_refusal,
    settled_by,
)

NOW = 1_800_000_000_000
TOKEN = "tok-live-0123456789"
KEY = b"k" * 16
GENERATION = 3

LEASE = Lease(
    job_id="job-1",
    token=TOKEN,
    generation=GENERATION,
    attempt=2,
    owner="w",
    expires_at=datetime(2027, 1, 15, tzinfo=timezone.utc),
    claim_key=KEY,
)

STATES = ["pending", "leased", "done", "failed", "dead", "cancelled"]
TOKENS = {"same": TOKEN, "other": "tok-other-987", "none": None}
GENERATIONS = {"same": GENERATION, "older": GENERATION - 1, "newer": GENERATION + 1}
SETTLED = {"none": None, "same": GENERATION, "other": GENERATION + 1}
KEYS = {"same": KEY, "other": b"o" * 16, "none": None}
UNTIL = {"future": NOW + 5_000, "exactly-now": NOW, "past": NOW - 1_234, "none": None}

CASES = list(
    itertools.product(STATES, TOKENS, GENERATIONS, SETTLED, KEYS, UNTIL),
)


def _expected(  # noqa: PLR0917 - one argument per axis of the table
    state: str, token: str, generation: str, settled: str, key: str, until: str
) -> tuple[type[LeaseLost] | Verdict, str | None]:
    """SPEC §3's table: which answer, and (for a supersession) what it says."""
    if state != "leased":
        if settled == "same" and key == "same":
            return Verdict.SETTLED_BY_THIS_ATTEMPT, None
        return JobSettled, None
    if token != "same":
        if generation != "same":
            return LeaseSuperseded, "another attempt holds it now"
        if key == "same":
            return LeaseSuperseded, "a renewal replaced it"
        return LeaseSuperseded, "swept and enqueued again"
    if until in ("exactly-now", "past"):
        return LeaseExpired, None
    if until == "none":  # a leased row without an expiry is not a live lease
        return LeaseExpired, None
    return Verdict.HELD, None


@pytest.mark.parametrize(
    ("state", "token", "generation", "settled", "key", "until"),
    CASES,
    ids=["-".join(case) for case in CASES],
)
def test_every_combination_gets_the_answer_the_table_gives(  # noqa: PLR0917
    state: str, token: str, generation: str, settled: str, key: str, until: str
) -> None:
    row = FenceRow(
        state=state,
        token=TOKENS[token],
        lease_until=UNTIL[until],
        generation=GENERATIONS[generation],
        settled_generation=SETTLED[settled],
        claim_key=KEYS[key],
    )
    expected, says = _expected(state, token, generation, settled, key, until)
    verdict = classify(row, LEASE, NOW, "complete()")
    if isinstance(expected, Verdict):
        assert verdict is expected
        return
    assert isinstance(verdict, expected)
    assert verdict.details["job_id"] == "job-1"
    assert TOKEN not in str(verdict)
    assert TOKEN not in repr(verdict.details)
    assert str(verdict).startswith(f"{verdict.code}: complete() refused")
    if says is not None:
        assert says in str(verdict)
    if expected is JobSettled:
        assert verdict.details["state"] == state
    if expected is LeaseSuperseded:
        assert verdict.details["generation"] == GENERATION
        assert verdict.details["current_generation"] == GENERATIONS[generation]
    if expected is LeaseExpired and UNTIL[until] is not None:
        assert verdict.details["expired_ms"] == NOW - UNTIL[until]


def test_an_unknown_job_is_settled_with_no_state() -> None:
    verdict = classify(None, LEASE, NOW, "renew()")
    assert isinstance(verdict, JobSettled)
    assert verdict.details == {"job_id": "job-1", "state": None}
    assert "unknown" in str(verdict)


def test_a_lease_without_a_claim_key_is_never_the_settling_attempt() -> None:
    """A hand-made lease (no claim key) matches no row, not even a NULL key's."""
    forged = Lease("job-1", TOKEN, GENERATION, 2, "w", LEASE.expires_at)
    for key in (None, b""):
        row = FenceRow("done", None, None, GENERATION, GENERATION, key)
        assert isinstance(classify(row, forged, NOW, "complete()"), JobSettled)


def test_refusal_is_none_only_for_the_settling_attempt_and_never_a_false_success() -> None:
    settled = FenceRow("done", None, None, GENERATION, GENERATION, KEY)
    assert refusal(settled, LEASE, NOW, "complete()") is None
    held = FenceRow("leased", TOKEN, NOW + 1, GENERATION, None, KEY)
    answer = refusal(held, LEASE, NOW, "complete()")
    assert isinstance(answer, JobSettled)  # a guard that missed a held row: refused, not True
    gone = refusal(None, LEASE, NOW, "complete()")
    assert isinstance(gone, JobSettled)


def test_a_fence_row_is_read_from_the_drivers_tuple() -> None:
    row = FenceRow.from_row(("leased", TOKEN, NOW, "3", None, memoryview(KEY)))
    assert row == FenceRow("leased", TOKEN, NOW, GENERATION, None, KEY)
    assert row.last_error is None  # a backend that does not read it leaves the default


def test_a_fence_row_carries_the_stored_error_for_the_outcome() -> None:
    row = FenceRow.from_row(("dead", None, None, 3, 3, KEY), last_error="ValueError: boom")
    assert row == FenceRow("dead", None, None, GENERATION, GENERATION, KEY, "ValueError: boom")
    assert row.last_error == "ValueError: boom"


def test_a_fence_row_never_shows_its_token() -> None:
    row = FenceRow("leased", TOKEN, NOW, GENERATION, None, KEY)
    assert TOKEN not in repr(row)
    assert TOKEN not in str(row)
    assert TOKEN not in repr(Missed(row))


SETTLED_BY_CASES = [
    ("this attempt settled it", FenceRow("done", None, None, GENERATION, GENERATION, KEY), True),
    ("failed by it", FenceRow("failed", None, None, GENERATION, GENERATION, KEY), True),
    ("still leased", FenceRow("leased", TOKEN, NOW, GENERATION, GENERATION, KEY), False),
    ("another claim", FenceRow("done", None, None, GENERATION, GENERATION, b"o" * 16), False),
    ("another generation", FenceRow("done", None, None, 4, 4, KEY), False),
    ("nobody settled it", FenceRow("pending", None, None, GENERATION, None, KEY), False),
    ("no such job", None, False),
]


@pytest.mark.parametrize(
    ("case", "case_row", "expected"), SETTLED_BY_CASES, ids=[c for c, _, _ in SETTLED_BY_CASES]
)
def test_settled_by_agrees_with_the_classification(
    case: str, case_row: FenceRow | None, expected: bool
) -> None:
    assert settled_by(case_row, LEASE) is expected
    verdict = classify(case_row, LEASE, NOW, "complete()")
    assert (verdict is Verdict.SETTLED_BY_THIS_ATTEMPT) is expected


def test_a_renewal_is_refused_even_for_the_attempts_own_settlement() -> None:
    own = FenceRow("done", None, None, GENERATION, GENERATION, KEY)
    refused = renewal_refusal(own, LEASE, NOW, "renew()")
    assert isinstance(refused, JobSettled)
    assert "already settled (by this attempt)" in str(refused)
    assert TOKEN not in str(refused)
    other = FenceRow("done", None, None, GENERATION, GENERATION, b"o" * 16)
    assert renewal_refusal(other, LEASE, NOW, "renew()").details["state"] == "done"
    held = FenceRow("leased", TOKEN, NOW - 1, GENERATION, None, KEY)
    assert isinstance(renewal_refusal(held, LEASE, NOW, "renew()"), LeaseExpired)
