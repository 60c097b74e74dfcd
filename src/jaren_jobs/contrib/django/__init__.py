"""jaren_jobs as a backend of Django's tasks framework (SPEC §16).

``TASKS = {"default": {"BACKEND": "jaren_jobs.contrib.django.JarenBackend", ...}}``
and ``"jaren_jobs.contrib.django"`` in ``INSTALLED_APPS`` (its migration creates
the tables); ``python manage.py jaren_worker`` runs the tasks. See docs/django.md.
Django itself is imported only when one of these names is used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["JarenBackend", "JarenTask"]


def __getattr__(name: str) -> Any:
    # lazily: Django imports this package (an INSTALLED_APPS entry) before it is set up
    if name in __all__:
        from . import backend  # noqa: PLC0415 - Django only when asked for

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
