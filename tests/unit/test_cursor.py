"""The cursor lifecycle, over a fake row source that counts opens and releases."""

from __future__ import annotations

import inspect
import sqlite3
import threading
from datetime import datetime, timezone
from typing import Any

import pytest

from jaren_jobs import (
    Barrier,
    CancelScope,
    Cursor,
    CursorAborted,
    DeadlinePassed,
    GateRefused,
    ItemTooLarge,
    StorageError,
    drain_page,
)
from jaren_jobs import cursor as cursor_module
from jaren_jobs.backends.sqlite import pages as pages_module
from jaren_jobs.backends.sqlite.errors import translating
from jaren_jobs.cursor import gate_admission
from jaren_jobs.errors import JobsError
from jaren_jobs.gate import Gate
from tests.conftest import START, FakeClock

WAIT = 5.0  # seconds any event may take before a test fails


class Source:
    """A row source that counts what the cursor did to it."""

    def __init__(
        self, rows: list[Any], *, fail_at: int | None = None, error: Exception | None = None
    ):
        self.rows = rows
        self.fail_at = fail_at
        self.error = error or RuntimeError("the source broke")
        self.opens = 0
        self.releases = 0
        self.pulls = 0
        self.in_pull = False
        self.released_during_pull = False
        # set to make a pull block inside the source until `resume` is set
        self.block_next = False
        self.entered = threading.Event()
        self.resume = threading.Event()

    def open(self) -> Rows:
        self.opens += 1
        return Rows(self)

    def release(self, rows: Rows) -> None:
        assert isinstance(rows, Rows)
        if self.in_pull:
            self.released_during_pull = True
        self.releases += 1


class Rows:
    def __init__(self, source: Source) -> None:
        self.source = source
        self.index = 0

    def __iter__(self) -> Rows:
        return self

    def __next__(self) -> Any:
        src = self.source
        src.in_pull = True
        try:
            src.pulls += 1
            if src.block_next:
                src.block_next = False
                src.entered.set()
                assert src.resume.wait(WAIT)
            if src.fail_at is not None and self.index == src.fail_at:
                raise src.error
            if self.index >= len(src.rows):
                raise StopIteration
            row = src.rows[self.index]
            self.index += 1
            return row
        finally:
            src.in_pull = False


class Settles:
    def __init__(self) -> None:
        self.calls: list[bool] = []

    def __call__(self, opened: bool) -> None:
        self.calls.append(opened)


class ForeignSignal:
    """A signal that is not the library's: it can only be polled."""

    def __init__(self) -> None:
        self.aborted = False
        self.reason: Any = None

    def abort(self, reason: Any) -> None:
        self.reason = reason
        self.aborted = True


def row_cursor(source: Source, **options: Any) -> tuple[Cursor[Any], Settles]:
    settles = Settles()
    cur: Cursor[Any] = Cursor(
        open_rows=source.open,
        release=source.release,
        on_settle=settles,
        **options,
    )
    return cur, settles


# ----------------------------------------------------------------- exit paths


def test_construction_opens_nothing_and_close_before_first_pull_releases_nothing() -> None:
    source = Source([1, 2, 3])
    cur, settles = row_cursor(source)
    assert cur.streaming == "row"
    assert cur.barrier is None
    assert not cur.settled
    assert source.opens == 0
    cur.close()
    assert (source.opens, source.releases) == (0, 0)
    assert settles.calls == [False]
    assert cur.settled
    # a closed cursor never opens its source later
    assert list(cur) == []
    cur.close()
    assert (source.opens, source.releases) == (0, 0)
    assert settles.calls == [False]


def test_close_midway_releases_once() -> None:
    source = Source([1, 2, 3])
    cur, settles = row_cursor(source, map_row=lambda r: r * 10)
    assert next(cur) == 10
    assert (source.opens, source.releases) == (1, 0)
    cur.close()
    assert source.releases == 1
    assert settles.calls == [True]
    cur.close()
    with pytest.raises(StopIteration):
        next(cur)
    assert (source.opens, source.releases) == (1, 1)
    assert settles.calls == [True]


def test_exhaustion_counts_as_released_and_close_does_not_release_again() -> None:
    source = Source(["a", "b"])
    cur, settles = row_cursor(source)
    assert list(cur) == ["a", "b"]
    assert cur.settled
    assert (source.opens, source.releases) == (1, 0)
    assert settles.calls == [True]
    cur.close()
    with pytest.raises(StopIteration):
        next(cur)
    assert (source.opens, source.releases) == (1, 0)
    assert settles.calls == [True]


