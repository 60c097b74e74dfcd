"""A loop's queue run: one algorithm over a narrow steps interface.

The thread worker's loops implement the steps in threads (:class:`ThreadSteps`);
an AsyncWorker's queue run implements them on its event loop, over the twin of
this module that ``tools/async_gen.py`` derives (``queue_run_async.py``), so the
algorithm — when to top up, when to hand back, when to stop — is written once.
"""

from __future__ import annotations

from typing import Protocol

from jaren_jobs.records import ClaimedJob
from jaren_jobs.signals import Signal
from jaren_jobs.worker.attempt import Attempt, Ran
from jaren_jobs.worker.claims import ClaimBook
from jaren_jobs.worker.pacing import Batch
from jaren_jobs.worker.running import AttemptRunner
from jaren_jobs.worker.settler import Settler

__all__ = ["QueueSteps", "ThreadSteps", "run_queue"]


class QueueSteps(Protocol):
    """Where a queue run waits and runs: in threads, or on an event loop."""

    def wait_refill(self, batch: Batch) -> bool:
        """Wait for the top-up under way (if any); whether the queue has a job now."""
        ...

    def run(self, attempt: Attempt, batch: Batch) -> None:
        """Run the started attempt's handler, and end it or post its settlement."""
        ...


def run_queue(
    steps: QueueSteps,
    batch: Batch,
    rest: list[ClaimedJob],
    *,
    claims: ClaimBook,
    runner: AttemptRunner,
    halt: Signal,
) -> bool:
    """Run a loop's queue of leased jobs one after another; True when it ended because
    a top-up found nothing to lease (the loop may go idle without claiming again).

    Each returned attempt goes to the settling thread at once, which
    commits it (with whatever else is ready) while the loop runs the next
    job, and tops the queue up in the same transaction (a job the claim
    brought alone runs with no top-up under way: its settlement asks for
    the next, so no job waits leased behind one of unknown length). The
    first job runs even if the worker is stopping (its claim was under
    way); a job not started when the worker halts, or that has waited past
    the time budget (it sat behind a job far slower than the average),
    joins ``rest``, to be handed back unstarted: no attempt is spent.
    """
    first, dry = True, False
    while True:
        if not first and halt.aborted:
            break
        claimed = batch.take()
        if claimed is None:
            if batch.stalled or halt.aborted:
                break
            # nothing ahead and nothing on its way: ask for the next
            # job, in the transaction of the last one's settlement
            if not batch.refill and not claims.top_up(batch, idle=True):
                break
            if steps.wait_refill(batch):
                continue
            dry = batch.dry  # the store had nothing more for this loop
            break
        if not first and claims.waited_too_long(claimed):
            rest.append(claimed)
            claims.slow_start()  # a slow job hid among fast ones: start small again
            break
        alone = first and not batch.unstarted()  # the claim brought this job only
        first = False
        attempt = runner.begin(claimed)
        if attempt is None:
            continue  # cancelled before it started
        if not alone:
            # the next jobs come while this one runs. A job claimed alone (an idle
            # loop's) runs with none leased behind it: how long it runs is not known
            # yet, and the next jobs come with its settlement
            claims.top_up(batch)
        steps.run(attempt, batch)
    if batch.stalled:
        claims.slow_start()
    return dry


class ThreadSteps:
    """The thread worker's steps: the loop's thread waits, and runs each handler."""

    def __init__(self, runner: AttemptRunner, settler: Settler) -> None:
        self._runner = runner
        self._settler = settler

    def wait_refill(self, batch: Batch) -> bool:
        return batch.wait_refill()

    def run(self, attempt: Attempt, batch: Batch) -> None:
        runner = self._runner
        ran: list[Ran] = []
        try:
            outcome = runner.call(attempt, ran)
        except BaseException as exc:
            # only a handler's KeyboardInterrupt/SystemExit gets here
            runner.end(attempt, runner.abandon(attempt, exc))
            raise
        finally:
            batch.returned()
        if outcome is not None:
            runner.end(attempt, outcome)
        else:
            self._settler.post(ran.pop())
