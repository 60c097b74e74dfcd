"""``jaren-jobs worker`` as its own OS process: work arrives, a signal stops it.

The jobs are enqueued through the library *after* the worker process says it
is ready, so the worker finds them by polling the shared file. A subprocess
cannot set this process's Event, so the test polls the store in a bounded
loop of short waits.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jaren_jobs import Job, NewJob, open_store
from tests.processes.pg_support import base_url, schema_on

REPO = Path(__file__).resolve().parents[2]
HANDLERS = "tests.processes.cli_handlers:HANDLERS"
WAIT_SECONDS = 60.0  # generous: only a broken worker gets near it

READY = re.compile(
    r"^worker (?P<kinds>.+) x(?P<concurrency>\d+) on .+; SIGINT or SIGTERM stops it$"
)
STOPPING = re.compile(
    r"^stopping: draining for up to [0-9.]+s; a second SIGINT or SIGTERM stops at once$"
)
SUMMARY = re.compile(
    r"^stopped: (?P<completed>\d+) completed, (?P<failed>\d+) failed, "
    r"(?P<cancelled>\d+) cancelled, (?P<lost>\d+) lost; (?P<drain>drained|\d+ not drained)$"
)


def start_worker(db: Path | str, cwd: Path, *options: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "JAREN_JOBS_DB"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-m", "jaren_jobs", "--db", str(db), "worker", HANDLERS, *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
    )


def wait_ready(process: subprocess.Popen[str]) -> re.Match[str]:
    assert process.stdout is not None
    line = process.stdout.readline()  # written once the signal handlers are installed
    ready = READY.match(line.rstrip("\n"))
    if ready is None:
        process.kill()
        _, stderr = process.communicate(timeout=WAIT_SECONDS)
        pytest.fail(f"no ready line from the worker: {line!r}; stderr: {stderr}")
    return ready


def stop(
    process: subprocess.Popen[str], signum: int, logged: tuple[str, ...] = (), status: int = 0
) -> tuple[re.Match[str], str]:
    """Send ``signum``; the worker must exit ``status`` with one summary line.

    Its stderr holds only the library's WARNING-or-worse log lines (Python's
    last-resort handler prints them when nothing configured logging): one
    per text of ``logged``, each holding that text, with any traceback
    following it; nothing else.
    """
    process.send_signal(signum)
    try:
        stdout, stderr = process.communicate(timeout=WAIT_SECONDS)
    except subprocess.TimeoutExpired:  # pragma: no cover - only on a hung worker
        process.kill()
        raise
    assert process.returncode == status, stderr
    log_lines = [line for line in stderr.splitlines() if line.startswith("jaren_jobs:")]
    assert len(log_lines) == len(logged), stderr
    for line, text in zip(log_lines, logged, strict=True):
        assert text in line, stderr
    if not logged:
        assert stderr == ""
    else:
        assert stderr.startswith("jaren_jobs:"), stderr
    lines = stdout.splitlines()
    # the ready line was already read; then what the signal began, and the report
    assert len(lines) == 2, stdout
    assert STOPPING.match(lines[0]), lines[0]
    summary = SUMMARY.match(lines[1])
    assert summary is not None, lines[1]
    return summary, lines[1]


def jobs_of(db: Path | str, ids: list[str]) -> dict[str, Job]:
    with open_store(db, readonly=True) as store:
        found = {job_id: store.jobs.get(job_id) for job_id in ids}
    return {job_id: job for job_id, job in found.items() if job is not None}


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "queue.db"
    open_store(path).close()  # an empty jaren_jobs database for the worker to open
    return path


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_worker_process_runs_jobs_enqueued_later_and_drains_on_a_signal(
    db: Path, tmp_path: Path, signum: int
) -> None:
    process = start_worker(db, tmp_path, "--concurrency", "2", "--poll", "0.05")
    try:
        ready = wait_ready(process)
        assert ready.group("kinds") == "double, explode, hold, stubborn"
        assert ready.group("concurrency") == "2"

        with open_store(db) as store:
            doubles = store.jobs.enqueue_many(NewJob("double", {"n": n}) for n in range(30))
            doomed = store.jobs.enqueue("explode", "boom", max_attempts=1)
            # holds one loop until the stop: proves the stop waits for it (drains)
            held = store.jobs.enqueue("hold", None)
        ids = [job.id for job in doubles]

        def worked() -> bool:
            jobs = jobs_of(db, [*ids, doomed.id, held.id])
            return (
                all(jobs[i].state == "done" for i in ids)
                and jobs[doomed.id].state == "dead"
                and jobs[held.id].state == "leased"
            )

        wait_until(worked, "the worker to run every job")
        # the dead letter is the one line the worker logs (at ERROR, with its traceback)
        summary, _ = stop(
            process,
            signum,
            (f"job {doomed.id!r} (kind 'explode') attempt 1 of 1 failed; dead letter",),
        )
    finally:
        if process.poll() is None:  # pragma: no cover - only when an assertion failed early
            process.kill()
            process.communicate(timeout=WAIT_SECONDS)

    jobs = jobs_of(db, [*ids, doomed.id, held.id])
    for n, job_id in enumerate(ids):
        assert jobs[job_id].state == "done"
        assert jobs[job_id].result == {"n": n, "doubled": 2 * n}
        assert jobs[job_id].attempts == 1
    assert jobs[doomed.id].state == "dead"
    assert jobs[doomed.id].last_error == "RuntimeError: exploded on purpose: 'boom'"
    # the held job was running when the signal came: its handler saw the stop
    # and returned within the grace period, so it settled instead of being abandoned
    assert jobs[held.id].state == "done"
    assert jobs[held.id].result == {"released_by_stop": True}
    assert summary.groupdict() == {
        "completed": "31",
        "failed": "1",
        "cancelled": "0",
        "lost": "0",
        "drain": "drained",
    }
    with open_store(db, readonly=True) as store:
        counts = store.jobs.counts()
    assert (counts.pending, counts.leased, counts.failed) == (0, 0, 0)


def test_worker_process_runs_only_the_kinds_it_was_given(db: Path, tmp_path: Path) -> None:
    process = start_worker(db, tmp_path, "--kinds", "double", "--poll", "0.05")
    try:
        assert wait_ready(process).group("kinds") == "double"
        with open_store(db) as store:
            wanted = store.jobs.enqueue("double", {"n": 4})
            other = store.jobs.enqueue("explode", "not mine")
        wait_until(lambda: jobs_of(db, [wanted.id])[wanted.id].state == "done", "the double job")
        summary, _ = stop(process, signal.SIGTERM)
    finally:
        if process.poll() is None:  # pragma: no cover - only when an assertion failed early
            process.kill()
            process.communicate(timeout=WAIT_SECONDS)
    assert summary.group("completed") == "1"
    assert summary.group("failed") == "0"
    untouched = jobs_of(db, [other.id])[other.id]
    assert (untouched.state, untouched.attempts) == ("pending", 0)


def test_the_grace_period_bounds_the_stop_of_a_handler_that_ignores_it(
    db: Path, tmp_path: Path
) -> None:
    process = start_worker(db, tmp_path, "--grace", "0.3", "--poll", "0.05")
    try:
        wait_ready(process)
        with open_store(db) as store:
            job = store.jobs.enqueue("stubborn", {"seconds": WAIT_SECONDS})
        wait_until(lambda: jobs_of(db, [job.id])[job.id].state == "leased", "the stubborn claim")
        started = time.monotonic()
        # it stopped without draining: exit status 1
        summary, _ = stop(process, signal.SIGTERM, status=1)
        stopped_in = time.monotonic() - started
    finally:
        if process.poll() is None:  # pragma: no cover - only when an assertion failed early
            process.kill()
            process.communicate(timeout=WAIT_SECONDS)
    # far sooner than the handler would have finished: the grace period bounded it
    assert stopped_in < WAIT_SECONDS / 4
    assert summary.group("drain") == "1 not drained"
    assert summary.group("completed") == "0"
    # the attempt never settled: its lease will expire and the job be re-claimed
    left = jobs_of(db, [job.id])[job.id]
    assert (left.state, left.attempts, left.result) == ("leased", 1, None)


# -------------------------------------------------------- --burst, --log-level, two signals


@pytest.fixture(params=["sqlite", "postgres"])
def any_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty jaren_jobs database: a file, or a postgresql:// URL into a schema of its own."""
    if request.param == "sqlite":
        path = tmp_path / "queue.db"
        open_store(path).close()
        yield str(path)
        return
    with schema_on(base_url()) as schema:
        open_store(schema.url).close()
        yield schema.url


