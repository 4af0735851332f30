"""A cron schedule's ticks across daylight saving time changes, in the schedule's timezone:
a wall-clock time the spring change skips fires once (at the change), a wall-clock time the
autumn change repeats fires once (the first time) unless the hour field starts with `*`; an
expression that names no existing date is refused."""

from __future__ import annotations

import datetime
import zoneinfo

import pytest

from keel.core.errors import UsageError
from keel.runtime.cron import CronTiming, check_cron

PARIS = zoneinfo.ZoneInfo("Europe/Paris")
NEW_YORK = zoneinfo.ZoneInfo("America/New_York")


def ticks(expression: str, zone: zoneinfo.ZoneInfo, start: datetime.datetime, n: int) -> list[str]:
    timing = CronTiming(expression, zone)
    t, out = start.timestamp(), []
    for _ in range(n):
        t = timing.after(t)
        out.append(datetime.datetime.fromtimestamp(t, zone).isoformat())
    return out


@pytest.mark.parametrize("expression", ["30 2 * * *", "0 30 2 * * *"])
def test_a_daily_time_the_autumn_change_repeats_fires_once(expression: str) -> None:
    start = datetime.datetime(2026, 10, 24, 12, 0, tzinfo=PARIS)
    assert ticks(expression, PARIS, start, 3) == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
        "2026-10-27T02:30:00+01:00",
    ]


def test_a_daily_time_the_spring_change_skips_fires_once_at_the_change() -> None:
    start = datetime.datetime(2026, 3, 28, 12, 0, tzinfo=PARIS)
    assert ticks("30 2 * * *", PARIS, start, 3) == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]


@pytest.mark.parametrize("expression", ["30 * * * *", "30 */1 * * *"])
def test_an_hourly_schedule_fires_every_real_hour_of_the_autumn_night(expression: str) -> None:
    """`*/1` is hourly too: an hour field starting with `*` is a wildcard (Vixie cron)."""
    start = datetime.datetime(2026, 11, 1, 0, 0, tzinfo=NEW_YORK)
    assert ticks(expression, NEW_YORK, start, 4) == [
        "2026-11-01T00:30:00-04:00",
        "2026-11-01T01:30:00-04:00",
        "2026-11-01T01:30:00-05:00",
        "2026-11-01T02:30:00-05:00",
    ]


def test_the_latest_tick_before_skips_the_repeat_too() -> None:
    timing = CronTiming("30 1 * * *", NEW_YORK)
    after_the_night = datetime.datetime(2026, 11, 1, 3, 0, tzinfo=NEW_YORK).timestamp()
    latest = datetime.datetime.fromtimestamp(timing.before(after_the_night), NEW_YORK)
    assert latest.isoformat() == "2026-11-01T01:30:00-04:00"


@pytest.mark.parametrize("expression", ["0 0 30 2 *", "0 0 31 4 *", "0 0 0 31 11 *"])
def test_an_expression_that_names_no_existing_date_is_refused(expression: str) -> None:
    """Valid syntax, no date: it would never fire, and a declared one stopped every schedule of
    the worker that declared it (its first pass failed, and every pass after)."""
    with pytest.raises(UsageError, match="names no date that exists"):
        check_cron(expression)
    assert check_cron("0 0 29 2 *") == "0 0 29 2 *"  # a leap day exists
