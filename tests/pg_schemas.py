"""Migrated PostgreSQL schemas for the tests: built once per session, emptied between tests.

Building a schema (``CREATE SCHEMA``, then every migration, each committed and
fsynced) was most of a PostgreSQL test's time. The ``backend`` fixture's
PostgreSQL harnesses take a migrated schema from a :class:`SchemaPool` and
give it back when the test ends. Giving back empties it only when it is still
exactly as the migrations left it — the same tables, columns, constraints,
indexes, sequences, functions, triggers, grants and ``_jaren_meta`` rows — and
drops it otherwise (a test that reset, altered or added to it), so no test
sees what an earlier one changed. Emptying deletes every row and restarts the
sequences (``seq``, the insertion order twins compare, starts at 1 again).

Tests that need an empty schema (migrations, ``search_path``, roles, server
settings: ``tests/backends/postgres/``) get one from a harness made without a
pool; ``test_mechanics.py`` builds every migration from empty there.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any

from jaren_jobs import open_store

__all__ = ["SchemaPool"]

# What a schema holds, one text per object, with the schema's name taken out
# by the caller: two schemas built by the same migrations describe the same.
_DESCRIBE = """
SELECT concat_ws(' ', 'rel', c.relname, c.relkind, c.relrowsecurity, c.relacl, c.reloptions)
  FROM pg_class c WHERE c.relnamespace = %(ns)s::regnamespace
UNION ALL
SELECT concat_ws(' ', 'col', c.relname, a.attnum, a.attname,
                 format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity,
                 a.attcollation, pg_get_expr(d.adbin, d.adrelid))
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE c.relnamespace = %(ns)s::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT concat_ws(' ', 'con', conname, pg_get_constraintdef(oid))
  FROM pg_constraint WHERE connamespace = %(ns)s::regnamespace
UNION ALL
SELECT concat_ws(' ', 'idx', pg_get_indexdef(i.indexrelid))
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
 WHERE c.relnamespace = %(ns)s::regnamespace
UNION ALL
SELECT concat_ws(' ', 'seq', c.relname, s.seqstart, s.seqincrement)
  FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
 WHERE c.relnamespace = %(ns)s::regnamespace
UNION ALL
SELECT concat_ws(' ', 'fn', p.proname, pg_get_function_identity_arguments(p.oid))
  FROM pg_proc p WHERE p.pronamespace = %(ns)s::regnamespace
UNION ALL
SELECT concat_ws(' ', 'trg', t.tgname, t.tgenabled)
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE c.relnamespace = %(ns)s::regnamespace
UNION ALL
SELECT concat_ws(' ', 'type', t.typname) FROM pg_type t WHERE t.typnamespace = %(ns)s::regnamespace
UNION ALL
SELECT concat_ws(' ', 'schema', n.nspowner::regrole, n.nspacl)
  FROM pg_namespace n WHERE n.oid = %(ns)s::regnamespace
"""


class SchemaPool:
    """Migrated schemas of one server, handed to one test at a time (see the module doc)."""

    def __init__(self, server_url: str, psycopg: Any, search_path_url: Any) -> None:
        self.server_url = server_url
        self._psycopg = psycopg
        self._url_for = search_path_url  # (server url, schema) -> a url whose tables are there
        self._free: list[str] = []
        self._made: set[str] = set()
        self._shape: tuple[list[str], list[str]] | None = None  # a freshly migrated schema's
        self._lock = threading.Lock()

    def take(self) -> str:
        """A migrated schema with empty tables, the caller's until :meth:`give_back`."""
        with self._lock:
            if self._free:
                return self._free.pop()
        name = f"jt_{secrets.token_hex(6)}"
        with self._psycopg.connect(self.server_url, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
            with self._lock:
                self._made.add(name)
            # the library migrates it, as a first open_store would
            open_store(self._url_for(self.server_url, name)).close()
            shape = self._describe(conn, name)
        with self._lock:
            if self._shape is None:
                self._shape = shape
        return name

    def give_back(self, name: str) -> None:
        """Empty ``name`` for the next test if it is as the migrations left it, else drop it."""
        try:
            with self._psycopg.connect(self.server_url, autocommit=True) as conn:
                # a lock a test leaked (an unclosed transaction) fails the clean-up, not hangs it
                conn.execute("SET lock_timeout = '10s'")
                if self._describe(conn, name) == self._shape:
                    self._empty(conn, name)
                    with self._lock:
                        self._free.append(name)
                    return
        except self._psycopg.Error:
            pass  # dropped below, as a schema a test left in any other state
        self._drop(name)

    def close(self) -> None:
        """Drop every schema this pool made (the end of the session)."""
        with self._lock:
            names = sorted(self._made)
            self._free.clear()
        for name in names:
            self._drop(name)

    def _describe(self, conn: Any, name: str) -> tuple[list[str], list[str]]:
        quoted = f'"{name}"'
        shape = sorted(
            row[0].replace(f"{quoted}.", "").replace(f"{name}.", "")
            for row in conn.execute(_DESCRIBE, {"ns": quoted})
        )
        meta = sorted(repr(row) for row in conn.execute(f'SELECT * FROM "{name}"."_jaren_meta"'))
        return shape, meta

    def _empty(self, conn: Any, name: str) -> None:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT c.relname FROM pg_class c WHERE c.relnamespace = %s::regnamespace "
                "AND c.relkind = 'r' AND c.relname <> '_jaren_meta' ORDER BY 1",
                (f'"{name}"',),
            )
        ]
        sequences = list(
            conn.execute(
                "SELECT c.oid, s.seqstart FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid "
                "WHERE c.relnamespace = %s::regnamespace ORDER BY 1",
                (f'"{name}"',),
            )
        )
        # DELETE, not TRUNCATE: a few rows go faster than new files for every table and index
        with conn.transaction():
            for table in tables:
                conn.execute(f'DELETE FROM "{name}"."{table}"')
            for sequence, start in sequences:
                # setval, not ALTER SEQUENCE ... RESTART (which makes the sequence a new file)
                conn.execute("SELECT setval(%s::oid::regclass, %s, false)", (sequence, start))

    def _drop(self, name: str) -> None:
        with self._psycopg.connect(self.server_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        with self._lock:
            self._made.discard(name)
