"""The dashboard's ``/metrics`` (SPEC §17) over real HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jaren_jobs import Store
from jaren_jobs.dashboard import create_app
from tests.dashboard.support import serving


def test_the_dashboard_serves_the_stores_metrics(store: Store) -> None:
    store.jobs.enqueue("k", id="a")
    store.jobs.enqueue("k", id="b", queue="mail")
    with (
        serving(create_app(store)) as base,
        urllib.request.urlopen(base + "/metrics", timeout=10) as answer,
    ):
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain; version=")
        text = answer.read().decode()
    jobs = {
        (sample.labels["queue"], sample.labels["state"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "jaren_jobs_jobs"
    }
    assert jobs[("default", "pending")] == 1.0
    assert jobs[("mail", "pending")] == 1.0
    assert sum(jobs.values()) == 2.0
    # the attempt families are there, empty until a worker of this process runs
    assert "# TYPE jaren_jobs_attempts_total counter" in text
    assert "# TYPE jaren_jobs_attempt_duration_seconds histogram" in text


def test_without_prometheus_client_metrics_is_not_found(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the adapter cannot be imported, as when the extra is not installed
    monkeypatch.setitem(sys.modules, "jaren_jobs.observability.metrics", None)
    with serving(create_app(store)) as base:
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(base + "/metrics", timeout=10)
        assert info.value.code == 404
        assert b"jaren_jobs[prometheus]" in info.value.read()
