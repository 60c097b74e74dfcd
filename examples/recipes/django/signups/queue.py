# examples/recipes/django/signups/queue.py
"""One jaren_jobs store per process, opened on first use from the settings."""

import os
import threading

from django.conf import settings

import jaren_jobs

_lock = threading.Lock()
_store = None
_pid = None


def get_store():
    global _store, _pid
    with _lock:
        if _store is None or _pid != os.getpid():  # first use, or a forked child
            _store, _pid = jaren_jobs.open_store(settings.JAREN_JOBS_DATABASE), os.getpid()
        return _store


def sql(statement):
    """``?`` placeholders as the driver takes them: psycopg wants ``%s``."""
    if get_store().backend == "postgres":
        return statement.replace("?", "%s")
    return statement
