"""A wait's notification payload has one rule (keel.core.notifications.notification_payload):
SQLite's queries call that very function; PostgreSQL's `keel_notification` (migration 0020)
is its twin in SQL, compared with it here on values that tell them apart if they drift."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from keel.core.codec import dumps
from keel.core.notifications import notification_payload

CASES: list[tuple[Any, ...]] = [
    ("job-1", "review", "w-1", "approval", "manager", None, [], None, {"stage": 0}),
    (
        "ticket 4711",
        "support-ticket",
        "w-abc",
        "interrupt",
        "interrupt",
        {"to": "a@x", "n": 3, "ratio": 0.1, "nested": [1, {"é": "ü"}], "none": None},
        ["alice", "bob"],
        1_790_000_000.125,
        {"stage": 0, "decision": "approved", "by": "ed", "comment": 'say "hi"\n', "x": None},
    ),
    ("j", "w", "w-2", "effect", "charge", "a plain string", ["ops"], 0.0, {"stage": 2}),
]


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)])
@pytest.mark.parametrize("case", CASES, ids=["plain", "rich", "string"])
def test_postgres_builds_the_payload_by_the_python_rule(db_url: str, case: tuple[Any, ...]) -> None:
    job, workflow, wait_id, kind, name, payload, approvers, deadline, details = case
    args = (job, workflow, wait_id, kind, name, dumps(payload), dumps(approvers), deadline)
    with psycopg.connect(db_url) as conn:
        [(built,)] = conn.execute(
            "SELECT keel_notification(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (*args, dumps(details)),
        ).fetchall()
    expected = json.loads(notification_payload(*args, dumps(details)))
    assert json.loads(built) == expected
    assert expected["wait"]["payload"] == payload and expected["details"] == details
