"""docs/recipes.md, Django the plain-store way: the recipe's project served by a real
gunicorn on 127.0.0.1, real HTTP requests, and its ``runjobs`` management command
as a separate worker process, stopped by SIGTERM.
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
    gunicorn,
    post_signups,
    processes,
    python,
    recipe_env,
    run,
    signups,
    wait_listening,
    wait_until,
)

pytest.importorskip("django", reason="the dev extra installs django")
pytest.importorskip("gunicorn", reason="the dev extra installs gunicorn")

__all__ = ["database", "processes"]  # the fixtures this module uses

REQUESTS = 16


def test_django_view_enqueues_in_its_transaction_and_runjobs_runs_each_once(
    database: Database, processes: Processes, tmp_path: Path
) -> None:
    project = copy_recipe("django", tmp_path)
    env = recipe_env(project, JAREN_JOBS_DATABASE=database.where)
    env.pop("DJANGO_SETTINGS_MODULE", None)  # manage.py and wsgi.py name mysite.settings
    run(python("manage.py", "create_signup_tables"), cwd=project, env=env)
    port = free_port()
    server = processes.start(
        gunicorn("--bind", f"127.0.0.1:{port}", "--workers", "2", "mysite.wsgi"),
        cwd=project,
        env=env,
    )
    worker = processes.start(
        python("manage.py", "runjobs", "--concurrency", "2"), cwd=project, env=env
    )
    wait_listening(port, server, processes)

    emails = signups(REQUESTS)
    statuses = post_signups(f"http://127.0.0.1:{port}/signup", emails)
    assert statuses == [400 if e.endswith("@spam.example") else 200 for e in emails], (
        processes.output(server)
    )
    wait_until("runjobs to run every job", all_done(database, REQUESTS // 2))
    worker.send_signal(signal.SIGTERM)
    server.send_signal(signal.SIGTERM)
    assert worker.wait(WAIT) == 0, processes.output(worker)
    assert server.wait(WAIT) == 0, processes.output(server)
    assert f"stopped: {REQUESTS // 2} completed, drained=True" in processes.output(worker)
    check_exactly_the_committed_signups_ran_once(database, emails)
