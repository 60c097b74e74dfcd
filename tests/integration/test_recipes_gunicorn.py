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
    WAIT,
    Database,
    Processes,
    all_done,
    check_exactly_the_committed_signups_ran_once,
    copy_recipe,
    database,
    free_port,
    gunicorn,
    post_json,
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
pytest.importorskip("gunicorn", reason="the dev extra installs gunicorn")

__all__ = ["database", "processes"]  # the fixtures this module uses

REQUESTS = 16

# (gunicorn's arguments after the bind, the app) for each way the recipe serves
WAYS = {
    "lazy": (["--workers", "2"], "shop.web:app"),
    "lazy-preload": (["--workers", "2", "--preload"], "shop.web:app"),
    "eager-preload-post-fork": (["--config", "gunicorn_conf.py"], "shop.eager:app"),
}


@pytest.mark.parametrize("way", list(WAYS))
def test_gunicorn_serves_the_recipe_and_a_worker_process_runs_each_committed_job_once(
    way: str, database: Database, processes: Processes, tmp_path: Path
) -> None:
    app = copy_recipe("flask", tmp_path)
    env = recipe_env(app, SHOP_DATABASE=database.where)
    run(python("-m", "shop.db"), cwd=app, env=env)
    port = free_port()
    options, target = WAYS[way]
    server = processes.start(
        gunicorn("--bind", f"127.0.0.1:{port}", *options, target), cwd=app, env=env
    )
    worker = processes.start(
        python("-m", "jaren_jobs", "--db", database.where, "worker", "shop.jobs:HANDLERS",
               "--concurrency", "4", "--poll", "0.1"),
        cwd=app,
        env=env,
    )  # fmt: skip
    wait_listening(port, server, processes)

    emails = signups(REQUESTS)
    statuses = post_signups(f"http://127.0.0.1:{port}/signup", emails)
    assert statuses == [400 if e.endswith("@spam.example") else 200 for e in emails], (
        processes.output(server)
    )
    wait_until("the worker process to run every job", all_done(database, REQUESTS // 2))
    worker.send_signal(signal.SIGTERM)
    server.send_signal(signal.SIGTERM)
    assert worker.wait(WAIT) == 0, processes.output(worker)
    assert server.wait(WAIT) == 0, processes.output(server)
    assert "StoreClosed" not in processes.output(server)
    check_exactly_the_committed_signups_ran_once(database, emails)


def test_preload_without_the_hook_fails_each_request_with_store_closed_and_writes_nothing(
    database: Database, processes: Processes, tmp_path: Path
) -> None:
    app = copy_recipe("flask", tmp_path)
    env = recipe_env(app, SHOP_DATABASE=database.where)
    run(python("-m", "shop.db"), cwd=app, env=env)
    port = free_port()
    server = processes.start(
        gunicorn("--bind", f"127.0.0.1:{port}", "--workers", "2", "--preload", "shop.eager:app"),
        cwd=app,
        env=env,
    )
    wait_listening(port, server, processes)
    answers = [
        post_json(f"http://127.0.0.1:{port}/signup", {"email": f"user{n}@example.com"})
        for n in range(4)
    ]  # each answered (urlopen's timeout bounds a hang), each a server error
    assert [status for status, _ in answers] == [500] * 4
    server.send_signal(signal.SIGTERM)
    assert server.wait(WAIT) == 0
    log = processes.output(server)
    assert log.count("jaren_jobs.errors.StoreClosed: JD2091") == 4, log
    assert "before os.fork()" in log
    assert "open a new store in the child" in log
    assert database.query("SELECT email FROM signups") == []
    assert database.jobs() == {}
