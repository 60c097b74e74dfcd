"""Creating the tables, and upgrading older ones in place, forward only.

Jobs rows are live work, so an existing queue is never rebuilt: missing
columns are added one at a time behind a presence check, and an index an
older schema had and this one replaces is dropped after its successor exists. A fresh database
goes through the very same steps (base tables, then every added column), so
"all upgrades from empty" and "the current schema" cannot drift apart.
"""

from __future__ import annotations

from jaren_jobs.backends.sqlite import listing
from jaren_jobs.backends.sqlite import queries as sql
from jaren_jobs.backends.sqlite.connection import Database
from jaren_jobs.errors import JobsError, SchemaError

__all__ = ["ensure_schema", "require_schema", "schema_version"]


def schema_version(db: Database) -> int | None:
    """The recorded version; ``None`` when the meta table is missing (or pre-fence)."""
    what = "reading the schema version"
    if db.one(sql.TABLE_EXISTS, ("_jaren_meta",), doing=what) is None:
        return None
    row = db.one(sql.READ_SCHEMA_VERSION, doing=what)
    if row is None:
        return None
    try:
        return int(row[0])
    except (TypeError, ValueError):
        raise SchemaError(
            f"this database's _jaren_meta holds schema_version {row[0]!r}, which is not a "
            "version number; another program wrote it — restore the row (or the file) "
            "before opening it with jaren_jobs",
            version=str(row[0]),
        ) from None


def _refuse_newer(version: int | None) -> None:
    if version is not None and version > sql.SCHEMA_VERSION:
        raise SchemaError(
            f"this database's job tables are schema version {version}, newer than this "
            f"jaren_jobs understands ({sql.SCHEMA_VERSION}); upgrade jaren_jobs",
            version=version,
        )


def ensure_schema(db: Database) -> None:
    """Create or upgrade the tables; one immediate transaction, only when needed."""
    try:
        version = schema_version(db)
        _refuse_newer(version)
        if version == sql.SCHEMA_VERSION:
            return  # the common open: no write lock taken
        db.transaction(lambda: _upgrade(db), doing="creating the job tables")
    except SchemaError:
        raise
    except JobsError as exc:
        raise SchemaError(
            f"the job tables could not be created or upgraded ({exc.message}); a read-only "
            "file creates nothing — open it read-write once",
        ) from exc


def _upgrade(db: Database) -> None:
    what = "creating the job tables"
    # re-read under the write lock: another process may have just done it
    version = schema_version(db)
    _refuse_newer(version)
    if version == sql.SCHEMA_VERSION:
        return
    for statement in (sql.CREATE_JOBS, sql.CREATE_CHECKPOINTS, sql.CREATE_ERRORS, sql.CREATE_META):
        db.run(statement, doing=what)
    history = {row[0] for row in db.all(sql.table_columns("_jaren_job_errors"), doing=what)}
    if "generation" not in history:
        for statement in sql.REKEY_ERRORS:
            db.run(statement, doing=what)
    for table, column, definition in sql.ADDED_COLUMNS:
        present = {row[0] for row in db.all(sql.table_columns(table), doing=what)}
        if column not in present:
            db.run(sql.add_column(table, column, definition), doing=what)
    for statement in (*sql.CREATE_INDEXES, *listing.LISTING_INDEXES):
        db.run(statement, doing=what)
    for name in sql.DROPPED_INDEXES:
        db.run(sql.drop_index(name), doing=what)
    db.run(sql.WRITE_SCHEMA_VERSION, (str(sql.SCHEMA_VERSION),), doing=what)


def require_schema(db: Database) -> None:
    """For a read-only store: the tables must already be there, at a known version."""
    what = "checking the job tables"
    try:
        missing = [
            name
            for name in ("_jaren_jobs", "_jaren_job_checkpoints")
            if db.one(sql.TABLE_EXISTS, (name,), doing=what) is None
        ]
        version = schema_version(db)
    except SchemaError:
        raise
    except JobsError as exc:
        raise SchemaError(f"{what} failed: {exc.message}") from exc
    if missing:
        raise SchemaError(
            f"this database has no job tables ({', '.join(missing)} missing) and a read-only "
            "store creates nothing; open it read-write once to create them",
            missing=missing,
        )
    _refuse_newer(version)
    if version != sql.SCHEMA_VERSION:
        raise SchemaError(
            f"this database's job tables are an older schema ({version or 'pre-fence'}); a "
            "read-only store cannot upgrade them — open it read-write once",
            version=version,
        )
