"""Settling a batch: what one backend ``settle`` call writes, and what it answers.

A batch is everything a caller (or group commit, on behalf of many callers)
settles in ONE transaction: completions and failures in the order given,
leases handed back unstarted, and the next claims. A lone ``complete()`` is
a batch of one. The backend answers data per item (``backend.SettleAnswer``:
``True``, written, or ``Missed`` with the fence row) and the caller names
any refusal with :mod:`jaren_jobs.core.fence` at the answer's ``now``.

Snoozes (SPEC §12) are settlements too (:class:`Snoozing`): fenced like a
completion, applied in order with the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from jaren_jobs.core.commands import ClaimRequest, Failure
from jaren_jobs.core.policy import backoff_seconds
from jaren_jobs.records import Lease

__all__ = [
    "Completion",
    "SettleBatch",
    "Settlement",
    "Snoozing",
    "due_at_once",
    "merge",
    "what_of",
]

# the ``what`` of each part's statements (an error names the call it stands for)
COMPLETE = "complete()"
FAIL = "fail()"
SNOOZE = "snooze()"
RELEASE = "releasing unstarted jobs"
CLAIM = "claim()"


class Completion(NamedTuple):
    """A checked completion: the lease, and its result as JSON text."""

    lease: Lease
    result: str


class Snoozing(NamedTuple):
    """A checked snooze: the lease, and how long until the job may run again (ms).

    The backend puts the job back to ``pending`` at ``now + delay_ms`` under
    the fence, gives the claim's attempt back (``attempts - 1``), clears the
    lease and keeps the generation (so the old lease stays refused); the row
    records which attempt settled it, so a repeat of the same attempt is
    idempotent. ``stopping`` marks the worker's stop hand-back (a handler
    that raised because its worker is stopping): the same write.
    """

    lease: Lease
    delay_ms: int
    stopping: bool = False


Settlement = Completion | Failure | Snoozing


def what_of(item: Settlement) -> str:
    """The call a settlement stands for, as its errors name it."""
    if isinstance(item, Completion):
        return COMPLETE
    return SNOOZE if isinstance(item, Snoozing) else FAIL


def due_at_once(item: Settlement) -> bool:
    """Whether a written settlement leaves its job claimable at once: a snooze of no
    delay, a retry with no backoff to speak of (this process's idle workers are woken
    for it; an idle loop does not otherwise claim again before its next poll)."""
    if isinstance(item, Snoozing):
        return item.delay_ms <= 0
    # the longest delay its draw can give, under a millisecond: run_at is now (ms)
    return (
        isinstance(item, Failure)
        and item.retry
        and backoff_seconds(item.lease.attempt, item.base, item.cap, 1.0) < 0.001
    )


@dataclass(frozen=True, slots=True)
class SettleBatch:
    """One transaction's worth of settling.

    ``settlements`` apply as if one after another, in order (items naming
    the same job meet the row the earlier ones left); ``releases`` hand back
    leases whose attempts never started (no attempt spent); ``claims`` lease
    up to ``count`` jobs per request, after everything else.
    """

    settlements: tuple[Settlement, ...] = ()
    releases: tuple[Lease, ...] = ()
    claims: tuple[tuple[ClaimRequest, int], ...] = ()

    def __len__(self) -> int:
        return len(self.settlements) + (1 if self.releases else 0) + len(self.claims)


def merge(batches: Sequence[SettleBatch]) -> tuple[SettleBatch, list[list[tuple[int, int]]]]:
    """One batch for many callers', and where each caller's claims lie in its answer.

    Claims of the same request become one claim of the summed count (one
    batch's own claims too: a worker's loops share one claim statement); the
    second value gives, per batch and per claim of it, ``(index of the
    merged claim, offset of its jobs there)``, or ``(-1, 0)`` for a claim
    of nothing. The jobs come back in claim order, each caller's slice in
    queue order.
    """
    if len(batches) == 1 and len(batches[0].claims) <= 1:
        only = batches[0]
        if not only.claims or only.claims[0][1] > 0:
            return only, [[(0, 0)] if only.claims else []]
    settlements: list[Settlement] = []
    releases: list[Lease] = []
    index: dict[ClaimRequest, int] = {}
    totals: list[tuple[ClaimRequest, int]] = []
    places: list[list[tuple[int, int]]] = []
    for batch in batches:
        settlements.extend(batch.settlements)
        releases.extend(batch.releases)
        mine: list[tuple[int, int]] = []
        for request, count in batch.claims:
            if count <= 0:
                mine.append((-1, 0))
                continue
            at = index.get(request)
            if at is None:
                index[request] = at = len(totals)
                totals.append((request, 0))
            mine.append((at, totals[at][1]))
            totals[at] = (request, totals[at][1] + count)
        places.append(mine)
    merged = SettleBatch(
        settlements=tuple(settlements), releases=tuple(releases), claims=tuple(totals)
    )
    return merged, places
