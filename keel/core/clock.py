"""Time, injectable: lease and deadline tests move a ManualClock instead of sleeping.

Leases, claims and deadlines are judged by the database's clock, in the SQL (`keel_now()`), never
by this one. A worker's own clock only paces it (heartbeats, polls) and is compared with the
database's at start. A `ManualClock` is the exception made for tests: it *drives* the database's
clock for its own connections (`drives_database`), so moving it moves `keel_now()` too.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

from keel.core.errors import ClockSkew

OFFSET_ENV = "KEEL_CLOCK_OFFSET"
MAX_SKEW_ENV = "KEEL_MAX_CLOCK_SKEW"
DEFAULT_MAX_SKEW = 300.0
"""Five minutes, Kerberos's tolerance: beyond it a host's time sync is broken, not drifting."""


LIVENESS_MARGIN = 0.5
"""The share of a lease's (or a claim's) seconds left within which an answer "still yours" may be
acted upon, counted from before the question was sent; the rest is slack for clock rates and
scheduling. A later answer says nothing: a partition that held it may have let the lease lapse
and another owner act (DESIGN promise 14)."""


def live_within(left: float, asked_at: float) -> bool:
    """Whether an answer "held, `left` seconds to go" may still be acted upon: the monotonic time
    since `asked_at` (read before the question was sent) is within the margin of `left`."""
    return time.monotonic() - asked_at < left * LIVENESS_MARGIN


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The host's clock, shifted by `offset` seconds (default: `$KEEL_CLOCK_OFFSET`, e.g. `10`,
    `-2h`): the offset stands in for a host whose clock is wrong, in tests of clock skew."""

    def __init__(self, offset: float | None = None) -> None:
        self.offset = offset if offset is not None else parse_offset(os.environ.get(OFFSET_ENV))

    def now(self) -> float:
        return time.time() + self.offset

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class ManualClock:
    """A clock that only moves when told to; `sleep` advances it instead of waiting. It drives
    the database's clock on the connections of the app that uses it."""

    drives_database = True

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    async def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)


LONGEST = 100 * 365 * 86400.0
"""The longest duration anything waits (a century): past it, a wait would never end, and
adding it to a timestamp leaves the range of dates (a summary's "in 3 years" overflows)."""


def parse_duration(value: float | int | str) -> float:
    """`90`, `"90s"`, `"15m"`, `"24h"`, `"2d"` -> seconds (finite, from 0 to `LONGEST`)."""
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an int past float's range, either way
            seconds = math.inf if value > 0 else -math.inf
    else:
        text = value.strip().lower()
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        number, unit = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1)
        try:
            seconds = float(number) * unit
        except ValueError:
            raise ValueError(
                f"not a duration: {value!r} (use e.g. 90, '15m', '24h', '2d')"
            ) from None
    if seconds != seconds:
        raise ValueError(f"not a duration: {value!r} (not a number)")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    if seconds > LONGEST:
        shown = repr(value) if len(repr(value)) <= 24 else repr(value)[:20] + "..."
        raise ValueError(f"a duration of {shown} is longer than a century: it would never end")
    return seconds


def database_override(clock: Clock) -> Callable[[], float] | None:
    """What the database's clock should read on this app's connections: a test clock's `now`,
    or None for the database's own clock (every clock that does not say `drives_database`)."""
    return clock.now if getattr(clock, "drives_database", False) else None


def parse_offset(value: str | None) -> float:
    """`None`/`""` -> 0; `"10"`, `"2.5"`, `"-2h"`, `"+90s"` -> signed seconds."""
    text = (value or "").strip()
    if not text:
        return 0.0
    sign = -1.0 if text.startswith("-") else 1.0
    try:
        return sign * parse_duration(text.lstrip("+-"))
    except ValueError:
        raise ValueError(
            f"{OFFSET_ENV}={value!r} is not a signed duration (e.g. 10, -2h)"
        ) from None


def judge_skew(skew: float, *, lease_ttl: float, limit: float) -> str | None:
    """The verdict on a worker clock `skew` seconds ahead of the database's (negative: behind).

    Leases and deadlines never depend on it (the database's clock judges them), but a host this
    far off logs, signs and schedules with a wrong time: past a third of the lease TTL it is a
    warning (returned), past `limit` (0: no limit) it is ClockSkew (raised).
    """
    ahead = f"{abs(skew):.3f} s {'ahead of' if skew >= 0 else 'behind'} the database's"
    if limit > 0 and abs(skew) > limit:
        raise ClockSkew(
            f"this host's clock is {ahead} (limit {limit:g} s: --max-clock-skew or "
            f"${MAX_SKEW_ENV}): fix its time sync (NTP) before starting a worker here"
        )
    if abs(skew) > lease_ttl / 3:
        return f"this host's clock is {ahead}, more than a third of the lease TTL ({lease_ttl:g} s)"
    return None
