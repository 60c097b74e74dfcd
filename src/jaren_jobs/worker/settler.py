"""The settler: returned attempts become one settle batch per write, on its own threads.

Loops post each returned attempt; a settling thread commits whatever was posted
while it wrote last, in one transaction (the engine's group commit), fenced one
by one and answered only after the commit. The same transaction tops up the
loops' queues (the claim book's refills) and writes again a settlement whose
last write only timed out waiting, while its lease holds.

There is one settling thread per lane of the group commit: one on SQLite (one
writer per file), two on PostgreSQL, where a batch's statements keep a server
process busy for milliseconds (a few dozen jobs' rows and index entries) while
the next batch gathers: two threads let the loops' Python, one batch's
statements and the other's commit overlap.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from jaren_jobs.codec import ms_from_datetime
from jaren_jobs.core.settle import Completion, SettleBatch, Settlement, Snoozing
from jaren_jobs.engine.engine import ClaimRequest
from jaren_jobs.engine.group_commit import Settled, SettlementBatcher
from jaren_jobs.observe import hooks
from jaren_jobs.records import ClaimedJob, Lease, Outcome
from jaren_jobs.snooze import Snooze, snooze_ms
from jaren_jobs.worker.attempt import Attempt, Ran, WorkerStopped
from jaren_jobs.worker.claims import ClaimBook
from jaren_jobs.worker.outcomes import (
    Entry,
    Phase,
    finish,
    interrupted,
    is_wait,
    lost,
    outcome_of,
    retryable,
)
from jaren_jobs.worker.pacing import Batch
from jaren_jobs.worker.stats import Stats
from jaren_jobs.worker.tracking import Tracker

__all__ = ["POSTED_LIMIT", "SETTLING_LANES", "Settler"]

_log = logging.getLogger("jaren_jobs.worker")


# the most returned attempts waiting for the settling thread; past it, loops wait
POSTED_LIMIT = 256

# the settlements a top-up is written apart from (an AsyncWorker's, on two lanes):
# fewer ride with it in one transaction, which keeps a trickle of jobs at one
# transaction per job (a burst is what a top-up should not wait behind)
APART_FROM = 8

# the posted settlements that wake a second settling thread while one writes
# (fewer wait for that write to end: a transaction for one or two settlements
# costs the server as much as one for dozens)
_EAGER = 32

# settling threads (and transactions writing at once) where the database can
# write more than one: two measured 1.2-1.35x one at concurrency 4 on PostgreSQL,
# three no better than two
SETTLING_LANES = 2


# the pause before a settlement that met a transient error is written again
# (doubling from the first, up to the last), for as long as its lease holds
_RETRY_FIRST_SECONDS = 0.01
_RETRY_MOST_SECONDS = 1.0


def _stopping(attempt: Attempt) -> bool:
    """Whether the attempt's signal aborted because its worker is stopping (and only that)."""
    signal = attempt.scope.signal
    return (
        signal.aborted
        and isinstance(signal.reason, WorkerStopped)
        and not attempt.cancelled
        and attempt.lost is None
    )


