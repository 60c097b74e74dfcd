"""Cron parsing and evaluation, by explicit cases (issue 16, SPEC §12).

The DST rules are pinned by name in Europe/Berlin and America/New_York: a
wall time the zone skips does not fire that day, one it repeats fires once
(its first occurrence). croniter, the oracle of test_cron_oracle.py, differs
there (it fires a skipped time at the shifted wall time, and a repeated one
twice); the cases that say so call it to show it.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from jaren_jobs.cron import load_zone, parse_cron

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def ticks(
    expression: str, start: datetime, zone: ZoneInfo | timezone, count: int
) -> list[datetime]:
    cron = parse_cron(expression)
    found: list[datetime] = []
    moment = start
    for _ in range(count):
        moment = cron.next_after(moment, zone)
        found.append(moment)
    return found


# ------------------------------------------------------------ the grammar


@pytest.mark.parametrize(
    ("expression", "start", "expected"),
    [
        ("* * * * *", utc(2024, 1, 1, 0, 0), utc(2024, 1, 1, 0, 1)),
        ("* * * * *", utc(2024, 1, 1, 0, 0, 30), utc(2024, 1, 1, 0, 1)),  # strictly after
        ("15 10 * * *", utc(2024, 1, 1, 10, 15), utc(2024, 1, 2, 10, 15)),
        ("0,30 * * * *", utc(2024, 1, 1, 0, 10), utc(2024, 1, 1, 0, 30)),
        ("10-12 * * * *", utc(2024, 1, 1, 0, 12), utc(2024, 1, 1, 1, 10)),
        ("*/15 * * * *", utc(2024, 1, 1, 0, 46), utc(2024, 1, 1, 1, 0)),
        ("10-40/15 * * * *", utc(2024, 1, 1, 0, 26), utc(2024, 1, 1, 0, 40)),
        ("50/5 * * * *", utc(2024, 1, 1, 0, 56), utc(2024, 1, 1, 1, 50)),  # a/n: a to the end
        ("0 0 1 jan *", utc(2024, 3, 1), utc(2025, 1, 1)),
        ("0 0 1 Jun-aug *", utc(2024, 9, 1), utc(2025, 6, 1)),
        ("0 0 * * Mon", utc(2024, 1, 2), utc(2024, 1, 8)),  # 2024-01-08 is a Monday
        ("0 0 * * sun", utc(2024, 1, 1), utc(2024, 1, 7)),
        ("0 0 * * 0", utc(2024, 1, 1), utc(2024, 1, 7)),
        ("0 0 * * 7", utc(2024, 1, 1), utc(2024, 1, 7)),  # 7 is Sunday too
        ("0 0 * * FRI-SUN", utc(2024, 1, 7, 1), utc(2024, 1, 12)),
        ("0 0 * * 5-7", utc(2024, 1, 7, 1), utc(2024, 1, 12)),
        ("0 0 * * 1/2", utc(2024, 1, 5, 1), utc(2024, 1, 8)),  # Mon, Wed, Fri: not Sunday
        ("0 0 29 2 *", utc(2024, 3, 1), utc(2028, 2, 29)),
        ("0 0 29 2 *", utc(2096, 3, 1), utc(2104, 2, 29)),  # 2100 is no leap year
        ("0 0 31 * *", utc(2024, 4, 1), utc(2024, 5, 31)),  # April has 30 days
        ("0 12 13-13 * *", utc(2024, 1, 1), utc(2024, 1, 13, 12)),  # croniter 7 reads a-a as *
        # 29 February OR a Monday in February (both restricted): the first Monday
        ("0 0 29 2 mon", utc(2024, 3, 1), utc(2025, 2, 3)),
    ],
)
def test_next_after(expression: str, start: datetime, expected: datetime) -> None:
    assert parse_cron(expression).next_after(start, UTC) == expected


@pytest.mark.parametrize(
    ("shorthand", "expanded"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@DAILY", "0 0 * * *"),
    ],
)
def test_shorthands_are_their_five_fields(shorthand: str, expanded: str) -> None:
    start = utc(2023, 7, 19, 13, 47)
    assert ticks(shorthand, start, UTC, 5) == ticks(expanded, start, UTC, 5)


def test_day_of_month_and_day_of_week_both_restricted_match_either() -> None:
    # the 1st and the 15th, and every Friday: Vixie cron's OR
    found = ticks("0 9 1,15 * fri", utc(2024, 2, 29), UTC, 5)
    # 2024-03-01 and 2024-03-15 are Fridays themselves
    assert [t.date().isoformat() for t in found] == [
        "2024-03-01",
        "2024-03-08",
        "2024-03-15",
        "2024-03-22",
        "2024-03-29",
    ]
    # 2024-04-01 is a Monday and 2024-04-15 too: they fire by their day of month
    assert [t.date().isoformat() for t in ticks("0 9 1,15 * fri", utc(2024, 4, 1), UTC, 4)] == [
        "2024-04-01",
        "2024-04-05",
        "2024-04-12",
        "2024-04-15",
    ]


def test_a_star_led_day_field_makes_both_required_as_vixie_cron_does() -> None:
    # '*/2' starts with '*': odd days that are Mondays (AND), as in Vixie cron
    found = ticks("0 0 */2 * 1", utc(2024, 1, 1, 1), UTC, 3)
    assert [t.date().isoformat() for t in found] == ["2024-01-15", "2024-01-29", "2024-02-05"]
    # croniter reads '*/2' as restricted and takes either (2024-01-03 is a Wednesday)
    theirs = croniter("0 0 */2 * 1", utc(2024, 1, 1, 1)).get_next(datetime)
    assert theirs == utc(2024, 1, 3)


def test_latest_at_or_before_is_inclusive() -> None:
    cron = parse_cron("0 * * * *")
    assert cron.latest_at_or_before(utc(2024, 1, 1, 5, 0), UTC) == utc(2024, 1, 1, 5, 0)
    assert cron.latest_at_or_before(utc(2024, 1, 1, 5, 59, 59), UTC) == utc(2024, 1, 1, 5, 0)
    assert parse_cron("0 0 29 2 *").latest_at_or_before(utc(2104, 2, 28), UTC) == utc(2096, 2, 29)


def test_a_far_search_skips_by_field() -> None:
    # 50 ticks of 29 February, two centuries on: 2028 + 49 leap years, and
    # 2100 and 2200 are none
    cron = parse_cron("0 0 29 2 *")
    moment = utc(2025, 1, 1)
    for _ in range(50):
        moment = cron.next_after(moment, UTC)
    assert moment == utc(2232, 2, 29)
    assert cron.latest_at_or_before(utc(2232, 2, 28), UTC) == utc(2228, 2, 29)
    assert cron.latest_at_or_before(utc(2104, 2, 28), UTC) == utc(2096, 2, 29)


# ------------------------------------------------------------ DST, pinned by name


def test_berlin_spring_gap_skips_a_daily_0230_that_day() -> None:
    # 2024-03-31: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist
    found = ticks("30 2 * * *", datetime(2024, 3, 30, 12, tzinfo=BERLIN), BERLIN, 2)
    assert found == [
        datetime(2024, 4, 1, 2, 30, tzinfo=BERLIN),
        datetime(2024, 4, 2, 2, 30, tzinfo=BERLIN),
    ]
    # croniter fires it at the shifted wall time instead
    theirs = croniter("30 2 * * *", datetime(2024, 3, 30, 12, tzinfo=BERLIN)).get_next(datetime)
    assert theirs.replace(tzinfo=None) == datetime(2024, 3, 31, 3, 0)


def test_berlin_autumn_overlap_fires_a_daily_0230_once_at_its_first_occurrence() -> None:
    # 2024-10-27: 03:00 CEST goes back to 02:00 CET; 02:30 happens twice
    found = ticks("30 2 * * *", datetime(2024, 10, 26, 12, tzinfo=BERLIN), BERLIN, 2)
    assert found[0] == utc(2024, 10, 27, 0, 30)  # 02:30 CEST, the first
    assert found[0].astimezone(BERLIN).utcoffset() == timedelta(hours=2)
    assert found[1] == datetime(2024, 10, 28, 2, 30, tzinfo=BERLIN)
    # croniter fires it twice
    it = croniter("30 2 * * *", datetime(2024, 10, 26, 12, tzinfo=BERLIN))
    first, second = it.get_next(datetime), it.get_next(datetime)
    assert first.date() == second.date() == datetime(2024, 10, 27).date()


def test_berlin_overlap_every_half_hour_fires_each_wall_time_once() -> None:
    found = ticks("*/30 * * * *", datetime(2024, 10, 27, 0, 40, tzinfo=BERLIN), BERLIN, 6)
    walls = [t.astimezone(BERLIN).strftime("%H:%M%z") for t in found]
    # 02:00 and 02:30 CEST fire; the repeated 02:00 and 02:30 CET do not; 03:00 CET does
    assert walls == [
        "01:00+0200",
        "01:30+0200",
        "02:00+0200",
        "02:30+0200",
        "03:00+0100",
        "03:30+0100",
    ]
    gaps = [b - a for a, b in itertools.pairwise(found)]
    assert gaps == [timedelta(minutes=30)] * 3 + [timedelta(minutes=90), timedelta(minutes=30)]


def test_berlin_latest_tick_during_the_repeated_hour_is_the_first_occurrence() -> None:
    cron = parse_cron("30 2 * * *")
    # 02:10 CET, the second pass of the repeated hour (01:10 UTC)
    moment = utc(2024, 10, 27, 1, 10)
    assert cron.latest_at_or_before(moment, BERLIN) == utc(2024, 10, 27, 0, 30)
    assert cron.next_after(moment, BERLIN) == datetime(2024, 10, 28, 2, 30, tzinfo=BERLIN)


def test_new_york_spring_gap_skips_a_daily_0230_that_day() -> None:
    # 2024-03-10: 02:00 EST jumps to 03:00 EDT
    found = ticks("30 2 * * *", datetime(2024, 3, 9, 12, tzinfo=NEW_YORK), NEW_YORK, 2)
    assert found == [
        datetime(2024, 3, 11, 2, 30, tzinfo=NEW_YORK),
        datetime(2024, 3, 12, 2, 30, tzinfo=NEW_YORK),
    ]
    assert parse_cron("30 2 * * *").latest_at_or_before(
        datetime(2024, 3, 10, 12, tzinfo=NEW_YORK), NEW_YORK
    ) == datetime(2024, 3, 9, 2, 30, tzinfo=NEW_YORK)


def test_new_york_autumn_overlap_fires_a_daily_0130_once() -> None:
    # 2024-11-03: 02:00 EDT goes back to 01:00 EST; 01:30 happens twice
    found = ticks("30 1 * * *", datetime(2024, 11, 2, 12, tzinfo=NEW_YORK), NEW_YORK, 2)
    assert found[0] == utc(2024, 11, 3, 5, 30)  # 01:30 EDT
    assert found[1] == datetime(2024, 11, 4, 1, 30, tzinfo=NEW_YORK)
    # asked from inside the second pass (01:40 EST), the next is tomorrow's
    assert parse_cron("30 1 * * *").next_after(utc(2024, 11, 3, 6, 40), NEW_YORK) == found[1]


def test_new_york_hourly_in_the_overlap_fires_each_wall_hour_once() -> None:
    found = ticks("0 * * * *", datetime(2024, 11, 3, 0, 30, tzinfo=NEW_YORK), NEW_YORK, 3)
    # 01:00 EDT (05:00 UTC); 01:00 EST (06:00 UTC) does not fire again; then 02:00 EST
    assert found == [utc(2024, 11, 3, 5, 0), utc(2024, 11, 3, 7, 0), utc(2024, 11, 3, 8, 0)]


def test_every_minute_across_the_spring_gap_has_no_tick_in_it() -> None:
    found = ticks("* * * * *", datetime(2024, 3, 10, 1, 58, tzinfo=NEW_YORK), NEW_YORK, 3)
    assert [t.astimezone(NEW_YORK).strftime("%H:%M") for t in found] == ["01:59", "03:00", "03:01"]
    assert [b - a for a, b in itertools.pairwise(found)] == [timedelta(minutes=1)] * 2


# ------------------------------------------------------------ mistakes, named


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("* * * *", "expected five fields"),
        ("* * * * * *", "expected five fields"),
        ("", "expected five fields"),
        ("60 * * * *", "minute field '60': 60 is out of range 0-59"),
        ("* 24 * * *", "hour field '24': 24 is out of range 0-23"),
        ("* * 0 * *", "day-of-month field '0': 0 is out of range 1-31"),
        ("* * 32 * *", "day-of-month field '32'"),
        ("* * * 13 *", "month field '13': 13 is out of range 1-12"),
        ("* * * * 8", "day-of-week field '8': 8 is out of range 0-7"),
        ("* * * FOO *", "month field 'FOO': 'FOO' is not a value (1-12 or a name JAN-DEC)"),
        ("* * * * FUN", "day-of-week field 'FUN': 'FUN' is not a value (0-7 or a name SUN-SAT)"),
        ("* * * * MONDAY", "'MONDAY' is not a value"),
        ("x * * * *", "minute field 'x'"),
        ("5-2 * * * *", "range '5-2' runs backwards"),
        ("*/0 * * * *", "step 0 must be at least 1"),
        ("*/x * * * *", "step 'x' is not a whole number"),
        ("1,,2 * * * *", "an empty list item"),
        ("-1 * * * *", "minute field '-1'"),
        ("@reboot", "unknown shorthand '@reboot'"),
        ("@every 5m", "unknown shorthand"),
        ("0 0 30 2 *", "never fires: day-of-month 30 does not occur in month 2"),
        ("0 0 31 4,6,9,11 *", "never fires"),
        ("0 0 30,31 feb *", "never fires"),
    ],
)
def test_a_bad_expression_is_a_value_error_naming_the_field(expression: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"^cron ") as info:
        parse_cron(expression)
    assert message in str(info.value)


def test_a_never_month_with_a_weekday_still_fires() -> None:
    # 30 February, OR any Monday in February: Vixie's OR makes it fire
    assert parse_cron("0 0 30 2 mon").next_after(utc(2024, 1, 1), UTC) == utc(2024, 2, 5)


def test_a_non_str_expression_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="cron must be a str"):
        parse_cron(5)


@pytest.mark.parametrize("name", ["Mars/Olympus", "", "../etc/passwd", "Europe/"])
def test_an_unknown_zone_is_a_value_error_naming_it(name: str) -> None:
    with pytest.raises(ValueError, match="timezone") as info:
        load_zone(name)
    assert repr(name) in str(info.value) or name == ""


def test_a_zone_that_is_not_a_str_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="IANA zone name"):
        load_zone(None)
