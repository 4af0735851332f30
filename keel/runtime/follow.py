"""Following a run's timeline by cursor: what `GET /v1/runs/{id}/events` and `keel runs watch`
both do, written once.

Event ids grow in commit order for each run on both backends (see the `events_after` query), so
"every event with an id above the last one seen" is a cursor that resumes without gaps or
repeats. A run is done being followed once it has finished and every event up to its final
status was read: the status change and its event commit together, so one more read after
seeing the finished status catches everything.
"""

from __future__ import annotations

from typing import Any

from keel.core.lifecycle import FINISHED, Status
from keel.core.store.base import Row
from keel.runtime.app import App

PAGE = 500


class Cursor:
    """`poll()` returns the next events and whether the run is over (blocking; call it from a
    thread on an event loop)."""

    def __init__(self, app: App, run_id: str, after: int = 0) -> None:
        self.app = app
        self.run_id = run_id
        self.after = after
        self.status = app.run_status(run_id)  # RunNotFound for an unknown run

    def poll(self) -> tuple[list[Row], bool]:
        rows = self._read()
        if rows:
            return rows, False
        self.status = self.app.run_status(self.run_id)
        if Status(self.status) in FINISHED:
            return self._read(), True
        return [], False

    def _read(self) -> list[Row]:
        rows = self.app.events_after(self.run_id, self.after, PAGE)
        if rows:
            self.after = int(rows[-1]["event_id"])
        return rows


def event_json(row: Row) -> dict[str, Any]:
    """An event as the stream and `keel runs watch --json` show it."""
    keys = ("event_id", "run_id", "at", "kind", "worker_id", "lease_token", "data")
    return {k: row[k] for k in keys}
