"""Stores over the database of a Django alias.

* :func:`store_for` — the web side: a store on *Django's own* connection for the
  alias (the raw ``sqlite3`` / ``psycopg`` connection under its wrapper), so an
  enqueue inside ``transaction.atomic()`` joins it (``store.join_transaction``)
  and commits or rolls back with the application's writes, with no second
  connection. One store per raw connection: Django opens a new one per thread,
  and per request unless ``CONN_MAX_AGE`` says otherwise.
* :func:`open_worker_store` — the worker's store, on connections of its own
  (a worker's threads claim, renew and settle beside the tasks' own ORM work).
* :func:`create_tables` — what the app's migration runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlencode

from django.db import connections, transaction

from jaren_jobs.store import Store, open_store

__all__ = [
    "ENGINES",
    "create_tables",
    "jobs_scope",
    "open_worker_store",
    "store_for",
    "transaction_scope",
]

# the Django database engines (their ``vendor``) the backend can keep jobs in
ENGINES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


def _busy_seconds(settings_dict: dict[str, Any]) -> float:
    """Django's own wait for a locked SQLite file (OPTIONS["timeout"], default 5 s)."""
    timeout = (settings_dict.get("OPTIONS") or {}).get("timeout", 5.0)
    return float(timeout) if isinstance(timeout, (int, float)) else 5.0


def store_for(alias: str) -> Store:
    """A store on Django's current connection for ``alias`` (opened once per connection)."""
    wrapper = connections[alias]
    wrapper.ensure_connection()
    raw = wrapper.connection
    cached = getattr(wrapper, "_jaren_jobs_store", None)
    if cached is not None and cached[0] is raw:
        store: Store = cached[1]
        return store
    if wrapper.vendor == "postgresql" and type(raw).__module__.split(".")[0] != "psycopg":
        raise RuntimeError(
            f"database {alias!r}: jaren_jobs needs psycopg 3 under Django's PostgreSQL "
            "backend (pip install 'psycopg[binary]'); this connection is psycopg2's"
        )
    store = open_store(connection=raw, busy_timeout_seconds=_busy_seconds(wrapper.settings_dict))
    # the old connection's store (if any) goes with it: a store on an application's
    # connection holds nothing else
    wrapper._jaren_jobs_store = (raw, store)
    return store


@contextmanager
def jobs_scope(alias: str) -> Iterator[Any]:
    """``jobs`` to call for ``alias`` now: inside ``atomic()``, the joined transaction's
    ``tx.jobs`` (written with it, wake-ups on its commit); outside, the store's own."""
    store = store_for(alias)
    wrapper = connections[alias]
    if not wrapper.in_atomic_block:
        yield store.jobs
        return

    def on_commit(callback: Callable[[], None]) -> None:
        transaction.on_commit(callback, using=alias)

    with store.join_transaction(on_commit=on_commit) as tx:
        yield tx.jobs


@contextmanager
def transaction_scope(alias: str) -> Iterator[Any]:
    """A transaction on Django's connection for ``alias``: the joined ``atomic()``, or a
    ``store.transaction()`` of its own outside one."""
    store = store_for(alias)
    if not connections[alias].in_atomic_block:
        with store.transaction() as tx:
            yield tx
        return
    with store.join_transaction(
        on_commit=lambda callback: transaction.on_commit(callback, using=alias)
    ) as tx:
        yield tx


def postgres_url(settings_dict: dict[str, Any]) -> str:
    """A ``postgresql://`` URL with Django's connection settings for one alias."""
    params: dict[str, str] = {}
    options = dict(settings_dict.get("OPTIONS") or {})
    for key in ("NAME", "USER", "PASSWORD", "HOST", "PORT"):
        value = settings_dict.get(key)
        if value not in (None, ""):
            params["dbname" if key == "NAME" else key.lower()] = str(value)
    for key, value in options.items():
        # libpq's own keywords (sslmode, options, service, ...); Django's extras are not
        if (
            isinstance(value, (str, int))
            and not isinstance(value, bool)
            and key
            not in (
                "isolation_level",
                "server_side_binding",
                "pool",
                "assume_role",
            )
        ):
            params[key] = str(value)
    return "postgresql:///?" + urlencode(params)


def open_worker_store(alias: str, **options: Any) -> Store:
    """The worker's store on ``alias``'s database, on connections of its own."""
    wrapper = connections[alias]
    settings_dict = wrapper.settings_dict
    if wrapper.vendor == "sqlite":
        name = settings_dict["NAME"]
        if wrapper.is_in_memory_db():
            raise RuntimeError(
                f"database {alias!r} is in memory: a worker in another thread or process "
                "cannot reach it — give it a file"
            )
        return open_store(str(name), busy_timeout_seconds=_busy_seconds(settings_dict), **options)
    if wrapper.vendor == "postgresql":
        return open_store(postgres_url(settings_dict), **options)
    raise RuntimeError(
        f"database {alias!r} is {wrapper.vendor}: jaren_jobs keeps jobs in SQLite or PostgreSQL"
    )


def create_tables(alias: str) -> None:
    """Create (or upgrade) the library's tables in ``alias``'s database, inside whatever
    transaction Django has open there (a migration's): opening a store does it."""
    wrapper = connections[alias]
    wrapper.ensure_connection()
    open_store(
        connection=wrapper.connection, busy_timeout_seconds=_busy_seconds(wrapper.settings_dict)
    )
