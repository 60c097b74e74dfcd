"""``AsyncWorker`` (SPEC §11): §7's worker, with ``async def`` handlers awaited on the loop.

The worker's machinery — claims, batching and group commit, renewals,
exactly one outcome per attempt, bounded drain, quiescence — is the thread
worker's, shared rather than copied. What changes is where a handler runs:

* a started worker's loop thread that claims a batch whose first job has an
  ``async def`` handler hands the whole batch to the event loop that created
  the worker: one task (:class:`_QueueRun`) runs it as the thread worker's
  loop would, awaiting each handler in a task of its own and posting each
  result to the settling thread, with no thread waiting per job. The thread
  waits for the batch to end, running what must block (a plain handler, a
  wait for the settling thread, the hand-back of unstarted jobs);
* ``run_once()`` (and a batch whose first job is plain) runs on a thread: an
  ``async def`` handler is then handed to the loop as a task, and the thread
  waits for it (:class:`_HandlerRun`);
* a plain handler runs on a worker's thread, as in §7, never on the loop.

The handler's task is cancelled when its job is cancelled or its lease is
lost (its ``ctx.signal`` aborts with that reason), and when ``stop()``'s grace
period ends with it still running — not when ``stop()`` begins: a stop asks
handlers to wind up (``ctx.signal``) and gives them the grace period.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .arenewals import LoopRenewals, renew_on_loop, renew_on_thread
from .arunner import AsyncCheckpointStore, CallerThread, LoopPoster, ThreadRunner
from .records import ClaimedJob, Lease, Outcome, StopOutcome, WorkerStats
from .signals import Signal
from .store import Jobs
from .worker import JobContext, Worker, WorkerStopped, is_async
from .worker.attempt import _Attempt, _Ran
from .worker.pacing import _Batch, averaged

if TYPE_CHECKING:
    from .abackend import AsyncJobsSession

__all__ = ["AsyncJobContext", "AsyncWorker", "HandlerCancelled"]


# the worker whose handler this task runs (or a task that handler made): its stop() is refused
_HANDLER_OF: contextvars.ContextVar[AsyncWorker | None] = contextvars.ContextVar(
    "jaren_jobs_async_handler_of", default=None
)


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


class _OnLoop:
    """A plain handler (what the thread worker calls) that runs a coroutine handler on
    the loop and waits for it from the worker's thread."""

    def __init__(self, worker: AsyncWorker, handler: Callable[..., Coroutine[Any, Any, Any]]):
        self._worker = worker
        self._handler = handler

    def __call__(self, payload: Any, ctx: JobContext) -> Any:
        worker = self._worker
        actx = AsyncJobContext(ctx, worker._runner)
        if (
            threading.get_ident() == worker._loop_ident
            and _IN_RUN.get() is asyncio.current_task(worker._loop) is not None
        ):
            # called by the thread worker's _call inside a queue run on the loop: the
            # run awaits the handler itself (no thread waits for it)
            return _Pending(worker, self._handler(payload, actx), ctx)
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
            raise HandlerCancelled(
                f"the handler's task for job {ctx.job.id!r} was cancelled: "
                f"{_why(ctx.signal.reason)}"
            ) from exc
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


# the task of the queue run whose context this is: called from that very task (not from a
# handler's task, which copies the context), a handler comes back unawaited
_IN_RUN: contextvars.ContextVar[asyncio.Task[Any] | None] = contextvars.ContextVar(
    "jaren_jobs_async_queue_run", default=None
)


def _on_loop(worker: Worker, kind: str) -> bool:
    """Whether ``kind``'s handler is awaited on the loop (a lookup that raises: no, and
    the thread worker's own lookup fails the attempt)."""
    try:
        return isinstance(worker._handlers.get(kind), _OnLoop)
    except Exception:
        return False


class _Interrupted(Exception):
    """A plain handler run for a queue run raised KeyboardInterrupt/SystemExit (its
    thread re-raises it once the run is over)."""


