"""``JarenBackend``: Django's tasks framework over jaren_jobs (SPEC §16).

A task is one job of kind ``django:<backend alias>`` in the queue named by its
``queue_name``, with its priority and ``run_after``; its payload names the task
(its module path) and holds its arguments. The job's record says where the
task stands; the app's ``Attempt`` rows add what Django's ``TaskResult``
reports per attempt (worker ids, start and end, exception and traceback).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from django.utils.module_loading import import_string

from jaren_jobs.records import Job

from .compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from .settings import Options, positive_seconds, read_options

__all__ = ["JOB_OPTIONS", "JarenBackend", "JarenTask", "kind_for"]

#: the job options a JarenTask carries beyond Django's Task
JOB_OPTIONS = ("max_attempts", "unique_key", "backoff_base_seconds", "backoff_cap_seconds")

# job state -> the task's status (SPEC §16)
_STATUS = {
    "pending": TaskResultStatus.READY,
    "failed": TaskResultStatus.READY,
    "leased": TaskResultStatus.RUNNING,
    "done": TaskResultStatus.SUCCESSFUL,
    "dead": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}
_SETTLED = frozenset({"done", "dead", "cancelled"})
LOST_ATTEMPT = "jaren_jobs.errors.LeaseExpired"


def kind_for(alias: str) -> str:
    """The job kind of the tasks of the backend ``alias``."""
    return f"django:{alias}"


@dataclass(frozen=True, slots=True, kw_only=True)
class JarenTask(Task):  # type: ignore[misc]
    """Django's ``Task`` plus the job options jaren_jobs has, typed and validated.

    ``@task(max_attempts=3, backoff_base_seconds=5)`` sets them for every call;
    ``task.using(unique_key=f"welcome-{user.pk}")`` for one call (``using`` takes
    them beside Django's own). ``None``: the backend's OPTIONS, else the library's.
    """

    max_attempts: int | None = None
    unique_key: str | None = None
    backoff_base_seconds: float | None = None
    backoff_cap_seconds: float | None = None

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        **options: Any,
    ) -> JarenTask:
        """A copy with other defaults: Django's four, and any of :data:`JOB_OPTIONS`."""
        unknown = sorted(set(options) - set(JOB_OPTIONS))
        if unknown:
            raise TypeError(
                f"using() got unknown options {unknown}: it takes priority, queue_name, "
                f"run_after, backend and {', '.join(JOB_OPTIONS)}"
            )
        changed: JarenTask = Task.using(
            self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend
        )
        return replace(changed, **options) if options else changed

    # a task is pickled as its module path (the decorated name), as Django 6.1 does;
    # the backport's Task would pickle the function, which its module no longer names
    @classmethod
    def _reconstruct(cls, kwargs: dict[str, Any]) -> JarenTask:
        path = kwargs["func"]
        try:
            kwargs["func"] = import_string(path).func
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"Expected {path!r} to point to a Task instance.") from exc
        return cls(**kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        kwargs = {f.name: getattr(self, f.name) for f in fields(self)}
        kwargs["func"] = self.module_path
        return (type(self)._reconstruct, (kwargs,))


def _invalid_job_options(task: Any) -> str | None:
    """What is wrong with a task's job options (``None``: nothing)."""
    max_attempts = getattr(task, "max_attempts", None)
    if max_attempts is not None and (
        isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1
    ):
        return f"max_attempts must be an int >= 1 (or None), got {max_attempts!r}"
    unique_key = getattr(task, "unique_key", None)
    if unique_key is not None and (
        not isinstance(unique_key, str) or not unique_key or "\x00" in unique_key
    ):
        return f"unique_key must be a non-empty str without NUL (or None), got {unique_key!r}"
    for name in ("backoff_base_seconds", "backoff_cap_seconds"):
        value = getattr(task, name, None)
        if value is not None and not positive_seconds(value):
            return f"{name} must be a finite number of seconds > 0 (or None), got {value!r}"
    base = getattr(task, "backoff_base_seconds", None)
    cap = getattr(task, "backoff_cap_seconds", None)
    if base is not None and cap is not None and cap < base:
        return "backoff_cap_seconds must not be below backoff_base_seconds"
    return None


def _aware(value: datetime) -> bool:
    return value.tzinfo is not None and value.tzinfo.utcoffset(value) is not None


def _shown_time(value: datetime | None) -> datetime | None:
    """A time as Django shows it: aware with USE_TZ, naive local time without."""
    if value is None or settings.USE_TZ:
        return value
    return timezone.make_naive(value) if _aware(value) else value


class JarenBackend(BaseTaskBackend):  # type: ignore[misc]
    """A backend of Django's tasks framework that keeps tasks as jaren_jobs jobs in a
    database of the project (``OPTIONS["DATABASE"]``, SQLite or PostgreSQL), written
    through Django's own connection: an enqueue inside ``transaction.atomic()``
    commits or rolls back with it. ``python manage.py jaren_worker`` runs them."""

    task_class = JarenTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        super().__init__(alias, params)
        self.settings, self.problems = read_options(self.options)

    # ------------------------------------------------------------ configuration

    @property
    def database(self) -> str:
        """The Django database alias that keeps this backend's jobs."""
        return self.settings.database

    @property
    def kind(self) -> str:
        return kind_for(self.alias)

    def _configured(self) -> Options:
        if self.problems:
            raise ImproperlyConfigured(
                f"TASKS[{self.alias!r}] (JarenBackend): {'; '.join(self.problems)}"
            )
        return self.settings

    def check(self, **kwargs: Any) -> list[Any]:
        from .checks import backend_checks  # noqa: PLC0415 - the checks need the app registry

        return [*super().check(**kwargs), *backend_checks(self)]

    # ------------------------------------------------------------ validation

    def validate_task(self, task: Any) -> None:
        """Django's checks (module-level function, priority, queue, context argument),
        an aware ``run_after`` whatever ``USE_TZ`` says, and the job options."""
        super().validate_task(task)
        if task.run_after is not None and (
            not isinstance(task.run_after, datetime) or not _aware(task.run_after)
        ):
            raise InvalidTask("run_after must be an aware datetime.")
        problem = _invalid_job_options(task)
        if problem is not None:
            raise InvalidTask(problem)

    def _check_importable(self, task: Any) -> None:
        """The worker finds a task by its module path: it must name this very task."""
        path = task.module_path
        try:
            found = import_string(path)
        except ImportError as exc:
            raise InvalidTask(
                f"Task {path!r} cannot be imported by its module path ({exc}), so no worker "
                "could run it; define it at module level of an importable module"
            ) from None
        if getattr(found, "func", None) is not task.func:
            raise InvalidTask(
                f"Task {path!r} does not name this task in its module (found "
                f"{type(found).__name__}); keep the @task-decorated function under its name"
            )

    # ------------------------------------------------------------ enqueue

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Add the task as a job; inside ``atomic()`` it exists once the block commits."""
        options = self._configured()
        self.validate_task(task)
        self._check_importable(task)
        # the framework's own refusal of arguments JSON cannot hold (TypeError), before
        # anything is written; NaN and infinity are refused by the store (ValueError)
        args = normalize_json(list(args))
        kwargs = normalize_json(dict(kwargs))
        payload = {
            "task": task.module_path,
            "args": args,
            "kwargs": kwargs,
            "run_after": None if task.run_after is None else task.run_after.isoformat(),
            "options": {
                name: getattr(task, name)
                for name in JOB_OPTIONS
                if getattr(task, name, None) is not None
            },
        }
        from .stores import jobs_scope  # noqa: PLC0415 - the ORM, once Django is set up

        max_attempts = getattr(task, "max_attempts", None) or options.max_attempts
        with jobs_scope(options.database) as jobs:
            job = jobs.enqueue(
                self.kind,
                payload,
                queue=task.queue_name,
                priority=task.priority,
                run_at=task.run_after,
                max_attempts=max_attempts,
                unique_key=getattr(task, "unique_key", None),
            )
        result = self.result_of(job, attempts=[])
        task_enqueued.send(type(self), task_result=result)
        return result

    # ------------------------------------------------------------ results

    def get_result(self, result_id: str) -> Any:
        """The task's result as the database holds it now, from any process."""
        options = self._configured()
        from .models import Attempt  # noqa: PLC0415
        from .stores import jobs_scope  # noqa: PLC0415

        if not isinstance(result_id, str) or not result_id or "\x00" in result_id:
            raise TaskResultDoesNotExist(result_id)
        with jobs_scope(options.database) as jobs:
            job = jobs.get(result_id)
        if job is None or job.kind != self.kind:
            raise TaskResultDoesNotExist(result_id)
        attempts = list(Attempt.objects.using(options.database).filter(job_id=job.id))
        return self.result_of(job, attempts=attempts)

    def task_of(self, job: Job) -> Any:
        """The task a job runs, as it was enqueued (imported by its module path)."""
        payload: Any = job.payload
        if not isinstance(payload, dict) or not isinstance(payload.get("task"), str):
            raise InvalidTask(f"job {job.id!r} is not a task of this backend (its payload)")
        base = import_string(payload["task"])
        if not isinstance(base, Task):
            raise InvalidTask(f"{payload['task']!r} is not a Task")
        run_after = payload.get("run_after")
        changed = base.using(
            priority=job.priority,
            queue_name=job.queue,
            run_after=None if run_after is None else datetime.fromisoformat(run_after),
            backend=self.alias,
        )
        extra = {k: v for k, v in (payload.get("options") or {}).items() if k in JOB_OPTIONS}
        if extra and isinstance(changed, JarenTask):
            changed = replace(changed, **extra)
        return changed

    def result_of(self, job: Job, *, attempts: list[Any], task: Any = None) -> Any:
        """Django's ``TaskResult`` for a job and its attempt rows (oldest first)."""
        attempts = sorted(attempts, key=lambda row: row.number)
        running = job.attempts if job.state == "leased" else None
        errors = []
        for row in attempts:
            if row.exception_class_path:
                errors.append(
                    TaskError(
                        exception_class_path=row.exception_class_path, traceback=row.traceback
                    )
                )
            elif row.finished_at is None and row.number != running:
                # started, never finished: its worker died or lost the lease, and the
                # job was claimed again (or dead-lettered) once the lease ran out
                errors.append(
                    TaskError(
                        exception_class_path=LOST_ATTEMPT,
                        traceback=(
                            f"attempt {row.number} (worker {row.worker_id}) ended without "
                            "settling: its worker stopped or lost the lease, which expired"
                        ),
                    )
                )
        payload: Any = job.payload if isinstance(job.payload, dict) else {}
        # the last attempt's own end (microseconds) where it has one: the job's record
        # keeps milliseconds, which could put the end before the attempt's start
        last = attempts[-1].finished_at if attempts else None
        finished = last if last is not None and job.state in ("done", "dead") else job.updated_at
        result = TaskResult(
            task=self.task_of(job) if task is None else task,
            id=job.id,
            status=_STATUS[job.state],
            enqueued_at=_shown_time(job.created_at),
            started_at=_shown_time(attempts[0].started_at) if attempts else None,
            finished_at=_shown_time(finished) if job.state in _SETTLED else None,
            last_attempted_at=_shown_time(attempts[-1].started_at) if attempts else None,
            args=payload.get("args", []),
            kwargs=payload.get("kwargs", {}),
            backend=self.alias,
            errors=errors,
            worker_ids=[row.worker_id for row in attempts],
        )
        if job.state == "done":
            object.__setattr__(result, "_return_value", job.result)
        return result

    # ------------------------------------------------------------ tests

    def clear(self) -> None:
        """Delete every job of this backend, and their attempts (for tests)."""
        from .models import Attempt  # noqa: PLC0415
        from .stores import store_for, transaction_scope  # noqa: PLC0415

        options = self._configured()
        store = store_for(options.database)
        mark = "?" if store.backend == "sqlite" else "%s"
        with transaction_scope(options.database) as tx:
            for statement in _CLEAR:
                tx.execute(statement.format(mark=mark), (self.kind,))
        Attempt.objects.using(options.database).all().delete()


_MINE = 'SELECT id FROM "_jaren_jobs" WHERE kind = {mark}'
_CLEAR = (
    f'DELETE FROM "_jaren_job_errors" WHERE job_id IN ({_MINE})',
    'DELETE FROM "_jaren_jobs" WHERE kind = {mark}',
)
