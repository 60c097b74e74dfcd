"""``AsyncWorker`` (SPEC §11): §7's worker, with ``async def`` handlers awaited on the loop.

The worker's machinery — claims, batching and group commit, renewals,
exactly one outcome per attempt, bounded drain, quiescence — is the thread
worker's, shared rather than copied. What changes is where a handler runs:

* a started worker's loop thread that claims a batch whose first job has an
  ``async def`` handler hands the whole batch to the event loop that created
  the worker: one task (``queue_run._QueueRun``) runs it as the thread worker's
  loop would, awaiting each handler in that task (in a context of its own,
  no task per job) and posting each result to the settling thread, with no
  thread waiting per job. The thread waits for the batch to end, running what
  must block (a plain handler, a wait for the settling thread, the hand-back of
  unstarted jobs);
* ``run_once()`` (and a batch whose first job is plain) runs on a thread: an
  ``async def`` handler is then handed to the loop as a task, and the thread
  waits for it (:class:`_HandlerRun`);
* a plain handler runs on a worker's thread, as in §7, never on the loop.

The task running the handler is cancelled (at the handler's await, for the
handler alone) when its job is cancelled or its lease is
lost (its ``ctx.signal`` aborts with that reason), and when ``stop()``'s grace
period ends with it still running — not when ``stop()`` begins: a stop asks
handlers to wind up (``ctx.signal``) and gives them the grace period.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from jaren_jobs.aio.queue_run import (
    _HANDLER_OF,
    _Cancellable,
    _LoopHandler,
    _on_loop,
    _Pending,
    _QueueRun,
)
from jaren_jobs.aio.renewals import LoopRenewals, renew_on_loop, renew_on_thread
from jaren_jobs.aio.runner import AsyncCheckpointStore, LoopPoster, ThreadRunner
from jaren_jobs.jobs import Jobs, worker_for_host
from jaren_jobs.records import ClaimedJob, Lease, StopOutcome, WorkerStats
from jaren_jobs.signals import Signal
from jaren_jobs.worker import JobContext, Worker, WorkerStopped, is_async
from jaren_jobs.worker.renewals import RenewalScheduler, Renewer

if TYPE_CHECKING:
    from jaren_jobs.backend_async import AsyncJobsSession

__all__ = ["AsyncJobContext", "AsyncWorker", "HandlerCancelled"]


class HandlerCancelled(Exception):
    """An ``async def`` handler's task was cancelled (its job cancelled, its lease lost,
    or stop's grace period over): what the attempt records as the handler's error."""


def _why(reason: object) -> str:
    if reason is None:
        return "stop()'s grace period ended"
    return str(reason)


class AsyncJobContext:
    """What an ``async def`` handler gets besides the payload (``handler(payload, ctx)``).

    As §7's context: ``job``, ``lease`` (follows renewals), ``signal``, ``owner``;
    ``checkpoints`` is the attempt's checkpoint store, awaited
    (:class:`~jaren_jobs.AsyncCheckpointStore`).
    """

    __slots__ = ("_checkpoints", "_context", "_runner")

    def __init__(self, context: JobContext, runner: ThreadRunner) -> None:
        self._context = context
        self._runner = runner
        self._checkpoints: AsyncCheckpointStore | None = None

    @property
    def job(self) -> ClaimedJob:
        return self._context.job

    @property
    def lease(self) -> Lease:
        return self._context.lease

    @property
    def signal(self) -> Signal:
        return self._context.signal

    @property
    def owner(self) -> str:
        return self._context.owner

    @property
    def checkpoints(self) -> AsyncCheckpointStore:
        if self._checkpoints is None:
            self._checkpoints = AsyncCheckpointStore(self._context.checkpoints, self._runner)
        return self._checkpoints

    def __repr__(self) -> str:
        return f"<AsyncJobContext job={self.job.id!r} attempt={self.job.lease.attempt}>"


def _wrap(worker: AsyncWorker, kind: str, handler: Any) -> Any:
    """What the thread worker calls for ``handler``: itself if plain, else a waiter."""
    if not is_async(handler):
        return handler
    target = handler
    while isinstance(target, functools.partial):
        target = target.func
    call = target if inspect.isroutine(target) else type(target).__call__
    if inspect.isasyncgenfunction(call):
        raise TypeError(
            f"create_worker(): the handler for kind {kind!r} is an async generator; a "
            "handler returns its result (async def handler(payload, ctx): ... return value)"
        )
    return _OnLoop(worker, handler)


class _OnLoop(_LoopHandler):
    """A plain handler (what the thread worker calls) that runs a coroutine handler on
    the loop and waits for it from the worker's thread."""

    def __init__(self, worker: AsyncWorker, handler: Callable[..., Coroutine[Any, Any, Any]]):
        self._worker = worker
        self._handler = handler

    def __call__(self, payload: Any, ctx: JobContext) -> Any:
        worker = self._worker
        actx = AsyncJobContext(ctx, worker._runner)
        if threading.get_ident() == worker._loop_ident:
            run = worker._calling
            if run is not None:
                # called by the thread worker's _call inside a queue run's step: the run
                # awaits the handler itself, in its task (no thread waits for it)
                return _Pending(worker, self._handler(payload, actx), ctx, run)
        if worker._loop.is_closed():
            raise RuntimeError(
                f"the event loop of worker {worker.owner!r} is closed: its async handlers "
                "cannot run (stop the worker before its loop ends)"
            )
        running = _HandlerRun(worker, self._handler(payload, actx))
        with worker._lock:
            worker._running.add(running)
        # handed to the loop with the other threads' hand-offs of the moment, one wake-up
        worker._poster.post(running.start)

        def on_abort() -> None:
            # a stop only asks (the grace period); a cancel or a lost lease ends the task now
            if not isinstance(ctx.signal.reason, WorkerStopped):
                running.cancel()

        unsubscribe = ctx.signal.add_callback(on_abort)
        try:
            return running.result()
        except concurrent.futures.CancelledError as exc:
            # an Exception, not asyncio's BaseException: the attempt ends as any handler
            # error does (its outcome says cancelled or lost, from the signal's reason)
            raise worker._handler_cancelled(ctx) from exc
        finally:
            unsubscribe()
            with worker._lock:
                worker._running.discard(running)


