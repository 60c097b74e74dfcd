"""``register_metrics`` itself (SPEC §17), once: what it accepts, registering twice, and
taking the metrics out again. The metrics on every harness are
tests/conformance/test_metrics.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

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
