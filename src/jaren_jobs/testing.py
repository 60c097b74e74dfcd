"""Test helpers over the engine's internal statements (not part of the public API).

The batched statements a worker's settle batch runs, reachable one at a
time from inside a write the caller holds (:func:`write`), so
tests can pin what each does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from jaren_jobs.backend import Missed
from jaren_jobs.core.commands import ClaimRequest
from jaren_jobs.core.fence import refusal
from jaren_jobs.core.settle import Completion, SettleBatch
from jaren_jobs.engine.engine import JobEngine
from jaren_jobs.errors import LeaseLost
from jaren_jobs.jobs import Jobs, engine_of
from jaren_jobs.records import ClaimedJob, Lease

__all__ = [
    "claim_request",
    "claim_within",
    "now_ms",
    "release_within",
    "scope_of",
    "settle_done_many",
    "write",
]


def claim_request(
    jobs: Jobs | JobEngine, kinds: Iterable[str], *, owner: str, lease_seconds: float | None = None
) -> ClaimRequest:
    """Checked claim arguments, as a worker builds them once for its repeated claims."""
    jobs = _engine(jobs)
    return jobs.claim_request(kinds, owner=owner, lease_seconds=lease_seconds)


def claim_within(
    jobs: Jobs | JobEngine, request: ClaimRequest, limit: int, what: str
) -> list[ClaimedJob]:
    """A settle batch's claim alone: up to ``limit`` jobs, in claim order."""
    jobs = _engine(jobs)
    now = jobs.runtime.now_ms()  # the claim reads the clock itself, as a worker's does
    return jobs.settle_within(SettleBatch(claims=((request, limit),)), now, what).claimed[0]


def settle_done_many(
    jobs: Jobs | JobEngine, items: Sequence[tuple[Lease, str]], now: int, what: str
) -> list[int | LeaseLost]:
    """Many completions at once, inside a write, as a settle batch runs them.

    Per item, in input order: ``1`` when this call settled the job, ``0``
    when this same attempt had already settled it (nothing written), or the
    :class:`LeaseLost` a lone ``complete()`` would raise — returned, not
    raised. Items naming the same job act as if applied one after another.
    """
    jobs = _engine(jobs)
    batch = SettleBatch(tuple(Completion(lease, text) for lease, text in items))
    answers: list[int | LeaseLost] = []
    for (lease, _), answer in zip(items, jobs.settle_within(batch, now, what).settled, strict=True):
        if not isinstance(answer, Missed):
            answers.append(1)
            continue
        refused = refusal(answer.row, lease, now, what)
        answers.append(0 if refused is None else refused)
    return answers


def release_within(jobs: Jobs | JobEngine, leases: Sequence[Lease], now: int, what: str) -> int:
    """Hand back leases whose attempts never started (inside a write); how many were held.

    Each job still held by exactly that lease is pending again at once, its
    claim's attempt undone; leases no longer held are skipped.
    """
    jobs = _engine(jobs)
    return jobs.settle_within(SettleBatch(releases=tuple(leases)), now, what).released


T = TypeVar("T")


def _engine(jobs: Jobs | JobEngine) -> JobEngine:
    """``store.jobs`` (a :class:`~jaren_jobs.Jobs`) or an engine view: the engine."""
    return engine_of(jobs) if isinstance(jobs, Jobs) else jobs


def write(jobs: Jobs | JobEngine, fn: Callable[[], T], what: str = "test") -> T:
    """Run ``fn`` inside one write of the engine view's session (its transaction or savepoint)."""
    jobs = _engine(jobs)
    return jobs.session.write(fn, what)


def scope_of(jobs: Jobs | JobEngine) -> Any:
    """The scope (root or transaction) the engine view's session writes through."""
    jobs = _engine(jobs)
    return jobs.session.scope


def now_ms(jobs: Jobs | JobEngine) -> int:
    """The engine view's clock, in epoch milliseconds."""
    jobs = _engine(jobs)
    return jobs.runtime.now_ms()
