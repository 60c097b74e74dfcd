"""The docs site builds with ``mkdocs build --strict``, and its API reference is the public API.

mkdocs.yml turns every link check on, so a broken link, a missing anchor, a
page left out of the nav or an API name mkdocstrings cannot find fails the
build, and this test prints mkdocs's own words. The reference pages render
each public name under the path it is imported by (``::: jaren_jobs.Store``),
never a module's, so moving a file inside the package cannot break them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import jaren_jobs
import jaren_jobs.dashboard

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "reference"
BUILD_TIMEOUT = 300.0

# "::: jaren_jobs.Store" (an mkdocstrings directive: one name, rendered from its docstring)
DIRECTIVE = re.compile(r"^:::[ \t]+(?P<path>\S+)[ \t]*$", re.M)

# public names the reference leaves out, each with its reason
NOT_RENDERED = {
    "__version__",  # a string, not an API
}
# the public modules below jaren_jobs whose own __all__ the reference renders
PUBLIC_MODULES = {"jaren_jobs.dashboard": jaren_jobs.dashboard}


def directives() -> dict[str, list[str]]:
    """Every directive's target, with the reference pages that name it."""
    found: dict[str, list[str]] = {}
    for page in sorted(REFERENCE.glob("*.md")):
        for match in DIRECTIVE.finditer(page.read_text(encoding="utf-8")):
            found.setdefault(match.group("path"), []).append(page.name)
    return found


def public_paths() -> set[str]:
    paths = {f"jaren_jobs.{name}" for name in jaren_jobs.__all__ if name not in NOT_RENDERED}
    for module_name, module in PUBLIC_MODULES.items():
        paths |= {f"{module_name}.{name}" for name in module.__all__}
    return paths


def test_the_reference_renders_every_public_name_once() -> None:
    rendered = directives()
    twice = {path: pages for path, pages in rendered.items() if len(pages) > 1}
    missing = sorted(public_paths() - set(rendered))
    assert not twice, f"rendered more than once: {twice}"
    assert not missing, f"public names no page of docs/reference/ renders: {missing}"


def test_the_reference_renders_public_paths_only() -> None:
    # a module path (jaren_jobs.store.Store) breaks when the file moves; the public one does not
    private = sorted(set(directives()) - public_paths())
    assert not private, (
        f"docs/reference/ renders names that are not public (not in jaren_jobs.__all__ "
        f"or a public module's __all__): {private}"
    )


def test_the_exclusions_name_public_names() -> None:
    assert NOT_RENDERED.issubset(jaren_jobs.__all__)


def test_the_docs_extra_and_the_dev_extra_pin_the_same_tools() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    # the README's test command installs dev, so dev must build what `.[docs]` builds
    assert extras["docs"], "the docs extra is empty"
    assert set(extras["docs"]).issubset(extras["dev"]), (extras["docs"], extras["dev"])


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once with --strict into a temporary folder."""
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError as missing:
        reason = f"the docs tools are not installed (pip install -e '.[docs]'): {missing}"
        if os.environ.get("CI"):
            pytest.fail(f"the docs site must build in CI: {reason}")
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,  # mkdocs.yml's griffe extension path is relative to the checkout
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        env=env,
        check=False,
    )
    if result.returncode != 0:
        # only mkdocs's WARNING and ERROR lines: the INFO lines bury them
        said = [line for line in result.stderr.splitlines() if not line.startswith("INFO")]
        pytest.fail(
            "mkdocs build --strict failed (exit {}):\n{}".format(
                result.returncode, "\n".join(said).strip()
            ),
            pytrace=False,
        )
    return out


def test_the_site_builds_strict(site: Path) -> None:
    pages = {path.parent.relative_to(site).as_posix() for path in site.rglob("index.html")}
    # every docs page is a page of the site (mkdocs --strict refuses one left out of the nav)
    for page in sorted((REPO / "docs").glob("*.md")):
        expected = "." if page.stem == "index" else page.stem
        assert expected in pages, f"docs/{page.name} is not on the site"


def test_the_reference_shows_each_name_from_its_docstring(site: Path) -> None:
    html = "\n".join(
        path.read_text(encoding="utf-8") for path in (site / "reference").rglob("index.html")
    )
    # each directive became a heading whose anchor is the public path
    for path in directives():
        assert f'id="{path}"' in html, f"{path} has no heading on the reference pages"
    # a docstring's own words, and one of a member inherited from the engine's base class
    assert "Add one job; wakes in-process workers once it is committed." in html
    assert 'id="jaren_jobs.Jobs.cancel"' in html
    # the Sphinx roles of the docstrings render as code (tools/docs_roles.py), not as text
    leftover = re.findall(r":(?:class|func|meth|attr|exc|data|mod):", html)
    assert not leftover, f"{len(leftover)} Sphinx roles left as text on the reference pages"


def test_the_site_fetches_nothing_from_the_network(site: Path) -> None:
    # theme.font: false; no CDN script or stylesheet, so the site reads offline
    fetched = set()
    for path in site.rglob("*.html"):
        text = path.read_text(encoding="utf-8")
        fetched |= set(re.findall(r'<(?:script|link|img)\b[^>]*(?:src|href)="(https?:[^"]+)', text))
    assert not fetched, sorted(fetched)


def test_the_readme_says_how_to_build_and_open_the_site() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "pip install -e '.[docs]' && mkdocs serve" in readme
    assert "http://127.0.0.1:8000/" in readme  # mkdocs serve's default address