class Settler:
    """The posted and retrying settlements, the settling thread and its back pressure.

    It shares the worker's one lock (given): a loop posting, the tracker counting
    what stop() drains, and the claim book asking for a refill meet under it.
    """

    def __init__(
        self,
        *,
        owner: str,
        name: str,
        lock: threading.Lock,
        tracker: Tracker,
        claims: ClaimBook,
        stats: Stats,
        settlements: SettlementBatcher,
        now_ms: Callable[[], int],
        end: Callable[[Attempt, Outcome], None],
        backoff_base_seconds: float | None,
        backoff_cap_seconds: float | None,
        claims_apart: bool = False,
    ) -> None:
        self._owner = owner
        # top-ups in a transaction of their own, ahead of the settlements posted with
        # them, where two lanes write at once (an AsyncWorker's: see threaded.py)
        self._claims_apart = claims_apart
        self._name = name
        self._lock = lock
        self._tracker = tracker
        self._claims = claims
        self._stats = stats
        self._settlements = settlements
        self._now_ms = now_ms
        self._end = end  # an attempt's one outcome, reported
        self._backoff_base = backoff_base_seconds
        self._backoff_cap = backoff_cap_seconds
        self._posted: list[Entry] = []  # returned attempts the loops posted
        self._refills: list[Batch] = []  # queues to top up in the next write
        self._retrying: list[Entry] = []  # posted settlements that met a transient error
        self._posting = threading.Condition(lock)
        self._room = threading.Condition(lock)  # loops waiting for the settling thread
        self._waiting = 0  # settling threads waiting for something to write
        self._done = False
        #: the settling threads (one per lane of the group commit), once started
        self.threads: tuple[threading.Thread, ...] = ()

    def start(self) -> None:
        threads = tuple(
            threading.Thread(target=self._run, name=f"{self._name}-settler-{lane}", daemon=True)
            for lane in range(self._settlements.lanes)
        )
        for thread in threads:
            thread.start()
        self.threads = threads  # before any loop runs: loops post only once they exist

    def refill(self, batch: Batch) -> bool:
        """Top ``batch`` up in the next write; False once stopping (the caller answers it)."""
        with self._lock:
            refused = self._done or self._tracker.halt.aborted
            if not refused:
                self._refills.append(batch)
                if self._waiting:
                    self._posting.notify()
        return not refused

    def close(self, bound: float) -> None:
        """The settling thread exits once what was posted has its outcome (a settlement
        the bar refused is a lost outcome, at once)."""
        with self._lock:
            self._done = True
            self._posting.notify_all()
            self._room.notify_all()
        deadline = time.monotonic() + bound
        for thread in self.threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
                if thread.is_alive():
                    _log.error("jaren_jobs: worker %r: a settling thread did not exit", self._owner)

    def _refail(self, entry: Entry) -> None:
        # a completion the store could not write: the attempt fails instead
        assert entry.item is not None
        assert entry.error is not None
        entry.item = self.failure(entry.item.lease, entry.error)
        self.submit([entry])

    def settle_all(self, ran: list[Ran]) -> None:
        """Settle ``ran`` in one group, in this thread (run_once)."""
        entries: list[Entry] = []
        try:
            for attempt, error, result in ran:
                entries.append(self.prepare(attempt, error, result))
        finally:
            for attempt, _, _ in ran[len(entries) :]:  # interrupted while preparing
                self._end(attempt, interrupted(attempt))
        self.settle_entries(entries)

    def submit(
        self, entries: Sequence[Entry], claims: Sequence[tuple[ClaimRequest, int]] = ()
    ) -> Settled:
        """Write the entries' settlements (and ``claims``) as one batch; each keeps its answer."""
        settling = [entry for entry in entries if entry.item is not None]
        batch = SettleBatch(
            tuple(e.item for e in settling if e.item is not None), (), tuple(claims)
        )
        settled = self._settlements.submit(batch)
        if hooks.observers:  # SPEC §17: the settlement batch sizes
            hooks.settlement_batch(len(settling))
        for index, entry in enumerate(settling):
            entry.met, entry.wrote = settled.error(index), settled.wrote[index]
            entry.row = settled.row(index)
        return settled

    def settle_entries(
        self,
        entries: list[Entry],
        claims: Sequence[tuple[ClaimRequest, int]] = (),
        *,
        defer: list[Entry] | None = None,
        committed: Callable[[Settled | None], None] | None = None,
    ) -> None:
        """One batch for the entries' settlements (and ``claims``); then each outcome.

        Each attempt gets exactly one outcome, reported only after the commit
        that made its settlement durable. ``committed`` runs once the batch's
        write is over (with its answer; ``None`` if it was interrupted),
        before any outcome is reported. A settlement that met
        a transient error (not a fence refusal: a locked database, a gate
        timeout) is written again while its lease holds: joined to ``defer``
        (the settling thread writes it with a later group), or, without
        ``defer``, retried here.
        """
        settled: set[int] = set()  # id() of the entries ended (or deferred)
        try:
            answer: Settled | None = None
            try:
                if claims or any(entry.item is not None for entry in entries):
                    answer = self.submit(entries, claims)
            finally:
                if committed is not None:
                    committed(answer)
            pending = entries
            while pending:
                again: list[Entry] = []
                for entry in pending:
                    if entry.outcome is None and self._to_retry(entry):
                        if defer is None:
                            again.append(entry)
                        else:
                            settled.add(id(entry))
                            defer.append(entry)
                        continue
                    outcome = entry.outcome or finish(self._owner, entry, self._refail)
                    settled.add(id(entry))
                    self._end(entry.attempt, outcome)
                if again:
                    # run_once(), or a handler that outlived stop(): wait here
                    pause = min(e.retry_at for e in again) - time.monotonic()
                    self._tracker.bar.signal.wait(max(0.0, pause))
                    self.submit(again)
                pending = again
        finally:
            # interrupted inside the worker's own bookkeeping: every attempt
            # still ends exactly once
            for entry in entries:
                if id(entry) not in settled:
                    self._end(entry.attempt, interrupted(entry.attempt))

    def _to_retry(self, entry: Entry) -> bool:
        """Whether the entry's settlement only met a wait, and its lease still holds.

        A write that timed out waiting (for the gate, behind a long
        application transaction; for SQLite's write lock, held by another
        connection) says nothing about the settlement: it is written again
        for as long as the lease would let it land, rather than turning a
        success into a failure. Any other error keeps its meaning (see
        :meth:`_finish`). Schedules the next write.
        """
        item = entry.item
        exc = None if item is None else entry.met
        if exc is None or not is_wait(exc):
            return False
        attempt = entry.attempt
        if ms_from_datetime(attempt.lease.expires_at) <= self._now_ms():
            return False  # too late: the fence would refuse it anyway
        if entry.tries == 0:
            assert item is not None
            doing = (
                "completing"
                if isinstance(item, Completion)
                else "snoozing"
                if isinstance(item, Snoozing)
                else "recording the failure of"
            )
            _log.warning(
                "jaren_jobs: worker %r: %s job %r failed (%s); retrying while its lease holds",
                self._owner,
                doing,
                attempt.job_id,
                exc,
            )
        pause = min(_RETRY_FIRST_SECONDS * 2**entry.tries, _RETRY_MOST_SECONDS)
        entry.tries += 1
        entry.retry_at = time.monotonic() + pause
        return True

    def post(self, ran: Ran) -> None:
        """Queue a returned attempt for the settling thread; stop() drains it like a step."""
        entry = self.prepare(*ran)
        full = self.enter_posted(entry)
        if full is None:
            # a handler that outlived stop(): its settlement is refused here, by name
            self.settle_entries([entry])
        elif full:
            self.wait_for_room()

    def enter_posted(self, entry: Entry) -> bool | None:
        """Queue ``entry`` for the settling thread, never waiting: whether the queue is full
        now (the caller then waits for room); None once the settling thread is done (the
        caller settles it itself). The AsyncWorker's loop posts through this and waits off
        the loop."""
        with self._lock:
            if self._done:
                return None
            self._tracker.busy += 1
            posted = self._posted
            posted.append(entry)
            # a settlement wakes a settling thread when none is writing; while one
            # is, it waits for that write to end, unless enough have gathered for a
            # write of their own (a top-up, which a loop waits for, always wakes one)
            if self._waiting and (self._waiting == len(self.threads) or len(posted) >= _EAGER):
                self._posting.notify()
            return len(posted) + len(self._retrying) >= POSTED_LIMIT

    def wait_for_room(self) -> None:
        # back-pressure: loops that outrun the settling thread wait for it, so the
        # attempts that ran but are not settled stay bounded (and none waits long
        # enough for its lease to run out)
        with self._lock:
            while len(self._posted) + len(self._retrying) >= POSTED_LIMIT and not self._done:
                self._room.wait()

    def _run(self) -> None:
        """The settling thread: commit what the loops posted, as one group each time.

        The same transaction leases the jobs that top up the loops' queues,
        and writes again the settlements whose last write met a transient
        error, once their pause is over.
        """
        while True:
            with self._lock:
                while True:
                    now = time.monotonic()
                    # once stop() is quiescing, no pause: the bar refuses them at once
                    due = [e for e in self._retrying if self._done or e.retry_at <= now]
                    if self._posted or self._refills or due:
                        break
                    if self._done and not self._retrying:
                        return
                    wait = min((e.retry_at for e in self._retrying), default=None)
                    self._waiting += 1
                    self._posting.wait(None if wait is None else max(0.0, wait - now))
                    self._waiting -= 1
                entries, self._posted = self._posted, []
                refills, self._refills = self._refills, []
                if due:
                    self._retrying = [e for e in self._retrying if e not in due]
                self._room.notify_all()
            settling = due + entries
            deferred: list[Entry] = []
            try:
                self._settle_cycle(settling, refills, deferred)
            except Exception:  # a worker bug must not end the settling thread silently
                _log.exception("jaren_jobs: worker %r: settling raised", self._owner)
            finally:
                with self._tracker.cond:
                    self._retrying.extend(deferred)
                    self._tracker.busy -= len(settling) - len(deferred)
                    self._tracker.cond.notify_all()

    def _settle_cycle(
        self, entries: list[Entry], refills: list[Batch], deferred: list[Entry]
    ) -> None:
        """One write of the settling thread: the entries, and the loops' top-ups."""
        asked: list[tuple[Batch, int]] = []  # each loop asking, and how many jobs
        waiting = list(refills)  # loops not answered yet

        def answer(batch: Batch, jobs: list[ClaimedJob], dry: bool = False) -> None:
            self._claims.hold(jobs)
            waiting.remove(batch)
            batch.topped_up(jobs, dry=dry)

        def deliver(settled: Settled | None) -> None:
            # before any outcome is reported: the loops wait for these
            back: list[ClaimedJob] = []
            for index, (batch, _) in enumerate(asked):
                claimed = settled.claimed[index] if settled is not None else None
                if not isinstance(claimed, list):
                    with self._lock:
                        self._stats.add("claim_errors")
                    _log.warning(
                        "jaren_jobs: worker %r: claim failed, retrying later: %s",
                        self._owner,
                        claimed or "interrupted",
                    )
                    answer(batch, [])
                    continue
                jobs = claimed
                if jobs and self._tracker.halt.aborted:  # stopping: back to the queue
                    back, jobs = back + jobs, []
                answer(batch, jobs, dry=not claimed)
            self._claims.hand_back(back)

        try:
            for batch in refills:
                count = batch.want - batch.unstarted()
                if count <= 0 or self._tracker.halt.aborted:
                    answer(batch, [])
                    continue
                asked.append((batch, count))
            claims = [(self._claims.request, count) for _, count in asked]
            if (
                claims
                and len(entries) >= APART_FROM
                and self._claims_apart
                and self._settlements.lanes > 1
            ):
                # the top-ups first, in a short transaction of their own: the loops
                # wait for them; the other lane is free to take what is posted next.
                # Whatever becomes of that write, each entry still gets its outcome
                try:
                    self.settle_entries([], claims, defer=deferred, committed=deliver)
                finally:
                    self.settle_entries(entries, (), defer=deferred)
            else:
                self.settle_entries(entries, claims, defer=deferred, committed=deliver)
        finally:
            # a loop waiting for its top-up must never wait forever
            for batch in list(waiting):
                waiting.remove(batch)
                batch.topped_up([])

    def prepare(self, attempt: Attempt, error: Exception | None, result: Any) -> Entry:
        """The attempt's settlement, checked in this thread; or its outcome if none is due."""
        entry = Entry(attempt, error)
        with attempt.lease_lock:
            attempt.ended = True  # no renewal from here on
            if attempt.cancelled:
                entry.outcome = outcome_of(attempt, "cancelled", reason="cancelled")
                return entry
            if attempt.lost is not None:
                phase: Phase = "completion" if error is None else "failure"
                # the fence row the refused renewal met decides, as a settlement's would
                entry.outcome = lost(attempt, phase, attempt.lost, attempt.lost_row)
                return entry
            lease = attempt.lease
        if error is not None and attempt.cancel_requested:
            # a forced cancel asked it to stop and it raised (or snoozed): the
            # failure of a marked job settles it cancelled, never retried
            entry.error = error
            entry.item = self.failure(lease, error)
            return entry
        if isinstance(error, Snooze):
            # the handler asked to run again later: no attempt spent (SPEC §12)
            entry.error = error
            entry.item = Snoozing(lease, snooze_ms(error.delay_seconds))
            return entry
        if error is not None and _stopping(attempt):
            # the handler raised because its worker is stopping (ctx.signal aborted
            # for the stop, not a cancel nor a lost lease): handed back, pending
            # now, the attempt not spent — five deploys during one long job must
            # not dead-letter it
            entry.error = error
            entry.item = Snoozing(lease, 0, stopping=True)
            return entry
        if error is None:
            if inspect.iscoroutine(result):
                result.close()
                error = TypeError(
                    f"the handler of kind {attempt.claimed.kind!r} returned a coroutine; "
                    "jaren_jobs handlers are plain functions (run the coroutine with "
                    "asyncio.run() inside the handler)"
                )
            else:
                try:
                    entry.item = self._settlements.completion(lease, result)
                    return entry
                except (TypeError, ValueError) as exc:  # a result JSON cannot carry or encode
                    error = exc
        entry.error = error
        entry.item = self.failure(lease, error)
        return entry

    def failure(self, lease: Lease, error: BaseException) -> Settlement:
        return self._settlements.failure(
            lease,
            error,
            retry=retryable(error),
            backoff_base_seconds=self._backoff_base,
            backoff_cap_seconds=self._backoff_cap,
        )
