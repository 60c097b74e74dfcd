"""The Django app: its migration creates the job tables in the backends' databases."""

from __future__ import annotations

from django.apps import AppConfig


class JarenJobsConfig(AppConfig):
    name = "jaren_jobs.contrib.django"
    label = "jaren_jobs"
    verbose_name = "jaren_jobs"
    default_auto_field = "django.db.models.BigAutoField"
