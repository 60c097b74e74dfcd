"""What Django's ``TaskResult`` reports and the job record does not keep: one row per attempt.

``worker_ids`` (one per attempt), when each attempt started and finished, and
the exception class path and traceback of each failed one. The worker writes
a row when it starts an attempt and completes it when the attempt ends; the
job itself (state, lease, result, retries) lives in the library's own tables.
"""

from __future__ import annotations

from django.db import models


class Attempt(models.Model):
    job_id = models.CharField(max_length=200)
    number = models.PositiveIntegerField()
    worker_id = models.CharField(max_length=400)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    exception_class_path = models.CharField(max_length=400, blank=True, default="")
    traceback = models.TextField(blank=True, default="")

    class Meta:
        db_table = "_jaren_django_attempts"
        constraints = [  # noqa: RUF012 - Django's Meta reads a plain list
            models.UniqueConstraint(fields=["job_id", "number"], name="jaren_attempt_once"),
        ]
        ordering = ("job_id", "number")

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.job_id}"
