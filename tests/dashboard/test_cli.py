"""``jaren-jobs dashboard`` started as a process and requested over HTTP, on both databases."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from jaren_jobs import Store
from tests.harness import Harness

from .support import fill

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _target(harness: Harness) -> str:
    return str(getattr(harness, "url", None) or harness.db_path)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAREN_JOBS_DASHBOARD_")}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


@contextmanager
def dashboard(harness: Harness, *args: str, **env: str) -> Iterator[str]:
    """The command running; yields the URL it printed; stops it with SIGTERM."""
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jaren_jobs",
            "--db",
            _target(harness),
            "dashboard",
            "--port",
            "0",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(**env),
    ) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()  # the first line says where it listens
            found = re.search(r"serving (http://\S+?)/ ", line)
            assert found, line
            yield found.group(1)
        finally:
            process.terminate()
            _, errors = process.communicate(timeout=30)
        assert process.returncode == 0, errors
        assert "Traceback" not in errors


def test_serves_read_only_by_default(harness: Harness, db: Store) -> None:
    filled = fill(db)
    with dashboard(harness) as base, httpx.Client(base_url=base, timeout=30) as client:
        assert client.get("/api/counts").json() == db.jobs.counts().to_dict()
        assert "Overview" in client.get("/").text
        refused = client.post(f"/api/jobs/{filled.dead}/requeue")
        assert refused.status_code == 403
        assert "read-only" in refused.json()["error"]
    assert db.jobs.get(filled.dead).state == "dead"


def test_allow_actions_requeues_with_the_session_token(harness: Harness, db: Store) -> None:
    filled = fill(db)
    with dashboard(harness, "--allow-actions") as base, httpx.Client(base_url=base) as client:
        token = re.search(r'name="csrf-token" content="([0-9a-f]+)"', client.get("/jobs").text)
        assert token is not None
        answer = client.post(
            f"/api/jobs/{filled.dead}/requeue", headers={"X-CSRF-Token": token.group(1)}
        )
        assert answer.status_code == 200, answer.text
    assert db.jobs.get(filled.dead).state == "pending"


def test_refuses_another_address_without_credentials(harness: Harness, db: Store) -> None:
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaren_jobs",
            "--db",
            _target(harness),
            "dashboard",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
        ],
        check=False,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )
    assert finished.returncode == 2
    assert "refusing to serve on '0.0.0.0' without credentials" in finished.stderr
    assert "Traceback" not in finished.stderr
    assert finished.stdout == ""


def test_credentials_guard_every_request(harness: Harness, db: Store) -> None:
    fill(db)
    credentials = {"JAREN_JOBS_DASHBOARD_USER": "ops", "JAREN_JOBS_DASHBOARD_PASSWORD": "s3cret"}
    with dashboard(harness, "--host", "0.0.0.0", **credentials) as base:
        local = base.replace("0.0.0.0", "127.0.0.1")
        with httpx.Client(base_url=local) as client:
            assert client.get("/api/counts").status_code == 401
            assert client.get("/api/counts", auth=("ops", "wrong")).status_code == 401
            answer = client.get("/api/counts", auth=("ops", "s3cret"))
            assert answer.status_code == 200
            assert answer.json()["pending"] == 4
