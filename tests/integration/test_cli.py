"""The ``jaren-jobs`` command line, driven end to end through subprocesses.

Every invocation is ``sys.executable -m jaren_jobs ...`` against a real
database file prepared with the library; the results are read back through
the library. Read-only commands share one prepared database per module.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import NewJob, Runtime, Store, open_store
from jaren_jobs.backends.sqlite import queries as sql
from tests.backends.sqlite.test_schema_upgrade import build_pre_fence

SUBPROCESS_TIMEOUT = 60.0
STATES = ("pending", "leased", "done", "failed", "dead", "cancelled")
DAY = 86_400.0

# a worker's ready line: printed once its SIGINT/SIGTERM handlers are installed
READY = re.compile(r"^worker .* SIGINT or SIGTERM stops it$")
SUMMARY = re.compile(
    r"^stopped: (\d+) completed, (\d+) failed, (\d+) cancelled, (\d+) lost; "
    r"(drained|\d+ not drained)$"
)


# ------------------------------------------------------------------ helpers


def cli_env(db: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "JAREN_JOBS_DB"}
    if db is not None:
        env["JAREN_JOBS_DB"] = db
    env.update(extra)
    return env


def run_cli(
    *args: str | Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    python_flags: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *python_flags, "-m", "jaren_jobs", *map(str, args)],
        capture_output=True,
        text=True,
        env=env if env is not None else cli_env(),
        cwd=cwd,
        timeout=SUBPROCESS_TIMEOUT,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}; stderr: {result.stderr}"
    assert result.stderr == ""
    return result.stdout


def assert_one_line_error(
    result: subprocess.CompletedProcess[str], status: int, *needles: str
) -> str:
    """Exit ``status``, nothing on stdout, and exactly one clear line on stderr."""
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stderr.endswith("\n")
    assert lines[0].startswith("jaren-jobs"), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def table_rows(text: str) -> list[list[str]]:
    """The rows (header dropped) of the first table in ``text``: cells split on 2+ spaces."""
    lines = text.splitlines()
    rows: list[list[str]] = []
    for line in lines[1:]:
        if not line.strip():
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def clock_runtime(now: list[float]) -> Runtime:
    return Runtime(now=lambda: now[0])


def settle(store: Store, kind: str, *, ok_result: Any = None, error: str | None = None) -> None:
    claimed = store.jobs.claim([kind], owner="prep")
    assert claimed is not None
    if error is None:
        store.jobs.complete(claimed.lease, ok_result)
    else:
        try:  # raised, so the failure carries a traceback into the error history
            raise RuntimeError(error)
        except RuntimeError as exc:
            store.jobs.fail(claimed.lease, exc, retry=False)


LONG_ERROR = (
    "the image service answered 503 three times in a row; "
    + "this message is deliberately longer than any table column " * 3
    + "\nsecond line: retry budget exhausted\n    third line, indented"
)


@dataclass(frozen=True)
class Prepared:
    path: Path
    ids: list[str]


def prepare_mixed(path: Path) -> list[str]:
    """Twenty jobs in every state, of three kinds, with ids that sort predictably.

    On the real clock: the command line reads it, and the leased job's lease
    must still be live when a test asks to cancel or requeue it.
    """
    now = [time.time()]
    with open_store(path, runtime=clock_runtime(now)) as store:
        store.jobs.enqueue_many(NewJob("email", {"to": f"u{i}"}, id=f"e{i:02d}") for i in range(12))
        for i in range(5):
            store.jobs.enqueue("resize", {"image": i}, id=f"r{i}", max_attempts=2)
        settle(store, "resize", ok_result={"w": 64})  # r0 done
        settle(store, "resize", ok_result={"w": 32})  # r1 done
        settle(store, "resize", error=LONG_ERROR)  # r2 dead
        settle(store, "resize", error="short and final")  # r3 dead
        claimed = store.jobs.claim(["resize"], owner="prep")  # r4 failed, waiting for a retry
        assert claimed is not None
        store.jobs.fail(claimed.lease, TimeoutError("upstream timed out"))
        store.jobs.enqueue("report", {"month": 1}, id="p0")
        store.jobs.enqueue("report", {"month": 2}, id="p1")
        store.jobs.enqueue("report", {"month": 3}, id="p2", priority=5)
        leased = store.jobs.claim(["report"], owner="prep-worker", lease_seconds=3600)
        assert leased is not None
        assert leased.id == "p2"  # the highest priority first
        store.jobs.cancel("p1")
        counts = store.jobs.counts()
    assert (counts.pending, counts.leased, counts.done) == (13, 1, 2)
    assert (counts.failed, counts.dead, counts.cancelled) == (1, 2, 1)
    return sorted(
        [f"e{i:02d}" for i in range(12)] + [f"r{i}" for i in range(5)] + ["p0", "p1", "p2"]
    )


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    """A database shared by the read-only commands (counts, ls, show)."""
    path = tmp_path_factory.mktemp("cli") / "mixed.db"
    return Prepared(path, prepare_mixed(path))


@pytest.fixture
def mixed(tmp_path: Path) -> Prepared:
    """The same contents, in a database of the test's own (for write commands)."""
    path = tmp_path / "mixed.db"
    return Prepared(path, prepare_mixed(path))


def read_job(path: Path, job_id: str) -> dict[str, Any] | None:
    with open_store(path, readonly=True) as store:
        job = store.jobs.get(job_id)
        return None if job is None else job.to_dict()


def all_jobs(path: Path) -> dict[str, dict[str, Any]]:
    with open_store(path, readonly=True) as store, store.jobs.page(limit=10_000) as cursor:
        return {job.id: job.to_dict() for job in cursor}


# ------------------------------------------------------------------ counts


def test_counts_prints_a_table_of_every_state_and_the_queued_kinds(prepared: Prepared) -> None:
    out = ok(run_cli("--db", prepared.path, "counts"))
    assert out.splitlines()[0].split() == ["state", "jobs", "of", "which"]
    rows = table_rows(out)
    states = {row[0]: int(row[1]) for row in rows}
    # the queued jobs split at now; p2's lease is live. r4's retry waits out a
    # backoff of seconds, so (the database is shared by the module) it may have
    # fallen due by now: either way it is counted once
    detail = {row[0]: row[2] for row in rows if len(row) > 2}
    assert set(detail) == {"pending", "failed", "leased"}
    assert detail["pending"] == "13 ready now, 0 scheduled later"
    assert detail["failed"] in ("0 ready now, 1 scheduled later", "1 ready now, 0 scheduled later")
    assert detail["leased"] == "0 with an expired lease"
    assert states == {
        "pending": 13,
        "leased": 1,
        "done": 2,
        "failed": 1,
        "dead": 2,
        "cancelled": 1,
    }
    kinds_section = out.split("queued (pending + failed) by kind:\n", 1)[1]
    kinds = {row[0]: int(row[1]) for row in table_rows(kinds_section)}
    assert kinds == {"email": 12, "resize": 1, "report": 1}


