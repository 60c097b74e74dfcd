"""The PostgreSQL session: which statements run, in what order (see backend.py).

Dialect here: a claim locks its rows with ``FOR UPDATE SKIP LOCKED`` (expired
leases rescued in the same statement) and mints one token per row; a fenced
write hands back the job's fence row in the same round trip when it matched
nothing; an enqueue sends one ``NOTIFY`` with its commit, which wakes idle
workers in every process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from jaren_jobs.backend import ErrorRow, Missed, Scope, SettleAnswer, StoreBackend
from jaren_jobs.core.commands import ClaimRequest, Failure, PageFilters, PreparedJob
from jaren_jobs.core.fence import FenceRow, Verdict, classify
from jaren_jobs.core.policy import failure_transition, retry_at_ms
from jaren_jobs.core.settle import Completion, SettleBatch, Snoozing
from jaren_jobs.errors import DuplicateJob, StorageError, key_held
from jaren_jobs.records import STATES, ClaimedJob, Counts, Job, Lease
from jaren_jobs.rows import claim_key, claimed_from_row, inserted_job, job_from_row, lease_from_row
from jaren_jobs.runtime import ResolvedRuntime
from jaren_jobs.signals import SignalLike

from . import queries as sql
from .connection import PgDatabase

if TYPE_CHECKING:
    from jaren_jobs.cursor import Cursor

__all__ = ["PostgresSession", "settled_channel"]


def settled_channel(channel: str) -> str:
    """The channel a settlement's NOTIFY goes to (``wait()`` listens), beside the enqueue one.

    Its own channel, so that settlements never wake idle workers to claim.
    """
    name = f"{channel}.settled"
    return name if len(name.encode()) <= 63 else f"{channel[:54]}.settled"


T = TypeVar("T")


def _fence_row(values: Sequence[Any]) -> FenceRow | None:
    """``(state, token, until, generation, settled, key, last_error)``, or None (no job)."""
    if values[0] is None:
        return None
    return FenceRow.from_row(tuple(values[:6]), None if values[6] is None else str(values[6]))


_JOB_WIDTH = 18  # the columns of sql.JOB_COLUMNS
_UNIQUE_TRIES = 8  # inserts of one unique-key enqueue before it gives up


def _taken(job_id: str, what: str) -> DuplicateJob:
    return DuplicateJob(
        f"{what}: a job with id {job_id!r} already exists; ids are unique for a "
        "job's whole life (until it is swept)",
        job_id=job_id,
    )


def _holds(fence: FenceRow | None, token: str, now: int) -> bool:
    """Whether the fence row shows ``token``'s lease live at ``now``."""
    return (
        fence is not None
        and fence.state == "leased"
        and fence.token == token
        and fence.lease_until is not None
        and fence.lease_until > now
    )


def _pg_text(text: str) -> str:
    # PostgreSQL's text cannot hold NUL: kept as its escape, as lone surrogates are
    return text.replace("\x00", "\\x00") if "\x00" in text else text


