"""Guard rails for the layout (DESIGN.md): layers point one way, files form no circle.

Every ``import`` in ``src/jaren_jobs`` is read with ``ast`` — at module level,
inside functions and under ``TYPE_CHECKING`` alike, since each is a
dependency a reader has to follow — and resolved to the *file* it reaches
(``from jaren_jobs.engine import hub`` reaches ``engine/hub.py``; ``from
jaren_jobs.worker import Worker`` reaches ``worker/__init__.py``). There is no
list of known offenders: a rule here holds everywhere, or the test fails.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "jaren_jobs"
BENCH = ROOT / "bench"

# Lowest first. A file may import files of its own layer or below; a layer is named
# by a top-level file or folder of the package (a folder covers everything in it).
LAYERS: list[set[str]] = [
    {"errors", "runtime", "signals", "codec", "records", "cron", "snooze", "tracebacks"},
    # the observation seam (SPEC §17): a dependency-free leaf the engine and workers call
    {"observe"},
    {"core"},  # pure: see test_the_core_is_pure
    {"gate", "gate_async", "backend", "backend_async", "cursor"},
    {"backends"},
    {"engine"},
    # schedules and tick enqueueing: over the engine, given to workers
    {"periodic"},
    {"worker", "jobs", "transaction", "transaction_async"},
    {"store"},
    {"aio"},  # the asyncio front door, over the sync one
    # observability: the OpenTelemetry and Prometheus adapters (SPEC §17), which the
    # dashboard and the CLI serve
    {"dag", "contrib", "dashboard", "demo", "cli", "testing", "observability"},
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

MAX_FILE_LINES = 600
MAX_CLASS_LINES = 500


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _name(path: Path, root: Path = SRC) -> str:
    """A file's dotted name under its package: ``engine.hub``, ``worker.__init__``."""
    return ".".join(path.relative_to(root).with_suffix("").parts)


def _imports(path: Path) -> list[ast.Import | ast.ImportFrom]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


@cache
def _file_of(dotted: str, root: Path = SRC, package: str = "jaren_jobs") -> str | None:
    """The file a dotted module name reaches, as ``_name`` gives it, or None if not ours."""
    parts = dotted.split(".")
    if parts[0] != package:
        return None
    rest = parts[1:]
    base = root.joinpath(*rest)
    if base.with_suffix(".py").is_file():
        return ".".join(rest)
    if (base / "__init__.py").is_file():
        return ".".join([*rest, "__init__"])
    raise AssertionError(f"{dotted} names no file under {root}")


def _absolute(path: Path, node: ast.ImportFrom, package: str = "jaren_jobs") -> str:
    if not node.level:
        return node.module or ""
    here = [package, *path.relative_to(SRC).parts[:-1]]
    base = here[: len(here) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _targets(path: Path, root: Path = SRC, package: str = "jaren_jobs") -> set[str]:
    """Every file of ``root`` that ``path`` imports, wherever the import statement is."""
    found: set[str] = set()
    for node in _imports(path):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _file_of(alias.name, root, package)
                if target is not None:
                    found.add(target)
            continue
        module = _absolute(path, node, package) if root == SRC else node.module or ""
        target = _file_of(module, root, package)
        if target is None:
            continue
        folder = root.joinpath(*module.split(".")[1:])
        for alias in node.names:
            # `from pkg import module` reaches the module's file, not the package's
            if (folder / f"{alias.name}.py").is_file():
                found.add(".".join([*module.split(".")[1:], alias.name]))
            elif (folder / alias.name / "__init__.py").is_file():
                found.add(".".join([*module.split(".")[1:], alias.name, "__init__"]))
            else:
                found.add(target)
    return found - {_name(path, root)}


def _layer(name: str) -> int:
    top = name.split(".", maxsplit=1)[0]
    for index, layer in enumerate(LAYERS):
        if top in layer:
            return index
    raise AssertionError(f"{name!r} is in no layer of tests/unit/test_layers.py")


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph (a path that comes back to its start), or None."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def test_every_layer_names_something_that_exists() -> None:
    tops = {p.name.removesuffix(".py") for p in SRC.iterdir() if p.name != "__pycache__"}
    missing = {name for layer in LAYERS for name in layer} - tops
    assert missing == set(), f"the layer table names what does not exist: {sorted(missing)}"


def test_every_file_has_a_layer() -> None:
    for path in _files(SRC):
        _layer(_name(path))


def test_layers_point_one_way() -> None:
    upward = {
        (_name(path), target)
        for path in _files(SRC)
        for target in _targets(path)
        if _layer(target) > _layer(_name(path))
    }
    assert upward == set(), "upward imports"


def test_no_circle_of_files_counting_lazy_and_typing_imports() -> None:
    graph = {_name(path): _targets(path) for path in _files(SRC)}
    # a package's __init__ re-exports its files: importing it reaches them, and they may
    # import each other freely, so only an edge back INTO the __init__ makes a circle
    circle = _cycle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_no_circle_between_the_benchmark_files() -> None:
    graph = {_name(path, BENCH): _targets(path, BENCH, "bench") for path in _files(BENCH)}
    circle = _cycle(graph)
    assert circle is None, "import circle in bench/: " + " -> ".join(circle or [])


def test_drivers_are_imported_only_in_their_backend() -> None:
    offenders: set[tuple[str, str]] = set()
    for path in _files(SRC):
        relative = str(path.relative_to(SRC))
        for node in _imports(path):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            for name in names:
                homes = DRIVER_HOMES.get(name.split(".")[0])
                if homes is not None and not relative.startswith(homes):
                    offenders.add((relative, name))
    assert offenders == set(), "a driver imported outside its backend"


def test_the_core_is_pure() -> None:
    for path in _files(SRC / "core"):
        for node in _imports(path):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [_absolute(path, node)]
            for name in names:
                assert name.split(".")[0] not in CORE_BANNED, (path.name, name)
        for target in _targets(path):
            assert _layer(target) <= _layer("core"), (path.name, target)


def test_no_module_level_function_takes_self() -> None:
    """Methods live in classes: a function taking ``self`` bound onto a class from outside
    hides what the class is."""
    offenders = [
        f"{_name(path)}.{node.name}"
        for path in _files(SRC)
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.args.args
        and node.args.args[0].arg == "self"
    ]
    assert offenders == [], "module-level functions taking self"


def _folder(name: str) -> str:
    return name.rpartition(".")[0]


def test_no_private_name_is_imported_across_folders() -> None:
    """A ``_name`` is its folder's business; another folder gets a public name or nothing."""
    offenders: set[tuple[str, str]] = set()
    for path in _files(SRC):
        mine = _name(path)
        for node in _imports(path):
            if not isinstance(node, ast.ImportFrom):
                continue
            target = _file_of(_absolute(path, node))
            if target is None:
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and _folder(target) != _folder(mine):
                    offenders.add((mine, f"{target}.{alias.name}"))
    assert offenders == set(), "private names imported across folders"


@pytest.mark.parametrize("path", _files(SRC), ids=_name)
def test_no_file_over_600_lines_nor_class_over_500(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count("\n") <= MAX_FILE_LINES, f"{_name(path)}: {text.count(chr(10))} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            assert length <= MAX_CLASS_LINES, f"{_name(path)}.{node.name}: {length} lines"