def test_counts_json_is_the_library_counts(prepared: Prepared) -> None:
    out = ok(run_cli("--db", prepared.path, "counts", "--json"))
    assert len(out.splitlines()) == 1
    with open_store(prepared.path, readonly=True) as store:
        counts, due = store.jobs.counts(), store.jobs.due_counts()
    # the library's counts, and the due split under "due"
    printed = json.loads(out)
    due_json = printed.pop("due")
    assert printed == counts.to_dict()
    assert (due_json["pending_ready"], due_json["pending_scheduled"]) == (13, 0)
    assert due_json["leased_expired"] == 0
    # r4's retry waits out a real backoff of seconds: it may fall due between the
    # CLI's read and the library's, so the failed split is compared as a sum
    library = due.to_dict()
    for split in (due_json, library):
        assert split.pop("failed_ready") + split.pop("failed_scheduled") == 1
    assert due_json == library


def test_counts_of_an_empty_database_prints_zeroes_and_no_kind_section(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    open_store(path).close()
    out = ok(run_cli("--db", path, "counts"))
    assert {row[0]: int(row[1]) for row in table_rows(out)} == dict.fromkeys(STATES, 0)
    assert "by kind" not in out


# ------------------------------------------------------------------ ls


def test_ls_json_prints_one_to_dict_per_line_in_id_order(prepared: Prepared) -> None:
    out = ok(run_cli("--db", prepared.path, "ls", "--json", "--limit", "100"))
    jobs = json_lines(out)
    assert [job["id"] for job in jobs] == prepared.ids
    # each line is the job's to_dict() and whether its lease ran out
    assert [job.pop("lease_expired") for job in jobs] == [False] * len(jobs)
    assert {job["id"]: job for job in jobs} == all_jobs(prepared.path)
    assert all("lease_token" not in job for job in jobs)


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (["--state", "dead"], ["r2", "r3"]),
        (["--state", "leased"], ["p2"]),
        (["--kind", "report"], ["p0", "p1", "p2"]),
        (["--state", "pending", "--kind", "report"], ["p0"]),
        (["--state", "failed", "--kind", "resize"], ["r4"]),
        (["--state", "done", "--kind", "email"], []),
        (["--kind", "no-such-kind"], []),
    ],
)
def test_ls_filters_by_state_and_kind(
    prepared: Prepared, filters: list[str], expected: list[str]
) -> None:
    jobs = json_lines(ok(run_cli("--db", prepared.path, "ls", "--json", *filters)))
    assert [job["id"] for job in jobs] == expected
    for job in jobs:
        for flag, field in (("--state", "state"), ("--kind", "kind")):
            if flag in filters:
                assert job[field] == filters[filters.index(flag) + 1]


def test_ls_table_shows_one_row_per_job_and_says_when_nothing_matches(prepared: Prepared) -> None:
    out = ok(run_cli("--db", prepared.path, "ls", "--state", "dead"))
    header = out.splitlines()[0].split()
    assert header == [
        "id",
        "kind",
        "state",
        "attempts",
        "run_at",
        "updated_at",
        "lease_until",
        "last_error",
    ]
    rows = table_rows(out)
    assert [row[:4] for row in rows] == [
        ["r2", "resize", "dead", "1/2"],
        ["r3", "resize", "dead", "1/2"],
    ]
    # a long error is cut to one short line in the table (show prints it in full)
    assert rows[0][7].startswith("RuntimeError: the image service")
    assert len(rows[0][7]) == 40
    assert rows[0][7].endswith("…")
    assert "second line" not in out
    assert rows[1][7] == "RuntimeError: short and final"
    assert rows[0][6] == "-"  # no lease
    assert "more:" not in out

    empty = ok(run_cli("--db", prepared.path, "ls", "--kind", "no-such-kind"))
    assert empty == "no jobs\n"


def test_ls_after_continues_strictly_after_the_given_id(prepared: Prepared) -> None:
    jobs = json_lines(ok(run_cli("--db", prepared.path, "ls", "--json", "--after", "e05")))
    assert [job["id"] for job in jobs] == [i for i in prepared.ids if i > "e05"]
    last = json_lines(ok(run_cli("--db", prepared.path, "ls", "--json", "--after", "r4")))
    assert last == []


def test_ls_limit_bounds_a_page(prepared: Prepared) -> None:
    jobs = json_lines(ok(run_cli("--db", prepared.path, "ls", "--json", "--limit", "3")))
    assert [job["id"] for job in jobs] == prepared.ids[:3]


def test_keyset_paging_with_the_tables_hint_reaches_every_job_exactly_once(
    prepared: Prepared,
) -> None:
    seen: list[str] = []
    after: list[str] = []
    pages = 0
    while True:
        out = ok(run_cli("--db", prepared.path, "ls", "--limit", "6", *after))
        pages += 1
        seen += [row[0] for row in table_rows(out)]
        hint = re.search(r"^more: --after (\S+)$", out, re.MULTILINE)
        if hint is None:
            break
        assert hint.group(1) == seen[-1]
        after = ["--after", hint.group(1)]
        assert pages < 10, "paging does not terminate"
    assert seen == prepared.ids  # every job, once, in id order
    assert pages == 4  # 6 + 6 + 6 + 2


def test_keyset_paging_in_json_with_a_filter_reaches_every_match_once(prepared: Prepared) -> None:
    seen: list[str] = []
    after: list[str] = []
    for _ in range(10):
        page = json_lines(
            ok(
                run_cli(
                    "--db", prepared.path, "ls", "--json", "--kind", "email", "--limit", "4", *after
                )
            )
        )
        seen += [job["id"] for job in page]
        if len(page) < 4:
            break
        after = ["--after", page[-1]["id"]]
    assert seen == [f"e{i:02d}" for i in range(12)]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["ls", "--state", "sleeping"], "invalid choice: 'sleeping'"),
        (["ls", "--limit", "0"], "positive integer"),
        (["ls", "--limit", "many"], "positive integer"),
        (["ls", "--kind", ""], "non-empty"),
        (["ls", "--after", ""], "non-empty"),
    ],
)
def test_ls_refuses_bad_filters_in_one_line(
    prepared: Prepared, args: list[str], needle: str
) -> None:
    assert_one_line_error(run_cli("--db", prepared.path, *args), 2, needle)


