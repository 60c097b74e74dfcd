"""The operator's CLI of SPEC §14 through real subprocesses, on SQLite and on PostgreSQL.

Bulk ``requeue``/``cancel`` (ids or filters, ``--dry-run``, ``--json``, exit
statuses), ``sweep --state``, ``ls --sort newest`` with lease expiry, and
``counts`` telling ready-now from scheduled-later. Each database is prepared
through the library on a clock an hour in the past, so that one lease has run
out and one retry and one delayed job are still due later when the command
line (on the real clock) reads them.
"""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import NewJob, open_store
from jaren_jobs.cli import bulk, main
from jaren_jobs.engine.engine import JobEngine
from tests.integration.test_cli import (
    assert_one_line_error,
    cli_env,
    clock_runtime,
    json_lines,
    ok,
    run_cli,
    settle,
    table_rows,
)
from tests.processes.pg_support import base_url, schema_on

HOUR = 3600.0
QUEUED = [f"m{i}" for i in range(6)]


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A prepared database: a file path, or a postgresql:// URL into a schema of its own."""
    if request.param == "sqlite":
        path = str(tmp_path / "ops.db")
        prepare(path)
        yield path
        return
    with schema_on(base_url()) as schema:
        prepare(schema.url)
        yield schema.url


def prepare(db: str) -> None:
    """m0-m5 mail (m5 due in about an hour), i0/i1 dead, i2 done, i3 failed (its retry due
    much later), p0 leased with a lease that ran out, p1 leased live, p2 cancelled; p* in
    queue "reports". Changed at t0+10, +20, ... in that order, so newest first is known."""
    t0 = time.time() - HOUR
    now = [t0]
    with open_store(db, runtime=clock_runtime(now)) as store:
        for job_id in QUEUED[:5]:
            store.jobs.enqueue("mail", {"to": job_id}, id=job_id)
        store.jobs.enqueue("mail", {"to": "m5"}, id="m5", delay_seconds=2 * HOUR)
        for n in range(4):
            store.jobs.enqueue("img", n, id=f"i{n}", max_attempts=1 if n < 2 else 3)
        for n in range(3):
            store.jobs.enqueue("rep", n, id=f"p{n}", queue="reports")
        now[0] = t0 + 10
        settle(store, "img", error="no such image")  # i0
        now[0] = t0 + 20
        settle(store, "img", error="still no such image")  # i1
        now[0] = t0 + 30
        settle(store, "img", ok_result="small")  # i2
        now[0] = t0 + 40
        retried = store.jobs.claim(["img"], owner="prep")  # i3
        assert retried is not None
        store.jobs.fail(
            retried.lease, "try later", backoff_base_seconds=10**5, backoff_cap_seconds=10**6
        )
        now[0] = t0 + 50
        ran_out = store.jobs.claim(["rep"], owner="gone", lease_seconds=60)
        assert ran_out is not None
        assert ran_out.id == "p0"
        now[0] = t0 + 60
        live = store.jobs.claim(["rep"], owner="busy", lease_seconds=3 * HOUR)
        assert live is not None
        assert live.id == "p1"
        now[0] = t0 + 70
        store.jobs.cancel("p2")


def jobs_in(db: str) -> dict[str, dict[str, Any]]:
    with open_store(db, readonly=True) as store, store.jobs.page(limit=1000) as cursor:
        return {job.id: job.to_dict() for job in cursor}


def one_json(out: str) -> dict[str, Any]:
    lines = out.splitlines()
    assert len(lines) == 1, out
    parsed: dict[str, Any] = json.loads(lines[0])
    return parsed


def results(report: dict[str, Any]) -> dict[str, str]:
    return {job["id"]: job["result"] for job in report["jobs"]}


# ------------------------------------------------------------------ counts and ls


def test_counts_tell_ready_now_from_scheduled_later(target: str) -> None:
    counts = one_json(ok(run_cli("--db", target, "counts", "--json")))
    assert (counts["pending"], counts["failed"], counts["leased"]) == (6, 1, 2)
    # the longest-waiting ready job's run_at: an instant already passed
    oldest = datetime.fromisoformat(counts["due"].pop("oldest_ready_at"))
    assert oldest <= datetime.now(timezone.utc)
    assert counts["due"] == {
        "pending_ready": 5,
        "pending_scheduled": 1,
        "failed_ready": 0,
        "failed_scheduled": 1,
        "leased_expired": 1,
    }
    rows = {row[0]: row[1:] for row in table_rows(ok(run_cli("--db", target, "counts")))}
    assert rows["pending"] == ["6", "5 ready now, 1 scheduled later"]
    assert rows["failed"] == ["1", "0 ready now, 1 scheduled later"]
    assert rows["leased"] == ["2", "1 with an expired lease"]
    reports = one_json(ok(run_cli("--db", target, "counts", "--queue", "reports", "--json")))
    assert reports["due"]["leased_expired"] == 1
    assert reports["due"]["pending_ready"] == 0


