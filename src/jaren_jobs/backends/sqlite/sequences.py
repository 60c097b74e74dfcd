"""The SQLite statement sequences that run inside a write the caller holds.

Claims, fenced settlements, hand-backs and a whole batch's settlement: which
statements run, in what order and batched how. None of them opens a unit of
work; :class:`~jaren_jobs.backends.sqlite.session.SqliteSession` runs them
inside its writes, and group commit inside its own (``settle_within``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from jaren_jobs.backend import Missed, SettleAnswer
from jaren_jobs.backends.sqlite import queries as sql
from jaren_jobs.backends.sqlite.connection import Database
from jaren_jobs.core.commands import ClaimRequest, Failure
from jaren_jobs.core.fence import FenceRow
from jaren_jobs.core.policy import failure_transition, retry_at_ms
from jaren_jobs.core.rows import claim_key, claimed_from_row, stored_text
from jaren_jobs.core.settle import Completion, SettleBatch, Settlement, Snoozing
from jaren_jobs.records import ClaimedJob, Lease
from jaren_jobs.runtime import ResolvedRuntime

__all__ = ["IdleClaims", "Sequences"]

# kinds -> (data_version, total_changes, next due ms) as of the last root
# claim of those kinds that found nothing; read and written under the gate
IdleClaims = dict[tuple[str, ...], tuple[int, int, int | None]]


class Sequences:
    """The inside-a-write statement sequences over one SQLite store's connection."""

    __slots__ = ("_db", "_idle_claims", "_root", "_runtime")

    def __init__(
        self, db: Database, runtime: ResolvedRuntime, idle_claims: IdleClaims, *, root: bool
    ) -> None:
        self._db = db
        self._runtime = runtime
        self._idle_claims = idle_claims
        # only the root scope remembers an empty claim: a savepoint's view
        # may roll back, and the idle probe reads the root connection's state
        self._root = root

    # ------------------------------------------------------------ claims

    def _claim_params(self, request: ClaimRequest, *, token: bool = True) -> dict[str, Any]:
        now = self._runtime.now_ms()
        params: dict[str, Any] = {
            "owner": request.owner,
            "until": now + request.lease_ms,
            "now": now,
        }
        if token:
            params["token"] = minted = self._runtime.uuid()
            params["claim_key"] = claim_key(minted)
        for index, kind in enumerate(request.kinds):
            params[f"k{index}"] = kind
        if request.queues is not None:
            for index, queue in enumerate(request.queues):
                params[f"q{index}"] = queue
        return params

    # An empty root claim records the connection's `PRAGMA data_version`
    # (moves when another connection commits), its total_changes (moves when
    # this connection writes) and the earliest time anything of those kinds
    # can come due without a write (a delayed run_at, a lease expiring). Until
    # one of the three moves, the next claim of those kinds would find nothing
    # too: it answers None without taking the write lock.

    def _remember_empty(self, request: ClaimRequest, params: dict[str, Any], what: str) -> None:
        """Inside the empty claim's transaction: when could these kinds next be claimable?"""
        if not self._root:
            return
        queues = 0 if request.queues is None else len(request.queues)
        ready = self._db.one(sql.next_ready_at(len(request.kinds), queues), params, doing=what)
        lease = self._db.one(sql.NEXT_LEASE_EXPIRY, doing=what)
        dues = [int(r[0]) for r in (ready, lease) if r is not None and r[0] is not None]
        version = self._db.one(sql.DATA_VERSION, doing=what)
        assert version is not None
        self._idle_claims[request.idle_key] = (
            int(version[0]),
            self._db.connection.total_changes,
            min(dues) if dues else None,
        )

    def claim_within(self, request: ClaimRequest, limit: int, what: str) -> list[ClaimedJob]:
        """The claim statements alone, for callers already inside a write: up to ``limit``.

        Jobs come back in claim order, each with its own lease (a fresh token
        from the runtime, generation + 1, attempts + 1). Past one job this is
        two statements, not one per job: the candidates in claim order, then
        one update minting every lease (one more per 256 jobs).
        """
        if limit > 1 and sql.MULTI_ROW_UPDATES:
            return self._claim_batch(request, limit, what)
        queues = 0 if request.queues is None else len(request.queues)
        statement = sql.claim_next(len(request.kinds), queues)
        claimed: list[ClaimedJob] = []
        for _ in range(limit):
            params = self._claim_params(request)
            row = self._db.one(statement, params, doing=what)
            if row is None:
                if not claimed:
                    self._remember_empty(request, params, what)
                break
            claimed.append(claimed_from_row(row, params["claim_key"], self._db.text_codec))
        return claimed

    def _claim_batch(self, request: ClaimRequest, limit: int, what: str) -> list[ClaimedJob]:
        queues = 0 if request.queues is None else len(request.queues)
        params = self._claim_params(request, token=False)
        params["limit"] = limit
        statement = sql.claim_candidates(len(request.kinds), queues)
        candidates = self._db.all(statement, params, doing=what)
        if not candidates:
            self._remember_empty(request, params, what)
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

    # ------------------------------------------------------------ fenced writes

    def fence_row_within(self, job_id: str, what: str) -> FenceRow | None:
        """The job's fence row as it stands (``None``: no such job)."""
        row = self._db.one(sql.FENCE_ROW, (job_id,), doing=what)
        if row is None:
            return None
        return FenceRow.from_row(row[:6], stored_text(row[6], self._db.text_codec))

    def complete_within(self, lease: Lease, result: str, now: int, what: str) -> bool | Missed:
        params = {"result": result, "now": now, "id": lease.job_id, "token": lease.token}
        if self._db.changes(sql.SETTLE_DONE, params, doing=what):
            return True
        return Missed(self.fence_row_within(lease.job_id, what))

    def complete_many_within(
        self, items: Sequence[tuple[Lease, str]], now: int, what: str
    ) -> list[bool | Missed]:
        """Many completions at once: per item, ``True`` (written) or :class:`Missed`.

        Items naming the same job act as if applied one after another. From
        four jobs up, one statement settles every fenced item and only the
        rest are read back, one by one.
        """
        answers: list[bool | Missed] = [True] * len(items)
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
                if job_id not in settled:
                    answers[index] = Missed(self.fence_row_within(job_id, what))
        else:
            repeats = list(range(len(items)))  # one by one, in input order
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
            return Missed(self.fence_row_within(current.job_id, what))
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
        # the history entry in the failure's own transaction: never one without the other
        entry = {"id": current.job_id, "attempt": attempts, "now": now}
        entry |= {"generation": current.generation}
        entry |= {"error": failure.message, "traceback": failure.traceback}
        self._db.run(sql.INSERT_ERROR, entry, doing=what)
        if row[2] is not None:
            # marked by cancel(id, force=True): the failure wrote ``cancelled``; answered
            # as the row it wrote (as a repeat is), so the caller learns how the job ended
            return Missed(self.fence_row_within(current.job_id, what))
        return True

    def snooze_within(self, item: Snoozing, now: int, what: str) -> bool | Missed:
        """Back to pending at ``now + delay`` under the fence, the attempt given back."""
        lease = item.lease
        run_at = now + item.delay_ms
        params = {"id": lease.job_id, "token": lease.token, "now": now, "run_at": run_at}
        if self._db.changes(sql.SETTLE_SNOOZE, params, doing=what):
            row = self.fence_row_within(lease.job_id, what)
            # a snooze of a job cancel(id, force=True) marked wrote ``cancelled``: that row
            return True if row is None or row.state != "cancelled" else Missed(row)
        return Missed(self.fence_row_within(lease.job_id, what))

    def _one_within(self, item: Settlement, now: int, what: str) -> bool | Missed:
        """One settlement by the statements a lone call runs."""
        if isinstance(item, Completion):
            return self.complete_within(item.lease, item.result, now, what)
        if isinstance(item, Snoozing):
            return self.snooze_within(item, now, what)
        return self.fail_within(item, now, what)

    def release_within(self, leases: Sequence[Lease], now: int, what: str) -> int:
        """Hand back leases whose attempts never started; how many jobs were released.

        Each job still held by exactly that lease (leased, same token, not
        expired at ``now``) is pending again at once: its lease cleared, the
        claim's attempt undone (``attempts - 1``), ``run_at`` and the
        generation kept, so the released lease stays superseded and settles
        nothing. Leases no longer held are skipped.
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

    # ------------------------------------------------------------ settling a batch

    def settle_within(self, batch: SettleBatch, now: int, what: str) -> SettleAnswer:
        """The batch's statements inside the caller's write: settlements, releases, claims.

        Completions of distinct jobs no failure of the batch names go through
        one multi-row call (the same fence per row); every other settlement
        runs the very statements a lone call runs, in order, so items naming
        one job meet the row the earlier ones left.
        """
        items = batch.settlements
        if len(items) == 1:
            # a lone complete()/fail(), or a worker's single settlement: the
            # same statements as the loop below, without its bookkeeping
            return self._answer((self._one_within(items[0], now, what),), batch, now, what)
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
                answers = self.complete_many_within([s for _, s in together], now, what)
                for (index, _), answer in zip(together, answers, strict=True):
                    settled[index] = answer
                joined = {index for index, _ in together}
                rest = [index for index in rest if index not in joined]
        for index in rest:
            settled[index] = self._one_within(items[index], now, what)
        return self._answer(tuple(settled), batch, now, what)

    def _answer(
        self, settled: tuple[bool | Missed, ...], batch: SettleBatch, now: int, what: str
    ) -> SettleAnswer:
        """After the settlements: the batch's releases and claims, and the whole answer."""
        released = self.release_within(batch.releases, now, what) if batch.releases else 0
        claimed: tuple[list[ClaimedJob], ...] = ()
        if batch.claims:
            claimed = tuple(self.claim_within(request, n, what) for request, n in batch.claims)
        return SettleAnswer(settled, released, claimed, now)

    # ------------------------------------------------------------ statement sizes

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
        largest = self.largest_rows(len(head), width)
        for start in range(0, len(rows), largest):
            chunk = rows[start : start + largest]
            size = sql.batch_size(len(chunk))
            params = list(head)
            for row in chunk:
                params += row
            params += [None] * ((size - len(chunk)) * width)
            yield statement(size), params

    def largest_rows(self, head: int, width: int) -> int:
        """The most rows (a power of two, at most ``sql.BATCH_ROWS``) one statement may bind.

        ``head`` parameters come first, then ``width`` per row, within the
        connection's parameter limit.
        """
        largest = sql.BATCH_ROWS
        while largest > 1 and head + largest * width > self._db.max_variables:
            largest //= 2
        return largest
