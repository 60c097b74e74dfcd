"""The SQLite session: which statements run, in what order and batched how (see backend.py).

Everything here is dialect: a taken id found by a multi-row INSERT that
inserted fewer rows, a claim that probes ``PRAGMA data_version`` before it
takes the write lock, a guarded write followed by a read of the fence row
when it matched nothing. The engine sees only the answers. The sequences that
run inside a write (claims, fenced settlements, a batch's settlement) are in
``sequences.py``; this module opens the units of work around them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from jaren_jobs.backend import (
    DueRow,
    ErrorRow,
    ForcedAnswer,
    Missed,
    Renewal,
    Scope,
    SettleAnswer,
    StoreBackend,
)
from jaren_jobs.backends.sqlite import listing
from jaren_jobs.backends.sqlite import queries as sql
from jaren_jobs.backends.sqlite.connection import Database
from jaren_jobs.backends.sqlite.pages import page_jobs
from jaren_jobs.backends.sqlite.sequences import IdleClaims, Sequences
from jaren_jobs.core.commands import ClaimRequest, PageFilters, PreparedJob
from jaren_jobs.core.fence import FenceRow, Verdict, classify
from jaren_jobs.core.rows import inserted_job, job_from_row, lease_from_row, stored_text
from jaren_jobs.core.settle import SettleBatch
from jaren_jobs.errors import DuplicateJob, key_held
from jaren_jobs.records import STATES, ClaimedJob, Counts, Job, Lease
from jaren_jobs.runtime import ResolvedRuntime
from jaren_jobs.signals import SignalLike

if TYPE_CHECKING:
    from jaren_jobs.cursor import Cursor

__all__ = ["IdleClaims", "SqliteSession"]

T = TypeVar("T")

_ROW_PARAMS = 8  # the parameters of one row of sql.ENQUEUE / sql.enqueue_rows


class _Skipped(Exception):
    """A row of a batch insert was skipped: its id was taken."""


class SqliteSession:
    """The engine's statements over one scope of one SQLite store."""

    def __init__(
        self,
        db: Database,
        scope: Scope,
        runtime: ResolvedRuntime,
        idle_claims: IdleClaims,
        store_backend: StoreBackend,
    ) -> None:
        # the store hands itself down: a session never builds the level above it
        self._store_backend = store_backend
        self._db = db
        self._scope = scope
        self._runtime = runtime
        self._idle_claims = idle_claims
        self._seq = Sequences(db, runtime, idle_claims, root=scope.root)

    @property
    def db(self) -> Database:
        return self._db

    @property
    def scope(self) -> Scope:
        return self._scope

    @property
    def store_backend(self) -> StoreBackend:
        return self._store_backend

    def rescoped(self, scope: Scope) -> SqliteSession:
        """The same store's statements over another scope (a worker's tracked views)."""
        return SqliteSession(self._db, scope, self._runtime, self._idle_claims, self._store_backend)

    # ------------------------------------------------------------ units of work

    def write(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        return self._scope.write(fn, what, signal)

    def read(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        return self._scope.read(fn, what, signal)

    def after_commit(self, callback: Callable[[], None]) -> None:
        self._scope.after_commit(callback)

    def insert_jobs(
        self, prepared: Sequence[PreparedJob], *, one_by_one: bool, what: str
    ) -> list[Job]:
        now_ms = self._runtime.now_ms
        if len(prepared) == 1:
            job = prepared[0]
            return [self._scope.write(lambda: self._insert(job, now_ms(), what), what)]
        if one_by_one:
            return self._scope.write(lambda: self._insert_each(prepared, now_ms(), what), what)
        ids: list[str] = []  # minted once, by the first write; a replay keeps them
        try:
            return self._scope.write(
                lambda: self._insert_batch(prepared, ids, now_ms(), what), what
            )
        except _Skipped:
            # The write was undone whole (its transaction, or the savepoint of
            # tx.jobs): the batch again, one job at a time, answers exactly what
            # one-by-one inserts answer: DuplicateJob for the first taken id, in order
            named = [p._replace(id=job_id) for job_id, p in zip(ids, prepared, strict=True)]
            return self._scope.write(lambda: self._insert_each(named, now_ms(), what), what)

    def _insert_each(self, prepared: Sequence[PreparedJob], now: int, what: str) -> list[Job]:
        return [self._insert(p, now, what) for p in prepared]

    def get_job(self, job_id: str, what: str) -> Job | None:
        def work() -> tuple[Any, ...] | None:
            params = {"id": job_id, "now": self._runtime.now_ms()}
            return self._db.one(sql.GET_JOB, params, doing=what)

        row = self._scope.read(work, what)
        return None if row is None else job_from_row(row, self._db.text_codec)

    def job_errors(self, job_id: str, what: str) -> list[ErrorRow] | None:
        def work() -> list[ErrorRow] | None:
            if self._db.one(listing.JOB_EXISTS, (job_id,), doing=what) is None:
                return None
            rows = self._db.all(listing.READ_ERRORS, (job_id,), doing=what)
            codec = self._db.text_codec
            return [
                (int(a), int(t), stored_text(e, codec) or "", stored_text(tb, codec))
                for a, t, e, tb in rows
            ]

        return self._scope.read(work, what)

    def count_jobs(self, what: str, queue: str | None = None) -> Counts:
        if queue is not None:
            return self._count_queue(queue, what)

        def work() -> Counts:
            by_state = dict(self._db.all(listing.COUNT_BY_STATE, doing=what))
            leased = self._db.one(listing.COUNT_LEASED, {"now": self._runtime.now_ms()}, doing=what)
            held, gone = (0, 0) if leased is None else (int(leased[0]), int(leased[1] or 0))
            # a marked lease that ran out is cancelled (see sql.MARKED_EXPIRED)
            by_state["leased"] = held - gone
            by_state["cancelled"] = int(by_state.get("cancelled", 0)) + gone
            kinds = dict(self._db.all(listing.COUNT_PENDING_KINDS, doing=what))
            known = {s: int(by_state.get(s, 0)) for s in STATES}
            return Counts(**known, pending_kinds={str(k): int(v) for k, v in kinds.items()})

        return self._scope.read_consistent(work, what)

    def _count_queue(self, queue: str, what: str) -> Counts:
        def work() -> Counts:
            params = {"queue": queue, "now": self._runtime.now_ms()}
            by_state = dict(self._db.all(listing.COUNT_QUEUE_BY_STATE, params, doing=what))
            kinds = dict(
                self._db.all(listing.COUNT_QUEUE_PENDING_KINDS, {"queue": queue}, doing=what)
            )
            known = {s: int(by_state.get(s, 0)) for s in STATES}
            return Counts(**known, pending_kinds={str(k): int(v) for k, v in kinds.items()})

        return self._scope.read_consistent(work, what)

    def live_queues(self, limit: int, what: str) -> list[str]:
        def work() -> list[str]:
            rows = self._db.all(listing.LIVE_QUEUES, {"limit": limit}, doing=what)
            return [str(queue) for (queue,) in rows]

        return self._scope.read(work, what)

    def count_settled(
        self, since: int, until: int, bucket: int, limit: int, what: str
    ) -> list[tuple[str, int, int]]:
        params = {"since": since, "until": until, "bucket": bucket, "limit": limit}

        def work() -> list[tuple[str, int, int]]:
            rows = self._db.all(listing.SETTLED_BUCKETS, params, doing=what)
            return [(str(state), int(index), int(n)) for state, index, n in rows]

        return self._scope.read(work, what)

    def count_due(self, now: int, what: str, queue: str | None = None) -> DueRow:
        params: dict[str, object] = {"now": now}
        if queue is not None:
            params["queue"] = queue
        statement = listing.DUE_COUNTS if queue is None else listing.DUE_COUNTS_QUEUE

        def work() -> DueRow:
            row = self._db.one(statement, params, doing=what)
            if row is None:
                return (0, 0, 0, 0, 0, None)
            pr, ps, fr, fs, expired, oldest = row
            ready = None if oldest is None else int(oldest)
            return (int(pr), int(ps), int(fr), int(fs), int(expired), ready)

        return self._scope.read(work, what)

    def queue_gauges(self, now: int, what: str) -> list[tuple[Any, ...]]:
        def work() -> list[tuple[Any, ...]]:
            return [
                tuple(row) for row in self._db.all(listing.QUEUE_GAUGES, {"now": now}, doing=what)
            ]

        return self._scope.read(work, what)

    def claim(self, request: ClaimRequest, limit: int, what: str) -> list[ClaimedJob]:
        if self._nothing_claimable(request.idle_key, what):
            return []
        return self._scope.write(lambda: self._seq.claim_within(request, limit, what), what)

    def renew(self, lease: Lease, lease_ms: int, what: str) -> Renewal | Missed:
        def work() -> Renewal | Missed:
            now = self._runtime.now_ms()
            params = {
                "until": now + lease_ms,
                "new_token": self._runtime.uuid(),
                "now": now,
                "id": lease.job_id,
                "token": lease.token,
            }
            row = self._db.one(sql.RENEW, params, doing=what)
            if row is not None:
                # the same attempt; the row says whether a forced cancel marked it
                return Renewal(lease_from_row(row, lease.claim_key), row[18] is not None)
            return Missed(self._seq.fence_row_within(lease.job_id, what))

        return self._scope.write(work, what)

    def cancel_queued(
        self, job_id: str, what: str, signal: SignalLike | None
    ) -> bool | FenceRow | None:
        def work() -> bool | FenceRow | None:
            params = {"id": job_id, "now": self._runtime.now_ms()}
            if self._db.changes(sql.CANCEL_QUEUED, params, doing=what):
                return True
            # a marked lease that ran out is cancelled already: the row says so
            self._db.run(sql.MATERIALISE_ONE, params, doing=what)
            return self._seq.fence_row_within(job_id, what)

        return self._scope.write(work, what, signal)

    def cancel_forced(self, job_id: str, what: str, signal: SignalLike | None) -> ForcedAnswer:
        def work() -> ForcedAnswer:
            params = {"id": job_id, "now": self._runtime.now_ms()}
            if self._db.changes(sql.CANCEL_NOW, params, doing=what):
                return "cancelled"
            if self._db.changes(sql.MARK_CANCEL, params, doing=what):
                return "marked"
            self._db.run(sql.MATERIALISE_ONE, params, doing=what)
            return self._seq.fence_row_within(job_id, what)

        return self._scope.write(work, what, signal)

    def cancel_leased(self, lease: Lease, what: str, signal: SignalLike | None) -> bool | Missed:
        def work() -> bool | Missed:
            now = self._runtime.now_ms()
            params = {"id": lease.job_id, "token": lease.token, "now": now}
            if self._db.changes(sql.CANCEL_LEASED, params, doing=what):
                return True
            return Missed(self._seq.fence_row_within(lease.job_id, what))

        return self._scope.write(work, what, signal)

    def requeue(
        self,
        job_id: str,
        *,
        drop_checkpoints: bool,
        reset_attempts: bool = False,
        what: str,
        signal: SignalLike | None,
    ) -> bool | FenceRow | None:
        def drop() -> None:
            # no attempt holds the job now (requeue refuses a live lease), so
            # no attempt's run can be writing these rows
            if drop_checkpoints:
                self._db.run(sql.CHECKPOINT_DROP_RUN, {"run_id": job_id}, doing=what)

        def work() -> bool | FenceRow | None:
            now = self._runtime.now_ms()
            if self._db.changes(
                sql.REQUEUE, {"id": job_id, "now": now, "reset": int(reset_attempts)}, doing=what
            ):
                drop()
                return True
            holder = self._db.one(sql.REQUEUE_KEY_HOLDER, (job_id,), doing=what)
            if holder is not None:
                raise key_held(job_id, str(holder[0]), what)
            row = self._seq.fence_row_within(job_id, what)
            if row is not None and row.state == "pending":
                drop()
            return row

        return self._scope.write(work, what, signal)

    def run_now(self, job_id: str, what: str, signal: SignalLike | None) -> bool | FenceRow | None:
        def work() -> bool | FenceRow | None:
            params = {"id": job_id, "now": self._runtime.now_ms()}
            if self._db.changes(sql.RUN_NOW, params, doing=what):
                return True
            return self._seq.fence_row_within(job_id, what)

        return self._scope.write(work, what, signal)

    def sweep(
        self,
        horizon_ms: int,
        limit: int | None,
        what: str,
        signal: SignalLike | None,
        states: tuple[str, ...] = (),
    ) -> int:
        params: dict[str, object] = {"horizon": horizon_ms}
        if limit is not None:
            params["limit"] = limit
        params.update({f"s{i}": state for i, state in enumerate(states)})
        checkpoints, errors, jobs = listing.sweeps(len(states), limit is not None)

        def work() -> int:
            # marked leases that ran out are cancelled, aged from their expiry
            self._db.run(sql.MATERIALISE_ALL, {"now": self._runtime.now_ms()}, doing=what)
            self._db.run(checkpoints, params, doing=what)
            self._db.run(errors, params, doing=what)
            return self._db.changes(jobs, params, doing=what)

        return self._scope.write(work, what, signal)

    def page(
        self, filters: PageFilters, *, signal: SignalLike | None, deadline: datetime | None
    ) -> Cursor[Job]:
        return page_jobs(
            self._db,
            self._scope,
            self._runtime,
            filters,
            signal=signal,
            deadline=deadline,
        )

    # ------------------------------------------------------------ inserts

    def _insert(self, prepared: PreparedJob, now: int, what: str) -> Job:
        job_id = prepared.id if prepared.id is not None else self._runtime.uuid()
        run_at = prepared.run_at(now)
        # one statement: a taken id, or a unique key an active job holds,
        # inserts nothing (inside the write lock: no other writer can come between)
        params: tuple[Any, ...] = (
            job_id,
            prepared.kind,
            prepared.payload,
            prepared.priority,
            run_at,
            prepared.max_attempts,
            now,
            now,
        )
        if (
            prepared.unique_key is None
            and prepared.queue == "default"
            and prepared.trace_context is None
        ):
            inserted = self._db.changes(sql.ENQUEUE, params, doing=what)
        else:
            params += (prepared.queue, prepared.unique_key, prepared.trace_context)
            inserted = self._db.changes(sql.ENQUEUE_QUEUED, params, doing=what)
        if not inserted:
            if prepared.unique_key is not None and (
                prepared.id is None or self._db.one(sql.ID_EXISTS, (job_id,), doing=what) is None
            ):
                held = self._db.one(sql.GET_KEY_HOLDER, (prepared.unique_key,), doing=what)
                if held is not None:
                    return job_from_row(held, self._db.text_codec)
            raise DuplicateJob(
                f"{what}: a job with id {job_id!r} already exists; ids are unique for a "
                "job's whole life (until it is swept)",
                job_id=job_id,
            )
        return inserted_job(job_id, prepared, run_at, now)

    def _insert_batch(
        self, prepared: Sequence[PreparedJob], ids: list[str], now: int, what: str
    ) -> list[Job]:
        """Insert a batch with multi-row statements (inside the caller's write); all or none.

        ``ids`` is filled with the batch's ids (minted here for the jobs without
        one). No savepoint of its own: one would have SQLite copy every page
        the batch changes into a journal besides the WAL, doubling what a batch
        writes. If any row was skipped (a taken id, or a unique key an active
        job holds), :class:`_Skipped` undoes the caller's whole write instead,
        and :meth:`insert_jobs` replays the batch one job at a time.
        """
        minted = iter(self._runtime.uuids(sum(1 for p in prepared if p.id is None)))
        ids[:] = [next(minted) if p.id is None else p.id for p in prepared]
        run_ats = [p.run_at(now) for p in prepared]
        params: list[Any] = []
        add = params.extend
        queued = any(
            p.unique_key is not None or p.queue != "default" or p.trace_context is not None
            for p in prepared
        )
        width = _ROW_PARAMS + 3 if queued else _ROW_PARAMS
        if queued:
            for job_id, p, run_at in zip(ids, prepared, run_ats, strict=True):
                row = (job_id, p.kind, p.payload, p.priority, run_at, p.max_attempts, now, now)
                add((*row, p.queue, p.unique_key, p.trace_context))
        else:
            for job_id, p, run_at in zip(ids, prepared, run_ats, strict=True):
                add((job_id, p.kind, p.payload, p.priority, run_at, p.max_attempts, now, now))
        db = self._db
        # statements of a few fixed sizes (powers of two), each kept prepared
        size = self._seq.largest_rows(0, width)
        inserted = start = 0
        while start < len(ids):
            while size > len(ids) - start:
                size //= 2
            chunk = params[start * width : (start + size) * width]
            inserted += db.run(sql.enqueue_rows(size, queued), chunk, doing=what).rowcount
            start += size
        if inserted != len(ids):
            raise _Skipped
        return [
            inserted_job(job_id, p, run_at, now)
            for job_id, p, run_at in zip(ids, prepared, run_ats, strict=True)
        ]

    # ------------------------------------------------------------ claims

    def _nothing_claimable(self, kinds: tuple[str, ...], what: str) -> bool:
        # the idle probe: what an empty root claim remembered (Sequences._remember_empty)
        # still holds, so this claim would find nothing too
        if not self._scope.root or kinds not in self._idle_claims:
            return False

        def probe() -> bool:
            known = self._idle_claims.get(kinds)
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
            del self._idle_claims[kinds]
            return False

        return self._scope.read(probe, what)

    # ------------------------------------------------------------ settling a batch

    def settle(self, batch: SettleBatch, what: str) -> SettleAnswer:
        """One batch in one write: a transaction (root) or a savepoint (tx)."""
        now_ms = self._runtime.now_ms
        return self._scope.write(lambda: self._seq.settle_within(batch, now_ms(), what), what)

    def settle_within(self, batch: SettleBatch, now: int, what: str) -> SettleAnswer:
        """:meth:`settle`'s statements inside a write the caller holds (group commit)."""
        return self._seq.settle_within(batch, now, what)

    # ------------------------------------------------------------ checkpoints (SPEC §6)

    def load_checkpoints(self, run_id: str, generation: int, what: str) -> list[tuple[str, str]]:
        """``(node id, value text)`` of the run's rows of generation ≤ ``generation``."""
        params = {"run_id": run_id, "generation": generation}
        rows = self._scope.read(lambda: self._db.all(sql.CHECKPOINT_LOAD, params, doing=what), what)
        return [(str(node_id), text) for node_id, text in rows]

    def save_checkpoint(
        self, lease: Lease, run_id: str, node_id: str, value: str, what: str
    ) -> bool | Missed:
        """Record one node's value under the attempt's fence; ``Missed`` when it no longer holds."""

        def work() -> bool | Missed:
            now = self._runtime.now_ms()
            fenced = {"id": lease.job_id, "token": lease.token, "now": now}
            if self._db.one(sql.CHECKPOINT_FENCE, fenced, doing=what) is None:
                return Missed(self._seq.fence_row_within(lease.job_id, what))
            params = {
                "run_id": run_id,
                "node_id": node_id,
                "value": value,
                "generation": lease.generation,
            }
            self._db.run(sql.CHECKPOINT_SAVE, params, doing=what)
            return True

        return self._scope.write(work, what)

    def complete_run(self, lease: Lease, run_id: str, result: str, what: str) -> bool | Missed:
        """Complete the job and prune the run's rows of generation ≤ the lease's: one write.

        The rows are pruned only when the job ends ``done``: an attempt that
        already settled its job another way (fail, cancel) is answered like
        any repeated settlement, but its checkpoints are what a retry
        resumes from.
        """

        def work() -> bool | Missed:
            now = self._runtime.now_ms()
            answer = self._seq.complete_within(lease, result, now, what)
            if not isinstance(answer, Missed):
                self._prune(run_id, lease.generation, what)
            elif (
                answer.row is not None
                and answer.row.state == "done"
                and classify(answer.row, lease, now, what) is Verdict.SETTLED_BY_THIS_ATTEMPT
            ):
                self._prune(run_id, lease.generation, what)  # its own repeat: prune as then
            return answer

        return self._scope.write(work, what)

    def _prune(self, run_id: str, generation: int, what: str) -> None:
        params = {"run_id": run_id, "generation": generation}
        self._db.run(sql.CHECKPOINT_PRUNE, params, doing=what)
