"""The database fails the statement that records an outcome, as a dropped connection would.

SQLite's connector fails the next statement it sends once `keel.core.faults` is armed (what the
fault harness's `!fail-next-statement` does), so these are SQLite-only."""

from __future__ import annotations

from typing import Any

import keel
from keel.core import faults


def records_fail(app: keel.App, method: str, status: str, times: int) -> dict[str, int]:
    """Fail the statement of the app store's next `times` calls of `method` (record_effect,
    settle_intent, settle_notification, ...) that record `status`. Returns the failures left:
    `{"times": 0}` once each has been taken."""
    store = app.aio.runtime.services.store
    record = getattr(store, method)
    left = {"times": times}

    async def failing(*args: Any, **kw: Any) -> Any:
        if kw["status"] == status and left["times"]:
            left["times"] -= 1
            faults._fail_next_statement = True
        return await record(*args, **kw)

    setattr(store, method, failing)
    return left
