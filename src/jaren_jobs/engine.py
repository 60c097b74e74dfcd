"""The fenced job engine: ``store.jobs`` and ``tx.jobs``.

Every settling statement (renew, complete, fail, leased cancel, checkpoint
save) is guarded by the fence — the token one claim minted and a lease still
valid now — never by the owner. Execution is at-least-once; settlement is
exactly-once against the store. A guard that matches nothing is never a
silent ``False``: the row says which refusal applies (JD2065/66/67), except
when the same attempt already settled it, which is idempotent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .backends.sqlite import queries as sql
from .backends.sqlite.connection import Database, RootScope, TxScope
from .codec import (
    EPOCH,
    check_aware,
    check_text,
    datetime_from_ms,
    decode_json,
    ms_from_datetime,
)
from .core import fence
from .core.commands import (
    ClaimRequest,
    Failure,
    PreparedJob,
    check_id,
    check_lease_seconds,
    claim_request,
    prepare_complete,
    prepare_fail,
    prepare_job,
    require_lease,
)
from .core.fence import FenceRow
from .core.policy import backoff_seconds, failure_transition, is_lease_lost, lease_ms, retry_at_ms
from .errors import (
    DuplicateJob,
    JobsError,
    JobSettled,
    LeaseLost,
    LeaseRequired,
)
from .pages import page_jobs
from .records import STATES, ClaimedJob, Counts, Job, Lease, NewJob, assemble
from .rows import claim_key, claimed_from_row, job_from_row, lease_from_row
from .runtime import Defaults, ResolvedRuntime, check_positive_int
from .signals import SignalLike, check_deadline_arg, check_signal_arg, refuse_if_cancelled

if TYPE_CHECKING:
    from .checkpoints import CheckpointStore
    from .cursor import Cursor

__all__ = ["ClaimRequest", "EngineHub", "Failure", "JobEngine", "backoff_seconds", "is_lease_lost"]


@dataclass
class EngineHub:
    """What every engine view of one store shares: clock, defaults, wake-ups, attempts."""

    runtime: ResolvedRuntime
    defaults: Defaults
    wakers: set[Callable[[], None]] = field(default_factory=set)
    # in-flight attempts of THIS process by job id -> abort(reason); the
    # fence guarantees at most one live attempt per job
    local_attempts: dict[str, Callable[[Any], None]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    worker_factory: Callable[..., Any] | None = None
    # live workers of this store, so close() can stop them first
    workers: set[Any] = field(default_factory=set)
    # kinds -> (data_version, total_changes, next due ms) as of the last root
    # claim of those kinds that found nothing; read and written under the gate
    idle_claims: dict[tuple[str, ...], tuple[int, int, int | None]] = field(default_factory=dict)

    def wake(self) -> None:
        with self.lock:
            wakers = list(self.wakers)
        for wake in wakers:
            wake()

    def abort_local(self, job_id: str, reason: Any) -> None:
        with self.lock:
            abort = self.local_attempts.get(job_id)
        if abort is not None:
            abort(reason)


_ROW_PARAMS = 8  # the parameters of one row of sql.ENQUEUE / sql.enqueue_rows


class _Skipped(Exception):
    """A row of a batch insert was skipped: its id was taken."""


class JobEngine:
    """The queue over one store, reached through a scope (root or transaction)."""

    def __init__(self, db: Database, scope: RootScope | TxScope, hub: EngineHub) -> None:
        self._db = db
        self._scope = scope
        self._hub = hub
        self._runtime = hub.runtime
        self._defaults = hub.defaults

    # ------------------------------------------------------------ enqueue

    def _prepare(self, kind: object, payload: Any, **checked: Any) -> PreparedJob:
        return prepare_job(self._defaults, kind, payload, **checked)

    def _claim_args(
        self, kinds: object, owner: object, lease_seconds: object, what: str
    ) -> tuple[tuple[str, ...], str, int]:
        request = claim_request(self._defaults, kinds, owner, lease_seconds, what)
        return request.kinds, request.owner, request.lease_ms

    def _insert(self, prepared: PreparedJob, now: int, what: str) -> Job:
        job_id = prepared.id if prepared.id is not None else self._runtime.uuid()
        run_at = prepared.run_at(now)
        # one statement: a taken id inserts nothing
        inserted = self._db.changes(
            sql.ENQUEUE,
            (
                job_id,
                prepared.kind,
                prepared.payload,
                prepared.priority,
                run_at,
                prepared.max_attempts,
                now,
                now,
            ),
            doing=what,
        )
        if not inserted:
            raise DuplicateJob(
                f"{what}: a job with id {job_id!r} already exists; ids are unique for a "
                "job's whole life (until it is swept)",
                job_id=job_id,
            )
        return _new_job(job_id, prepared, run_at, now, _instant(now))

    def _insert_batch(self, prepared: list[PreparedJob], now: int, what: str) -> list[Job]:
        """Insert a batch with multi-row statements (inside the caller's write); all or none.

        The batch goes in under a savepoint. If any row was skipped (a taken
        id), the savepoint is rolled back and the batch replayed one job at a
        time from the same state, which raises exactly what one-by-one
        inserts raise: :class:`DuplicateJob` for the first taken id, in order.
        """
        minted = iter(self._runtime.uuids(sum(1 for p in prepared if p.id is None)))
        ids = [next(minted) if p.id is None else p.id for p in prepared]
        run_ats = [p.run_at(now) for p in prepared]
        params: list[Any] = []
        add = params.extend
        for job_id, p, run_at in zip(ids, prepared, run_ats, strict=True):
            add((job_id, p.kind, p.payload, p.priority, run_at, p.max_attempts, now, now))
        db = self._db
        # statements of a few fixed sizes (powers of two), each kept prepared
        largest = self._largest_rows(0, _ROW_PARAMS)

        def insert() -> None:
            inserted = start = 0
            size = largest
            while start < len(ids):
                while size > len(ids) - start:
                    size //= 2
                chunk = params[start * _ROW_PARAMS : (start + size) * _ROW_PARAMS]
                inserted += db.run(sql.enqueue_rows(size), chunk, doing=what).rowcount
                start += size
            if inserted != len(ids):
                raise _Skipped

        try:
            db.savepoint(insert, doing=what)
        except _Skipped:
            replay = zip(ids, prepared, strict=True)
            return [self._insert(p._replace(id=job_id), now, what) for job_id, p in replay]
        created = _instant(now)
        return [
            _new_job(job_id, p, run_at, now, created)
            for job_id, p, run_at in zip(ids, prepared, run_ats, strict=True)
        ]

    def enqueue(
        self,
        kind: str,
        payload: Any = None,
        *,
        id: str | None = None,
        run_at: datetime | None = None,
        delay_seconds: float | None = None,
        max_attempts: int | None = None,
        priority: int = 0,
    ) -> Job:
        """Add one job; wakes in-process workers once it is committed.

        Refuses (nothing written): a non-JSON payload (``TypeError`` /
        ``ValueError``), an empty or non-str kind, a bad ``max_attempts``,
        ``priority``, ``run_at`` or ``delay_seconds``, and an id that exists
        (:class:`DuplicateJob`).
        """
        what = "enqueue()"
        prepared = self._prepare(
            kind,
            payload,
            job_id=id,
            run_at=run_at,
            delay_seconds=delay_seconds,
            max_attempts=max_attempts,
            priority=priority,
            what=what,
        )
        now_ms = self._runtime.now_ms
        job = self._scope.write(lambda: self._insert(prepared, now_ms(), what), what)
        self._scope.after_commit(self._hub.wake)
        return job

    def enqueue_many(self, jobs: Iterable[NewJob]) -> list[Job]:
        """Add many jobs in one transaction: all of them, or (on any refusal) none.

        Refuses exactly as :meth:`enqueue` would for each item (naming the
        item), an id named twice in the batch, and an id that exists
        (:class:`DuplicateJob`, for the first such item in order).
        """
        what = "enqueue_many()"
        if isinstance(jobs, (str, bytes, Mapping)):
            raise TypeError(f"{what} takes an iterable of NewJob")
        batch = list(jobs)
        prepared: list[PreparedJob] = []
        prepare = self._prepare
        named = False  # an item with an id came before
        minted_after_named = False  # an item without one followed it
        for index, new in enumerate(batch):
            if not isinstance(new, NewJob):
                raise TypeError(
                    f"{what}: item {index} is a {type(new).__name__}, expected jaren_jobs.NewJob"
                )
            item = prepare(
                new.kind,
                new.payload,
                job_id=new.id,
                run_at=new.run_at,
                delay_seconds=new.delay_seconds,
                max_attempts=new.max_attempts,
                priority=new.priority,
                what=f"{what}: item {index}",
            )
            prepared.append(item)
            if item.id is not None:
                named = True
            elif named:
                minted_after_named = True
        ids = [p.id for p in prepared if p.id is not None]
        if len(ids) != len(set(ids)):
            seen: set[str] = set()
            dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
            raise DuplicateJob(f"{what}: the batch names id {dup!r} twice", job_id=dup)
        if not prepared:
            return []
        now_ms = self._runtime.now_ms

        def work() -> list[Job]:
            now = now_ms()
            if len(prepared) == 1 or minted_after_named:
                # One by one: a taken id stops the batch before any later id
                # is minted, so the runtime's uuid() is drawn exactly as often
                # as one-by-one enqueues would draw it.
                return [self._insert(p, now, what) for p in prepared]
            return self._insert_batch(prepared, now, what)

        created = self._scope.write(work, what)
        self._scope.after_commit(self._hub.wake)
        return created

    # ------------------------------------------------------------ reads

    def get(self, id: str) -> Job | None:
        """The job with this id, or ``None``."""
        if not isinstance(id, str):
            raise TypeError(f"get(): id must be a str, got {type(id).__name__}")
        check_text(id, "get(): id")
        row = self._scope.read(lambda: self._db.one(sql.GET_JOB, (id,), doing="get()"), "get()")
        return None if row is None else job_from_row(row, self._db.text_codec)

    def settled_by(self, lease: Lease) -> Job | None:
        """The job, if the attempt ``lease`` belongs to is what settled it; else ``None``.

        The same rule as a repeated settlement's idempotence: that attempt's
        claim, not merely its generation (which repeats once a swept id is
        enqueued again).
        """
        what = "get()"
        params = {"id": lease.job_id, "generation": lease.generation, "claim_key": lease.claim_key}
        row = self._scope.read(lambda: self._db.one(sql.GET_SETTLED_BY, params, doing=what), what)
        return None if row is None else job_from_row(row, self._db.text_codec)

    def counts(self) -> Counts:
        """Jobs per state, and pending + failed jobs per kind, from one snapshot."""
        what = "counts()"

        def work() -> Counts:
            by_state = dict(self._db.all(sql.COUNT_BY_STATE, doing=what))
            leased = self._db.one(sql.COUNT_LEASED, doing=what)
            by_state["leased"] = 0 if leased is None else leased[0]
            kinds = dict(self._db.all(sql.COUNT_PENDING_KINDS, doing=what))
            known = {s: int(by_state.get(s, 0)) for s in STATES}
            return Counts(**known, pending_kinds={str(k): int(v) for k, v in kinds.items()})

        return self._scope.read_consistent(work, what)

    # ------------------------------------------------------------ claims

    def _claim_params(
        self, kinds: tuple[str, ...], owner: str, lease_ms: int, *, token: bool = True
    ) -> dict[str, Any]:
        now = self._runtime.now_ms()
        params: dict[str, Any] = {"owner": owner, "until": now + lease_ms, "now": now}
        if token:
            params["token"] = minted = self._runtime.uuid()
            params["claim_key"] = claim_key(minted)
        for index, kind in enumerate(kinds):
            params[f"k{index}"] = kind
        return params

    # ------------------------------------------------------------ the idle check
    #
    # An empty root claim records the connection's `PRAGMA data_version`
    # (moves when another connection commits), its total_changes (moves when
    # this connection writes) and the earliest time anything of those kinds
    # can come due without a write (a delayed run_at, a lease expiring). Until
    # one of the three moves, the next claim of those kinds would find nothing
    # too: it answers None without taking the write lock.

    def _nothing_claimable(self, kinds: tuple[str, ...], what: str) -> bool:
        if not isinstance(self._scope, RootScope) or kinds not in self._hub.idle_claims:
            return False

        def probe() -> bool:
            known = self._hub.idle_claims.get(kinds)
            if known is None:
                return False
            row = self._db.one(sql.DATA_VERSION, doing=what)
            version, changes, due = known
            if (
                row is not None
                and int(row[0]) == version
                and self._db.connection.total_changes == changes
                and (due is None or self._runtime.now_ms() < due)
            ):
                return True
            # stale: forget it, so busy claims do not pay for a probe each time
            del self._hub.idle_claims[kinds]
            return False

        return self._scope.read(probe, what)

    def _remember_empty(self, kinds: tuple[str, ...], params: dict[str, Any], what: str) -> None:
        """Inside the empty claim's transaction: when could these kinds next be claimable?"""
        if not isinstance(self._scope, RootScope):
            return
        ready = self._db.one(sql.next_ready_at(len(kinds)), params, doing=what)
        lease = self._db.one(sql.NEXT_LEASE_EXPIRY, doing=what)
        dues = [int(r[0]) for r in (ready, lease) if r is not None and r[0] is not None]
        version = self._db.one(sql.DATA_VERSION, doing=what)
        assert version is not None
        self._hub.idle_claims[kinds] = (
            int(version[0]),
            self._db.connection.total_changes,
            min(dues) if dues else None,
        )

    def claim(
        self, kinds: Iterable[str], *, owner: str, lease_seconds: float | None = None
    ) -> ClaimedJob | None:
        """Lease the next claimable job of these kinds, or ``None``.

        Claimable: pending, failed, or leased with an expired lease (how a
        crashed worker's job is rescued), with ``run_at`` passed; highest
        priority first, then ``run_at``, ``created_at``, ``id``. The claim
        mints the lease: a fresh token, generation + 1, attempts + 1.
        """
        what = "claim()"
        checked, owner_, lease_ms = self._claim_args(kinds, owner, lease_seconds, what)
        statement = sql.claim_next(len(checked))
        if self._nothing_claimable(checked, what):
            return None

        def work() -> ClaimedJob | None:
            params = self._claim_params(checked, owner_, lease_ms)
            row = self._db.one(statement, params, doing=what)
            if row is None:
                self._remember_empty(checked, params, what)
                return None
            return claimed_from_row(row, params["claim_key"], self._db.text_codec)

        return self._scope.write(work, what)

    def claim_many(
        self,
        kinds: Iterable[str],
        *,
        owner: str,
        limit: int,
        lease_seconds: float | None = None,
    ) -> list[ClaimedJob]:
        """Lease up to ``limit`` jobs in one transaction, in claim order."""
        what = "claim_many()"
        checked, owner_, lease_ms = self._claim_args(kinds, owner, lease_seconds, what)
        count = check_positive_int(limit, f"{what}: limit")
        if self._nothing_claimable(checked, what):
            return []
        request = ClaimRequest(checked, owner_, lease_ms)
        return self._scope.write(lambda: self.claim_within(request, count, what), what)

    def claim_request(
        self, kinds: Iterable[str], *, owner: str, lease_seconds: float | None = None
    ) -> ClaimRequest:
        """Checked claim arguments, for :meth:`claim_within` (a worker's repeated claims)."""
        return ClaimRequest(*self._claim_args(kinds, owner, lease_seconds, "claim_many()"))

    def claim_within(self, request: ClaimRequest, limit: int, what: str) -> list[ClaimedJob]:
        """The claim statements alone, for callers already inside a write: up to ``limit``.

        Jobs come back in claim order, each with its own lease (a fresh token
        from the runtime, generation + 1, attempts + 1). Past one job this is
        two statements, not one per job: the candidates in claim order, then
        one update minting every lease (one more per 256 jobs).
        """
        if limit > 1 and sql.MULTI_ROW_UPDATES:
            return self._claim_batch(request, limit, what)
        statement = sql.claim_next(len(request.kinds))
        claimed: list[ClaimedJob] = []
        for _ in range(limit):
            params = self._claim_params(request.kinds, request.owner, request.lease_ms)
            row = self._db.one(statement, params, doing=what)
            if row is None:
                if not claimed:
                    self._remember_empty(request.kinds, params, what)
                break
            claimed.append(claimed_from_row(row, params["claim_key"], self._db.text_codec))
        return claimed

    def _claim_batch(self, request: ClaimRequest, limit: int, what: str) -> list[ClaimedJob]:
        kinds = request.kinds
        params = self._claim_params(kinds, request.owner, request.lease_ms, token=False)
        params["limit"] = limit
        candidates = self._db.all(sql.claim_candidates(len(kinds)), params, doing=what)
        if not candidates:
            self._remember_empty(kinds, params, what)
            return []
        # one fresh token per lease, as many uuid() calls would give
        tokens = self._runtime.uuids(len(candidates))
        keys = {token: claim_key(token) for token in tokens}
        picked = [
            (rowid, token, keys[token])
            for (rowid, _), token in zip(candidates, tokens, strict=True)
        ]
        head = (request.owner, params["until"], params["now"])
        rows: list[tuple[Any, ...]] = []
        for statement, batch in self._batches(sql.claim_rows, head, picked):
            rows += self._db.all(statement, batch, doing=what)
        # RETURNING follows no promised order: put the rows back in claim order
        place = {job_id: index for index, (_, job_id) in enumerate(candidates)}
        rows.sort(key=lambda row: place[row[0]])
        codec = self._db.text_codec
        return [claimed_from_row(row, keys[row[15]], codec) for row in rows]

    # ------------------------------------------------------------ the fence

    def _require_lease(self, lease: object, what: str) -> Lease:
        return require_lease(lease, what)

    def _refusal(self, lease: Lease, now: int, what: str) -> LeaseLost | None:
        """Why a fenced statement matched nothing; ``None`` if this attempt already settled it."""
        row = self._db.one(sql.FENCE_ROW, (lease.job_id,), doing=what)
        return fence.refusal(None if row is None else FenceRow.from_row(row), lease, now, what)

    def _settled_or_raise(self, lease: Lease, now: int, what: str) -> bool:
        refusal = self._refusal(lease, now, what)
        if refusal is not None:
            raise refusal
        return True  # this same attempt already settled it: idempotent

    def renew(self, lease: Lease, *, lease_seconds: float | None = None) -> Lease:
        """A new lease (new token, later expiry, same generation and attempt); fenced."""
        what = "renew()"
        current = self._require_lease(lease, what)
        seconds = check_lease_seconds(self._defaults, lease_seconds, what)

        def work() -> Lease:
            now = self._runtime.now_ms()
            row = self._db.one(
                sql.RENEW,
                {
                    "until": now + lease_ms(seconds),
                    "new_token": self._runtime.uuid(),
                    "now": now,
                    "id": current.job_id,
                    "token": current.token,
                },
                doing=what,
            )
            if row is not None:
                return lease_from_row(row, current.claim_key)  # the same attempt
            refusal = self._refusal(current, now, what)
            # a settled job cannot be renewed, whoever settled it
            raise refusal or JobSettled(
                f"{what} refused: job {current.job_id!r} is already settled (by this attempt)",
                job_id=current.job_id,
            )

        return self._scope.write(work, what)

    def complete(self, lease: Lease, result: Any = None) -> bool:
        """Mark the job done with ``result``; fenced, idempotent for the same attempt.

        A result JSON cannot carry is ``TypeError`` before any write; text in
        it that cannot be encoded (a lone surrogate) is ``ValueError``.
        """
        what = "complete()"
        current, text = self.prepare_complete(lease, result, what)
        return self._scope.write(
            lambda: self.settle_done(current, text, self._runtime.now_ms(), what), what
        )

    def prepare_complete(self, lease: object, result: Any, what: str) -> tuple[Lease, str]:
        """A completion's checks, before any write: the lease, and the result as JSON."""
        return prepare_complete(lease, result, what)

    def fail(
        self,
        lease: Lease,
        error: object,
        *,
        retry: bool = True,
        backoff_base_seconds: float | None = None,
        backoff_cap_seconds: float | None = None,
    ) -> bool:
        """Fail this attempt: retry after a jittered backoff, or dead-letter.

        Dead-letters when ``attempts >= max_attempts`` or ``retry=False``.
        ``last_error`` records a readable description of ``error``.
        """
        what = "fail()"
        failure = self.prepare_fail(
            lease,
            error,
            retry=retry,
            backoff_base_seconds=backoff_base_seconds,
            backoff_cap_seconds=backoff_cap_seconds,
            what=what,
        )
        return self._scope.write(
            lambda: self.settle_fail(failure, self._runtime.now_ms(), what), what
        )

    def prepare_fail(
        self,
        lease: object,
        error: object,
        *,
        retry: object,
        backoff_base_seconds: float | None,
        backoff_cap_seconds: float | None,
        what: str,
    ) -> Failure:
        """A failure's checks, before any write; the error is described here, once."""
        return prepare_fail(
            self._defaults,
            lease,
            error,
            retry=retry,
            backoff_base_seconds=backoff_base_seconds,
            backoff_cap_seconds=backoff_cap_seconds,
            what=what,
        )

    def settle_fail(self, failure: Failure, now: int, what: str) -> bool:
        """The fenced failure statements alone, for callers already inside a write."""
        current = failure.lease
        fenced = {"id": current.job_id, "token": current.token, "now": now}
        row = self._db.one(sql.READ_ATTEMPTS, fenced, doing=what)
        if row is None:
            return self._settled_or_raise(current, now, what)
        attempts, max_attempts = int(row[0]), int(row[1])
        if failure_transition(attempts, max_attempts, retry=failure.retry) == "dead":
            self._db.run(sql.SETTLE_DEAD, {**fenced, "error": failure.message}, doing=what)
        else:
            draw = self._runtime.random()
            run_at = retry_at_ms(now, attempts, failure.base, failure.cap, draw)
            self._db.run(
                sql.SETTLE_RETRY,
                {**fenced, "error": failure.message, "run_at": run_at},
                doing=what,
            )
        return True

    # ------------------------------------------------------------ administration

    def cancel(
        self,
        id: str,
        *,
        lease: Lease | None = None,
        signal: SignalLike | None = None,
        deadline: datetime | None = None,
    ) -> bool:
        """Cancel a job.

        Queued (pending/failed): cancelled in one write, no lease needed.
        Claimed: needs the current lease (:class:`LeaseRequired` otherwise,
        even when that lease has expired) and is fenced; an in-flight attempt
        of this process is aborted through its signal. ``True`` when this
        call cancelled it; ``False`` when it already was cancelled, or the
        lease's own attempt already settled it. Unknown or settled:
        :class:`JobSettled`.
        """
        what = "cancel()"
        job_id = check_id(id, f"{what}: id")
        current = None if lease is None else self._require_lease(lease, what)
        if current is not None and current.job_id != job_id:
            raise LeaseRequired(
                f"{what}: the lease given belongs to job {current.job_id!r}, not {job_id!r}; "
                "pass the lease of the job being cancelled",
                job_id=job_id,
                lease_job_id=current.job_id,
            )
        sig = check_signal_arg(signal, what)
        dl = check_deadline_arg(deadline, what)
        refuse_if_cancelled(sig, dl, self._runtime.now(), what)

        def queued() -> bool:
            now = self._runtime.now_ms()
            if self._db.changes(sql.CANCEL_QUEUED, {"id": job_id, "now": now}, doing=what):
                return True
            row = self._db.one(sql.FENCE_ROW, (job_id,), doing=what)
            if row is None:
                raise JobSettled(f"{what} refused: job {job_id!r} is unknown", job_id=job_id)
            state = row[0]
            if state == "cancelled":
                return False
            if state == "leased":
                raise LeaseRequired(
                    f"{what} refused: job {job_id!r} is claimed — cancelling a claimed job "
                    "takes the lease its attempt holds (cancel(id, lease=...)), so no "
                    "stranger settles another's work; or wait for it to settle",
                    job_id=job_id,
                )
            raise JobSettled(
                f"{what} refused: job {job_id!r} is {state!r}, already settled",
                job_id=job_id,
                state=state,
            )

        if current is None:
            return self._scope.write(queued, what, sig)
        holder = current

        def leased() -> bool:
            now = self._runtime.now_ms()
            params = {"id": job_id, "token": holder.token, "now": now}
            if self._db.changes(sql.CANCEL_LEASED, params, doing=what):
                return True
            self._settled_or_raise(holder, now, what)
            return False  # this attempt already settled it

        cancelled = self._scope.write(leased, what, sig)
        if cancelled:
            reason = JobSettled(
                f"job {job_id!r} was cancelled; this attempt no longer speaks for it",
                job_id=job_id,
                cancelled=True,
            )
            self._scope.after_commit(lambda: self._hub.abort_local(job_id, reason))
        return cancelled

    def requeue(
        self,
        id: str,
        *,
        signal: SignalLike | None = None,
        deadline: datetime | None = None,
        drop_checkpoints: bool = False,
    ) -> bool:
        """Return a failed, dead, cancelled or lease-expired job to pending, now.

        Attempt history is kept. A live lease is :class:`LeaseRequired`
        (requeue is not a steal); done or unknown is :class:`JobSettled`;
        ``False`` when it already is pending. ``drop_checkpoints=True`` also
        deletes the job's checkpoints in the same transaction (a pending
        job's too), so a DAG run starts over instead of resuming: the way out
        of a ``RunMismatch``. A refusal deletes nothing.
        """
        what = "requeue()"
        job_id = check_id(id, f"{what}: id")
        if not isinstance(drop_checkpoints, bool):
            raise TypeError(
                f"{what}: drop_checkpoints must be a bool, got {type(drop_checkpoints).__name__}"
            )
        sig = check_signal_arg(signal, what)
        dl = check_deadline_arg(deadline, what)
        refuse_if_cancelled(sig, dl, self._runtime.now(), what)

        def drop() -> None:
            # no attempt holds the job now (requeue refuses a live lease), so
            # no attempt's run can be writing these rows
            if drop_checkpoints:
                self._db.run(sql.CHECKPOINT_DROP_RUN, {"run_id": job_id}, doing=what)

        def work() -> bool:
            now = self._runtime.now_ms()
            if self._db.changes(sql.REQUEUE, {"id": job_id, "now": now}, doing=what):
                drop()
                return True
            row = self._db.one(sql.FENCE_ROW, (job_id,), doing=what)
            if row is None:
                raise JobSettled(f"{what} refused: job {job_id!r} is unknown", job_id=job_id)
            state = row[0]
            if state == "pending":
                drop()
                return False
            if state == "leased":
                raise LeaseRequired(
                    f"{what} refused: job {job_id!r} holds a live lease — requeue is not a "
                    "steal; cancel the attempt with its lease, or wait for the lease to expire",
                    job_id=job_id,
                )
            raise JobSettled(
                f"{what} refused: job {job_id!r} is {state!r} — a completed job is not re-run; "
                "enqueue new work under a new id",
                job_id=job_id,
                state=state,
            )

        moved = self._scope.write(work, what, sig)
        if moved:
            self._scope.after_commit(self._hub.wake)
        return moved

    def sweep(
        self,
        *,
        settled_before: datetime,
        limit: int | None = None,
        signal: SignalLike | None = None,
        deadline: datetime | None = None,
    ) -> int:
        """Delete settled jobs last changed before the horizon, oldest first, with checkpoints.

        One transaction; returns how many jobs were deleted.
        """
        what = "sweep()"
        horizon = ms_from_datetime(check_aware(settled_before, f"{what}: settled_before"))
        bound = -1 if limit is None else check_positive_int(limit, f"{what}: limit")
        sig = check_signal_arg(signal, what)
        dl = check_deadline_arg(deadline, what)
        refuse_if_cancelled(sig, dl, self._runtime.now(), what)
        params = {"horizon": horizon, "limit": bound}

        def work() -> int:
            self._db.run(sql.SWEEP_CHECKPOINTS, params, doing=what)
            return self._db.changes(sql.SWEEP_JOBS, params, doing=what)

        return self._scope.write(work, what, sig)

    # ------------------------------------------------------------ surfaces built elsewhere

    def page(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        after: str | None = None,
        limit: int = 100,
        signal: SignalLike | None = None,
        deadline: datetime | None = None,
    ) -> Cursor[Job]:
        """A keyset cursor over jobs by id (see :mod:`jaren_jobs.cursor`)."""
        return page_jobs(
            self._db,
            self._scope,
            self._runtime,
            state=state,
            kind=kind,
            after=after,
            limit=limit,
            signal=signal,
            deadline=deadline,
        )

    def checkpoints_for(self, claimed: ClaimedJob) -> CheckpointStore:
        """The checkpoint store bound to this claimed attempt (SPEC §6)."""
        from .checkpoints import CheckpointStore  # noqa: PLC0415 - built on this engine

        if not isinstance(claimed, ClaimedJob):
            raise LeaseRequired(
                "checkpoints_for() takes the ClaimedJob a claim returned (it carries the lease), "
                f"got {type(claimed).__name__}",
                given=type(claimed).__name__,
            )
        return CheckpointStore(self, claimed.id, lambda: claimed.lease)

    def create_worker(self, handlers: Mapping[str, Callable[..., Any]], **options: Any) -> Any:
        """A worker running ``handlers`` over this store (SPEC §7)."""
        factory = self._hub.worker_factory
        if factory is None:
            raise JobsError("this store has no worker support")  # pragma: no cover
        return factory(handlers, **options)

    # ------------------------------------------------------------ internals for checkpoints

    @property
    def db(self) -> Database:
        return self._db

    @property
    def scope(self) -> RootScope | TxScope:
        return self._scope

    @property
    def runtime(self) -> ResolvedRuntime:
        return self._runtime

    def refusal(self, lease: Lease, now: int, what: str) -> LeaseLost | None:
        return self._refusal(lease, now, what)

    def settle_done(self, lease: Lease, text: str, now: int, what: str) -> bool:
        """The completion statement alone, for callers already inside a write."""
        answer = self._settle_one(lease, text, now, what)
        if isinstance(answer, LeaseLost):
            raise answer
        return True  # written, or already settled by this same attempt

    def settle_done_many(
        self, items: Sequence[tuple[Lease, str]], now: int, what: str
    ) -> list[int | LeaseLost]:
        """Many completions at once, for callers already inside a write.

        Each item is a lease and its result as JSON text (from
        :meth:`prepare_complete`). Per item, in input order: ``1`` when this
        call settled the job (exactly what :meth:`settle_done` writes), ``0``
        when this same attempt had already settled it (nothing written), or
        the :class:`LeaseLost` a lone ``complete()`` would raise — returned,
        not raised. Items naming the same job act as if applied one after
        another. From four jobs up, one statement settles every fenced item
        and only the rest are read back, one by one, to say why.
        """
        answers: list[int | LeaseLost] = [0] * len(items)
        first: dict[str, int] = {}  # job id -> index of its first item
        repeats: list[int] = []
        for index, (lease, _) in enumerate(items):
            if lease.job_id in first:
                repeats.append(index)
            else:
                first[lease.job_id] = index
        if len(first) >= sql.SETTLE_MANY_MIN and sql.MULTI_ROW_UPDATES:
            firsts = [items[index] for index in first.values()]
            fenced = [(lease.job_id, lease.token, text) for lease, text in firsts]
            settled: set[str] = set()
            for statement, batch in self._batches(sql.settle_done_rows, (now,), fenced):
                settled.update(row[0] for row in self._db.all(statement, batch, doing=what))
            for job_id, index in first.items():
                if job_id in settled:
                    answers[index] = 1
                else:
                    refusal = self._refusal(items[index][0], now, what)
                    answers[index] = 0 if refusal is None else refusal
        else:
            repeats = list(range(len(items)))  # one by one, in input order
        # a repeat meets the row its earlier items left: strictly after them
        for index in repeats:
            lease, text = items[index]
            answers[index] = self._settle_one(lease, text, now, what)
        return answers

    def _batches(
        self,
        statement: Callable[[int], str],
        head: tuple[Any, ...],
        rows: Sequence[tuple[Any, ...]],
    ) -> Iterator[tuple[str, list[Any]]]:
        """A batched statement (``sql.*_rows``) and its parameters, per chunk of ``rows``.

        Chunks fill the largest statement size the connection's parameter
        limit allows; the last is padded with NULL rows up to its size.
        """
        width = len(rows[0])
        largest = self._largest_rows(len(head), width)
        for start in range(0, len(rows), largest):
            chunk = rows[start : start + largest]
            size = sql.batch_size(len(chunk))
            params = list(head)
            for row in chunk:
                params += row
            params += [None] * ((size - len(chunk)) * width)
            yield statement(size), params

    def _largest_rows(self, head: int, width: int) -> int:
        """The most rows (a power of two, at most ``sql.BATCH_ROWS``) one statement may bind.

        ``head`` parameters come first, then ``width`` per row, within the
        connection's parameter limit.
        """
        largest = sql.BATCH_ROWS
        while largest > 1 and head + largest * width > self._db.max_variables:
            largest //= 2
        return largest

    def _settle_one(self, lease: Lease, text: str, now: int, what: str) -> int | LeaseLost:
        params = {"result": text, "now": now, "id": lease.job_id, "token": lease.token}
        if self._db.changes(sql.SETTLE_DONE, params, doing=what):
            return 1
        refusal = self._refusal(lease, now, what)
        return 0 if refusal is None else refusal

    def release_within(self, leases: Sequence[Lease], now: int, what: str) -> int:
        """Hand back leases whose attempts never started, for callers already inside a write.

        Each job still held by exactly that lease (leased, same token, not
        expired at ``now``) is pending again at once: its lease cleared, the
        claim's attempt undone (``attempts - 1``), ``run_at`` and the
        generation kept, so the released lease stays superseded and settles
        nothing. Leases no longer held are skipped. Returns how many jobs
        were released. Waking workers after the commit is the caller's call.
        """
        held = list(dict.fromkeys((lease.job_id, lease.token) for lease in leases))
        released = 0
        if len(held) >= sql.SETTLE_MANY_MIN and sql.MULTI_ROW_UPDATES:
            for statement, batch in self._batches(sql.release_rows, (now,), held):
                released += self._db.changes(statement, batch, doing=what)
            return released
        for job_id, token in held:
            params = {"id": job_id, "token": token, "now": now}
            released += self._db.changes(sql.RELEASE_LEASE, params, doing=what)
        return released


def _instant(ms: int) -> datetime:
    # one instant remembered (calls a few hundred microseconds apart share
    # their ms), as one tuple: a thread never sees one call's ms with another's time
    last_ms, last = _LAST_INSTANT[0]
    if last_ms == ms:
        return last
    moment = datetime_from_ms(ms)
    assert moment is not None
    _LAST_INSTANT[0] = (ms, moment)
    return moment


_LAST_INSTANT: list[tuple[int, datetime]] = [(0, EPOCH)]


def _new_job(job_id: str, prepared: PreparedJob, run_at: int, now: int, created: datetime) -> Job:
    """The record of a row just inserted at ``now``: exactly what was bound, never read back."""
    return assemble(
        Job,
        {
            "id": job_id,
            "kind": prepared.kind,
            "payload": decode_json(prepared.payload),
            "state": "pending",
            "priority": prepared.priority,
            "attempts": 0,
            "max_attempts": prepared.max_attempts,
            "run_at": created if run_at == now else _instant(run_at),
            "lease_until": None,
            "lease_owner": None,
            "lease_generation": 0,
            "last_error": None,
            "result": None,
            "created_at": created,
            "updated_at": created,
        },
    )
