"""The thread-based worker (SPEC §7): claim → run → settle, on ``concurrency`` loops.

Shape of one worker:

* ``concurrency`` loop threads, each running a queue of leased jobs one
  after another, and sleeping on a condition variable between empty claims
  until a wake-up (an enqueue; on PostgreSQL, another process's too) or the
  poll: one idle loop polls every ``poll_seconds`` for all of them and wakes
  the others when it finds work. A loop
  holds at most a few jobs beyond the one it runs: as many as the handlers'
  measured running time lets it start within a short horizon, never more
  than its share of ``WORKER_AHEAD`` (see ``ClaimBook.ahead``), since each is
  a lease no other worker can take and an attempt a SIGKILL spends;
* ONE settling thread: each returned attempt is posted to it, and it commits
  whatever was posted while it wrote last, in one transaction (through a
  :class:`~jaren_jobs.engine.group_commit.SettlementBatcher`, so each settlement is
  fenced on its own and answered only after the commit). The same
  transaction tops up the loops' queues, and writes again a settlement
  whose last write only timed out waiting, while its lease holds;
* ONE renewal thread, which wakes every quarter of the renewal period while
  attempts are in flight and renews the leases that have fallen due;
* every database operation the worker itself starts (claims, renewals,
  settlements, the handlers' checkpoint stores) runs through a tracked root
  scope, so :meth:`Worker.stop` can bar new ones and wait out the running
  ones: when ``stop()`` returns, nothing the worker started still touches
  the store.

Jobs a loop leased and did not start (the worker is stopping, or a slow job
overran the batch's time budget) are handed back with a fenced release that
spends no attempt; one cancelled with its lease before it started never
starts. :meth:`Worker.run_once` works on one job, synchronously.

Each attempt has exactly one :class:`~jaren_jobs.records.Outcome`:
``completed``, ``failed``, ``cancelled`` or ``lost``.
"""

from jaren_jobs.worker.attempt import Handler, JobContext, WorkerStopped
from jaren_jobs.worker.options import create_worker, is_async
from jaren_jobs.worker.pacing import MAX_AHEAD
from jaren_jobs.worker.settler import POSTED_LIMIT
from jaren_jobs.worker.threaded import Worker, WorkerHost

# the bounds tests state their limits by (not public API)
_MAX_AHEAD = MAX_AHEAD
_POSTED_LIMIT = POSTED_LIMIT

__all__ = [
    "Handler",
    "JobContext",
    "Worker",
    "WorkerHost",
    "WorkerStopped",
    "create_worker",
    "is_async",
]
