"""Attempts: what one owns, the context its handler gets, and the errors naming a stop."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from jaren_jobs.core.fence import FenceRow
from jaren_jobs.engine.checkpoints import CheckpointStore
from jaren_jobs.engine.engine import JobEngine
from jaren_jobs.errors import (
    CancelRequested,
    LeaseLost,
    StoreClosed,
)
from jaren_jobs.observe import hooks
from jaren_jobs.records import (
    ClaimedJob,
    Lease,
)
from jaren_jobs.signals import CancelScope, Signal

_log = logging.getLogger("jaren_jobs.worker")


class WorkerStopped(StoreClosed):
    """The worker was stopped: this attempt may no longer reach the database through it.

    Raised by ``ctx.checkpoints`` calls (and by the worker's own settlement)
    once :meth:`Worker.stop` has barred an attempt it could not drain. The
    attempt's lease is left to expire; the job is then re-claimed. It is also
    the ``reason`` of ``ctx.signal`` when the worker stops. A subclass of
    :class:`~jaren_jobs.StoreClosed` (JD2091): the store is closed *to this
    attempt*.
    """


class JobContext:
    """What a handler gets besides the payload: ``handler(payload, ctx)``.

    * ``job``: the :class:`~jaren_jobs.ClaimedJob` (its ``lease`` is the
      claim's; :attr:`lease` follows renewals);
    * ``checkpoints``: the attempt's :class:`~jaren_jobs.CheckpointStore`,
      always using the attempt's *current* lease;
    * ``signal``: aborted when the worker stops, when the job is cancelled
      through ``cancel(id, lease=...)`` or stopped by ``cancel(id,
      force=True)`` (reason :class:`~jaren_jobs.CancelRequested`: raise
      and the job ends cancelled; return and it is done), or when the lease
      is lost — wind up promptly when it fires (``ctx.signal.wait(t)``
      blocks until it does).
    """

    __slots__ = ("_attempt", "_checkpoints", "_engine", "job", "owner", "signal")

    def __init__(self, attempt: Attempt, engine: JobEngine, signal: Signal, owner: str) -> None:
        self._attempt = attempt
        self._engine = engine
        self._checkpoints: CheckpointStore | None = None
        self.job: ClaimedJob = attempt.claimed
        self.signal = signal
        self.owner = owner

    @property
    def checkpoints(self) -> CheckpointStore:
        """The attempt's checkpoint store (built on first use: most handlers never need one)."""
        if self._checkpoints is None:
            self._checkpoints = AttemptCheckpoints(self._engine, self._attempt)
        return self._checkpoints

    @property
    def lease(self) -> Lease:
        """The attempt's current lease (a renewal replaces it)."""
        return self._attempt.lease

    def __repr__(self) -> str:
        return f"<jaren_jobs.JobContext job={self.job.id!r} kind={self.job.kind!r}>"


# what create_worker runs per kind: handler(payload, ctx) -> result
Handler = Callable[[Any, JobContext], Any]


class Attempt:
    """Everything one in-flight attempt owns."""

    __slots__ = (
        "cancel_requested",
        "cancelled",
        "claimed",
        "ended",
        "error",
        "key",
        "lease",
        "lease_lock",
        "lease_seq",
        "lost",
        "lost_row",
        "observed",
        "renew_at",
        "scope",
    )

    def __init__(self, claimed: ClaimedJob, key: int, lease_seq: int) -> None:
        self.claimed = claimed
        self.key = key
        self.lease = claimed.lease
        self.lease_seq = lease_seq  # order of the current lease's issue, for leases()
        # serialises renewals with settlements and checkpoint calls: a call
        # that read the lease just before a renewal committed would otherwise
        # be refused as superseded by its own attempt
        self.lease_lock = threading.Lock()
        self.scope = CancelScope()
        self.cancelled = False
        # cancel(id, force=True) marked the job: the signal aborted, and a
        # failure (or snooze) of this attempt settles it cancelled
        self.cancel_requested = False
        self.lost: LeaseLost | None = None
        # the fence row the renewal that found the lease lost met: how the job
        # ended, should this very attempt have settled it (a handler using its lease)
        self.lost_row: FenceRow | None = None
        self.ended = False  # no renewal once set
        self.renew_at = 0.0  # time.monotonic() when the lease is next renewed
        # what the handler raised (or what failed it instead): its traceback is logged
        self.error: BaseException | None = None
        self.observed: Any = None  # the observers' states (jaren_jobs.observe), if any

    @property
    def job_id(self) -> str:
        return self.claimed.id

    def cancel(self, reason: Any) -> None:
        if isinstance(reason, CancelRequested):
            # cancel(id, force=True): nothing is settled yet; the attempt
            # winds up and settles the job itself (a completion still stands)
            if self.cancel_requested:
                return
            self.cancel_requested = True
            _log.info(
                "jaren_jobs: job %r (kind %r) attempt %d: cancel(id, force=True) asked it "
                "to stop; its signal aborts",
                self.claimed.id,
                self.claimed.kind,
                self.lease.attempt,
            )
            self.scope.abort(reason)
            return
        # the engine's cancel(id, lease=...) committed; this attempt's
        # outcome is a cancellation, whatever its handler does next
        self.cancelled = True
        self.scope.abort(reason)


# an attempt whose handler returned: (attempt, the exception it raised, its result)
Ran = tuple[Attempt, Exception | None, Any]


class Held:
    """A job leased for a loop and not started yet; a cancel with its lease reaches it here."""

    __slots__ = ("abort", "at", "attempt", "cancelled", "forced", "job", "seq")

    def __init__(self, job: ClaimedJob, seq: int, at: float) -> None:
        self.job = job
        self.seq = seq  # order of the lease's issue, for leases()
        self.at = at  # time.monotonic() of the claim
        self.cancelled = False  # cancel(id, lease=...) committed before it started
        self.attempt: Attempt | None = None  # once started
        # cancel(id, force=True) before it started: it starts, and its attempt
        # settles the job cancelled without running the handler
        self.forced: CancelRequested | None = None
        self.abort: Callable[[Any], None] | None = None  # what the hub holds for it


class AttemptCheckpoints(CheckpointStore):
    """``ctx.checkpoints``: the attempt's current lease, never racing a renewal."""

    def __init__(self, engine: JobEngine, attempt: Attempt) -> None:
        super().__init__(
            engine.session,
            engine.runtime.now_ms,
            attempt.job_id,
            lambda: attempt.lease,
            engine.settled_wake,
        )
        self._attempt = attempt

    def load(self, run_id: str) -> dict[str, Any] | None:
        with self._attempt.lease_lock:
            return super().load(run_id)

    def save(self, run_id: str, node_id: str, value: Any) -> None:
        with self._attempt.lease_lock:
            super().save(run_id, node_id, value)
        if self._attempt.observed is not None:  # SPEC §17: DAG nodes as span events
            hooks.checkpoint_saved(self._attempt.observed, self._attempt.claimed, node_id)

    def complete(self, run_id: str, result: Any = None) -> bool:
        with self._attempt.lease_lock:
            return super().complete(run_id, result)


def gone(held: Held | None) -> bool:
    """A held job a cancel with its lease settled: its lease is nothing to hand back."""
    return held is not None and held.cancelled


def stopped_error(owner: str, what: str) -> WorkerStopped:
    """The refusal of a call the stop barred: the attempt may no longer reach the database."""
    return WorkerStopped(
        f"{what}: worker {owner!r} was stopped, and this attempt may no longer reach "
        "the database through it; its lease will expire and the job will be re-claimed",
        owner=owner,
    )


def stopping_reason(owner: str, why: str) -> WorkerStopped:
    """The signal's reason while draining: the attempt may still settle."""
    return WorkerStopped(
        f"worker {owner!r} is stopping ({why}): wind up now; an attempt that "
        "returns within the stop's grace period still settles",
        owner=owner,
    )
