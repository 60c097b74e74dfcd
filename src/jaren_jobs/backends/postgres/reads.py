"""The operator's reads of a PostgreSQL session: error history, counts, the settled
buckets, what is due, the metrics' gauges. A class of their own, the base of
:class:`~jaren_jobs.backends.postgres.session.PostgresSession`, so that the session's
class holds the statements of the queue's life (enqueue, claim, settle) alone.
"""

from __future__ import annotations

from typing import Any

from jaren_jobs.backend import DueRow, ErrorRow, Scope
from jaren_jobs.backends.postgres import listing
from jaren_jobs.backends.postgres import queries as sql
from jaren_jobs.backends.postgres.connection import PgDatabase
from jaren_jobs.records import STATES, Counts
from jaren_jobs.runtime import ResolvedRuntime

__all__ = ["PgReads"]


class PgReads:
    """The operator's reads over the session's scope (its ``_db``, ``_scope``, ``_runtime``)."""

    _db: PgDatabase
    _scope: Scope
    _runtime: ResolvedRuntime

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
            rows = self._db.all(listing.COUNT_BY_STATE, {"now": self._runtime.now_ms()}, doing=what)
            by_state = {str(s): int(n) for s, n in rows}
            kinds = self._db.all(listing.COUNT_PENDING_KINDS, doing=what)
            known = {s: by_state.get(s, 0) for s in STATES}
            return Counts(**known, pending_kinds={str(k): int(v) for k, v in kinds})

        return self._scope.read_consistent(work, what)

    def _count_queue(self, queue: str, what: str) -> Counts:
        def work() -> Counts:
            params = {"queue": queue, "now": self._runtime.now_ms()}
            rows = self._db.all(listing.COUNT_QUEUE_BY_STATE, params, doing=what)
            by_state = {str(s): int(n) for s, n in rows}
            kinds = self._db.all(listing.COUNT_QUEUE_PENDING_KINDS, {"queue": queue}, doing=what)
            known = {s: by_state.get(s, 0) for s in STATES}
            return Counts(**known, pending_kinds={str(k): int(v) for k, v in kinds})

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
