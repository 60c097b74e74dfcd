"""The mypy pair (issue 17, SPEC §13 "Typing"): typed user code is checked, typos are caught.

``tests/typing/ok.py`` is a small typed program that must pass ``mypy
--strict``; ``tests/typing/bad.py`` holds the typos of the issue, each on a
line marked ``# error: <code>``, and must fail with exactly those errors.
mypy reads the jaren_jobs this suite imports (``MYPYPATH``), not whatever
the environment has installed, and runs outside the repository so no
project configuration changes what it checks.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import jaren_jobs

HERE = Path(__file__).resolve().parent.parent / "typing"
SRC = Path(jaren_jobs.__file__).resolve().parent.parent

# path:line: error: message  [code]
ERROR_LINE = re.compile(
    r"^(?P<path>[^:]+):(?P<line>\d+): error: (?P<message>.*)\s+\[(?P<code>[a-z-]+)\]$"
)
MARKED = re.compile(r"#\s*error:\s*(?P<code>[a-z-]+)\s*$")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # shared by both runs: the second one reads jaren_jobs from the first one's cache
    return tmp_path_factory.mktemp("mypy-cache")


def mypy(program: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, MYPYPATH=str(SRC))
    env.pop("MYPY_CACHE_DIR", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            "--show-error-codes",
            "--no-color-output",
            "--cache-dir",
            str(cache),
            str(program),
        ],
        check=False,
        cwd=cache,  # no pyproject/mypy.ini here: only the flags above apply
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_typed_program_passes_mypy_strict(cache_dir: Path) -> None:
    done = mypy(HERE / "ok.py", cache_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == ""


def test_the_typos_of_the_issue_fail_mypy_strict_with_exactly_those_errors(
    cache_dir: Path,
) -> None:
    program = HERE / "bad.py"
    expected = {
        (number, match["code"])
        for number, text in enumerate(program.read_text().splitlines(), start=1)
        if (match := MARKED.search(text))
    }
    assert len(expected) == 5  # the file and this test move together
    done = mypy(program, cache_dir)
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [m for line in done.stdout.splitlines() if (m := ERROR_LINE.match(line))]
    # every error is in bad.py, on a marked line, with the marked code; none is missing
    assert {Path(m["path"]).name for m in errors} == {"bad.py"}, done.stdout
    assert {(int(m["line"]), m["code"]) for m in errors} == expected, done.stdout
    assert len(errors) == len(expected), done.stdout
    messages = {int(m["line"]): m["message"] for m in errors}
    by_code = {code: messages[number] for number, code in expected}
    assert 'Unexpected keyword argument "concurency" for "create_worker"' in by_code["call-arg"]
    assert (
        '"Worker" has no attribute "strat"'
        in messages[min(n for n, c in expected if c == "attr-defined")]
    )
    assert 'has no attribute "DAED"' in messages[max(n for n, c in expected if c == "attr-defined")]
    assert 'Argument "reset_attempts" to "requeue"' in by_code["arg-type"]
    assert '"JsonValue | CorruptJson"' in by_code["assignment"]
