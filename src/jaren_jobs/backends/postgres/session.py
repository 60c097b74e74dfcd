"""The PostgreSQL session: which statements run, in what order (see backend.py).

Dialect here: a claim locks its rows with ``FOR UPDATE SKIP LOCKED`` (expired
leases rescued in the same statement) and mints one token per row; a fenced
write hands back the job's fence row in the same round trip when it matched
nothing; an enqueue of a job due now sends one ``NOTIFY`` with its commit, which
wakes idle workers in every process (a job not due yet wakes nobody).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from jaren_jobs.backend import (
    ForcedAnswer,
    Missed,
    Renewal,
    Scope,
    SettleAnswer,
    StoreBackend,
)
from jaren_jobs.backends.postgres import queries as sql
from jaren_jobs.backends.postgres.channels import cancel_channel, settled_channel
from jaren_jobs.backends.postgres.connection import PgDatabase
from jaren_jobs.backends.postgres.reads import PgReads
from jaren_jobs.backends.postgres.settling import PgSettling, fence_row_of
from jaren_jobs.core.commands import ClaimRequest, PageFilters, PreparedJob
from jaren_jobs.core.fence import FenceRow, Verdict, classify
from jaren_jobs.core.rows import (
    inserted_job,
    job_from_row,
    lease_from_row,
)
from jaren_jobs.core.settle import SettleBatch
from jaren_jobs.errors import DuplicateJob, StorageError, key_held
from jaren_jobs.records import ClaimedJob, Job, Lease
from jaren_jobs.runtime import ResolvedRuntime
from jaren_jobs.signals import SignalLike

if TYPE_CHECKING:
    from jaren_jobs.cursor import Cursor

__all__ = ["PostgresSession", "cancel_channel", "settled_channel"]


T = TypeVar("T")


_JOB_WIDTH = 19  # the columns of sql.JOB_COLUMNS
_UNIQUE_TRIES = 64  # inserts of one unique-key enqueue before it gives up (each retry means
# another writer took and freed the key meanwhile: progress, not a stall; 8 ran out once
# under a full test run)


def _taken(job_id: str, what: str) -> DuplicateJob:
    return DuplicateJob(
        f"{what}: a job with id {job_id!r} already exists; ids are unique for a "
        "job's whole life (until it is swept)",
        job_id=job_id,
    )


def _row(prepared: PreparedJob, job_id: str, run_at: int, now: int) -> tuple[Any, ...]:
    """One job's values in the order of ENQUEUE's placeholders (no unique key)."""
    return (
        job_id,
        prepared.kind,
        prepared.payload,
        prepared.priority,
        run_at,
        prepared.max_attempts,
        now,
        now,
        prepared.queue,
        None,
        prepared.trace_context,
    )


class PostgresSession(PgReads):
    """The engine's statements over one scope of one PostgreSQL store."""

    def __init__(
        self,
        db: PgDatabase,
        scope: Scope,
        runtime: ResolvedRuntime,
        channel: str | None,
        store_backend: StoreBackend,
    ) -> None:
        # the store hands itself down: a session never builds the level above it
        self._store_backend = store_backend
        self._db = db
        self._scope = scope
        self._runtime = runtime
        self._channel = channel
        self._settled = None if channel is None else settled_channel(channel)
        self._cancel = None if channel is None else cancel_channel(channel)
        self._settling = PgSettling(db, runtime, channel, self._settled)

    @property
    def db(self) -> PgDatabase:
        return self._db

    @property
    def scope(self) -> Scope:
        return self._scope

    @property
    def store_backend(self) -> StoreBackend:
        return self._store_backend

    def rescoped(self, scope: Scope) -> PostgresSession:
        return PostgresSession(self._db, scope, self._runtime, self._channel, self._store_backend)

    # ------------------------------------------------------------ units of work

    def write(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        return self._scope.write(fn, what, signal)

    def read(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        return self._scope.read(fn, what, signal)

    def after_commit(self, callback: Callable[[], None]) -> None:
        self._scope.after_commit(callback)

    # ------------------------------------------------------------ jobs

    def _notify(self, what: str) -> None:
        # sent with the transaction's commit (never before it), once per statement
        if self._channel is not None:
            self._db.run(sql.NOTIFY, {"channel": self._channel}, doing=what)

    def _notify_settled(self, what: str) -> None:
        # a settlement outside the batched path (a queued cancel): wait()ers elsewhere wake
        if self._settled is not None:
            self._db.run(sql.NOTIFY, {"channel": self._settled}, doing=what)

    def _settled_params(self, params: dict[str, Any]) -> dict[str, Any]:
        params["settled"] = self._settled or "jaren_jobs.settled"
        return params

    def insert_jobs(
        self, prepared: Sequence[PreparedJob], *, one_by_one: bool, what: str
    ) -> list[Job]:
        if len(prepared) == 1 and prepared[0].unique_key is None:
            # the insert and its NOTIFY in one statement: at the root, one round trip
            def alone() -> list[Job]:
                return [self._insert_alone(prepared[0], what)]

            return self._scope.write(alone, what)
        ids: list[str] | None = None
        if not one_by_one and len(prepared) > 1:
            minted = iter(self._runtime.uuids(sum(1 for p in prepared if p.id is None)))
            ids = [next(minted) if p.id is None else p.id for p in prepared]
            batch = ids
            try:
                return self._scope.write(lambda: self._insert_batch(prepared, batch, what), what)
            except _Skipped:
                pass  # an id was taken and nothing written: one by one names which

        def work() -> list[Job]:
            now = self._runtime.now_ms()
            if ids is None:
                jobs = [self._insert(p, now, what) for p in prepared]
            else:
                replay = zip(ids, prepared, strict=True)
                jobs = [self._insert(p._replace(id=job_id), now, what) for job_id, p in replay]
            if any(p.run_at(now) <= now for p in prepared):
                self._notify(what)
            return jobs

        return self._scope.write(work, what)

    def _insert_alone(self, prepared: PreparedJob, what: str) -> Job:
        """One job without a unique key, the unit's only statement: inserted with its
        NOTIFY when it is due now. A job not due yet wakes nobody: an idle worker
        could not claim it, and starts it at a poll after its ``run_at`` either way."""
        now = self._runtime.now_ms()
        job_id = prepared.id if prepared.id is not None else self._runtime.uuid()
        run_at = prepared.run_at(now)
        values = _row(prepared, job_id, run_at, now)
        if run_at <= now:
            channel = self._channel or "jaren_jobs"
            notified = self._db.one(sql.ENQUEUE_NOTIFY, (*values, channel), doing=what, final=True)
            inserted = notified is not None
        else:
            inserted = self._db.changes(sql.ENQUEUE, values, doing=what, final=True) == 1
        if not inserted:
            raise _taken(job_id, what)
        return inserted_job(job_id, prepared, run_at, now)

    def _insert(self, prepared: PreparedJob, now: int, what: str) -> Job:
        job_id = prepared.id if prepared.id is not None else self._runtime.uuid()
        run_at = prepared.run_at(now)
        if prepared.unique_key is not None:
            return self._insert_unique(prepared, job_id, run_at, now, what)
        inserted = self._db.changes(
            sql.ENQUEUE,
            _row(prepared, job_id, run_at, now),
            doing=what,
        )
        if not inserted:
            raise _taken(job_id, what)
        return inserted_job(job_id, prepared, run_at, now)

    def _insert_unique(
        self, prepared: PreparedJob, job_id: str, run_at: int, now: int, what: str
    ) -> Job:
        """Insert, or answer the job holding the key: one round trip unless the holder
        committed (or settled) while the insert waited on it."""
        key = prepared.unique_key
        params = {
            "id": job_id,
            "kind": prepared.kind,
            "payload": prepared.payload,
            "priority": prepared.priority,
            "run_at": run_at,
            "max_attempts": prepared.max_attempts,
            "now": now,
            "queue": prepared.queue,
            "key": key,
            "trace": prepared.trace_context,
        }
        # a holder that settles between the insert and the read frees the
        # key: the insert is tried again (a few times: each try is a change
        # another writer made meanwhile)
        for _ in range(_UNIQUE_TRIES):
            row = self._db.one(sql.ENQUEUE_UNIQUE, params, doing=what)
            assert row is not None
            if row[0]:
                return inserted_job(job_id, prepared, run_at, now)
            if row[1]:
                raise _taken(job_id, what)
            if row[2] is not None:
                return job_from_row(row[2 : 2 + _JOB_WIDTH])
            # not in the statement's snapshot: read it in a fresh one
            if self._db.one(sql.ID_EXISTS, (job_id,), doing=what) is not None:
                raise _taken(job_id, what)
            held = self._db.one(sql.GET_KEY_HOLDER, (key,), doing=what)
            if held is not None:
                return job_from_row(held)
        raise StorageError(
            f"{what}: unique_key {key!r} was taken and freed {_UNIQUE_TRIES} times while "
            "this enqueue ran; nothing was written — try again",
            unique_key=key,
        )

    def _insert_batch(
        self, prepared: Sequence[PreparedJob], ids: list[str], what: str
    ) -> list[Job]:
        """The batch and its NOTIFY in one statement, all or nothing; ``_Skipped`` when an
        id was taken (nothing written: the caller replays it one by one, which raises
        exactly what one-by-one inserts raise)."""
        now = self._runtime.now_ms()
        run_ats = [p.run_at(now) for p in prepared]
        params = {
            "count": len(ids),
            "due": any(run_at <= now for run_at in run_ats),
            "channel": self._channel or "jaren_jobs",
            "now": now,
            "ids": ids,
            "kinds": [p.kind for p in prepared],
            "payloads": [p.payload for p in prepared],
            "priorities": [p.priority for p in prepared],
            "run_ats": run_ats,
            "maxes": [p.max_attempts for p in prepared],
            "queues": [p.queue for p in prepared],
            "keys": [p.unique_key for p in prepared],
            "traces": [p.trace_context for p in prepared],
        }

        try:
            self._db.one(sql.ENQUEUE_MANY_NOTIFY, params, doing=what, final=True)
        except StorageError as exc:
            if exc.details.get("sqlstate") == "22P02" and sql.SKIPPED_MARK in exc.message:
                raise _Skipped from None  # the statement failed: the unit undoes it
            raise
        return [
            inserted_job(job_id, p, run_at, now)
            for job_id, p, run_at in zip(ids, prepared, run_ats, strict=True)
        ]

    def get_job(self, job_id: str, what: str) -> Job | None:
        def work() -> tuple[Any, ...] | None:
            params = {"id": job_id, "now": self._runtime.now_ms()}
            return self._db.one(sql.GET_JOB, params, doing=what)

        row = self._scope.read(work, what)
        return None if row is None else job_from_row(row)

    # ------------------------------------------------------------ claims

    def claim(self, request: ClaimRequest, limit: int, what: str) -> list[ClaimedJob]:
        claim = self._settling.claim_within
        return self._scope.write(lambda: claim(request, limit, what, final=True), what)

    def claim_within(self, request: ClaimRequest, limit: int, what: str) -> list[ClaimedJob]:
        return self._settling.claim_within(request, limit, what, final=False)

    # ------------------------------------------------------------ fenced writes

    def _fence_row(self, job_id: str, what: str) -> FenceRow | None:
        row = self._db.one(sql.FENCE_ROW, (job_id,), doing=what)
        return None if row is None else fence_row_of(row)

    def _fenced(
        self, statement: str, params: dict[str, Any], lease: Lease, what: str
    ) -> bool | Missed:
        """A ``sql.fenced`` write: ``True``, or the fence row it met, from the same round trip."""
        row = self._db.one(statement, params, doing=what)
        assert row is not None
        if row[0]:
            return True
        return Missed(fence_row_of(row[1:]))

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
            assert row is not None
            if row[0]:
                fresh = lease_from_row(row[1 : 1 + _JOB_WIDTH], lease.claim_key)
                # the row says whether a forced cancel marked it (its last column)
                return Renewal(fresh, row[_JOB_WIDTH] is not None)
            return Missed(fence_row_of(row[1 + _JOB_WIDTH :]))

        return self._scope.write(work, what)

    def cancel_queued(
        self, job_id: str, what: str, signal: SignalLike | None
    ) -> bool | FenceRow | None:
        def work() -> bool | FenceRow | None:
            params = {"id": job_id, "now": self._runtime.now_ms()}
            if self._db.changes(sql.CANCEL_QUEUED, params, doing=what):
                self._notify_settled(what)
                return True
            # a marked lease that ran out is cancelled already: the row says so
            self._db.run(sql.MATERIALISE_ONE, params, doing=what)
            return self._fence_row(job_id, what)

        return self._scope.write(work, what, signal)

    def cancel_forced(self, job_id: str, what: str, signal: SignalLike | None) -> ForcedAnswer:
        def work() -> ForcedAnswer:
            params = {"id": job_id, "now": self._runtime.now_ms()}
            if self._db.changes(sql.CANCEL_NOW, params, doing=what):
                self._notify_settled(what)
                return "cancelled"
            if self._db.changes(sql.MARK_CANCEL, params, doing=what):
                if self._cancel is not None:
                    notice = {"channel": self._cancel, "id": job_id}
                    self._db.run(sql.NOTIFY_CANCEL, notice, doing=what)
                return "marked"
            self._db.run(sql.MATERIALISE_ONE, params, doing=what)
            return self._fence_row(job_id, what)

        return self._scope.write(work, what, signal)

    def cancel_leased(self, lease: Lease, what: str, signal: SignalLike | None) -> bool | Missed:
        def work() -> bool | Missed:
            now = self._runtime.now_ms()
            params = self._settled_params({"id": lease.job_id, "token": lease.token, "now": now})
            return self._fenced(sql.CANCEL_LEASED, params, lease, what)

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
            if drop_checkpoints:
                self._db.run(sql.CHECKPOINT_DROP_RUN, {"run_id": job_id}, doing=what)

        def work() -> bool | FenceRow | None:
            now = self._runtime.now_ms()

            def move() -> int:
                return self._db.changes(
                    sql.REQUEUE, {"id": job_id, "now": now, "reset": reset_attempts}, doing=what
                )

            # REQUEUE skips a row whose key another job holds, as of its snapshot; a
            # holder enqueued concurrently (committing while the update waits on it)
            # is a unique violation instead. Under a savepoint, so that it aborts
            # nothing: it is then refused like the other case.
            try:
                moved = self._db.savepoint(move, doing=what)
            except StorageError as exc:
                if exc.details.get("sqlstate") != "23505":
                    raise
                moved = 0
            if moved:
                drop()
                self._notify(what)
                return True
            holder = self._db.one(sql.REQUEUE_KEY_HOLDER, (job_id,), doing=what)
            if holder is not None:
                raise key_held(job_id, str(holder[0]), what)
            row = self._fence_row(job_id, what)
            if row is not None and row.state == "pending":
                drop()
            return row

        return self._scope.write(work, what, signal)

    def run_now(self, job_id: str, what: str, signal: SignalLike | None) -> bool | FenceRow | None:
        def work() -> bool | FenceRow | None:
            params = {"id": job_id, "now": self._runtime.now_ms()}
            if self._db.changes(sql.RUN_NOW, params, doing=what):
                self._notify(what)  # workers elsewhere: a job is ready now
                return True
            return self._fence_row(job_id, what)

        return self._scope.write(work, what, signal)

    def sweep(
        self,
        horizon_ms: int,
        limit: int | None,
        what: str,
        signal: SignalLike | None,
        states: tuple[str, ...] = (),
    ) -> int:
        params: dict[str, object] = {"horizon": horizon_ms, "limit": limit}
        params.update({f"s{i}": state for i, state in enumerate(states)})
        statement = sql.sweep_only(len(states))

        def work() -> int:
            # marked leases that ran out are cancelled, aged from their expiry
            self._db.run(sql.MATERIALISE_ALL, {"now": self._runtime.now_ms()}, doing=what)
            row = self._db.one(statement, params, doing=what)
            return 0 if row is None else int(row[0])

        return self._scope.write(work, what, signal)

    def page(
        self, filters: PageFilters, *, signal: SignalLike | None, deadline: datetime | None
    ) -> Cursor[Job]:
        from jaren_jobs.backends.postgres.pages import page_jobs  # noqa: PLC0415 - the cursor module is only needed here

        return page_jobs(
            self._db,
            self._scope,
            self._runtime,
            filters,
            signal=signal,
            deadline=deadline,
        )

    # ------------------------------------------------------------ settling a batch

    def complete_within(
        self, lease: Lease, result: str, now: int, what: str, *, notify: bool = False
    ) -> bool | Missed:
        return self._settling.complete_within(lease, result, now, what, notify=notify)

    def settle(self, batch: SettleBatch, what: str) -> SettleAnswer:
        now_ms = self._runtime.now_ms
        return self._scope.write(lambda: self._settle(batch, now_ms(), what, final=True), what)

    def settle_within(self, batch: SettleBatch, now: int, what: str) -> SettleAnswer:
        return self._settle(batch, now, what, final=False)

    def _settle(self, batch: SettleBatch, now: int, what: str, *, final: bool) -> SettleAnswer:
        """``final``: the batch is its unit of work, so its last statement may commit it."""
        claims = batch.claims
        if final and claims:
            together = self._settling.settle_together(batch, now, what)
            if together is not None:
                return SettleAnswer(together[0], 0, together[1], now)
        settled, released = self._settling.settle_within(
            batch, now, what, final=final and not claims
        )
        last = len(claims) - 1
        claimed = tuple(
            self._settling.claim_within(request, count, what, final=final and index == last)
            for index, (request, count) in enumerate(claims)
        )
        return SettleAnswer(settled, released, claimed, now)

    # ------------------------------------------------------------ checkpoints (SPEC §6)

    def load_checkpoints(self, run_id: str, generation: int, what: str) -> list[tuple[str, str]]:
        params = {"run_id": run_id, "generation": generation}
        rows = self._scope.read(lambda: self._db.all(sql.CHECKPOINT_LOAD, params, doing=what), what)
        return [(str(node_id), str(text)) for node_id, text in rows]

    def save_checkpoint(
        self, lease: Lease, run_id: str, node_id: str, value: str, what: str
    ) -> bool | Missed:
        def work() -> bool | Missed:
            params = {
                "id": lease.job_id,
                "token": lease.token,
                "now": self._runtime.now_ms(),
                "run_id": run_id,
                "node_id": node_id,
                "value": value,
                "generation": lease.generation,
            }
            row = self._db.one(sql.CHECKPOINT_SAVE, params, doing=what)
            assert row is not None
            if row[0]:
                return True
            return Missed(fence_row_of(row[1:]))

        return self._scope.write(work, what)

    def complete_run(self, lease: Lease, run_id: str, result: str, what: str) -> bool | Missed:
        def work() -> bool | Missed:
            now = self._runtime.now_ms()
            answer = self.complete_within(lease, result, now, what, notify=True)
            if not isinstance(answer, Missed) or (
                answer.row is not None
                and answer.row.state == "done"
                and classify(answer.row, lease, now, what) is Verdict.SETTLED_BY_THIS_ATTEMPT
            ):
                self._prune(run_id, lease.generation, what)
            return answer

        return self._scope.write(work, what)

    def _prune(self, run_id: str, generation: int, what: str) -> None:
        params = {"run_id": run_id, "generation": generation}
        self._db.run(sql.CHECKPOINT_PRUNE, params, doing=what)


class _Skipped(Exception):
    """A row of a batch insert was skipped: its id was taken."""
