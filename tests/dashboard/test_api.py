"""The JSON API of SPEC §15 and its refusals, over real HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from jaren_jobs import Store
from jaren_jobs.dashboard import create_app
from tests.conftest import FakeClock

from .support import XSS, fill, serving


def _csrf(client: httpx.Client) -> str:
    """The session's token, as the browser reads it off a page (the client keeps the cookie)."""
    page = client.get("/jobs")
    found = re.search(r'<meta name="csrf-token" content="([0-9a-f]+)">', page.text)
    assert found, "an actions-enabled page carries the session's CSRF token"
    return found.group(1)


def test_counts_and_pages_match_the_store(db: Store) -> None:
    filled = fill(db)
    with serving(create_app(db)) as base, httpx.Client(base_url=base) as client:
        counts = client.get("/api/counts")
        assert counts.status_code == 200
        assert counts.json() == db.jobs.counts().to_dict()
        assert counts.json()["pending"] == 4
        assert counts.json()["dead"] == 1
        # every job, three at a time, by keyset
        seen: list[str] = []
        after: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 3}
            if after is not None:
                params["after"] = after
            answer = client.get("/api/jobs", params=params).json()
            assert set(answer) == {"items", "continuation", "has_more"}
            seen += [item["id"] for item in answer["items"]]
            if not answer["has_more"]:
                break
            after = answer["continuation"]
        assert seen == sorted(job.id for job in db.jobs.page())
        assert len(seen) == 10
        # filters
        failed = client.get("/api/jobs", params={"state": "failed"}).json()
        assert [item["id"] for item in failed["items"]] == [filled.failed]
        reports = client.get("/api/jobs", params={"queue": "reports", "state": "done"}).json()
        assert sorted(item["id"] for item in reports["items"]) == sorted(filled.done)
        emails = client.get("/api/jobs", params={"kind": "email"}).json()
        assert {item["kind"] for item in emails["items"]} == {"email"}
        assert len(emails["items"]) == 5
        newest = client.get("/api/jobs", params={"order": "newest", "limit": 1}).json()
        assert newest["has_more"] is True
        # one job, with its error history and traceback
        dead = client.get(f"/api/jobs/{filled.dead}").json()
        assert dead["state"] == "dead"
        assert len(dead["errors"]) == 1
        assert "this one is hopeless" in dead["errors"][0]["error"]
        assert "RuntimeError" in (dead["errors"][0]["traceback"] or "")
        leased = client.get(f"/api/jobs/{filled.leased}")
        assert leased.json()["lease_owner"] == "worker-b"


def test_the_lease_token_appears_in_no_answer(db: Store) -> None:
    db.jobs.enqueue("work", {"n": 1}, id="held")
    claimed = db.jobs.claim(["work"], owner="w")
    assert claimed is not None
    token = claimed.lease.token
    with serving(create_app(db, read_only=False)) as base, httpx.Client(base_url=base) as client:
        for path in (
            "/",
            "/jobs",
            "/job?id=held",
            "/api/jobs",
            "/api/jobs/held",
            "/api/overview",
            "/api/jobs?state=leased",
        ):
            answer = client.get(path)
            assert answer.status_code == 200, path
            assert token not in answer.text, path


def test_unknown_job_is_404_and_bad_filters_are_400(db: Store) -> None:
    fill(db)
    with serving(create_app(db)) as base, httpx.Client(base_url=base) as client:
        missing = client.get("/api/jobs/no-such-job")
        assert missing.status_code == 404
        assert "no job" in missing.json()["error"]
        page = client.get("/job", params={"id": "no-such-job"})
        assert page.status_code == 404
        assert "no job" in page.text
        for params, words in (
            ({"state": "sleeping"}, "state must be one of"),
            ({"limit": "0"}, "limit must be from 1"),
            ({"limit": "-5"}, "limit must be a whole number"),
            ({"limit": "99999999999999999999"}, "limit must be a whole number"),
            ({"limit": "501"}, "limit must be from 1"),
            ({"limit": "ten"}, "limit must be a whole number"),
            ({"order": "oldest"}, "order must be"),
            ({"state": ["done", "dead"]}, "give state once"),
        ):
            answer = client.get("/api/jobs", params=params)
            assert answer.status_code == 400, params
            assert words in answer.json()["error"], (params, answer.json())
        assert client.get("/nowhere").status_code == 404
        assert client.put("/api/counts").status_code == 405


