"""Shared fixtures: a fake clock, deterministic runtimes, and stores on every backend.

``backend`` is parametrised over the harnesses of :mod:`tests.harness` (an
SQLite file the store opens itself, and an application-owned
``sqlite3.Connection``); ``store`` and ``real_store`` are built from it, so
every test that takes a store runs once per backend. A test that needs a
capability not every backend has declares it with
``@pytest.mark.requires(...)``: it is collected only for the backends that
have it, and the summary says how many were left out and why.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

import jaren_jobs
from jaren_jobs import AsyncStore, Runtime, Store
from tests import postgres_server
from tests.async_bridge import BridgeStore
from tests.harness import (
    CAPABILITIES,
    HARNESSES,
    ONCE_PER_API,
    POSTGRES_HARNESSES,
    Harness,
    psycopg,
    with_search_path,
)
from tests.pg_schemas import SchemaPool

START = 1_800_000_000.0  # 2027-01-15, a fixed epoch for every fake clock

# Hypothesis: a short profile by default, for the edit-and-test loop; .ci/run selects
# the longer one, HYPOTHESIS_PROFILE=ci: Hypothesis's own CI profile (100 examples,
# derandomized, no example database), which it would load by itself where CI is set.
# Tests that set no example count of their own follow the profile (the cron oracle
# scales its counts by it: tests/unit/test_cron_oracle.py). No deadline in either: a
# shared two-core machine makes a per-example time limit noise.
settings.register_profile("dev", settings.get_profile("default"), max_examples=25, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


class FakeClock:
    """A manual clock: ``now()`` returns what the test set; thread-safe."""

    def __init__(self, start: float = START) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        with self._lock:
            self._now += seconds
            return self._now

    def set(self, value: float) -> None:
        with self._lock:
            self._now = value


class Sequence:
    """Deterministic uuid() and random() sources."""

    def __init__(self, prefix: str = "id", draw: float = 0.5) -> None:
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self.prefix = prefix
        self.draw = draw

    def uuid(self) -> str:
        with self._lock:
            return f"{self.prefix}-{next(self._counter):06d}"

    def random(self) -> float:
        return self.draw


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ids() -> Sequence:
    return Sequence()


@pytest.fixture
def runtime(clock: FakeClock, ids: Sequence) -> Runtime:
    return Runtime(now=clock.now, random=ids.random, uuid=ids.uuid)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "jobs.db"


def required_capabilities(node: pytest.Item | pytest.Function) -> frozenset[str]:
    """What a test declared with ``@pytest.mark.requires`` (its own, its class's, its params')."""
    found: set[str] = set()
    for mark in node.iter_markers("requires"):
        found.update(mark.args)
    conformance = node.nodeid.startswith("tests/conformance/")
    if conformance and "sqlite" in found:
        # the suite holds what every backend promises; SQLite's own goes to its folder
        raise pytest.UsageError(
            f"{node.nodeid}: requires('sqlite') in tests/conformance/: move the test to "
            "tests/backends/sqlite/ (mark it both_apis to keep the async harness)"
        )
    uses_backend = "backend" in getattr(node, "fixturenames", ())
    if node.nodeid.startswith("tests/backends/sqlite/") and uses_backend:
        found.add("sqlite")  # SQLite's own mechanics: its folder runs on its harnesses only
    if not conformance and uses_backend and node.get_closest_marker("both_apis") is None:
        # a database's own mechanics, processes, properties: the sync API's harnesses; the
        # async harnesses run the conformance suite (what the API promises) and the tests
        # marked both_apis
        found.add("sync-api")
    unknown = found - set(CAPABILITIES)
    if unknown:
        raise pytest.UsageError(
            f"{node.nodeid}: unknown capabilities {sorted(unknown)} in @pytest.mark.requires "
            f"(known: {sorted(CAPABILITIES)})"
        )
    return frozenset(found)


# Why the PostgreSQL harnesses cannot run here (None: they can), and the
# server this session started for them (stopped at the end of the session).
_POSTGRES_CHECKED = False
_POSTGRES_MISSING: str | None = None
_SESSION_SERVER: postgres_server.PostgresServer | None = None
# the session's migrated schemas, which the backend fixture's harnesses take and give back
_SCHEMAS: SchemaPool | None = None


def schema_pool() -> SchemaPool:
    """The session's pool of migrated PostgreSQL schemas (after :func:`require_postgres`)."""
    global _SCHEMAS
    if _SCHEMAS is None:
        _SCHEMAS = SchemaPool(os.environ["JAREN_JOBS_TEST_POSTGRES_URL"], psycopg, with_search_path)
    return _SCHEMAS


def _find_postgres() -> str | None:
    """Point JAREN_JOBS_TEST_POSTGRES_URL at a server, starting one if none is named."""
    global _SESSION_SERVER
    if psycopg is None:
        return "psycopg is not installed: pip install -e '.[dev]' (or jaren_jobs[postgres])"
    if os.environ.get("JAREN_JOBS_TEST_POSTGRES_URL"):
        return None
    try:
        _SESSION_SERVER = postgres_server.start()
    except postgres_server.ServerUnavailable as exc:
        return str(exc)
    # spawned worker processes of the tests inherit it
    os.environ["JAREN_JOBS_TEST_POSTGRES_URL"] = _SESSION_SERVER.url
    return None


