"""Entry point of the decider processes in test_decisions (spawned: each its own interpreter)."""

from __future__ import annotations

from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any

import keel


def decide(
    db_url: str, run_id: str, approve: bool, by: str, start: Barrier, out: Queue[Any]
) -> None:
    """Build an App on the database, wait for every decider, then decide once and report."""
    with keel.App(db_url) as app:
        app.list_runs(limit=1)  # connected before the starting line, so all fire together
        start.wait(timeout=60)
        try:
            decide_fn = app.approve if approve else app.reject
            result = decide_fn(run_id, by=by, action_id=f"click-{by}", channel="slack")
            out.put((by, result.recorded, result.decision, result.wait["decided_by"]))
        except Exception as exc:  # reported, so the test shows it instead of a silent exit
            out.put((by, "error", repr(exc), None))
