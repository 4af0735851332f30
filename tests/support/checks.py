"""Waiting for a condition, and what a run's timeline must show."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import keel


def wait_until(predicate: Callable[[], Any], timeout: float, what: str | Callable[[], str]) -> Any:
    """Poll `predicate` until it returns something truthy (returned); fail after `timeout`,
    saying `what` (called then, if a function: logs as they were when it failed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    said = what() if callable(what) else what
    raise AssertionError(f"timed out after {timeout}s waiting for {said}")


def event_kinds(app: keel.App, run_id: str) -> list[str]:
    return [e["kind"] for e in app.get_run(run_id).timeline]


def assert_single_owner(timeline: list[dict[str, Any]]) -> None:
    """No run was executed by two workers at once: once a newer lease token wrote, no older
    token writes again (events are in commit order of their ids)."""
    highest = 0
    for event in timeline:
        token = event["lease_token"]
        if token is None:
            continue
        assert token >= highest, f"token {token} wrote after token {highest}: {event}"
        highest = token