def test_ls_newest_first_shows_updated_at_and_an_expired_lease(target: str) -> None:
    newest = ["p2", "p1", "p0", "i3", "i2", "i1", "i0", *reversed(QUEUED)]
    first = json_lines(
        ok(run_cli("--db", target, "ls", "--sort", "newest", "--json", "--limit", "4"))
    )
    assert [job["id"] for job in first] == newest[:4]
    assert {job["id"]: job["lease_expired"] for job in first} == {
        "p2": False,
        "p1": False,
        "p0": True,
        "i3": False,
    }
    stamps = [job["updated_at"] for job in first]
    assert stamps == sorted(stamps, reverse=True)

    out = ok(run_cli("--db", target, "ls", "--sort", "newest", "--limit", "4"))
    rows = table_rows(out)
    assert [row[0] for row in rows] == newest[:4]
    states = {row[0]: row[2] for row in rows}
    # the lease that ran out must not read as a live one
    assert states == {"p2": "cancelled", "p1": "leased", "p0": "leased (expired)", "i3": "failed"}
    assert rows[1][6] != "-"  # p1's lease_until
    assert out.splitlines()[-1] == "more: --after i3 --sort newest"
    rest = json_lines(
        ok(run_cli("--db", target, "ls", "--sort", "newest", "--after", "i3", "--json"))
    )
    assert [job["id"] for job in rest] == newest[4:]
    shown = one_json(ok(run_cli("--db", target, "show", "p0", "--json")))
    assert (shown["state"], shown["lease_expired"]) == ("leased", True)
    fields = ok(run_cli("--db", target, "show", "p0")).splitlines()
    assert any(line.startswith("state") and line.endswith("(its lease expired)") for line in fields)
    # a position must exist in newest order; the id order takes any id
    assert_one_line_error(
        run_cli("--db", target, "ls", "--sort", "newest", "--after", "zz"), 1, "'zz'"
    )


# ------------------------------------------------------------------ requeue


def test_bulk_requeue_by_filters_dry_run_then_for_real(target: str) -> None:
    before = jobs_in(target)
    dry = run_cli(
        "--db", target, "requeue", "--state", "dead", "--state", "leased", "--dry-run", "--json"
    )
    assert dry.returncode == 1  # p1's live lease is refused
    report = one_json(dry.stdout)
    assert {k: v for k, v in report.items() if k != "jobs"} == {
        "command": "requeue",
        "dry_run": True,
        "drop_checkpoints": False,
        "reset_attempts": False,
        "changed": 3,
        "unchanged": 0,
        "refused": 1,
        "interrupted": False,
    }
    assert results(report) == {
        "i0": "changed",
        "i1": "changed",
        "p0": "changed",  # its lease ran out
        "p1": "refused",
    }
    refused = report["jobs"][-1]
    assert refused["state"] == "leased"
    assert "live lease" in refused["reason"]
    assert jobs_in(target) == before  # a dry run changes nothing

    out = ok(run_cli("--db", target, "requeue", "--state", "dead", "--reset-attempts"))
    assert out == "requeued i0\nrequeued i1\nrequeue: 2 requeued\n"
    after = jobs_in(target)
    for job_id in ("i0", "i1"):
        assert (after[job_id]["state"], after[job_id]["attempts"]) == ("pending", 0)
    assert {k: v for k, v in after.items() if k not in ("i0", "i1")} == {
        k: v for k, v in before.items() if k not in ("i0", "i1")
    }


def test_bulk_requeue_by_ids_does_the_rest_and_exits_1(target: str) -> None:
    ids = ["i2", "m0", "p1", "nope", "i3", "i0"]
    result = run_cli("--db", target, "requeue", *ids, "--json")
    assert result.returncode == 1
    assert result.stderr == ""
    report = one_json(result.stdout)
    assert results(report) == {
        "i2": "refused",  # done: not re-run
        "m0": "unchanged",  # already pending
        "p1": "refused",  # a live lease
        "nope": "refused",
        "i3": "changed",
        "i0": "changed",
    }
    assert (report["changed"], report["unchanged"], report["refused"]) == (2, 1, 3)
    assert next(job for job in report["jobs"] if job["id"] == "nope")["state"] is None
    after = jobs_in(target)
    assert after["i3"]["state"] == after["i0"]["state"] == "pending"
    assert after["i2"]["state"] == "done"

    # the human form: a line per job done, one stderr line per refusal, a summary
    human = run_cli("--db", target, "requeue", "i2", "m0", "i1", "nope")
    assert human.returncode == 1
    assert human.stdout == (
        "m0 was already pending\nrequeued i1\nrequeue: 1 requeued, 1 unchanged, 2 refused\n"
    )
    errors = human.stderr.splitlines()
    assert len(errors) == 2
    assert "JD2065" in errors[0]
    assert "'i2'" in errors[0]
    assert "'nope'" in errors[1]


