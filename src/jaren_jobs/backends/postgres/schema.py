"""Creating the tables from numbered SQL migrations, forward only, once across processes.

``migrations/NNNN_*.sql`` are applied in order, each at most once, inside one
transaction that first takes ``pg_advisory_xact_lock`` on a key derived from
the schema's name: of many processes opening a fresh database at once, one
creates the tables and the others, once it commits, find them made. The
version reached is ``_jaren_meta.schema_version`` (the highest migration
applied). The tables live in ``current_schema()``, the first schema of the
connection's ``search_path``.
"""

from __future__ import annotations

import re
from importlib import resources

from jaren_jobs.errors import JobsError, SchemaError

from . import queries as sql
from .connection import Database

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "ensure_schema", "require_schema"]

_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def _load() -> tuple[tuple[int, str, str], ...]:
    found = []
    for entry in resources.files(__package__).joinpath("migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort()
    numbers = [number for number, _, _ in found]
    assert numbers == list(range(1, len(found) + 1)), f"migrations must be 1..n, got {numbers}"
    return tuple(found)


# (number, file name, SQL) in order
MIGRATIONS = _load()
SCHEMA_VERSION = MIGRATIONS[-1][0]


def _version(db: Database, what: str) -> int | None:
    """The recorded version (None: no meta table, or no version in it)."""
    row = db.one(sql.TABLE_EXISTS, (sql.META_NAME,), doing=what)
    if row is None or row[0] is None:
        return None
    row = db.one(sql.READ_SCHEMA_VERSION, doing=what)
    if row is None:
        return None
    try:
        return int(row[0])
    except (TypeError, ValueError):
        raise SchemaError(
            f"this database's _jaren_meta holds schema_version {row[0]!r}, which is not a "
            "version number; another program wrote it — restore the row before opening it "
            "with jaren_jobs",
            version=str(row[0]),
        ) from None


def _refuse_newer(version: int | None) -> None:
    if version is not None and version > SCHEMA_VERSION:
        raise SchemaError(
            f"this database's job tables are schema version {version}, newer than this "
            f"jaren_jobs understands ({SCHEMA_VERSION}); upgrade jaren_jobs",
            version=version,
        )


def ensure_schema(db: Database) -> None:
    """Apply the migrations not yet applied; a no-op read when the tables are current."""
    what = "creating the job tables"
    try:
        version = db.transaction(lambda: _version(db, what), doing=what, read_only=True)
        _refuse_newer(version)
        if version == SCHEMA_VERSION:
            return
        db.transaction(lambda: _upgrade(db, what), doing=what)
    except SchemaError:
        raise
    except JobsError as exc:
        raise SchemaError(
            f"the job tables could not be created or upgraded ({exc.message}); a role that "
            "may not create tables in this schema creates nothing — run the first open with "
            "one that may",
        ) from exc


def _upgrade(db: Database, what: str) -> None:
    # serialise every process migrating this schema; re-read under the lock
    db.run(sql.MIGRATION_LOCK, doing=what)
    version = _version(db, what) or 0
    _refuse_newer(version)
    for number, _, text in MIGRATIONS:
        if number > version:
            db.run(text, doing=f"{what} (migration {number})")
    db.run(sql.WRITE_SCHEMA_VERSION, (str(SCHEMA_VERSION),), doing=what)


def require_schema(db: Database) -> None:
    """For a read-only store: the tables must already be there, at this version."""
    what = "checking the job tables"

    def check() -> tuple[list[str], int | None]:
        missing = [
            name
            for name in (sql.JOBS_NAME, sql.CHECKPOINTS_NAME)
            if (row := db.one(sql.TABLE_EXISTS, (name,), doing=what)) is None or row[0] is None
        ]
        return missing, _version(db, what)

    try:
        missing, version = db.transaction(check, doing=what, read_only=True)
    except SchemaError:
        raise
    except JobsError as exc:
        raise SchemaError(f"{what} failed: {exc.message}") from exc
    if missing:
        raise SchemaError(
            f"this database has no job tables ({', '.join(missing)} missing in the "
            "first schema of search_path) and a read-only store creates nothing; open it "
            "read-write once to create them",
            missing=missing,
        )
    _refuse_newer(version)
    if version != SCHEMA_VERSION:
        raise SchemaError(
            f"this database's job tables are an older schema ({version}); a read-only "
            "store cannot upgrade them — open it read-write once",
            version=version,
        )