def run_worker(db: str, cwd: Path, *options: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "JAREN_JOBS_DB"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "jaren_jobs", "--db", db, "worker", HANDLERS, *options],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=WAIT_SECONDS,
        check=False,
    )


def test_burst_runs_what_is_due_then_exits_0_with_a_json_report(
    any_db: str, tmp_path: Path
) -> None:
    with open_store(any_db) as store:
        due = store.jobs.enqueue_many(NewJob("double", {"n": n}) for n in range(5))
        doomed = store.jobs.enqueue("explode", "boom", max_attempts=1)
        later = store.jobs.enqueue("double", {"n": 99}, delay_seconds=3600)
    result = run_worker(
        any_db, tmp_path, "--burst", "--json", "--concurrency", "2", "--log-level", "info"
    )
    assert result.returncode == 0, result.stderr
    ready, stopping, stopped = (json.loads(line) for line in result.stdout.splitlines())
    assert ready == {
        "event": "ready",
        "kinds": ["double", "explode", "hold", "stubborn"],
        "concurrency": 2,
        "queues": None,
        "burst": True,
    }
    assert stopping["event"] == "stopping"
    assert stopped == {
        "event": "stopped",
        "completed": 5,
        "failed": 1,
        "cancelled": 0,
        "lost": 0,
        "snoozed": 0,
        "drained": True,
        "in_flight": 0,
        "burst": True,
        "ran_dry": True,
    }
    jobs = jobs_of(any_db, [job.id for job in due] + [doomed.id, later.id])
    assert all(jobs[job.id].state == "done" for job in due)
    assert jobs[doomed.id].state == "dead"
    # due in an hour: not what a burst drains
    assert (jobs[later.id].state, jobs[later.id].attempts) == ("pending", 0)
    # --log-level INFO: the jaren_jobs tree on stderr, levelled and named
    log = result.stderr.splitlines()
    assert any(" INFO jaren_jobs.cli " in line and "burst in 2 thread(s)" in line for line in log)
    assert any(" INFO jaren_jobs.worker " in line and "stopped" in line for line in log), log
    assert any(" ERROR jaren_jobs.worker " in line and "dead letter" in line for line in log), log
    assert not any(" DEBUG " in line for line in log)