def pytest_unconfigure(config: pytest.Config) -> None:
    global _SESSION_SERVER, _SCHEMAS
    if _SCHEMAS is not None:
        _SCHEMAS.close()
        _SCHEMAS = None
    if _SESSION_SERVER is not None:
        _SESSION_SERVER.destroy()
        _SESSION_SERVER = None


def require_postgres() -> str:
    """The test server's URL; skips the test (fails it in CI) when there is none.

    The first call of a session finds (or starts) the server, so a run of tests
    that never touch PostgreSQL never starts one.
    """
    global _POSTGRES_CHECKED, _POSTGRES_MISSING
    if not _POSTGRES_CHECKED:
        _POSTGRES_CHECKED = True
        _POSTGRES_MISSING = _find_postgres()
    if _POSTGRES_MISSING is not None:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL tests must run in CI: {_POSTGRES_MISSING}")
        pytest.skip(_POSTGRES_MISSING)
    return os.environ["JAREN_JOBS_TEST_POSTGRES_URL"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "requires(*capabilities): the test runs only on backends that have them "
        f"({', '.join(sorted(CAPABILITIES))}; see tests/harness.py)",
    )
    config.addinivalue_line(
        "markers",
        "both_apis: outside tests/conformance/, the test runs on the async harnesses too "
        "(sync-api is implied there otherwise)",
    )
    config.addinivalue_line(
        "markers",
        "once_per_api: the test checks what no backend takes part in (arguments refused "
        "before any statement): it runs on one harness of each API, "
        f"{' and '.join(h.name for h in ONCE_PER_API)}, not on all six",
    )


_LEFT_OUT: list[tuple[str, str, frozenset[str]]] = []  # (test, backend, what it lacks)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept: list[pytest.Item] = []
    left_out: list[pytest.Item] = []
    runs: dict[str, int] = {}  # each test (and param): on how many backends it still runs
    for item in items:
        needs = required_capabilities(item)
        uses_backend = "backend" in getattr(item, "fixturenames", ())
        if needs and not uses_backend:
            raise pytest.UsageError(
                f"{item.nodeid}: @pytest.mark.requires names a backend capability, "
                "but the test takes no backend (nor a store built from one)"
            )
        harness = _harness_of(item)
        once = item.get_closest_marker("once_per_api") is not None
        if harness is not None and once and harness not in ONCE_PER_API:
            left_out.append(item)
            _LEFT_OUT.append((item.nodeid, harness.name, frozenset({"once-per-api"})))
            continue
        base = item.nodeid  # the test with the backend taken out of its id
        if harness is not None:
            for shown in (f"[{harness.name}]", f"{harness.name}-", f"-{harness.name}"):
                base = base.replace(shown, "")
        runs.setdefault(base, 0)
        if harness is not None and not needs <= harness.capabilities:
            left_out.append(item)
            _LEFT_OUT.append((item.nodeid, harness.name, needs - harness.capabilities))
            continue
        runs[base] += 1
        kept.append(item)
    orphans = sorted(base for base, count in runs.items() if count == 0)
    if orphans and left_out:
        raise pytest.UsageError(
            "no backend has what these tests require, so they would never run: "
            + ", ".join(orphans)
        )
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


def _harness_of(item: pytest.Item) -> type[Harness] | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    param: Any = callspec.params.get("backend")
    return param if isinstance(param, type) and issubclass(param, Harness) else None


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _LEFT_OUT:
        return
    counts: dict[tuple[str, frozenset[str]], int] = {}
    for _, name, lacking in _LEFT_OUT:
        counts[(name, lacking)] = counts.get((name, lacking), 0) + 1
    terminalreporter.section("backends")
    for (name, lacking), count in sorted(counts.items(), key=lambda kv: kv[0][0]):
        terminalreporter.line(
            f"{count} test{'' if count == 1 else 's'} not run on {name}: "
            + (
                "it runs once per API"
                if lacking == {"once-per-api"}
                else f"it lacks {', '.join(sorted(lacking))}"
            )
        )


@pytest.fixture(params=HARNESSES, ids=[harness.name for harness in HARNESSES])
def backend(request: pytest.FixtureRequest, db_path: Path) -> Iterator[Harness]:
    """The database under test, reached through its harness (see tests/harness.py)."""
    harness_class: type[Harness] = request.param
    options: dict[str, Any] = {}
    if harness_class in POSTGRES_HARNESSES:
        require_postgres()
        options["schemas"] = schema_pool()  # migrated once, emptied between tests
    needs = required_capabilities(request.node)
    missing = needs - harness_class.capabilities
    if missing:  # collection leaves these out; reaching here is a wiring mistake
        pytest.fail(f"{harness_class.name} lacks {sorted(missing)}, which this test requires")
    harness = harness_class(db_path, declared=needs, **options)
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture
def store(backend: Harness, runtime: Runtime) -> Store:
    """A store on the backend under test, on the fake clock (closed by the harness)."""
    return backend.open(runtime=runtime)


@pytest.fixture
def astore(store: Store) -> AsyncStore:
    """The store under test under asyncio, for async-native tests: an ``AsyncStore`` over
    the harness's store (on an async harness, over the sync store its bridge drives), used
    from the test's own event loop (``asyncio.run``); the harness closes what is underneath."""
    return AsyncStore(store.astore.store if isinstance(store, BridgeStore) else store)


@pytest.fixture
def real_store(backend: Harness) -> Store:
    """A store on the platform clock, for tests about real threads and time."""
    return backend.open()


__all__ = ["START", "FakeClock", "Sequence", "jaren_jobs", "require_postgres"]
