"""The observation seam (SPEC §17): where metrics and traces attach, at no cost when off.

The engine and the workers call in at a few places — an enqueue, an
attempt's start and its one outcome, a settlement batch — each behind a
check of ``hooks.observers``, a process-wide tuple that is empty unless
``jaren_jobs.observability`` installed an observer (an attribute of one
object, so ``from jaren_jobs.observe import hooks`` sees every change). Nothing here imports
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

__all__ = ["UNOBSERVED", "Hooks", "Observer", "Sending", "add", "hooks", "remove"]

_log = logging.getLogger("jaren_jobs.observe")

_lock = threading.Lock()
_complained: set[tuple[int, str]] = set()


#: what ``Observer.attempt_started`` answers to hear nothing more of that attempt
UNOBSERVED: Any = object()


class Observer:
    """What an adapter may override; every hook is a no-op here.

    ``enqueueing`` may answer a :class:`Sending` for one enqueue call
    (``items`` are the checked new jobs, ``core.commands.PreparedJob``);
    ``attempt_started`` answers any state the adapter keeps for the attempt,
    handed back to ``attempt_ended`` with the :class:`~jaren_jobs.Outcome`
    and the exception the handler raised (``None`` if none) — or
    :data:`UNOBSERVED`, and the observer hears nothing more of the attempt
    (a tracer with nothing to record). ``entering``/``leaving`` wrap the
    handler only when ``wraps`` is true.
    """

    #: whether ``entering``/``leaving`` wrap the handler (else the call skips them);
    #: a subclass that overrides ``entering`` wraps unless it says otherwise
    wraps = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "wraps" not in vars(cls):
            cls.wraps = cls.entering is not Observer.entering

    def enqueueing(self, items: Sequence[Any]) -> Sending | None:
        return None

    def attempt_started(self, job: Any, now_ms: int) -> Any:
        return None

    def attempt_ended(
        self, state: Any, job: Any, outcome: Any, error: BaseException | None
    ) -> None:
        return None

    def settlement_batch(self, size: int) -> None:
        return None

    def checkpoint_saved(self, state: Any, job: Any, node_id: str) -> None:
        return None

    def entering(self, state: Any) -> Any:
        """A plain handler of the attempt starts (in this thread): what ``leaving`` needs."""
        return None

    def leaving(self, state: Any, entered: Any) -> None:
        return None


class Sending:
    """One enqueue call as an observer sees it: it may stamp the items (their
    ``trace_context``), and hears of the jobs written."""

    def stamp(self, items: Sequence[Any]) -> Sequence[Any]:
        return items

    def sent(self, jobs: Sequence[Any], after_commit: Callable[[Callable[[], None]], None]) -> None:
        """The insert returned ``jobs``; ``after_commit`` runs a callback once (and only
        if) the enqueuing transaction commits."""


def add(observer: Observer) -> None:
    """Install ``observer`` for the whole process (a second add of it does nothing)."""
    with _lock:
        if observer not in hooks.observers:
            hooks.observers = (*hooks.observers, observer)
            hooks.settling = _settling(hooks.observers)


def remove(observer: Observer) -> None:
    """Uninstall ``observer`` (not installed: nothing happens)."""
    with _lock:
        hooks.observers = tuple(o for o in hooks.observers if o is not observer)
        hooks.settling = _settling(hooks.observers)


def _settling(observers: tuple[Observer, ...]) -> tuple[Observer, ...]:
    # only the observers that hear of settlement batches are called per batch
    return tuple(o for o in observers if type(o).settlement_batch is not Observer.settlement_batch)


def _failed(observer: object, hook: str, exc: Exception) -> None:
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
                _failed(part, "stamp", exc)
        return items

    def sent(self, jobs: Sequence[Any], after_commit: Callable[[Callable[[], None]], None]) -> None:
        for part in self._parts:
            try:
                part.sent(jobs, after_commit)
            except Exception as exc:
                _failed(part, "sent", exc)


class Hooks:
    """What the engine and the workers call; ``observers`` is empty unless observed."""

    __slots__ = ("observers", "settling")

    def __init__(self) -> None:
        self.observers: tuple[Observer, ...] = ()
        self.settling: tuple[Observer, ...] = ()

    def sending(self, items: Sequence[Any]) -> tuple[Sequence[Any], Sending | None]:
        """An enqueue call begins: the items to insert (stamped), and what hears the
        answer (``None`` when no observer asked to)."""
        parts: list[Sending] = []
        for observer in self.observers:
            try:
                part = observer.enqueueing(items)
            except Exception as exc:
                _failed(observer, "enqueueing", exc)
                continue
            if part is not None:
                parts.append(part)
        if not parts:
            return items, None
        sends = _Sendings(parts)
        return sends.stamp(items), sends

    def attempt_started(self, job: Any, now_ms: int) -> tuple[tuple[Observer, Any], ...] | None:
        """An attempt of ``job`` (a ClaimedJob) starts at ``now_ms``: each observer's state,
        or ``None`` when no observer follows it (the attempt then runs as unobserved)."""
        states: list[tuple[Observer, Any]] = []
        for observer in self.observers:
            try:
                state = observer.attempt_started(job, now_ms)
            except Exception as exc:
                _failed(observer, "attempt_started", exc)
                continue
            if state is not UNOBSERVED:
                states.append((observer, state))
        return tuple(states) if states else None

    @staticmethod
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

    @staticmethod
    def call(states: tuple[tuple[Observer, Any], ...], handler: Any, *args: Any) -> Any:
        """``handler(*args)`` with each observer around it (a span current while it runs)."""
        entered: list[tuple[Observer, Any, Any]] = []
        for observer, state in states:
            if not observer.wraps:
                continue
            try:
                entered.append((observer, state, observer.entering(state)))
            except Exception as exc:
                _failed(observer, "entering", exc)
        if not entered:
            return handler(*args)
        try:
            return handler(*args)
        finally:
            for observer, state, token in reversed(entered):
                try:
                    observer.leaving(state, token)
                except Exception as exc:
                    _failed(observer, "leaving", exc)

    @staticmethod
    def checkpoint_saved(states: tuple[tuple[Observer, Any], ...], job: Any, node_id: str) -> None:
        """The attempt saved a checkpoint (a DAG node's value) under ``node_id``."""
        for observer, state in states:
            try:
                observer.checkpoint_saved(state, job, node_id)
            except Exception as exc:
                _failed(observer, "checkpoint_saved", exc)

    def settlement_batch(self, size: int) -> None:
        """A worker's settling thread committed ``size`` settlements in one transaction."""
        for observer in self.settling:
            try:
                observer.settlement_batch(size)
            except Exception as exc:
                _failed(observer, "settlement_batch", exc)


#: the process's hooks: the call sites test ``hooks.observers`` first
hooks = Hooks()
