"""What both backends' scopes share: ``store.jobs`` (one connection per call) and
``tx.jobs`` (inside an open ``store.transaction()``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from jaren_jobs.errors import StorageError
from jaren_jobs.signals import SignalLike

__all__ = ["RootScope", "TxScope"]

T = TypeVar("T")


class _Connections(Protocol):
    """What a root scope needs of a backend's database."""

    def check_open(self, what: str) -> None: ...

    def take(self, what: str, signal: SignalLike | None = None) -> None:
        """Hold a connection for this thread (the gate's place), bounded."""
        ...

    def give_back(self) -> None: ...

    def transaction(self, fn: Callable[[], T], *, doing: str) -> T:
        """``fn`` in a write transaction of its own: committed, or rolled back on error."""
        ...

    def snapshot(self, fn: Callable[[], T], *, doing: str) -> T:
        """``fn``'s reads from one snapshot (a read-only transaction)."""
        ...

    def before_read(self, what: str) -> None:
        """Make the held connection ready for reads outside any transaction."""
        ...

    def after_read(self) -> None:
        """Leave the held connection as a read outside any transaction must."""
        ...


class RootScope:
    """``store.jobs``: one of the store's connections per call (the gate), each write
    its own transaction."""

    root = True

    def __init__(self, db: _Connections) -> None:
        self.db = db

    def write(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        db = self.db
        db.check_open(what)
        db.take(what, signal)
        try:
            return db.transaction(fn, doing=what)
        finally:
            db.give_back()

    def read(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        db = self.db
        db.check_open(what)
        db.take(what, signal)
        try:
            db.before_read(what)
            try:
                return fn()
            finally:
                db.after_read()
        finally:
            db.give_back()

    def read_consistent(self, fn: Callable[[], T], what: str) -> T:
        """A multi-statement read from one snapshot."""
        db = self.db
        db.check_open(what)
        db.take(what)
        try:
            return db.snapshot(fn, doing=what)
        finally:
            db.give_back()

    def after_commit(self, callback: Callable[[], None]) -> None:
        callback()


class _Savepoints(Protocol):
    def check_open(self, what: str) -> None: ...

    def savepoint(self, fn: Callable[[], T], *, doing: str) -> T: ...


class TxScope:
    """``tx.jobs``: inside the application's open transaction, writes under savepoints."""

    root = False

    def __init__(self, db: _Savepoints, transaction: Any) -> None:
        self.db = db
        self._transaction = transaction

    def _check(self, what: str) -> None:
        self.db.check_open(what)
        self._transaction.check_active(what)

    def _explained(self, error: StorageError) -> StorageError | None:
        """``error`` retold if it ended the transaction (None: re-raise it as it is)."""
        explained: StorageError = self._transaction.explain(error)
        return None if explained is error else explained

    def write(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        self._check(what)
        try:
            return self.db.savepoint(fn, doing=what)
        except StorageError as exc:
            if (explained := self._explained(exc)) is None:
                raise
            raise explained from exc.__cause__

    def read(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        self._check(what)
        try:
            return fn()
        except StorageError as exc:
            if (explained := self._explained(exc)) is None:
                raise
            raise explained from exc.__cause__

    def read_consistent(self, fn: Callable[[], T], what: str) -> T:
        return self.read(fn, what)

    def after_commit(self, callback: Callable[[], None]) -> None:
        self._transaction.after_commit(callback)
