"""Our cron against croniter's, over random expressions and instants (issue 16).

croniter is a test-only oracle (jaren_jobs parses cron itself). The two agree
wherever their rules are the same: random five-field expressions, in UTC and
in zones, at instants whose answer is not separated from them by a change of
the zone's offset (where DST differs on purpose: tests/unit/test_cron.py pins
those cases by name). The day-of-month and day-of-week fields are drawn as
``*`` or forms not starting with ``*``: a ``*/n`` day field is where Vixie
cron (which we follow) and croniter disagree, pinned there too; so is a
one-value range ``a-a``, which croniter 7 reads as ``*``.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from croniter import croniter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from jaren_jobs.cron import load_zone, parse_cron

# the loaded Hypothesis profile's count (tests/conftest.py: 25 by default, 100 with
# HYPOTHESIS_PROFILE=ci, as .ci/run sets), three times over for the comparisons with croniter
BASE_EXAMPLES = settings().max_examples
EXAMPLES = 3 * BASE_EXAMPLES

ZONES = [
    "UTC",
    "Asia/Tokyo",
    "Asia/Kolkata",
    "America/Phoenix",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Sydney",
]


def _field(
    low: int, high: int, *, star_steps: bool, names: list[str] | None = None
) -> st.SearchStrategy[str]:
    value = st.integers(low, high)

    def one_value(n: int) -> str:
        return str(n)

    plain = value.map(one_value)
    if names:
        plain = st.one_of(
            plain, st.sampled_from(names).map(lambda n: n.lower()), st.sampled_from(names)
        )

    @st.composite
    def a_range(draw: st.DrawFn) -> str:
        # a one-value range a-a is left out: croniter 7 reads it as '*'
        # (test_cron.py pins ours)
        a = draw(st.integers(low, high - 1))
        b = draw(st.integers(a + 1, high))
        step = draw(st.none() | st.integers(1, max(1, high - low)))
        return f"{a}-{b}" + ("" if step is None else f"/{step}")

    @st.composite
    def a_start_step(draw: st.DrawFn) -> str:  # a/n: from a to the field's end
        return f"{draw(value)}/{draw(st.integers(1, max(1, high - low)))}"

    item = st.one_of(plain, a_range(), a_start_step())
    listed = st.lists(item, min_size=1, max_size=4).map(",".join)
    choices = [st.just("*"), listed]
    if star_steps:
        choices.append(st.integers(1, high - low + 1).map(lambda n: f"*/{n}"))
    return st.one_of(*choices)


MONTH_NAMES = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
DAY_NAMES = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]


@st.composite
def expressions(draw: st.DrawFn) -> str:
    minute = draw(_field(0, 59, star_steps=True))
    hour = draw(_field(0, 23, star_steps=True))
    day = draw(_field(1, 31, star_steps=False))
    month = draw(_field(1, 12, star_steps=True, names=MONTH_NAMES))
    weekday = draw(_field(0, 6, star_steps=False, names=DAY_NAMES))
    expression = f"{minute} {hour} {day} {month} {weekday}"
    refusal = None
    try:
        parse_cron(expression)
    except ValueError as exc:
        refusal = str(exc)
    # 30 February and the like are refused by us (croniter searches on); nothing else is
    assert refusal is None or "never fires" in refusal, refusal
    assume(refusal is None)
    return expression


instants = st.datetimes(
    min_value=datetime(1990, 1, 1), max_value=datetime(2060, 1, 1), timezones=st.just(timezone.utc)
).map(lambda d: d.replace(microsecond=0))


def _offset_constant(zone: ZoneInfo, a: datetime, b: datetime) -> bool:
    """No change of the zone's offset between two instants (sampled twice a day)."""
    first = a.astimezone(zone).utcoffset()
    t = a
    while t < b:
        if t.astimezone(zone).utcoffset() != first:
            return False
        t += timedelta(hours=12)
    return b.astimezone(zone).utcoffset() == first


PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)


@PROPERTY
@given(expression=expressions(), moment=instants, zone_name=st.sampled_from(ZONES))
def test_next_after_equals_croniters(expression: str, moment: datetime, zone_name: str) -> None:
    zone = load_zone(zone_name)
    assert isinstance(zone, ZoneInfo)
    ours = parse_cron(expression).next_after(moment, zone)
    theirs = croniter(expression, moment.astimezone(zone)).get_next(datetime)
    later = max(ours, theirs)
    if (later - moment) > timedelta(days=200) or not _offset_constant(zone, moment, later):
        # far answers (rare days) are compared in UTC below; a DST change
        # in between is where the rules differ on purpose
        return
    assert ours == theirs, (expression, moment, zone_name)
    assert ours > moment
    assert ours.astimezone(zone).utcoffset() == theirs.utcoffset()


@PROPERTY
@given(expression=expressions(), moment=instants)
def test_next_after_equals_croniters_in_utc_however_far(expression: str, moment: datetime) -> None:
    ours = parse_cron(expression).next_after(moment, timezone.utc)
    theirs = croniter(expression, moment).get_next(datetime)
    assert ours == theirs, (expression, moment)


@settings(PROPERTY, max_examples=EXAMPLES)
@given(
    expression=expressions(),
    moment=instants.map(lambda d: d.replace(second=max(d.second, 1))),
    zone_name=st.sampled_from(ZONES),
)
def test_latest_at_or_before_equals_croniters_previous(
    expression: str, moment: datetime, zone_name: str
) -> None:
    # a moment with seconds never sits on a tick, so "at or before" is "before"
    zone = load_zone(zone_name)
    assert isinstance(zone, ZoneInfo)
    ours = parse_cron(expression).latest_at_or_before(moment, zone)
    theirs = croniter(expression, moment.astimezone(zone)).get_prev(datetime)
    earlier = min(ours, theirs)
    if zone_name != "UTC" and (
        (moment - earlier) > timedelta(days=200) or not _offset_constant(zone, earlier, moment)
    ):
        return
    assert ours == theirs, (expression, moment, zone_name)
    assert ours <= moment


@settings(PROPERTY, max_examples=BASE_EXAMPLES)
@given(expression=expressions(), moment=instants, zone_name=st.sampled_from(ZONES))
def test_latest_tick_is_the_one_before_the_next(
    expression: str, moment: datetime, zone_name: str
) -> None:
    """No oracle needed: the latest tick at or before t, and the next after it, bracket t."""
    cron = parse_cron(expression)
    zone = load_zone(zone_name)
    latest = cron.latest_at_or_before(moment, zone)
    following = cron.next_after(latest, zone)
    assert latest <= moment < following
    assert cron.next_after(moment, zone) == following
