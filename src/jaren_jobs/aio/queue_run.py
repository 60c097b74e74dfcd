"""An ``AsyncWorker``'s queue run (SPEC §11): a claimed batch of async jobs, run on the loop.

A started AsyncWorker's loop thread that claims a batch whose first job has
an ``async def`` handler hands the whole batch to the event loop: one task
(:class:`_QueueRun`) runs it as the thread worker's loop would, awaiting each
handler in a task of its own (:class:`_Pending`) and posting each result to
the settling thread, with no thread waiting per job. The thread waits for the
batch to end, running what must block (a plain handler, a wait for the
settling thread, the hand-back of unstarted jobs).

``aio.worker`` imports this module, not the reverse: what the run needs of its
worker is typed by :class:`_Host`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol, TypeVar

from jaren_jobs.aio.runner import CallerThread, LoopPoster
from jaren_jobs.records import ClaimedJob, Outcome
from jaren_jobs.worker import JobContext, Worker, WorkerStopped
from jaren_jobs.worker.attempt import Attempt, Ran
from jaren_jobs.worker.pacing import Batch
from jaren_jobs.worker.queue_run_async import run_queue_async

__all__: list[str] = []

T = TypeVar("T")


class _Cancellable(Protocol):
    """A handler's task as its worker tracks it: cancelled when stop's grace period ends."""

    def cancel(self) -> None: ...


class _Host(Protocol):
    """What a queue run needs of its AsyncWorker."""

    _worker: Worker
    _loop: asyncio.AbstractEventLoop
    _lock: threading.Lock
    _running: set[_Cancellable]
    _poster: LoopPoster

    @property
    def name(self) -> str: ...

    @property
    def handlers(self) -> Mapping[str, object]:
        """The handlers the worker calls, by kind (an async one wrapped)."""
        ...

    def _handler_cancelled(self, ctx: JobContext) -> Exception:
        """The error a handler's cancelled task records (a ``HandlerCancelled``)."""
        ...


class _LoopHandler:
    """A handler that the thread worker calls and a queue run awaits on the loop (the
    AsyncWorker's wrapper of an ``async def`` handler derives from this)."""


# the worker whose handler this task runs (or a task that handler made): its stop() is refused
_HANDLER_OF: contextvars.ContextVar[_Host | None] = contextvars.ContextVar(
    "jaren_jobs_async_handler_of", default=None
)

# the task of the queue run whose context this is: called from that very task (not from a
# handler's task, which copies the context), a handler comes back unawaited
_IN_RUN: contextvars.ContextVar[asyncio.Task[Any] | None] = contextvars.ContextVar(
    "jaren_jobs_async_queue_run", default=None
)


def _on_loop(handlers: Mapping[str, object], kind: str) -> bool:
    """Whether ``kind``'s handler is awaited on the loop (a lookup that raises: no, and
    the thread worker's own lookup fails the attempt)."""
    try:
        return isinstance(handlers.get(kind), _LoopHandler)
    except Exception:
        return False


class _Interrupted(Exception):
    """A plain handler run for a queue run raised KeyboardInterrupt/SystemExit (its
    thread re-raises it once the run is over)."""


class _LoopBatch(Batch):
    """A loop's queue whose jobs a task on the event loop runs: a top-up wakes that task."""

    __slots__ = ("_poster", "_waiter")

    def __init__(self, jobs: list[ClaimedJob], poster: LoopPoster) -> None:
        super().__init__(jobs)
        self._poster = poster
        self._waiter: asyncio.Future[None] | None = None

    def topped_up(self, jobs: list[ClaimedJob]) -> None:
        with self.cond:
            self.jobs.extend(jobs)
            self.refill = False
            self.cond.notify_all()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._poster.post(functools.partial(_wake_waiter, waiter))

    async def refilled(self) -> bool:
        """On the loop: wait for the top-up under way (if any); whether a job is queued now."""
        with self.cond:
            if not self.refill or self.jobs:
                return bool(self.jobs)
            waiter = self._waiter = asyncio.get_running_loop().create_future()
        await waiter
        with self.cond:
            return bool(self.jobs)


