"""The store tier's own guard: every status move a test's database recorded on a run's
timeline is one the lifecycle table allows.

The statements that write a run's status record each move as an event whose data holds
`from` and `to` (`status.*`, `lease.claimed`, `lease.takeover`), in the same transaction as
the move. After each test that had a database (`db_url`), its timeline is read back and the
test fails on a forbidden move, or on a move that does not start where the run's previous
one ended (a status changed without its event): whatever path wrote it, SQL or Python.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from keel.core.lifecycle import ADMITTED, allowed

_EVENTS = "SELECT event_id, run_id, kind, data FROM keel_events ORDER BY event_id"


def recorded_events(url: str) -> list[tuple[Any, ...]]:
    """(event_id, run_id, kind, data) of every event in the database, in order."""
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            return list(conn.execute(_EVENTS))
        except sqlite3.OperationalError:  # a test that dropped or never migrated its tables
            return []
        finally:
            conn.close()
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as pg:
        try:
            return list(pg.execute(_EVENTS))
        except psycopg.errors.UndefinedTable:
            return []


def forbidden_moves(events: list[tuple[Any, ...]]) -> list[str]:
    """The recorded moves the lifecycle table forbids, and moves that start from a status
    the run's timeline never reached, one line each."""
    found = []
    status: dict[str, str] = {}
    for event_id, run_id, kind, raw in events:
        data = json.loads(raw) if isinstance(raw, str) else raw
        if kind == "admitted":
            status[run_id] = ADMITTED.value
            continue
        if not isinstance(data, dict) or "from" not in data or "to" not in data:
            continue
        src, dst = str(data["from"]), str(data["to"])
        where = f"event {event_id} ({kind}) of run {run_id}"
        if not allowed(src, dst):
            found.append(f"{where}: {src}>{dst}, which the lifecycle table forbids")
        elif run_id in status and status[run_id] != src:
            found.append(f"{where}: {src}>{dst}, but the run was {status[run_id]}")
        status[run_id] = dst
    return found


@pytest.fixture(autouse=True)
def recorded_moves_are_allowed(request: pytest.FixtureRequest) -> Iterator[None]:
    if "db_url" not in request.fixturenames:
        yield
        return
    # Requested here, the database outlives this fixture: it is read before it is dropped.
    url = request.getfixturevalue("db_url")
    yield
    bad = forbidden_moves(recorded_events(url))
    if bad:
        pytest.fail(
            "a run's timeline records moves the lifecycle table forbids:\n" + "\n".join(bad)
        )