# ------------------------------------------------------------------ cancel


def test_bulk_cancel_by_queue_asks_the_running_job_to_stop(target: str) -> None:
    before = jobs_in(target)
    report = one_json(
        ok(run_cli("--db", target, "cancel", "--queue", "reports", "--dry-run", "--json"))
    )
    assert results(report) == {"p0": "changed", "p1": "changed", "p2": "unchanged"}
    assert report["dry_run"] is True
    assert jobs_in(target) == before

    out = ok(run_cli("--db", target, "cancel", "--queue", "reports"))
    lines = out.splitlines()
    assert lines[0] == "cancelled p0"  # its lease had run out: no holder to ask
    assert lines[1].startswith("cancel requested for running p1: ")
    assert lines[2:] == ["p2 was already cancelled", "cancel: 2 cancelled, 1 unchanged"]
    after = jobs_in(target)
    assert after["p0"]["state"] == "cancelled"
    assert (after["p1"]["state"], after["p1"]["cancel_requested"]) == ("leased", True)

    assert ok(run_cli("--db", target, "cancel", "--kind", "mail", "--state", "pending")) == (
        "".join(f"cancelled {job_id}\n" for job_id in QUEUED) + "cancel: 6 cancelled\n"
    )
    mixed = run_cli("--db", target, "cancel", "--kind", "img", "--json")
    assert mixed.returncode == 1
    assert results(one_json(mixed.stdout)) == {
        "i0": "refused",
        "i1": "refused",
        "i2": "refused",
        "i3": "changed",
    }
    assert jobs_in(target)["i3"]["state"] == "cancelled"


# ------------------------------------------------------------------ sweep


def test_sweep_state_spares_the_rest_and_dry_run_deletes_nothing(target: str) -> None:
    before = jobs_in(target)
    dry = one_json(
        ok(
            run_cli(
                "--db",
                target,
                "sweep",
                "--older-than",
                "1m",
                "--state",
                "done",
                "--dry-run",
                "--json",
            )
        )
    )
    assert dry["swept"] == 1
    assert (dry["dry_run"], dry["states"], dry["limit"]) == (True, ["done"], None)
    assert jobs_in(target) == before
    out = ok(
        run_cli(
            "--db", target, "sweep", "--older-than", "1m", "--state", "dead", "--state", "cancelled"
        )
    )
    assert out.startswith("swept 3 cancelled/dead job(s) last changed before ")
    assert set(before) - set(jobs_in(target)) == {"i0", "i1", "p2"}
    report = one_json(ok(run_cli("--db", target, "sweep", "--older-than", "1m", "--json")))
    assert (report["swept"], report["states"]) == (1, ["cancelled", "dead", "done"])
    assert "i2" not in jobs_in(target)


# ------------------------------------------------------------------ usage and paging


def test_a_bulk_command_needs_ids_or_filters_not_both(tmp_path: Path) -> None:
    db = str(tmp_path / "ops.db")
    prepare(db)
    before = jobs_in(db)
    for command in ("requeue", "cancel"):
        assert_one_line_error(run_cli("--db", db, command), 2, "name the jobs")
        assert_one_line_error(run_cli("--db", db, command, "m0", "--kind", "mail"), 2, "not both")
        assert_one_line_error(
            run_cli("--db", db, command, "--dry-run", "--state", "asleep"), 2, "invalid choice"
        )
    assert_one_line_error(
        run_cli("--db", db, "sweep", "--older-than", "1d", "--state", "pending"),
        2,
        "invalid choice",
    )
    assert jobs_in(db) == before


def test_a_bulk_command_walks_its_matches_in_keyset_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "ops.db")
    prepare(db)
    monkeypatch.setattr(bulk, "PAGE_SIZE", 2)
    pages: list[tuple[str | None, int]] = []
    real_page = JobEngine.page

    def counted(self: JobEngine, **kwargs: Any) -> Any:
        pages.append((kwargs.get("after"), kwargs["limit"]))
        return real_page(self, **kwargs)

    monkeypatch.setattr(JobEngine, "page", counted)
    out = io.StringIO()
    assert main(["--db", db, "cancel", "--kind", "mail", "--json"], out=out) == 0
    report = json.loads(out.getvalue())
    assert [job["id"] for job in report["jobs"]] == QUEUED
    # six matches, two a page: each page continues past the last id of the one before
    assert pages == [(None, 2), ("m1", 2), ("m3", 2), ("m5", 2)]
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------------ a dry run is the real run


