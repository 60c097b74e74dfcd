"""docs/recipes.md, workers under systemd: the recipe's unit files, run as systemd would.

systemd cannot run here, so the test reads the units from examples/recipes/systemd
(the files the page shows), runs their ``ExecStart`` as a real subprocess in
the unit's ``WorkingDirectory`` (the Flask recipe's folder) with the unit's
``Environment`` (its database pointed at the test's), sends ``KillSignal``
as ``systemctl stop`` does, and checks the worker is gone within
``TimeoutStopSec`` with exit status 0 and every job settled or handed back.
"""

from __future__ import annotations

import re
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import jaren_jobs
from tests.integration.recipes_support import (
    RECIPES,
    Database,
    Processes,
    all_done,
    copy_recipe,
    database,
    processes,
    python,
    recipe_env,
    run,
    wait_until,
)

__all__ = ["database", "processes"]  # the fixtures this module uses

UNIT = RECIPES / "systemd" / "shop-worker.service"
TEMPLATE = RECIPES / "systemd" / "shop-worker@.service"


def read_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file's sections, each key's values in order (systemd allows repeats)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}: {line!r} outside a section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: {line!r} is not key=value"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def one(unit: dict[str, dict[str, list[str]]], key: str) -> str:
    values = unit["Service"][key]
    assert len(values) == 1, (key, values)
    return values[0]


def environment(unit: dict[str, dict[str, list[str]]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in unit["Service"].get("Environment", []):
        for assignment in shlex.split(line):
            name, _, value = assignment.partition("=")
            env[name] = value
    return env


def exec_start(unit: dict[str, dict[str, list[str]]], env: dict[str, str]) -> list[str]:
    """ExecStart's argv, ``${NAME}`` expanded from ``env`` as systemd does."""
    words = shlex.split(one(unit, "ExecStart"))
    return [re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], word) for word in words]


def grace_of(argv: list[str]) -> float:
    return float(argv[argv.index("--grace") + 1])


@pytest.mark.parametrize("path", [UNIT, TEMPLATE], ids=lambda p: p.name)
def test_the_units_say_what_the_recipe_promises(path: Path) -> None:
    unit = read_unit(path)
    assert one(unit, "Type") == "simple"
    assert one(unit, "KillSignal") == "SIGTERM"
    assert one(unit, "Restart") == "on-failure"
    argv = exec_start(unit, environment(unit))
    assert Path(argv[0]).name == "jaren-jobs"
    assert argv[1] == "--db"
    assert argv[3:7] == ["worker", "shop.jobs:HANDLERS", "--concurrency", "4"]
    # systemd's SIGKILL must not cut the worker's own drain short
    assert float(one(unit, "TimeoutStopSec")) > grace_of(argv)
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    if path == TEMPLATE:  # N instances of the same worker
        assert read_unit(UNIT)["Service"]["ExecStart"] == unit["Service"]["ExecStart"]
        assert "%i" in one(unit, "SyslogIdentifier")


def start_unit(
    path: Path, database: Database, processes: Processes, workdir: Path, instance: str = ""
) -> tuple[Any, float]:
    """Start ``path``'s ExecStart as systemd would; the process and its TimeoutStopSec."""
    unit = read_unit(path)
    env = {**environment(unit), "SHOP_DATABASE": database.where}  # a drop-in's override
    argv = [arg.replace("%i", instance) for arg in exec_start(unit, env)]
    # the unit's /srv/shop/.venv/bin/jaren-jobs is this interpreter's jaren-jobs
    command = [sys.executable, "-m", "jaren_jobs", *argv[1:], "--poll", "0.1"]
    proc = processes.start(command, cwd=workdir, env=recipe_env(workdir, **env))
    return proc, float(one(unit, "TimeoutStopSec"))


def enqueue_welcomes(database: Database, count: int) -> None:
    with jaren_jobs.open_store(database.where) as store:
        store.jobs.enqueue_many(
            [
                jaren_jobs.NewJob("send_welcome", {"to": f"user{n}@example.com"})
                for n in range(count)
            ]
        )


def stop_like_systemd(proc: Any, timeout_stop: float) -> tuple[int, float]:
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    status = proc.wait(timeout_stop)  # past it, systemd would SIGKILL
    return int(status), time.monotonic() - started


def test_sigterm_stops_the_unit_within_its_timeout_with_jobs_settled_or_handed_back(
    database: Database, processes: Processes, tmp_path: Path
) -> None:
    app = copy_recipe("flask", tmp_path)
    run(python("-m", "shop.db"), cwd=app, env=recipe_env(app, SHOP_DATABASE=database.where))
    enqueue_welcomes(database, 300)
    proc, timeout_stop = start_unit(UNIT, database, processes, app)
    # stop it mid-queue: some jobs done, some running, the rest not claimed yet
    wait_until("the first job to be done", lambda: "done" in database.jobs().values())
    status, took = stop_like_systemd(proc, timeout_stop)
    output = processes.output(proc)
    assert status == 0, output
    assert took < timeout_stop
    assert "drained" in output.splitlines()[-1], output
    states = database.jobs()
    assert set(states.values()) <= {"done", "pending"}  # nothing left leased
    done = sorted(id for id, state in states.items() if state == "done")
    assert len(done) > 0
    # stopped mid-queue: what it had not run is pending, for the next start
    assert len(done) < len(states), len(done)
    welcomed = sorted(str(j) for (j,) in database.query("SELECT job_id FROM welcomes"))
    assert welcomed == done  # each settled job ran once; none half-done


def test_two_instances_of_the_template_drain_one_queue_each_job_once(
    database: Database, processes: Processes, tmp_path: Path
) -> None:
    app = copy_recipe("flask", tmp_path)
    run(python("-m", "shop.db"), cwd=app, env=recipe_env(app, SHOP_DATABASE=database.where))
    instances = [start_unit(TEMPLATE, database, processes, app, str(n)) for n in (1, 2)]
    enqueue_welcomes(database, 60)
    wait_until("the two instances to run every job", all_done(database, 60))
    for proc, timeout_stop in instances:
        status, took = stop_like_systemd(proc, timeout_stop)
        assert status == 0, processes.output(proc)
        assert took < timeout_stop
    welcomed = sorted(str(j) for (j,) in database.query("SELECT job_id FROM welcomes"))
    assert welcomed == sorted(database.jobs())
