"""The dashboard in a real browser: Debian's Chromium driven by Playwright, on both databases.

Every wait is Playwright's auto-waiting ``expect``: a page condition, never a sleep.
With ``JAREN_JOBS_DASHBOARD_SCREENSHOTS=1`` the SQLite run also writes the
screenshots of ``docs/dashboard.md``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from jaren_jobs import Periodic, Store
from jaren_jobs.dashboard import create_app
from tests.conftest import FakeClock

from .support import XSS, fill, serving

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
expect.set_options(timeout=10_000)
DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "apt-get install chromium (.ci/run does)"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1000, "height": 720})
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield opened
    finally:
        context.close()
    assert errors == [], "the page's script raised"


def _screenshot(page: Page, db: Store, name: str) -> None:
    if os.environ.get("JAREN_JOBS_DASHBOARD_SCREENSHOTS") and db.backend == "sqlite":
        page.screenshot(path=str(DOCS / name))


def test_overview_counts_and_refresh(db: Store, page: Page, clock: FakeClock) -> None:
    fill(db)
    nightly = Periodic("nightly-report", "report", cron="0 3 * * *")
    with serving(create_app(db, periodic=[nightly], poll_seconds=0.5)) as base:
        page.goto(base + "/")
        for state, count in (
            ("pending", 4),
            ("leased", 1),
            ("done", 2),
            ("failed", 1),
            ("dead", 1),
            ("cancelled", 1),
        ):
            expect(page.get_by_test_id(f"count-{state}")).to_have_text(str(count))
        expect(page.get_by_test_id("queues")).to_contain_text("reports")
        expect(page.get_by_test_id("leases")).to_contain_text("worker-b")
        expect(page.get_by_test_id("periodic")).to_contain_text("nightly-report")
        expect(page.get_by_test_id("periodic")).to_contain_text("2027-01-16T03:00:00.000Z")
        expect(page.locator("rect.bar-done")).to_have_count(12)
        expect(page.get_by_test_id("oldest-ready")).to_have_text("0 s")
        # refreshed in place by the poller, without a reload
        db.jobs.enqueue("email", {"to": "late@example.com"}, id="p-late")
        expect(page.get_by_test_id("count-pending")).to_have_text("5")
        expect(page.get_by_test_id("oldest-ready")).to_have_text("0 s")
        # work done over the next minutes: the chart draws what the poller saw
        done, dead = 2, 1
        for minute, (completed, died) in enumerate(((3, 0), (5, 1), (2, 0), (4, 1)), start=1):
            clock.advance(300)
            for n in range(completed + died):
                kind = f"round-{minute}-{n}"
                db.jobs.enqueue(kind, None, id=kind)
                claimed = db.jobs.claim([kind], owner="worker-c")
                assert claimed is not None
                if n < completed:
                    db.jobs.complete(claimed.lease)
                else:
                    db.jobs.fail(claimed.lease, "gave up", retry=False)
            done, dead = done + completed, dead + died
            expect(page.get_by_test_id("count-done")).to_have_text(str(done))
            expect(page.get_by_test_id("count-dead")).to_have_text(str(dead))
        expect(page.locator('[data-bar="done-11"]')).not_to_have_attribute("height", "0")
        expect(page.get_by_test_id("oldest-ready")).to_have_text("20 min")
        _screenshot(page, db, "dashboard-overview.png")


def test_filter_and_page_through_the_list(db: Store, page: Page) -> None:
    filled = fill(db)
    with serving(create_app(db)) as base:
        page.goto(base + "/jobs")
        expect(page.get_by_test_id("jobs").locator("tbody tr")).to_have_count(10)
        page.locator("select[name=state]").select_option("pending")
        page.locator("input[name=limit]").fill("3")
        page.get_by_role("button", name="Filter").click()
        rows = page.get_by_test_id("jobs").locator("tbody tr")
        expect(rows).to_have_count(3)
        first = [rows.nth(i).locator("td").first.inner_text() for i in range(3)]
        assert first == sorted(filled.pending)[:3]
        page.get_by_test_id("next-page").click()
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text(sorted(filled.pending)[3])
        expect(page.get_by_test_id("next-page")).to_have_count(0)
        # a kind filter, typed
        page.goto(base + "/jobs")
        page.locator("input[name=kind]").fill("work-dead")
        page.get_by_role("button", name="Filter").click()
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text("dead")
        _screenshot(page, db, "dashboard-jobs.png")


def test_open_a_job_and_read_its_traceback(db: Store, page: Page) -> None:
    filled = fill(db)
    with serving(create_app(db)) as base:
        page.goto(base + "/jobs?state=dead")
        page.get_by_role("link", name=filled.dead, exact=True).click()
        expect(page).to_have_url(re.compile(r"/job\?id=work-dead$"))
        expect(page.get_by_test_id("job-state")).to_have_text("dead")
        traceback = page.get_by_test_id("traceback")
        expect(traceback).to_contain_text("Traceback (most recent call last)")
        expect(traceback).to_contain_text("RuntimeError: this one is hopeless")
        traceback.scroll_into_view_if_needed()
        _screenshot(page, db, "dashboard-job.png")


def test_requeue_a_dead_job_and_watch_its_state_change(db: Store, page: Page) -> None:
    filled = fill(db)
    with serving(create_app(db, read_only=False)) as base:
        page.goto(f"{base}/job?id={filled.dead}")
        expect(page.get_by_test_id("job-state")).to_have_text("dead")
        page.get_by_label("reset attempts").check()
        page.get_by_test_id("action-requeue").click()
        expect(page.get_by_test_id("job-state")).to_have_text("pending")
        expect(page.get_by_test_id("flash")).to_have_text("requeued with its attempts reset")
        job = db.jobs.get(filled.dead)
        assert job is not None
        assert job.state == "pending"
        assert job.attempts == 0


def test_bulk_requeue_by_filter_shows_the_count_first(db: Store, page: Page) -> None:
    fill(db)
    for index in range(3):
        claimed = None
        db.jobs.enqueue("flaky", {"i": index}, id=f"flaky-{index}")
        claimed = db.jobs.claim(["flaky"], owner="w")
        assert claimed is not None
        db.jobs.fail(claimed.lease, "gave up", retry=False)
    with serving(create_app(db, read_only=False)) as base:
        page.goto(base + "/jobs?state=dead&kind=flaky")
        page.get_by_test_id("bulk-filter-requeue").click()
        expect(page.get_by_test_id("bulk-count")).to_contain_text("Requeue 3 jobs")
        assert db.jobs.counts().dead == 4  # nothing happens before the confirmation
        page.get_by_test_id("bulk-confirm").click()
        expect(page.get_by_test_id("bulk-result")).to_contain_text("3 of 3 done")
        counts = db.jobs.counts()
        assert counts.dead == 1
        assert counts.pending == 7


def test_a_script_in_the_data_does_not_run(db: Store, page: Page) -> None:
    filled = fill(db)
    hostile = '<img src=x onerror="window.__pwned = true">'
    db.jobs.enqueue(hostile, {"x": XSS}, id=f"id-{hostile}", queue=XSS)
    with serving(create_app(db, read_only=False, queues=["default", XSS])) as base:
        page.goto(f"{base}/job?id={filled.hostile}")
        expect(page.get_by_test_id("payload")).to_contain_text(XSS)
        assert page.evaluate("window.__pwned") is None
        page.goto(base + "/jobs")
        expect(page.get_by_test_id("jobs")).to_contain_text(hostile)
        page.goto(base + "/")
        expect(page.get_by_test_id("queues")).to_contain_text(XSS)
        expect(page.get_by_test_id("kinds")).to_contain_text(hostile)
        page.get_by_test_id("kinds").get_by_role("link", name=hostile).click()
        expect(page.get_by_test_id("jobs")).to_contain_text(hostile)
        assert page.evaluate("window.__pwned") is None
        assert page.locator("img[src=x]").count() == 0


def test_read_only_mode_shows_no_actions(db: Store, page: Page) -> None:
    filled = fill(db)
    with serving(create_app(db)) as base:
        for job_id in (filled.dead, filled.failed, filled.leased):
            page.goto(f"{base}/job?id={job_id}")
            expect(page.get_by_test_id("job-state")).to_be_visible()
            expect(page.get_by_test_id("actions")).to_have_count(0)
            expect(page.locator("form[method=post]")).to_have_count(0)
        page.goto(base + "/jobs")
        expect(page.get_by_test_id("jobs")).to_be_visible()
        expect(page.locator("input[type=checkbox]")).to_have_count(0)
        expect(page.locator("form[method=post]")).to_have_count(0)
        expect(page.locator('meta[name="csrf-token"]')).to_have_count(0)
        expect(page.get_by_test_id("mode")).to_contain_text("read-only")


def test_mounted_under_a_prefix_the_page_polls_its_own_api(db: Store, page: Page) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from jaren_jobs.dashboard import create_asgi_app

    from .test_mounts import uvicorn_serving

    fill(db)
    app = Starlette(
        routes=[Mount("/ops/jobs", app=create_asgi_app(db, read_only=False, poll_seconds=0.5))]
    )
    with uvicorn_serving(app) as base:
        page.goto(base + "/ops/jobs/")
        expect(page.get_by_test_id("queues")).to_contain_text("reports")  # fetched by the page
        db.jobs.enqueue("email", None, id="p-prefixed")
        expect(page.get_by_test_id("count-pending")).to_have_text("5")
        page.get_by_role("link", name="Jobs", exact=True).click()
        expect(page).to_have_url(base + "/ops/jobs/jobs")
        page.goto(base + "/ops/jobs/job?id=work-dead")
        page.get_by_test_id("action-requeue").click()
        expect(page.get_by_test_id("job-state")).to_have_text("pending")
