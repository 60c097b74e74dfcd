"""Every code example in README.md and docs/*.md runs, so the docs cannot drift.

Each ```python block is executed on its own, in a fresh interpreter and a
fresh temporary working directory: a block must be self-contained. Pages are
found when the tests are collected, so a new page is covered without
touching this file. ``examples/*.py`` run as scripts too.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 120.0
FIRST_SCREEN_LINES = 40

# an opening fence and its info string: ```python, ``` python, ~~~python, ...
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\s]*)[^`]*$")
PYTHON_INFO = {"python", "py", "python3"}
SHELL_INFO = {"sh", "bash", "shell", "console", "zsh"}


@dataclass(frozen=True)
class Block:
    page: Path
    number: int  # 1-based, counting this page's python blocks
    line: int  # 1-based line of the opening fence
    info: str
    code: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)} block {self.number} (line {self.line})"


def fenced_blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` (any language), numbered per language family."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    counters: dict[str, int] = {}
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence, info = opening.group("indent", "fence", "info")
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        body: list[str] = []
        j = i + 1
        while j < len(lines) and closing.match(lines[j]) is None:
            # a fence inside a list item is indented; its body is too
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        if j == len(lines):
            raise ValueError(f"{page}: the fence opened on line {i + 1} never closes")
        family = "python" if info.lower() in PYTHON_INFO else info.lower()
        counters[family] = counters.get(family, 0) + 1
        blocks.append(Block(page, counters[family], i + 1, info.lower(), "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def python_blocks(page: Path) -> list[Block]:
    return [block for block in fenced_blocks(page) if block.info in PYTHON_INFO]


def all_python_blocks() -> list[Block]:
    return [block for page in pages() for block in python_blocks(page)]


def clean_env() -> dict[str, str]:
    # the examples must not lean on the test run's environment
    return {k: v for k, v in os.environ.items() if not k.startswith(("JAREN_", "PYTEST_"))}


def run_python(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        env=clean_env(),
        check=False,
    )


# a block whose first line names a file under examples/recipes/ ("# examples/recipes/...")
# shows that file verbatim: tests/docs/test_recipes_page.py checks the two agree, and the
# tests/integration/test_recipes_*.py run the files as the page says (servers, processes)
RECIPE_FILE = re.compile(r"^# (examples/recipes/\S+)$")


def shown_recipe_file(block: Block) -> Path | None:
    """The recipe file ``block`` shows, if it shows one."""
    first = block.code.split("\n", 1)[0]
    named = RECIPE_FILE.match(first)
    return None if named is None else REPO / named.group(1)


EXAMPLES = [block for block in all_python_blocks() if shown_recipe_file(block) is None]


@pytest.mark.parametrize("block", EXAMPLES, ids=[b.name for b in EXAMPLES])
def test_every_python_block_in_the_docs_runs(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(block.code, encoding="utf-8")
    result = run_python([str(script)], cwd=tmp_path)
    if result.returncode != 0:
        pytest.fail(
            f"{block.name} failed with exit status {result.returncode}:\n"
            f"--- code ---\n{block.code}--- stderr ---\n{result.stderr}"
            f"--- stdout ---\n{result.stdout}",
            pytrace=False,
        )


def test_the_extractor_finds_every_python_block_of_every_page() -> None:
    assert (REPO / "README.md").is_file()
    assert python_blocks(REPO / "README.md"), "README.md shows no python example"
    for page in pages():
        text = page.read_text(encoding="utf-8")
        openings = re.findall(r"^[ \t]*(?:```|~~~)[ \t]*(?:python3?|py)[ \t]*$", text, re.M)
        found = python_blocks(page)
        # a page that has python fences yields at least one block, and no fence is missed
        assert len(found) == len(openings), page.name
        if openings:
            assert found, page.name
        for block in found:
            assert block.code.strip(), f"{block.name} is empty"


def test_the_extractor_reads_fences_the_way_markdown_does(tmp_path: Path) -> None:
    sample = tmp_path / "sample.md"
    sample.write_text(
        "text\n"
        "```python\nprint(1)\n```\n"
        "```sh\necho no\n```\n"
        "- a list item:\n\n"
        "  ```python\n  if True:\n      print(2)\n  ```\n"
        "````python\nprint('```')\n````\n",
        encoding="utf-8",
    )
    blocks = fenced_blocks(sample)
    assert [(b.info, b.number, b.line) for b in blocks] == [
        ("python", 1, 2),
        ("sh", 1, 5),
        ("python", 2, 10),
        ("python", 3, 14),
    ]
    assert [b.code for b in blocks if b.info == "python"] == [
        "print(1)\n",
        "if True:\n    print(2)\n",
        "print('```')\n",
    ]
    unclosed = tmp_path / "unclosed.md"
    unclosed.write_text("```python\nprint(1)\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 1 never closes"):
        fenced_blocks(unclosed)


def shell_commands(lines: list[str]) -> list[str]:
    """The commands in the shell-language fences among ``lines``."""
    commands: list[str] = []
    info: str | None = None  # the language of the fence we are in, if any
    for line in lines:
        opening = FENCE.match(line)
        if info is None:
            if opening is not None:
                info = opening.group("info").lower()
            continue
        if line.strip() in {"```", "~~~"}:
            info = None
        elif info in SHELL_INFO and line.strip() and not line.lstrip().startswith("#"):
            commands.append(line.strip().removeprefix("$ "))
    return commands


def readme_first_screen_commands() -> list[str]:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    return shell_commands(lines[:FIRST_SCREEN_LINES])


def test_readme_first_screen_shows_exactly_the_two_set_up_commands() -> None:
    commands = readme_first_screen_commands()
    assert len(commands) == 2, commands
    first, second = commands
    # first: install, then run something that shows the queue working
    assert first.startswith("pip install . && "), first
    # second: a development install, then the tests
    assert second == "pip install -e '.[dev]' && python -m pytest", second


def test_readme_first_command_runs(tmp_path: Path) -> None:
    """What the first command runs after installing (the package is installed here)."""
    first = readme_first_screen_commands()[0]
    run = shlex.split(first.split("&&", 1)[1])
    if run[0] == "python":
        args = run[1:]
        if args and not args[0].startswith("-"):
            args[0] = str(REPO / args[0])  # a script path, relative to the checkout
    elif run[0] == "jaren-jobs":
        args = ["-m", "jaren_jobs", *run[1:]]
    else:
        pytest.fail(f"README's first command runs {run[0]!r}: teach this test how to run it")
    result = run_python(args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), "the first command printed nothing"


SCRIPTS = sorted((REPO / "examples").glob("*.py"))


def test_there_are_example_scripts() -> None:
    assert SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_every_example_script_runs(script: Path, tmp_path: Path) -> None:
    result = run_python([str(script)], cwd=tmp_path)
    assert result.returncode == 0, f"examples/{script.name}:\n{result.stderr}"
    assert "Traceback" not in result.stderr
