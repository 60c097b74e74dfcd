"""Group commit for settlements: concurrent ``complete``/``fail`` calls share one transaction.

Under ``synchronous=FULL`` every commit waits for the disk, so a worker whose
loops each commit their own settlement spends most of its time in fsync.
:class:`SettlementBatcher` lets concurrent settlements share the wait:

* **leader/follower**: a call that arrives while fewer than ``lanes`` batches
  are being written leads at once, with only its own settlement (a lone call
  waits for nobody); calls that arrive while every lane is writing queue up,
  and when a batch commits the oldest of them leads the next batch, taking
  every queued settlement with it. One lane on SQLite (one writer per file);
  a PostgreSQL worker writes on two, so that one batch's statements run on
  the server while the next one gathers (they settle distinct jobs: no two
  lanes wait on each other's rows);
* **one settle call**: the queued callers' batches
  (:class:`~jaren_jobs.core.settle.SettleBatch`) merge into one, written by
  ONE ``settle`` backend call — one transaction — whose answers are split
  back per caller. Inside it each settlement is fenced on its own (the
  backend runs plain completions of distinct jobs as one multi-row
  statement, the same fence per row): a settlement the fence refuses writes
  nothing and gets its own refusal (``JobSettled``, ``LeaseSuperseded``,
  ``LeaseExpired``, named here by ``core.fence``), never disturbing the
  others;
* **batches**: :meth:`SettlementBatcher.submit` takes a caller's whole
  batch — several settlements (a worker's), leases it never started to hand
  back, and claims of its next jobs — all in the same transaction;
* **durable before answered**: every caller is answered after the commit
  that made its settlement durable. Should the batch fail as a whole (a
  driver error, the store closing), each of its parts (a settlement, a
  caller's hand-back, a claim) is retried in a transaction of its own, so
  each caller gets exactly the answer a lone call would have given.

A settlement's checks (the lease, a result JSON can carry, the error's
description) run in the caller's thread before it queues, as they do for a
lone call, so a ``TypeError`` never reaches the batch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from jaren_jobs.backend import Missed
from jaren_jobs.core import fence
from jaren_jobs.core.commands import Failure, prepare_complete
from jaren_jobs.core.fence import FenceRow
from jaren_jobs.core.settle import (
    CLAIM,
    COMPLETE,
    FAIL,
    RELEASE,
    Completion,
    SettleBatch,
    Settlement,
    merge,
    what_of,
)
from jaren_jobs.engine.engine import JobEngine
from jaren_jobs.records import ClaimedJob, Lease

__all__ = ["Settled", "SettlementBatcher"]

_GROUP_COMMIT = "settling (group commit)"


@dataclass(slots=True)
class Settled:
    """One submitted batch's answers, given once the commit that made it durable happened.

    Per settlement (in the batch's order): ``True``, or the refusal or error
    a lone call would have raised; ``wrote`` says whether this batch's
    statements wrote it (``False``: this same attempt had settled it
    already). ``release_error`` is why the hand-back failed (``None``: it
    committed; leases no longer held are skipped). Per claim: the jobs it
    leased, in claim order, or the error that rolled the claim back (its
    jobs are nobody's to run). ``rows``: per settlement, the fence row its
    fenced write met when it wrote nothing (``None``: it wrote, or the write
    failed), so a caller can tell how the job ended without reading it again.
    """

    settled: list[bool | BaseException]
    wrote: list[bool]
    claimed: list[list[ClaimedJob] | BaseException]
    release_error: BaseException | None = None
    rows: list[FenceRow | None] = field(default_factory=list)

    @classmethod
    def failed(cls, batch: SettleBatch, error: BaseException) -> Settled:
        """Every part of ``batch`` met ``error``: nothing of it was written."""
        return cls(
            settled=[error] * len(batch.settlements),
            wrote=[False] * len(batch.settlements),
            claimed=[error] * len(batch.claims),
            release_error=error if batch.releases else None,
            rows=[None] * len(batch.settlements),
        )

    def result(self, index: int = 0) -> bool:
        """The answer a lone call would have returned for settlement ``index``, or its raise."""
        answer = self.settled[index]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def error(self, index: int = 0) -> BaseException | None:
        """Settlement ``index``'s refusal or error; ``None`` when it holds."""
        answer = self.settled[index]
        return answer if isinstance(answer, BaseException) else None

    def row(self, index: int = 0) -> FenceRow | None:
        """The fence row settlement ``index`` met when it wrote nothing; else ``None``."""
        return self.rows[index] if index < len(self.rows) else None

    def jobs(self, index: int = 0) -> list[ClaimedJob]:
        """The jobs claim ``index`` leased (none when its claim failed)."""
        claimed = self.claimed[index]
        return [] if isinstance(claimed, BaseException) else claimed


class _Group:
    """A caller's batch in the queue: what to write, and (once committed) its answers."""

    __slots__ = ("answer", "batch", "event", "lead")

    def __init__(self, batch: SettleBatch) -> None:
        self.batch = batch
        self.answer: Settled | None = None
        self.event: threading.Event | None = None  # only a queued group waits on one
        # set by a leader ending: the queued groups (this one first) this call writes next
        self.lead: list[_Group] | None = None


class SettlementBatcher:
    """Settle leases through ``engine`` (a root-scoped view), group-committing concurrent calls.

    ``complete`` and ``fail`` take the same arguments, refuse the same
    mistakes and answer exactly as ``engine.complete``/``engine.fail`` do.
    At most ``lanes`` batches are written at once, each in its own transaction.
    """

    def __init__(self, engine: JobEngine, lanes: int = 1) -> None:
        if lanes < 1:
            raise ValueError(f"a batcher needs at least one lane, got {lanes}")
        self._engine = engine
        self._lock = threading.Lock()
        self.lanes = lanes
        self._writing = 0  # lanes writing a batch now
        self._queue: list[_Group] = []
        self.batches = 0  # transactions written (for tests and the benchmark)
        self.settled = 0  # settlements answered
        self.retried_alone = 0  # parts re-run alone after their batch failed

    def writing(self) -> bool:
        """True while a batch is being written (a leader holds a lane)."""
        with self._lock:
            return self._writing > 0

    def waiting(self) -> int:
        """How many settlements are queued behind the batch being written now."""
        with self._lock:
            return sum(len(group.batch) for group in self._queue)

    # ------------------------------------------------------------ the calls

    def complete(self, lease: Lease, result: Any = None) -> bool:
        """As ``store.jobs.complete``: fenced, idempotent for the same attempt."""
        return self.submit(SettleBatch((self.completion(lease, result),))).result()

    def fail(
        self,
        lease: Lease,
        error: object,
        *,
        retry: bool = True,
        backoff_base_seconds: float | None = None,
        backoff_cap_seconds: float | None = None,
    ) -> bool:
        """As ``store.jobs.fail``: a jittered retry, or dead-lettered; fenced."""
        item = self.failure(
            lease,
            error,
            retry=retry,
            backoff_base_seconds=backoff_base_seconds,
            backoff_cap_seconds=backoff_cap_seconds,
        )
        return self.submit(SettleBatch((item,))).result()

    # ------------------------------------------------------------ batches

    def completion(self, lease: Lease, result: Any = None) -> Completion:
        """A checked completion (``TypeError`` for a result JSON cannot carry)."""
        current, text = prepare_complete(lease, result, COMPLETE)
        return Completion(current, text)

    def failure(
        self,
        lease: Lease,
        error: object,
        *,
        retry: bool = True,
        backoff_base_seconds: float | None = None,
        backoff_cap_seconds: float | None = None,
    ) -> Failure:
        """A checked failure (see :meth:`completion`); the error is described here, once."""
        return self._engine.prepare_failure(
            lease,
            error,
            retry=retry,
            backoff_base_seconds=backoff_base_seconds,
            backoff_cap_seconds=backoff_cap_seconds,
            what=FAIL,
        )

    def submit(self, batch: SettleBatch) -> Settled:
        """Write ``batch`` in one transaction (shared with whatever else is queued).

        Returns once the commit that made all of it durable has happened,
        with each part's own answer or refusal. The batch is never split
        between transactions, except when the transaction fails as a whole
        and each part is retried alone.
        """
        group = _Group(batch)
        if not len(batch):
            return Settled([], [], [])
        with self._lock:
            follower = self._writing >= self.lanes
            if follower:
                group.event = event = threading.Event()
                self._queue.append(group)
            else:
                self._writing += 1
        if follower:
            event.wait()
            if group.lead is None:
                assert group.answer is not None
                return group.answer  # a leader committed it
            groups = group.lead  # promoted: everything that was queued, this group included
        else:
            groups = [group]
        try:
            self._write(groups)
        finally:
            with self._lock:
                successor = None
                if self._queue:  # the lane passes to the oldest queued call, with the queue
                    successor = self._queue[0]
                    successor.lead, self._queue = self._queue, []
                else:
                    self._writing -= 1
                self.settled += sum(len(g.batch.settlements) for g in groups)
            for other in groups:
                if other.event is not None and other is not group:
                    other.event.set()
            if successor is not None and successor.event is not None:
                successor.event.set()
        assert group.answer is not None
        return group.answer

    # ------------------------------------------------------------ writing

    def _write(self, groups: list[_Group]) -> None:
        """One transaction for the groups; on failure, each part alone."""
        # a failed transaction rolled its claims back: never hand those jobs out
        try:
            self._transaction(groups)
        except Exception as exc:
            if sum(len(g.batch) for g in groups) == 1:
                groups[0].answer = Settled.failed(groups[0].batch, exc)
                return
            for group in groups:  # what each part would have met alone
                group.answer = self._alone(group.batch)
        except BaseException as exc:  # an interrupt: nobody's settlement is known
            for group in groups:
                group.answer = Settled.failed(group.batch, exc)
            raise

    def _alone(self, batch: SettleBatch) -> Settled:
        """Each part of ``batch`` in a transaction of its own."""
        answer = Settled.failed(batch, RuntimeError("not written"))  # every slot is replaced
        for index, item in enumerate(batch.settlements):
            part = self._retry(SettleBatch((item,)))
            answer.settled[index], answer.wrote[index] = part.settled[0], part.wrote[0]
            answer.rows[index] = part.row(0)
        if batch.releases:
            answer.release_error = self._retry(SettleBatch(releases=batch.releases)).release_error
        for index, claim in enumerate(batch.claims):
            answer.claimed[index] = self._retry(SettleBatch(claims=(claim,))).claimed[0]
        return answer

    def _retry(self, part: SettleBatch) -> Settled:
        self.retried_alone += 1
        group = _Group(part)
        try:
            self._transaction([group])
        except Exception as alone:
            return Settled.failed(part, alone)
        assert group.answer is not None
        return group.answer

    def _transaction(self, groups: list[_Group]) -> None:
        merged, places = merge([group.batch for group in groups])
        answer = self._engine.settle(merged, _what(merged))
        self.batches += 1
        now = answer.now
        at = 0
        for group, place in zip(groups, places, strict=True):
            batch = group.batch
            settled: list[bool | BaseException] = []
            wrote: list[bool] = []
            rows: list[FenceRow | None] = []
            for item in batch.settlements:
                got = answer.settled[at]
                at += 1
                if got is True:
                    settled.append(True)
                    wrote.append(True)
                    rows.append(None)
                    continue
                assert isinstance(got, Missed)
                refusal = fence.refusal(got.row, item.lease, now, _of(item))
                settled.append(True if refusal is None else refusal)  # None: idempotent
                wrote.append(False)
                rows.append(got.row)
            claimed: list[list[ClaimedJob] | BaseException] = []
            for (index, offset), (_, count) in zip(place, batch.claims, strict=True):
                jobs = [] if index < 0 else answer.claimed[index][offset : offset + count]
                claimed.append(jobs)
            group.answer = Settled(settled, wrote, claimed, rows=rows)


def _of(item: Settlement) -> str:
    return what_of(item)


def _what(batch: SettleBatch) -> str:
    """The name a batch's statements go by: the lone call it stands for, if it is one."""
    if len(batch) != 1:
        return _GROUP_COMMIT
    if batch.settlements:
        return _of(batch.settlements[0])
    return RELEASE if batch.releases else CLAIM