class _HandlerRun:
    """One async handler's task, as the worker's thread that claimed the job waits for it.

    Lighter than ``run_coroutine_threadsafe``'s chained futures: the task is made
    on the loop by :meth:`start` (posted with other hand-offs), its end sets an
    event the thread waits on, and :meth:`cancel` (any thread) cancels the task —
    or, if it has not started yet, closes the coroutine unrun.
    """

    __slots__ = ("_cancelled", "_coroutine", "_done", "_outcome", "_task", "_worker")

    def __init__(self, worker: AsyncWorker, coroutine: Coroutine[Any, Any, Any]) -> None:
        self._worker = worker
        self._coroutine: Coroutine[Any, Any, Any] | None = coroutine
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False
        self._done = threading.Event()
        self._outcome: tuple[bool, Any] = (False, None)

    def start(self) -> None:
        """On the loop: the handler's task begins (unless it was cancelled first)."""
        coroutine, self._coroutine = self._coroutine, None
        assert coroutine is not None
        if self._cancelled:
            coroutine.close()  # never started: closed, so it is not reported "never awaited"
            self._end(False, concurrent.futures.CancelledError())
            return
        task = self._worker._loop.create_task(self._worker._as_handler_task(coroutine))
        self._task = task
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            self._end(False, concurrent.futures.CancelledError())
            return
        error = task.exception()
        self._end(error is None, task.result() if error is None else error)

    def _end(self, ok: bool, value: Any) -> None:
        self._outcome = (ok, value)
        self._done.set()

    def cancel(self) -> None:
        """From any thread: the task is cancelled (on the loop)."""
        self._cancelled = True
        self._worker._poster.post(self._cancel_task)

    def _cancel_task(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def result(self) -> Any:
        """From the worker's thread: what the handler returned, or its error, once it ended."""
        self._done.wait()
        ok, value = self._outcome
        if ok:
            return value
        raise value


class AsyncWorker:
    """A worker for an :class:`~jaren_jobs.AsyncStore` (SPEC §11): ``await worker.start()``,
    ``await worker.stop()``, ``await worker.run_once()``, ``async with worker``."""

    def __init__(
        self,
        jobs: Jobs,
        runner: ThreadRunner,
        handlers: Mapping[str, Callable[..., Any]],
        options: Mapping[str, Any],
        session: AsyncJobsSession | None = None,
    ) -> None:
        if not isinstance(handlers, Mapping):
            raise TypeError(
                f"create_worker() needs a mapping of kinds to handlers, got "
                f"{type(handlers).__name__}"
            )
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "create_worker() of an AsyncStore is called from a coroutine: its async "
                "handlers run on that event loop"
            ) from None
        self._loop_ident = threading.get_ident()  # the loop's thread (it runs this)
        self._runner = runner
        self._lock = threading.Lock()
        self._running: set[_Cancellable] = set()
        self._calling: asyncio.Task[Any] | None = None  # see queue_run._Host
        self._grace_over = False  # see queue_run._Host
        self._poster = LoopPoster(self._loop)
        self._runner_session = session
        wrapped = {kind: _wrap(self, kind, handler) for kind, handler in handlers.items()}
        # this AsyncWorker hosts the thread worker's queue runs (on the loop), its
        # renewals (a task on the loop) and its grace end (the handlers' tasks cancelled)
        self._worker: Worker = worker_for_host(jobs, wrapped, self, **options)
        self._native = session is not None

    # ------------------------------------------------------------ the worker's host

    @property
    def handlers(self) -> Mapping[str, object]:
        """The handlers the thread worker calls, by kind (an async one wrapped)."""
        return self._worker.runner.handlers

    def renewal_scheduler(self, renewer: Renewer) -> RenewalScheduler:
        """Renewals are a task on the loop (awaited through the async-native store's
        session, when there is one), not a thread."""
        session = self._runner_session
        renew = (
            renew_on_thread(renewer, self._runner)
            if session is None
            else renew_on_loop(renewer, session)
        )
        return LoopRenewals(
            renewer,
            handlers=lambda: self.handlers,
            name=renewer.name,
            loop=self._loop,
            post=self._poster.post,
            renew=renew,
            tick_seconds=renewer.every / 4,
        )

    def grace_ended(self) -> None:
        """The grace period is over: cancel the tasks before the worker bars them, so each
        raises while it may still settle and its job is handed back."""
        self._cancel_running()

    def run_queue(self, jobs: list[ClaimedJob]) -> bool | None:
        """A started worker's loop hands its queue here: one whose first job has an
        ``async def`` handler is run by a task on the loop (see :class:`_QueueRun`); this
        thread waits for it, serving what must not run on the loop. None: the thread
        worker runs it; else whether the run ended on a top-up that found nothing."""
        if not _on_loop(self.handlers, jobs[0].kind) or self._loop.is_closed():
            return None
        return _QueueRun(self, jobs).serve()

    # ------------------------------------------------------------ what §7 reads

    @property
    def worker(self) -> Worker:
        """The thread worker underneath (its claims, renewals and settlements)."""
        return self._worker

    @property
    def owner(self) -> str:
        return self._worker.owner

    @property
    def name(self) -> str:
        return self._worker.name

    @property
    def kinds(self) -> list[str]:
        return self._worker.kinds

    @property
    def running(self) -> bool:
        return self._worker.running

    @property
    def interrupted(self) -> BaseException | None:
        """What halted the worker from inside (a BaseException from an observer), or None."""
        return self._worker.interrupted

    def stats(self) -> WorkerStats:
        return self._worker.stats()

    def leases(self) -> list[Lease]:
        return self._worker.leases()

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> AsyncWorker:
        """Start the worker's loops (idempotent)."""
        await self._runner.run(self._worker.start)
        return self

    async def run_once(self) -> bool:
        """Claim and run at most one job (its handler awaited on this loop); True if one ran."""
        return await asyncio.to_thread(self._worker.run_once)

    def _handler_cancelled(self, ctx: JobContext) -> Exception:
        """The error a handler's cancelled task records, with its reason."""
        return HandlerCancelled(
            f"the handler's task for job {ctx.job.id!r} was cancelled: {_why(ctx.signal.reason)}"
        )

    async def _as_handler_task(self, handler: Coroutine[Any, Any, Any]) -> Any:
        # marks the handler's task, and the tasks it makes (they copy its context)
        _HANDLER_OF.set(self)
        return await handler

    async def stop(self, grace_seconds: float | None = None) -> StopOutcome:
        """Stop: handlers get the grace period to wind up (``ctx.signal``); the tasks of
        those still running then are cancelled. Quiescent when it returns (§7).

        Awaited by one of this worker's own handlers it is a ``RuntimeError``, as
        the thread worker's ``stop()`` from its own threads is: it would wait for
        the very handler that awaits it, for the whole grace period.
        """
        if _HANDLER_OF.get() is self:
            raise RuntimeError(
                "stop() was awaited by one of this worker's own handlers, which stop() "
                "would wait for; return from the handler instead, or stop the worker "
                "from another task"
            )
        stopping = asyncio.ensure_future(asyncio.to_thread(self._worker.stop, grace_seconds))
        try:
            outcome = await asyncio.shield(stopping)
        except asyncio.CancelledError:
            await asyncio.wait({stopping})  # never leave a stop half done
            raise
        finally:
            self._cancel_running()
        return outcome

    def _cancel_running(self) -> None:
        with self._lock:
            self._grace_over = True  # and a handler of a queue run that suspends later
            running, self._running = list(self._running), set()
        for future in running:
            future.cancel()

    async def __aenter__(self) -> AsyncWorker:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def __repr__(self) -> str:
        return f"<jaren_jobs.AsyncWorker {self.owner!r} running={self.running}>"
