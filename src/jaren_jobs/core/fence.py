"""The fence: from a job's fence row and a lease, which refusal applies (or none).

Every settling statement is guarded by ``state='leased' AND lease_token=?
AND lease_until > now``. When the guard matches nothing, the backend hands
back the job's fence row and :func:`classify` names the reason — never the
backend, which only reports what the row holds.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from jaren_jobs.errors import JobSettled, LeaseExpired, LeaseLost, LeaseRequired, LeaseSuperseded
from jaren_jobs.records import Lease

__all__ = [
    "FenceRow",
    "Verdict",
    "classify",
    "moved_or_refused",
    "refusal",
    "renewal_refusal",
    "settled_by",
]


@dataclass(frozen=True, slots=True)
class FenceRow:
    """What a job's row says about who may settle it.

    ``settled_generation`` and ``claim_key`` together name the attempt that
    settled the row (``None`` while nobody has): a generation alone repeats
    once a swept id is enqueued again; the claim key (a digest of the
    claim's token) does not.

    ``last_error`` is the row's stored error text, so that a worker whose
    settlement met a row its own attempt had already failed reports that
    failure from the answer alone, without reading the row again. It
    defaults to ``None`` for a backend that does not read it. The token is
    left out of the repr: a fence row in a log must not hand out the lease.
    """

    state: str
    token: str | None = field(repr=False)
    lease_until: int | None
    generation: int
    settled_generation: int | None
    claim_key: bytes | None
    last_error: str | None = None

    @classmethod
    def from_row(cls, row: tuple[Any, ...], last_error: str | None = None) -> FenceRow:
        """From the driver's ``(state, token, until, generation, settled, key)`` tuple.

        ``last_error`` comes as text the backend already decoded.
        """
        state, token, until, generation, settled, key = row
        return cls(
            state=str(state),
            token=token,
            lease_until=None if until is None else int(until),
            generation=int(generation),
            settled_generation=None if settled is None else int(settled),
            claim_key=None if key is None else bytes(key),
            last_error=last_error,
        )


class Verdict(enum.Enum):
    """The two answers of :func:`classify` that are not a refusal."""

    #: the lease is the job's live lease: the guarded write should have matched
    HELD = "held"
    #: this very attempt already settled the job: a repeat is idempotent
    SETTLED_BY_THIS_ATTEMPT = "settled by this attempt"


def classify(row: FenceRow | None, lease: Lease, now_ms: int, what: str) -> Verdict | LeaseLost:
    """Why a fenced write for ``lease`` at ``now_ms`` did (or would) not match ``row``.

    ``None`` for ``row`` is a job that does not exist (never enqueued, or
    swept). The refusal names the job and says what to do; its message
    never holds a token.
    """
    job_id = lease.job_id
    if row is None:
        return JobSettled(
            f"{what} refused: job {job_id!r} is unknown (never enqueued, or swept)",
            job_id=job_id,
            state=None,
        )
    if row.state != "leased":
        if settled_by(row, lease):
            return Verdict.SETTLED_BY_THIS_ATTEMPT
        return JobSettled(
            f"{what} refused: job {job_id!r} is {row.state!r}, not leased — it was settled "
            "or requeued by someone else; this attempt no longer speaks for it",
            job_id=job_id,
            state=row.state,
        )
    if row.token != lease.token:
        return LeaseSuperseded(
            f"{what} refused: the lease on job {job_id!r} was superseded — "
            + _superseded_because(lease, row),
            job_id=job_id,
            generation=lease.generation,
            current_generation=row.generation,
        )
    until = row.lease_until if row.lease_until is not None else now_ms
    if until <= now_ms:
        return LeaseExpired(
            f"{what} refused: the lease on job {job_id!r} expired {now_ms - until} ms "
            "ago — renew() while a handler runs longer than its lease, or claim with a "
            "longer lease_seconds",
            job_id=job_id,
            expired_ms=now_ms - until,
        )
    return Verdict.HELD


def refusal(row: FenceRow | None, lease: Lease, now_ms: int, what: str) -> LeaseLost | None:
    """The refusal for a fenced write that matched nothing; ``None`` when idempotent.

    A row that still shows the lease held (the guard and the row disagree,
    which one transaction rules out) is refused as settled rather than
    answered as a success: never a false ``True``.
    """
    verdict = classify(row, lease, now_ms, what)
    if verdict is Verdict.SETTLED_BY_THIS_ATTEMPT:
        return None
    if verdict is Verdict.HELD:
        return JobSettled(
            f"{what} refused: job {lease.job_id!r} did not accept the settlement",
            job_id=lease.job_id,
        )
    return verdict


def renewal_refusal(row: FenceRow | None, lease: Lease, now_ms: int, what: str) -> LeaseLost:
    """The refusal for a renewal that matched nothing: a settled job is never renewed.

    Where a settlement's repeat is idempotent, a renewal of a job this very
    attempt settled is refused too (``JobSettled``), whoever settled it.
    """
    return refusal(row, lease, now_ms, what) or JobSettled(
        f"{what} refused: job {lease.job_id!r} is already settled (by this attempt)",
        job_id=lease.job_id,
    )


def settled_by(row: FenceRow | None, lease: Lease) -> bool:
    """Whether the attempt ``lease`` belongs to is what settled ``row`` (not leased now)."""
    # this very attempt settled it: the claim that began it, not merely its
    # generation (which repeats after a sweep and reuse); an empty key (a
    # hand-made lease) names no claim
    return (
        row is not None
        and row.state != "leased"
        and row.settled_generation is not None
        and row.settled_generation == lease.generation
        and bool(row.claim_key)
        and row.claim_key == lease.claim_key
    )


def _superseded_because(lease: Lease, row: FenceRow) -> str:
    if row.generation != lease.generation:
        return (
            f"this lease is generation {lease.generation}, the job is on generation "
            f"{row.generation}: another attempt holds it now; stop writing on its behalf"
        )
    if row.claim_key is not None and row.claim_key == lease.claim_key:
        return (
            "a renewal replaced it with a newer lease of the same attempt; use the lease "
            "renew() returned"
        )
    return (
        "this lease is from another attempt of the same generation (the job was swept and "
        "enqueued again under its id since this lease was claimed): another attempt holds "
        "it now; stop writing on its behalf"
    )


def moved_or_refused(
    answer: bool | FenceRow | None,
    job_id: str,
    what: str,
    *,
    unchanged: str,
    leased: str,
    settled: str,
) -> bool:
    """An administrative write's answer: ``True`` moved it, ``False`` it already was
    ``unchanged``; a live lease is :class:`LeaseRequired`, anything else :class:`JobSettled`."""
    if answer is True:
        return True
    state = answer.state if isinstance(answer, FenceRow) else None
    if state is None:
        raise JobSettled(f"{what} refused: job {job_id!r} is unknown", job_id=job_id)
    if state == unchanged:
        return False
    if state == "leased":
        raise LeaseRequired(f"{what} refused: job {job_id!r} {leased}", job_id=job_id)
    raise JobSettled(
        f"{what} refused: job {job_id!r} is {state!r} — {settled}", job_id=job_id, state=state
    )
