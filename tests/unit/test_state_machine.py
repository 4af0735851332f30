"""The SQL commands are the state machine: every statement that writes `keel_runs.status`
declares its moves in its `-- moves:` header, and the headers agree with the lifecycle table.

The writers are found by their SQL text (an UPDATE of keel_runs that sets `status`, or an
INSERT INTO keel_runs), so a new writer without a header fails here, as does a header that
declares a move the table forbids.
"""

from __future__ import annotations

import re

import pytest

from keel.core.lifecycle import NEW, TRANSITIONS, allowed
from keel.core.store.base import Move, parse_moves, parse_queries, queries_text

DIALECTS = ("sqlite", "postgres")

# One statement's UPDATE of keel_runs: up to the end of the statement (`;`, a chain's), its
# RETURNING, or the next write (a CTE's next statement).
_UPDATE = re.compile(
    r"\bUPDATE\s+keel_runs\b(?P<body>.*?)(?=;|\bRETURNING\b|\bUPDATE\b|\bINSERT\b|\bDELETE\b|$)",
    re.IGNORECASE | re.DOTALL,
)
# `status = ...` as an assignment of SET (first, or after a comma), not a comparison.
_SETS_STATUS = re.compile(r"(?:\bSET\b|,)\s*status\s*=", re.IGNORECASE)
_INSERT = re.compile(r"\bINSERT\s+INTO\s+keel_runs\b", re.IGNORECASE)


def writes_status(sql: str) -> bool:
    """Whether a statement (or chain) writes a run's status, judged from its text."""
    if _INSERT.search(sql):
        return True
    return any(_SETS_STATUS.search(m["body"]) for m in _UPDATE.finditer(sql))


def problems(text: str) -> list[str]:
    """What is wrong with one dialect's queries.sql against the lifecycle table."""
    queries, declared = parse_queries(text), parse_moves(text)
    found = []
    writers = {name for name, sql in queries.items() if writes_status(sql)}
    for name in sorted(writers - declared.keys()):
        found.append(f"{name} writes keel_runs.status without a `-- moves:` header")
    for name in sorted(declared.keys() - writers):
        found.append(f"{name} declares moves but writes no status")
    for name, moves in sorted(declared.items()):
        for src, dst in sorted(moves):
            if not allowed(src, dst):
                found.append(f"{name} declares {src}>{dst}, which the lifecycle table forbids")
    made = frozenset().union(*declared.values()) if declared else frozenset()
    for src, dst in sorted(table_moves() - made):
        found.append(f"the table allows {src}>{dst}, but no statement makes it")
    return found


def table_moves() -> frozenset[Move]:
    moves = {(str(src.value), str(dst.value)) for src, dsts in TRANSITIONS.items() for dst in dsts}
    return frozenset(moves | {(NEW, "queued")})


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_status_writer_declares_moves_the_table_allows(dialect: str) -> None:
    assert problems(queries_text(dialect)) == []


def test_both_dialects_declare_the_same_moves() -> None:
    sqlite, postgres = (parse_moves(queries_text(d)) for d in DIALECTS)
    assert sqlite == postgres


def test_the_writers_are_the_ones_runs_py_names() -> None:
    # keel/core/runs.py's docstring names them: a new writer is named there too.
    import keel.core.runs

    for name in parse_moves(queries_text("sqlite")):
        assert f"`{name}`" in (keel.core.runs.__doc__ or ""), name


# -- the check itself fails on a wrong header ----------------------------------------------------


def _doctored(old: str, new: str) -> str:
    text = queries_text("sqlite")
    assert text.count(old) == 1, old
    return text.replace(old, new)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        # A move the table forbids (a waiting run cannot complete without running again).
        (
            "-- name: decide\n-- moves: waiting>queued\n",
            "-- name: decide\n-- moves: waiting>queued, waiting>completed\n",
            "decide declares waiting>completed, which the lifecycle table forbids",
        ),
        # A writer whose header was lost.
        (
            "-- name: decide\n-- moves: waiting>queued\n",
            "-- name: decide\n",
            "decide writes keel_runs.status without a `-- moves:` header",
        ),
        # A move the table allows that no statement makes any more.
        (
            "-- moves: running>waiting, running>queued, running>cancelled\n",
            "-- moves: running>queued, running>cancelled\n",
            "the table allows running>waiting, but no statement makes it",
        ),
        # An admission that would not start queued.
        (
            "-- name: insert_run\n-- moves: new>queued\n",
            "-- name: insert_run\n-- moves: new>running\n",
            "insert_run declares new>running, which the lifecycle table forbids",
        ),
    ],
)
def test_a_wrong_header_is_caught(old: str, new: str, expected: str) -> None:
    assert expected in problems(_doctored(old, new))


def test_a_new_writer_without_a_header_is_caught() -> None:
    text = queries_text("sqlite") + (
        "\n-- name: sneaky\n-- Not declared.\n"
        "UPDATE keel_runs SET updated_at = keel_now(), status = 'queued' WHERE run_id = :run_id;\n"
    )
    assert "sneaky writes keel_runs.status without a `-- moves:` header" in problems(text)


def test_a_comparison_is_not_a_write() -> None:
    assert not writes_status("UPDATE keel_runs SET cancel_requested = 1 WHERE status = 'running'")
    assert writes_status("UPDATE keel_runs AS r SET decision = 'x', status = 'queued'")


# -- the store tier's guard (tests/store/conftest.py) fails on a forbidden move -----------------


def test_the_store_guard_flags_a_forbidden_move() -> None:
    from tests.store.conftest import forbidden_moves

    events = [
        (1, "r", "admitted", "{}"),
        (2, "r", "lease.claimed", '{"from": "queued", "to": "running"}'),
        (3, "r", "status.waiting", '{"from": "running", "to": "waiting"}'),
        (4, "r", "status.completed", '{"from": "waiting", "to": "completed"}'),
    ]
    assert forbidden_moves(events) == [
        "event 4 (status.completed) of run r: waiting>completed, which the lifecycle table forbids"
    ]


def test_the_store_guard_flags_a_move_from_where_the_run_was_not() -> None:
    from tests.store.conftest import forbidden_moves

    events = [
        (1, "r", "admitted", "{}"),
        (2, "r", "status.queued", '{"from": "waiting", "to": "queued"}'),
    ]
    assert forbidden_moves(events) == [
        "event 2 (status.queued) of run r: waiting>queued, but the run was queued"
    ]
