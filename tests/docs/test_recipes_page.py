"""docs/recipes.md shows the recipe files verbatim, and every recipe file is on the page.

The files under examples/recipes/ are what tests/integration/test_recipes_*.py
run (real servers, real worker processes); this keeps the page's code the
code that runs. A block shows a file when its first line is that file's
own header comment, ``# examples/recipes/<path>``.
"""

from __future__ import annotations

from pathlib import Path

from tests.docs.test_examples import (
    EXAMPLES,
    RECIPE_FILE,
    REPO,
    fenced_blocks,
    shown_recipe_file,
)

PAGE = REPO / "docs" / "recipes.md"
RECIPES = REPO / "examples" / "recipes"
# boilerplate the page names without showing
NOT_SHOWN: set[str] = set()


def recipe_files() -> list[Path]:
    return sorted(
        path
        for path in RECIPES.rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and path.read_text(encoding="utf-8").strip()  # empty __init__.py files
        and path.relative_to(RECIPES).as_posix() not in NOT_SHOWN
    )


def test_every_block_that_names_a_recipe_file_is_that_file_verbatim() -> None:
    shown: list[Path] = []
    for block in fenced_blocks(PAGE):
        path = shown_recipe_file(block)
        if path is None:
            assert not block.code.startswith("# examples/"), block.name
            continue
        assert path.is_file(), f"{block.name} shows {path}, which does not exist"
        assert block.code == path.read_text(encoding="utf-8"), (
            f"{block.name} differs from {path.relative_to(REPO)}"
        )
        assert block.info == ("python" if path.suffix == ".py" else "ini"), block.name
        shown.append(path)
    assert len(shown) == len(set(shown)), "a file is shown twice"
    assert sorted(shown) == recipe_files()


def test_every_recipe_file_names_itself_on_its_first_lines() -> None:
    for path in [*recipe_files(), *(RECIPES / name for name in NOT_SHOWN)]:
        lines = path.read_text(encoding="utf-8").splitlines()
        header = lines[1] if lines[0].startswith("#!") else lines[0]
        named = RECIPE_FILE.match(header)
        assert named is not None, f"{path}: no header comment"
        assert REPO / named.group(1) == path, f"{path}: names {named.group(1)}"


def test_the_page_is_linked_from_the_readme_and_the_index() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    first_screen = "\n".join(readme.splitlines()[:40])
    assert "(docs/recipes.md)" in first_screen
    assert "(recipes.md)" in (REPO / "docs" / "index.md").read_text(encoding="utf-8")


def test_the_fastapi_recipe_the_page_points_to_is_run_by_the_docs_tests() -> None:
    assert "(asyncio.md#fastapi)" in PAGE.read_text(encoding="utf-8")
    page = REPO / "docs" / "asyncio.md"
    assert "\n## FastAPI\n" in page.read_text(encoding="utf-8")
    executed = [block.code for block in EXAMPLES if block.page == page]
    assert any(
        "FastAPI(lifespan=lifespan)" in code
        and "create_worker(" in code
        and "await tx.jobs.enqueue(" in code
        for code in executed
    )
