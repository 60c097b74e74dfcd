"""The PostgreSQL statements that settle a batch, inside a write the caller holds.

Completions (many distinct jobs' in one statement), failures (the retry or
dead letter and the error-history entry), snoozes, hand-backs of leases never
started, and the batch's next claims: which statements run, in what order and
batched how — as ``backends/sqlite/sequences.py`` keeps SQLite's. None of them
opens a unit of work; :class:`~jaren_jobs.backends.postgres.session.PostgresSession`
runs them inside its writes, and group commit inside its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from jaren_jobs.backend import Missed
from jaren_jobs.backends.postgres import queries as sql
from jaren_jobs.backends.postgres.connection import PgDatabase
from jaren_jobs.core.commands import ClaimRequest, Failure
from jaren_jobs.core.fence import FenceRow
from jaren_jobs.core.policy import failure_transition, retry_at_ms
from jaren_jobs.core.rows import claim_key, claimed_from_row
from jaren_jobs.core.settle import Completion, SettleBatch, Snoozing
from jaren_jobs.records import ClaimedJob, Lease
from jaren_jobs.runtime import ResolvedRuntime

__all__ = ["PgSettling", "fence_row_of", "pg_text"]

# a claim of up to this many jobs is one statement, its tokens minted before it runs (a
# few unused ones cost less than a round trip); a larger one locks, then mints
_MINTED_AHEAD = 64


def fence_row_of(values: Sequence[Any]) -> FenceRow | None:
    """``(state, token, until, generation, settled, key, last_error)``, or None (no job)."""
    if values[0] is None:
        return None
    return FenceRow.from_row(tuple(values[:6]), None if values[6] is None else str(values[6]))


# where a fenced write's answer says the row was marked by cancel(id, force=True): after
# the written flag and the fence row's seven columns
_MARKED_AT = 8


def ended_cancelled(before: FenceRow | None, error: str | None) -> Missed:
    """A failure or snooze that a forced-cancel mark made ``cancelled``, answered as the row
    it wrote (as a repeat by the same attempt is): its caller learns how the job ended."""
    assert before is not None
    after = replace(
        before,
        state="cancelled",
        token=None,
        lease_until=None,
        settled_generation=before.generation,
        last_error=error if error is not None else before.last_error,
    )
    return Missed(after)


def _holds(fence: FenceRow | None, token: str, now: int) -> bool:
    """Whether the fence row shows ``token``'s lease live at ``now``."""
    return (
        fence is not None
        and fence.state == "leased"
        and fence.token == token
        and fence.lease_until is not None
        and fence.lease_until > now
    )


def pg_text(text: str) -> str:
    """PostgreSQL's text cannot hold NUL: kept as its escape, as lone surrogates are."""
    return text.replace("\x00", "\\x00") if "\x00" in text else text


def _claimed(rows: list[tuple[Any, ...]], keys: list[bytes]) -> list[ClaimedJob]:
    """A one-statement claim's rows, in claim order (each row's place is its last column,
    which also picks its token's claim key)."""
    rows.sort(key=lambda row: row[-1])
    return [claimed_from_row(row, keys[row[-1] - 1]) for row in rows]