def test_context_manager_releases_on_exit() -> None:
    source = Source([1, 2, 3])
    cur, settles = row_cursor(source)
    with cur as same:
        assert same is cur
        assert next(same) == 1
    assert (source.opens, source.releases) == (1, 1)
    assert settles.calls == [True]


def test_error_in_the_mapper_releases_once() -> None:
    source = Source([1, 2, 3])

    def mapper(row: int) -> int:
        if row == 2:
            raise ValueError("bad row 2")
        return row

    cur, settles = row_cursor(source, map_row=mapper)
    assert next(cur) == 1
    with pytest.raises(ValueError, match="bad row 2"):
        next(cur)
    assert source.releases == 1
    assert cur.settled
    assert settles.calls == [True]
    with pytest.raises(StopIteration):
        next(cur)
    cur.close()
    assert (source.opens, source.releases) == (1, 1)
    assert settles.calls == [True]


def test_a_mapper_stopiteration_is_an_error_not_the_end() -> None:
    source = Source([1, 2])

    def mapper(row: int) -> int:
        raise StopIteration

    cur, _ = row_cursor(source, map_row=mapper)
    with pytest.raises(RuntimeError, match="StopIteration"):
        next(cur)
    assert source.releases == 1


def test_a_sqlite_error_in_the_source_is_a_storage_error_and_releases_once() -> None:
    driver_error = sqlite3.OperationalError("disk I/O error")
    source = Source([1, 2, 3], fail_at=1, error=driver_error)
    # the SQLite backend hands every cursor its translation of sqlite3 errors
    cur, settles = row_cursor(source, what="test cursor", wrap=translating("test cursor"))
    assert next(cur) == 1
    with pytest.raises(StorageError) as caught:
        next(cur)
    assert caught.value.__cause__ is driver_error
    assert "test cursor" in str(caught.value)
    assert source.releases == 1
    assert settles.calls == [True]
    cur.close()
    assert (source.opens, source.releases) == (1, 1)


def test_an_error_opening_the_source_has_nothing_to_release() -> None:
    settles = Settles()

    def broken_open() -> Any:
        raise sqlite3.OperationalError("no such table")

    released: list[object] = []
    cur: Cursor[Any] = Cursor(
        open_rows=broken_open,
        release=released.append,
        on_settle=settles,
        wrap=translating("test cursor"),
    )
    with pytest.raises(StorageError):
        next(cur)
    assert released == []
    assert settles.calls == [True]
    cur.close()
    assert released == []


def test_the_wrap_hook_classifies_errors_but_jobs_errors_pass_unchanged() -> None:
    class Wrapped(Exception):
        pass

    source = Source([1], fail_at=0, error=KeyError("k"))
    cur, _ = row_cursor(source, wrap=lambda exc: Wrapped(repr(exc)))
    with pytest.raises(Wrapped) as caught:
        next(cur)
    assert isinstance(caught.value.__cause__, KeyError)
    assert source.releases == 1

    coded = StorageError("already classified")
    source2 = Source([1], fail_at=0, error=coded)
    cur2, _ = row_cursor(source2, wrap=lambda exc: Wrapped(repr(exc)))
    with pytest.raises(StorageError) as caught2:
        next(cur2)
    assert caught2.value is coded
    assert source2.releases == 1


def test_a_failing_release_is_reported_once_and_never_retried() -> None:
    calls: list[int] = []

    def release(_: object) -> None:
        calls.append(1)
        raise sqlite3.OperationalError("reset failed")

    source = Source([1, 2])
    cur: Cursor[Any] = Cursor(open_rows=source.open, release=release, wrap=translating("t"))
    next(cur)
    with pytest.raises(StorageError):
        cur.close()
    cur.close()
    assert calls == [1]
    assert cur.settled


# ----------------------------------------------------------------- abort


# what stops a cursor: a library Signal (which calls back at once), a foreign signal
# (polled at the next pull) or a deadline (checked at the next pull); for each, how to
# arm the cursor and how to stop it, the error and its code, and whether the statement
# is let go at the stop itself rather than at the next pull


def _library_signal() -> tuple[dict[str, Any], Any]:
    scope = CancelScope()
    return {"signal": scope.signal}, lambda: scope.abort("client went away")


def _foreign_signal() -> tuple[dict[str, Any], Any]:
    signal = ForeignSignal()
    return {"signal": signal}, lambda: signal.abort("client went away")


