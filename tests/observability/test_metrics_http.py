"""``jaren-jobs worker --metrics-port``: metrics scraped over HTTP from a running worker process.

The worker is the CLI in an OS process of its own, on SQLite and on PostgreSQL.
A subprocess cannot signal this one, so the test scrapes in a bounded loop of
short waits until the worker has settled every job, then holds the counts to
exactly what it did.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from prometheus_client.parser import text_string_to_metric_families

import jaren_jobs
from tests.processes.pg_support import base_url, schema_on

REPO = Path(__file__).resolve().parents[2]
HANDLERS = "tests.processes.cli_handlers:HANDLERS"
WAIT_SECONDS = 60.0  # generous: only a broken worker gets near it


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "queue.db")
        return
    with schema_on(base_url()) as schema:
        yield schema.url


def read_event(stream: IO[str], event: str) -> dict[str, object]:
    for line in stream:
        data = json.loads(line)
        if data.get("event") == event:
            return data  # type: ignore[no-any-return]
    raise AssertionError(f"the worker ended without a {event!r} line")


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.slow
def test_a_running_worker_serves_exactly_what_it_did(database: str) -> None:
    with jaren_jobs.open_store(database) as store:
        store.jobs.enqueue_many([jaren_jobs.NewJob("double", {"n": n}) for n in range(5)])
        store.jobs.enqueue("explode", {"n": 0}, max_attempts=1)
        store.jobs.enqueue("explode", {"n": 1}, max_attempts=1, queue="other")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    worker = subprocess.Popen(
        [sys.executable, "-m", "jaren_jobs", "--db", database, "worker", HANDLERS,
         "--metrics-port", "0", "--json", "--poll", "0.05"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert worker.stdout is not None
        url = str(read_event(worker.stdout, "metrics")["url"])
        assert url.startswith("http://127.0.0.1:")
        assert url.endswith("/metrics")
        read_event(worker.stdout, "ready")
        done = {
            ("jaren_jobs_jobs", (("queue", "default"), ("state", "done"))): 5.0,
            ("jaren_jobs_jobs", (("queue", "default"), ("state", "dead"))): 1.0,
            ("jaren_jobs_jobs", (("queue", "other"), ("state", "dead"))): 1.0,
        }
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            samples = scrape(url)
            attempts = sum(v for (n, _), v in samples.items() if n == "jaren_jobs_attempts_total")
            if attempts >= 7 and all(samples.get(key) == value for key, value in done.items()):
                break
            assert time.monotonic() < deadline, samples
            time.sleep(0.05)  # another process: nothing to wait on but its answers
        attempts_total = {
            labels: value
            for (name, labels), value in samples.items()
            if name == "jaren_jobs_attempts_total"
        }
        assert attempts_total == {
            (("kind", "double"), ("outcome", "completed"), ("queue", "default")): 5.0,
            (("kind", "explode"), ("outcome", "failed"), ("queue", "default")): 1.0,
            (("kind", "explode"), ("outcome", "failed"), ("queue", "other")): 1.0,
        }
        jobs = {labels: v for (n, labels), v in samples.items() if n == "jaren_jobs_jobs"}
        assert sum(jobs.values()) == 7.0
        assert samples[("jaren_jobs_attempts_in_flight", (("queue", "default"),))] == 0.0
        assert samples[("jaren_jobs_settlement_batch_size_sum", ())] == 7.0
    finally:
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=WAIT_SECONDS)
    assert worker.returncode == 0, err
    stopped = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert stopped[-1]["event"] == "stopped"
    assert (stopped[-1]["completed"], stopped[-1]["failed"]) == (5, 2)
    # the port is released with the worker
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)


def test_metrics_port_needs_a_port_number(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-m", "jaren_jobs", "--db", str(tmp_path / "q.db"), "worker", HANDLERS,
         "--metrics-port", "70000"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "expected a port from 0 to 65535, got '70000'" in done.stderr
