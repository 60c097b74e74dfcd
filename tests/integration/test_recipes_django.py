"""docs/recipes.md, Django the plain-store way: the recipe's project served by a real
gunicorn on 127.0.0.1, real HTTP requests, and its ``runjobs`` management command
as a separate worker process, stopped by SIGTERM.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.recipes_support import (
    DJANGO,
    Database,
    Processes,
    check_signups_run_once,
    database,
    processes,
    serve,
)

pytest.importorskip("django", reason="the dev extra installs django")
pytest.importorskip("gunicorn", reason="the dev extra installs gunicorn")

__all__ = ["database", "processes"]  # the fixtures this module uses

REQUESTS = 16


def test_django_view_enqueues_in_its_transaction_and_runjobs_runs_each_once(
    database: Database, processes: Processes, tmp_path: Path
) -> None:
    served = serve(DJANGO, database, processes, tmp_path)
    check_signups_run_once(served, database, processes, REQUESTS)
    assert served.worker is not None
    assert f"stopped: {REQUESTS // 2} completed, drained=True" in processes.output(served.worker)
