"""Shared fixtures: a fake clock, deterministic runtimes, stores on temporary files."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import jaren_jobs
from jaren_jobs import Runtime, Store, open_store

START = 1_800_000_000.0  # 2027-01-15, a fixed epoch for every fake clock


class FakeClock:
    """A manual clock: ``now()`` returns what the test set; thread-safe."""

    def __init__(self, start: float = START) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        with self._lock:
            self._now += seconds
            return self._now

    def set(self, value: float) -> None:
        with self._lock:
            self._now = value


class Sequence:
    """Deterministic uuid() and random() sources."""

    def __init__(self, prefix: str = "id", draw: float = 0.5) -> None:
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self.prefix = prefix
        self.draw = draw

    def uuid(self) -> str:
        with self._lock:
            return f"{self.prefix}-{next(self._counter):06d}"

    def random(self) -> float:
        return self.draw


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ids() -> Sequence:
    return Sequence()


@pytest.fixture
def runtime(clock: FakeClock, ids: Sequence) -> Runtime:
    return Runtime(now=clock.now, random=ids.random, uuid=ids.uuid)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "jobs.db"


@pytest.fixture
def store(db_path: Path, runtime: Runtime) -> Iterator[Store]:
    s = open_store(db_path, runtime=runtime)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def real_store(db_path: Path) -> Iterator[Store]:
    """A store on the platform clock, for tests about real threads and time."""
    s = open_store(db_path)
    try:
        yield s
    finally:
        s.close()


__all__ = ["START", "FakeClock", "Sequence", "jaren_jobs"]
