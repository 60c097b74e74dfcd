"""Cancellation: scopes, waitable signals, and their combination.

A *signal* is any object with ``aborted: bool`` and ``reason``. The library's
own (:class:`Signal`) can also be waited on and subscribed to; foreign ones
are polled where the library has to wait.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from jaren_jobs.errors import OperationCancelled

__all__ = [
    "CancelScope",
    "Signal",
    "SignalLike",
    "any_signal",
    "check_deadline_arg",
    "refuse_if_cancelled",
    "subscribe",
    "wait_signal",
]

# how often a foreign (non-subscribable) signal is re-read while waiting
FOREIGN_POLL_SECONDS = 0.02


@runtime_checkable
class SignalLike(Protocol):
    """What the library accepts as a signal."""

    @property
    def aborted(self) -> bool: ...

    @property
    def reason(self) -> Any: ...


class Signal:
    """A waitable, subscribable cancellation signal (read side of a scope)."""

    __slots__ = ("_aborted", "_callbacks", "_event", "_lock", "_reason")

    def __init__(self) -> None:
        self._aborted = False
        # built on the first wait: most signals (one per worker attempt) are
        # never waited on, and an Event costs a Condition and two locks
        self._event: threading.Event | None = None
        self._lock = threading.Lock()
        self._reason: Any = None
        self._callbacks: list[Callable[[], None]] = []

    @property
    def aborted(self) -> bool:
        return self._aborted

    @property
    def reason(self) -> Any:
        return self._reason

    def wait(self, timeout_seconds: float | None = None) -> bool:
        """Block until aborted or the timeout passes; True once aborted."""
        if self._aborted:
            return True
        with self._lock:
            if self._aborted:
                return True
            event = self._event
            if event is None:
                event = self._event = threading.Event()
        return event.wait(timeout_seconds)

    def add_callback(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` once on abort (at once if already aborted); returns an unsubscriber."""
        with self._lock:
            if not self._aborted:
                self._callbacks.append(callback)

                def remove() -> None:
                    with self._lock:
                        if callback in self._callbacks:
                            self._callbacks.remove(callback)

                return remove
        _safe_call(callback)
        return _noop

    def _abort(self, reason: Any) -> bool:
        with self._lock:
            if self._aborted:
                return False
            self._reason = reason
            self._aborted = True
            if self._event is not None:
                self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            _safe_call(callback)
        return True

    def __repr__(self) -> str:
        state = f"aborted ({self._reason!r})" if self.aborted else "live"
        return f"<jaren_jobs.Signal {state}>"


class CancelScope:
    """A cancellation controller: hand out ``.signal``, call ``.abort(reason)``."""

    __slots__ = ("_signal",)

    def __init__(self) -> None:
        self._signal = Signal()

    @property
    def signal(self) -> Signal:
        return self._signal

    @property
    def aborted(self) -> bool:
        return self._signal.aborted

    def abort(self, reason: Any = "aborted") -> bool:
        """Abort the signal; True if this call aborted it, False if it already was."""
        return self._signal._abort(reason)


def any_signal(*signals: SignalLike | None) -> Signal:
    """A signal aborted as soon as any of ``signals`` is (``None`` entries are ignored)."""
    combined = CancelScope()
    live = [s for s in signals if s is not None]
    for s in live:
        if not isinstance(s, SignalLike):
            raise TypeError(f"any_signal takes signals (aborted, reason), got {type(s).__name__}")
    for s in live:
        if s.aborted:
            combined.abort(s.reason)
            return combined.signal
    foreign: list[SignalLike] = []
    for s in live:
        if isinstance(s, Signal):
            s.add_callback(_aborter(combined, s))
        else:
            foreign.append(s)
    if not foreign:
        return combined.signal
    return _PollingSignal(combined, foreign)


class _PollingSignal(Signal):
    """A combined signal with foreign members, re-read on every access and wait."""

    __slots__ = ("_foreign", "_scope")

    def __init__(self, scope: CancelScope, foreign: list[SignalLike]) -> None:
        # share the scope's state: the subscribable members abort the scope
        super().__init__()
        self._scope = scope
        self._foreign = foreign

    def _refresh(self) -> bool:
        if self._scope.aborted:
            return True
        for s in self._foreign:
            if s.aborted:
                self._scope.abort(s.reason)
                return True
        return False

    @property
    def aborted(self) -> bool:
        return self._refresh()

    @property
    def reason(self) -> Any:
        self._refresh()
        return self._scope.signal.reason

    def wait(self, timeout_seconds: float | None = None) -> bool:
        end = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        while True:
            if self._refresh():
                return True
            step = FOREIGN_POLL_SECONDS
            if end is not None:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                step = min(step, left)
            if self._scope.signal.wait(step):
                return True

    def add_callback(self, callback: Callable[[], None]) -> Callable[[], None]:
        # foreign members cannot call back; callers that need promptness poll
        return self._scope.signal.add_callback(callback)


def _aborter(scope: CancelScope, source: SignalLike) -> Callable[[], None]:
    def abort() -> None:
        scope.abort(source.reason)

    return abort


def subscribe(signal: SignalLike | None, callback: Callable[[], None]) -> Callable[[], None] | None:
    """Subscribe to a library signal; ``None`` when the signal must be polled instead."""
    if signal is None:
        return _noop
    if isinstance(signal, _PollingSignal):
        return None
    if isinstance(signal, Signal):
        return signal.add_callback(callback)
    return None


def wait_signal(signal: SignalLike, timeout_seconds: float | None) -> bool:
    """Wait on any signal: natively if it can be waited on, else by polling."""
    waiter = getattr(signal, "wait", None)
    if callable(waiter):
        return bool(waiter(timeout_seconds))
    end = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    while not signal.aborted:
        if end is not None and time.monotonic() >= end:
            return False
        time.sleep(FOREIGN_POLL_SECONDS)
    return True


def check_signal_arg(signal: object, what: str) -> SignalLike | None:
    if signal is None:
        return None
    if not isinstance(signal, SignalLike):
        raise TypeError(
            f"{what}: signal must have 'aborted' and 'reason' (e.g. CancelScope().signal), "
            f"got {type(signal).__name__}"
        )
    return signal


def check_deadline_arg(deadline: object, what: str) -> datetime | None:
    if deadline is None:
        return None
    if not isinstance(deadline, datetime):
        raise TypeError(
            f"{what}: deadline must be an aware datetime, got {type(deadline).__name__}"
        )
    if deadline.tzinfo is None or deadline.utcoffset() is None:
        raise ValueError(f"{what}: deadline must be timezone-aware (e.g. tzinfo=timezone.utc)")
    return deadline


def refuse_if_cancelled(
    signal: SignalLike | None, deadline: datetime | None, now: float, what: str
) -> None:
    """Refuse a call before it does anything, if its signal or deadline already says no."""
    if signal is not None and signal.aborted:
        raise OperationCancelled(
            f"{what} was not run: its signal was already aborted ({signal.reason!r})",
            reason=repr(signal.reason),
        )
    if deadline is not None and deadline.timestamp() <= now:
        raise OperationCancelled(
            f"{what} was not run: its deadline {deadline.isoformat()} had already passed",
            deadline=deadline.isoformat(),
        )


def _safe_call(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:  # a subscriber's failure must not break the abort
        logging.getLogger("jaren_jobs.signals").exception("a signal callback raised")


def _noop() -> None:
    return None
