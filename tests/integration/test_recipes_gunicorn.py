"""docs/recipes.md, gunicorn: a real gunicorn with 2 workers on 127.0.0.1, real HTTP
requests, and a worker as a separate process (the CLI, as systemd runs it).

With ``--preload`` the app module is imported in the arbiter before the
fork (SPEC §13: a store used in a child after fork raises StoreClosed,
JD2091). The recipe's two answers both work — open the store lazily per
process (``shop.web``), or open it at import and again in a ``post_fork``
hook (``shop.eager`` with ``gunicorn_conf.py``) — and without the hook each
request fails at once with that clear error: no hang, nothing written.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.integration.recipes_support import (
    FLASK,
    WAIT,
    Database,
    Processes,
    Server,
    check_signups_run_once,
    database,
    flask_under_gunicorn,
    gunicorn_serving,
    post_json,
    processes,
    serve,
)

pytest.importorskip("flask", reason="the dev extra installs flask")
pytest.importorskip("gunicorn", reason="the dev extra installs gunicorn")

__all__ = ["database", "processes"]  # the fixtures this module uses

REQUESTS = 16

# each way the recipe serves: gunicorn's arguments after the bind, then the app
WAYS = {
    "lazy": flask_under_gunicorn("--workers", "2", "shop.web:app"),
    "lazy-preload": flask_under_gunicorn("--workers", "2", "--preload", "shop.web:app"),
    "eager-preload-post-fork": flask_under_gunicorn(
        "--config", "gunicorn_conf.py", "shop.eager:app"
    ),
}


@pytest.mark.parametrize("way", list(WAYS))
def test_gunicorn_serves_the_recipe_and_a_worker_process_runs_each_committed_job_once(
    way: str, database: Database, processes: Processes, tmp_path: Path
) -> None:
    served = serve(WAYS[way], database, processes, tmp_path)
    check_signups_run_once(served, database, processes, REQUESTS)


def test_preload_without_the_hook_fails_each_request_with_store_closed_and_writes_nothing(
    database: Database, processes: Processes, tmp_path: Path
) -> None:
    eager = Server(
        "flask",
        FLASK.database_variable,
        FLASK.setup,
        gunicorn_serving("--workers", "2", "--preload", "shop.eager:app"),
    )
    served = serve(eager, database, processes, tmp_path)
    answers = [
        post_json(f"{served.url}/signup", {"email": f"user{n}@example.com"}) for n in range(4)
    ]  # each answered (urlopen's timeout bounds a hang), each a server error
    assert [status for status, _ in answers] == [500] * 4
    served.server.send_signal(signal.SIGTERM)
    assert served.server.wait(WAIT) == 0
    log = processes.output(served.server)
    assert log.count("jaren_jobs.errors.StoreClosed: JD2091") == 4, log
    assert "before os.fork()" in log
    assert "open a new store in the child" in log
    assert database.query("SELECT email FROM signups") == []
    assert database.jobs() == {}
