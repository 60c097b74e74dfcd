"""The benchmark's own tests: it runs, it reports, and it reports honestly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python -m bench ARGS`` from the repository, on SQLite unless ARGS name a server."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("JAREN_JOBS_BENCH_PG_URL", None)
    completed = subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return completed
