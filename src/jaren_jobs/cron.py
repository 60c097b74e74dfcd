"""Cron expressions, parsed and evaluated here (SPEC §12): no runtime dependency.

Five fields — minute, hour, day of month, month, day of week — each ``*``, a
value, a range ``a-b``, a step ``*/n``, ``a-b/n`` or ``a/n`` (``a`` to the
field's end), or a comma-separated list of those; month names ``JAN``-``DEC``
and weekday names ``SUN``-``SAT`` in any case; 0 and 7 are both Sunday. The
shorthands ``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily``
(``@midnight``) and ``@hourly`` stand for their five-field forms.

Day of month and day of week combine as in Vixie cron: when both are
restricted (neither field starts with ``*``) a day matches if EITHER does;
otherwise both must.

Times are wall-clock times in an IANA zone (:mod:`zoneinfo`). A wall time the
zone skips (a daylight-saving gap) does not fire that day; one it repeats (an
overlap) fires once, at its first occurrence. :meth:`CronExpression.next_after`
and :meth:`~CronExpression.latest_at_or_before` skip field by field (a month,
a day, an hour at a time), never minute by minute.

Pure: no clock is read; the zone's rules come from the system's (or the
``tzdata`` package's) zone files.
"""

from __future__ import annotations

import bisect
import calendar
import functools
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone, tzinfo

__all__ = ["CronExpression", "load_zone", "parse_cron"]

_SHORTHANDS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_MONTHS = {
    name: number
    for number, name in enumerate(
        ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"), 1
    )
}
_WEEKDAYS = {
    name: number for number, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))
}

# (name, lowest, highest, names) of each field, in order
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day-of-week", 0, 7, _WEEKDAYS),
)

# the Gregorian calendar repeats every 400 years: a day that matches none
# of them never comes (29 February that is a Monday comes once in 28 years;
# parsing refuses the expressions that can never fire at all)
_SEARCH_YEARS = 400

# a zone's offset changes by at most a few hours (DST shifts are one or two):
# walls this far past a moment's own wall cannot map to an earlier instant
_SHIFT_BOUND = timedelta(hours=3)
_MINUTE = timedelta(minutes=1)
_DAY = timedelta(days=1)


# keys zoneinfo may load whose meaning is the host's, not a place's
HOST_DEPENDENT_ZONES = frozenset({"localtime", "posixrules", "Factory"})


@functools.lru_cache(maxsize=1)
def _known_zones() -> frozenset[str]:
    import zoneinfo  # noqa: PLC0415

    # UTC is always a zone, even on a system without zone files
    return frozenset(zoneinfo.available_timezones()) | {"UTC"}


def load_zone(name: object, what: str = "timezone") -> tzinfo:
    """The IANA zone ``name`` through :mod:`zoneinfo`; ``ValueError`` naming it if unknown."""
    if not isinstance(name, str):
        raise TypeError(f"{what} must be an IANA zone name (str), got {type(name).__name__}")
    if name == "":
        raise ValueError(
            f"{what} must be an IANA zone name such as 'UTC' or 'Europe/Berlin', got ''"
        )
    # imported here, not with the package: zoneinfo pulls in sysconfig and
    # its platform data, which `import jaren_jobs` (and the CLI worker) need not load
    import zoneinfo  # noqa: PLC0415

    if name in HOST_DEPENDENT_ZONES or name not in _known_zones():
        # a key whose meaning depends on the host ('localtime' is the host's own zone)
        # would make hosts in different zones compute different ticks of one schedule
        raise ValueError(
            f"{what} {name!r} is not an IANA time zone name: give one such as 'UTC' or "
            "'Europe/Berlin' (zoneinfo.available_timezones() lists them; host-dependent "
            "keys such as 'localtime', 'posixrules' and 'Factory' are refused)"
        )
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValueError(
            f"{what} {name!r} is not an IANA time zone known to this system "
            f"(zoneinfo could not load it: {exc}); on a system without zone files, "
            "install the tzdata package"
        ) from None


