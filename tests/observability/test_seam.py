"""The observation seam itself (jaren_jobs.observe), once: what an observer may answer
and how a raising one is contained. The adapters on every harness are
tests/conformance/test_observability.py and tests/conformance/test_metrics.py."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jaren_jobs
from jaren_jobs.observe import UNOBSERVED, Observer, add, remove


class _Recorder(Observer):
    """Records what it hears; ``follow`` decides whether it follows an attempt."""

    def __init__(self, follow: bool = True) -> None:
        self.follow = follow
        self.heard: list[str] = []

    def attempt_started(self, job: Any, now_ms: int) -> Any:
        self.heard.append(f"started {job.id}")
        return job.id if self.follow else UNOBSERVED

    def entering(self, state: Any) -> Any:
        self.heard.append(f"entering {state}")
        return threading.get_ident()

    def leaving(self, state: Any, entered: Any) -> None:
        assert entered == threading.get_ident()  # the handler's thread, both times
        self.heard.append(f"leaving {state}")

    def attempt_ended(self, state: Any, job: Any, outcome: Any, error: Any) -> None:
        self.heard.append(f"ended {state} {outcome.outcome}")


class _Raising(Observer):
    def attempt_started(self, job: Any, now_ms: int) -> Any:
        raise RuntimeError("an observer's bug")


@pytest.fixture
def installed() -> Iterator[list[Observer]]:
    observers: list[Observer] = []
    try:
        yield observers
    finally:
        for observer in observers:
            remove(observer)


def _run(path: Path, job_id: str, handler: Any) -> list[str]:
    with jaren_jobs.open_store(path) as store:
        store.jobs.enqueue("k", id=job_id)
        ran: list[str] = []
        worker = store.jobs.create_worker(
            {"k": handler}, on_outcome=lambda o: ran.append(o.outcome)
        )
        try:
            while worker.run_once():
                pass
        finally:
            worker.stop()
        return ran


def test_an_observer_that_overrides_entering_wraps_the_handler(
    tmp_path: Path, installed: list[Observer]
) -> None:
    recorder = _Recorder()
    assert recorder.wraps  # overriding entering is enough
    installed.append(recorder)
    add(recorder)
    order: list[str] = []

    def handler(payload: Any, ctx: Any) -> None:
        order.extend(recorder.heard)

    assert _run(tmp_path / "q.db", "j", handler) == ["completed"]
    assert order == ["started j", "entering j"]
    assert recorder.heard == ["started j", "entering j", "leaving j", "ended j completed"]


def test_unobserved_hears_nothing_more_of_that_attempt(
    tmp_path: Path, installed: list[Observer]
) -> None:
    aside, follows = _Recorder(follow=False), _Recorder()
    installed.extend([aside, follows])
    add(aside)
    add(follows)
    assert _run(tmp_path / "q.db", "j", lambda p, c: None) == ["completed"]
    assert aside.heard == ["started j"]
    assert follows.heard == ["started j", "entering j", "leaving j", "ended j completed"]


def test_a_raising_observer_never_affects_the_attempt(
    tmp_path: Path, installed: list[Observer], caplog: pytest.LogCaptureFixture
) -> None:
    raising, follows = _Raising(), _Recorder()
    installed.extend([raising, follows])
    add(raising)
    add(follows)
    with caplog.at_level(logging.WARNING, logger="jaren_jobs.observe"):
        assert _run(tmp_path / "a.db", "a", lambda p, c: None) == ["completed"]
        assert _run(tmp_path / "b.db", "b", lambda p, c: None) == ["completed"]
    assert follows.heard[-1] == "ended b completed"
    warnings = [r for r in caplog.records if "an observer's bug" in r.getMessage()]
    assert len(warnings) == 1  # once per observer and hook
