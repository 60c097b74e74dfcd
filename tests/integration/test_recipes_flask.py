"""docs/recipes.md, Flask: the app and its worker in one process (werkzeug's real WSGI
server, the worker beside it on threads), driven by real HTTP requests.

Half of the signups are refused *after* their enqueue: exactly the committed
ones must have jobs, each run once (its welcome recorded in the handler's
own transaction), and SIGTERM stops the server and drains the worker.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.recipes_support import (
    FLASK,
    Database,
    Processes,
    check_signups_run_once,
    database,
    processes,
    serve,
)

pytest.importorskip("flask", reason="the dev extra installs flask")

__all__ = ["database", "processes"]  # the fixtures this module uses

REQUESTS = 24


def test_flask_app_and_its_worker_in_one_process(
    database: Database, processes: Processes, tmp_path: Path
) -> None:
    served = serve(FLASK, database, processes, tmp_path)
    assert served.worker is None  # the worker runs beside the app, in its process
    check_signups_run_once(served, database, processes, REQUESTS)