HOSTILE = [
    "'; DROP TABLE _jaren_jobs; --",
    '"quoted"',
    XSS,
    "nul\x00byte",
    "x" * 10_000,
    "%00",
    "../../etc/passwd",
    "\u202eright-to-left",
    "emoji 🙂",
]


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_input_is_a_400_or_an_escaped_answer(db: Store, value: str) -> None:
    fill(db)
    with serving(create_app(db, read_only=False)) as base, httpx.Client(base_url=base) as client:
        answers = [
            client.get("/api/jobs/" + quote(value, safe="")),
            client.get("/job", params={"id": value}),
            client.get("/jobs", params={"kind": value}),
            client.get("/jobs", params={"queue": value, "state": "pending"}),
            client.get("/api/jobs", params={"after": value}),
            client.get("/api/jobs", params={"kind": value, "order": "newest"}),
            client.get("/api/jobs", params={"state": value}),
            client.get("/api/jobs", params={"limit": value}),
            client.post(
                "/api/jobs/" + quote(value, safe="") + "/requeue",
                headers={"X-CSRF-Token": _csrf(client)},
            ),
        ]
        for answer in answers:
            assert answer.status_code in (200, 400, 404), (answer.request.url, answer.status_code)
            assert "Traceback" not in answer.text
            assert "<script>window" not in answer.text  # escaped wherever it is echoed
            assert answer.headers["X-Frame-Options"] == "DENY"
            if answer.status_code != 200:
                body = answer.json() if "json" in answer.headers["content-type"] else None
                if body is not None:
                    assert body["error"], "a refusal says why"
                else:
                    assert 'data-testid="error"' in answer.text


