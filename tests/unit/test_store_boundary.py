"""Only the store names queries: everything else calls a `Store` method.

One method per query is the one place to read what a statement does and who runs it; a named
query issued from elsewhere (or a transaction opened on the connector behind the store's back)
would slip past that, so this walks the package and refuses it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import keel
from keel.core.store.base import load_queries

PACKAGE = Path(keel.__file__).parent
STORE = PACKAGE / "core" / "store"
QUERY_METHODS = {"one", "all", "execute", "send"}
CONNECTOR_METHODS = {"transaction", "read"}


def query_names() -> set[str]:
    return set(load_queries("sqlite")) | set(load_queries("postgres"))


def violations(source: str, names: set[str], filename: str = "<source>") -> list[str]:
    """Where `source` issues a named query or opens a transaction on `<x>.db` directly."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{node.lineno}" if isinstance(node, ast.expr) else filename
        if (
            isinstance(node, ast.Attribute)
            and node.attr in CONNECTOR_METHODS
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "db"
        ):
            found.append(f"{where}: .db.{node.attr} (use store.{node.attr}())")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in QUERY_METHODS
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in names
        ):
            found.append(f"{where}: .{node.func.attr}({node.args[0].value!r}) (add a Store method)")
    return found


def test_no_module_outside_the_store_names_a_query() -> None:
    names = query_names()
    found = [
        problem
        for path in sorted(PACKAGE.rglob("*.py"))
        if STORE not in path.parents
        for problem in violations(path.read_text(), names, str(path.relative_to(PACKAGE)))
    ]
    assert found == []


def test_the_store_itself_is_where_queries_are_named() -> None:
    names = query_names()
    inside = [
        problem
        for path in STORE.rglob("*.py")
        for problem in violations(path.read_text(), names, path.name)
    ]
    assert any("'claim_next'" in p for p in inside)  # the scan sees real calls


def test_the_checker_refuses_a_named_query_and_a_connector_transaction() -> None:
    bad = """
async def sneak(store, tx):
    async with store.db.transaction() as t:
        await t.one("get_run", {"run_id": "r"})
    async with rt.store.db.read() as r:
        await r.all("list_waits", {"run_id": "r"})
    await tx.execute("update_run_status", {})
"""
    found = violations(bad, {"get_run", "list_waits", "update_run_status"})
    assert len(found) == 5, found


def test_the_checker_leaves_other_calls_alone() -> None:
    fine = """
async def fine(store, conn, executor, lease, row):
    async with store.transaction() as tx:
        await store.read_run(tx, "r")
    await conn.execute("CREATE DATABASE x")
    await executor.execute(lease, row)
    await tx.one(name_from_somewhere)
    items.all("get_run_not_a_query")
"""
    assert violations(fine, {"get_run"}) == []
