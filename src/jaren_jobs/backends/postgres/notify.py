"""Cross-process wake-ups: ``LISTEN`` on a connection of its own, re-established when it drops.

An enqueue's ``NOTIFY`` is delivered when its transaction commits; the
listener thread then wakes this process's idle workers. Polling stays the
fallback: a notification lost while the listener reconnects costs at most
one poll interval, and every reconnection wakes the workers once, in case
one was.

The thread sleeps in the kernel until the socket has data or ``stop()``
writes to a socket pair of its own: no timer. (psycopg's
``notifies(timeout=...)`` wakes about every 10 ms to look at its socket;
measured, that alone cost an idle worker a third of a per cent of a core.)

A notification sent by one of this store's own connections (``Notify.pid``;
the async store's pool counts as its own) does not wake the workers: the
enqueue that sent it woke them in this process when it committed.
Notifications from any other connection do.

The enqueue channel is listened on only once a worker asks (``start(wake)``):
a process that only calls ``wait()`` would otherwise wake for every enqueue
of every process, to do nothing. A worker that comes after a ``wait()``
pokes the thread, which LISTENs on that channel too and wakes the workers
once, in case an enqueue came meanwhile.

A second channel carries settlements (``wait()`` in this process wakes on
them): its own, so that a settlement never wakes an idle worker to claim. A
third carries ``cancel(id, force=True)`` of a running job, naming the job:
the workers of this process renew that job's lease at once if they hold it
(the renewal reads the mark back), so the holder learns sooner than its next
renewal would have told it.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
from collections import Counter
from collections.abc import Callable, Collection

import psycopg

from jaren_jobs.backends.postgres.connection import connect_settings

__all__ = ["Listener"]

_log = logging.getLogger("jaren_jobs.postgres")

# how long stop() waits for the thread (it wakes at once: stop() writes to its socket)
_WAIT_SECONDS = 0.2
# the pause between reconnection attempts while the server is away
_RETRY_SECONDS = 0.5


class Listener:
    """One thread per store: ``LISTEN channel``, and ``wake()`` on every notification."""

    def __init__(
        self,
        conninfo: str,
        quoted_channel: str,
        quoted_settled: str | None = None,
        settled_name: str | None = None,
        *,
        quoted_cancel: str | None = None,
        cancel_name: str | None = None,
        own_pids: Callable[[], Collection[int]] = frozenset,
    ) -> None:
        self._conninfo = conninfo
        self._channel = quoted_channel
        self._settled = quoted_settled
        self.settled_name = settled_name  # as a notification names it (unquoted)
        self._wakers: list[Callable[[], None]] = []
        self._settled_wakers: list[Callable[[], None]] = []
        self._cancel = quoted_cancel
        self._cancel_name = cancel_name  # as a notification names it (unquoted)
        self._cancel_wakers: list[Callable[[str], None]] = []
        # the server pids of the store's own connections (each pool's): their enqueues
        # woke this process's workers already, when they committed
        self._own_pools: list[Callable[[], Collection[int]]] = [own_pids]
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self.connected = threading.Event()  # set while LISTEN is in force (tests wait on it)
        self.reconnections = 0
        self.ignored = 0  # enqueue notifications of our own connections, not acted on
        # notifications read, by channel; and set at the first settlement's (tests wait)
        self.heard: Counter[str] = Counter()
        self.heard_settled = threading.Event()
        self._listening_enqueues = False  # whether the live connection LISTENs on them
        self._relisten = False  # a worker came: LISTEN on the enqueue channel too
        # stop() writes to one end; the thread waits on the other beside the connection
        self._poke: tuple[socket.socket, socket.socket] | None = None

    def start(self, wake: Callable[[], None] | None) -> None:
        with self._lock:
            if wake is not None and wake not in self._wakers:
                self._wakers.append(wake)
            if self._stopping.is_set():
                return
            if self._thread is None:
                self._poke = socket.socketpair()
                self._thread = threading.Thread(
                    target=self._run, name="jaren_jobs-listen", daemon=True
                )
                self._thread.start()
                return
            if not self._wakers or self._listening_enqueues or self._relisten:
                return
            # the first worker after a wait(): not connected, as tests see it, until
            # the thread LISTENs on the enqueue channel too
            self._relisten = True
            self.connected.clear()
            poke = self._poke
        if poke is not None:
            with contextlib.suppress(OSError):
                poke[1].send(b"\1")

    def on_settled(self, wake: Callable[[], None]) -> None:
        """Also call ``wake`` on every settlement NOTIFY (and on every reconnection)."""
        with self._lock:
            if wake not in self._settled_wakers:
                self._settled_wakers.append(wake)
        self.start(None)

    def on_cancel(self, wake: Callable[[str], None]) -> None:
        """Also call ``wake(job_id)`` on every forced-cancel NOTIFY (the job it names)."""
        with self._lock:
            if wake not in self._cancel_wakers:
                self._cancel_wakers.append(wake)
        self.start(None)

    def also_own(self, pids: Callable[[], Collection[int]]) -> None:
        """Count ``pids()`` as the store's own connections too: the async store's pool,
        whose enqueues wake this process's workers in process, as the sync pool's do."""
        with self._lock:
            self._own_pools.append(pids)

    def _own_pids(self) -> frozenset[int]:
        with self._lock:
            pools = list(self._own_pools)
        return frozenset(pid for pids in pools for pid in pids())

    def _cancelled(self, job_id: str) -> None:
        with self._lock:
            wakers = list(self._cancel_wakers)
        for wake in wakers:
            try:
                wake(job_id)
            except Exception:  # a waker never stops the listener
                _log.exception("jaren_jobs: a forced-cancel callback raised")

    def _wake(self, settled: bool | None = False) -> None:
        """Enqueue wakers (``False``), settlement wakers (``True``), or both (``None``)."""
        with self._lock:
            wakers = [] if settled is True else list(self._wakers)
            if settled is not False:
                wakers += self._settled_wakers
        for wake in wakers:
            try:
                wake()
            except Exception:  # a waker never stops the listener
                _log.exception("jaren_jobs: a wake-up callback raised")

    def _listen(self) -> psycopg.Connection[tuple[object, ...]]:
        conn = psycopg.connect(self._conninfo, autocommit=True, **connect_settings(self._conninfo))
        with self._lock:
            enqueues = bool(self._wakers)
            self._relisten = False
        if enqueues:
            conn.execute(f"LISTEN {self._channel}")
        self._listening_enqueues = enqueues
        if self._settled is not None:
            conn.execute(f"LISTEN {self._settled}")
        if self._cancel is not None:
            conn.execute(f"LISTEN {self._cancel}")
        return conn

    def _run(self) -> None:
        assert self._poke is not None
        poked = self._poke[0]
        first = True
        while not self._stopping.is_set():
            try:
                conn = self._listen()
            except psycopg.Error:
                self._stopping.wait(_RETRY_SECONDS)
                continue
            self._conn = conn
            self.connected.set()
            if not first:
                self.reconnections += 1
                # what was sent while we were away is claimable (or settled) now
                self._wake(None)
            first = False
            try:
                with selectors.DefaultSelector() as waiting:
                    waiting.register(conn.fileno(), selectors.EVENT_READ)
                    waiting.register(poked, selectors.EVENT_READ)
                    # first what arrived with the LISTENs (psycopg keeps it aside)
                    self._dispatch(conn)
                    while not self._stopping.is_set():
                        ready = waiting.select()  # no timeout: data, a drop, a poke
                        if any(key.fileobj is poked for key, _ in ready):
                            poked.recv(64)
                            self._listen_to_enqueues(conn)
                        self._dispatch(conn)
            except (psycopg.Error, OSError):
                pass  # dropped: reconnect
            finally:
                self._listening_enqueues = False
                self.connected.clear()
                self._conn = None
                with contextlib.suppress(psycopg.Error):
                    conn.close()

    def _listen_to_enqueues(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        """A worker came after a wait(): LISTEN on the enqueue channel too, then wake the
        workers once (an enqueue may have committed before the LISTEN did)."""
        with self._lock:
            if not self._relisten or self._stopping.is_set():
                return
            self._relisten = False
        conn.execute(f"LISTEN {self._channel}")
        self._listening_enqueues = True
        self.connected.set()
        self._wake(False)

    def _dispatch(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        """Act on every notification the connection has now (reading without waiting)."""
        own: Collection[int] | None = None
        for note in conn.notifies(timeout=0):
            self.heard[note.channel] += 1
            if note.channel == self._cancel_name:
                self._cancelled(note.payload)
                continue
            settled = note.channel == self.settled_name
            if settled:
                self.heard_settled.set()
            else:
                if own is None:
                    own = self._own_pids()
                if note.pid in own:
                    self.ignored += 1
                    continue
            # at once: a worker idles until it is woken or polls
            self._wake(settled)

    def stop(self) -> None:
        with self._lock:
            self._stopping.set()
            thread, poke = self._thread, self._poke
        if poke is not None:
            with contextlib.suppress(OSError):
                poke[1].send(b"\0")  # the thread wakes from its wait at once
        if thread is not None and thread is not threading.current_thread():
            thread.join(_WAIT_SECONDS * 3)
        if poke is not None and thread is not None and not thread.is_alive():
            for end in poke:
                end.close()
