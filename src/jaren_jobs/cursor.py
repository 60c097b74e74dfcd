"""The one cursor: every query surface of the library builds its cursor here.

A :class:`Cursor` is a Python iterator and a context manager over one source:

* a **row source** (``open_rows``) is opened on the first pull, pulled one row
  per item, and released exactly once: on ``close()``, on an error while a
  row is pulled or mapped, on abort, on a passed deadline. A source pulled
  to exhaustion has already let go of its statement and is never released
  again;
* a **buffered source** (``materialize``) is materialised by the first pull
  and says so: ``streaming == "buffered"`` beside the :class:`Barrier` that
  forced it.

The module itself never materialises a row source: an engine that must
buffer hands its items in as ``materialize``, named by a barrier.

Cancellation happens at a row boundary: an aborted ``signal`` releases the
source and every later pull raises :class:`CursorAborted`; a ``deadline``
(read against the runtime clock, never the platform's) is checked at every
pull and, once passed, releases the source and raises
:class:`DeadlinePassed`. ``admit`` is how a root cursor borrows the store's
connection: once **per pull**, never between pulls, so a consumer paused
mid-iteration blocks no transaction.

:func:`drain_page` fills one :class:`~jaren_jobs.records.Page` from a cursor.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Generic, Literal, NoReturn, Protocol, TypeVar

from jaren_jobs.codec import encode_json
from jaren_jobs.errors import CursorAborted, DeadlinePassed, ItemTooLarge, JobsError
from jaren_jobs.gate import Gate
from jaren_jobs.records import Page
from jaren_jobs.signals import SignalLike, subscribe

__all__ = ["Admit", "Barrier", "Cursor", "Streaming", "drain_page", "gate_admission"]

T = TypeVar("T")
R = TypeVar("R")

Streaming = Literal["row", "buffered"]


@dataclass(frozen=True)
class Barrier:
    """What forced a cursor to buffer.

    ``construct`` is a stable identifier a program or a test can match on;
    ``reason`` is the sentence for a person.
    """

    construct: str
    reason: str

    def __post_init__(self) -> None:
        for name in ("construct", "reason"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"Barrier.{name} must be a str, got {type(value).__name__}")
            if value == "":
                raise ValueError(f"Barrier.{name} must be a non-empty string")


class Admit(Protocol):
    """Runs ``fn`` while holding the connection (the store's gate), for ``what``.

    A ``signal`` that aborts while the call is queued abandons it
    (``GateRefused``).
    """

    def __call__(
        self, fn: Callable[[], R], what: str, signal: SignalLike | None = None, /
    ) -> R: ...


def gate_admission(gate: Gate) -> Admit:
    """Per-pull admission through ``gate``: each pull takes it and gives it back."""

    def admit(fn: Callable[[], R], what: str, signal: SignalLike | None = None, /) -> R:
        with gate.held(what, signal):
            return fn()

    return admit


def _release_by_close(source: object) -> None:
    close = getattr(source, "close", None)
    if callable(close):
        close()


class Cursor(Generic[T]):
    """An iterator over one source, released exactly once (see the module docstring).

    Give exactly one of:

    * ``open_rows`` — a callable opening the row source (an iterable such as
      a driver's cursor), called by the first pull; ``map_row`` turns each
      row into an item; ``release(source)`` lets go of an unexhausted source
      (default: its ``close()``);
    * ``materialize`` — a callable answering every item at once, called by
      the first pull; requires the ``barrier`` that forced buffering.

    ``signal`` (anything with ``aborted`` and ``reason``) is honoured at each
    pull; a library :class:`~jaren_jobs.Signal` that aborts between pulls
    releases the source at once. ``deadline`` (an aware datetime) is read
    against ``now`` (epoch seconds; required with a deadline). ``wrap``
    classifies a failure raised while the source is opened, pulled, mapped or
    released (the backend's translation of its driver's errors; a
    ``JobsError`` always passes unchanged). ``on_settle(opened)`` is called
    exactly once, when the cursor settles — exhausted, closed, failed,
    aborted or past its deadline — with whether a pull ever reached the
    source. ``admit`` runs each pull (and the release ``close()`` makes)
    while holding the store's connection; construction holds nothing.
    """

    def __init__(
        self,
        *,
        open_rows: Callable[[], Iterable[Any]] | None = None,
        map_row: Callable[[Any], T] | None = None,
        release: Callable[[Any], object] | None = None,
        materialize: Callable[[], Iterable[T]] | None = None,
        barrier: Barrier | None = None,
        signal: SignalLike | None = None,
        deadline: datetime | None = None,
        now: Callable[[], float] | None = None,
        wrap: Callable[[Exception], BaseException] | None = None,
        on_settle: Callable[[bool], object] | None = None,
        admit: Admit | None = None,
        what: str = "cursor",
    ) -> None:
        if (open_rows is None) == (materialize is None):
            raise TypeError("a Cursor takes exactly one source: open_rows or materialize")
        if materialize is not None:
            if not isinstance(barrier, Barrier):
                raise TypeError(
                    "a buffered cursor (materialize) names the Barrier that forced buffering"
                )
            if map_row is not None or release is not None:
                raise TypeError("map_row and release belong to a row source (open_rows)")
        elif barrier is not None:
            raise TypeError("a row cursor streams: it has no barrier")
        if deadline is not None:
            if not isinstance(deadline, datetime) or deadline.utcoffset() is None:
                raise TypeError("a cursor's deadline is an aware datetime")
            if now is None:
                raise TypeError("a cursor with a deadline needs the clock it is read against (now)")
        if signal is not None and not isinstance(signal, SignalLike):
            raise TypeError(
                f"a cursor's signal has aborted and reason, got {type(signal).__name__}"
            )
        self._open_rows = open_rows
        self._map_row = map_row
        self._release = release or _release_by_close
        self._materialize = materialize
        self._barrier = barrier
        self._signal = signal
        self._deadline = deadline
        self._deadline_at = None if deadline is None else deadline.timestamp()
        self._now = now
        self._wrap = wrap
        self._on_settle = on_settle
        self._admit = admit
        self._what = what

        # one pull (or release) at a time; an abort callback only ever tries it
        self._lock = threading.Lock()
        self._opened = False
        self._source: Any = None
        self._rows: Iterator[Any] | None = None
        self._source_live = False  # opened, neither exhausted nor released
        self._items: list[T] = []
        self._offset = 0
        self._settled = False
        self._deadline_hit = False
        self._unsubscribe: Callable[[], None] | None = None

        if signal is not None:
            if signal.aborted:
                self._settle()
            else:
                self._unsubscribe = subscribe(signal, self._on_abort)

    # ------------------------------------------------------------ what it says about itself

    @property
    def streaming(self) -> Streaming:
        """``"row"``: one database row per pull; ``"buffered"``: the first pull read everything."""
        return "row" if self._materialize is None else "buffered"

    @property
    def barrier(self) -> Barrier | None:
        """What forced buffering; ``None`` when the cursor streams."""
        return self._barrier

    @property
    def settled(self) -> bool:
        """True once the cursor is exhausted, closed, failed, aborted or past its deadline."""
        return self._settled

    def __repr__(self) -> str:
        state = "settled" if self._settled else ("open" if self._opened else "unopened")
        return f"<jaren_jobs.Cursor {self._what} streaming={self.streaming} {state}>"

    # ------------------------------------------------------------ iteration

    def __iter__(self) -> Cursor[T]:
        return self

    def __next__(self) -> T:
        """The next item; ``StopIteration`` when the source is exhausted.

        Raises :class:`CursorAborted` (this and every later pull) once the
        signal aborted, :class:`DeadlinePassed` once the deadline passed;
        either way the source was released first.
        """
        if self._admit is None or self._needs_no_connection():
            return self._pull()
        return self._admit(self._pull, f"{self._what} (next row)", self._signal)

    def _needs_no_connection(self) -> bool:
        # an aborted or settled cursor refuses or ends on its own, and a
        # materialised buffer is already in memory: nothing to admit
        if self._signal is not None and self._signal.aborted:
            return True
        return self._settled or (self._materialize is not None and self._opened)

    def _pull(self) -> T:
        try:
            with self._lock:
                return self._pull_locked()
        finally:
            # an abort whose callback met this pull holding the lock is
            # handled here, as soon as the pull lets go
            if self._signal is not None and self._signal.aborted and not self._settled:
                self._on_abort()

    def _pull_locked(self) -> T:
        self._boundary()
        if self._settled:
            if self._deadline_hit:
                raise self._deadline_error()
            raise StopIteration
        if self._materialize is not None:
            return self._next_buffered(self._materialize)
        return self._next_row()

    def _next_buffered(self, materialize: Callable[[], Iterable[T]]) -> T:
        if not self._opened:
            self._opened = True
            try:
                self._items = list(materialize())
            except BaseException as exc:
                self._fail(exc)
            self._boundary()
        if self._offset < len(self._items):
            item = self._items[self._offset]
            self._offset += 1
            return item
        self._settle()
        raise StopIteration

    def _next_row(self) -> T:
        if not self._opened:
            self._opened = True
            assert self._open_rows is not None
            try:
                self._source = self._open_rows()
                self._source_live = True
                self._rows = iter(self._source)
            except BaseException as exc:
                self._fail(exc)
        assert self._rows is not None
        try:
            row = next(self._rows)
        except StopIteration:
            self._source_live = False  # an exhausted source already let go
            self._settle()
            raise
        except BaseException as exc:
            self._fail(exc)
        # a row stepped while the signal aborted or the deadline passed is dropped
        self._boundary()
        if self._map_row is None:
            return row  # type: ignore[no-any-return]
        try:
            return self._map_row(row)
        except StopIteration as exc:
            # a mapper's StopIteration must not read as the end of the rows
            self._finish(quiet=True)
            raise RuntimeError(f"{self._what}: the row mapper raised StopIteration") from exc
        except BaseException as exc:
            self._fail(exc)

    def _boundary(self) -> None:
        """Refuse the pull if the signal aborted or the deadline passed (releasing first)."""
        signal = self._signal
        if signal is not None and signal.aborted:
            self._finish(quiet=True)
            raise CursorAborted(
                f"{self._what}: the cursor was aborted ({signal.reason!r}); its statement was "
                "released at a row boundary and it pulls no further row",
                reason=repr(signal.reason),
            )
        if self._settled or self._deadline_at is None:
            return
        assert self._now is not None
        if self._now() >= self._deadline_at:
            self._deadline_hit = True
            self._finish(quiet=True)
            raise self._deadline_error()

    def _deadline_error(self) -> DeadlinePassed:
        assert self._deadline is not None
        stamp = self._deadline.isoformat()
        return DeadlinePassed(
            f"{self._what}: the deadline {stamp} passed before the next row; the statement "
            "was released at a row boundary",
            deadline=stamp,
        )

    def _fail(self, exc: BaseException) -> NoReturn:
        """Release the source, settle, and raise ``exc`` (classified by ``wrap``)."""
        self._finish(quiet=True)
        if isinstance(exc, Exception):
            wrapped = self._wrapped(exc)
            if wrapped is not exc:
                raise wrapped from exc
        raise exc

    def _wrapped(self, exc: Exception) -> BaseException:
        if isinstance(exc, JobsError):
            return exc
        if self._wrap is not None:
            return self._wrap(exc)
        return exc

    # ------------------------------------------------------------ release

    def _on_abort(self) -> None:
        # from the aborting thread: never wait for (nor run beside) a pull;
        # a pull holding the lock releases the source itself once it ends
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._finish(quiet=True)
        finally:
            self._lock.release()

    def _finish(self, *, quiet: bool) -> None:
        """Release a live source (once) and settle; ``quiet`` swallows a release failure."""
        try:
            self._release_source()
        except Exception:
            if not quiet:
                raise
        finally:
            self._settle()

    def _release_source(self) -> None:
        if not self._source_live:
            return
        self._source_live = False  # exactly once, even if the release itself fails
        source, self._source, self._rows = self._source, None, None
        try:
            self._release(source)
        except Exception as exc:
            wrapped = self._wrapped(exc)
            if wrapped is exc:
                raise
            raise wrapped from exc

    def _settle(self) -> None:
        if self._settled:
            return
        self._settled = True
        self._items = []
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()
        if self._on_settle is not None:
            self._on_settle(self._opened)

    def close(self) -> None:
        """Release the source (if one is open) and settle; idempotent.

        A root cursor makes the release holding the store's connection; if
        that is refused (the gate timed out, the store closed, this thread
        holds a transaction), the statement is released anyway — a statement
        left open is the worse outcome.
        """
        if self._admit is None or not self._source_live:
            self._close_locked()
            return
        ran = False

        def release() -> None:
            nonlocal ran
            ran = True
            self._close_locked()

        try:
            self._admit(release, f"{self._what} (release)", None)
        except JobsError:
            if ran:
                raise  # the release itself failed, not the admission
            self._close_locked()

    def _close_locked(self) -> None:
        with self._lock:
            self._finish(quiet=False)

    def __enter__(self) -> Cursor[T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# ----------------------------------------------------------------- pages


def _item_bytes(item: object) -> int:
    """UTF-8 bytes of the item's compact JSON (``to_dict()`` where the item has it)."""
    to_dict = getattr(item, "to_dict", None)
    value = to_dict() if callable(to_dict) else item
    return len(encode_json(value, "a page item").encode("utf-8"))


def _item_id(item: object) -> str:
    if isinstance(item, Mapping):
        value = item.get("id")
    else:
        value = getattr(item, "id", None)
    if not isinstance(value, str):
        raise TypeError(
            f"drain_page(): a page item carries its str id (item.id or item['id']), "
            f"got {type(item).__name__}"
        )
    return value


def drain_page(
    cursor: Cursor[T],
    *,
    limit: int,
    max_bytes: int | None = None,
    after: str | None = None,
) -> Page[T]:
    """Fill ONE page from ``cursor`` and close it.

    At most ``limit`` items and at most ``max_bytes`` UTF-8 bytes of their
    JSON (``to_dict()`` for a ``Job``), stopping at an item boundary.
    ``has_more`` is decided by one peek past ``limit``, or by an item that
    did not fit beside the earlier ones. ``continuation`` is the last
    delivered item's id (``after`` when nothing was delivered). An item
    that alone exceeds ``max_bytes`` is :class:`ItemTooLarge`, raised
    without advancing the continuation, so a retry meets the same refusal
    instead of skipping the item.
    """
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"drain_page(): limit must be an int, got {type(limit).__name__}")
    if limit < 1:
        raise ValueError(f"drain_page(): limit must be >= 1, got {limit}")
    if max_bytes is not None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
            raise TypeError(
                f"drain_page(): max_bytes must be an int or None, got {type(max_bytes).__name__}"
            )
        if max_bytes < 1:
            raise ValueError(f"drain_page(): max_bytes must be >= 1, got {max_bytes}")
    if after is not None and not isinstance(after, str):
        raise TypeError(f"drain_page(): after must be a str or None, got {type(after).__name__}")

    items: list[T] = []
    used = 0
    continuation = after
    has_more = False
    with cursor:
        for item in cursor:
            if len(items) >= limit:
                has_more = True  # the peek past limit found one more
                break
            if max_bytes is not None:
                size = _item_bytes(item)
                if used + size > max_bytes:
                    if not items:
                        raise ItemTooLarge(
                            f"drain_page(): the next item ({_item_id(item)!r}) is {size} bytes "
                            f"of JSON, more than the page's max_bytes of {max_bytes}; the "
                            "continuation was not advanced — raise max_bytes to read it",
                            item_id=_item_id(item),
                            bytes=size,
                            max_bytes=max_bytes,
                            continuation=after,
                        )
                    has_more = True  # it starts the next page
                    break
                used += size
            items.append(item)
            continuation = _item_id(item)
    return Page(items=items, continuation=continuation, has_more=has_more)