def _deadline() -> tuple[dict[str, Any], Any]:
    clock = FakeClock()
    deadline = datetime.fromtimestamp(START + 10, tz=timezone.utc)
    return {"deadline": deadline, "now": clock.now}, lambda: clock.advance(10)


STOPS: dict[str, tuple[Any, type[Exception], str, bool]] = {
    "library-signal": (_library_signal, CursorAborted, "JD2072", True),
    "foreign-signal": (_foreign_signal, CursorAborted, "JD2072", False),
    "deadline": (_deadline, DeadlinePassed, "JD2075", False),
}


@pytest.mark.parametrize("stop", list(STOPS))
def test_a_stop_between_pulls_releases_once_and_refuses_every_later_pull(stop: str) -> None:
    arm, error, code, at_once = STOPS[stop]
    options, stop_now = arm()
    source = Source([1, 2, 3])
    cur, settles = row_cursor(source, **options)
    assert next(cur) == 1
    stop_now()
    # a library Signal lets go of the statement at the abort; nothing can call back for
    # a foreign signal or a deadline: the next pull sees it
    assert source.releases == (1 if at_once else 0)
    if at_once:
        assert settles.calls == [True]
    for _ in range(3):
        with pytest.raises(error) as caught:
            next(cur)
        assert caught.value.code == code
        if error is CursorAborted:
            assert "client went away" in str(caught.value)
        assert source.releases == 1
        assert settles.calls == [True]
    cur.close()
    assert (source.opens, source.releases) == (1, 1)
    assert settles.calls == [True]


def _aborted_signal() -> dict[str, Any]:
    scope = CancelScope()
    scope.abort("too late")
    return {"signal": scope.signal}


def _passed_deadline() -> dict[str, Any]:
    deadline = datetime.fromtimestamp(START - 1, tz=timezone.utc)
    return {"deadline": deadline, "now": FakeClock().now}


# (how to arm the cursor, the error, whether it settles at construction: a library
# Signal already aborted does; a deadline is only read at the pull)
@pytest.mark.parametrize(
    ("arm", "error", "settled_at_once"),
    [(_aborted_signal, CursorAborted, True), (_passed_deadline, DeadlinePassed, False)],
    ids=["aborted-signal", "passed-deadline"],
)
def test_a_cursor_stopped_before_its_first_pull_refuses_it_without_opening(
    arm: Any, error: type[Exception], settled_at_once: bool
) -> None:
    source = Source([1])
    cur, settles = row_cursor(source, **arm())
    if settled_at_once:
        assert cur.settled
        assert settles.calls == [False]
    with pytest.raises(error):
        next(cur)
    assert (source.opens, source.releases) == (0, 0)
    assert settles.calls == [False]


def test_an_abort_during_a_pull_waits_for_the_pull_then_releases_once() -> None:
    scope = CancelScope()
    source = Source([1, 2, 3])
    cur, settles = row_cursor(source, signal=scope.signal)
    assert next(cur) == 1
    source.block_next = True
    outcome: list[BaseException | int] = []

    def pull() -> None:
        try:
            outcome.append(next(cur))
        except BaseException as exc:
            outcome.append(exc)

    puller = threading.Thread(target=pull)
    puller.start()
    assert source.entered.wait(WAIT)
    scope.abort("mid-pull")
    # the release never runs beside a pull that is inside the source
    assert source.releases == 0
    source.resume.set()
    puller.join(WAIT)
    assert not puller.is_alive()
    # the row stepped while the signal aborted is dropped
    assert len(outcome) == 1
    assert isinstance(outcome[0], CursorAborted)
    assert source.releases == 1
    assert not source.released_during_pull
    assert settles.calls == [True]
    cur.close()
    assert source.releases == 1


def test_a_mapper_that_aborts_its_own_signal_releases_once_after_its_pull() -> None:
    scope = CancelScope()
    source = Source([1, 2, 3])

    def mapper(row: int) -> int:
        if row == 2:
            scope.abort("seen enough")
        return row

    cur, settles = row_cursor(source, signal=scope.signal, map_row=mapper)
    assert next(cur) == 1
    assert next(cur) == 2  # the row was already pulled and mapped
    assert source.releases == 1
    assert not source.released_during_pull
    with pytest.raises(CursorAborted):
        next(cur)
    assert (source.opens, source.releases) == (1, 1)
    assert settles.calls == [True]


# ----------------------------------------------------------------- deadline