def _wake_waiter(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _Pending:
    """An ``async def`` handler's coroutine, as the thread worker's ``_call`` returned it
    inside a queue run: the run awaits it in a task of its own (cancelled when the job
    is cancelled or its lease lost, or when stop's grace period ends)."""

    __slots__ = (
        "_called_in",
        "_cancelling",
        "_context",
        "_coroutine",
        "_task",
        "_worker",
        "run_cancelled",
    )

    def __init__(
        self, worker: _Host, coroutine: Coroutine[Any, Any, Any], context: JobContext
    ) -> None:
        self.run_cancelled = False
        self._cancelling = False  # the worker cancelled the handler's task
        self._worker = worker
        self._coroutine = coroutine
        self._context = context
        # the context the handler was called in (the attempt's span current, SPEC §17):
        # its task runs in it, as a plain handler runs in the caller's
        self._called_in = contextvars.copy_context()
        self._task: asyncio.Task[Any] | None = None

    async def run(self, attempt: Attempt) -> Ran:
        """On the loop: the handler's task, awaited; what it returned or raised.

        A KeyboardInterrupt/SystemExit it raised comes out as is (asyncio has
        already let it out of the loop once).
        """
        worker = self._worker
        ctx = self._context
        # the context it was called in (copied into the task) already marks it as this
        # worker's handler
        task = self._called_in.run(worker._loop.create_task, self._coroutine)
        self._task = task
        with worker._lock:
            worker._running.add(self)
        unsubscribe = ctx.signal.add_callback(self._on_abort)
        try:
            result = await task
        except asyncio.CancelledError as exc:
            # not cancelled by the worker: the run itself was (its loop shutting down),
            # and the handler's task with it; the attempt still settles, then the run ends
            self.run_cancelled = not self._cancelling
            error = worker._handler_cancelled(ctx)
            error.__cause__ = exc
            attempt.error = error
            return (attempt, error, None)
        except Exception as exc:
            attempt.error = exc
            return (attempt, exc, None)
        finally:
            unsubscribe()
            with worker._lock:
                worker._running.discard(self)
        return (attempt, None, result)

    def _on_abort(self) -> None:
        # any thread. A stop only asks (the grace period); a cancel or a lost lease
        # ends the task now
        if not isinstance(self._context.signal.reason, WorkerStopped):
            self.cancel()

    def cancel(self) -> None:
        """From any thread: the handler's task is cancelled (on the loop)."""
        self._worker._poster.post(self._cancel_task)

    def _cancel_task(self) -> None:
        if self._task is not None and not self._task.done():
            self._cancelling = True
            self._task.cancel()


class _QueueRun:
    """One loop's queue of leased jobs, run by a task on the event loop.

    The thread worker's queue run — the same algorithm, its asyncio twin
    (:func:`~jaren_jobs.worker.queue_run_async.run_queue_async`) — with the steps
    implemented here: an ``async def`` handler is awaited on the loop (no thread
    waits for each job), a top-up is awaited, and what must block — a plain
    handler, a wait for room at the settling thread, the hand-back of unstarted
    jobs — runs on the loop thread that handed the queue over, which waits in
    :meth:`serve` for the run to end.
    """

    def __init__(self, worker: _Host, jobs: list[ClaimedJob]) -> None:
        self._aworker = worker
        inner = worker._worker
        self._claims = inner.claims
        self._runner = inner.runner
        self._settler = inner.settler
        self._halt = inner.tracker.halt.signal
        self._thread = CallerThread(f"{worker.name}-run")
        self._batch = _LoopBatch(jobs, worker._poster)
        self._rest: list[ClaimedJob] = []
        self._interrupt: BaseException | None = None
        self._cancelled = False  # the run's task was cancelled while a handler ran

    def serve(self) -> None:
        """On the loop thread that claimed the jobs: hand them to the loop, serve the
        run's blocking calls until it ends, then hand back what it did not start."""
        aworker = self._aworker
        batch = self._batch
        self._claims.add_batch(batch)
        try:
            aworker._poster.post(self._start)
            self._thread.serve(aworker._loop.is_closed)
        finally:
            # a top-up still on its way is handed back with the rest
            rest = self._rest + batch.close()
            self._claims.discard_batch(batch)
            self._claims.hand_back(rest)
        if self._interrupt is not None:
            raise self._interrupt  # as the thread worker's loop, this thread ends with it

    def _start(self) -> None:
        try:
            self._aworker._loop.create_task(self._run())
        except BaseException:
            self._thread.release()
            raise

    async def _run(self) -> None:
        _IN_RUN.set(asyncio.current_task())
        _HANDLER_OF.set(self._aworker)  # copied into each handler's task
        try:
            await run_queue_async(
                self,
                self._batch,
                self._rest,
                claims=self._claims,
                runner=self._runner,
                halt=self._halt,
            )
        except _Interrupted:
            pass  # the plain handler's thread abandoned the attempt; it re-raises
        finally:
            self._thread.release()

    # ------------------------------------------------------------ the queue run's steps

    async def wait_refill(self, batch: Batch) -> bool:
        return await self._batch.refilled()

    async def run(self, attempt: Attempt, batch: Batch) -> None:
        if not _on_loop(self._aworker.handlers, attempt.claimed.kind):
            # a plain handler, on the thread that handed the queue over: it runs
            # and settles there, to the end even if this run is cancelled meanwhile
            await self._thread.submit(functools.partial(self._plain, attempt, batch))
            return
        ran: list[Ran] = []
        try:
            outcome = await self._call(attempt, ran)
        finally:
            batch.returned()
        if outcome is not None:
            self._runner.end(attempt, outcome)
        else:
            await self._post(ran.pop())
        if self._cancelled:
            raise asyncio.CancelledError  # the run's own, taken by its handler's await

    async def _call(self, attempt: Attempt, ran: list[Ran]) -> Outcome | None:
        runner = self._runner
        before = self._claims.spent
        began = time.perf_counter()
        outcome = runner.call(attempt, ran)  # its handler comes back unawaited: a _Pending
        if outcome is not None:
            return outcome
        _, error, pending = ran[-1]
        if error is None and isinstance(pending, _Pending):
            try:
                ran[-1] = await pending.run(attempt)
                self._cancelled = pending.run_cancelled
            except BaseException as exc:
                # only a handler's KeyboardInterrupt/SystemExit gets here
                ran.pop()
                abandon = functools.partial(runner.abandon, attempt, exc)
                runner.end(attempt, await self._unlocked(attempt, abandon))
                self._interrupt = exc
                raise _Interrupted from exc
            finally:
                # the handler's running time, for the pacing (the call measured none)
                self._claims.remeasured(before, time.perf_counter() - began)
        return None

    def _plain(self, attempt: Attempt, batch: Batch) -> None:
        # the thread worker's step for one job, on the thread that handed the queue over
        runner = self._runner
        ran: list[Ran] = []
        try:
            outcome = runner.call(attempt, ran)
        except BaseException as exc:
            # only a handler's KeyboardInterrupt/SystemExit gets here
            runner.end(attempt, runner.abandon(attempt, exc))
            self._interrupt = exc
            raise _Interrupted from exc
        finally:
            batch.returned()
        if outcome is not None:
            runner.end(attempt, outcome)
        else:
            self._settler.post(ran.pop())

    async def _unlocked(self, attempt: Attempt, step: Callable[[], T]) -> T:
        """``step()``, which takes ``attempt.lease_lock``: on the loop, unless a renewal
        holds the lock across its write (a task on this loop, when async-native), in
        which case it waits for the fresh lease off the loop."""
        if attempt.lease_lock.locked():
            return await self._thread.submit(step)
        return step()

    async def _post(self, ran: Ran) -> None:
        settler = self._settler
        entry = await self._unlocked(ran[0], functools.partial(settler.prepare, *ran))
        full = settler.enter_posted(entry)
        if full is None:
            # a handler that outlived stop(): its settlement is refused, by name
            await self._thread.submit(functools.partial(settler.settle_entries, [entry]))
        elif full:
            await self._thread.submit(settler.wait_for_room)
