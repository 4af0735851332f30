"""Durations a user writes (a sleep, a start delay, a timeout, a schedule's interval): seconds,
a timedelta or a string like '15m', finite and at most a century, or a clear UsageError. An
infinite one left a timer pending for ever and broke the run's summary (OverflowError)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from keel.core.errors import UsageError
from keel.core.timers import seconds_of, start_time
from keel.runtime.cron import check_timing


@pytest.mark.parametrize(
    ("given", "seconds"),
    [(90, 90.0), ("90s", 90.0), ("15m", 900.0), ("2d", 172800.0), (timedelta(hours=1), 3600.0)],
)
def test_what_a_user_writes_is_read_in_seconds(given: object, seconds: float) -> None:
    assert seconds_of(given) == seconds  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("inf", "longer than a century"),
        ("infs", "longer than a century"),
        ("1e400", "longer than a century"),
        (1e300, "longer than a century"),
        (10**400, "longer than a century"),
        (timedelta(days=99_999), "from 0 to a century"),
        (float("nan"), "not a number"),
        ("nan", "not a number"),
        (-1, "cannot be negative"),
        (-(10**400), "cannot be negative"),  # past float's range: OverflowError before
        ("5x", "not a duration"),
    ],
)
def test_a_duration_that_never_ends_or_is_no_number_is_refused_clearly(
    given: object, said: str
) -> None:
    with pytest.raises(UsageError, match=said):
        seconds_of(given, what="sleep")  # type: ignore[arg-type]
    if not isinstance(given, timedelta):
        with pytest.raises(UsageError):
            start_time(after=given)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "not_before",
    [
        datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC),
        99999999999999,
        float("inf"),
        float("nan"),
        10**400,
        "101 years from now",
    ],
)
def test_a_start_time_past_a_century_is_refused_as_a_delay_is(not_before: object) -> None:
    # It was admitted, and the run never started. (The time from now is computed here, not at
    # collection: pytest-xdist's workers must collect the same parameters.)
    if not_before == "101 years from now":
        not_before = time.time() + 101 * 365 * 86400
    with pytest.raises(UsageError, match="within a century"):
        start_time(not_before=not_before)  # type: ignore[arg-type]


def test_a_start_time_within_a_century_or_past_is_taken() -> None:
    soon = time.time() + 99 * 365 * 86400
    assert start_time(not_before=soon) == (None, soon)
    assert start_time(not_before=0) == (None, 0.0)  # the past: at once


@pytest.mark.parametrize("every", [float("inf"), 1e300, float("nan"), 0.5])
def test_an_interval_schedule_that_would_never_fire_is_refused(every: float) -> None:
    with pytest.raises(UsageError, match="from 1 to a century"):
        check_timing(None, every, "UTC")
