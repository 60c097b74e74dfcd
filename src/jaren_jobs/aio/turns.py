"""The turns of an async transaction's levels: its parts run whole, one after another.

Tasks an ``async with store.transaction()`` block makes share its connection;
each level's :class:`Turn` makes every ``tx.jobs`` call, ``tx.execute`` and
nested block run whole, and the levels a context is inside say where a nested
block nests (see :mod:`jaren_jobs.aio.transaction`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from jaren_jobs.errors import TransactionEnded

__all__ = ["Turn"]

T = TypeVar("T")


class _Hold:
    """One task's turn at a transaction level, while it lasts (see :class:`Turn`)."""

    __slots__ = ("active", "turn")

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.active = True


# the turns the calling context holds: copied into the tasks made while one is held,
# so that a nested block's own tasks reach the levels it holds without waiting on it
_HOLDS: contextvars.ContextVar[tuple[_Hold, ...]] = contextvars.ContextVar(
    "jaren_jobs_transaction_turns", default=()
)


class Turn:
    """One transaction level's turn: its ``tx.jobs`` calls, its SQL and the blocks nested
    in it run whole, one after another, whichever of the block's tasks makes them.

    Tasks a block makes (``gather``) share its connection: interleaved, one part's
    savepoint rollback could undo another part's acknowledged write. A call holds
    the turn while it runs; a nested block holds its parent's turn from entry to
    exit. A context that holds the turn already (the nested block's own body,
    and tasks made inside it) goes on without waiting for itself. Once the block
    has ended, every call is refused (``TransactionEnded``) before it runs.
    """

    __slots__ = ("_check_open", "_lock", "ended")

    def __init__(self, check_open: Callable[[str], None]) -> None:
        self._lock = asyncio.Lock()
        self._check_open = check_open  # a closed store says so first, as the sync API does
        self.ended = False

    def _held_here(self) -> bool:
        return any(hold.turn is self and hold.active for hold in _HOLDS.get())

    def _check(self, what: str) -> None:
        self._check_open(what)
        if self.ended:
            raise TransactionEnded(
                f"{what}: this store.transaction() block has already ended, so nothing was "
                "written; await the tasks that use its tx inside the block",
                doing=what,
            )

    async def run(self, make: Callable[[], Awaitable[T]], what: str = "tx.jobs") -> T:
        """Await ``make()`` in this turn (at once if this context holds it already)."""
        self._check(what)
        if self._held_here():
            return await make()
        async with self._lock:
            self._check(what)
            hold = _Hold(self)
            token = _HOLDS.set((*_HOLDS.get(), hold))
            try:
                return await make()
            finally:
                hold.active = False
                _HOLDS.reset(token)

    async def take(self, what: str) -> tuple[_Hold, contextvars.Token[tuple[_Hold, ...]]] | None:
        """Hold the turn until :meth:`give` (a nested block); None if held here already."""
        self._check(what)
        if self._held_here():
            return None
        await self._lock.acquire()
        try:
            self._check(what)
        except BaseException:
            self._lock.release()
            raise
        hold = _Hold(self)
        return hold, _HOLDS.set((*_HOLDS.get(), hold))

    def give(self, taken: tuple[_Hold, contextvars.Token[tuple[_Hold, ...]]] | None) -> None:
        if taken is None:
            return
        hold, token = taken
        hold.active = False
        with contextlib.suppress(ValueError):  # exited in another context than it entered
            _HOLDS.reset(token)
        self._lock.release()

    async def close(self) -> None:
        """End the level: after the calls in flight, and before its commit or rollback."""
        if self.ended:
            return
        if self._held_here():
            self.ended = True
            return
        async with self._lock:
            self.ended = True


class _Level:
    """An open transaction level of one store, as the contexts inside it see it."""

    __slots__ = ("mark", "owner", "state", "turn")

    def __init__(self, owner: object, turn: Turn, mark: Any, state: Any) -> None:
        self.owner = owner
        self.turn = turn
        self.mark = mark  # the lane's aio.transaction.Mark (sync transactions on a lane)
        self.state = state  # AsyncTransactionState (async-native)


# the levels the calling context is inside, innermost last: a task made inside a block
# nests its own blocks in the level it was made in, not in a sibling's
_LEVELS: contextvars.ContextVar[tuple[_Level, ...]] = contextvars.ContextVar(
    "jaren_jobs_transaction_levels", default=()
)


def _current_level(owner: object) -> _Level | None:
    for level in reversed(_LEVELS.get()):
        if level.owner is owner and not level.turn.ended:
            return level
    return None


def _enter_level(level: _Level) -> contextvars.Token[tuple[_Level, ...]]:
    return _LEVELS.set((*_LEVELS.get(), level))


def _leave_level(token: contextvars.Token[tuple[_Level, ...]] | None) -> None:
    if token is not None:
        with contextlib.suppress(ValueError):  # exited in another context than it entered
            _LEVELS.reset(token)
