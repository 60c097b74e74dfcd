# examples/recipes/flask/shop/db.py
"""The store: one per process, opened on first use."""

import os
import threading

import jaren_jobs

# a SQLite path or a postgresql:// URL, from the environment (12-factor style)
DATABASE = os.environ.get("SHOP_DATABASE", "shop.db")

_lock = threading.Lock()
_store = None
_pid = None


def get_store():
    """This process's store. Opened lazily, so a process forked after the
    import (gunicorn --preload, multiprocessing) opens its own: a store used in
    a child after fork() raises StoreClosed (JD2091)."""
    global _store, _pid
    with _lock:
        if _store is None or _pid != os.getpid():
            _store, _pid = jaren_jobs.open_store(DATABASE), os.getpid()
        return _store


def sql(statement):
    """``?`` placeholders as the driver takes them: psycopg wants ``%s``."""
    if DATABASE.startswith(("postgresql://", "postgres://")):
        return statement.replace("?", "%s")
    return statement


def create_tables():
    """The app's own tables (your migrations, in real life): `python -m shop.db`."""
    with get_store().transaction() as tx:
        tx.execute("CREATE TABLE IF NOT EXISTS signups (email TEXT PRIMARY KEY)")
        tx.execute("CREATE TABLE IF NOT EXISTS welcomes (email TEXT, job_id TEXT UNIQUE)")


if __name__ == "__main__":
    create_tables()
