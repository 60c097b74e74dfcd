"""Group commit for settlements: concurrent ``complete``/``fail`` calls share one transaction.

Under ``synchronous=FULL`` every commit waits for the disk, so a worker whose
loops each commit their own settlement spends most of its time in fsync.
:class:`SettlementBatcher` lets concurrent settlements share the wait:

* **leader/follower**: a call that arrives while no batch is being written
  leads at once, with only its own settlement (a lone call waits for nobody);
  calls that arrive while a batch is being written queue up, and when that
  batch commits the oldest of them leads the next batch, taking every queued
  settlement with it;
* **each settlement is fenced on its own**: the batch runs the very
  statements a lone call runs, one settlement after another, inside one
  ``BEGIN IMMEDIATE … COMMIT``; a settlement the fence refuses writes nothing
  and gets its own refusal (``JobSettled``, ``LeaseSuperseded``,
  ``LeaseExpired``), never disturbing the others;
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
from collections.abc import Callable
from typing import Any

from .engine import ClaimRequest, Failure, JobEngine
from .errors import LeaseLost
from .records import ClaimedJob, Lease

__all__ = ["Settlement", "SettlementBatcher"]


class Settlement:
    """One queued settlement: what to write, and (once committed) its answer."""

    __slots__ = ("answer", "apply", "changes", "claim", "error", "event", "handed", "lead", "what")

    def __init__(
        self, what: str, apply: Callable[[int], bool], claim: ClaimRequest | None = None
    ) -> None:
        self.what = what
        self.apply = apply  # runs the fenced statements at time `now`; may raise a refusal
        # a worker loop's next job, claimed in the same transaction
        self.claim = claim
        self.handed: ClaimedJob | None = None
        self.answer = False
        self.error: BaseException | None = None
        self.changes = 0  # rows this settlement's statements changed (0: already settled)
        self.event: threading.Event | None = None  # only a queued call waits on one
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
        return self.settle_complete(lease, result).result()

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
        return self.settle_fail(
            lease,
            error,
            retry=retry,
            backoff_base_seconds=backoff_base_seconds,
            backoff_cap_seconds=backoff_cap_seconds,
        ).result()

    def settle_complete(
        self, lease: Lease, result: Any = None, *, claim: ClaimRequest | None = None
    ) -> Settlement:
        """Complete, and return the committed :class:`Settlement` (answer and changes).

        With ``claim``, the same transaction also claims one job for the
        caller (``settlement.handed``, ``None`` when nothing was claimable):
        the next job of a worker loop costs no transaction of its own.
        """
        what = "complete()"
        current, text = self._engine.prepare_complete(lease, result, what)
        engine = self._engine
        return self._submit(
            Settlement(what, lambda now: engine.settle_done(current, text, now, what), claim)
        )

    def settle_fail(
        self,
        lease: Lease,
        error: object,
        *,
        retry: bool = True,
        backoff_base_seconds: float | None = None,
        backoff_cap_seconds: float | None = None,
        claim: ClaimRequest | None = None,
    ) -> Settlement:
        """Fail, and return the committed :class:`Settlement` (see :meth:`settle_complete`)."""
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
        return self._submit(
            Settlement(what, lambda now: engine.settle_fail(failure, now, what), claim)
        )

    # ------------------------------------------------------------ leader / follower

    def _submit(self, item: Settlement) -> Settlement:
        with self._lock:
            follower = self._leading
            if follower:
                item.event = event = threading.Event()
                self._queue.append(item)
            else:
                self._leading = True
        if follower:
            event.wait()
            if not item.lead:
                return item  # a leader committed it
            with self._lock:  # promoted: write everything queued, this call included
                batch, self._queue = self._queue, []
        else:
            batch = [item]
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
                self.settled += len(batch)
            for other in batch:
                if other.event is not None and other is not item:
                    other.event.set()
            if successor is not None and successor.event is not None:
                successor.event.set()
        return item

    def _write(self, batch: list[Settlement]) -> None:
        """One transaction for the batch; on failure, each settlement alone."""
        try:
            self._transaction(batch)
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error = exc
                return
            for item in batch:  # what each would have met alone
                self.retried_alone += 1
                try:
                    self._transaction([item])
                except Exception as alone:
                    item.error = alone
        except BaseException as exc:  # an interrupt: nobody's settlement is known
            for item in batch:
                item.error = exc
            raise

    def _transaction(self, batch: list[Settlement]) -> None:
        engine = self._engine
        connection = engine.db.connection
        runtime = engine.runtime

        def work() -> None:
            wanting: dict[ClaimRequest, list[Settlement]] = {}
            for item in batch:
                item.answer, item.error, item.handed = False, None, None
                before = connection.total_changes
                try:
                    item.answer = item.apply(runtime.now_ms())
                except LeaseLost as refusal:
                    item.error = refusal  # fenced out: it wrote nothing
                item.changes = connection.total_changes - before
                if item.claim is not None:
                    wanting.setdefault(item.claim, []).append(item)
            # one job for each caller that asked: each starts it as soon as it is answered
            for request, items in wanting.items():
                jobs = engine.claim_within(request, len(items), "claim()")
                for item, job in zip(items, jobs, strict=False):  # fewer jobs than asked: None
                    item.handed = job

        engine.scope.write(work, batch[0].what if len(batch) == 1 else "settling (group commit)")
        self.batches += 1
