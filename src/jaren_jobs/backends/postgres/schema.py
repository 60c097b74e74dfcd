"""Creating and upgrading the tables: numbered SQL migrations, forward only, one at a time.

``migrations/NNNN_*.sql`` are applied in order, each in the transaction that
records it, under a transaction-scoped advisory lock keyed by the schema: many
processes opening a fresh database at once create it once (the others wait,
then find it done). The tables live in the schema the store resolved at open
(``queries.RESOLVE_SCHEMA``), which every statement names.
"""

from __future__ import annotations

from importlib import resources

from jaren_jobs.backends.postgres import queries as sql
from jaren_jobs.backends.postgres.connection import PgDatabase
from jaren_jobs.errors import SchemaError, StorageError

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "ensure_schema", "require_schema"]


def _migrations() -> list[tuple[int, str, str]]:
    folder = resources.files(__package__).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:4].isdigit():
            found.append((int(name[:4]), name, entry.read_text(encoding="utf-8")))
    found.sort()
    numbers = [number for number, _, _ in found]
    assert numbers == list(range(1, len(found) + 1)), f"migrations must be numbered 1..n: {numbers}"
    return found


# SQLSTATE insufficient_privilege: e.g. CREATE refused on the schema
_INSUFFICIENT_PRIVILEGE = "42501"

MIGRATIONS = _migrations()
SCHEMA_VERSION = len(MIGRATIONS)


def _version(db: PgDatabase, doing: str) -> int:
    found = db.one(sql.TABLE_EXISTS, {"schema": db.schema, "name": "_jaren_meta"}, doing=doing)
    if found is None:
        return 0
    row = db.one(sql.READ_SCHEMA_VERSION, doing=doing)
    return 0 if row is None else int(row[0])


def ensure_schema(db: PgDatabase) -> None:
    """Apply every migration the database lacks (none: a quick read)."""
    doing = "creating the tables"

    def check() -> int:
        return _version(db, doing)

    current = db.transaction(check, doing=doing, read_only=True)
    if current == SCHEMA_VERSION:
        return
    if current > SCHEMA_VERSION:
        raise SchemaError(
            f"the tables are at schema {current}, newer than this jaren_jobs knows "
            f"({SCHEMA_VERSION}); upgrade jaren_jobs",
            found=current,
        )

    def migrate() -> None:
        db.run(sql.MIGRATION_LOCK, {"schema": db.schema}, doing=doing)
        db.run(sql.CREATE_META, doing=doing)
        found = _version(db, doing)  # another process may have done it meanwhile
        for number, _, text in MIGRATIONS:
            if number > found:
                db.run(text, doing=f"{doing} (migration {number})")
                db.run(sql.WRITE_SCHEMA_VERSION, {"v": str(number)}, doing=doing)

    try:
        db.transaction(migrate, doing=doing)
    except StorageError as exc:
        if exc.details.get("sqlstate") != _INSUFFICIENT_PRIVILEGE:
            raise
        # a role without CREATE (the application's, docs/postgres.md): the tables
        # could not be created or upgraded, which SPEC §4 names SchemaError
        raise SchemaError(
            f"{doing}: this role may not create or upgrade the jaren_jobs tables "
            f"(they are at schema {current}, this jaren_jobs needs {SCHEMA_VERSION}): "
            "open a store once as the schema's owner (a deploy step), then as this "
            f"role — {exc.message}",
            found=current,
            needed=SCHEMA_VERSION,
            sqlstate=_INSUFFICIENT_PRIVILEGE,
        ) from exc.__cause__


def require_schema(db: PgDatabase) -> None:
    """A read-only store creates nothing: the tables must be there already."""
    doing = "opening read-only"
    current = db.transaction(lambda: _version(db, doing), doing=doing, read_only=True)
    if current == 0:
        raise SchemaError(
            "the jaren_jobs tables are missing and a read-only store creates nothing; "
            "open it once without readonly=True first",
            readonly=True,
        )
    if current > SCHEMA_VERSION:
        raise SchemaError(
            f"the tables are at schema {current}, newer than this jaren_jobs knows "
            f"({SCHEMA_VERSION}); upgrade jaren_jobs",
            found=current,
        )