class PostgresSession:
    """The engine's statements over one scope of one PostgreSQL store."""

    def __init__(
        self, db: PgDatabase, scope: Scope, runtime: ResolvedRuntime, channel: str | None
    ) -> None:
        self._db = db
        self._scope = scope
        self._runtime = runtime
        self._channel = channel
        self._settled = None if channel is None else settled_channel(channel)

    @property
    def db(self) -> PgDatabase:
        return self._db

    @property
    def scope(self) -> Scope:
        return self._scope

    @property
    def store_backend(self) -> StoreBackend:
        from .store import PostgresBackend  # noqa: PLC0415 - the store level sits above sessions

        return PostgresBackend(self._db, self._channel)

    def rescoped(self, scope: Scope) -> PostgresSession:
        return PostgresSession(self._db, scope, self._runtime, self._channel)

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
        def work() -> list[Job]:
            now = self._runtime.now_ms()
            if len(prepared) == 1 or one_by_one:
                jobs = [self._insert(p, now, what) for p in prepared]
            else:
                jobs = self._insert_batch(prepared, now, what)
            self._notify(what)
            return jobs

        return self._scope.write(work, what)

    def _insert(self, prepared: PreparedJob, now: int, what: str) -> Job:
        job_id = prepared.id if prepared.id is not None else self._runtime.uuid()
        run_at = prepared.run_at(now)
        if prepared.unique_key is not None:
            return self._insert_unique(prepared, job_id, run_at, now, what)
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
                prepared.queue,
                None,
            ),
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

    def _insert_batch(self, prepared: Sequence[PreparedJob], now: int, what: str) -> list[Job]:
        """One statement for the batch, under a savepoint; a taken id replays it one by
        one, which raises exactly what one-by-one inserts raise."""
        minted = iter(self._runtime.uuids(sum(1 for p in prepared if p.id is None)))
        ids = [next(minted) if p.id is None else p.id for p in prepared]
        run_ats = [p.run_at(now) for p in prepared]
        params = {
            "now": now,
            "ids": ids,
            "kinds": [p.kind for p in prepared],
            "payloads": [p.payload for p in prepared],
            "priorities": [p.priority for p in prepared],
            "run_ats": run_ats,
            "maxes": [p.max_attempts for p in prepared],
            "queues": [p.queue for p in prepared],
            "keys": [p.unique_key for p in prepared],
        }

        def insert() -> None:
            if self._db.changes(sql.ENQUEUE_MANY, params, doing=what) != len(ids):
                raise _Skipped  # an id was taken: the savepoint undoes the batch

        try:
            self._db.savepoint(insert, doing=what)
        except _Skipped:
            replay = zip(ids, prepared, strict=True)
            return [self._insert(p._replace(id=job_id), now, what) for job_id, p in replay]
        return [
            inserted_job(job_id, p, run_at, now)
            for job_id, p, run_at in zip(ids, prepared, run_ats, strict=True)
        ]

    def get_job(self, job_id: str, what: str) -> Job | None:
        row = self._scope.read(lambda: self._db.one(sql.GET_JOB, (job_id,), doing=what), what)
        return None if row is None else job_from_row(row)

    def job_errors(self, job_id: str, what: str) -> list[ErrorRow] | None:
        def work() -> list[ErrorRow] | None:
            if self._db.one(sql.JOB_EXISTS, (job_id,), doing=what) is None:
                return None
            rows = self._db.all(sql.READ_ERRORS, (job_id,), doing=what)
            return [
                (int(a), int(t), str(e), None if tb is None else str(tb)) for a, t, e, tb in rows
            ]

        return self._scope.read(work, what)

    def count_jobs(self, what: str, queue: str | None = None) -> Counts:
        if queue is not None:
            return self._count_queue(queue, what)

        def work() -> Counts:
            by_state = {str(s): int(n) for s, n in self._db.all(sql.COUNT_BY_STATE, doing=what)}
            kinds = self._db.all(sql.COUNT_PENDING_KINDS, doing=what)
            known = {s: by_state.get(s, 0) for s in STATES}
            return Counts(**known, pending_kinds={str(k): int(v) for k, v in kinds})

        return self._scope.read_consistent(work, what)

    def _count_queue(self, queue: str, what: str) -> Counts:
        def work() -> Counts:
            rows = self._db.all(sql.COUNT_QUEUE_BY_STATE, (queue,), doing=what)
            by_state = {str(s): int(n) for s, n in rows}
            kinds = self._db.all(sql.COUNT_QUEUE_PENDING_KINDS, (queue,), doing=what)
            known = {s: by_state.get(s, 0) for s in STATES}
            return Counts(**known, pending_kinds={str(k): int(v) for k, v in kinds})

        return self._scope.read_consistent(work, what)

    def count_due(self, now: int, what: str, queue: str | None = None) -> tuple[int, ...]:
        params: dict[str, object] = {"now": now}
        if queue is not None:
            params["queue"] = queue
        statement = sql.DUE_COUNTS if queue is None else sql.DUE_COUNTS_QUEUE

        def work() -> tuple[int, ...]:
            row = self._db.one(statement, params, doing=what)
            return (0,) * 5 if row is None else tuple(int(n) for n in row)

        return self._scope.read(work, what)

    # ------------------------------------------------------------ claims

    def claim(self, request: ClaimRequest, limit: int, what: str) -> list[ClaimedJob]:
        return self._scope.write(lambda: self.claim_within(request, limit, what), what)

    def claim_within(self, request: ClaimRequest, limit: int, what: str) -> list[ClaimedJob]:
        now = self._runtime.now_ms()
        params: dict[str, Any] = {"now": now, "limit": limit}
        for index, kind in enumerate(request.kinds):
            params[f"k{index}"] = kind
        queues = 0
        if request.queues is not None:
            queues = len(request.queues)
            for index, queue in enumerate(request.queues):
                params[f"q{index}"] = queue
        statement = sql.claim_lock(len(request.kinds), queues)
        ids = [row[0] for row in self._db.all(statement, params, doing=what)]
        if not ids:
            return []
        tokens = self._runtime.uuids(len(ids))
        keys = [claim_key(token) for token in tokens]
        rows = self._db.all(
            sql.CLAIM_ROWS,
            {
                "owner": request.owner,
                "until": now + request.lease_ms,
                "now": now,
                "ids": ids,
                "tokens": tokens,
                "keys": keys,
            },
            doing=what,
        )
        place = {job_id: index for index, job_id in enumerate(ids)}
        rows.sort(key=lambda row: place[row[0]])
        by_token = dict(zip(tokens, keys, strict=True))
        return [claimed_from_row(row, by_token[row[15]]) for row in rows]

    # ------------------------------------------------------------ fenced writes

    def _fence_row(self, job_id: str, what: str) -> FenceRow | None:
        row = self._db.one(sql.FENCE_ROW, (job_id,), doing=what)
        return None if row is None else _fence_row(row)

    def _fenced(
        self, statement: str, params: dict[str, Any], lease: Lease, what: str
    ) -> bool | Missed:
        """A ``sql.fenced`` write: ``True``, or the fence row it met, from the same round trip."""
        row = self._db.one(statement, params, doing=what)
        assert row is not None
        if row[0]:
            return True
        return Missed(_fence_row(row[1:]))

    def renew(self, lease: Lease, lease_ms: int, what: str) -> Lease | Missed:
        def work() -> Lease | Missed:
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
                return lease_from_row(row[1 : 1 + _JOB_WIDTH], lease.claim_key)
            return Missed(_fence_row(row[1 + _JOB_WIDTH :]))

        return self._scope.write(work, what)

    def cancel_queued(
        self, job_id: str, what: str, signal: SignalLike | None
    ) -> bool | FenceRow | None:
        def work() -> bool | FenceRow | None:
            now = self._runtime.now_ms()
            if self._db.changes(sql.CANCEL_QUEUED, {"id": job_id, "now": now}, doing=what):
                self._notify_settled(what)
                return True
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
            row = self._db.one(statement, params, doing=what)
            return 0 if row is None else int(row[0])

        return self._scope.write(work, what, signal)

    def page(
        self, filters: PageFilters, *, signal: SignalLike | None, deadline: datetime | None
    ) -> Cursor[Job]:
        from .pages import page_jobs  # noqa: PLC0415 - the cursor module is only needed here

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
        params = {"result": result, "now": now, "id": lease.job_id, "token": lease.token}
        if notify and self._settled is not None:
            params["settled"] = self._settled
            return self._fenced(sql.SETTLE_DONE_NOTIFY, params, lease, what)
        return self._fenced(sql.SETTLE_DONE, params, lease, what)

    def _complete_many(
        self, items: Sequence[tuple[int, Completion]], now: int, what: str, *, notify: bool
    ) -> dict[int, bool | Missed]:
        """Distinct jobs' completions in one statement, which also answers the missed ones'
        fence rows."""
        params = {
            "now": now,
            "ids": [c.lease.job_id for _, c in items],
            "tokens": [c.lease.token for _, c in items],
            "results": [c.result for _, c in items],
        }
        statement = sql.SETTLE_DONE_MANY
        if notify and self._settled is not None:
            params["settled"] = self._settled
            statement = sql.SETTLE_DONE_MANY_NOTIFY
        found = {
            row[0]: True if row[1] else Missed(_fence_row(row[2:]))
            for row in self._db.all(statement, params, doing=what)
        }
        return {index: found[c.lease.job_id] for index, c in items}

    def snooze_within(self, item: Snoozing, now: int, what: str) -> bool | Missed:
        """Back to pending at ``now + delay`` under the fence, the attempt given back."""
        lease = item.lease
        params = {
            "id": lease.job_id,
            "token": lease.token,
            "now": now,
            "run_at": now + item.delay_ms,
        }
        return self._fenced(sql.SNOOZE, params, lease, what)

    def fail_within(
        self, failure: Failure, now: int, what: str, *, notify: bool = False
    ) -> bool | Missed:
        """One statement: the retry or dead letter under the fence, or the fence row it met.

        The backoff is computed for the lease's attempt (the row's, while the
        lease holds). A retry draws the runtime's random() before the write
        knows whether attempts remain, so a failure that turns out dead has
        drawn one (SQLite draws only for a retry).
        """
        current = failure.lease
        fenced = {"id": current.job_id, "token": current.token, "now": now}
        error = _pg_text(failure.message)
        run_at = 0
        draw = 0.0
        if failure.retry:
            draw = self._runtime.random()
            run_at = retry_at_ms(now, current.attempt, failure.base, failure.cap, draw)
        traceback = None if failure.traceback is None else _pg_text(failure.traceback)
        params = {
            **fenced,
            "error": error,
            "retry": bool(failure.retry),
            "run_at": run_at,
            "attempts": current.attempt,
            "traceback": traceback,
        }
        statement = sql.FAIL
        if notify and self._settled is not None:
            params["settled"] = self._settled
            statement = sql.FAIL_NOTIFY
        answer = self._db.one(statement, params, doing=what)
        assert answer is not None
        if answer[0]:
            return True
        fence = _fence_row(answer[1:])
        if not _holds(fence, current.token, now):
            return Missed(fence)
        # held, but the lease names another attempt number than its row (a
        # lease made by hand): decide by the row's own counts
        row = self._db.one(sql.READ_ATTEMPTS, fenced, doing=what)
        if row is None:
            return Missed(self._fence_row(current.job_id, what))
        attempts, max_attempts = int(row[0]), int(row[1])
        if failure_transition(attempts, max_attempts, retry=failure.retry) == "dead":
            self._db.run(sql.SETTLE_DEAD, {**fenced, "error": error}, doing=what)
        else:  # the draw made for the lease's attempt, recomputed for the row's
            run_at = retry_at_ms(now, attempts, failure.base, failure.cap, draw)
            self._db.run(sql.SETTLE_RETRY, {**fenced, "error": error, "run_at": run_at}, doing=what)
        entry = {"id": current.job_id, "attempt": attempts, "now": now, "error": error}
        self._db.run(sql.INSERT_ERROR, {**entry, "traceback": traceback}, doing=what)
        return True

    def release_within(self, leases: Sequence[Lease], now: int, what: str) -> int:
        held = list(dict.fromkeys((lease.job_id, lease.token) for lease in leases))
        params = {"now": now, "ids": [h[0] for h in held], "tokens": [h[1] for h in held]}
        return self._db.changes(sql.RELEASE_LEASES, params, doing=what)

    def settle(self, batch: SettleBatch, what: str) -> SettleAnswer:
        now_ms = self._runtime.now_ms
        return self._scope.write(lambda: self.settle_within(batch, now_ms(), what), what)

    def settle_within(self, batch: SettleBatch, now: int, what: str) -> SettleAnswer:
        items = batch.settlements
        settled: list[bool | Missed] = [True] * len(items)
        rest: Sequence[int] = range(len(items))
        if len(items) > 1:
            failing = {s.lease.job_id for s in items if not isinstance(s, Completion)}
            seen: set[str] = set()
            together: list[tuple[int, Completion]] = []
            for index, s in enumerate(items):
                job_id = s.lease.job_id
                if isinstance(s, Completion) and job_id not in failing and job_id not in seen:
                    seen.add(job_id)
                    together.append((index, s))
            if len(together) >= 2:
                many = self._complete_many(together, now, what, notify=True)
                for index, answer in many.items():
                    settled[index] = answer
                joined = {index for index, _ in together}
                rest = [index for index in rest if index not in joined]
                notify = False  # the one settlement NOTIFY of this transaction went
            else:
                notify = True
        else:
            notify = True
        ready = False  # a snooze made a job claimable now: wake the other processes' workers
        for index in rest:
            item = items[index]
            if isinstance(item, Completion):
                answer = self.complete_within(item.lease, item.result, now, what, notify=notify)
                notify = False
            elif isinstance(item, Snoozing):
                answer = self.snooze_within(item, now, what)
                ready = ready or (answer is True and item.delay_ms <= 0)
            else:
                answer = self.fail_within(item, now, what, notify=notify)
                notify = False
            settled[index] = answer
        released = self.release_within(batch.releases, now, what) if batch.releases else 0
        if released or ready:
            self._notify(what)  # released jobs are claimable again: wake the others
        claimed = tuple(self.claim_within(request, count, what) for request, count in batch.claims)
        return SettleAnswer(tuple(settled), released, claimed, now)

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
            return Missed(_fence_row(row[1:]))

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
