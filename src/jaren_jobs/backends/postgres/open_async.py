"""Opening the async side of a PostgreSQL store: its pool and its listener.

The tables are created or checked by the sync store opened first (off the
loop, once); this makes the ``AsyncConnection`` pool beside it, sized like
the sync one, and the loop's listener. Nothing connects here: the pool opens
its first connection for the first call.
"""

from __future__ import annotations

from psycopg import sql as pgsql

from jaren_jobs.backends.postgres.connection_async import AsyncPgDatabase
from jaren_jobs.backends.postgres.notify_async import AsyncListener
from jaren_jobs.backends.postgres.session import settled_channel
from jaren_jobs.backends.postgres.store import PostgresBackend
from jaren_jobs.backends.postgres.store_async import AsyncPostgresBackend
from jaren_jobs.gate_async import AsyncGate

__all__ = ["open_async_postgres"]


def open_async_postgres(sync: PostgresBackend) -> AsyncPostgresBackend | None:
    """The async twin of an open URL store (``None`` for a store on the application's
    connection: that one connection is the application's, used from its threads)."""
    db = sync.db
    if not db.owns or db.conninfo is None:
        return None
    gate = AsyncGate(db.gate.timeout_seconds, db.gate.capacity)
    adb = AsyncPgDatabase(
        conninfo=db.conninfo, durability=db.durability, readonly=db.readonly, gate=gate
    )
    adb.schema = db.schema  # the sync store resolved it: the same tables, always
    channel = sync.channel
    if channel is not None and not db.readonly:
        adb.listener = AsyncListener(
            db.conninfo,
            pgsql.Identifier(channel).as_string(None),
            pgsql.Identifier(settled_channel(channel)).as_string(None),
            settled_channel(channel),
        )
    if db.listener is not None:
        # its enqueues wake this process's workers when they commit (the hub is shared):
        # their NOTIFYs, back at the sync store's listener, must not wake them again
        db.listener.also_own(adb.own_pids)
    return AsyncPostgresBackend(adb, channel)