# ------------------------------------------------------------------ show


def rendered(value: Any) -> str:
    if value is None:
        return "-"
    return value if isinstance(value, str) else json.dumps(value)


def test_show_prints_every_field_and_the_last_error_in_full(prepared: Prepared) -> None:
    out = ok(run_cli("--db", prepared.path, "show", "r2"))
    job = read_job(prepared.path, "r2")
    assert job is not None
    assert job["last_error"] == "RuntimeError: " + LONG_ERROR
    for key, value in job.items():
        if key == "last_error":
            continue
        assert re.search(rf"^{key} +{re.escape(rendered(value))}$", out, re.MULTILINE), key
    # the whole error, every line of it, verbatim, then the error history
    assert re.search(r"^last_error +" + re.escape(job["last_error"]) + r"\n\n", out, re.M)
    history = out.split(job["last_error"] + "\n\n", 1)[1]
    lines = history.splitlines()
    assert lines[0] == "error history (1 failed attempt(s), oldest first):"
    assert re.fullmatch(
        r"  attempt 1  \S+\+00:00  RuntimeError: the image service .{60,}\.\.\.", lines[1]
    )
    # the last attempt's traceback, where fail() was given a raised exception
    assert lines[2:4] == ["", "traceback of attempt 1:"]
    assert lines[4] == "Traceback (most recent call last):"
    assert "in settle" in history
    assert history.rstrip().endswith("third line, indented")
    assert "lease_token" not in out


def test_show_renders_results_payloads_and_unset_times(prepared: Prepared) -> None:
    out = ok(run_cli("--db", prepared.path, "show", "r0"))
    fields = dict(re.split(r" {2,}", line, maxsplit=1) for line in out.splitlines())
    assert fields["state"] == "done"
    assert json.loads(fields["payload"]) == {"image": 0}
    assert json.loads(fields["result"]) == {"w": 64}
    assert fields["lease_until"] == "-"
    assert fields["last_error"] == "-"
    assert fields["attempts"] == "1"
    job = read_job(prepared.path, "r0")
    assert job is not None
    assert fields["created_at"] == job["created_at"]  # ISO 8601, UTC, milliseconds
    assert datetime.fromisoformat(fields["created_at"]).utcoffset() == timedelta(0)


def test_show_json_is_the_jobs_to_dict(prepared: Prepared) -> None:
    for job_id in ("r2", "p2", "e00"):
        out = ok(run_cli("--db", prepared.path, "show", job_id, "--json"))
        assert len(out.splitlines()) == 1
        shown = json.loads(out)
        history = shown.pop("errors")
        assert shown.pop("lease_expired") is False
        assert shown == read_job(prepared.path, job_id)
        with open_store(prepared.path, readonly=True) as store:
            assert history == [e.to_dict() for e in store.jobs.errors(job_id)]
        assert len(history) == (1 if job_id == "r2" else 0)


@pytest.mark.parametrize("command", ["show", "cancel", "requeue"])
def test_an_unknown_id_exits_1_with_one_line(prepared: Prepared, command: str) -> None:
    before = all_jobs(prepared.path)
    line = assert_one_line_error(run_cli("--db", prepared.path, command, "nope-404"), 1)
    assert "'nope-404'" in line
    assert all_jobs(prepared.path) == before


# ------------------------------------------------------------------ cancel and requeue


def test_cancel_cancels_a_queued_job_once(mixed: Prepared) -> None:
    assert ok(run_cli("--db", mixed.path, "cancel", "e03")) == "cancelled e03\n"
    job = read_job(mixed.path, "e03")
    assert job is not None
    assert job["state"] == "cancelled"
    # a failed job (waiting for its retry) is queued too
    assert ok(run_cli("--db", mixed.path, "cancel", "r4")) == "cancelled r4\n"
    again = ok(run_cli("--db", mixed.path, "cancel", "e03"))
    assert again == "e03 was already cancelled\n"


def test_cancel_is_refused_for_a_settled_job(mixed: Prepared) -> None:
    before = all_jobs(mixed.path)
    assert_one_line_error(run_cli("--db", mixed.path, "cancel", "r0"), 1, "JD2065", "r0")
    assert_one_line_error(run_cli("--db", mixed.path, "cancel", "r2"), 1, "JD2065", "r2")
    assert all_jobs(mixed.path) == before


def test_cancel_of_a_running_job_requests_its_cancellation(mixed: Prepared) -> None:
    # p2 is leased by a live attempt: the forced cancel marks it (SPEC §13)
    out = ok(run_cli("--db", mixed.path, "cancel", "p2"))
    assert out.startswith("cancel requested for running p2: ")
    job = read_job(mixed.path, "p2")
    assert job is not None
    assert (job["state"], job["cancel_requested"]) == ("leased", True)
    listed = table_rows(ok(run_cli("--db", mixed.path, "ls", "--kind", "report")))
    assert [row[2] for row in listed] == ["pending", "cancelled", "leased (cancel requested)"]
    assert ok(run_cli("--db", mixed.path, "cancel", "p2")) == "p2: cancellation already requested\n"


def test_requeue_returns_dead_failed_and_cancelled_jobs_to_pending(mixed: Prepared) -> None:
    before = all_jobs(mixed.path)
    for job_id in ("r2", "r4", "p1"):
        assert ok(run_cli("--db", mixed.path, "requeue", job_id)) == f"requeued {job_id}\n"
        job = read_job(mixed.path, job_id)
        assert job is not None
        assert job["state"] == "pending"
        assert job["attempts"] == before[job_id]["attempts"]  # the history is kept
        assert job["last_error"] == before[job_id]["last_error"]
    assert ok(run_cli("--db", mixed.path, "requeue", "r2")) == "r2 was already pending\n"


def test_requeue_reset_attempts_starts_the_count_over(mixed: Prepared) -> None:
    before = all_jobs(mixed.path)
    assert before["r2"]["attempts"] > 0
    assert ok(run_cli("--db", mixed.path, "requeue", "r2", "--reset-attempts")) == "requeued r2\n"
    job = read_job(mixed.path, "r2")
    assert job is not None
    assert (job["state"], job["attempts"]) == ("pending", 0)
    assert job["last_error"] == before["r2"]["last_error"]


