"""One place that knows where Django's tasks framework lives.

Django >= 6.0 ships it as ``django.tasks``; on Django 5.2 it is the
``django-tasks`` backport (``django_tasks``), whose names differ slightly
(``InvalidTaskError``; ``normalize_json`` in its ``utils``). Every other
module of this package imports the framework from here.
"""

from __future__ import annotations

from typing import Any

try:  # Django >= 6.0
    from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskError,
    )
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    FRAMEWORK = "django.tasks"
except ImportError:  # Django 5.2: the backport
    try:
        from django_tasks import (  # type: ignore[no-redef]
            TaskContext,
            TaskResult,
            TaskResultStatus,
            task_backends,
        )
    except ImportError as exc:
        raise ImportError(
            "jaren_jobs.contrib.django needs Django's tasks framework: Django >= 6.0, or "
            "Django 5.2 with the django-tasks backport (pip install 'jaren_jobs[django]' "
            "django-tasks)"
        ) from exc
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
    from django_tasks.base import (  # type: ignore[no-redef]
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskError,
    )
    from django_tasks.exceptions import (  # type: ignore[no-redef]
        InvalidTaskError as InvalidTask,
    )
    from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef]
    from django_tasks.signals import (  # type: ignore[no-redef]
        task_enqueued,
        task_finished,
        task_started,
    )
    from django_tasks.utils import normalize_json  # type: ignore[no-redef]

    FRAMEWORK = "django_tasks"

__all__ = [
    "FRAMEWORK",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "module_path",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]


def module_path(value: Any) -> str:
    """``module.qualname`` of a function or class, as the framework names them."""
    return f"{value.__module__}.{value.__qualname__}"
