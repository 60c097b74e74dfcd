"""``register_metrics`` itself (SPEC §17), once: what it accepts, registering twice, and
taking the metrics out again. The metrics on every harness are
tests/conformance/test_metrics.py."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import jaren_jobs
from jaren_jobs.observability import register_metrics
from jaren_jobs.observability.metrics import unregister_metrics
from jaren_jobs.observe import hooks


def test_register_metrics_takes_a_store(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="takes a jaren_jobs Store or AsyncStore, got str"):
        register_metrics(str(tmp_path / "q.db"), registry=CollectorRegistry())


def test_one_store_per_registry_and_registering_it_again_does_nothing(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    before = hooks.observers
    with (
        jaren_jobs.open_store(tmp_path / "a.db") as first,
        jaren_jobs.open_store(tmp_path / "b.db") as second,
    ):
        try:
            register_metrics(first, registry=registry)
            observers = hooks.observers
            register_metrics(first, registry=registry)
            assert hooks.observers == observers
            with pytest.raises(ValueError, match="already holds the gauges of another store"):
                register_metrics(second, registry=registry)
            assert b"jaren_jobs_jobs" in generate_latest(registry)
        finally:
            unregister_metrics(registry)
    assert hooks.observers == before
    assert b"jaren_jobs" not in generate_latest(registry)


def test_the_default_registry_and_an_async_store(tmp_path: Path) -> None:
    async def scenario() -> bytes:
        async with jaren_jobs.open_async_store(tmp_path / "q.db") as store:
            await store.jobs.enqueue("k", id="j")
            register_metrics(store)
            try:
                # the scrape reads the store from the scraping thread, off the loop
                return await asyncio.to_thread(generate_latest, REGISTRY)
            finally:
                unregister_metrics()

    text = asyncio.run(scenario())
    assert b'jaren_jobs_jobs{queue="default",state="pending"} 1.0' in text
    assert b"jaren_jobs" not in generate_latest(REGISTRY)


def _attempts(registry: CollectorRegistry) -> dict[tuple[str, ...], float]:
    found: dict[tuple[str, ...], float] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if sample.name in ("jaren_jobs_attempts_total", "jaren_jobs_attempts_in_flight") or (
                sample.name == "jaren_jobs_attempt_duration_seconds_count"
            ):
                found[(sample.name, *sorted(sample.labels.values()))] = sample.value
    return found


def test_counts_stay_exact_across_threads_that_come_and_go(tmp_path: Path) -> None:
    # each feeding thread keeps its own counts, summed at scrape time; a thread
    # that ended (a stopped worker's) must keep counting, folded into the rest
    registry = CollectorRegistry()
    with jaren_jobs.open_store(tmp_path / "q.db") as store:
        register_metrics(store, registry=registry)
        try:
            expected = 0
            for round_ in range(3):
                for index in range(40):
                    store.jobs.enqueue("k", id=f"{round_}-{index}")
                expected += 40
                done = threading.Semaphore(0)
                worker = store.jobs.create_worker(
                    {"k": lambda p, c: None},
                    concurrency=4,
                    poll_seconds=0.01,
                    on_outcome=lambda outcome, done=done: done.release(),
                )
                worker.start()
                for _ in range(40):
                    assert done.acquire(timeout=60)
                worker.stop()
                assert _attempts(registry) == {
                    ("jaren_jobs_attempts_total", "completed", "default", "k"): expected,
                    ("jaren_jobs_attempt_duration_seconds_count", "default", "k"): expected,
                    ("jaren_jobs_attempts_in_flight", "default"): 0.0,
                }
        finally:
            unregister_metrics(registry)
