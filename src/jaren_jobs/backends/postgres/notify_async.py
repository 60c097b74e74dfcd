"""``LISTEN`` on the event loop: the async store's cross-process wake-ups, no thread.

The asyncio twin of :mod:`.notify`, written by hand: the sync listener is a
thread blocked in ``conn.notifies(timeout=...)``, which has no line-by-line
asyncio form; here one task of the loop awaits an ``AsyncConnection``'s
notifications and calls the wakers (each a callable that never blocks). The
rules are the same: re-established when the connection drops (with a pause
while the server is away), and every reconnection wakes every waker once, in
case a notification was lost meanwhile (polling stays the fallback).

It listens on the enqueue channel only while something wants enqueues: an
AsyncWorker hears them through the sync store's listener, and ``wait()``,
what starts this one, needs only settlements. Listening anyway would wake
the loop for every enqueue of every process, to do nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg

from jaren_jobs.backends.postgres.connection import connect_settings

__all__ = ["AsyncListener"]

_log = logging.getLogger("jaren_jobs.postgres")

_RETRY_SECONDS = 0.5


class AsyncListener:
    """One task per async store: ``LISTEN`` both channels, ``wake()`` on every notification."""

    def __init__(
        self, conninfo: str, quoted_channel: str, quoted_settled: str, settled_name: str
    ) -> None:
        self._conninfo = conninfo
        self._channel = quoted_channel
        self._settled = quoted_settled
        self.settled_name = settled_name  # as a notification names it (unquoted)
        self._wakers: list[Callable[[], None]] = []
        self._settled_wakers: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.connected = asyncio.Event()  # set while LISTEN is in force (tests wait on it)
        self.reconnections = 0
        self.connection: psycopg.AsyncConnection[Any] | None = None
        # notifications read, by channel; and set at the first settlement's (tests wait)
        self.heard: Counter[str] = Counter()
        self.heard_settled = asyncio.Event()
        self._listening_enqueues = False  # whether the live connection LISTENs on them

    def start(self, wake: Callable[[], None] | None) -> None:
        """Listen (from a coroutine of the store's loop), and call ``wake`` on enqueues."""
        if wake is not None and wake not in self._wakers:
            self._wakers.append(wake)
        task = self._task
        if self._stopping:
            return
        if task is not None and not task.done():
            if not self._wakers or self._listening_enqueues:
                return
            # the first enqueue waker: listen again, on that channel too (not
            # connected, as tests see it, until that LISTEN is in force)
            self.connected.clear()
            task.cancel()
        # (again, if the loop it ran on ended: asyncio.run cancels what is left)
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="jaren_jobs-listen-async"
        )

    def on_settled(self, wake: Callable[[], None]) -> None:
        """Also call ``wake`` on every settlement NOTIFY (and on every reconnection)."""
        if wake not in self._settled_wakers:
            self._settled_wakers.append(wake)
        self.start(None)

    def _wake(self, settled: bool | None = False) -> None:
        wakers = [] if settled is True else list(self._wakers)
        if settled is not False:
            wakers += self._settled_wakers
        for wake in wakers:
            try:
                wake()
            except Exception:  # a waker never stops the listener
                _log.exception("jaren_jobs: a wake-up callback raised")

    async def _run(self) -> None:
        first = True
        while not self._stopping:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._conninfo, autocommit=True, **connect_settings(self._conninfo)
                )
            except psycopg.Error:
                await asyncio.sleep(_RETRY_SECONDS)
                continue
            try:
                listening = bool(self._wakers)
                if listening:
                    await conn.execute(f"LISTEN {self._channel}")
                await conn.execute(f"LISTEN {self._settled}")
                self._listening_enqueues = listening
                self.connection = conn
                self.connected.set()
                if not first:
                    self.reconnections += 1
                    self._wake(None)  # what was sent while we were away
                first = False
                async for note in conn.notifies():
                    self.heard[note.channel] += 1
                    settled = note.channel == self.settled_name
                    if settled:
                        self.heard_settled.set()
                    self._wake(settled)
            except psycopg.Error:
                pass  # dropped: reconnect
            finally:
                self.connected.clear()
                self._listening_enqueues = False
                self.connection = None
                with contextlib.suppress(psycopg.Error):
                    await conn.close()

    async def stop(self) -> None:
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