def parse_cron(expression: object) -> CronExpression:
    """Parse a five-field cron expression or an ``@`` shorthand.

    A mistake is a ``ValueError`` naming the field and the value at fault; an
    expression that can never fire (``0 0 30 2 *``) is refused the same way.
    """
    if not isinstance(expression, str):
        raise TypeError(f"cron must be a str, got {type(expression).__name__}")
    source = expression.strip()
    text = source
    if text.startswith("@"):
        expanded = _SHORTHANDS.get(text.lower())
        if expanded is None:
            raise ValueError(
                f"cron {expression!r}: unknown shorthand {text!r}; the shorthands are "
                f"{', '.join(_SHORTHANDS)}"
            )
        text = expanded
    parts = text.split()
    if len(parts) != 5:
        raise ValueError(
            f"cron {expression!r}: expected five fields (minute hour day-of-month month "
            f"day-of-week), got {len(parts)}"
        )
    values: list[tuple[int, ...]] = []
    for part, spec in zip(parts, _FIELDS, strict=True):
        values.append(_parse_field(expression, part, spec))
    minutes, hours, days, months, weekdays = values
    # 7 is Sunday too
    weekdays = tuple(sorted({0 if w == 7 else w for w in weekdays}))
    cron = CronExpression(
        source=source,
        minutes=minutes,
        hours=hours,
        days=days,
        months=months,
        weekdays=weekdays,
        day_star=parts[2].startswith("*"),
        weekday_star=parts[4].startswith("*"),
    )
    cron._check_can_fire(expression)
    return cron


def _parse_field(
    expression: str, part: str, spec: tuple[str, int, int, dict[str, int]]
) -> tuple[int, ...]:
    field, low, high, names = spec
    where = f"cron {expression!r}: {field} field {part!r}"
    chosen: set[int] = set()
    for item in part.split(","):
        if item == "":
            raise ValueError(f"{where}: an empty list item")
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not step_text.isdecimal():
                raise ValueError(f"{where}: step {step_text!r} is not a whole number")
            step = int(step_text)
            if step < 1:
                raise ValueError(f"{where}: step {step} must be at least 1")
        if base == "*":
            first, last = low, high
            if field == "day-of-week":
                last = 6  # 7 repeats Sunday
        else:
            start, dash, end = base.partition("-")
            first = _value(where, start, low, high, names)
            if dash:
                last = _value(where, end, low, high, names)
                if field == "day-of-week" and end.upper() == "SUN" and first > 0:
                    last = 7  # FRI-SUN runs to the week's end (7 is Sunday too)
                if last < first:
                    raise ValueError(f"{where}: range {base!r} runs backwards ({first} > {last})")
            elif slash:
                # a/n: from a to the field's end (Saturday for the day of
                # week, as with '*': 7 only repeats Sunday)
                last = 6 if field == "day-of-week" else high
            else:
                last = first
        chosen.update(range(first, last + 1, step))
    return tuple(sorted(chosen))


def _value(where: str, text: str, low: int, high: int, names: dict[str, int]) -> int:
    if text.isdecimal() and text.isascii():
        number = int(text)
    elif text.upper() in names:
        return names[text.upper()]
    else:
        allowed = f"{low}-{high}" + (
            f" or a name {next(iter(names))}-{list(names)[-1]}" if names else ""
        )
        raise ValueError(f"{where}: {text!r} is not a value ({allowed})")
    if not low <= number <= high:
        raise ValueError(f"{where}: {number} is out of range {low}-{high}")
    return number


