"""An ``AsyncWorker``'s queue run (SPEC §11): a claimed batch of async jobs, run on the loop.

A started AsyncWorker's loop thread that claims a batch whose first job has
an ``async def`` handler hands the whole batch to the event loop: one task
(:class:`_QueueRun`) runs it as the thread worker's loop would, awaiting each
handler in that task, in a context of its own (:class:`_Pending`: no task per
job), and posting each result to the settling thread, with no thread waiting
per job. The thread waits for the
batch to end, running what must block (a plain handler, a wait for the
settling thread, the hand-back of unstarted jobs).

``aio.worker`` imports this module, not the reverse: what the run needs of its
worker is typed by :class:`_Host`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Generator, Mapping
from typing import Any, Protocol, TypeVar

from jaren_jobs.aio.runner import CallerThread, LoopPoster
from jaren_jobs.records import ClaimedJob
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
    #: stop's grace period has ended: a handler that suspends from now on is cancelled
    _grace_over: bool
    #: the queue run's task whose step is calling a handler now (on the loop's thread):
    #: the handler comes back unawaited, for that run to await
    _calling: asyncio.Task[Any] | None

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


def _on_loop(handlers: Mapping[str, object], kind: str) -> bool:
    """Whether ``kind``'s handler is awaited on the loop (a lookup that raises: no, and
    the thread worker's own lookup fails the attempt)."""
    try:
        return isinstance(handlers.get(kind), _LoopHandler)
    except Exception:
        return False


class _Interrupted(Exception):
    """A handler run for a queue run raised KeyboardInterrupt/SystemExit (the loop
    thread that handed the queue over re-raises it once the run is over)."""

    def __init__(self, on_loop: bool) -> None:
        super().__init__()
        self.on_loop = on_loop  # an async handler's: it leaves the event loop too


# the longest a queue run keeps the loop while its handlers never suspend: then it
# yields, so the loop's other tasks (and the other runs) get their turn between jobs
_SLICE_SECONDS = 0.0002


def _retrieved(task: asyncio.Task[Any]) -> None:
    # a queue run's task that let a handler's KeyboardInterrupt/SystemExit out of the
    # loop: its exception is the loop thread's to re-raise, not one never retrieved
    if not task.cancelled():
        task.exception()


class _LoopBatch(Batch):
    """A loop's queue whose jobs a task on the event loop runs: a top-up wakes that task."""

    __slots__ = ("_poster", "_waiter")

    def __init__(self, jobs: list[ClaimedJob], poster: LoopPoster) -> None:
        super().__init__(jobs)
        self._poster = poster
        self._waiter: asyncio.Future[None] | None = None

    def topped_up(self, jobs: list[ClaimedJob], *, dry: bool = False) -> None:
        with self.cond:
            self.jobs.extend(jobs)
            self.refill, self.dry = False, dry
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


def _nothing() -> None:
    pass