class PgSettling:
    """The settle-batch statements over one PostgreSQL store's connection."""

    __slots__ = ("_channel", "_db", "_runtime", "_settled")

    def __init__(
        self, db: PgDatabase, runtime: ResolvedRuntime, channel: str | None, settled: str | None
    ) -> None:
        self._db = db
        self._runtime = runtime
        self._channel = channel  # the enqueue channel: wakes idle workers to claim
        self._settled = settled  # the settlement channel: wakes wait()ers

    def _notify(self, what: str) -> None:
        # sent with the transaction's commit (never before it), once per statement
        if self._channel is not None:
            self._db.run(sql.NOTIFY, {"channel": self._channel}, doing=what)

    def _fence_row(self, job_id: str, what: str) -> FenceRow | None:
        row = self._db.one(sql.FENCE_ROW, (job_id,), doing=what)
        return None if row is None else fence_row_of(row)

    def _fenced(
        self, statement: str, params: dict[str, Any], lease: Lease, what: str, final: bool = False
    ) -> bool | Missed:
        """A ``sql.fenced`` write: ``True``, or the fence row it met, from the same round trip."""
        row = self._db.one(statement, params, doing=what, final=final)
        assert row is not None
        if row[0]:
            return True
        return Missed(fence_row_of(row[1:]))

    def _fenced_unless_marked(
        self, statement: str, params: dict[str, Any], what: str, error: str | None = None
    ) -> bool | Missed:
        """A fenced failure or snooze: ``True``; the row it wrote when a mark made the job
        ``cancelled`` (see :func:`ended_cancelled`); or the fence row it met."""
        row = self._db.one(statement, params, doing=what)
        assert row is not None
        if row[0]:
            if row[_MARKED_AT] is None:
                return True
            return ended_cancelled(fence_row_of(row[1:]), error)
        return Missed(fence_row_of(row[1:]))

    def complete_within(
        self,
        lease: Lease,
        result: str,
        now: int,
        what: str,
        *,
        notify: bool = False,
        final: bool = False,
    ) -> bool | Missed:
        params = {"result": result, "now": now, "id": lease.job_id, "token": lease.token}
        if notify and self._settled is not None:
            params["settled"] = self._settled
            return self._fenced(sql.SETTLE_DONE_NOTIFY, params, lease, what, final)
        return self._fenced(sql.SETTLE_DONE, params, lease, what, final)

    def _complete_many(
        self,
        items: Sequence[tuple[int, Completion]],
        now: int,
        what: str,
        *,
        notify: bool,
        final: bool = False,
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
            row[0]: True if row[1] else Missed(fence_row_of(row[2:]))
            for row in self._db.all(statement, params, doing=what, final=final)
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
        return self._fenced_unless_marked(sql.SNOOZE, params, what)

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
        error = pg_text(failure.message)
        run_at = 0
        draw = 0.0
        if failure.retry:
            draw = self._runtime.random()
            run_at = retry_at_ms(now, current.attempt, failure.base, failure.cap, draw)
        traceback = None if failure.traceback is None else pg_text(failure.traceback)
        params = {
            **fenced,
            "error": error,
            "retry": bool(failure.retry),
            "run_at": run_at,
            "attempts": current.attempt,
            "generation": current.generation,
            "traceback": traceback,
        }
        statement = sql.FAIL
        if notify and self._settled is not None:
            params["settled"] = self._settled
            statement = sql.FAIL_NOTIFY
        answer = self._db.one(statement, params, doing=what)
        assert answer is not None
        if answer[0]:
            if answer[_MARKED_AT] is None:
                return True
            return ended_cancelled(fence_row_of(answer[1:]), error)
        fence = fence_row_of(answer[1:])
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
        entry["generation"] = current.generation
        self._db.run(sql.INSERT_ERROR, {**entry, "traceback": traceback}, doing=what)
        return True

    def release_within(self, leases: Sequence[Lease], now: int, what: str) -> int:
        held = list(dict.fromkeys((lease.job_id, lease.token) for lease in leases))
        params = {"now": now, "ids": [h[0] for h in held], "tokens": [h[1] for h in held]}
        return self._db.changes(sql.RELEASE_LEASES, params, doing=what)

    def claim_within(
        self, request: ClaimRequest, limit: int, what: str, *, final: bool
    ) -> list[ClaimedJob]:
        """Lock and lease up to ``limit`` jobs: one statement up to ``_MINTED_AHEAD`` (its
        tokens minted before it knows how many rows it finds), two beyond."""
        if limit <= _MINTED_AHEAD:
            statement, params, keys = self._claim_statement(request, limit)
            return _claimed(self._db.all(statement, params, doing=what, final=final), keys)
        params = self._claim_params(request, limit)
        queues = 0 if request.queues is None else len(request.queues)
        locked = self._db.all(sql.claim_lock(len(request.kinds), queues), params, doing=what)
        ids = [row[0] for row in locked]
        if not ids:
            return []
        tokens = self._runtime.uuids(len(ids))
        keys = [claim_key(token) for token in tokens]
        rows = self._db.all(
            sql.CLAIM_ROWS,
            {**params, "ids": ids, "tokens": tokens, "keys": keys},
            doing=what,
            final=final,
        )
        place = {job_id: index for index, job_id in enumerate(ids)}
        rows.sort(key=lambda row: place[row[0]])
        by_token = dict(zip(tokens, keys, strict=True))
        return [claimed_from_row(row, by_token[row[15]]) for row in rows]

    def _claim_params(self, request: ClaimRequest, limit: int) -> dict[str, Any]:
        now = self._runtime.now_ms()
        params: dict[str, Any] = {"now": now, "limit": limit}
        for index, kind in enumerate(request.kinds):
            params[f"k{index}"] = kind
        if request.queues is not None:
            for index, queue in enumerate(request.queues):
                params[f"q{index}"] = queue
        params["owner"] = request.owner
        params["until"] = now + request.lease_ms
        return params

    def _claim_statement(
        self, request: ClaimRequest, limit: int
    ) -> tuple[str, dict[str, Any], list[bytes]]:
        """The one-statement claim of up to ``limit`` jobs, its ``limit`` tokens minted."""
        params = self._claim_params(request, limit)
        queues = 0 if request.queues is None else len(request.queues)
        if limit == 1:  # a lone claim: its token and key as scalars, not one-element arrays
            token = self._runtime.uuid()
            key = params["key"] = claim_key(token)
            params["token"] = token
            return sql.claim_single(len(request.kinds), queues), params, [key]
        tokens = self._runtime.uuids(limit)
        keys = [claim_key(token) for token in tokens]
        params["tokens"] = tokens
        params["keys"] = keys
        return sql.claim(len(request.kinds), queues), params, keys

    def settle_together(
        self, batch: SettleBatch, now: int, what: str
    ) -> tuple[tuple[bool | Missed, ...], tuple[list[ClaimedJob], ...]] | None:
        """A worker's usual batch — completions of distinct jobs and its next claims, the
        batch its whole unit of work — in ONE round trip: its BEGIN, the completions'
        statement, each claim's, its COMMIT, pipelined (none reads another's answer).
        None when the batch is another shape, or the unit has begun: the caller then
        runs the statements one by one."""
        items = batch.settlements
        if batch.releases or not items or not batch.claims:
            return None
        if any(count > _MINTED_AHEAD for _, count in batch.claims):
            return None
        ids = [item.lease.job_id for item in items]
        if len(set(ids)) != len(ids) or not all(isinstance(i, Completion) for i in items):
            return None
        done = [item for item in items if isinstance(item, Completion)]
        params: dict[str, Any] = {
            "now": now,
            "ids": ids,
            "tokens": [c.lease.token for c in done],
            "results": [c.result for c in done],
        }
        statement = sql.SETTLE_DONE_MANY
        if self._settled is not None:
            params["settled"] = self._settled
            statement = sql.SETTLE_DONE_MANY_NOTIFY
        claims = [self._claim_statement(request, count) for request, count in batch.claims]
        answers = self._db.together(
            [(statement, params), *((text, bound) for text, bound, _ in claims)], doing=what
        )
        if answers is None:
            return None
        found = {row[0]: True if row[1] else Missed(fence_row_of(row[2:])) for row in answers[0]}
        settled = tuple(found[job_id] for job_id in ids)
        claimed = tuple(
            _claimed(rows, keys) for rows, (_, _, keys) in zip(answers[1:], claims, strict=True)
        )
        return settled, claimed

    def settle_within(
        self, batch: SettleBatch, now: int, what: str, *, final: bool = False
    ) -> tuple[tuple[bool | Missed, ...], int]:
        """The batch's settlements and releases inside the caller's write: per settlement
        ``True`` or :class:`Missed`, and how many released leases were still held. The
        batch's claims are the session's (they run after these, in the same write).

        ``final``: nothing follows in the write, so completions alone (the common batch)
        go as its final statement, which commits it in the same round trip."""
        items = batch.settlements
        final = final and not batch.releases
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
                alone = final and len(together) == len(items)
                many = self._complete_many(together, now, what, notify=True, final=alone)
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
                alone = final and len(items) == 1
                answer = self.complete_within(
                    item.lease, item.result, now, what, notify=notify, final=alone
                )
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
        return tuple(settled), released
