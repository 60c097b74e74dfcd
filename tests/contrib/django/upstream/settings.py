"""Settings for Django's own tasks tests run against JarenBackend (see run.py)."""

from __future__ import annotations

import os

SECRET_KEY = "jaren-jobs-upstream-tests"  # a test run
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "jaren_jobs.contrib.django"]
_folder = os.environ["JAREN_UPSTREAM_WORKDIR"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(_folder, "upstream.sqlite3"),
        # a file, not memory: the worker that drains the queue opens it too
        "TEST": {"NAME": os.path.join(_folder, "test-upstream.sqlite3")},
        "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
    }
}
TASKS = {"default": {"BACKEND": "jaren_jobs.contrib.django.JarenBackend"}}