def _json_of(args: list[str]) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    status = main(args, out=out)
    return status, one_json(out.getvalue())


def _without_dry_flag(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k != "dry_run"}


@pytest.fixture(params=["sqlite", "postgres"])
def empty_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "dry.db")
        return
    with schema_on(base_url()) as schema:
        yield schema.url


def test_a_requeue_dry_run_predicts_the_unique_key_refusals_the_real_run_meets(
    empty_db: str,
) -> None:
    # issue 26 item 15: three cancelled jobs sharing a unique key; the real run requeues
    # the first, and the key it then holds refuses the other two (DuplicateJob)
    with open_store(empty_db) as store:
        for job_id in ("a", "b", "c"):
            store.jobs.enqueue("k", id=job_id, unique_key="report-2026")
            assert store.jobs.cancel(job_id)
        store.jobs.enqueue("k", id="d")
        assert store.jobs.cancel("d")
    before = jobs_in(empty_db)
    dry_status, dry = _json_of(
        ["--db", empty_db, "requeue", "--state", "cancelled", "--dry-run", "--json"]
    )
    assert jobs_in(empty_db) == before  # nothing written
    real_status, real = _json_of(["--db", empty_db, "requeue", "--state", "cancelled", "--json"])
    assert (dry["dry_run"], real["dry_run"]) == (True, False)
    assert _without_dry_flag(dry) == _without_dry_flag(real)
    assert dry_status == real_status == 1
    assert results(real) == {"a": "changed", "b": "refused", "c": "refused", "d": "changed"}
    assert (real["changed"], real["refused"]) == (2, 2)


def test_a_cancel_dry_run_is_the_real_run_over_every_state(empty_db: str) -> None:
    t0 = time.time() - HOUR
    now = [t0]
    with open_store(empty_db, runtime=clock_runtime(now)) as store:
        for job_id in ("waiting", "expired", "running", "done", "asked"):
            store.jobs.enqueue("k", id=job_id)
        store.jobs.enqueue("k", id="gone")
        assert store.jobs.cancel("gone")
        for job_id, lease in (("asked", 3), ("done", 3), ("expired", 0.5), ("running", 3)):
            claimed = store.jobs.claim(["k"], owner="w", lease_seconds=lease * HOUR)
            assert claimed is not None
            assert claimed.id == job_id
            if job_id == "done":
                assert store.jobs.complete(claimed.lease)
        assert store.jobs.cancel("asked", force=True)
    before = jobs_in(empty_db)
    ids = ["waiting", "expired", "running", "done", "asked", "gone", "nope"]
    dry_status, dry = _json_of(["--db", empty_db, "cancel", *ids, "--dry-run", "--json"])
    assert jobs_in(empty_db) == before
    real_status, real = _json_of(["--db", empty_db, "cancel", *ids, "--json"])
    assert _without_dry_flag(dry) == _without_dry_flag(real)
    assert dry_status == real_status
    assert results(real) == {
        "waiting": "changed",
        "expired": "changed",
        "running": "changed",  # its cancellation requested
        "done": "refused",
        "asked": "unchanged",  # already requested
        "gone": "unchanged",
        "nope": "refused",
    }


# ------------------------------------------------------------------ an interrupted bulk run


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_bulk_cancel_reports_exactly_what_it_changed(
    empty_db: str, signum: int
) -> None:
    # issue 26 item 8: interrupted, `cancel --json` printed nothing at all
    total = 4000
    with open_store(empty_db) as store:
        store.jobs.enqueue_many(NewJob("k", id=f"j{n:05d}") for n in range(total))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jaren_jobs",
            "--db",
            empty_db,
            "cancel",
            "--state",
            "pending",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    try:
        pause = threading.Event()
        end = time.monotonic() + 120
        with open_store(empty_db, readonly=True) as reader:
            while reader.jobs.counts().cancelled < 50:  # it is under way: interrupt it
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < end, "the bulk run never got going"
                pause.wait(0.02)
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[signum], stderr
    assert "interrupted" in stderr
    report = one_json(stdout)
    assert report["interrupted"] is True
    said = {job["id"] for job in report["jobs"] if job["result"] == "changed"}
    cancelled = {job_id for job_id, job in jobs_in(empty_db).items() if job["state"] == "cancelled"}
    assert said == cancelled  # exactly what changed: not one more, not one less
    assert 50 <= len(cancelled) < total
    assert report["changed"] == len(cancelled)