def _wake_waiter(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _Pending:
    """An ``async def`` handler's coroutine, as the thread worker's ``_call`` returned it
    inside a queue run: the run's task awaits it (``await pending``), stepping it in a
    context of its own — no task per handler. Its task (the run's) is cancelled while
    it runs when the job is cancelled or its lease lost, or when stop's grace period
    ends; the cancellation stays the handler's.

    A task per handler cost a task, a callback and a wake-up of the run's task per job
    (measured: a third of the loop's time on no-op jobs). The handler sees what a task
    of its own would give it: it runs in a copy of the context it was called in (its
    changes stay its own; tasks it makes copy it); a cancellation lands at its await
    (``asyncio.timeout`` and task groups work on the run's task, which runs nothing
    else meanwhile); its exception or result is the attempt's.
    """

    __slots__ = (
        "_called_in",
        "_cancels",
        "_context",
        "_coroutine",
        "_running",
        "_task",
        "_unsubscribe",
        "_worker",
        "run_cancelled",
        "suspended",
    )

    def __init__(
        self,
        worker: _Host,
        coroutine: Coroutine[Any, Any, Any],
        context: JobContext,
        task: asyncio.Task[Any],
    ) -> None:
        self.run_cancelled = False
        self.suspended = False  # it awaited something that suspended the run's task
        self._cancels = 0  # cancellations of the run's task the worker asked for it
        self._running = False  # stepping, or suspended in it: a cancellation is its
        self._worker = worker
        self._coroutine = coroutine
        self._context = context
        # the context the handler was called in (the attempt's span current, SPEC §17):
        # it runs in a copy, as a plain handler runs in the caller's
        self._called_in = contextvars.copy_context()
        self._task = task  # the queue run's, which awaits it
        self._unsubscribe: Callable[[], None] = _nothing

    def start(self) -> _Pending:
        """On the loop, in the run's task: the handler runs (the caller awaits this, then
        calls :meth:`ended` whatever it raised)."""
        self._running = True
        return self

    def _track(self) -> None:
        # the handler suspended for the first time: only now can a cancellation reach
        # it (one asked while it stepped would land at this very await, after the step),
        # so only now is it tracked for stop's grace end and subscribed to its signal —
        # a handler that never suspends costs neither
        worker = self._worker
        with worker._lock:
            worker._running.add(self)
            over = worker._grace_over
        self._unsubscribe = self._context.signal.add_callback(self._on_abort)
        if over:
            self.cancel()  # stop's grace period ended while it stepped

    def __await__(self) -> Generator[Any, Any, Any]:
        # what a task's step does, in the handler's context: what the handler awaits,
        # the run's task awaits; what is thrown into that task, the handler gets
        coroutine = self._coroutine
        run = self._called_in.run
        send, throw = coroutine.send, coroutine.throw
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                yielded = run(send, value) if error is None else run(throw, error)
            except StopIteration as stop:
                return stop.value
            if not self.suspended:
                self.suspended = True
                self._track()
            try:
                value, error = (yield yielded), None
            except GeneratorExit:
                run(coroutine.close)  # the run's task is being destroyed
                raise
            except BaseException as exc:
                value, error = None, exc

    def ended(self) -> None:
        """On the loop: the handler is over (or the run stopped waiting for it)."""
        self._running = False
        if self.suspended:
            # unsubscribed, and the cycle through the subscription broken: what the
            # handler held is freed now, not left to the garbage collector
            unsubscribe, self._unsubscribe = self._unsubscribe, _nothing
            unsubscribe()
            worker = self._worker
            with worker._lock:
                worker._running.discard(self)
        if self._cancels and sys.version_info >= (3, 11):
            # the worker's cancellations were the handler's, not the run's
            for _ in range(self._cancels):
                self._task.uncancel()

    def failed(self, attempt: Attempt, exc: BaseException) -> Ran:
        """What the attempt records when awaiting the handler raised ``exc``."""
        if isinstance(exc, asyncio.CancelledError):
            # not cancelled by the worker: the run itself was (its loop shutting down);
            # the attempt still settles, then the run ends
            self.run_cancelled = not self._cancels
            error = self._worker._handler_cancelled(self._context)
            error.__cause__ = exc
            attempt.error = error
            return (attempt, error, None)
        assert isinstance(exc, Exception)
        attempt.error = exc
        return (attempt, exc, None)

    def _on_abort(self) -> None:
        # any thread. A stop only asks (the grace period); a cancel or a lost lease
        # ends the handler now
        if not isinstance(self._context.signal.reason, WorkerStopped):
            self.cancel()

    def cancel(self) -> None:
        """From any thread: the handler is cancelled (on the loop), if it still runs."""
        self._worker._poster.post(self._cancel_task)

    def _cancel_task(self) -> None:
        # on the loop, between steps: if the handler still runs, the run's task is
        # suspended in it, so the cancellation lands at the handler's await
        if self._running and self._task.cancel():
            self._cancels += 1


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
        self._handlers = inner.runner.handlers  # by kind, as the worker calls them
        self._settler = inner.settler
        self._halt = inner.tracker.halt.signal
        self._thread = CallerThread(f"{worker.name}-run")
        self._batch = _LoopBatch(jobs, worker._poster)
        self._rest: list[ClaimedJob] = []
        self._dry = False  # run_queue_async's answer: it ended on a top-up that found nothing
        self._interrupt: BaseException | None = None
        self._cancelled = False  # the run's task was cancelled while a handler ran
        self._resumed = 0.0  # when the run's task last came back from the loop
        self._task: asyncio.Task[Any] | None = None  # the run's, once it runs

    def serve(self) -> bool:
        """On the loop thread that claimed the jobs: hand them to the loop, serve the
        run's blocking calls until it ends, then hand back what it did not start; whether
        the run ended on a top-up that found nothing."""
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
        return self._dry

    def _start(self) -> None:
        try:
            self._aworker._loop.create_task(self._run()).add_done_callback(_retrieved)
        except BaseException:
            self._thread.release()
            raise

    async def _run(self) -> None:
        self._task = asyncio.current_task()
        _HANDLER_OF.set(self._aworker)  # copied into each handler's context
        self._resumed = time.perf_counter()
        try:
            self._dry = await run_queue_async(
                self,
                self._batch,
                self._rest,
                claims=self._claims,
                runner=self._runner,
                halt=self._halt,
            )
        except _Interrupted as interrupted:
            # the attempt is abandoned; the loop thread re-raises it. An async handler's
            # leaves the event loop as well, as it would from a task of its own
            if interrupted.on_loop and self._interrupt is not None:
                raise self._interrupt from None
        finally:
            self._thread.release()

    # ------------------------------------------------------------ the queue run's steps

    async def wait_refill(self, batch: Batch) -> bool:
        refilled = await self._batch.refilled()
        self._resumed = time.perf_counter()
        return refilled

    async def run(self, attempt: Attempt, batch: Batch) -> None:
        # one coroutine per job: this step is the whole of a no-op job's time on the loop
        # (the worker's handlers are a dict of its own: a lookup never raises)
        if not isinstance(self._handlers.get(attempt.claimed.kind), _LoopHandler):
            # a plain handler, on the thread that handed the queue over: it runs
            # and settles there, to the end even if this run is cancelled meanwhile
            await self._thread.submit(functools.partial(self._plain, attempt, batch))
            return
        runner = self._runner
        claims = self._claims
        ran: list[Ran] = []
        try:
            before = claims.spent
            began = time.perf_counter()
            aworker = self._aworker
            aworker._calling = self._task
            try:
                outcome = runner.call(attempt, ran)  # its handler comes back unawaited: a _Pending
            finally:
                aworker._calling = None
            if outcome is None:
                _, error, pending = ran[-1]
                if error is None and isinstance(pending, _Pending):
                    try:
                        try:
                            ran[-1] = (attempt, None, await pending.start())
                        except (Exception, asyncio.CancelledError) as exc:
                            ran[-1] = pending.failed(attempt, exc)
                        finally:
                            pending.ended()
                        self._cancelled = pending.run_cancelled
                        if pending.suspended:
                            self._resumed = time.perf_counter()
                    except BaseException as exc:
                        # only a handler's KeyboardInterrupt/SystemExit gets here
                        ran.pop()
                        abandon = functools.partial(runner.abandon, attempt, exc)
                        runner.end(attempt, await self._unlocked(attempt, abandon))
                        self._interrupt = exc
                        raise _Interrupted(on_loop=True) from exc
                    finally:
                        # the handler's running time, for the pacing (the call measured none)
                        claims.remeasured(before, time.perf_counter() - began)
        finally:
            batch.returned()
        if outcome is not None:
            runner.end(attempt, outcome)
        else:
            settler = self._settler
            done = ran.pop()
            if attempt.lease_lock.locked():
                # a renewal holds the lock across its write (a task on this loop, when
                # async-native): the settlement waits for the fresh lease off the loop
                entry = await self._thread.submit(functools.partial(settler.prepare, *done))
            else:
                entry = settler.prepare(*done)
            full = settler.enter_posted(entry)
            if full is None:
                # a handler that outlived stop(): its settlement is refused, by name
                await self._thread.submit(functools.partial(settler.settle_entries, [entry]))
            elif full:
                await self._thread.submit(settler.wait_for_room)
        if self._cancelled:
            raise asyncio.CancelledError  # the run's own, taken by its handler's await
        if time.perf_counter() - self._resumed >= _SLICE_SECONDS:
            await asyncio.sleep(0)
            self._resumed = time.perf_counter()

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
            raise _Interrupted(on_loop=False) from exc
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
