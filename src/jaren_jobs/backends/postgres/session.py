"""The PostgreSQL session: SQLite's answers (see backend.py) from PostgreSQL's statements.

Dialect lives here: a batch insert of arrays whose NOTIFY rides on the same
statement, a claim that locks its candidates with ``FOR UPDATE SKIP LOCKED``
(expired leases rescued by the same claim), and fenced writes that answer
the job's fence row in the same round trip as the write they guard.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from jaren_jobs.backend import Missed, SettleAnswer
from jaren_jobs.backends.sqlite.session import _instant, _new_job
from jaren_jobs.core.commands import ClaimRequest, Failure, PreparedJob
from jaren_jobs.core.fence import FenceRow, Verdict, classify
from jaren_jobs.core.policy import failure_transition, retry_at_ms
from jaren_jobs.core.settle import Completion, SettleBatch
from jaren_jobs.errors import DuplicateJob
from jaren_jobs.records import STATES, ClaimedJob, Counts, Job, Lease
from jaren_jobs.rows import claim_key, claimed_from_row, job_from_row, lease_from_row
from jaren_jobs.runtime import ResolvedRuntime
from jaren_jobs.signals import SignalLike

from . import queries as sql
from .connection import Database, RootScope, TxScope
from .pages import page_jobs

if TYPE_CHECKING:
    from jaren_jobs.cursor import Cursor

__all__ = ["PostgresSession"]

T = TypeVar("T")

_JOB_WIDTH = 16  # len(JOB_COLUMNS)


class _Skipped(Exception):
    """A row of a batch insert was skipped: its id was taken."""


def _fence_row(row: Sequence[Any]) -> FenceRow | None:
    """The six fence columns at the end of an answer; all NULL state: no such job."""
    if row[0] is None:
        return None
    return FenceRow.from_row(tuple(row))


class PostgresSession:
    """The engine's statements over one scope of one PostgreSQL store."""

    def __init__(self, db: Database, scope: RootScope | TxScope, runtime: ResolvedRuntime) -> None:
        self._db = db
        self._scope = scope
        self._runtime = runtime

    @property
    def db(self) -> Database:
        return self._db

    @property
    def scope(self) -> RootScope | TxScope:
        return self._scope

    def rescoped(self, scope: RootScope | TxScope) -> PostgresSession:
        return PostgresSession(self._db, scope, self._runtime)

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

        def work() -> list[Job]:
            now = now_ms()
            if one_by_one or len(prepared) == 1:
                return [self._insert(p, now, what) for p in prepared]
            return self._insert_batch(prepared, now, what)

        return self._scope.write(work, what)

    def _insert_rows(
        self, ids: Sequence[str], prepared: Sequence[PreparedJob], run_ats: Sequence[int], now: int,
        what: str,
    ) -> int:
        params = {
            "now": now,
            "ids": list(ids),
            "kinds": [p.kind for p in prepared],
            "payloads": [p.payload for p in prepared],
            "priorities": [p.priority for p in prepared],
            "run_ats": list(run_ats),
            "max_attempts": [p.max_attempts for p in prepared],
            "channel": self._db.channel,
        }
        row = self._db.one(sql.INSERT_JOBS, params, doing=what)
        return 0 if row is None else int(row[0])

    def _insert(self, prepared: PreparedJob, now: int, what: str) -> Job:
        job_id = prepared.id if prepared.id is not None else self._runtime.uuid()
        run_at = prepared.run_at(now)
        if not self._insert_rows([job_id], [prepared], [run_at], now, what):
            raise DuplicateJob(
                f"{what}: a job with id {job_id!r} already exists; ids are unique for a "
                "job's whole life (until it is swept)",
                job_id=job_id,
            )
        return _new_job(job_id, prepared, run_at, now, _instant(now))

    def _insert_batch(self, prepared: Sequence[PreparedJob], now: int, what: str) -> list[Job]:
        """One statement for the batch under a savepoint; a taken id replays it one by one
        (which raises what one-by-one inserts raise, for the first taken id in order)."""
        minted = iter(self._runtime.uuids(sum(1 for p in prepared if p.id is None)))
        ids = [next(minted) if p.id is None else p.id for p in prepared]
        run_ats = [p.run_at(now) for p in prepared]

        def insert() -> None:
            if self._insert_rows(ids, prepared, run_ats, now, what) != len(ids):
                raise _Skipped

        try:
            self._db.savepoint(insert, doing=what)
        except _Skipped:
            replay = zip(ids, prepared, strict=True)
            return [self._insert(p._replace(id=job_id), now, what) for job_id, p in replay]
        created = _instant(now)
        return [
            _new_job(job_id, p, run_at, now, created)
            for job_id, p, run_at in zip(ids, prepared, run_ats, strict=True)
        ]

    def get_job(self, job_id: str, what: str) -> Job | None:
        row = self._scope.read(lambda: self._db.one(sql.GET_JOB, (job_id,), doing=what), what)
        return None if row is None else job_from_row(row)

    def settled_by(self, lease: Lease, what: str) -> Job | None:
        params = {"id": lease.job_id, "generation": lease.generation, "claim_key": lease.claim_key}
        row = self._scope.read(lambda: self._db.one(sql.GET_SETTLED_BY, params, doing=what), what)
        return None if row is None else job_from_row(row)

    def count_jobs(self, what: str) -> Counts:
        def work() -> Counts:
            by_state = dict(self._db.all(sql.COUNT_BY_STATE, doing=what))
            leased = self._db.one(sql.COUNT_LEASED, doing=what)
            by_state["leased"] = 0 if leased is None else leased[0]
            kinds = dict(self._db.all(sql.COUNT_PENDING_KINDS, doing=what))
            known = {s: int(by_state.get(s, 0)) for s in STATES}
            return Counts(**known, pending_kinds={str(k): int(v) for k, v in kinds.items()})

        return self._scope.read_consistent(work, what)

    # ------------------------------------------------------------ claims

    def claim(self, request: ClaimRequest, limit: int, what: str) -> list[ClaimedJob]:
        return self._scope.write(lambda: self.claim_within(request, limit, what), what)

    def claim_within(self, request: ClaimRequest, limit: int, what: str) -> list[ClaimedJob]:
        """Up to ``limit`` jobs in claim order, each with its own lease, inside a write.

        One job: one statement (its token minted first, as SQLite's claim
        does). More: the candidates locked (skipping rows other claims hold),
        then one update minting exactly as many tokens as were found.
        """
        now = self._runtime.now_ms()
        params: dict[str, Any] = {
            "owner": request.owner,
            "until": now + request.lease_ms,
            "now": now,
            "kinds": list(request.kinds),
            "limit": limit,
        }
        if limit == 1:
            params["token"] = token = self._runtime.uuid()
            params["claim_key"] = key = claim_key(token)
            row = self._db.one(sql.CLAIM_ONE, params, doing=what)
            return [] if row is None else [claimed_from_row(row, key)]
        candidates = [r[0] for r in self._db.all(sql.CLAIM_CANDIDATES, params, doing=what)]
        if not candidates:
            return []
        tokens = self._runtime.uuids(len(candidates))
        keys = [claim_key(token) for token in tokens]
        params.update(ids=candidates, tokens=list(tokens), keys=keys)
        rows = self._db.all(sql.CLAIM_ROWS, params, doing=what)
        by_token = dict(zip(tokens, keys, strict=True))
        place = {job_id: index for index, job_id in enumerate(candidates)}
        rows.sort(key=lambda row: place[row[0]])  # RETURNING follows no promised order
        return [claimed_from_row(row, by_token[row[15]]) for row in rows]

    # ------------------------------------------------------------ fenced writes

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
            if row is None:
                return Missed(None)
            if row[0] is not None:
                return lease_from_row(row[:_JOB_WIDTH], lease.claim_key)
            return Missed(_fence_row(row[_JOB_WIDTH:]))

        return self._scope.write(work, what)

    def cancel_queued(
        self, job_id: str, what: str, signal: SignalLike | None
    ) -> bool | FenceRow | None:
        def work() -> bool | FenceRow | None:
            params = {"id": job_id, "now": self._runtime.now_ms()}
            row = self._db.one(sql.CANCEL_QUEUED, params, doing=what)
            if row is None:
                return None
            return True if row[0] is not None else _fence_row(row[1:])

        return self._scope.write(work, what, signal)

    def cancel_leased(self, lease: Lease, what: str, signal: SignalLike | None) -> bool | Missed:
        def work() -> bool | Missed:
            params = {"id": lease.job_id, "token": lease.token, "now": self._runtime.now_ms()}
            return self._fenced(sql.CANCEL_LEASED, params, what)

        return self._scope.write(work, what, signal)

    def requeue(
        self, job_id: str, *, drop_checkpoints: bool, what: str, signal: SignalLike | None
    ) -> bool | FenceRow | None:
        def drop() -> None:
            # no attempt holds the job now (requeue refuses a live lease)
            if drop_checkpoints:
                self._db.run(sql.CHECKPOINT_DROP_RUN, {"run_id": job_id}, doing=what)

        def work() -> bool | FenceRow | None:
            params = {"id": job_id, "now": self._runtime.now_ms(), "channel": self._db.channel}
            row = self._db.one(sql.REQUEUE, params, doing=what)
            if row is None:
                return None
            if row[0] is not None:
                drop()
                return True
            fence = _fence_row(row[2:])
            if fence is not None and fence.state == "pending":
                drop()
            return fence

        return self._scope.write(work, what, signal)

    def sweep(
        self, horizon_ms: int, limit: int | None, what: str, signal: SignalLike | None
    ) -> int:
        params = {"horizon": horizon_ms, "limit": limit}
        return self._scope.write(
            lambda: self._db.changes(sql.SWEEP, params, doing=what), what, signal
        )

    def page(
        self,
        *,
        state: object,
        kind: object,
        after: object,
        limit: object,
        signal: SignalLike | None,
        deadline: datetime | None,
    ) -> Cursor[Job]:
        return page_jobs(
            self._db,
            self._scope,
            self._runtime,
            state=state,  # type: ignore[arg-type]
            kind=kind,  # type: ignore[arg-type]
            after=after,  # type: ignore[arg-type]
            limit=limit,  # type: ignore[arg-type]
            signal=signal,
            deadline=deadline,
        )

    def _fenced(self, statement: str, params: dict[str, Any], what: str) -> bool | Missed:
        """A one-row ``sql.fenced`` statement: ``True`` (written) or the fence row it missed."""
        row = self._db.one(statement, params, doing=what)
        if row is None:
            return Missed(None)
        if row[0] is not None:
            return True
        return Missed(_fence_row(row[1:]))

    def fence_row_within(self, job_id: str, what: str) -> FenceRow | None:
        row = self._db.one(sql.FENCE_ROW, (job_id,), doing=what)
        return None if row is None else FenceRow.from_row(tuple(row))

    def complete_within(self, lease: Lease, result: str, now: int, what: str) -> bool | Missed:
        params = {"result": result, "now": now, "id": lease.job_id, "token": lease.token}
        return self._fenced(sql.SETTLE_DONE, params, what)

    def complete_many_within(
        self, items: Sequence[tuple[Lease, str]], now: int, what: str
    ) -> list[bool | Missed]:
        """Many completions: distinct jobs in one statement, repeats after, one by one."""
        answers: list[bool | Missed] = [True] * len(items)
        first: dict[str, int] = {}
        repeats: list[int] = []
        for index, (lease, _) in enumerate(items):
            if lease.job_id in first:
                repeats.append(index)
            else:
                first[lease.job_id] = index
        firsts = [items[index] for index in first.values()]
        params = {
            "now": now,
            "ids": [lease.job_id for lease, _ in firsts],
            "tokens": [lease.token for lease, _ in firsts],
            "results": [text for _, text in firsts],
        }
        for row in self._db.all(sql.SETTLE_DONE_MANY, params, doing=what):
            if not row[1]:
                answers[first[row[0]]] = Missed(_fence_row(row[2:]))
        # a repeat meets the row its earlier items left: strictly after them
        for index in repeats:
            lease, text = items[index]
            answers[index] = self.complete_within(lease, text, now, what)
        return answers

    def fail_within(self, failure: Failure, now: int, what: str) -> bool | Missed:
        current = failure.lease
        fenced = {"id": current.job_id, "token": current.token, "now": now}
        row = self._db.one(sql.READ_ATTEMPTS, fenced, doing=what)
        if row is None:
            return Missed(None)
        fence = FenceRow.from_row(tuple(row[2:]))
        held = (
            fence.state == "leased"
            and fence.token == current.token
            and fence.lease_until is not None
            and fence.lease_until > now
        )
        if not held:
            return Missed(fence)
        attempts, max_attempts = int(row[0]), int(row[1])
        if failure_transition(attempts, max_attempts, retry=failure.retry) == "dead":
            self._db.run(sql.SETTLE_DEAD, {**fenced, "error": failure.message}, doing=what)
        else:
            draw = self._runtime.random()
            run_at = retry_at_ms(now, attempts, failure.base, failure.cap, draw)
            self._db.run(
                sql.SETTLE_RETRY, {**fenced, "error": failure.message, "run_at": run_at}, doing=what
            )
        return True

    def release_within(self, leases: Sequence[Lease], now: int, what: str) -> int:
        held = list(dict.fromkeys((lease.job_id, lease.token) for lease in leases))
        params = {"now": now, "ids": [h[0] for h in held], "tokens": [h[1] for h in held]}
        return self._db.changes(sql.RELEASE_MANY, params, doing=what)

    # ------------------------------------------------------------ settling a batch

    def settle(self, batch: SettleBatch, what: str) -> SettleAnswer:
        now_ms = self._runtime.now_ms
        return self._scope.write(lambda: self.settle_within(batch, now_ms(), what), what)

    def settle_within(self, batch: SettleBatch, now: int, what: str) -> SettleAnswer:
        """SQLite's order: completions of distinct jobs no failure names together, the rest
        one by one in order, then releases, then claims — all in the caller's write."""
        items = batch.settlements
        settled: list[bool | Missed] = [True] * len(items)
        rest: Sequence[int] = range(len(items))
        if len(items) > 1:
            failing = {s.lease.job_id for s in items if not isinstance(s, Completion)}
            together = [
                (index, s)
                for index, s in enumerate(items)
                if isinstance(s, Completion) and s.lease.job_id not in failing
            ]
            if len(together) >= 2:
                pairs = [(s.lease, s.result) for _, s in together]
                answers = self.complete_many_within(pairs, now, what)
                for (index, _), answer in zip(together, answers, strict=True):
                    settled[index] = answer
                joined = {index for index, _ in together}
                rest = [index for index in rest if index not in joined]
        for index in rest:
            item = items[index]
            if isinstance(item, Completion):
                settled[index] = self.complete_within(item.lease, item.result, now, what)
            else:
                settled[index] = self.fail_within(item, now, what)
        released = self.release_within(batch.releases, now, what) if batch.releases else 0
        claimed = tuple(self.claim_within(request, count, what) for request, count in batch.claims)
        return SettleAnswer(tuple(settled), released, claimed, now)

    # ------------------------------------------------------------ checkpoints (SPEC §6)

    def load_checkpoints(self, run_id: str, generation: int, what: str) -> list[tuple[str, str]]:
        params = {"run_id": run_id, "generation": generation}
        rows = self._scope.read(lambda: self._db.all(sql.CHECKPOINT_LOAD, params, doing=what), what)
        return [(str(node_id), text) for node_id, text in rows]

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
            if row is None:
                return Missed(None)
            if int(row[0]):
                return True
            return Missed(_fence_row(row[1:]))

        return self._scope.write(work, what)

    def complete_run(self, lease: Lease, run_id: str, result: str, what: str) -> bool | Missed:
        """Complete the job and prune the run's rows of generation ≤ the lease's (when done)."""

        def work() -> bool | Missed:
            now = self._runtime.now_ms()
            answer = self.complete_within(lease, result, now, what)
            if not isinstance(answer, Missed):
                self._prune(run_id, lease.generation, what)
            elif (
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
