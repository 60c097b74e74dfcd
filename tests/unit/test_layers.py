"""Guard rails for the layout (DESIGN.md): layers point one way, drivers stay in their place.

Every ``import`` in ``src/jaren_jobs`` is read with ``ast`` — at module level,
inside functions and under ``TYPE_CHECKING`` alike, since each is a
dependency a reader has to follow. The tables below are the rules; the
``KNOWN_*`` sets are today's offenders, which may only shrink: a new
offender fails, and so does an entry that is no longer needed.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "jaren_jobs"

# Lowest first. A module may import modules of its own layer or below.
LAYERS: list[set[str]] = [
    {"errors", "runtime", "signals", "codec", "records", "cron", "snooze", "tracebacks"},
    # the observation seam (SPEC §17): a dependency-free leaf the engine and workers call
    {"observe"},
    {"core"},
    {"gate", "agate", "rows", "backend", "abackend", "cursor"},
    {"backends"},
    {"pages", "hub", "waiting", "history", "admin", "aadmin"},
    {"engine", "aengine", "atransaction", "checkpoints", "acheckpoints", "batcher", "aio"},
    # schedules and tick enqueueing: over the engine, given to workers
    {"periodic"},
    {"worker"},
    {"store"},
    {"arunner", "aturns"},
    {"arenewals"},
    {"aqueue"},
    {"aworker"},
    {"atx"},
    {"ajobs"},
    # observability: the OpenTelemetry and Prometheus adapters (SPEC §17), which the
    # dashboard and the CLI serve
    {"astore", "dag", "contrib", "dashboard", "demo", "cli", "testing", "observability"},
    {"__init__", "__main__"},
]

# Who may import a database driver (DESIGN.md: one folder each).
DRIVER_HOMES = {
    "sqlite3": ("backends/sqlite/",),
    "psycopg": ("backends/postgres/",),
    "psycopg_pool": ("backends/postgres/",),
}

# The pure core: no I/O, threads, clocks, event loops or drivers.
CORE_BANNED = {
    "sqlite3",
    "psycopg",
    "psycopg_pool",
    "threading",
    "time",
    "asyncio",
    "socket",
    "os",
    "random",
    "concurrent",
    "subprocess",
}

# Today's offenders, shrinking as the backend seam moves in (issue 13).
KNOWN_DRIVER_IMPORTS: set[tuple[str, str]] = set()
KNOWN_UPWARD_IMPORTS: set[tuple[str, str]] = set()
# Pairs of modules that import each other (lazily or for typing); shrinking.
KNOWN_MUTUAL_IMPORTS: set[frozenset[str]] = set()


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def _top(path: Path) -> str:
    """The layer name of a module: its first path part under the package."""
    relative = path.relative_to(SRC)
    return relative.parts[0].removesuffix(".py")


def _imports(path: Path, *, module_level_only: bool = False) -> list[tuple[str, int]]:
    """(imported name, level) for every import in a file; level 0 is absolute.

    ``from . import x`` reads as ``("x", 1)``. With ``module_level_only``,
    only the imports that run when the module is imported count.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    found: list[tuple[str, int]] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level and not node.module:
                found += [(alias.name, node.level) for alias in node.names]
            else:
                found.append((node.module or "", node.level))
    return found


def _internal_target(path: Path, name: str, level: int) -> str | None:
    """The top-level package module a relative (or absolute own) import reaches."""
    if level == 0:
        if name == "jaren_jobs" or name.startswith("jaren_jobs."):
            rest = name.split(".")[1:]
            return rest[0] if rest else "__init__"
        return None
    package = path.relative_to(SRC).parts[:-1]
    base = package[: len(package) - (level - 1)]
    parts = [*base, *name.split(".")] if name else list(base)
    return parts[0] if parts else "__init__"


def _layer(name: str) -> int:
    for index, layer in enumerate(LAYERS):
        if name in layer:
            return index
    raise AssertionError(f"module {name!r} is in no layer of tests/unit/test_layers.py")


def test_every_module_has_a_layer() -> None:
    for path in _modules():
        _layer(_top(path))


def test_layers_point_one_way() -> None:
    upward: set[tuple[str, str]] = set()
    for path in _modules():
        mine = _top(path)
        for name, level in _imports(path):
            target = _internal_target(path, name, level)
            if target is None or target == mine:
                continue
            if _layer(target) > _layer(mine):
                upward.add((str(path.relative_to(SRC)), target))
    assert upward - KNOWN_UPWARD_IMPORTS == set(), "new upward imports"
    assert KNOWN_UPWARD_IMPORTS - upward == set(), "fixed: drop them from KNOWN_UPWARD_IMPORTS"


def test_drivers_are_imported_only_in_their_backend() -> None:
    offenders: set[tuple[str, str]] = set()
    for path in _modules():
        relative = str(path.relative_to(SRC))
        for name, level in _imports(path):
            if level:
                continue
            driver = name.split(".")[0]
            homes = DRIVER_HOMES.get(driver)
            if homes is not None and not relative.startswith(homes):
                offenders.add((relative, driver))
    assert offenders - KNOWN_DRIVER_IMPORTS == set(), "a driver imported outside its backend"
    assert KNOWN_DRIVER_IMPORTS - offenders == set(), "fixed: drop them from KNOWN_DRIVER_IMPORTS"


def test_the_core_is_pure() -> None:
    for path in sorted((SRC / "core").rglob("*.py")):
        for name, level in _imports(path):
            if level == 0:
                assert name.split(".")[0] not in CORE_BANNED, (path.name, name)
            else:
                target = _internal_target(path, name, level)
                assert target is not None
                assert _layer(target) <= _layer("core"), (path.name, target)


def test_no_import_cycles_at_module_level() -> None:
    """Imports that run at import time (module level, outside TYPE_CHECKING) form no cycle."""
    graph: dict[str, set[str]] = {}
    for path in _modules():
        mine = _top(path)
        for name, level in _imports(path, module_level_only=True):
            target = _internal_target(path, name, level)
            if target is not None and target != mine:
                graph.setdefault(mine, set()).add(target)
    seen: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(node: str, trail: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if seen.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*trail, node, nxt]))
            if nxt not in seen:
                visit(nxt, [*trail, node])
        seen[node] = 2

    for start in sorted(graph):
        if start not in seen:
            visit(start, [])


def test_no_two_modules_import_each_other() -> None:
    """Counting lazy and typing-only imports too: a pair that needs each other is one module."""
    edges: set[tuple[str, str]] = set()
    for path in _modules():
        mine = _top(path)
        for name, level in _imports(path):
            target = _internal_target(path, name, level)
            if target is not None and target not in (mine, "__init__"):
                edges.add((mine, target))
    mutual = {frozenset(edge) for edge in edges if (edge[1], edge[0]) in edges}
    assert mutual - KNOWN_MUTUAL_IMPORTS == set(), "modules that import each other"
    assert KNOWN_MUTUAL_IMPORTS - mutual == set(), "fixed: drop them from KNOWN_MUTUAL_IMPORTS"
