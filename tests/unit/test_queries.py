"""The two dialects' SQL agree: same query names, same parameters, same migrations."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import keel
from keel.core.store.base import load_migrations, load_queries

DIALECTS = ("sqlite", "postgres")
_LITERAL = re.compile(r"'(?:[^']|'')*'")
_SQLITE_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_PG_PARAM = re.compile(r"%\((\w+)\)s")
_USED = re.compile(r"""\btx\.(?:one|all|execute)\(\s*["']([a-z_]+)["']""")


_ALIAS = re.compile(r"\bAS\s+([A-Za-z_]\w*)", re.IGNORECASE)


def params(dialect: str, sql: str) -> set[str]:
    """The parameters a caller passes: in a SQLite chain (`Connector.single`), a column a
    statement names with AS is a parameter of the statements after it, not the caller's."""
    # String literals may hold colons ('keel:deadline'); they are not parameters.
    bare = _LITERAL.sub("''", sql)
    if dialect == "postgres":
        return set(_PG_PARAM.findall(bare))
    found: set[str] = set()
    carried: set[str] = set()
    for statement in _chain(bare):
        found |= set(_SQLITE_PARAM.findall(statement)) - carried
        carried |= set(_ALIAS.findall(statement))
    return found


def _chain(sql: str) -> list[str]:
    return [s for s in re.split(r";[ \t]*$", sql, flags=re.MULTILINE) if s.strip()]


@pytest.fixture(scope="module")
def queries() -> dict[str, dict[str, str]]:
    return {d: load_queries(d) for d in DIALECTS}


def test_both_dialects_define_exactly_the_same_query_names(queries) -> None:
    sqlite, postgres = set(queries["sqlite"]), set(queries["postgres"])
    assert sqlite - postgres == set(), "defined for SQLite only"
    assert postgres - sqlite == set(), "defined for PostgreSQL only"
    assert len(sqlite) > 10


def test_each_query_takes_the_same_named_parameters_in_both_dialects(queries) -> None:
    mismatched = {
        name: (params("sqlite", sql), params("postgres", queries["postgres"][name]))
        for name, sql in queries["sqlite"].items()
        if params("sqlite", sql) != params("postgres", queries["postgres"].get(name, ""))
    }
    assert mismatched == {}


def test_each_dialect_uses_only_its_own_parameter_style(queries) -> None:
    for name, sql in queries["sqlite"].items():
        assert "%(" not in sql, f"sqlite query {name} uses the PostgreSQL style"
    for name, sql in queries["postgres"].items():
        bare = _LITERAL.sub("''", sql).replace("::", "")
        assert not _SQLITE_PARAM.findall(bare), f"postgres query {name} uses the SQLite style"


def test_no_query_is_empty_or_lost_by_the_loader(queries) -> None:
    for dialect in DIALECTS:
        text = (
            Path(keel.__file__).parent / "core" / "store" / "sql" / dialect / "queries.sql"
        ).read_text()
        headers = re.findall(r"^-- name: (\S+)\s*$", text, re.MULTILINE)
        assert len(headers) == len(set(headers)), f"{dialect}: a query name is defined twice"
        assert sorted(headers) == sorted(queries[dialect])
        for name, sql in queries[dialect].items():
            assert sql.strip(), f"{dialect} query {name} is empty"
            # SQLite's chains (`Connector.single`) end their statements with `;` at a line's
            # end; PostgreSQL runs one statement per query.
            bare = _LITERAL.sub("''", sql)
            statements = _chain(bare) if dialect == "sqlite" else [bare]
            assert all(";" not in s for s in statements), (
                f"{dialect} query {name} holds two statements"
            )


def test_every_query_the_code_names_exists_in_both_dialects(queries) -> None:
    root = Path(keel.__file__).parent
    used = {m for path in root.rglob("*.py") for m in _USED.findall(path.read_text())}
    assert "insert_run" in used  # the scan itself works
    for dialect in DIALECTS:
        assert used - set(queries[dialect]) == set(), f"missing from {dialect}/queries.sql"


def test_both_dialects_have_the_same_migrations() -> None:
    sqlite, postgres = load_migrations("sqlite"), load_migrations("postgres")
    assert [(m.version, m.name) for m in sqlite] == [(m.version, m.name) for m in postgres]
    versions = [m.version for m in sqlite]
    # Numbers are handed out to branches in parallel (one may land 0006 before 0004): each is
    # used once and they only grow; migrate() applies them in order whatever the gaps.
    assert versions == sorted(set(versions)) and versions[0] == 1, "versions repeat or regress"
    for a, b in zip(sqlite, postgres, strict=True):
        # SQLite's keel_now() is defined on each connection, PostgreSQL's in its migration.
        tables = [s for s in b.statements if not s.startswith("CREATE OR REPLACE FUNCTION")]
        assert len(a.statements) == len(tables), f"migration {a.name} differs in size"
