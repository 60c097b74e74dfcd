"""The backend's OPTIONS, read and checked in one place (the backend, the worker and the
system checks all use :func:`read_options`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from django.conf import settings

__all__ = ["BACKEND_PATH", "Options", "backend_databases", "read_options"]

BACKEND_PATH = "jaren_jobs.contrib.django.JarenBackend"

#: OPTIONS key -> what it is (the system checks name unknown keys with this list)
KNOWN = {
    "DATABASE": "the Django database alias whose database keeps the jobs (default 'default')",
    "MAX_ATTEMPTS": "attempts per task unless the task says (int >= 1; default 5)",
    "LEASE_SECONDS": "the worker's lease, renewed while a task runs (default 30)",
    "POLL_SECONDS": "how often an idle worker looks for due tasks (default 1)",
    "BACKOFF_BASE_SECONDS": "first retry delay unless the task says (default 1)",
    "BACKOFF_CAP_SECONDS": "longest retry delay unless the task says (default 600)",
}
_SECONDS = ("LEASE_SECONDS", "POLL_SECONDS", "BACKOFF_BASE_SECONDS", "BACKOFF_CAP_SECONDS")


@dataclass(frozen=True)
class Options:
    database: str = "default"
    max_attempts: int | None = None
    lease_seconds: float | None = None
    poll_seconds: float | None = None
    backoff_base_seconds: float | None = None
    backoff_cap_seconds: float | None = None


def positive_seconds(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def read_options(raw: Any) -> tuple[Options, list[str]]:
    """The options, and what is wrong with them (each a sentence; empty when all is well)."""
    problems: list[str] = []
    if not isinstance(raw, dict):
        return Options(), [f"OPTIONS must be a dict, got {type(raw).__name__}"]
    for key in sorted(set(raw) - set(KNOWN)):
        problems.append(f"OPTIONS[{key!r}] is not an option of JarenBackend ({', '.join(KNOWN)})")
    database = raw.get("DATABASE", "default")
    if not isinstance(database, str) or not database:
        problems.append(f"OPTIONS['DATABASE'] must name a database alias, got {database!r}")
        database = "default"
    elif database not in settings.DATABASES:
        problems.append(
            f"OPTIONS['DATABASE'] is {database!r}, which DATABASES does not define "
            f"(it has {', '.join(map(repr, settings.DATABASES)) or 'none'})"
        )
    max_attempts = raw.get("MAX_ATTEMPTS")
    if max_attempts is not None and (
        isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1
    ):
        problems.append(f"OPTIONS['MAX_ATTEMPTS'] must be an int >= 1, got {max_attempts!r}")
        max_attempts = None
    seconds: dict[str, float | None] = {}
    for key in _SECONDS:
        value = raw.get(key)
        if value is not None and not positive_seconds(value):
            problems.append(
                f"OPTIONS[{key!r}] must be a finite number of seconds > 0, got {value!r}"
            )
            value = None
        seconds[key] = None if value is None else float(value)
    base, cap = seconds["BACKOFF_BASE_SECONDS"], seconds["BACKOFF_CAP_SECONDS"]
    if base is not None and cap is not None and cap < base:
        problems.append("OPTIONS['BACKOFF_CAP_SECONDS'] must not be below BACKOFF_BASE_SECONDS")
    options = Options(
        database=database,
        max_attempts=max_attempts,
        lease_seconds=seconds["LEASE_SECONDS"],
        poll_seconds=seconds["POLL_SECONDS"],
        backoff_base_seconds=base,
        backoff_cap_seconds=cap,
    )
    return options, problems


def backend_databases() -> set[str]:
    """The database aliases that the configured JarenBackends keep jobs in."""
    found: set[str] = set()
    for params in (getattr(settings, "TASKS", None) or {}).values():
        if isinstance(params, dict) and params.get("BACKEND") in (
            BACKEND_PATH,
            "jaren_jobs.contrib.django.backend.JarenBackend",
        ):
            options, _ = read_options(params.get("OPTIONS", {}))
            found.add(options.database)
    return found
