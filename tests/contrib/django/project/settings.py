"""A real Django project for the JarenBackend tests: an app with a model, a view that
saves it and enqueues a task inside ``atomic()``, and two task backends — on SQLite
(``default``) and on PostgreSQL (``pg``, when the tests have a server).

The databases come from the environment (set by tests/contrib/django/conftest.py),
so a ``manage.py jaren_worker`` started as a separate process finds the same ones.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

SECRET_KEY = "jaren-jobs-tests"  # a test project
DEBUG = False
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
USE_TZ = True
ROOT_URLCONF = "shop.urls"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "jaren_jobs.contrib.django",
    "shop",
]
try:  # Django 5.2: the backport is an app of its own (its log lines, its checks)
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.insert(1, "django_tasks")

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SHOP_SQLITE", "shop.sqlite3"),
        # IMMEDIATE: an atomic() block that reads, then writes, waits for the write lock
        # instead of failing at once when a worker committed in between (Django >= 5.1)
        "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
    }
}
_pg = os.environ.get("SHOP_POSTGRES_URL")
if _pg:
    parts = urlsplit(_pg)
    DATABASES["pg"] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "USER": parts.username or "",
        "PASSWORD": parts.password or "",
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }

_lease = float(os.environ.get("SHOP_LEASE_SECONDS", "30"))
TASKS = {
    "default": {
        "BACKEND": "jaren_jobs.contrib.django.JarenBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "DATABASE": "default",
            "LEASE_SECONDS": _lease,
            "POLL_SECONDS": 0.2,
            "BACKOFF_BASE_SECONDS": 0.01,
            "BACKOFF_CAP_SECONDS": 0.02,
        },
    }
}
if _pg:
    TASKS["pg"] = {
        "BACKEND": "jaren_jobs.contrib.django.JarenBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "DATABASE": "pg",
            "LEASE_SECONDS": _lease,
            "POLL_SECONDS": 0.2,
            "BACKOFF_BASE_SECONDS": 0.01,
            "BACKOFF_CAP_SECONDS": 0.02,
        },
    }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django.tasks": {"handlers": ["console"], "level": "INFO"},
        "django_tasks": {"handlers": ["console"], "level": "INFO"},
    },
}
