"""A dashboard in the browser for a jaren_jobs store (SPEC §15), over the public API only.

``create_app(store)`` is a WSGI application and ``create_asgi_app(store)`` an
ASGI one; mount either under a path prefix of your own web application, or
run ``jaren-jobs dashboard --db ...``. Read-only unless ``read_only=False``.
Standard library only; its CSS and JavaScript ship in the package. See
``docs/dashboard.md``.
"""

from __future__ import annotations

from collections.abc import Sequence

from jaren_jobs.dashboard.asgi import DashboardAsgiApp
from jaren_jobs.dashboard.core import Dashboard
from jaren_jobs.dashboard.wsgi import DashboardApp, basic_auth
from jaren_jobs.periodic import Periodic
from jaren_jobs.store import Store

__all__ = [
    "Dashboard",
    "DashboardApp",
    "DashboardAsgiApp",
    "basic_auth",
    "create_app",
    "create_asgi_app",
]


def create_app(
    store: Store,
    *,
    read_only: bool = True,
    periodic: Sequence[Periodic] = (),
    queues: Sequence[str] | None = None,
    bulk_cap: int = 1000,
    trusted_origins: Sequence[str] = (),
    poll_seconds: float = 5.0,
) -> DashboardApp:
    """The dashboard over ``store`` as a WSGI application.

    ``read_only=False`` turns the actions on (cancel, requeue, run now, in
    bulk), each a POST with the session's CSRF token from the dashboard's own
    origin. ``periodic``: the schedules whose next ticks the overview shows.
    ``queues``: the queues the overview counts (default: those of the newest
    jobs). ``bulk_cap``: the most jobs one bulk action touches.
    ``trusted_origins``: other origins (``https://ops.example``) whose POSTs
    are accepted, e.g. behind a proxy that rewrites the host. ``poll_seconds``:
    how often the overview refreshes itself from the JSON API.
    """
    return DashboardApp(
        Dashboard(
            store,
            read_only=read_only,
            periodic=periodic,
            queues=queues,
            bulk_cap=bulk_cap,
            trusted_origins=trusted_origins,
            poll_seconds=poll_seconds,
        )
    )


def create_asgi_app(
    store: Store,
    *,
    read_only: bool = True,
    periodic: Sequence[Periodic] = (),
    queues: Sequence[str] | None = None,
    bulk_cap: int = 1000,
    trusted_origins: Sequence[str] = (),
    poll_seconds: float = 5.0,
) -> DashboardAsgiApp:
    """The dashboard over ``store`` as an ASGI application (same options as :func:`create_app`).

    Each request is answered on the event loop's default executor, so the
    store's calls never block the loop.
    """
    return DashboardAsgiApp(
        Dashboard(
            store,
            read_only=read_only,
            periodic=periodic,
            queues=queues,
            bulk_cap=bulk_cap,
            trusted_origins=trusted_origins,
            poll_seconds=poll_seconds,
        )
    )
