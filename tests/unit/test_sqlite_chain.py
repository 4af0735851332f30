"""SQLite's one-call transactions (`Connector.single`): a chain of statements in one BEGIN
IMMEDIATE, each statement's first row handed to the statements after it."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest

from keel.backends.sqlite_tx import _run_chain, split_chain


@pytest.fixture
def conn() -> Iterator[sqlite3.Connection]:
    db = sqlite3.connect(":memory:")
    db.row_factory = sqlite3.Row
    db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER NOT NULL)")
    db.execute("INSERT INTO t VALUES ('a', 1)")
    db.commit()
    yield db
    db.close()


def rows(conn: sqlite3.Connection) -> list[tuple[str, int]]:
    return [(r["k"], r["v"]) for r in conn.execute("SELECT k, v FROM t ORDER BY k")]


def test_columns_of_a_row_are_parameters_of_the_statements_after_it(conn) -> None:
    chain = split_chain(
        "SELECT v + 1 AS next FROM t WHERE k = :k;\n"
        "INSERT INTO t VALUES (:new, :next);\n"
        "SELECT COUNT(*) AS n FROM t;"
    )
    assert len(chain) == 3
    answer = _run_chain(conn, chain, {"k": "a", "new": "b"}, own=True)
    assert answer == {"next": 2, "n": 2}
    assert rows(conn) == [("a", 1), ("b", 2)]
    assert not conn.in_transaction


def test_a_statement_that_finds_nothing_ends_the_chain_and_what_ran_commits(conn) -> None:
    chain = split_chain(
        "UPDATE t SET v = v + 10 WHERE k = 'a';\n"
        "SELECT v FROM t WHERE k = :missing;\n"
        "DELETE FROM t;"
    )
    assert _run_chain(conn, chain, {"missing": "zz"}, own=True) is None
    assert rows(conn) == [("a", 11)]  # the update committed; the delete never ran
    assert not conn.in_transaction


def test_a_failing_statement_rolls_the_whole_chain_back(conn) -> None:
    chain = split_chain("UPDATE t SET v = 99;\nINSERT INTO t VALUES ('a', 2);")
    with pytest.raises(sqlite3.IntegrityError):
        _run_chain(conn, chain, {}, own=True)
    assert rows(conn) == [("a", 1)]
    assert not conn.in_transaction


def test_inside_an_open_transaction_the_chain_neither_begins_nor_commits(conn) -> None:
    conn.execute("BEGIN IMMEDIATE")
    chain = split_chain("SELECT 5 AS v;\nINSERT INTO t VALUES ('c', :v);")
    assert _run_chain(conn, chain, {}, own=False) == {"v": 5}
    assert conn.in_transaction
    conn.rollback()
    assert rows(conn) == [("a", 1)]