@dataclass(frozen=True)
class CronExpression:
    """A parsed cron expression: the values each field allows. Build with :func:`parse_cron`."""

    source: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: tuple[int, ...]  # 0 is Sunday
    day_star: bool  # the day-of-month field starts with '*'
    weekday_star: bool  # the day-of-week field starts with '*'

    def __str__(self) -> str:
        return self.source

    # ------------------------------------------------------------ days

    def day_matches(self, day: date) -> bool:
        """Whether ``day`` is a day this expression fires on (month and Vixie day rules)."""
        if day.month not in self.months:
            return False
        by_day = day.day in self.days
        by_weekday = (day.weekday() + 1) % 7 in self.weekdays
        if not self.day_star and not self.weekday_star:
            return by_day or by_weekday
        return by_day and by_weekday

    def _check_can_fire(self, expression: str) -> None:
        if not self.weekday_star and not self.day_star:
            return  # any weekday turns up in any month
        if not self.weekday_star:
            return  # day of month is '*'-led: a chosen weekday turns up in every month
        # the day of week is unrestricted: some chosen day must exist in a chosen month
        # (29 February exists in leap years)
        for month in self.months:
            longest = 29 if month == 2 else calendar.monthrange(2001, month)[1]
            if self.days[0] <= longest:
                return
        raise ValueError(
            f"cron {expression!r}: never fires: day-of-month {', '.join(map(str, self.days))} "
            f"does not occur in month {', '.join(map(str, self.months))}"
        )

    # ------------------------------------------------------------ wall times

    def next_wall(self, start: datetime) -> datetime:
        """The first naive wall time at or after ``start`` (minute resolution) that matches."""
        t = start.replace(second=0, microsecond=0)
        if t < start:
            t += _MINUTE
        limit = t.year + _SEARCH_YEARS
        while t.year <= limit:
            if t.month not in self.months:
                i = bisect.bisect_right(self.months, t.month)
                if i < len(self.months):
                    t = datetime(t.year, self.months[i], 1)
                else:
                    t = datetime(t.year + 1, self.months[0], 1)
                continue
            if not self.day_matches(t.date()):
                t = datetime(t.year, t.month, t.day) + _DAY
                continue
            if t.hour not in self.hours:
                i = bisect.bisect_right(self.hours, t.hour)
                if i == len(self.hours):
                    t = datetime(t.year, t.month, t.day) + _DAY
                    continue
                t = t.replace(hour=self.hours[i], minute=0)
            if t.minute not in self.minutes:
                i = bisect.bisect_right(self.minutes, t.minute)
                if i == len(self.minutes):
                    t = t.replace(minute=0) + timedelta(hours=1)
                    continue
                t = t.replace(minute=self.minutes[i])
            return t
        raise ValueError(
            f"cron {self.source!r}: no time matches within {_SEARCH_YEARS} years of {start}"
        )

    def previous_wall(self, start: datetime) -> datetime:
        """The last naive wall time at or before ``start`` (minute resolution) that matches."""
        t = start.replace(second=0, microsecond=0)
        limit = t.year - _SEARCH_YEARS
        while t.year >= limit:
            if t.month not in self.months:
                i = bisect.bisect_left(self.months, t.month)
                year, month = (
                    (t.year, self.months[i - 1]) if i > 0 else (t.year - 1, self.months[-1])
                )
                last_day = calendar.monthrange(year, month)[1]
                t = datetime(year, month, last_day, 23, 59)
                continue
            if not self.day_matches(t.date()):
                t = datetime(t.year, t.month, t.day) - _MINUTE
                continue
            if t.hour not in self.hours:
                i = bisect.bisect_left(self.hours, t.hour)
                if i == 0:
                    t = datetime(t.year, t.month, t.day) - _MINUTE
                    continue
                t = t.replace(hour=self.hours[i - 1], minute=59)
            if t.minute not in self.minutes:
                i = bisect.bisect_left(self.minutes, t.minute)
                if i == 0:
                    t = t.replace(minute=0) - _MINUTE
                    continue
                t = t.replace(minute=self.minutes[i - 1])
            return t
        raise ValueError(
            f"cron {self.source!r}: no time matches within {_SEARCH_YEARS} years before {start}"
        )

    # ------------------------------------------------------------ instants

    def next_after(self, moment: datetime, zone: tzinfo) -> datetime:
        """The first instant (in UTC) strictly after ``moment`` (aware) at which this fires.

        The expression is read as wall times in ``zone``.

        Wall times the zone skips never fire; a repeated wall time fires at its
        first occurrence only.
        """
        try:
            local = moment.astimezone(zone)
            # the minute after the moment's own: a tick is a whole minute
            wall = local.replace(tzinfo=None, fold=0, second=0, microsecond=0) + _MINUTE
            while True:
                wall = self.next_wall(wall)
                instant = _instant(wall, zone)
                # strictly increasing in the wall time over walls that exist,
                # so the first one past the moment is the answer
                if instant is not None and instant > moment:
                    return instant
                wall += _MINUTE
        except OverflowError:
            raise ValueError(
                f"cron {self.source!r}: no time after {moment} before year 9999"
            ) from None

    def latest_at_or_before(self, moment: datetime, zone: tzinfo) -> datetime:
        """The last instant (in UTC) at or before ``moment`` (aware) at which this fires.

        The expression is read as wall times in ``zone``.
        """
        try:
            local = moment.astimezone(zone)
            wall = local.replace(tzinfo=None, fold=0)
            if local.fold:
                # the second pass of a repeated hour: walls later than this one
                # already had their first occurrence
                wall += _SHIFT_BOUND
            while True:
                wall = self.previous_wall(wall)
                instant = _instant(wall, zone)
                if instant is not None and instant <= moment:
                    return instant
                wall -= _MINUTE
        except OverflowError:
            raise ValueError(
                f"cron {self.source!r}: no time before {moment} after year 1"
            ) from None


def _instant(wall: datetime, zone: tzinfo) -> datetime | None:
    """The first instant with this naive wall time in ``zone`` (in UTC); None if skipped.

    In UTC: an aware datetime inside a repeated hour never compares equal to
    one in another zone (PEP 495), a trap the caller should not meet.
    """
    instant = wall.replace(tzinfo=zone, fold=0).astimezone(timezone.utc)
    if instant.astimezone(zone).replace(tzinfo=None, fold=0) != wall:
        return None  # in a gap: fold=0 resolved it with the offset from before the jump
    return instant