def test_refusals_of_actions(db: Store) -> None:
    filled = fill(db)
    with serving(create_app(db)) as base, httpx.Client(base_url=base) as client:
        # read-only: refused even with a well-formed request
        client.get("/")
        answer = client.post(f"/api/jobs/{filled.dead}/requeue", headers={"X-CSRF-Token": "x"})
        assert answer.status_code == 403
        assert "read-only" in answer.json()["error"]
        assert db.jobs.get(filled.dead).state == "dead"
    with serving(create_app(db, read_only=False)) as base, httpx.Client(base_url=base) as client:
        token = _csrf(client)
        # no token; a wrong one; the right one from another origin or site
        for headers in (
            {},
            {"X-CSRF-Token": "0" * 64},
            {"X-CSRF-Token": token, "Origin": "http://evil.example"},
            {"X-CSRF-Token": token, "Sec-Fetch-Site": "cross-site"},
            {"X-CSRF-Token": token, "Origin": "null"},
        ):
            answer = client.post(f"/api/jobs/{filled.dead}/requeue", headers=headers)
            assert answer.status_code == 403, headers
            assert answer.json()["error"]
        # a token without the session cookie it belongs to
        with httpx.Client(base_url=base) as stranger:
            answer = stranger.post(
                f"/api/jobs/{filled.dead}/requeue", headers={"X-CSRF-Token": token}
            )
            assert answer.status_code == 403
        assert db.jobs.get(filled.dead).state == "dead"
        # accepted: same origin, token and cookie
        answer = client.post(
            f"/api/jobs/{filled.dead}/requeue",
            headers={"X-CSRF-Token": token, "Origin": base, "Sec-Fetch-Site": "same-origin"},
            json={"reset_attempts": True},
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["state"] == "pending"
        after = db.jobs.get(filled.dead)
        assert after.state == "pending"
        assert after.attempts == 0
        # forced cancel of a running job: requested, answered 200
        answer = client.post(f"/api/jobs/{filled.leased}/cancel", headers={"X-CSRF-Token": token})
        assert answer.status_code == 200, answer.text
        assert db.jobs.get(filled.leased).cancel_requested
        # a done job cannot be cancelled or requeued: 409 with the store's reason
        answer = client.post(f"/api/jobs/{filled.done[0]}/requeue", headers={"X-CSRF-Token": token})
        assert answer.status_code == 409
        assert answer.json()["error"]
        answer = client.post("/api/jobs/nope/cancel", headers={"X-CSRF-Token": token})
        assert answer.status_code == 404


def test_security_headers_on_every_answer(db: Store) -> None:
    with serving(create_app(db)) as base, httpx.Client(base_url=base) as client:
        for path in ("/", "/jobs", "/api/counts", "/static/dashboard.css", "/missing"):
            answer = client.get(path)
            policy = answer.headers["Content-Security-Policy"]
            assert "script-src 'self'" in policy
            assert "frame-ancestors 'none'" in policy
            assert answer.headers["X-Frame-Options"] == "DENY"
            assert answer.headers["X-Content-Type-Options"] == "nosniff"


def test_bulk_by_filter_counts_then_confirms(db: Store) -> None:
    fill(db)
    for index in range(4):
        db.jobs.enqueue("bulky", {"i": index}, id=f"b-{index}")
    with (
        serving(create_app(db, read_only=False, bulk_cap=3)) as base,
        httpx.Client(base_url=base) as client,
    ):
        token = _csrf(client)
        preview = client.post(
            "/actions/bulk",
            data={"csrf_token": token, "mode": "filter", "kind": "bulky", "action": "cancel"},
        )
        assert preview.status_code == 200
        assert "Cancel <b>3</b> jobs" in preview.text
        assert "only the first 3" in preview.text
        assert db.jobs.counts().cancelled == 1  # nothing happened before the confirmation
        done = client.post(
            "/actions/bulk",
            data={
                "csrf_token": token,
                "mode": "filter",
                "kind": "bulky",
                "action": "cancel",
                "confirm": "yes",
            },
        )
        assert done.status_code == 200
        assert "cancel: 3 of 3 done" in done.text
        assert db.jobs.counts().cancelled == 4
        # by selected ids
        done = client.post(
            "/actions/bulk",
            data={
                "csrf_token": token,
                "mode": "ids",
                "ids": ["b-0", "b-1"],
                "action": "requeue",
                "confirm": "yes",
            },
        )
        assert "requeue: 2 of 2 done" in done.text
        assert db.jobs.get("b-0").state == "pending"


def test_overview_throughput_oldest_ready_and_leases(db: Store, clock: FakeClock) -> None:
    fill(db)
    with serving(create_app(db)) as base, httpx.Client(base_url=base) as client:
        first = client.get("/api/overview").json()
        assert first["counts"]["pending"] == 4
        # read from the stored jobs: fill() settled two done and one dead just now
        assert first["throughput"]["done"] == [0] * 11 + [2]
        assert first["throughput"]["failed"] == [0] * 11 + [1]
        assert first["throughput"]["truncated"] is False
        assert first["oldest_ready"]["age_seconds"] == 0
        assert first["queue_names"] == ["default", "reports"]
        queues = client.get("/api/queues").json()
        assert [(row["queue"], row["pending"], row["done"]) for row in queues["queues"]] == [
            ("default", 4, 0),
            ("reports", 0, 2),
        ]
        assert client.get("/api/overview").json()["queues"] == queues["queues"]  # kept
        (owner,) = first["leases"]["owners"]
        assert owner["owner"] == "worker-b"
        assert owner["leases"] == 1
        assert owner["expired"] == 0
        assert owner["soonest"] == "2027-01-15T08:00:30.000Z"
        clock.advance(400)
        for kind in ("late-a", "late-b", "late-c"):
            db.jobs.enqueue(kind, None, id=kind)
            claimed = db.jobs.claim([kind], owner="w")
            assert claimed is not None
            if kind == "late-c":
                db.jobs.fail(claimed.lease, "no", retry=False)
            else:
                db.jobs.complete(claimed.lease)
        second = client.get("/api/overview").json()
        # 400 s later: the first ones a bucket back (five-minute buckets), the new ones last
        assert second["throughput"]["done"] == [0] * 10 + [2, 2]
        assert second["throughput"]["failed"] == [0] * 10 + [1, 1]
        assert second["oldest_ready"]["age_seconds"] == 400
        assert second["oldest_ready"]["run_at"] == "2027-01-15T08:00:00.000Z"
        assert second["leases"]["owners"][0]["expired"] == 1  # its 30 s lease ran out
        clock.advance(2 * 3600)
        third = client.get("/api/overview").json()
        assert third["throughput"]["done"] == [0] * 12  # older than the hour
        assert third["throughput"]["failed"] == [0] * 12


def test_run_now_single_json_and_bulk_and_the_job_page_flash(db: Store, clock: FakeClock) -> None:
    filled = fill(db)
    failed = db.jobs.get(filled.failed)
    assert failed is not None
    assert failed.run_at.timestamp() > clock.now()  # waiting out its backoff
    for index in range(3):
        db.jobs.enqueue("later", {"i": index}, id=f"l-{index}", delay_seconds=3600)
    with serving(create_app(db, read_only=False)) as base, httpx.Client(base_url=base) as client:
        token = _csrf(client)
        # the job page offers it only for a queued job whose run_at is ahead
        assert 'data-testid="action-run_now"' in client.get("/job", params={"id": "l-0"}).text
        assert (
            'data-testid="action-run_now"' in client.get("/job", params={"id": filled.failed}).text
        )
        for due in (filled.pending[0], filled.dead):
            assert 'data-testid="action-run_now"' not in client.get("/job", params={"id": due}).text
        answer = client.post(
            "/actions/job", data={"csrf_token": token, "id": filled.failed, "action": "run_now"}
        )
        assert answer.status_code == 303
        job = db.jobs.get(filled.failed)
        assert job is not None
        # still a retry, due now: the attempt count and the error are kept
        assert (job.state, job.attempts, job.run_at.timestamp()) == ("failed", 1, clock.now())
        shown = client.get(answer.headers["location"])
        assert 'data-testid="flash">made due now<' in shown.text
        again = client.post(
            "/actions/job", data={"csrf_token": token, "id": filled.failed, "action": "run_now"}
        )
        assert "already+due" in again.headers["location"]
        # a settled job: 409 with the store's reason, and nothing written
        refused = client.post(
            "/actions/job", data={"csrf_token": token, "id": filled.dead, "action": "run_now"}
        )
        assert refused.status_code == 409
        assert "requeue" in refused.text
        # the JSON API: CSRF like every action, then the answer
        assert client.post("/api/jobs/l-0/run_now").status_code == 403
        assert db.jobs.get("l-0").run_at.timestamp() > clock.now()  # type: ignore[union-attr]
        api = client.post("/api/jobs/l-0/run_now", headers={"X-CSRF-Token": token})
        assert api.status_code == 200
        assert api.json() == {
            "id": "l-0",
            "action": "run_now",
            "changed": True,
            "message": "made due now",
            "state": "pending",
        }
        # in bulk, by filter: counted, confirmed, then done
        form = {"csrf_token": token, "mode": "filter", "kind": "later", "action": "run_now"}
        preview = client.post("/actions/bulk", data=form)
        assert "Run now <b>3</b> jobs" in preview.text
        assert db.jobs.get("l-1").run_at.timestamp() > clock.now()  # type: ignore[union-attr]
        done = client.post("/actions/bulk", data={**form, "confirm": "yes"})
        assert "run now: 3 of 3 done" in done.text
        assert all(
            db.jobs.get(f"l-{i}").run_at.timestamp() == clock.now()  # type: ignore[union-attr]
            for i in range(3)
        )
        # the flash shows only the dashboard's own words
        crafted = client.get("/job", params={"id": filled.dead, "done": "your account is closed"})
        assert crafted.status_code == 200
        assert "your account is closed" not in crafted.text


def test_hostile_paths_and_bodies(db: Store) -> None:
    fill(db)
    with serving(create_app(db, read_only=False)) as base, httpx.Client(base_url=base) as client:
        for path in (
            "/static/../core.py",
            "/static/%2e%2e/core.py",
            "/static/",
            "/api/",
            "/api/jobs/",
            "/job",
        ):
            answer = client.get(path)
            assert answer.status_code in (400, 404), path
            assert "Traceback" not in answer.text
        token = _csrf(client)
        huge = client.post(
            "/actions/bulk",
            content=b"a=" + b"x" * 400_000,
            headers={"X-CSRF-Token": token, "Content-Type": "application/x-www-form-urlencoded"},
        )
        assert huge.status_code == 413
        for body, kind in (
            (b"\xff\xfe", "application/x-www-form-urlencoded"),
            (b"{not json", "application/json"),
            (b"[1, 2]", "application/json"),
            (b'{"reset_attempts": {"a": 1}}', "application/json"),
        ):
            answer = client.post(
                "/api/jobs/work-dead/requeue",
                content=body,
                headers={"X-CSRF-Token": token, "Content-Type": kind},
            )
            assert answer.status_code == 400, body
            assert answer.json()["error"]
        many = client.post(
            "/actions/bulk",
            data={
                "csrf_token": token,
                "mode": "ids",
                "action": "cancel",
                "ids": ["nope", "p-0"],
                "confirm": "yes",
            },
        )
        assert many.status_code == 200
        assert "cancel: 1 of 2 done" in many.text
        assert "no job" in many.text


def test_the_chart_says_when_it_counted_only_the_most_recent(
    db: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jaren_jobs.dashboard import overview

    fill(db)  # two done jobs
    monkeypatch.setattr(overview, "SETTLED_CAP", 1)
    with serving(create_app(db)) as base, httpx.Client(base_url=base) as client:
        data = client.get("/api/overview").json()["throughput"]
        assert (data["done"][-1], data["truncated"], data["cap"]) == (1, True, 1)
        page = client.get("/").text
        assert 'data-field="chart-note"> (the most recent 1 of each counted)<' in page
