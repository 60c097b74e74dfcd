"""``manage.py jaren_worker`` as a separate process, on SQLite and PostgreSQL: the view's
committed tasks run once each, SIGTERM drains, and a worker SIGKILLed mid-task leaves a
task that another worker runs once its (short) lease runs out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.contrib.django.conftest import PROJECT_ENV

pytestmark = pytest.mark.slow

WAIT = 60.0


class Workers:
    """The worker processes a test starts (killed at its end if still running)."""

    def __init__(self, project: Path, tmp_path: Path) -> None:
        self.project = project
        self.tmp_path = tmp_path
        self.started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, alias: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        log = self.tmp_path / f"worker-{len(self.started)}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "manage.py", "jaren_worker", "--backend", alias, *args],
                cwd=self.project,
                env={**os.environ, **PROJECT_ENV, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.started.append((process, log))
        return process

    def output(self, process: subprocess.Popen[bytes]) -> str:
        for started, log in self.started:
            if started is process:
                return log.read_text(errors="replace")
        raise KeyError(process)

    def close(self) -> None:
        for process, _ in self.started:
            if process.poll() is None:
                process.kill()
                process.wait(WAIT)


@pytest.fixture
def workers(project: Path, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(project, tmp_path)
    try:
        yield started
    finally:
        started.close()


def wait_until(what: str, predicate: Callable[[], bool], process: Any = None) -> None:
    end = time.monotonic() + WAIT
    while not predicate():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the worker exited ({process.returncode}) before {what}")
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def fresh(result: Any) -> Any:
    from django.db import connections

    connections.close_all()  # read what the worker committed, on a new connection
    return result.task.get_result(result.id)


def test_committed_tasks_run_once_in_a_worker_process_which_sigterm_drains(
    alias: str, workers: Workers
) -> None:
    from django.test import Client
    from shop.models import Shipment

    client = Client()
    placed = []
    for n in range(5):
        response = client.get(f"/orders/{alias}" + ("?fail=1" if n % 2 else ""))
        if n % 2:
            assert response.status_code == 400
        else:
            assert response.status_code == 200, response.content
            placed.append(response.json())
    from shop.tasks import ship

    results = [ship.using(backend=alias).get_result(p["task"]) for p in placed]
    worker = workers.start(alias, "--concurrency", "2")
    wait_until(
        "every committed task to succeed",
        lambda: all(fresh(r).status == "SUCCESSFUL" for r in results),
        worker,
    )
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(WAIT) == 0, workers.output(worker)
    output = workers.output(worker)
    assert "stopped: 3 completed, 0 failed, 0 lost, drained=True" in output, output
    # Django's own log lines, from the signals the worker sends
    assert output.count("state=SUCCESSFUL") == 3, output
    shipped = sorted(Shipment.objects.using(alias).values_list("order_id", "attempt"))
    assert shipped == sorted((p["order"], 1) for p in placed)


def test_a_task_whose_worker_is_killed_runs_again_after_its_lease_and_succeeds_once(
    alias: str, workers: Workers, tmp_path: Path
) -> None:
    from shop.tasks import stall_once

    from jaren_jobs.contrib.django.backend import LOST_ATTEMPT

    marker = tmp_path / "first-attempt"
    result = stall_once.using(backend=alias).enqueue(str(marker))
    first = workers.start(alias, SHOP_LEASE_SECONDS="1")
    wait_until("the first attempt to start", marker.exists, first)
    assert fresh(result).status == "RUNNING"
    first.send_signal(signal.SIGKILL)
    first.wait(WAIT)

    second = workers.start(alias, SHOP_LEASE_SECONDS="1")
    wait_until("the task to succeed", lambda: fresh(result).status == "SUCCESSFUL", second)
    second.send_signal(signal.SIGTERM)
    assert second.wait(WAIT) == 0, workers.output(second)
    assert "stopped: 1 completed, 0 failed" in workers.output(second)

    final = fresh(result)
    assert final.return_value == 2
    assert final.attempts == 2
    assert len(set(final.worker_ids)) == 2
    assert [e.exception_class_path for e in final.errors] == [LOST_ATTEMPT]
    assert "ended without settling" in final.errors[0].traceback
