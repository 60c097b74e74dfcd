"""Periodic jobs (SPEC §12): schedules, and the ticks any worker may enqueue.

There is no leader. Every worker given a schedule enqueues each of its ticks
under a deterministic job id, ``periodic:<name>:<tick as epoch ms>``; the
store's primary key lets exactly one enqueue of an id win (the rest meet
``DuplicateJob``, which is the answer "someone already did"), and it keeps
winning after the tick's job has settled, so a tick is enqueued once, ever,
however many processes or hosts run the schedule.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from datetime import timezone as _timezone
from typing import Any

from jaren_jobs.codec import check_aware, check_identifier, encode_json
from jaren_jobs.core.commands import prepare_job
from jaren_jobs.cron import CronExpression, load_zone, parse_cron
from jaren_jobs.engine.engine import JobEngine
from jaren_jobs.errors import DuplicateJob
from jaren_jobs.records import Job
from jaren_jobs.runtime import resolve_defaults

__all__ = ["Periodic", "Ticker", "check_schedules"]

_log = logging.getLogger("jaren_jobs.periodic")

# the states in which a tick's job is still "the previous run, unsettled"
_UNSETTLED = frozenset({"pending", "leased", "failed"})
# how many earlier ticks skip_while_unsettled reads back through (ticks it
# skipped wrote no job) before it takes the schedule to be idle
_SKIP_LOOKBACK = 64
_MS = timedelta(milliseconds=1)


@dataclass(frozen=True)
class Periodic:
    """A schedule whose ticks are enqueued as jobs by any worker running it.

    ``Periodic(name, kind, *, cron=None, every_seconds=None, payload=None,
    timezone="UTC", queue="default", priority=0, max_attempts=None,
    skip_while_unsettled=False)`` — exactly one of ``cron`` (a five-field
    expression or an ``@`` shorthand, see :mod:`jaren_jobs.cron`) and
    ``every_seconds`` (ticks aligned to the epoch: every process agrees on
    them without talking). ``name`` identifies the schedule in the store:
    workers in different processes that share a name share its ticks.
    ``timezone`` (an IANA name) is where ``cron`` is read; ``every_seconds``
    ignores it. ``payload``, ``queue``, ``priority`` and ``max_attempts`` are
    what each tick's job is enqueued with. With ``skip_while_unsettled``, a
    tick whose schedule's previous job is still pending, leased or awaiting a
    retry enqueues nothing.

    Validated at construction: a mistake is a ``TypeError`` or a
    ``ValueError`` naming it. Frozen.
    """

    name: str
    kind: str
    cron: str | None = None
    every_seconds: float | None = None
    payload: Any = field(default=None, hash=False)  # a dict is unhashable; eq still sees it
    timezone: str = "UTC"
    queue: str = "default"
    priority: int = 0
    max_attempts: int | None = None
    skip_while_unsettled: bool = False
    _expression: CronExpression | None = field(init=False, repr=False, compare=False)
    _zone: tzinfo = field(init=False, repr=False, compare=False)
    _every_ms: int | None = field(init=False, repr=False, compare=False)

    def __init__(
        self,
        name: str,
        kind: str,
        *,
        cron: str | None = None,
        every_seconds: float | None = None,
        payload: Any = None,
        timezone: str = "UTC",
        queue: str = "default",
        priority: int = 0,
        max_attempts: int | None = None,
        skip_while_unsettled: bool = False,
    ) -> None:
        what = "Periodic()"
        name = _check_name(name, f"{what}: name")
        what = f"Periodic({name!r})"
        if cron is None and every_seconds is None:
            raise TypeError(f"{what}: give cron= or every_seconds= (exactly one of them)")
        if cron is not None and every_seconds is not None:
            raise ValueError(f"{what}: give cron= or every_seconds=, not both")
        expression = None if cron is None else _parse(cron, what)
        every_ms = None if every_seconds is None else _every_ms(every_seconds, what)
        zone = load_zone(timezone, f"{what}: timezone")
        if not isinstance(queue, str):
            raise TypeError(f"{what}: queue must be a non-empty str, got {type(queue).__name__}")
        if queue == "":
            raise ValueError(f"{what}: queue must be a non-empty str")
        check_identifier(queue, f"{what}: queue")
        if not isinstance(skip_while_unsettled, bool):
            raise TypeError(
                f"{what}: skip_while_unsettled must be a bool, got "
                f"{type(skip_while_unsettled).__name__}"
            )
        # the job's own arguments are checked exactly as enqueue() will check them
        prepare_job(
            resolve_defaults(None),
            kind,
            payload,
            job_id=None,
            run_at=None,
            delay_seconds=None,
            max_attempts=max_attempts,
            priority=priority,
            what=what,
        )
        # a private copy: the dataclass is frozen, the caller's dict is not
        payload = None if payload is None else json.loads(encode_json(payload, what, "payload"))
        for key, value in (
            ("name", name),
            ("kind", kind),
            ("cron", None if expression is None else expression.source),
            ("every_seconds", every_seconds),
            ("payload", payload),
            ("timezone", timezone),
            ("queue", queue),
            ("priority", priority),
            ("max_attempts", max_attempts),
            ("skip_while_unsettled", skip_while_unsettled),
            ("_expression", expression),
            ("_zone", zone),
            ("_every_ms", every_ms),
        ):
            object.__setattr__(self, key, value)

    # ------------------------------------------------------------ ticks

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment``, as a UTC datetime.

        Pure. (UTC because an aware datetime inside a repeated hour never
        compares equal to one in another zone; ``.astimezone(zone)`` to show
        it.) ``moment`` must be an aware datetime (a naive one is refused: it
        names no instant). ``cron`` ticks are wall times in ``timezone``; one
        the zone skips never fires, one it repeats fires at its first
        occurrence. ``every_seconds`` ticks are the multiples of the period
        counted from the Unix epoch.
        """
        check_aware(moment, f"Periodic({self.name!r}).next_after(): moment")
        if self._every_ms is not None:
            ms = _epoch_ms(moment)
            tick = (ms // self._every_ms + 1) * self._every_ms
            return _from_ms(tick)
        assert self._expression is not None
        return self._expression.next_after(moment, self._zone)

    def latest_at_or_before(self, moment: datetime) -> datetime:
        """The last tick at or before ``moment`` (aware), as a UTC datetime."""
        check_aware(moment, f"Periodic({self.name!r}).latest_at_or_before(): moment")
        if self._every_ms is not None:
            ms = _epoch_ms(moment)
            return _from_ms(ms // self._every_ms * self._every_ms)
        assert self._expression is not None
        return self._expression.latest_at_or_before(moment, self._zone)

    def job_id(self, tick: datetime) -> str:
        """The id of the job of ``tick``: ``periodic:<name>:<tick as epoch ms>``."""
        check_aware(tick, f"Periodic({self.name!r}).job_id(): tick")
        return f"periodic:{self.name}:{_epoch_ms(tick)}"


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a non-empty str, got {type(name).__name__}")
    if name == "":
        raise ValueError(f"{what} must be a non-empty str")
    return check_identifier(name, what)


def _parse(cron: object, what: str) -> CronExpression:
    try:
        return parse_cron(cron)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{what}: {exc}") from None


def _every_ms(every: object, what: str) -> int:
    if isinstance(every, bool) or not isinstance(every, int | float):
        raise TypeError(
            f"{what}: every_seconds must be a number of seconds, got {type(every).__name__}"
        )
    if not math.isfinite(every) or every < 1:
        raise ValueError(f"{what}: every_seconds must be at least 1 second, got {every!r}")
    ms = round(every * 1000)
    if abs(ms - every * 1000) > 1e-6 * max(1.0, every):
        raise ValueError(f"{what}: every_seconds {every!r} is finer than a millisecond")
    return ms


def _epoch_ms(moment: datetime) -> int:
    return (moment - _EPOCH) // _MS


def _from_ms(ms: int) -> datetime:
    return _EPOCH + ms * _MS


_EPOCH = datetime(1970, 1, 1, tzinfo=_timezone.utc)


def check_schedules(periodic: object, what: str) -> tuple[Periodic, ...]:
    """``create_worker(periodic=...)``: Periodic schedules with distinct names."""
    if periodic is None:
        return ()
    if isinstance(periodic, Periodic | str | bytes) or not isinstance(periodic, Sequence):
        raise TypeError(
            f"{what}: periodic must be a list of jaren_jobs.Periodic, got {type(periodic).__name__}"
        )
    names: set[str] = set()
    for item in periodic:
        if not isinstance(item, Periodic):
            raise TypeError(
                f"{what}: each periodic item must be a jaren_jobs.Periodic, got "
                f"{type(item).__name__}"
            )
        if item.name in names:
            raise ValueError(
                f"{what}: two schedules are named {item.name!r}; a name identifies a schedule's "
                "ticks in the store, so each must be distinct"
            )
        names.add(item.name)
    return tuple(periodic)


class Ticker:
    """The ticks of a worker's schedules: which are due, and enqueueing them.

    The first check of a schedule enqueues its latest tick at or before now
    (the one a gap with no worker running may have missed; if another worker
    already enqueued it, its id says so); each later check enqueues the
    latest tick due since the one before, so however long a check was late
    at most one tick per schedule is enqueued for it — never a backlog.
    """

    def __init__(self, schedules: Sequence[Periodic], now_ms: Callable[[], int]) -> None:
        self._schedules = tuple(schedules)
        self._now_ms = now_ms
        # epoch ms of each schedule's next due tick; absent until its first check
        self._due: dict[str, int] = {}
        # the runtime clock's latest reading: every due time above derives from it
        self._seen_ms: int | None = None
        self._lock = threading.Lock()  # one check at a time (run_once beside the thread)

    @property
    def schedules(self) -> tuple[Periodic, ...]:
        return self._schedules

    def seconds_until_due(self) -> float:
        """Seconds (by the runtime clock) until the next tick of any schedule is due."""
        with self._lock:
            if len(self._due) < len(self._schedules):
                return 0.0
            earliest = min(self._due.values())
        return max(0.0, (earliest - self._now_ms()) / 1000)

    def enqueue_due(self, jobs: JobEngine) -> list[Job]:
        """Enqueue the ticks due now through ``jobs``; the jobs this call created.

        A tick another worker enqueued first creates nothing here. A storage
        error propagates and leaves that schedule due, to be tried again.
        """
        created: list[Job] = []
        with self._lock:
            now_ms = self._now_ms()
            self._notice_backward_jump(now_ms)
            now = _from_ms(now_ms)
            for schedule in self._schedules:
                due = self._due.get(schedule.name)
                if due is not None and now_ms < due:
                    continue
                tick = schedule.latest_at_or_before(now)
                if due is None or _epoch_ms(tick) >= due:
                    job = _enqueue_tick(jobs, schedule, tick)
                    if job is not None:
                        created.append(job)
                self._due[schedule.name] = _epoch_ms(schedule.next_after(now))
        return created

    def _notice_backward_jump(self, now_ms: int) -> None:
        """Forget every due time when the clock moved back (held under ``_lock``).

        Each was derived from a later reading (a clock that jumped ahead, then
        was corrected): kept, it would hold every schedule back until the
        clock caught up with it again. Forgotten, the next check is a first
        check: it enqueues the latest tick at or before now, whose id keeps it
        from running twice if it was enqueued before.
        """
        seen, self._seen_ms = self._seen_ms, now_ms
        if seen is None or now_ms >= seen:
            return
        _log.warning(
            "jaren_jobs: periodic: the clock moved back %.3fs (from %s to %s); "
            "recomputing every schedule's next tick from now",
            (seen - now_ms) / 1000,
            _from_ms(seen).isoformat(),
            _from_ms(now_ms).isoformat(),
        )
        self._due.clear()


def _enqueue_tick(jobs: JobEngine, schedule: Periodic, tick: datetime) -> Job | None:
    if schedule.skip_while_unsettled and _previous_unsettled(jobs, schedule, tick):
        _log.info(
            "jaren_jobs: periodic %r: tick %s skipped, its previous run is unsettled",
            schedule.name,
            tick.isoformat(),
        )
        return None
    try:
        return jobs.enqueue_tick(
            schedule.kind,
            schedule.payload,
            id=schedule.job_id(tick),
            # the tick, even for a tick enqueued late (the catch-up after a gap)
            run_at=tick,
            max_attempts=schedule.max_attempts,
            priority=schedule.priority,
            queue=schedule.queue,
        )
    except DuplicateJob:
        return None  # another worker enqueued this tick: the database let one win


def _previous_unsettled(jobs: JobEngine, schedule: Periodic, tick: datetime) -> bool:
    """Whether the job of the schedule's latest earlier tick that has one is unsettled.

    Ticks this option skipped wrote no job, so it reads back through them, up
    to ``_SKIP_LOOKBACK`` ticks.
    """
    earlier = tick
    for _ in range(_SKIP_LOOKBACK):
        earlier = schedule.latest_at_or_before(earlier - _MS)
        job = jobs.get(schedule.job_id(earlier))
        if job is not None:
            return job.state in _UNSETTLED
    return False