def test_requeue_is_refused_for_a_done_or_live_leased_job(mixed: Prepared) -> None:
    before = all_jobs(mixed.path)
    assert_one_line_error(run_cli("--db", mixed.path, "requeue", "r1"), 1, "JD2065", "r1")
    assert_one_line_error(run_cli("--db", mixed.path, "requeue", "p2"), 1, "JD2068", "p2")
    assert all_jobs(mixed.path) == before


# ------------------------------------------------------------------ sweep


def test_sweep_deletes_settled_jobs_older_than_each_duration(tmp_path: Path) -> None:
    path = tmp_path / "aged.db"
    real_now = time.time()
    ages = {"old-8d": 8 * DAY, "old-2d": 2 * DAY, "old-11h": 11 * 3600, "old-5m": 5 * 60}
    ages["old-10s"] = 10
    now = [real_now - 30 * DAY]
    with open_store(path, runtime=clock_runtime(now)) as store:
        store.jobs.enqueue("keep", None, id="pending-30d")  # never settled: never swept
        for job_id, age in sorted(ages.items(), key=lambda item: -item[1]):
            now[0] = real_now - age
            store.jobs.enqueue("k", None, id=job_id)
            settle(store, "k", error="gone" if job_id == "old-2d" else None)

    remaining = set(ages) | {"pending-30d"}
    for duration, removed in (
        ("7d", "old-8d"),
        ("12h", "old-2d"),  # dead letters are settled too
        ("15m", "old-11h"),
        ("30s", "old-5m"),
    ):
        out = ok(run_cli("--db", path, "sweep", "--older-than", duration))
        assert out.startswith("swept 1 settled job(s) last changed before ")
        remaining.discard(removed)
        assert set(all_jobs(path)) == remaining, duration
    # nothing left old enough
    assert ok(run_cli("--db", path, "sweep", "--older-than", "1m")).startswith("swept 0 ")
    assert set(all_jobs(path)) == {"old-10s", "pending-30d"}


def test_sweep_limit_bounds_one_sweep(tmp_path: Path) -> None:
    path = tmp_path / "many.db"
    now = [time.time() - 2 * DAY]
    with open_store(path, runtime=clock_runtime(now)) as store:
        for i in range(5):
            store.jobs.enqueue("k", None, id=f"s{i}")
            settle(store, "k")
    out = ok(run_cli("--db", path, "sweep", "--older-than", "1d", "--limit", "2"))
    assert out.startswith("swept 2 ")
    assert len(all_jobs(path)) == 3


@pytest.mark.parametrize("duration", ["7", "7x", "d", "-1d", "1.5.2h", "", "7 days", "1e3s"])
def test_a_bad_duration_exits_2_with_one_line_and_sweeps_nothing(
    mixed: Prepared, duration: str
) -> None:
    before = all_jobs(mixed.path)
    assert_one_line_error(
        # the `=` form, so that "-1d" is not read as an option
        run_cli("--db", mixed.path, "sweep", f"--older-than={duration}"),
        2,
        "--older-than",
        "bad duration",
        "30s, 15m, 12h, 7d",
    )
    assert all_jobs(mixed.path) == before


def test_sweep_requires_a_horizon(mixed: Prepared) -> None:
    assert_one_line_error(run_cli("--db", mixed.path, "sweep"), 2, "--older-than")


# ------------------------------------------------------------------ --db and JAREN_JOBS_DB


def test_the_environment_names_the_database_and_db_overrides_it(
    prepared: Prepared, tmp_path: Path
) -> None:
    expected = {"pending": 13, "leased": 1, "done": 2, "failed": 1, "dead": 2, "cancelled": 1}

    def counts(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
        data = json.loads(ok(result))
        return {state: data[state] for state in STATES}

    assert counts(run_cli("counts", "--json", env=cli_env(str(prepared.path)))) == expected
    other = tmp_path / "other.db"
    open_store(other).close()
    overridden = run_cli("--db", other, "counts", "--json", env=cli_env(str(prepared.path)))
    assert counts(overridden) == dict.fromkeys(STATES, 0)
    # --db is also accepted after the subcommand
    assert counts(run_cli("counts", "--json", "--db", prepared.path)) == expected


def test_no_database_named_at_all_exits_2(tmp_path: Path) -> None:
    assert_one_line_error(
        run_cli("counts", cwd=tmp_path), 2, "no database", "--db PATH", "JAREN_JOBS_DB"
    )
    assert_one_line_error(run_cli("counts", env=cli_env("")), 2, "no database")


EVERY_DB_COMMAND = [
    ["counts"],
    ["counts", "--json"],
    ["ls"],
    ["show", "x"],
    ["cancel", "x"],
    ["requeue", "x"],
    ["sweep", "--older-than", "1d"],
    ["worker", "tests.processes.cli_handlers:HANDLERS"],
]


@pytest.mark.parametrize("command", EVERY_DB_COMMAND, ids=" ".join)
def test_a_missing_database_file_exits_2_and_is_not_created(
    tmp_path: Path, command: list[str]
) -> None:
    missing = tmp_path / "nope.db"
    assert_one_line_error(run_cli("--db", missing, *command), 2, "no database at", "nope.db")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def plain_sqlite(tmp_path: Path) -> Path:
    path = tmp_path / "app.db"
    connection = sqlite3.connect(path)
    with connection:
        connection.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        connection.execute("INSERT INTO customers (name) VALUES ('ada')")
    connection.close()
    return path


def table_names(path: Path) -> list[str]:
    connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return [
            row[0] for row in connection.execute("SELECT name FROM sqlite_master ORDER BY name")
        ]
    finally:
        connection.close()


@pytest.mark.parametrize("command", EVERY_DB_COMMAND, ids=" ".join)
def test_a_plain_sqlite_file_is_not_a_jaren_database_and_stays_untouched(
    plain_sqlite: Path, command: list[str]
) -> None:
    before = plain_sqlite.read_bytes()
    assert_one_line_error(
        run_cli("--db", plain_sqlite, *command), 2, "is not a jaren_jobs database", "app.db"
    )
    # not even a write command created job tables in it
    assert table_names(plain_sqlite) == ["customers"]
    assert plain_sqlite.read_bytes() == before
    assert sorted(p.name for p in plain_sqlite.parent.iterdir()) == ["app.db"]


@pytest.mark.parametrize("command", EVERY_DB_COMMAND, ids=" ".join)
def test_a_file_that_is_not_sqlite_is_refused_and_stays_untouched(
    tmp_path: Path, command: list[str]
) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 200)
    before = path.read_bytes()
    assert_one_line_error(
        run_cli("--db", path, *command), 2, "is not a jaren_jobs database", "not an SQLite file"
    )
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_a_directory_is_not_a_database(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("--db", tmp_path, "counts"), 2, "no database at")


