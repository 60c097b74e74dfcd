"""What the upstream tests are given in place of the dummy's and the immediate backend's
own: the list of results, and a JarenBackend whose enqueue drains the queue."""

from __future__ import annotations

import io
from dataclasses import replace
from typing import Any

from django.core.management import call_command
from django.db import connection

from jaren_jobs.contrib.django import JarenBackend


def jaren_results(backend: Any) -> list[Any]:
    """``DummyBackend.results``: this backend's results, oldest first, as stored."""
    with connection.cursor() as cursor:
        cursor.execute(
            'SELECT id FROM "_jaren_jobs" WHERE kind = %s ORDER BY created_at, id',
            [backend.kind],
        )
        ids = [row[0] for row in cursor.fetchall()]
    return [backend.get_result(job_id) for job_id in ids]


def clear_jobs() -> None:
    """Before each test: no job of any backend left by an earlier one."""
    with connection.cursor() as cursor:
        cursor.execute(
            'DELETE FROM "_jaren_job_errors" WHERE job_id IN '
            "(SELECT id FROM \"_jaren_jobs\" WHERE kind LIKE 'django:%%')"
        )
        cursor.execute("DELETE FROM \"_jaren_jobs\" WHERE kind LIKE 'django:%%'")
        cursor.execute('DELETE FROM "_jaren_django_attempts"')


class DrainingBackend(JarenBackend):
    """JarenBackend whose enqueue then runs ``manage.py jaren_worker --burst`` and answers
    the stored result: what ImmediateBackend's tests pin (statuses, timestamps, errors,
    attempts, log lines), observed after a real worker drained the queue. One attempt
    per task, as the immediate backend makes."""

    def __init__(self, alias: str, params: Any) -> None:
        super().__init__(alias, params)
        self.settings = replace(self.settings, max_attempts=1, poll_seconds=0.05)

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        result = super().enqueue(task, args, kwargs)
        call_command("jaren_worker", "--backend", self.alias, "--burst", stdout=io.StringIO())
        return self.get_result(result.id)