def test_a_second_signal_stops_at_once_and_the_lease_is_left_to_expire(
    any_db: str, tmp_path: Path
) -> None:
    process = start_worker(any_db, tmp_path, "--lease", "1", "--grace", "60", "--poll", "0.05")
    try:
        wait_ready(process)
        with open_store(any_db) as store:
            job = store.jobs.enqueue("stubborn", {"seconds": WAIT_SECONDS})
        wait_until(lambda: jobs_of(any_db, [job.id])[job.id].state == "leased", "the claim")
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.stdout is not None
        # the drain has begun (it would wait up to 60 s for the handler that ignores it)
        assert STOPPING.match(process.stdout.readline().rstrip("\n"))
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=WAIT_SECONDS)
        stopped_in = time.monotonic() - started
    finally:
        if process.poll() is None:  # pragma: no cover - only when an assertion failed early
            process.kill()
            process.communicate(timeout=WAIT_SECONDS)
    assert process.returncode == 130, stderr
    assert stdout.startswith("stopped at once by a second SIGINT: ")
    assert stopped_in < 30  # far sooner than the 60 s grace
    left = jobs_of(any_db, [job.id])[job.id]
    assert (left.state, left.attempts) == ("leased", 1)
    # nobody renews the abandoned lease: once it runs out the job is claimed again
    with open_store(any_db) as store:
        deadline = time.monotonic() + WAIT_SECONDS
        again = None
        while again is None:
            assert time.monotonic() < deadline, "the abandoned lease never expired"
            again = store.jobs.claim(["stubborn"], owner="rescuer")
            if again is None:
                time.sleep(0.05)
    assert (again.id, again.attempts) == (job.id, 2)
