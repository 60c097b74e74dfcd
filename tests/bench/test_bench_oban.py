"""oban, the one PostgreSQL peer that needs Python 3.12, run by a bench on another Python.

The bench runs on the project's Python (3.11 in CI); oban's workloads run in
a 3.12 interpreter given by ``--oban-python`` (``$JAREN_JOBS_BENCH_OBAN_PYTHON``;
``.ci/run`` makes a venv for it), or the report says why oban was skipped.
Nothing here asserts a speed: only that oban's figures are measured and
reported beside the others, and that a missing interpreter is named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from bench.pg_oban import Remote
from bench.pg_peers import OBAN_PYTHON_ENV, PG_PEERS, PgPeer, resolve

from tests.bench import run_bench


def test_oban_on_this_python_without_another_says_how_to_run_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(OBAN_PYTHON_ENV, raising=False)
    found = resolve("oban")
    if sys.version_info >= (3, 12):  # oban can run here: in-process, if installed
        assert isinstance(found, PgPeer) or "not installed" in found
    else:
        assert isinstance(found, str)
        assert "Python >= 3.12" in found
        assert "--oban-python" in found
        assert OBAN_PYTHON_ENV in found


def test_an_interpreter_that_cannot_run_oban_is_named_with_its_reason() -> None:
    if sys.version_info >= (3, 12):  # pragma: no cover - CI's bench runs on 3.11
        pytest.skip("this interpreter could run oban itself")
    found = resolve("oban", sys.executable)
    assert isinstance(found, str)
    assert f"{sys.executable} cannot run oban" in found
    assert "not installed" in found
    with pytest.raises(RuntimeError, match=r"oban's version .* exited with 2"):
        Remote(PG_PEERS["oban"], sys.executable).call("version", capture=True)


def oban_python() -> str:
    python = os.environ.get(OBAN_PYTHON_ENV)
    if not python:
        why = f"no Python 3.12 with oban: set ${OBAN_PYTHON_ENV} (.ci/run makes one)"
        if os.environ.get("CI"):
            pytest.fail(f"the oban bench must run in CI: {why}")
        pytest.skip(why)
    return python


@pytest.mark.slow
def test_a_quick_postgres_run_measures_oban_in_its_own_interpreter() -> None:
    from tests.processes.pg_support import base_url

    url = base_url()  # skips without a server (fails in CI)
    python = oban_python()
    completed = run_bench(
        "--quick", "--json", "--backend", "postgres", "--pg-url", url, "--peers", "oban",
        "--only", "1,4,5,6", "--oban-python", python, timeout=300,
    )  # fmt: skip
    report = json.loads(completed.stdout)
    meta = report["meta"]
    assert meta["peers"] == ["oban"]
    version = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('oban'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert meta["peer_versions"] == {"oban": version}
    assert any("Python 3.12" in note for note in report["notes"]["oban"])
    figures = {f["key"]: f for f in report["figures"]}
    for key in ("1", "4.c1", "4.c4", "5", "6.remote.p50", "6.remote.p99"):
        assert figures[key]["values"]["oban"] > 0, key
        assert figures[key]["ratios"]["oban"] is not None, key
    # every job of the four processes ran, and ran once
    assert figures["5"]["extra"]["duplicates"]["oban"] == 0
