"""What both backends' scopes share: ``tx.jobs`` inside an open ``store.transaction()``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from jaren_jobs.errors import StorageError
from jaren_jobs.signals import SignalLike

__all__ = ["TxScope"]

T = TypeVar("T")


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
