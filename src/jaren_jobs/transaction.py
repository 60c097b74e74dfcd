"""``with store.transaction() as tx``: :class:`Transaction`, the application's SQL and
``tx.jobs`` in one database transaction (SPEC §1, §3)."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from jaren_jobs.backend import AppParams, AppTransaction, Rows, StoreBackend
from jaren_jobs.engine.engine import EngineHub
from jaren_jobs.errors import (
    StorageError,
    TransactionAborted,
    TransactionEnded,
)
from jaren_jobs.jobs import Jobs

__all__ = ["StoreLike", "Transaction", "current_task"]


class StoreLike(Protocol):
    """What a transaction needs of its store: the open database, to check it is still open.

    (A protocol rather than ``Store``, which sits above and opens transactions.)
    """

    @property
    def _backend(self) -> StoreBackend: ...


# nested blocks' savepoint names, unique per use in this process
_SAVEPOINTS = itertools.count(1)


_USE_ASYNC = (
    "a store's transaction belongs to a thread, and the tasks of a loop share one: "
    "run each task's transaction in a thread of its own (asyncio.to_thread)"
)


def current_task() -> asyncio.Task[Any] | None:
    """The running asyncio task, or None outside an event loop."""
    if asyncio.events._get_running_loop() is None:
        return None
    return asyncio.current_task()


class Transaction:
    """An open ``store.transaction()``: the application's SQL and ``tx.jobs``, atomically.

    A job enqueued through ``tx.jobs`` exists if and only if this transaction
    commits; in-process workers are woken after the commit.
    """

    def __init__(
        self,
        store: StoreLike,
        handle: AppTransaction,
        hub: EngineHub,
        depth: int,
        outermost: Transaction | None = None,
    ) -> None:
        self._store = store
        self._handle = handle
        self._thread = threading.get_ident()
        # under asyncio, the task that opened it: tasks of one loop share a thread
        self._task = current_task()
        self._active = True
        self._callbacks: list[Callable[[], None]] = []
        # the store.transaction() this one nests in (itself at depth 0): a
        # rollback ends all of them at once, so they share one verdict
        self._outermost = self if outermost is None else outermost
        self._rolled_back = False  # read on the outermost only
        self.depth = depth
        self.jobs = Jobs(handle.session(self, hub.runtime), hub)

    def check_active(self, what: str) -> None:
        if not self._active:
            raise TransactionEnded(
                f"{what}: this transaction has already ended; nothing was written — open a "
                "new store.transaction()",
                doing=what,
            )
        if threading.get_ident() != self._thread:
            raise StorageError(
                f"{what}: a transaction is used only from the thread that opened it",
                doing=what,
            )
        if self._task is not None and current_task() is not self._task:
            raise StorageError(
                f"{what}: this transaction belongs to another asyncio task; a task never "
                f"joins another's transaction — {_USE_ASYNC}",
                doing=what,
            )
        if self.rolled_back():
            raise self._aborted(what)

    def rolled_back(self) -> bool:
        """Whether the database ended the transaction under us; once seen, it stays so.

        Without this, a later statement would run in autocommit and commit
        on its own (a job for an order that does not exist).
        """
        outermost = self._outermost
        if not outermost._rolled_back:
            outermost._rolled_back = self._handle.ended_by_database()
        return outermost._rolled_back

    def explain(self, error: StorageError) -> StorageError:
        """``error``, saying so if the statement that raised it ended the transaction."""
        if not self.rolled_back():
            return error
        return StorageError(
            f"{error.message} — {self._handle.ended_message}",
            **error.details,
            rolled_back=True,
        )

    def _aborted(self, what: str) -> TransactionAborted:
        return TransactionAborted(
            f"{what}: {self._handle.aborted_text}; nothing in it was committed and nothing "
            "more runs in it — leave the with block and retry in a new store.transaction()",
            doing=what,
        )

    def _run(
        self,
        what: str,
        statement: str,
        parameters: AppParams | Iterable[AppParams],
        *,
        many: bool,
    ) -> Rows:
        self.check_active(what)
        self._store._backend.check_open(what)
        try:
            rows = self._handle.execute(
                statement, parameters, many=many, what=what, transaction=self
            )
        except StorageError as exc:
            raise self.explain(exc) from exc.__cause__
        self.rolled_back()  # a statement that succeeded can end it too (ROLLBACK)
        return rows

    def execute(self, statement: str, parameters: Sequence[Any] | Mapping[str, Any] = ()) -> Rows:
        """Run the application's own SQL inside this transaction, as its driver takes it
        (``?`` placeholders on SQLite, ``%s`` on psycopg)."""
        return self._run("tx.execute()", statement, parameters, many=False)

    def executemany(
        self, statement: str, seq_of_parameters: Iterable[Sequence[Any] | Mapping[str, Any]]
    ) -> Rows:
        return self._run("tx.executemany()", statement, seq_of_parameters, many=True)

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the outermost transaction has committed (never on rollback)."""
        self._callbacks.append(callback)

    def _end(self) -> list[Callable[[], None]]:
        self._active = False
        callbacks, self._callbacks = self._callbacks, []
        return callbacks
