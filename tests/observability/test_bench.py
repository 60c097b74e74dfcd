"""``python -m bench.observability`` runs and reports every configuration (no speed asserted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_cost_benchmark_reports_every_configuration() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-m", "bench.observability",
         "--jobs", "40", "--rounds", "1", "--loops", "200"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0] for line in done.stdout.splitlines()[2:9]}
    assert rows == {"none", "otel-api", "otel", "prometheus", "both", "sdk-bare", "sdk-attrs"}
    assert "the SDK's floor" in done.stdout
    assert "the observation work alone" in done.stdout
    assert "the seam with nothing observing" in done.stdout
