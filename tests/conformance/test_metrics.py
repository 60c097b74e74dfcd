"""Prometheus metrics (SPEC §17) on every harness: SQLite and PostgreSQL, sync and async.

Scraped over real HTTP (``serve_metrics``) and parsed with prometheus_client's own
parser; the counts must be exactly what the worker did and what the store holds.
The CLI's ``--metrics-port`` is tests/observability/test_metrics_http.py.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from jaren_jobs import JobContext, Snooze, Store
from jaren_jobs.observability.metrics import register_metrics, serve_metrics, unregister_metrics
from tests.async_bridge import BridgeStore
from tests.conformance.test_worker import Outcomes
from tests.conftest import FakeClock

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class Scraper:
    """A registry with the store's metrics, served on a free port of 127.0.0.1."""

    def __init__(self, store: Store, cache_seconds: float = 0.0) -> None:
        self.registry = CollectorRegistry()
        # an async harness's store is the asyncio API's: register that, as its user would
        target = store.astore if isinstance(store, BridgeStore) else store
        register_metrics(target, registry=self.registry, cache_seconds=cache_seconds)
        self.server = serve_metrics(self.registry, port=0)

    def scrape(self) -> Samples:
        with urllib.request.urlopen(self.server.url, timeout=10) as answer:
            assert answer.status == 200
            text = answer.read().decode()
        samples: Samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    def close(self) -> None:
        self.server.close()
        unregister_metrics(self.registry)


@pytest.fixture
def scraper(store: Store) -> Iterator[Scraper]:
    made = Scraper(store)
    try:
        yield made
    finally:
        made.close()


def named(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (n, labels), value in samples.items() if n == name}


def labels(**values: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(values.items()))


def test_the_attempt_metrics_count_exactly_what_the_worker_did(
    store: Store, scraper: Scraper
) -> None:
    def bad(payload: Any, ctx: JobContext) -> Any:
        raise ValueError("bad input")

    def snoozes(payload: Any, ctx: JobContext) -> Any:
        raise Snooze(3600)

    for index in range(3):
        store.jobs.enqueue("ok", id=f"ok{index}")
    for index in range(2):
        store.jobs.enqueue("bad", id=f"bad{index}", max_attempts=1)
    store.jobs.enqueue("later", id="s", queue="mail")
    outcomes = Outcomes()
    worker = store.jobs.create_worker(
        {"ok": lambda p, c: "fine", "bad": bad, "later": snoozes}, on_outcome=outcomes
    )
    try:
        while worker.run_once():
            pass
    finally:
        worker.stop()
    assert sorted(outcomes.names()) == ["completed"] * 3 + ["failed"] * 2 + ["snoozed"]

    samples = scraper.scrape()
    assert named(samples, "jaren_jobs_attempts_total") == {
        labels(queue="default", kind="ok", outcome="completed"): 3.0,
        labels(queue="default", kind="bad", outcome="failed"): 2.0,
        labels(queue="mail", kind="later", outcome="snoozed"): 1.0,
    }
    assert named(samples, "jaren_jobs_attempt_duration_seconds_count") == {
        labels(queue="default", kind="ok"): 3.0,
        labels(queue="default", kind="bad"): 2.0,
        labels(queue="mail", kind="later"): 1.0,
    }
    assert named(samples, "jaren_jobs_start_delay_seconds_count") == {
        labels(queue="default"): 5.0,
        labels(queue="mail"): 1.0,
    }
    # the fake clock stood still: every job started the instant it was due
    assert named(samples, "jaren_jobs_start_delay_seconds_sum") == {
        labels(queue="default"): 0.0,
        labels(queue="mail"): 0.0,
    }
    assert named(samples, "jaren_jobs_attempts_in_flight") == {
        labels(queue="default"): 0.0,
        labels(queue="mail"): 0.0,
    }
    # every attempt's settlement was written in some batch, each once
    assert samples[("jaren_jobs_settlement_batch_size_sum", ())] == 6.0
    assert 1.0 <= samples[("jaren_jobs_settlement_batch_size_count", ())] <= 6.0
    jobs = named(samples, "jaren_jobs_jobs")
    assert jobs[labels(queue="default", state="done")] == 3.0
    assert jobs[labels(queue="default", state="dead")] == 2.0
    assert jobs[labels(queue="mail", state="pending")] == 1.0
    assert sum(jobs.values()) == 6.0


def test_the_gauges_read_the_store_at_scrape_time(
    store: Store, clock: FakeClock, scraper: Scraper
) -> None:
    store.jobs.enqueue("k", id="a1")
    store.jobs.enqueue("k", id="a2")
    store.jobs.enqueue("k", id="d1", delay_seconds=100)
    store.jobs.enqueue("k", id="m1", queue="mail")
    clock.advance(10)
    expiring = store.jobs.claim(["k"], owner="w", lease_seconds=5, queues=["default"])
    finished = store.jobs.claim(["k"], owner="w", lease_seconds=60, queues=["default"])
    assert expiring is not None
    assert finished is not None
    assert store.jobs.complete(finished.lease, "done") is True
    clock.advance(20)  # the first lease ran out; m1 has waited 30 s

    samples = scraper.scrape()
    jobs = named(samples, "jaren_jobs_jobs")
    expected = {
        ("default", "pending"): 1.0,  # d1, due later
        ("default", "leased"): 1.0,
        ("default", "done"): 1.0,
        ("mail", "pending"): 1.0,
    }
    for queue in ("default", "mail"):
        for state in ("pending", "leased", "done", "failed", "dead", "cancelled"):
            assert jobs[labels(queue=queue, state=state)] == expected.get((queue, state), 0.0)
    assert len(jobs) == 12
    assert named(samples, "jaren_jobs_oldest_ready_age_seconds") == {
        labels(queue="default"): 0.0,  # nothing ready: d1 is due later
        labels(queue="mail"): 30.0,
    }
    assert named(samples, "jaren_jobs_expired_leases") == {
        labels(queue="default"): 1.0,
        labels(queue="mail"): 0.0,
    }
    clock.advance(timedelta(minutes=2).total_seconds())  # d1 is ready now, since 100 s
    ages = named(scraper.scrape(), "jaren_jobs_oldest_ready_age_seconds")
    assert ages == {labels(queue="default"): 50.0, labels(queue="mail"): 150.0}


def test_a_scrape_within_the_cache_reads_nothing_new(store: Store) -> None:
    cached = Scraper(store, cache_seconds=3600)
    try:
        store.jobs.enqueue("k", id="one")
        first = named(cached.scrape(), "jaren_jobs_jobs")
        store.jobs.enqueue("k", id="two")
        assert named(cached.scrape(), "jaren_jobs_jobs") == first
        assert first[labels(queue="default", state="pending")] == 1.0
    finally:
        cached.close()


def test_no_lease_token_in_any_metric(store: Store, scraper: Scraper) -> None:
    tokens: list[str] = []

    def keeps(payload: Any, ctx: JobContext) -> Any:
        tokens.append(ctx.lease.token)
        return None

    store.jobs.enqueue("k", id="j")
    worker = store.jobs.create_worker({"k": keeps})
    try:
        assert worker.run_once() is True
    finally:
        worker.stop()
    with urllib.request.urlopen(scraper.server.url, timeout=10) as answer:
        text = answer.read().decode()
    (token,) = tokens
    assert "jaren_jobs_attempts_total" in text
    assert token not in text
