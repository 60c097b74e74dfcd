"""Opening the store a command works on: probe read-only, upgrade in place or read a copy."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from jaren_jobs.backends.sqlite.errors import is_not_a_database
from jaren_jobs.backends.sqlite.opening import copy_database
from jaren_jobs.backends.sqlite.queries import SCHEMA_VERSION
from jaren_jobs.cli.arguments import CliError
from jaren_jobs.errors import JobsError, SchemaError
from jaren_jobs.store import Store, open_store


def _require_db(path: str | None) -> str:
    if not path:
        raise CliError("no database: pass --db PATH (or a postgresql:// URL) or set JAREN_JOBS_DB")
    if not Path(path).is_file():
        raise CliError(f"no database at {path!r}")
    return path


def _upgradable(refusal: SchemaError) -> bool:
    """Whether a read-only store refused only because the schema is older."""
    missing = refusal.details.get("missing")
    if missing:
        return "_jaren_jobs" not in missing
    if "version" not in refusal.details:
        return False
    version = refusal.details["version"]
    return version is None or version < SCHEMA_VERSION


def _is_url(path: str | None) -> bool:
    return bool(path) and str(path).startswith(("postgresql://", "postgres://"))


def _shown(url: str) -> str:
    """A URL as a message may show it: never its password."""
    head, at, rest = url.rpartition("@")
    if not at:
        return url
    scheme, _, who = head.partition("://")
    return f"{scheme}://{who.split(':', 1)[0]}@{rest}"


@contextlib.contextmanager
def _opened_url(url: str, *, readonly: bool) -> Iterator[Store]:
    """A PostgreSQL store: a read-only command uses read-only transactions and creates
    nothing; a write command creates or upgrades the tables, as every open does."""
    try:
        store = open_store(url, readonly=readonly)
    except SchemaError as exc:
        raise CliError(f"{_shown(url)} has no jaren_jobs tables ({exc.message})") from None
    except ImportError as exc:
        raise CliError(str(exc)) from None
    except JobsError as exc:
        raise CliError(f"cannot open {_shown(url)}: {exc.message}") from None
    with contextlib.closing(store):
        yield store


@contextlib.contextmanager
def opened(path: str | None, *, readonly: bool) -> Iterator[Store]:
    """The store a command works on; a read-only command never changes the file."""
    if path is not None and _is_url(path):
        with _opened_url(path, readonly=readonly) as store:
            yield store
        return
    checked = _require_db(path)
    older: SchemaError | None = None
    try:
        # probe read-only first, so that no command ever creates job tables in
        # a file that is not a jaren_jobs database
        probe = open_store(checked, readonly=True)
    except SchemaError as exc:
        if not _upgradable(exc):
            if "_jaren_jobs" in exc.details.get("missing", ()):
                raise CliError(
                    f"{checked!r} is not a jaren_jobs database (no job tables)"
                ) from None
            raise CliError(f"cannot open {checked!r}: {exc.message}") from None
        older = exc  # an older (or partial) jaren_jobs schema
    except JobsError as exc:
        if exc.__cause__ is not None and is_not_a_database(exc.__cause__):
            raise CliError(
                f"{checked!r} is not a jaren_jobs database (it is not an SQLite file)"
            ) from None
        raise CliError(f"cannot open {checked!r}: {exc.message}") from None
    if older is None and readonly:
        with contextlib.closing(probe):
            yield probe
        return
    if older is None:
        probe.close()
    if older is not None and readonly:
        with _upgraded_copy(checked, older) as copy:
            yield copy
        return
    try:
        # read-write upgrades an older schema in place, forward only, as the
        # library does on every open
        store = open_store(checked)
    except JobsError as exc:
        raise CliError(f"cannot open {checked!r}: {exc.message}") from None
    with contextlib.closing(store):
        yield store


@contextlib.contextmanager
def _upgraded_copy(path: str, older: SchemaError) -> Iterator[Store]:
    """A private, upgraded copy of an older-schema file, for reading it unchanged.

    A read-only connection cannot run the upgrade, and the queries are the
    current schema's: so the file is copied (SQLite's online backup, through
    a read-only connection) into a temporary directory, and the copy is
    upgraded and read. Only the read-only commands take this path.
    """
    version = older.details.get("version")
    schema = "pre-fence" if version is None else f"version {version}"
    with tempfile.TemporaryDirectory(prefix="jaren-jobs-read-") as folder:
        copy = os.path.join(folder, "copy.db")
        try:
            copy_database(path, copy)
            store = open_store(copy, durability="normal")
        except (OSError, JobsError) as exc:
            raise CliError(
                f"cannot read {path!r}: its job tables are an older schema ({schema}) and an "
                f"upgraded copy to read could not be made ({exc}); a write command (cancel, "
                "requeue, sweep, worker) upgrades the file in place"
            ) from None
        print(
            f"jaren-jobs: note: {path!r} holds an older schema of the job tables ({schema}); "
            "read from an upgraded private copy, the file is unchanged (a write command "
            "upgrades it in place)",
            file=sys.stderr,
        )
        with contextlib.closing(store):
            yield store
