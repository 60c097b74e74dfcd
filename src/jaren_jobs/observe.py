"""The observation seam (SPEC §17): where metrics and traces attach, at no cost when off.

The engine and the workers call in at a few places — an enqueue, an
attempt's start and its one outcome, a settlement batch — each behind a
check of :data:`observers`, a process-wide tuple that is empty unless
``jaren_jobs.observability`` installed an observer. Nothing here imports
OpenTelemetry or ``prometheus_client``; the adapters in
:mod:`jaren_jobs.observability` subclass :class:`Observer`.

An observer that raises never affects the queue: every call into one is
guarded, and its error is logged once per observer and hook.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Observer", "Sending", "add", "attempt_ended", "attempt_started", "remove", "sending"]

_log = logging.getLogger("jaren_jobs.observe")

#: the installed observers; the call sites test it first (``if observe.observers:``)
observers: tuple[Observer, ...] = ()
_lock = threading.Lock()
_complained: set[tuple[int, str]] = set()


class Observer:
    """What an adapter may override; every hook is a no-op here.

    ``enqueueing`` may answer a :class:`Sending` for one enqueue call
    (``items`` are the checked new jobs, ``core.commands.PreparedJob``);
    ``attempt_started`` answers any state the adapter keeps for the attempt,
    handed back to ``attempt_ended`` with the :class:`~jaren_jobs.Outcome`
    and the exception the handler raised (``None`` if none).
    """

    def enqueueing(self, items: Sequence[Any]) -> Sending | None:
        return None

    def attempt_started(self, job: Any, now_ms: int) -> Any:
        return None

    def attempt_ended(self, state: Any, job: Any, outcome: Any, error: BaseException | None) -> None:
        return None

    def settlement_batch(self, size: int) -> None:
        return None


class Sending:
    """One enqueue call as an observer sees it: it may stamp the items (their
    ``trace_context``), and hears of the jobs written."""

    def stamp(self, items: Sequence[Any]) -> Sequence[Any]:
        return items

    def sent(self, jobs: Sequence[Any], after_commit: Callable[[Callable[[], None]], None]) -> None:
        """The insert returned ``jobs``; ``after_commit`` runs a callback once (and only
        if) the enqueuing transaction commits."""
        return None


def add(observer: Observer) -> None:
    """Install ``observer`` for the whole process (a second add of it does nothing)."""
    global observers
    with _lock:
        if observer not in observers:
            observers = (*observers, observer)


def remove(observer: Observer) -> None:
    """Uninstall ``observer`` (not installed: nothing happens)."""
    global observers
    with _lock:
        observers = tuple(o for o in observers if o is not observer)


def _failed(observer: Observer, hook: str, exc: Exception) -> None:
    key = (id(observer), hook)
    if key not in _complained:
        _complained.add(key)
        _log.warning("jaren_jobs: observer %r raised in %s: %r", observer, hook, exc)


class _Sendings(Sending):
    def __init__(self, parts: list[Sending]) -> None:
        self._parts = parts

    def stamp(self, items: Sequence[Any]) -> Sequence[Any]:
        for part in self._parts:
            try:
                items = part.stamp(items)
            except Exception as exc:
                _failed(part, "stamp", exc)  # type: ignore[arg-type]
        return items

    def sent(self, jobs: Sequence[Any], after_commit: Callable[[Callable[[], None]], None]) -> None:
        for part in self._parts:
            try:
                part.sent(jobs, after_commit)
            except Exception as exc:
                _failed(part, "sent", exc)  # type: ignore[arg-type]


def sending(items: Sequence[Any]) -> tuple[Sequence[Any], Sending]:
    """An enqueue call begins: the items to insert (stamped) and what hears the answer."""
    parts: list[Sending] = []
    for observer in observers:
        try:
            part = observer.enqueueing(items)
        except Exception as exc:
            _failed(observer, "enqueueing", exc)
            continue
        if part is not None:
            parts.append(part)
    sends = _Sendings(parts)
    return sends.stamp(items), sends


def attempt_started(job: Any, now_ms: int) -> tuple[tuple[Observer, Any], ...]:
    """An attempt of ``job`` (a ClaimedJob) starts at ``now_ms``: each observer's state."""
    states: list[tuple[Observer, Any]] = []
    for observer in observers:
        try:
            states.append((observer, observer.attempt_started(job, now_ms)))
        except Exception as exc:
            _failed(observer, "attempt_started", exc)
    return tuple(states)


def attempt_ended(
    states: tuple[tuple[Observer, Any], ...],
    job: Any,
    outcome: Any,
    error: BaseException | None,
) -> None:
    """The attempt's one outcome (an ``Outcome``), with the exception its handler raised."""
    for observer, state in states:
        try:
            observer.attempt_ended(state, job, outcome, error)
        except Exception as exc:
            _failed(observer, "attempt_ended", exc)


def settlement_batch(size: int) -> None:
    """A worker's settling thread committed ``size`` settlements in one transaction."""
    for observer in observers:
        try:
            observer.settlement_batch(size)
        except Exception as exc:
            _failed(observer, "settlement_batch", exc)
