"""How much work SQLite did for one query, counted without a clock: its virtual machine's
steps, in hundreds (a progress handler called every 100 steps). A plan that walks every run
shows as a count that grows with the runs; one that reads an index's front stays small."""

from __future__ import annotations

import sqlite3
import time
from typing import Any


def vm_steps(db_url: str, sql: str, params: Any) -> tuple[int, list[Any]]:
    """SQLite virtual-machine steps (in hundreds) of `sql` on the database, and its rows."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    with sqlite3.connect(db_url.removeprefix("sqlite:///")) as db:
        db.create_function("keel_now", 0, time.time)
        db.set_progress_handler(count, 100)
        found = db.execute(sql, params).fetchall()
    return steps, found