class _LoopBatch(_Batch):
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

    __slots__ = ("_cancelling", "_context", "_coroutine", "_task", "_worker", "run_cancelled")

    def __init__(
        self, worker: AsyncWorker, coroutine: Coroutine[Any, Any, Any], context: JobContext
    ) -> None:
        self.run_cancelled = False
        self._cancelling = False  # the worker cancelled the handler's task
        self._worker = worker
        self._coroutine = coroutine
        self._context = context
        self._task: asyncio.Task[Any] | None = None

    async def run(self, attempt: _Attempt) -> _Ran:
        """On the loop: the handler's task, awaited; what it returned or raised.

        A KeyboardInterrupt/SystemExit it raised comes out as is (asyncio has
        already let it out of the loop once).
        """
        worker = self._worker
        ctx = self._context
        # the run's context (copied into the task) already marks it as this worker's handler
        task = worker._loop.create_task(self._coroutine)
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
            error = HandlerCancelled(
                f"the handler's task for job {ctx.job.id!r} was cancelled: "
                f"{_why(ctx.signal.reason)}"
            )
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

    The thread worker's ``_run_queue``, step for step (its bookkeeping is the
    worker's own: ``_begin``, ``_call``, ``_top_up``, ``_end``, the settling
    thread), except where it would block: an ``async def`` handler is awaited
    on the loop (no thread waits for each job), a top-up is awaited, and what
    must block — a plain handler, a wait for room at the settling thread, the
    hand-back of unstarted jobs — runs on the loop thread that handed the
    queue over, which waits in :meth:`serve` for the run to end.
    """

    def __init__(self, worker: AsyncWorker, jobs: list[ClaimedJob]) -> None:
        self._aworker = worker
        self._thread = CallerThread(f"{worker.name}-run")
        self._batch = _LoopBatch(jobs, worker._poster)
        self._rest: list[ClaimedJob] = []
        self._interrupt: BaseException | None = None
        self._cancelled = False  # the run's task was cancelled while a handler ran

    def serve(self) -> None:
        """On the loop thread that claimed the jobs: hand them to the loop, serve the
        run's blocking calls until it ends, then hand back what it did not start."""
        aworker = self._aworker
        worker = aworker._worker
        batch = self._batch
        with worker._lock:
            worker._batches.add(batch)
        try:
            aworker._poster.post(self._start)
            self._thread.serve(aworker._loop.is_closed)
        finally:
            # a top-up still on its way is handed back with the rest
            rest = self._rest + batch.close()
            with worker._lock:
                worker._batches.discard(batch)
            worker._hand_back(rest)
        if self._interrupt is not None:
            raise self._interrupt  # as the thread worker's loop, this thread ends with it

    def _start(self) -> None:
        try:
            self._aworker._loop.create_task(self._run())
        except BaseException:
            self._thread.release()
            raise

    async def _run(self) -> None:
        aworker = self._aworker
        worker = aworker._worker
        batch = self._batch
        _IN_RUN.set(asyncio.current_task())
        _HANDLER_OF.set(aworker)  # copied into each handler's task
        ran: list[_Ran] = []
        first = True
        try:
            while True:
                if not first and worker._halt.aborted:
                    break
                claimed = batch.take()
                if claimed is None:
                    if batch.stalled or worker._halt.aborted:
                        break
                    if not batch.refill and not worker._top_up(batch, idle=True):
                        break
                    if await batch.refilled():
                        continue
                    break
                if not first and worker._waited_too_long(claimed):
                    self._rest.append(claimed)
                    worker._ramp = 0  # a slow job hid among fast ones: start small again
                    break
                first = False
                attempt = worker._begin(claimed)
                if attempt is None:
                    continue  # cancelled before it started
                worker._top_up(batch)  # the next jobs come while this one runs
                if not _on_loop(worker, claimed.kind):
                    # a plain handler, on the thread that handed the queue over: it runs
                    # and settles there, to the end even if this run is cancelled meanwhile
                    await self._thread.submit(functools.partial(self._plain, attempt, batch))
                    continue
                try:
                    outcome = await self._call(attempt, ran)
                finally:
                    batch.returned()
                if outcome is not None:
                    worker._end(attempt, outcome)
                else:
                    await self._post(ran.pop())
                if self._cancelled:
                    raise asyncio.CancelledError  # the run's own, taken by its handler's await
            if batch.stalled:
                worker._ramp = 0
        except _Interrupted:
            pass  # the plain handler's thread abandoned the attempt; it re-raises
        finally:
            self._thread.release()

    async def _call(self, attempt: _Attempt, ran: list[_Ran]) -> Outcome | None:
        worker = self._aworker._worker
        before = worker._spent
        began = time.perf_counter()
        outcome = worker._call(attempt, ran)  # its handler comes back unawaited: a _Pending
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
                if attempt.lease_lock.locked():  # held by a renewal: see _post
                    abandon = functools.partial(worker._abandon, attempt, exc)
                    worker._end(attempt, await self._thread.submit(abandon))
                else:
                    worker._end(attempt, worker._abandon(attempt, exc))
                self._interrupt = exc
                raise _Interrupted from exc
            finally:
                # the handler's running time, for the pacing (the _call measured none)
                worker._spent = averaged(before, time.perf_counter() - began)
        return None

    def _plain(self, attempt: _Attempt, batch: _Batch) -> None:
        # the thread worker's step for one job, on the thread that handed the queue over
        worker = self._aworker._worker
        ran: list[_Ran] = []
        try:
            outcome = worker._call(attempt, ran)
        except BaseException as exc:
            # only a handler's KeyboardInterrupt/SystemExit gets here
            worker._end(attempt, worker._abandon(attempt, exc))
            self._interrupt = exc
            raise _Interrupted from exc
        finally:
            batch.returned()
        if outcome is not None:
            worker._end(attempt, outcome)
        else:
            worker._post(ran.pop())

    async def _post(self, ran: _Ran) -> None:
        worker = self._aworker._worker
        if ran[0].lease_lock.locked():
            # a renewal (a task on this loop, when async-native) holds it across its
            # write: the settlement waits for the fresh lease off the loop
            entry = await self._thread.submit(functools.partial(worker._prepare, *ran))
        else:
            entry = worker._prepare(*ran)
        full = worker._enter_posted(entry)
        if full is None:
            # a handler that outlived stop(): its settlement is refused, by name
            await self._thread.submit(functools.partial(worker._settle_entries, [entry]))
        elif full:
            await self._thread.submit(worker._wait_for_room)


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
        self._running: set[_HandlerRun | _Pending] = set()
        self._poster = LoopPoster(self._loop)
        wrapped = {kind: _wrap(self, kind, handler) for kind, handler in handlers.items()}
        self._worker: Worker = jobs.create_worker(wrapped, **options)
        # the grace period over: cancel the tasks before the worker bars them, so
        # each raises while it may still settle and its job is handed back
        self._worker._on_grace_end = self._cancel_running
        # a started worker's loops hand their queues of async jobs to the loop
        self._worker._run_queue = self._run_queue  # type: ignore[method-assign]
        # renewals are a task on the loop (awaited through ``session`` when the store is
        # async-native), not a thread
        worker = self._worker
        self._native = session is not None
        renew = (
            renew_on_thread(worker, runner) if session is None else renew_on_loop(worker, session)
        )
        worker._renewals = LoopRenewals(
            worker, self._loop, self._poster.post, renew, worker._renew_every / 4
        )

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

    async def _as_handler_task(self, handler: Coroutine[Any, Any, Any]) -> Any:
        # marks the handler's task, and the tasks it makes (they copy its context)
        _HANDLER_OF.set(self)
        return await handler

    # ------------------------------------------------------------ queue runs on the loop

    def _run_queue(self, jobs: list[ClaimedJob]) -> None:
        """The thread worker's ``_run_queue`` for this worker: a queue whose first job has
        an ``async def`` handler is run by a task on the loop (see :class:`_QueueRun`);
        this thread waits for it, serving what must not run on the loop."""
        worker = self._worker
        if not _on_loop(worker, jobs[0].kind) or self._loop.is_closed():
            Worker._run_queue(worker, jobs)
            return
        _QueueRun(self, jobs).serve()

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
