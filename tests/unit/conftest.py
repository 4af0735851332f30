"""The database-free tier: Keel's rules on SQLite `:memory:`, driven by hand
(tests/support/by_hand.py). No server, no file, no worker, no graph executed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import keel
from tests.support.by_hand import memory_app


@pytest.fixture
def clock() -> keel.ManualClock:
    return keel.ManualClock()


@pytest.fixture
def app(clock: keel.ManualClock) -> Iterator[keel.App]:
    """A migrated app on an in-memory database, on the test's ManualClock."""
    made = memory_app(clock)
    try:
        yield made
    finally:
        made.close()
