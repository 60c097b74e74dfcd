"""docs/recipes.md, Flask: the app and its worker in one process (werkzeug's real WSGI
server, the worker beside it on threads), driven by real HTTP requests.

Half of the signups are refused *after* their enqueue: exactly the committed
ones must have jobs, each run once (its welcome recorded in the handler's
own transaction), and SIGTERM stops the server and drains the worker.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.integration.recipes_support import (
    WAIT,
    Database,
    Processes,
    all_done,
    check_exactly_the_committed_signups_ran_once,
    copy_recipe,
    database,
    free_port,
    post_signups,
    processes,
    python,
    recipe_env,
    run,
    signups,
    wait_listening,
    wait_until,
)

pytest.importorskip("flask", reason="the dev extra installs flask")

__all__ = ["database", "processes"]  # the fixtures this module uses

REQUESTS = 24


def test_flask_app_and_its_worker_in_one_process(
    database: Database, processes: Processes, tmp_path: Path
) -> None:
    app = copy_recipe("flask", tmp_path)
    env = recipe_env(app, SHOP_DATABASE=database.where)
    run(python("-m", "shop.db"), cwd=app, env=env)  # the app's tables
    port = free_port()
    server = processes.start(python("-m", "shop.serve", str(port)), cwd=app, env=env)
    wait_listening(port, server, processes)

    emails = signups(REQUESTS)
    statuses = post_signups(f"http://127.0.0.1:{port}/signup", emails)
    assert statuses == [400 if e.endswith("@spam.example") else 200 for e in emails]
    wait_until("the worker beside the app to run every job", all_done(database, REQUESTS // 2))

    server.send_signal(signal.SIGTERM)
    assert server.wait(WAIT) == 0, processes.output(server)
    check_exactly_the_committed_signups_ran_once(database, emails)
