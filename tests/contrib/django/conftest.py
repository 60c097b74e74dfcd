"""The Django test project (tests/contrib/django/project), set up once per session.

Its databases are real: an SQLite file of the session's own, and — when the tests
have a PostgreSQL server (tests/conftest.py's ``require_postgres``) — a database
of its own on it, created here and dropped at the end. ``manage.py migrate`` builds
both, as a deployment would. Tests pick a backend with the ``alias`` fixture:
``default`` (SQLite) and ``pg`` (PostgreSQL).
"""

from __future__ import annotations

import importlib
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

PROJECT = Path(__file__).resolve().parent / "project"

try:
    import django
except ImportError:  # pragma: no cover - the dev extra installs it
    django = None  # type: ignore[assignment]


def _framework_missing() -> str | None:
    if django is None:
        return "Django is not installed (pip install -e '.[dev]')"
    for framework in ("django.tasks", "django_tasks"):  # Django >= 6; the 5.2 backport
        try:
            importlib.import_module(framework)
        except ImportError:
            continue
        return None
    return "neither django.tasks (Django >= 6) nor the django-tasks backport is installed"


_STATE: dict[str, Any] = {}
#: the project's environment (its databases): what a worker process started by a test gets
PROJECT_ENV: dict[str, str] = {}


def _postgres_url() -> str | None:
    """A fresh database on the test server, or None when there is no server here."""
    from tests.conftest import _find_postgres

    if os.environ.get("JAREN_JOBS_TEST_POSTGRES_URL") is None and _find_postgres() is not None:
        return None
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    server = os.environ["JAREN_JOBS_TEST_POSTGRES_URL"]
    name = f"jaren_django_{secrets.token_hex(5)}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    _STATE["pg"] = (server, name)
    info = conninfo_to_dict(server)
    user = info.get("user") or ""
    password = f":{info['password']}" if info.get("password") else ""
    host = info.get("host") or "127.0.0.1"
    port = f":{info['port']}" if info.get("port") else ""
    return f"postgresql://{user}{password}@{host}{port}/{name}"


@pytest.fixture(scope="session")
def project() -> Iterator[Path]:
    """The project, configured, migrated and ready; its environment (for the worker
    processes a test starts) is in ``PROJECT_ENV``."""
    missing = _framework_missing()
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the Django tests must run in CI: {missing}")
        pytest.skip(missing)
    folder = Path(tempfile.mkdtemp(prefix="jaren-django-"))
    env = {"SHOP_SQLITE": str(folder / "shop.sqlite3"), "DJANGO_SETTINGS_MODULE": "settings"}
    url = _postgres_url()
    if url is not None:
        env["SHOP_POSTGRES_URL"] = url
    PROJECT_ENV.update(env)
    # set only while the settings are read: the other tests' subprocesses must not inherit them
    os.environ.update(env)
    sys.path.insert(0, str(PROJECT))
    try:
        django.setup()
    finally:
        for name in env:
            os.environ.pop(name, None)
    from django.core.management import call_command

    for alias in ("default", "pg") if url else ("default",):
        call_command("migrate", database=alias, verbosity=0)
    try:
        yield PROJECT
    finally:
        from django.db import connections

        connections.close_all()
        shutil.rmtree(folder, ignore_errors=True)
        if "pg" in _STATE:
            import psycopg

            server, name = _STATE.pop("pg")
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["default", "pg"], ids=["sqlite", "postgres"])
def alias(request: pytest.FixtureRequest, project: Path) -> Iterator[str]:
    """A task backend (and the database it keeps jobs in), emptied before the test."""
    name: str = request.param
    if name == "pg" and "SHOP_POSTGRES_URL" not in PROJECT_ENV:
        if os.environ.get("CI"):
            pytest.fail("the PostgreSQL tests must run in CI: no server")
        pytest.skip("no PostgreSQL server for the tests")
    from django.db import connections
    from shop.models import Order, Shipment

    from jaren_jobs.contrib.django.compat import task_backends

    task_backends[name].clear()
    Order.objects.using(name).all().delete()
    Shipment.objects.using(name).all().delete()
    yield name
    connections.close_all()
