"""A schedule's timing: cron expressions in a timezone (croniter), or an interval.

Cron expressions have 5 fields (minute hour day month weekday) or 6, the first then being the
second (`*/10 * * * * *`: every ten seconds), as in Quartz, Spring and node-cron. Ticks are
computed in the schedule's timezone (daylight saving time included) and kept as epoch seconds.

Daylight saving time, as Vixie cron and cronie do it: a wall-clock time the spring change skips
(02:30 on the night 02:00 becomes 03:00) fires once, at the change; a wall-clock time the autumn
change repeats (02:30 twice, the clocks going back from 03:00 to 02:00) fires once, the first
time, unless the expression's hour field is `*` (every hour: each real hour is its own tick).
"""

from __future__ import annotations

import copy
import datetime
import functools
import zoneinfo
from dataclasses import dataclass

from croniter import CroniterBadCronError, CroniterBadDateError, croniter

from keel.core.clock import LONGEST
from keel.core.errors import UsageError
from keel.core.schedules import Timing, interval_ticks
from keel.core.store.base import Row


def check_timezone(name: str) -> zoneinfo.ZoneInfo:
    try:
        return zoneinfo.ZoneInfo(name)
    # OSError: a name that is a folder of the tz database ("America") or past a file name's
    # length, which zoneinfo tries to open as a file.
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise UsageError(
            f"unknown timezone {name!r} (use an IANA name: UTC, Europe/Paris)"
        ) from None


def check_cron(expression: str) -> str:
    """A valid 5- or 6-field cron expression, normalized to single spaces."""
    fields = expression.split() if isinstance(expression, str) else []
    if len(fields) not in (5, 6):
        raise UsageError(
            f"cron {expression!r} needs 5 fields (minute hour day month weekday) or 6 (second "
            "first)"
        )
    text = " ".join(fields)
    if not croniter.is_valid(text, second_at_beginning=len(fields) == 6):
        raise UsageError(f"cron {expression!r} is not a valid cron expression")
    try:  # valid syntax may name no date at all (February 30th): it would never fire
        _first_tick(text)
    except (CroniterBadDateError, CroniterBadCronError, ValueError):
        raise UsageError(f"cron {expression!r} names no date that exists: it never fires") from None
    return text


def _first_tick(text: str) -> float:
    """The expression's next tick in UTC (CroniterBadDateError if no date matches it)."""
    itr = croniter(
        text, datetime.datetime.now(datetime.UTC), second_at_beginning=len(text.split()) == 6
    )
    return float(itr.get_next(float))


def check_timing(
    cron: str | None, every: float | None, timezone: str
) -> tuple[str | None, float | None]:
    """Exactly one of a cron expression and an interval, both checked."""
    if (cron is None) == (every is None):
        raise UsageError("a schedule takes either cron= or every= (seconds), not both or neither")
    check_timezone(timezone)
    if cron is not None:
        return check_cron(cron), None
    assert every is not None
    if isinstance(every, bool) or not isinstance(every, int | float) or not 1 <= every <= LONGEST:
        raise UsageError(
            f"every must be a number of seconds, from 1 to a century, not {str(every)[:24]}"
        )
    return None, float(every)


_REPEATS = 3600
"""At most this many ticks of a repeated hour are passed over (one a second, for an hour)."""


@dataclass(frozen=True)
class CronTiming:
    expression: str
    zone: zoneinfo.ZoneInfo

    def _at(self, t: float) -> croniter:
        # A copy of the parsed expression, moved to `t`: parsing it again took most of a due
        # tick's computation (~0.4 ms of croniter's expansion per tick).
        itr = copy.copy(_parsed(self.expression, self.zone))
        itr.set_current(datetime.datetime.fromtimestamp(t, self.zone), force=True)
        return itr

    def after(self, t: float) -> float:
        tick = float(self._at(t).get_next(float))
        for _ in range(_REPEATS):
            if not self._repeated(tick):
                break
            tick = float(self._at(tick).get_next(float))
        return tick

    def before(self, t: float) -> float:
        tick = float(self._at(t).get_prev(float))
        for _ in range(_REPEATS):
            if not self._repeated(tick):
                break
            tick = float(self._at(tick).get_prev(float))
        return tick

    def _repeated(self, tick: float) -> bool:
        """Whether `tick` is the second pass of a wall-clock time the autumn change repeats,
        for an expression that names its hours (already fired an hour earlier)."""
        fields = self.expression.split()
        if fields[-4].startswith("*"):  # the hour field (5 or 6 fields): `*`, `*/1`, `*/2`
            return False
        local = datetime.datetime.fromtimestamp(tick, self.zone)
        return local.fold == 1 and local.replace(fold=0).timestamp() != tick


@functools.lru_cache(maxsize=1024)
def _parsed(expression: str, zone: zoneinfo.ZoneInfo) -> croniter:
    """The expression parsed once (never iterated itself: `CronTiming` iterates copies)."""
    start = datetime.datetime.fromtimestamp(0, zone)
    return croniter(expression, start, second_at_beginning=len(expression.split()) == 6)


def timing(cron: str | None, every: float | None, timezone: str, anchor: float) -> Timing:
    """The ticks of a cron expression in `timezone`, or of an interval from `anchor`."""
    if cron is not None:
        return CronTiming(cron, check_timezone(timezone))
    assert every is not None
    return interval_ticks(float(every), anchor)


def timing_of(row: Row) -> Timing:
    """A schedule row's timing (an interval counts from its next tick)."""
    return timing(row["cron"], row["every_seconds"], str(row["timezone"]), float(row["next_tick"]))
