"""What the recipe tests share: a copy of a recipe, a database, real processes, real HTTP.

Each recipe under ``examples/recipes/`` (shown verbatim by docs/recipes.md)
is copied to a temporary folder and run there as its page says — real
servers on 127.0.0.1, real worker processes, real signals — against a
SQLite file or a fresh PostgreSQL schema.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_postgres
from tests.harness import Harness, PostgresUrl, SqliteFile

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "examples" / "recipes"
WAIT = 30.0  # generous bound for anything that should happen promptly
DATABASES = ("sqlite", "postgres")
JOBS = '"_jaren_jobs"'


class Database:
    """The recipe's database: ``where`` (a path or URL for the app), read through a harness."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.harness: Harness
        if kind == "postgres":
            require_postgres()
            postgres = PostgresUrl(tmp_path / "app.db")
            self.harness, self.where = postgres, postgres.url
        else:
            self.harness = SqliteFile(tmp_path / "app.db")
            self.where = str(tmp_path / "app.db")

    def query(self, statement: str) -> list[tuple[Any, ...]]:
        return self.harness.query(statement)

    def jobs(self) -> dict[str, str]:
        """Every job's id -> state."""
        return {str(id): str(state) for id, state in self.query(f"SELECT id, state FROM {JOBS}")}

    def close(self) -> None:
        self.harness.close()


@pytest.fixture(params=DATABASES)
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    db = Database(str(request.param), tmp_path)
    try:
        yield db
    finally:
        db.close()


def copy_recipe(name: str, into: Path) -> Path:
    """``examples/recipes/<name>`` copied to ``into/<name>`` (the app's working directory)."""
    target = into / name
    shutil.copytree(RECIPES / name, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def recipe_env(workdir: Path, **extra: str) -> dict[str, str]:
    """The environment of a recipe's process: the recipe importable from its folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAREN_", "PYTEST_"))}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(workdir), os.environ.get("PYTHONPATH", "")) if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Processes:
    """Real subprocesses, their output in files; whatever is still running at the end is
    stopped (SIGTERM, then SIGKILL) so that a failing test leaves nothing behind."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, args: Sequence[str], *, cwd: Path, env: dict[str, str]) -> Any:
        log = self.folder / f"process-{len(self.started)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                list(args), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        self.started.append((proc, log))
        return proc

    def output(self, proc: Any) -> str:
        for started, log in self.started:
            if started is proc:
                return log.read_text(encoding="utf-8", errors="replace")
        raise AssertionError("not a process of this test")

    def close(self) -> None:
        for proc, _ in self.started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.close()


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


def gunicorn(*args: str) -> list[str]:
    return [sys.executable, "-m", "gunicorn", *args]


def run(args: Sequence[str], *, cwd: Path, env: dict[str, str]) -> None:
    """Run a set-up step (tables, migrations) to its end; its failure fails the test."""
    done = subprocess.run(
        list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=WAIT, check=False
    )
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}{done.stderr}"


def wait_until(what: str, predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def post_json(url: str, body: Any) -> tuple[int, str]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=WAIT) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as refused:
        return int(refused.code), refused.read().decode()


def wait_listening(port: int, proc: Any, processes: Processes) -> None:
    """Until something accepts connections on ``port`` (the server's process still alive)."""

    def listening() -> bool:
        assert proc.poll() is None, f"the server exited:\n{processes.output(proc)}"
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    wait_until(f"a server on port {port}", listening)


def signups(n: int) -> list[str]:
    """``n`` emails, every other one refused by the app (``@spam.example``) after its enqueue."""
    return [f"user{i}@spam.example" if i % 2 else f"user{i}@example.com" for i in range(n)]


