"""Time as something a run waits for: delayed runs and durable sleep (issue 33).

A delayed run is admitted at once, durable and queued, with a not-before time the database
computes at admission (`keel_now() + delay`, or the instant given); the claim does not take it
earlier, and an idle worker's look at what falls due (`next_due`) knows when it comes.

`sleep()` inside a node parks the run on a wait of kind `timer` whose deadline is its wake time:
LangGraph's `interrupt()` with a description of the wait, registered by the executor like every
other wait, so no worker slot is held meanwhile and a crash or a database restart loses nothing.
The sweeper applies the deadline ("wake": the wait ends `expired` with decision `woke`, the run
is queued) once the database's clock has passed it, and the node, re-run from its start,
gets every sleep it already slept back at once: LangGraph matches resume values to a task's
interrupts by their order, so the Nth sleep of a task is the same wait on every replay.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta
from typing import Any

from keel.core.clock import LONGEST, parse_duration
from keel.core.context import current
from keel.core.errors import UsageError
from keel.core.wait_model import WaitKind

Duration = float | int | str | timedelta
"""Seconds, a `timedelta`, or a string such as "90s", "5m", "2h", "1d"."""

WAKE = "wake"
"""The deadline policy of a timer wait: its deadline is its wake time, not a failure."""


def seconds_of(duration: Duration, *, what: str = "a duration") -> float:
    """`duration` in seconds; UsageError if it is negative or not a duration."""
    if isinstance(duration, timedelta):
        seconds = duration.total_seconds()
    elif isinstance(duration, bool) or not isinstance(duration, int | float | str):
        raise UsageError(f"{what} is seconds, a timedelta or a string like '5m', not {duration!r}")
    else:
        try:
            seconds = parse_duration(duration)
        except ValueError as exc:
            raise UsageError(f"{what}: {exc}") from None
    if seconds != seconds or seconds < 0 or seconds > LONGEST:  # a timedelta, checked here
        raise UsageError(f"{what} must be from 0 to a century of seconds, not {duration!r}")
    return float(seconds)


def start_time(
    after: Duration | None = None, not_before: datetime | float | None = None
) -> tuple[float | None, float | None]:
    """`submit(after=..., not_before=...)` as the admission takes it: (delay in seconds from the
    database's now, an absolute epoch time), at most one of them set; (None, None): at once."""
    if after is not None and not_before is not None:
        raise UsageError("give after= or not_before=, not both")
    if after is not None:
        delay = seconds_of(after, what="after")
        return (delay if delay > 0 else None), None
    if not_before is None:
        return None, None
    if isinstance(not_before, datetime):
        if not_before.tzinfo is None:
            raise UsageError(
                "not_before must be a timezone-aware datetime (e.g. datetime.now(timezone.utc)): "
                "a naive one could mean any zone"
            )
        return None, _within_a_century(not_before.timestamp(), not_before)
    if isinstance(not_before, bool) or not isinstance(not_before, int | float):
        raise UsageError(f"not_before is a datetime or epoch seconds, not {not_before!r}")
    try:
        at = float(not_before)
    except OverflowError:  # an int past float's range
        at = math.inf
    return None, _within_a_century(at, not_before)


def _within_a_century(at: float, given: object) -> float:
    """`at` (epoch seconds), refused as `after` is past a century (`LONGEST`) from now: a run
    due later would never start. Judged by this host's clock (the database's is not at hand;
    the two agree within a century)."""
    if not math.isfinite(at) or at - time.time() > LONGEST:
        raise UsageError(f"not_before must be within a century from now, not {given!s:.40}")
    return at


def sleep(duration: Duration) -> None:
    """Sleep durably inside a node: the run parks on a timer wait (no worker held) and wakes
    once the database's clock passes the wake time, across crashes and restarts. The node re-runs
    from its start when the run wakes, so code before this call runs again: keep side effects
    in effects. `sleep(0)` returns at once, without a wait."""
    seconds = seconds_of(duration)
    if seconds == 0:
        return
    ctx = current("keel.sleep()")
    ctx.pause({"keel_wait": timer_spec(seconds)})


async def asleep(duration: Duration) -> None:
    """`sleep()` in an async node (`await keel.asleep("5m")`): the same timer wait."""
    sleep(duration)


def timer_spec(seconds: float) -> dict[str, Any]:
    """The description of a timer wait (as `keel.core.waits.wait_spec`'s, read by `register`)."""
    return {
        "kind": WaitKind.TIMER.value,
        "name": "sleep",
        "payload": {"seconds": seconds},
        "timeout": seconds,
        "on_timeout": WAKE,
        "approvers": [],
        "schedule": [],
    }
