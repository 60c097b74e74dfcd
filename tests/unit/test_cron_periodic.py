"""jaren_jobs.Periodic: validated at construction, frozen, its ticks pure (SPEC §12)."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest

from jaren_jobs import Periodic

UTC = timezone.utc


def test_every_seconds_ticks_are_aligned_to_the_epoch() -> None:
    schedule = Periodic("beat", "tick", every_seconds=60)
    moment = datetime(2024, 5, 5, 10, 0, 30, tzinfo=UTC)
    assert schedule.next_after(moment) == datetime(2024, 5, 5, 10, 1, tzinfo=UTC)
    assert schedule.latest_at_or_before(moment) == datetime(2024, 5, 5, 10, 0, tzinfo=UTC)
    on_tick = datetime(2024, 5, 5, 10, 1, tzinfo=UTC)
    assert schedule.next_after(on_tick) == datetime(2024, 5, 5, 10, 2, tzinfo=UTC)  # strictly
    assert schedule.latest_at_or_before(on_tick) == on_tick
    # any zone, any process: the same instants
    seven = Periodic("seven", "tick", every_seconds=7, timezone="Asia/Kolkata")
    tick = seven.next_after(moment)
    assert (tick - datetime(1970, 1, 1, tzinfo=UTC)) % timedelta(seconds=7) == timedelta(0)
    assert seven.next_after(moment.astimezone(timezone(timedelta(hours=-5)))) == tick


def test_a_fraction_of_a_second_to_the_millisecond() -> None:
    schedule = Periodic("p", "k", every_seconds=1.5)
    moment = datetime(1970, 1, 1, 0, 0, 2, tzinfo=UTC)
    assert schedule.next_after(moment) == datetime(1970, 1, 1, 0, 0, 3, tzinfo=UTC)


def test_cron_ticks_are_read_in_the_schedules_zone_and_given_in_utc() -> None:
    schedule = Periodic("report", "report", cron="0 9 * * mon-fri", timezone="Europe/Berlin")
    tick = schedule.next_after(datetime(2024, 1, 5, 9, 0, tzinfo=UTC))  # a Friday, 10:00 in Berlin
    assert tick == datetime(2024, 1, 8, 8, 0, tzinfo=UTC)  # Monday 09:00 CET
    assert tick.tzinfo is UTC
    assert schedule.job_id(tick) == "periodic:report:1704700800000"


def test_a_naive_moment_is_refused() -> None:
    schedule = Periodic("p", "k", every_seconds=5)
    with pytest.raises(ValueError, match="timezone-aware"):
        schedule.next_after(datetime(2024, 1, 1))
    with pytest.raises(TypeError, match="aware datetime"):
        schedule.next_after("2024-01-01")  # type: ignore[arg-type]


def test_it_is_frozen_and_keeps_a_copy_of_its_payload() -> None:
    payload = {"to": ["ops"]}
    schedule = Periodic("p", "k", every_seconds=5, payload=payload)
    payload["to"].append("everyone")
    assert schedule.payload == {"to": ["ops"]}
    with pytest.raises(dataclasses.FrozenInstanceError):
        schedule.name = "q"  # type: ignore[misc]
    assert schedule == Periodic("p", "k", every_seconds=5, payload={"to": ["ops"]})
    assert "Periodic(name='p'" in repr(schedule)
    assert len({schedule, Periodic("p", "k", every_seconds=5, payload={"to": ["ops"]})}) == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({}, TypeError, "give cron= or every_seconds="),
        ({"cron": "* * * * *", "every_seconds": 5}, ValueError, "not both"),
        ({"cron": "61 * * * *"}, ValueError, r"Periodic\('p'\): cron '61 \* \* \* \*': minute"),
        ({"cron": 5}, TypeError, "cron must be a str"),
        ({"every_seconds": 0}, ValueError, "at least 1 second"),
        ({"every_seconds": 0.5}, ValueError, "at least 1 second"),
        ({"every_seconds": float("inf")}, ValueError, "at least 1 second"),
        ({"every_seconds": 1.0001}, ValueError, "finer than a millisecond"),
        ({"every_seconds": True}, TypeError, "number of seconds"),
        ({"every_seconds": "5"}, TypeError, "number of seconds"),
        ({"every_seconds": 5, "timezone": "Mars/Base"}, ValueError, "'Mars/Base' is not an IANA"),
        ({"cron": "@daily", "timezone": None}, TypeError, "IANA zone name"),
        ({"every_seconds": 5, "queue": ""}, ValueError, "queue must be a non-empty str"),
        ({"every_seconds": 5, "queue": 3}, TypeError, "queue must be a non-empty str"),
        ({"every_seconds": 5, "priority": "high"}, TypeError, "priority"),
        ({"every_seconds": 5, "max_attempts": 0}, ValueError, "max_attempts"),
        ({"every_seconds": 5, "payload": {1, 2}}, TypeError, "payload"),
        ({"every_seconds": 5, "skip_while_unsettled": 1}, TypeError, "skip_while_unsettled"),
    ],
)
def test_mistakes_are_refused_at_construction(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Periodic("p", "k", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "kind", "error", "message"),
    [
        ("", "k", ValueError, "name must be a non-empty str"),
        (None, "k", TypeError, "name must be a non-empty str"),
        ("a\x00b", "k", ValueError, "NUL"),
        ("p", "", ValueError, "kind"),
        ("p", 5, TypeError, "kind"),
    ],
)
def test_a_bad_name_or_kind_is_refused(
    name: object, kind: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Periodic(name, kind, every_seconds=5)  # type: ignore[arg-type]


def test_importing_the_package_does_not_load_zoneinfo() -> None:
    # zoneinfo pulls in sysconfig's platform data; the CLI worker's import check
    # (tests/properties) allows none of it, so it loads with the first zone only
    import os
    import subprocess
    import sys
    from pathlib import Path

    import jaren_jobs

    src = str(Path(jaren_jobs.__file__).resolve().parents[1])
    code = (
        "import sys, jaren_jobs; "
        "assert 'zoneinfo' not in sys.modules and 'sysconfig' not in sys.modules; "
        "jaren_jobs.Periodic('p', 'k', cron='@daily', timezone='Europe/Berlin'); "
        "assert 'zoneinfo' in sys.modules"
    )
    env = {**os.environ, "PYTHONPATH": src}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "zone",
    [
        "localtime",
        "posixrules",
        "Factory",
        "posix/Europe/Paris",
        "right/UTC",
        "../etc/localtime",
        "/usr/share/zoneinfo/UTC",
        "Europe/Paris ",
        "europe/paris",
        "Europe/../UTC",
    ],
)
def test_a_zone_that_is_not_an_iana_name_is_refused(zone: str) -> None:
    # a host-dependent key ('localtime' is each host's own zone) would make hosts in
    # different zones compute different ticks of one schedule (issue 26 item 16)
    with pytest.raises(ValueError, match="is not an IANA time zone name"):
        Periodic("p", "k", cron="@daily", timezone=zone)


@pytest.mark.parametrize(
    "zone", ["UTC", "Europe/Paris", "America/Argentina/Buenos_Aires", "Asia/Kolkata", "Etc/GMT+5"]
)
def test_iana_names_are_accepted(zone: str) -> None:
    assert Periodic("p", "k", cron="@daily", timezone=zone).timezone == zone