def post_signups(url: str, emails: Sequence[str]) -> list[int]:
    """POST every signup at once (real concurrent requests); their statuses, in order."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        return [status for status, _ in pool.map(lambda e: post_json(url, {"email": e}), emails)]


def check_exactly_the_committed_signups_ran_once(db: Database, emails: Sequence[str]) -> None:
    """Committed signups, and only they, have a job; each job done, its welcome recorded once."""
    good = sorted(e for e in emails if not e.endswith("@spam.example"))
    assert sorted(str(r[0]) for r in db.query("SELECT email FROM signups")) == good
    jobs = db.jobs()
    assert len(jobs) == len(good)
    assert set(jobs.values()) == {"done"}
    welcomes = sorted((str(e), str(j)) for e, j in db.query("SELECT email, job_id FROM welcomes"))
    assert [e for e, _ in welcomes] == good  # one welcome per committed signup
    assert sorted(j for _, j in welcomes) == sorted(jobs)  # each by its own job


def all_done(db: Database, count: int) -> Callable[[], bool]:
    def check() -> bool:
        states = db.jobs()
        return len(states) == count and set(states.values()) == {"done"}

    return check


# ------------------------------------------------------------------ the recipes' servers


@dataclass(frozen=True)
class Server:
    """How a recipe of docs/recipes.md is served: its folder, the variable its app reads the
    database from, its set-up step (the app's tables), the server's command for a port,
    and the worker process's for the database, when the worker is not inside the server."""

    recipe: str
    database_variable: str
    setup: tuple[str, ...]
    command: Callable[[int], list[str]]
    worker: Callable[[str], list[str]] | None = None


def gunicorn_serving(*options: str) -> Callable[[int], list[str]]:
    """gunicorn bound to the test's port, then ``options`` (its workers, the app)."""
    return lambda port: gunicorn("--bind", f"127.0.0.1:{port}", *options)


FLASK_TABLES = ("-m", "shop.db")
FLASK = Server(
    "flask", "SHOP_DATABASE", FLASK_TABLES, lambda port: python("-m", "shop.serve", str(port))
)


def flask_under_gunicorn(*options: str) -> Server:
    """The Flask recipe served by gunicorn (``options``), its worker the CLI, as systemd runs it."""
    return Server(
        "flask",
        "SHOP_DATABASE",
        FLASK_TABLES,
        gunicorn_serving(*options),
        worker=lambda where: python("-m", "jaren_jobs", "--db", where, "worker",
                                    "shop.jobs:HANDLERS", "--concurrency", "4", "--poll", "0.1"),
    )  # fmt: skip


@dataclass
class Served:
    """A recipe's server (and worker process) running, listening on ``port``."""

    server: Any
    worker: Any | None
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def serve(how: Server, database: Database, processes: Processes, tmp_path: Path) -> Served:
    """The recipe copied, its tables made, its server (and worker) started and listening."""
    app = copy_recipe(how.recipe, tmp_path)
    env = recipe_env(app, **{how.database_variable: database.where})
    run(python(*how.setup), cwd=app, env=env)
    port = free_port()
    server = processes.start(how.command(port), cwd=app, env=env)
    worker = None
    if how.worker is not None:
        worker = processes.start(how.worker(database.where), cwd=app, env=env)
    wait_listening(port, server, processes)
    return Served(server, worker, port)


def check_signups_run_once(
    served: Served, database: Database, processes: Processes, requests: int
) -> None:
    """``requests`` signups POSTed at once, half refused after their enqueue: the committed
    ones run, SIGTERM stops the worker and the server cleanly, and exactly the committed
    signups ran, once each."""
    emails = signups(requests)
    statuses = post_signups(f"{served.url}/signup", emails)
    assert statuses == [400 if e.endswith("@spam.example") else 200 for e in emails], (
        processes.output(served.server)
    )
    wait_until("the worker to run every committed job", all_done(database, requests // 2))
    running = [proc for proc in (served.worker, served.server) if proc is not None]
    for proc in running:
        proc.send_signal(signal.SIGTERM)
    for proc in running:
        assert proc.wait(WAIT) == 0, processes.output(proc)
    assert "StoreClosed" not in processes.output(served.server)
    check_exactly_the_committed_signups_ran_once(database, emails)
