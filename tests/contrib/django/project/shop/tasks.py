"""The shop's tasks (tasks are found by module path: shop.tasks.<name>)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from django.db import transaction

from jaren_jobs.contrib.django.compat import TaskContext

try:
    from django.tasks import task
except ImportError:  # Django 5.2
    from django_tasks import task

from .models import Shipment


@task(takes_context=True)
def ship(context: TaskContext, order_id: int) -> dict[str, int]:
    with transaction.atomic(using=context.task_result.task.get_backend().database):
        Shipment.objects.using(context.task_result.task.get_backend().database).create(
            order_id=order_id, attempt=context.attempt
        )
    return {"order": order_id, "attempt": context.attempt}


@task(queue_name="emails", priority=10)
async def send_email(to: str) -> str:
    return f"sent to {to}"


@task(max_attempts=3)
def flaky(fail_times: int, context_file: str) -> str:
    """Fails its first ``fail_times`` runs (counted in a file), then succeeds."""
    path = Path(context_file)
    runs = int(path.read_text()) if path.exists() else 0
    path.write_text(str(runs + 1))
    if runs < fail_times:
        raise ValueError(f"run {runs + 1} fails")
    return "ok"


@task(max_attempts=2)
def always_fails() -> None:
    raise KeyError("nope")


@task()
def exits() -> None:
    raise SystemExit("bye")


@task(takes_context=True)
def stall_once(context: TaskContext, marker: str) -> int:
    """The first attempt writes ``marker`` and then hangs (its worker is killed);
    a later attempt returns at once."""
    path = Path(marker)
    if context.attempt == 1:
        path.write_text(str(os.getpid()))
        time.sleep(300)
    return context.attempt


@task()
def returns_unjsonable() -> object:
    return object()


def _plain() -> int:
    return 1


# the module names the function under its own name, and the task under another: no worker
# could find this task by its module path (shop.tasks._plain is the bare function)
aliased = task()(_plain)
