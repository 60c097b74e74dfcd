"""Group commit for settlements: concurrent ``complete``/``fail`` calls share one transaction.

Under ``synchronous=FULL`` every commit waits for the disk, so a worker whose
loops each commit their own settlement spends most of its time in fsync.
:class:`SettlementBatcher` lets concurrent settlements share the wait:

* **leader/follower**: a call that arrives while no batch is being written
  leads at once, with only its own settlement (a lone call waits for nobody);
  calls that arrive while a batch is being written queue up, and when that
  batch commits the oldest of them leads the next batch, taking every queued
  settlement with it;
* **each settlement is fenced on its own**: inside one ``BEGIN IMMEDIATE …
  COMMIT``, plain completions of distinct jobs go through one multi-row
  statement (``engine.settle_done_many``, the same fence per row) and
  everything else runs the very statements a lone call runs, in queue order;
  a settlement the fence refuses writes nothing and gets its own refusal
  (``JobSettled``, ``LeaseSuperseded``, ``LeaseExpired``), never disturbing
  the others;
* **groups**: :meth:`SettlementBatcher.submit` takes a caller's several
  settlements at once (a worker's batch), plus a carrier that claims the
  caller's next jobs or hands back leases it never started, all in the same
  transaction;
* **durable before answered**: every caller is answered after the commit
  that made its settlement durable. Should the batch fail as a whole (a
  driver error, the store closing), each of its settlements is retried in a
  transaction of its own, so each caller gets exactly the answer a lone call
  would have given.

A settlement's checks (the lease, a result JSON can carry, the error's
description) run in the caller's thread before it queues, as they do for a
lone call, so a ``TypeError`` never reaches the batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from .engine import ClaimRequest, Failure, JobEngine
from .errors import LeaseLost
from .records import ClaimedJob, Lease

__all__ = ["Settlement", "SettlementBatcher"]


class Settlement:
    """One queued settlement: what to write, and (once committed) its answer.

    ``apply`` runs the fenced statements at time ``now`` (it may raise a
    refusal); ``done`` marks a plain completion ``(lease, result text)``,
    which a batch writes with one multi-row statement instead. ``apply`` may
    be ``None``: a carrier for a claim or a release alone.
    """

    __slots__ = (
        "answer",
        "apply",
        "changes",
        "claim",
        "claim_count",
        "done",
        "error",
        "event",
        "handed",
        "job_id",
        "lead",
        "release",
        "what",
    )

    def __init__(
        self,
        what: str,
        apply: Callable[[int], bool] | None,
        claim: ClaimRequest | None = None,
        *,
        claim_count: int = 1,
        done: tuple[Lease, str] | None = None,
        job_id: str | None = None,
        release: Sequence[Lease] = (),
    ) -> None:
        self.what = what
        self.apply = apply
        self.done = done
        self.job_id = job_id  # the job it settles, if any
        # a worker loop's next jobs, claimed in the same transaction
        self.claim = claim
        self.claim_count = claim_count if claim is not None else 0
        self.handed: list[ClaimedJob] = []
        # leases whose attempts never started: handed back in the same transaction
        self.release = release
        self.answer = False
        self.error: BaseException | None = None
        self.changes = 0  # rows this settlement's statements changed (0: already settled)
        self.event: threading.Event | None = None  # only a queued group waits on one
        self.lead = False  # set by the previous leader: this call writes the next batch

    def result(self) -> bool:
        """The answer a lone call would have returned, or its exception raised."""
        if self.error is not None:
            raise self.error
        return self.answer


class SettlementBatcher:
    """Settle leases through ``engine`` (a root-scoped view), group-committing concurrent calls.

    ``complete`` and ``fail`` take the same arguments, refuse the same
    mistakes and answer exactly as ``engine.complete``/``engine.fail`` do.
    """

    def __init__(self, engine: JobEngine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._leading = False
        self._queue: list[Settlement] = []
        self.batches = 0  # transactions written (for tests and the benchmark)
        self.settled = 0  # settlements answered
        self.retried_alone = 0  # settlements re-run alone after their batch failed

    def writing(self) -> bool:
        """True while a batch is being written (a leader holds the lead)."""
        with self._lock:
            return self._leading

    def waiting(self) -> int:
        """How many settlements are queued behind the batch being written now."""
        with self._lock:
            return len(self._queue)

    # ------------------------------------------------------------ the calls

    def complete(self, lease: Lease, result: Any = None) -> bool:
        """As ``store.jobs.complete``: fenced, idempotent for the same attempt."""
        return self.submit([self.completion(lease, result)])[0].result()

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
        return self.submit([item])[0].result()

    # ------------------------------------------------------------ groups

    def completion(self, lease: Lease, result: Any = None) -> Settlement:
        """A checked, unsubmitted completion (``TypeError`` for a result JSON cannot carry)."""
        what = "complete()"
        current, text = self._engine.prepare_complete(lease, result, what)
        engine = self._engine
        return Settlement(
            what,
            lambda now: engine.settle_done(current, text, now, what),
            done=(current, text),
            job_id=current.job_id,
        )

    def failure(
        self,
        lease: Lease,
        error: object,
        *,
        retry: bool = True,
        backoff_base_seconds: float | None = None,
        backoff_cap_seconds: float | None = None,
    ) -> Settlement:
        """A checked, unsubmitted failure (see :meth:`completion`)."""
        what = "fail()"
        failure: Failure = self._engine.prepare_fail(
            lease,
            error,
            retry=retry,
            backoff_base_seconds=backoff_base_seconds,
            backoff_cap_seconds=backoff_cap_seconds,
            what=what,
        )
        engine = self._engine
        return Settlement(
            what, lambda now: engine.settle_fail(failure, now, what), job_id=failure.lease.job_id
        )

    def again(self, item: Settlement) -> Settlement:
        """A fresh, unsubmitted copy of a settlement whose write failed, to submit once more.

        Its checks already passed; the fence runs again when it is written. A
        carrier's claim and release are not copied.
        """
        return Settlement(item.what, item.apply, done=item.done, job_id=item.job_id)

    def submit(self, group: list[Settlement]) -> list[Settlement]:
        """Write ``group`` in one transaction (shared with whatever else is queued).

        Returns once the commit that made every item of the group durable
        has happened; each item then holds its own answer or refusal. The
        group is never split between transactions, except when its batch
        fails as a whole and each item is retried alone.
        """
        if not group:
            return group
        with self._lock:
            follower = self._leading
            if follower:
                group[0].event = event = threading.Event()
                self._queue.extend(group)
            else:
                self._leading = True
        if follower:
            event.wait()
            if not group[0].lead:
                return group  # a leader committed it
            with self._lock:  # promoted: write everything queued, this group included
                batch, self._queue = self._queue, []
        else:
            batch = group
        try:
            self._write(batch)
        finally:
            with self._lock:
                successor = None
                if self._queue:
                    successor = self._queue[0]
                    successor.lead = True
                else:
                    self._leading = False
                self.settled += sum(1 for item in batch if item.apply is not None)
            first = group[0]
            for other in batch:
                if other.event is not None and other is not first:
                    other.event.set()
            if successor is not None and successor.event is not None:
                successor.event.set()
        return group

    # ------------------------------------------------------------ writing

    def _write(self, batch: list[Settlement]) -> None:
        """One transaction for the batch; on failure, each settlement alone."""
        # a failed transaction rolled its claims back: never hand those jobs out
        try:
            self._transaction(batch)
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error, batch[0].handed = exc, []
                return
            for item in batch:  # what each would have met alone
                self.retried_alone += 1
                try:
                    self._transaction([item])
                except Exception as alone:
                    item.error, item.handed = alone, []
        except BaseException as exc:  # an interrupt: nobody's settlement is known
            for item in batch:
                item.error, item.handed = exc, []
            raise

    def _transaction(self, batch: list[Settlement]) -> None:
        engine = self._engine
        connection = engine.db.connection
        runtime = engine.runtime

        def work() -> None:
            for item in batch:
                item.answer, item.error, item.handed = False, None, []
            rest = self._settle_done_together(batch, runtime.now_ms())
            for item in rest:
                if item.apply is None:
                    continue
                before = connection.total_changes
                try:
                    item.answer = item.apply(runtime.now_ms())
                except LeaseLost as refusal:
                    item.error = refusal  # fenced out: it wrote nothing
                item.changes = connection.total_changes - before
            releasing = [lease for item in batch for lease in item.release]
            if releasing:
                engine.release_within(releasing, runtime.now_ms(), "releasing unstarted jobs")
            # the jobs each caller asked for, in its order: each starts them
            # as soon as it is answered
            wanting: dict[ClaimRequest, list[Settlement]] = {}
            for item in batch:
                if item.claim is not None and item.claim_count > 0:
                    wanting.setdefault(item.claim, []).append(item)
            for request, items in wanting.items():
                total = sum(item.claim_count for item in items)
                jobs = engine.claim_within(request, total, "claim()")
                at = 0
                for item in items:
                    item.handed = jobs[at : at + item.claim_count]
                    at += item.claim_count

        engine.scope.write(work, batch[0].what if len(batch) == 1 else "settling (group commit)")
        self.batches += 1

    def _settle_done_together(self, batch: list[Settlement], now: int) -> list[Settlement]:
        """Plain completions in one multi-row call; returns the items still to apply.

        ``settle_done_many`` applies completions naming one job in order
        itself; a job a failure names too is left out, so that its items
        keep their queue order.
        """
        failing = {item.job_id for item in batch if item.done is None and item.job_id}
        dones = [
            item for item in batch if item.done is not None and item.done[0].job_id not in failing
        ]
        if len(dones) < 2:
            return batch
        answers = self._engine.settle_done_many(
            [item.done for item in dones if item.done is not None], now, "complete()"
        )
        for item, answer in zip(dones, answers, strict=True):
            if isinstance(answer, LeaseLost):
                item.error = answer
            else:
                item.answer, item.changes = True, answer
        together = set(map(id, dones))
        return [item for item in batch if id(item) not in together]
