"""Running Django tasks in a jaren_jobs worker (``manage.py jaren_worker``).

One handler serves every task of a backend (the job kind ``django:<alias>``): it
imports the task by its module path, records the attempt (worker id, start),
sends ``task_started``, runs the task (an ``async def`` one through asgiref, as
Django's own backends do), records how it ended and sends ``task_finished``. A
failure is settled here with the task's own backoff, then re-raised for the
worker (which finds it settled by this very attempt: idempotent).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from traceback import format_exception
from typing import Any

from django.db import close_old_connections
from django.utils import timezone

from jaren_jobs.errors import LeaseLost
from jaren_jobs.store import Store

from .compat import (
    TaskContext,
    TaskError,
    TaskResultStatus,
    module_path,
    normalize_json,
    task_finished,
    task_started,
)

__all__ = ["TaskFailed", "make_handler"]


class TaskFailed(Exception):
    """A task raised something that is not an ``Exception`` (``SystemExit``,
    ``KeyboardInterrupt``): the worker settles the attempt as failed instead of stopping."""


def make_handler(backend: Any, store: Store) -> Callable[[Any, Any], Any]:
    """The worker's handler for ``backend``'s tasks, settling failures through ``store``."""
    from .models import Attempt  # noqa: PLC0415 - the app registry is ready by now

    alias = backend.settings.database
    sender = type(backend)

    def handler(payload: Any, ctx: Any) -> Any:
        close_old_connections()
        try:
            return run(payload, ctx)
        finally:
            close_old_connections()

    def run(payload: Any, ctx: Any) -> Any:
        job = ctx.job
        lease = ctx.lease
        rows = Attempt.objects.using(alias)
        # single statements, no atomic(): on SQLite a read-then-write transaction can
        # meet another writer's commit and fail at once instead of waiting
        fresh = {
            "worker_id": lease.owner,
            "started_at": timezone.now(),
            "finished_at": None,
            "exception_class_path": "",
            "traceback": "",
        }
        mine = rows.filter(job_id=job.id, number=lease.attempt)
        if not mine.update(**fresh):  # a snoozed attempt's number comes round again
            rows.create(job_id=job.id, number=lease.attempt, **fresh)
        current = Attempt(job_id=job.id, number=lease.attempt, **fresh)
        try:
            task = backend.task_of(job)
        except Exception as exc:
            finish(current, exc)
            # no later attempt can import it either
            with contextlib.suppress(LeaseLost):
                store.jobs.fail(lease, exc, retry=False)
            raise
        attempts = list(rows.filter(job_id=job.id))
        result = backend.result_of(job, attempts=attempts, task=task)
        task_started.send(sender=sender, task_result=result)
        try:
            args, kwargs = payload.get("args", []), payload.get("kwargs", {})
            if task.takes_context:
                value = task.call(TaskContext(task_result=result), *args, **kwargs)
            else:
                value = task.call(*args, **kwargs)
            value = normalize_json(value)
        except BaseException as exc:
            # in a worker thread even KeyboardInterrupt and SystemExit come from the task
            # itself (signals reach the main thread): the attempt failed
            finish(current, exc)
            final = lease.attempt >= job.max_attempts
            object.__setattr__(
                result, "status", TaskResultStatus.FAILED if final else TaskResultStatus.READY
            )
            if final:
                object.__setattr__(result, "finished_at", timezone.now())
            result.errors.append(
                TaskError(
                    exception_class_path=current.exception_class_path,
                    traceback=current.traceback,
                )
            )
            settled = exc if isinstance(exc, Exception) else TaskFailed(describe(exc))
            options = backend.settings
            # a lost lease: the worker meets the same refusal and reports the attempt lost
            with contextlib.suppress(LeaseLost):
                store.jobs.fail(
                    lease,
                    settled,
                    backoff_base_seconds=getattr(task, "backoff_base_seconds", None)
                    or options.backoff_base_seconds,
                    backoff_cap_seconds=getattr(task, "backoff_cap_seconds", None)
                    or options.backoff_cap_seconds,
                )
            # sent inside the except block: Django's log line carries the traceback
            task_finished.send(sender=sender, task_result=result)
            if settled is exc:
                raise
            raise settled from exc
        finish(current, None)
        object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
        object.__setattr__(result, "finished_at", timezone.now())
        object.__setattr__(result, "_return_value", value)
        task_finished.send(sender=sender, task_result=result)
        return value

    def finish(row: Any, exc: BaseException | None) -> None:
        row.finished_at = timezone.now()
        if exc is not None:
            row.exception_class_path = module_path(type(exc))
            row.traceback = "".join(format_exception(exc))
        Attempt.objects.using(alias).filter(job_id=row.job_id, number=row.number).update(
            finished_at=row.finished_at,
            exception_class_path=row.exception_class_path,
            traceback=row.traceback,
        )

    return handler


def describe(exc: BaseException) -> str:
    return f"{module_path(type(exc))}: {exc}"
