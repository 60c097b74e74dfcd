"""System checks of a JarenBackend's configuration (``manage.py check``)."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks

from .stores import ENGINES

__all__ = ["backend_checks"]

APP = "jaren_jobs.contrib.django"


def backend_checks(backend: Any) -> list[checks.CheckMessage]:
    where = f"TASKS[{backend.alias!r}]"
    found: list[checks.CheckMessage] = [
        checks.Error(f"{where}: {problem}", id="jaren_jobs.E001") for problem in backend.problems
    ]
    if not apps.is_installed(APP):
        found.append(
            checks.Error(
                f"{where} uses JarenBackend, but {APP!r} is not in INSTALLED_APPS",
                hint=f"add {APP!r} to INSTALLED_APPS and run manage.py migrate (it creates "
                "the job tables)",
                id="jaren_jobs.E002",
            )
        )
    database = backend.settings.database
    engine = (settings.DATABASES.get(database) or {}).get("ENGINE", "")
    vendor = engine.rsplit(".", 1)[-1].replace("postgresql_psycopg2", "postgresql")
    if database in settings.DATABASES and vendor.replace("sqlite3", "sqlite") not in ENGINES:
        found.append(
            checks.Error(
                f"{where}: database {database!r} uses {engine!r}; jaren_jobs keeps jobs in "
                "SQLite or PostgreSQL",
                id="jaren_jobs.E003",
            )
        )
    return found