def test_a_deadline_not_yet_passed_lets_every_row_through() -> None:
    clock = FakeClock()
    deadline = datetime.fromtimestamp(START + 10, tz=timezone.utc)
    source = Source([1, 2, 3])
    cur, settles = row_cursor(source, deadline=deadline, now=clock.now)
    assert list(cur) == [1, 2, 3]
    assert (source.opens, source.releases) == (1, 0)
    assert settles.calls == [True]


# ----------------------------------------------------------------- admission


class CountingAdmit:
    """Per-pull admission through a real gate, counting how often it is entered."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.inner = gate_admission(gate)
        self.calls: list[str] = []
        self.queued = threading.Event()

    def __call__(self, fn: Any, what: str, signal: Any = None) -> Any:
        self.calls.append(what)
        self.queued.set()
        return self.inner(fn, what, signal)


class GateHolder:
    """Another thread holding the gate until told to let go."""

    def __init__(self, gate: Gate) -> None:
        self.held = threading.Event()
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(gate,))

    def _run(self, gate: Gate) -> None:
        with gate.held("holder"):
            self.held.set()
            assert self.release.wait(WAIT)

    def __enter__(self) -> GateHolder:
        self.thread.start()
        assert self.held.wait(WAIT)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.thread.join(WAIT)


def test_admission_is_per_pull_and_construction_holds_nothing() -> None:
    gate = Gate(timeout_seconds=WAIT)
    admit = CountingAdmit(gate)
    source = Source([1, 2])
    cur, _ = row_cursor(source, admit=admit)
    assert admit.calls == []
    assert next(cur) == 1
    assert len(admit.calls) == 1
    assert not gate.held_by_me()  # nothing is held between pulls
    # between pulls another thread can take the gate and give it back
    with GateHolder(gate):
        pass
    assert next(cur) == 2
    with pytest.raises(StopIteration):
        next(cur)
    assert len(admit.calls) == 3
    # a settled cursor answers without borrowing the gate
    with GateHolder(gate), pytest.raises(StopIteration):
        next(cur)
    assert len(admit.calls) == 3
    cur.close()  # nothing live to release: no admission either
    assert len(admit.calls) == 3


def test_a_pull_waits_for_the_gate_and_proceeds_when_it_is_free() -> None:
    gate = Gate(timeout_seconds=WAIT)
    admit = CountingAdmit(gate)
    source = Source([1, 2])
    cur, _ = row_cursor(source, admit=admit)
    results: list[Any] = []
    with GateHolder(gate) as holder:
        puller = threading.Thread(target=lambda: results.append(next(cur)))
        puller.start()
        assert admit.queued.wait(WAIT)
        # the holder has the gate: the pull cannot have reached the source
        assert source.opens == 0
        assert results == []
        holder.release.set()
        puller.join(WAIT)
    assert results == [1]
    assert source.opens == 1


@pytest.mark.parametrize("signal_kind", ["library", "foreign"])
def test_an_abort_while_a_pull_waits_for_the_gate_is_gate_refused_and_releases_once(
    signal_kind: str,
) -> None:
    gate = Gate(timeout_seconds=WAIT)
    admit = CountingAdmit(gate)
    scope = CancelScope()
    foreign = ForeignSignal()
    library = signal_kind == "library"
    source = Source([1, 2, 3])
    cur, settles = row_cursor(source, admit=admit, signal=scope.signal if library else foreign)
    assert next(cur) == 1
    admit.queued.clear()
    outcome: list[BaseException | int] = []

    def pull() -> None:
        try:
            outcome.append(next(cur))
        except BaseException as exc:
            outcome.append(exc)

    with GateHolder(gate):
        puller = threading.Thread(target=pull)
        puller.start()
        assert admit.queued.wait(WAIT)
        if library:
            scope.abort("request cancelled")
            # the abort lets go of the statement at once, off-gate
            assert source.releases == 1
        else:
            foreign.abort("gone")
        puller.join(WAIT)
        assert not puller.is_alive()
        assert len(outcome) == 1
        assert isinstance(outcome[0], GateRefused)
        assert source.pulls == 1  # the abandoned pull never reached the source
        if not library:
            # nothing called back: the statement is let go at close, and a release the
            # gate refuses (this thread does not get the gate within its timeout) still
            # releases; shorten the wait to prove it
            assert source.releases == 0
            gate.timeout_seconds = 0.0
            cur.close()
            assert source.releases == 1
    cur.close()
    assert (source.opens, source.releases) == (1, 1)
    assert settles.calls == [True]
    if library:
        with pytest.raises(CursorAborted):
            next(cur)
        assert source.releases == 1


def test_a_close_refused_by_the_gate_still_releases() -> None:
    gate = Gate(timeout_seconds=0.0)
    source = Source([1, 2])
    cur, settles = row_cursor(source, admit=gate_admission(gate))
    assert next(cur) == 1
    with GateHolder(gate):
        cur.close()
        assert source.releases == 1
    assert settles.calls == [True]


def test_a_close_that_gets_the_gate_releases_under_it() -> None:
    gate = Gate(timeout_seconds=WAIT)
    seen: list[bool] = []
    source = Source([1, 2])

    def release(rows: Any) -> None:
        seen.append(gate.held_by_me())
        source.release(rows)

    cur: Cursor[Any] = Cursor(open_rows=source.open, release=release, admit=gate_admission(gate))
    next(cur)
    cur.close()
    assert seen == [True]
    assert source.releases == 1


# ----------------------------------------------------------------- buffered


def test_a_buffered_source_materialises_on_the_first_pull_and_says_so() -> None:
    barrier = Barrier("external", "the rows come from a foreign iterator that cannot stream")
    calls: list[int] = []
    settles = Settles()

    def materialize() -> list[str]:
        calls.append(1)
        return ["x", "y"]

    cur: Cursor[str] = Cursor(materialize=materialize, barrier=barrier, on_settle=settles)
    assert cur.streaming == "buffered"
    assert cur.barrier == barrier
    assert cur.barrier.construct == "external"
    assert calls == []
    assert next(cur) == "x"
    assert calls == [1]
    assert next(cur) == "y"
    with pytest.raises(StopIteration):
        next(cur)
    cur.close()
    assert calls == [1]
    assert settles.calls == [True]


def test_a_buffered_source_honours_abort_and_wraps_errors() -> None:
    barrier = Barrier("window", "a window function needs the whole result")
    scope = CancelScope()
    cur: Cursor[int] = Cursor(materialize=lambda: [1, 2], barrier=barrier, signal=scope.signal)
    assert next(cur) == 1
    scope.abort("enough")
    with pytest.raises(CursorAborted):
        next(cur)

    def broken() -> list[int]:
        raise sqlite3.DatabaseError("malformed")

    cur2: Cursor[int] = Cursor(materialize=broken, barrier=barrier, wrap=translating("t"))
    with pytest.raises(StorageError):
        next(cur2)
    assert cur2.settled


def test_a_buffered_close_before_pull_never_materialises() -> None:
    calls: list[int] = []
    settles = Settles()
    cur: Cursor[int] = Cursor(
        materialize=lambda: calls.append(1) or [1],
        barrier=Barrier("external", "test"),
        on_settle=settles,
    )
    cur.close()
    assert list(cur) == []
    assert calls == []
    assert settles.calls == [False]


# ----------------------------------------------------------------- construction


def test_construction_is_validated() -> None:
    source = Source([])
    barrier = Barrier("external", "test")
    with pytest.raises(TypeError):
        Cursor()
    with pytest.raises(TypeError):
        Cursor(open_rows=source.open, materialize=list, barrier=barrier)
    with pytest.raises(TypeError):
        Cursor(materialize=list)  # a buffered cursor names its barrier
    with pytest.raises(TypeError):
        Cursor(open_rows=source.open, barrier=barrier)  # a row cursor streams
    with pytest.raises(TypeError):
        Cursor(open_rows=source.open, deadline=datetime.now(timezone.utc))  # no clock
    with pytest.raises(TypeError):
        Cursor(open_rows=source.open, deadline=datetime(2030, 1, 1), now=lambda: 0.0)
    with pytest.raises(TypeError):
        Cursor(open_rows=source.open, signal=object())
    with pytest.raises(ValueError):
        Barrier("", "reason")
    with pytest.raises(TypeError):
        Barrier(1, "reason")  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        barrier.construct = "other"  # type: ignore[misc]


def test_the_cursor_modules_never_materialise_a_row_source() -> None:
    for module in (cursor_module, pages_module):
        text = inspect.getsource(module)
        assert "fetchall" not in text, module.__name__
        assert ".all(" not in text, module.__name__


# ----------------------------------------------------------------- drain_page


class Item:
    def __init__(self, id: str, text: str = "") -> None:
        self.id = id
        self.text = text

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "text": self.text}


def item_bytes(item: Item) -> int:
    return len(f'{{"id":"{item.id}","text":"{item.text}"}}'.encode())


def items_cursor(items: list[Item]) -> tuple[Cursor[Item], Source]:
    source = Source(items)
    cur: Cursor[Item] = Cursor(open_rows=source.open, release=source.release)
    return cur, source


def test_drain_page_fills_by_count_and_peeks_one_past_the_limit() -> None:
    items = [Item(f"i{n}") for n in range(5)]
    cur, source = items_cursor(items)
    page = drain_page(cur, limit=2)
    assert [i.id for i in page.items] == ["i0", "i1"]
    assert page.continuation == "i1"
    assert page.has_more is True
    assert source.pulls == 3  # two items and one peek
    assert cur.settled
    assert source.releases == 1

    cur, source = items_cursor(items[:2])
    page = drain_page(cur, limit=2, after="i")
    assert [i.id for i in page.items] == ["i0", "i1"]
    assert page.has_more is False
    assert source.releases == 0  # exhausted by the peek


def test_drain_page_of_nothing_keeps_the_given_continuation() -> None:
    cur, _ = items_cursor([])
    page = drain_page(cur, limit=3, after="k9")
    assert list(page.items) == []
    assert page.continuation == "k9"
    assert page.has_more is False
    cur2, _ = items_cursor([])
    assert drain_page(cur2, limit=3).continuation is None


def test_drain_page_counts_utf8_bytes_and_stops_at_an_item_boundary() -> None:
    # "é" is one character and two bytes: the bound is in bytes
    items = [Item("a", "é" * 10), Item("b", "é" * 10), Item("c")]
    size = item_bytes(items[0])
    assert size == len('{"id":"a","text":""}') + 20
    cur, source = items_cursor(items)
    page = drain_page(cur, limit=10, max_bytes=2 * size)  # exactly two fit
    assert [i.id for i in page.items] == ["a", "b"]
    assert page.has_more is True
    assert page.continuation == "b"

    cur, source = items_cursor(items)
    page = drain_page(cur, limit=10, max_bytes=2 * size - 1)
    assert [i.id for i in page.items] == ["a"]
    assert page.has_more is True
    assert page.continuation == "a"
    assert source.releases == 1


def test_an_item_alone_over_max_bytes_is_refused_without_advancing() -> None:
    items = [Item("a", "é" * 10), Item("b")]
    size = item_bytes(items[0])
    # by characters it would fit; by UTF-8 bytes it does not
    assert len('{"id":"a","text":""}') + 10 <= size - 1
    cur, source = items_cursor(items)
    with pytest.raises(ItemTooLarge) as caught:
        drain_page(cur, limit=5, max_bytes=size - 1, after="0")
    error = caught.value
    assert error.code == "JD2074"
    assert error.details["continuation"] == "0"
    assert error.details["item_id"] == "a"
    assert error.details["bytes"] == size
    assert cur.settled
    assert source.releases == 1


def test_drain_page_counts_jobs_by_their_to_dict_and_plain_dicts_as_they_are() -> None:
    rows = [{"id": "x", "v": "ü"}, {"id": "y", "v": 1}]
    size = len('{"id":"x","v":"ü"}'.encode())
    cur: Cursor[dict[str, Any]] = Cursor(open_rows=lambda: iter(rows))
    page = drain_page(cur, limit=5, max_bytes=size)
    assert page.items == [rows[0]]
    assert page.continuation == "x"
    assert page.has_more


def test_drain_page_closes_the_cursor_when_a_pull_fails() -> None:
    source = Source([Item("a"), Item("b")], fail_at=1, error=ValueError("boom"))
    cur: Cursor[Item] = Cursor(open_rows=source.open, release=source.release)
    with pytest.raises(ValueError, match="boom"):
        drain_page(cur, limit=5)
    assert cur.settled
    assert source.releases == 1


def test_drain_page_arguments_are_validated() -> None:
    for bad in (0, -1):
        with pytest.raises(ValueError):
            drain_page(items_cursor([])[0], limit=bad)
    with pytest.raises(TypeError):
        drain_page(items_cursor([])[0], limit=True)
    with pytest.raises(TypeError):
        drain_page(items_cursor([])[0], limit=1, max_bytes=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        drain_page(items_cursor([])[0], limit=1, max_bytes=0)
    with pytest.raises(TypeError):
        drain_page(items_cursor([])[0], limit=1, after=3)  # type: ignore[arg-type]


def test_cursor_errors_are_part_of_the_family() -> None:
    assert issubclass(CursorAborted, JobsError)
    assert issubclass(DeadlinePassed, JobsError)
    assert issubclass(ItemTooLarge, JobsError)