def journal_mode(path: Path) -> str:
    # asking read-only changes nothing
    connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return str(connection.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        connection.close()


def schema_version_of(path: Path) -> str | None:
    if "_jaren_meta" not in table_names(path):
        return None
    connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        row = connection.execute(
            "SELECT value FROM \"_jaren_meta\" WHERE key = 'schema_version'"
        ).fetchone()
        return None if row is None else str(row[0])
    finally:
        connection.close()


def build_version_1(path: Path) -> None:
    """A database as schema version 1 left it: the (state, kind) index of every row."""
    build_pre_fence(path)
    with open_store(path) as store:
        store.jobs.enqueue("mail", {"to": "b"}, id="p2")
    connection = sqlite3.connect(path)
    with connection:
        connection.execute('CREATE INDEX "_jaren_jobs_state" ON "_jaren_jobs" (state, kind)')
        connection.execute("UPDATE \"_jaren_meta\" SET value = '1' WHERE key = 'schema_version'")
    connection.execute("PRAGMA journal_mode = DELETE")  # outside a transaction, or a no-op
    connection.close()


def build_current_in_rollback_mode(path: Path) -> None:
    """The current schema, in a file the application keeps in rollback-journal mode."""
    build_version_1(path)
    with open_store(path):
        pass
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA journal_mode = DELETE")
    connection.close()


READ_ONLY_COMMANDS = [
    ["counts"],
    ["counts", "--json"],
    ["ls"],
    ["ls", "--json", "--state", "failed"],
    ["show", "f1"],
    ["show", "f1", "--json"],
]


def build_current_in_wal_mode(path: Path) -> None:
    build_version_1(path)
    open_store(path).close()  # upgraded, and switched to WAL


@pytest.mark.parametrize("command", READ_ONLY_COMMANDS, ids=" ".join)
@pytest.mark.parametrize(
    ("build", "older", "mode"),
    [
        pytest.param(build_pre_fence, True, "delete", id="pre-fence"),
        pytest.param(build_version_1, True, "delete", id="version 1"),
        pytest.param(build_current_in_rollback_mode, False, "delete", id="current, rollback"),
        pytest.param(build_current_in_wal_mode, False, "wal", id="current, WAL"),
    ],
)
def test_read_only_commands_read_any_schema_and_leave_the_file_as_it_was(
    tmp_path: Path, build: Callable[[Path], None], older: bool, mode: str, command: list[str]
) -> None:
    path = tmp_path / "legacy.db"
    build(path)
    before = (path.read_bytes(), journal_mode(path), schema_version_of(path))
    assert before[1] == mode
    result = run_cli("--db", path, *command)
    assert result.returncode == 0, result.stderr
    # not a byte, not the journal mode, not the schema version, no file beside it
    # (but a WAL file's readers share SQLite's -wal and -shm, which a read-only
    # connection cannot remove)
    assert (path.read_bytes(), journal_mode(path), schema_version_of(path)) == before
    shared = {"legacy.db-wal", "legacy.db-shm"} if mode == "wal" else set()
    assert {p.name for p in tmp_path.iterdir()} - shared == {"legacy.db"}
    if older:  # said once, on stderr: stdout stays what a script parses
        [note] = result.stderr.splitlines()
        assert note.startswith("jaren-jobs: note: ")
        assert "older schema" in note
        assert "unchanged" in note
    else:
        assert result.stderr == ""
    if command == ["counts", "--json"]:
        data = json.loads(result.stdout)
        assert (data["pending"], data["leased"], data["done"], data["failed"]) == (
            1 + (build is not build_pre_fence),
            1,
            1,
            1,
        )
    if command == ["show", "f1", "--json"]:
        shown = json.loads(result.stdout)
        assert shown["last_error"] == "Error: smtp down"
        assert shown["payload"] == [1, 2]
    if command[:2] == ["ls", "--json"]:
        assert [job["id"] for job in json_lines(result.stdout)] == ["f1"]


def test_a_write_command_upgrades_an_older_schema_in_place(tmp_path: Path) -> None:
    path = tmp_path / "legacy.db"
    build_pre_fence(path)
    assert ok(run_cli("--db", path, "requeue", "f1")) == "requeued f1\n"
    assert schema_version_of(path) == str(sql.SCHEMA_VERSION)
    assert journal_mode(path) == "wal"
    data = json.loads(ok(run_cli("--db", path, "counts", "--json")))
    assert (data["pending"], data["leased"], data["done"], data["failed"]) == (2, 1, 1, 0)


def test_a_newer_schema_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    with open_store(path) as store:
        store.jobs.enqueue("k", None, id="j")
    connection = sqlite3.connect(path)
    with connection:
        connection.execute("UPDATE \"_jaren_meta\" SET value = '99' WHERE key = 'schema_version'")
    connection.close()
    for command in (["counts"], ["cancel", "j"]):
        assert_one_line_error(run_cli("--db", path, *command), 2, "cannot open", "newer")


# ------------------------------------------------------------------ usage


def test_jaren_jobs_alone_prints_a_short_help_and_exits_2(prepared: Prepared) -> None:
    for args in ((), ("--db", str(prepared.path))):
        result = run_cli(*args)
        assert result.returncode == 2
        assert result.stdout == ""
        lines = result.stderr.splitlines()
        assert lines[0].startswith("usage: jaren-jobs")
        listed = [line.split()[0] for line in lines if line.startswith("  ")]
        assert listed == [
            "counts",
            "ls",
            "show",
            "cancel",
            "requeue",
            "sweep",
            "worker",
            "demo",
            "dashboard",
        ]
        assert "--help" in lines[-1]
        assert "Traceback" not in result.stderr
        assert len(lines) < 16  # short


def test_usage_mistakes_are_one_line_exit_2(prepared: Prepared) -> None:
    assert_one_line_error(run_cli("--db", prepared.path, "frobnicate"), 2, "invalid choice")
    assert_one_line_error(run_cli("--db", prepared.path, "show"), 2, "required", "id")
    assert_one_line_error(run_cli("--db", prepared.path, "show", ""), 2, "non-empty")


def test_the_console_script_is_declared_and_is_the_same_main() -> None:
    from importlib.metadata import entry_points

    from jaren_jobs import cli

    (script,) = entry_points(group="console_scripts", name="jaren-jobs")
    assert script.value == "jaren_jobs.cli:main"
    assert script.load() is cli.main


def test_help_lists_every_subcommand() -> None:
    out = ok(run_cli("--help"))
    commands = ("counts", "ls", "show", "cancel", "requeue", "sweep", "worker", "demo", "dashboard")
    for command in commands:
        assert re.search(rf"^\s+{command}\s", out, re.MULTILINE), command


def test_a_reader_that_goes_away_is_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "big.db"
    with open_store(path) as store:
        store.jobs.enqueue_many(NewJob("k", i) for i in range(3000))
    process = subprocess.Popen(
        [sys.executable, "-m", "jaren_jobs", "--db", str(path), "ls", "--limit", "3000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(),
    )
    assert process.stdout is not None
    assert process.stdout.readline().split()[0] == b"id"
    process.stdout.close()  # like `| head -1`
    _, stderr = process.communicate(timeout=SUBPROCESS_TIMEOUT)
    assert process.returncode == 141
    assert stderr == b""


def run_cli_bytes(
    *args: str | bytes | Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``run_cli`` with arguments passed as bytes, as a shell passes what a user typed."""
    return subprocess.run(
        [sys.executable, "-m", "jaren_jobs", *(os.fsencode(a) for a in args)],
        capture_output=True,
        encoding="utf-8",
        errors="surrogateescape",
        env=env if env is not None else cli_env(),
        cwd=cwd,
        timeout=SUBPROCESS_TIMEOUT,
        check=False,
    )


@pytest.mark.parametrize(
    "command",
    [
        ["show", b"\xff"],
        ["show", b"caf\xe9"],  # Latin-1, not UTF-8
        ["cancel", b"e0\xff"],
        ["requeue", b"\xfe\xff"],
        ["ls", "--kind", b"\xff"],
        ["ls", "--after", b"e\xff"],
        ["sweep", "--older-than", b"1\xffd"],
        ["worker", b"user\xffjobs:H"],
        ["worker", "userjobs:H", "--kinds", b"dou\xffble"],
    ],
    ids=lambda command: " ".join(
        os.fsdecode(part).encode("unicode_escape").decode() for part in command
    ),
)
def test_an_argument_that_is_not_utf8_exits_2_with_one_line(
    mixed: Prepared, user_code: Path, command: list[str | bytes]
) -> None:
    before = all_jobs(mixed.path)
    result = run_cli_bytes("--db", mixed.path, *command, cwd=user_code)
    assert_one_line_error(result, 2, "not valid UTF-8")
    assert all_jobs(mixed.path) == before


def test_a_database_path_that_is_not_utf8_is_still_a_path(
    prepared: Prepared, user_code: Path, tmp_path: Path
) -> None:
    # file names are bytes: one that is not UTF-8 names a file like any other
    path = os.fsencode(tmp_path) + b"/queue-\xff.db"
    with open(prepared.path, "rb") as source, open(path, "wb") as target:
        target.write(source.read())
    strict = cli_env(PYTHONIOENCODING="utf-8:strict")  # a terminal that refuses bad bytes
    counts = run_cli_bytes("--db", path, "counts", "--json", env=strict)
    assert counts.returncode == 0, counts.stderr
    assert json.loads(counts.stdout)["pending"] == 13
    missing = run_cli_bytes("--db", path + b".gone", "counts", env=strict)
    assert_one_line_error(missing, 2, "no database at")
    process = subprocess.Popen(
        [sys.executable, "-m", "jaren_jobs", b"--db", path, "worker", "userjobs:H"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=strict, cwd=user_code,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        ready = process.stdout.readline().decode("ascii")  # the path is shown escaped
        assert READY.match(ready.rstrip("\n")), (ready, process.poll())
        assert "queue-\\xff.db" in ready
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=SUBPROCESS_TIMEOUT)
    assert process.returncode == 0, stderr
    assert stderr == b""
    kept = os.fsencode(tmp_path) + b"/demo-\xff.db"
    demo = run_cli_bytes("demo", "--jobs", "10", "--db", kept, env=strict)
    assert demo.returncode == 0, demo.stderr
    assert "demo database: " in demo.stdout
    assert "demo-\\xff.db (kept)" in demo.stdout


HUGE = "9" * 30  # past every 64-bit integer


@pytest.mark.parametrize(
    ("command", "needles"),
    [
        # a horizon before the year 1: one line, not an OverflowError
        pytest.param(
            ["sweep", "--older-than", "200000w"], ["--older-than", "200000w"], id="sweep 200000w"
        ),
        pytest.param(
            ["sweep", "--older-than", "9" * 400 + "d"], ["--older-than"], id="sweep 9e400d"
        ),
        pytest.param(
            ["sweep", "--older-than", "1d", "--limit", HUGE],
            ["--limit", "at most"],
            id="sweep limit",
        ),
        pytest.param(["ls", "--limit", HUGE], ["--limit", "at most"], id="ls limit"),
        pytest.param(["ls", "--limit", "9" * 5000], ["--limit"], id="ls limit of 5000 digits"),
        pytest.param(
            ["worker", "userjobs:H", "--concurrency", "5000"],
            ["--concurrency", "at most"],
            id="worker concurrency",
        ),
        pytest.param(
            ["worker", "userjobs:H", "--grace", "1e308"], ["--grace", "at most"], id="worker grace"
        ),
        pytest.param(
            ["worker", "userjobs:H", "--poll", "1e308"], ["--poll", "at most"], id="worker poll"
        ),
        pytest.param(["demo", "--jobs", HUGE], ["--jobs", "at most"], id="demo jobs"),
    ],
)
def test_an_absurdly_large_number_exits_2_with_one_line(
    mixed: Prepared, user_code: Path, command: list[str], needles: list[str]
) -> None:
    before = all_jobs(mixed.path)
    result = run_cli("--db", mixed.path, *command, cwd=user_code)
    assert_one_line_error(result, 2, *needles)
    assert all_jobs(mixed.path) == before


def test_requeue_drop_checkpoints_starts_a_run_over(tmp_path: Path) -> None:
    path = tmp_path / "dag.db"
    with open_store(path) as store:
        for job_id in ("kept", "dropped"):
            store.jobs.enqueue("chain", {"input": 1}, id=job_id)
            claimed = store.jobs.claim(["chain"], owner="prep")
            assert claimed is not None
            store.jobs.checkpoints_for(claimed).save(job_id, "n1", 1)
            store.jobs.fail(claimed.lease, RuntimeError("RunMismatch"), retry=False)

    def checkpoint_rows(job_id: str) -> int:
        connection = sqlite3.connect(path)
        try:
            query = 'SELECT COUNT(*) FROM "_jaren_job_checkpoints" WHERE run_id = ?'
            return int(connection.execute(query, (job_id,)).fetchone()[0])
        finally:
            connection.close()

    assert ok(run_cli("--db", path, "requeue", "kept")) == "requeued kept\n"
    assert checkpoint_rows("kept") == 1  # a plain requeue resumes
    out = ok(run_cli("--db", path, "requeue", "dropped", "--drop-checkpoints"))
    assert out == "requeued dropped; its checkpoints were dropped\n"
    assert checkpoint_rows("dropped") == 0
    job = read_job(path, "dropped")
    assert job is not None
    assert (job["state"], job["attempts"]) == ("pending", 1)


# ------------------------------------------------------------------ worker


USER_HANDLERS = textwrap.dedent(
    """
    def double(payload, ctx):
        return payload * 2

    H = {"double": double, "other": double}
    NOT_CALLABLE = {"double": 3}
    EMPTY = {}
    NOT_A_DICT = [double]

    def factory():
        return {"double": double}

    def broken_factory():
        raise RuntimeError("the factory broke")
    """
)


@pytest.fixture(scope="module")
def user_code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory holding the user's handler modules."""
    folder = tmp_path_factory.mktemp("user-code")
    (folder / "userjobs.py").write_text(USER_HANDLERS)
    (folder / "raises_on_import.py").write_text('raise RuntimeError("refusing to import")\n')
    (folder / "bad_syntax.py").write_text("def broken(:\n")
    return folder


@pytest.fixture
def one_pending(tmp_path: Path) -> Path:
    path = tmp_path / "work.db"
    with open_store(path) as store:
        store.jobs.enqueue("double", 21, id="j1")
    return path


@pytest.mark.parametrize(
    ("spec", "options", "needles"),
    [
        ("nosuch.module:X", [], ["cannot import 'nosuch.module'", "ModuleNotFoundError"]),
        ("raises_on_import:H", [], ["cannot import", "RuntimeError: refusing to import"]),
        ("bad_syntax:H", [], ["cannot import 'bad_syntax'", "SyntaxError"]),
        ("userjobs:MISSING", [], ["has no attribute 'MISSING'"]),
        ("userjobs", [], ["expected MODULE:ATTR"]),
        ("userjobs:", [], ["expected MODULE:ATTR"]),
        ("userjobs:NOT_CALLABLE", [], ["must be callable"]),
        ("userjobs:EMPTY", [], ["non-empty dict"]),
        ("userjobs:NOT_A_DICT", [], ["non-empty dict"]),
        ("userjobs:broken_factory", [], ["raised RuntimeError: the factory broke"]),
        ("userjobs:H", ["--kinds", "double,nosuch"], ["--kinds", "no handler: nosuch"]),
        ("userjobs:H", ["--kinds", ","], ["--kinds names no kind"]),
        ("userjobs:H", ["--concurrency", "0"], ["--concurrency", "positive integer"]),
        ("userjobs:H", ["--poll", "-1"], ["--poll"]),
        ("userjobs:H", ["--grace", "soon"], ["--grace"]),
    ],
)
def test_worker_refuses_bad_handlers_in_one_line_and_runs_nothing(
    user_code: Path, one_pending: Path, spec: str, options: list[str], needles: list[str]
) -> None:
    result = run_cli("--db", one_pending, "worker", spec, *options, cwd=user_code)
    assert_one_line_error(result, 2, *needles)
    job = read_job(one_pending, "j1")
    assert job is not None
    assert (job["state"], job["attempts"]) == ("pending", 0)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` with short waits: a subprocess cannot set our Event."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def start_worker(
    db: Path, spec: str, *options: str, cwd: Path, python_flags: Sequence[str] = ()
) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, *python_flags, "-m", "jaren_jobs", "--db", str(db), "worker", spec,
         "--poll", "0.05", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=cwd,
    )  # fmt: skip
    assert process.stdout is not None
    ready = process.stdout.readline()  # printed after the signal handlers are installed
    assert READY.match(ready.rstrip("\n")), (ready, process.poll())
    return process


def test_worker_finds_the_module_in_the_working_directory_like_the_console_script(
    user_code: Path, one_pending: Path
) -> None:
    # -I keeps the working directory off sys.path, as it is for the installed
    # `jaren-jobs` script: only the CLI's own lookup can find userjobs.py
    process = start_worker(one_pending, "userjobs:factory", cwd=user_code, python_flags=["-I"])
    try:
        wait_until(lambda: (read_job(one_pending, "j1") or {})["state"] == "done", 30, "j1")
    finally:
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=SUBPROCESS_TIMEOUT)
    assert process.returncode == 0, stderr
    assert stderr == ""
    summary = SUMMARY.match(stdout.strip().splitlines()[-1])
    assert summary is not None, stdout
    assert summary.groups() == ("1", "0", "0", "0", "drained")
    job = read_job(one_pending, "j1")
    assert job is not None
    assert job["result"] == 42


# ------------------------------------------------------------------ demo


def demo_table(out: str) -> dict[str, int]:
    block = out.split("\nstate      jobs\n", 1)[1].split("\n\n", 1)[0]
    return {line.split()[0]: int(line.split()[1]) for line in block.splitlines()}


def check_demo_report(out: str, jobs: int) -> dict[str, int]:
    counts = demo_table(out)
    assert set(counts) == set(STATES)
    assert counts["done"] + counts["dead"] == jobs + 1  # + the DAG job
    assert counts["dead"] > 0
    assert (counts["pending"], counts["leased"], counts["failed"], counts["cancelled"]) == (
        0,
        0,
        0,
        0,
    )
    retries = re.search(r"^retries: (\d+) attempts failed", out, re.MULTILINE)
    assert retries is not None, out
    assert int(retries.group(1)) > counts["dead"]  # some failures were retried, not all dead
    dead = re.search(r"^dead letters: (\d+) jobs used all 3 attempts; e\.g\. \S+: .+", out, re.M)
    assert dead is not None, out
    assert int(dead.group(1)) == counts["dead"]
    dag = re.search(r"^DAG resume: .*resumed on attempt 2: gather ran 1x, total ran 1x, "
                    r"summarize ran 2x -> '3 numbers, total 12'$", out, re.MULTILINE)  # fmt: skip
    assert dag is not None, out
    # the report is the last thing printed
    assert out.rstrip("\n").splitlines()[-1].startswith("DAG resume: ")
    return counts


def test_demo_runs_on_a_temporary_database_in_seconds_and_cleans_up(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    started = time.monotonic()
    out = ok(run_cli("demo", env=cli_env(str(tmp_path / "ignored.db"), TMPDIR=str(scratch))))
    elapsed = time.monotonic() - started
    assert elapsed < 20, f"the demo took {elapsed:.1f} s"
    check_demo_report(out, 300)
    assert "\r" not in out  # not a terminal: plain counter lines
    settled = [int(n) for n in re.findall(r"^settled (\d+)/301 ", out, re.MULTILINE)]
    assert settled[-1] == 301
    assert settled == sorted(set(settled))  # each line reports progress
    assert list(scratch.iterdir()) == []  # the temporary database is gone
    # $JAREN_JOBS_DB is not the demo's: it may name a real queue
    assert not (tmp_path / "ignored.db").exists()


def test_demo_with_db_keeps_the_database_and_refuses_to_reuse_it(tmp_path: Path) -> None:
    path = tmp_path / "kept.db"
    out = ok(run_cli("demo", "--jobs", "40", "--db", path))
    counts = check_demo_report(out, 40)
    with open_store(path, readonly=True) as store:
        assert {s: getattr(store.jobs.counts(), s) for s in STATES} == counts
        report = store.jobs.get("report-1")
        assert report is not None
        assert report.result == "3 numbers, total 12"
    # a second run would mix its jobs with these: refused, nothing changed
    before = all_jobs(path)
    assert_one_line_error(run_cli("--db", path, "demo"), 2, "already holds 41 job(s)")
    assert all_jobs(path) == before


def test_demo_json_prints_one_object_with_what_the_report_says(tmp_path: Path) -> None:
    path = tmp_path / "kept.db"
    out = ok(run_cli("demo", "--jobs", "40", "--db", path, "--json"))
    assert len(out.splitlines()) == 1  # the object alone: no progress lines
    report = json.loads(out)
    assert report["finished"] is True
    assert report["jobs"] == 41
    with open_store(path, readonly=True) as store:
        assert report["counts"] == {s: getattr(store.jobs.counts(), s) for s in STATES}
    assert report["counts"]["done"] + report["counts"]["dead"] == 41
    assert report["failed_attempts"] > report["counts"]["dead"] > 0
    assert report["dead_letter_example"]["state"] == "dead"
    assert report["dead_letter_example"]["attempts"] == 3
    assert report["dag"] == {
        "attempts": 2,
        "result": "3 numbers, total 12",
        "runs": {"gather": 1, "total": 1, "summarize": 2},
    }
    assert report["database"] == str(path)


def test_demo_will_not_write_into_a_database_that_is_not_its_own(
    plain_sqlite: Path, tmp_path: Path
) -> None:
    before = plain_sqlite.read_bytes()
    assert_one_line_error(run_cli("demo", "--db", plain_sqlite), 2, "not a jaren_jobs database")
    assert plain_sqlite.read_bytes() == before
    assert_one_line_error(run_cli("demo", "--db", tmp_path / "no" / "dir.db"), 2, "no directory")


def test_demo_on_a_terminal_draws_one_live_progress_line() -> None:

    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "jaren_jobs", "demo", "--jobs", "60"],
        stdout=follower,
        stderr=subprocess.PIPE,
        env=cli_env(),
    )
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT
    while time.monotonic() < deadline:
        readable, _, _ = select.select([leader], [], [], 1.0)
        if not readable:
            continue
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    _, stderr = process.communicate(timeout=SUBPROCESS_TIMEOUT)
    assert process.returncode == 0, stderr
    out = b"".join(chunks).decode().replace("\r\n", "\n")
    progress = out.split("enqueued 61 jobs\n", 1)[1].split("\n", 1)[0]
    # one line redrawn in place (carriage returns, no newlines), ending complete
    assert progress.startswith("\r")
    assert progress.split("\r")[-1].startswith("settled 61/61")
    check_demo_report(out, 60)


# ------------------------------------------------------------------ queues (SPEC §12)


@pytest.fixture
def queued(tmp_path: Path) -> Path:
    path = tmp_path / "queued.db"
    with open_store(path) as store:
        store.jobs.enqueue("double", 1, id="e1", queue="emails")
        store.jobs.enqueue("double", 2, id="e2", queue="emails")
        store.jobs.enqueue("other", 3, id="b1", queue="bulk")
        store.jobs.enqueue("double", 4, id="d1")
    return path


def test_ls_and_counts_filter_by_queue(queued: Path) -> None:
    listed = json_lines(ok(run_cli("--db", queued, "ls", "--json", "--queue", "emails")))
    assert [job["id"] for job in listed] == ["e1", "e2"]
    assert [row[0] for row in table_rows(ok(run_cli("--db", queued, "ls", "--queue", "bulk")))] == [
        "b1"
    ]
    assert ok(run_cli("--db", queued, "ls", "--queue", "nowhere")) == "no jobs\n"
    out = ok(run_cli("--db", queued, "counts", "--queue", "emails"))
    assert out.splitlines()[0] == "queue emails:"
    states = {row[0]: int(row[1]) for row in table_rows(out.split("\n", 1)[1])}
    assert states == {**dict.fromkeys(STATES, 0), "pending": 2}
    as_json = json.loads(ok(run_cli("--db", queued, "counts", "--json", "--queue", "bulk")))
    assert (as_json["pending"], as_json["pending_kinds"]) == (1, {"other": 1})
    shown = json.loads(ok(run_cli("--db", queued, "show", "e1", "--json")))
    assert (shown["queue"], shown["unique_key"]) == ("emails", None)
    assert_one_line_error(run_cli("--db", queued, "ls", "--queue", ""), 2, "--queue")


def test_worker_queues_runs_only_those_queues(user_code: Path, queued: Path) -> None:
    result = run_cli("--db", queued, "worker", "userjobs:H", "--queues", " , ", cwd=user_code)
    assert_one_line_error(result, 2, "--queues names no queue")
    process = start_worker(queued, "userjobs:H", "--queues", "emails", cwd=user_code)
    try:
        wait_until(
            lambda: all((read_job(queued, j) or {})["state"] == "done" for j in ("e1", "e2")),
            30,
            "the emails queue",
        )
    finally:
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=SUBPROCESS_TIMEOUT)
    assert process.returncode == 0, stderr
    summary = SUMMARY.match(stdout.strip().splitlines()[-1])
    assert summary is not None, stdout
    assert summary.groups() == ("2", "0", "0", "0", "drained")
    assert (read_job(queued, "d1") or {})["state"] == "pending"
    assert (read_job(queued, "b1") or {})["state"] == "pending"
