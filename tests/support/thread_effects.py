"""A shop whose conversation charges an order once (`key="order_id"` on a thread) and mails a
receipt every turn (no `key=`), and the ledger's rows read with the database's own driver.

The provider counts what the outside world saw; the rows are read with sqlite3 or psycopg, not
through Keel, so a test sees what retention really left in `keel_effects`.
"""

from __future__ import annotations

import operator
import sqlite3
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import psycopg
from langgraph.graph import StateGraph

import keel
from tests.support.graphs import one_node
from tests.support.providers import Provider


class Shop(TypedDict, total=False):
    order_id: str
    amount: int
    charges: Annotated[list[str], operator.add]
    """The charge id each turn was answered with (the provider's, or the ledger's record)."""


def shop(charges: Provider, mails: Provider) -> Callable[[], StateGraph]:
    """pay: charge the order (once per thread and order) and mail a receipt (every turn)."""

    @keel.effect("charge", key="order_id")
    def charge(order_id: str, amount: int, *, idempotency_key: str = keel.KEY) -> Any:
        return charges.deliver(idempotency_key, {"order": order_id, "amount": amount})

    @keel.effect("receipt")
    def receipt(order_id: str, *, idempotency_key: str = keel.KEY) -> Any:
        return mails.deliver(idempotency_key, {"order": order_id})

    def pay(state: Shop) -> dict[str, Any]:
        charged = charge(state["order_id"], state["amount"])
        receipt(state["order_id"])
        return {"charges": [charged["id"]]}

    return lambda: one_node(Shop, "pay", pay)


def ledger(db_url: str) -> dict[str, tuple[str, str]]:
    """Every row of keel_effects: key -> (effect name, run_id)."""
    sql = "SELECT idempotency_key, name, run_id FROM keel_effects"
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(db_url.removeprefix("sqlite:///"))
        try:
            rows = conn.execute(sql).fetchall()
        finally:
            conn.close()
    else:
        with psycopg.connect(db_url) as pg:
            rows = pg.execute(sql).fetchall()
    return {str(k): (str(n), str(r)) for k, n, r in rows}


def runs_left(db_url: str, run_ids: list[str]) -> list[str]:
    """Which of `run_ids` keel_runs still holds."""
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(db_url.removeprefix("sqlite:///"))
        try:
            rows = conn.execute("SELECT run_id FROM keel_runs").fetchall()
        finally:
            conn.close()
    else:
        with psycopg.connect(db_url) as pg:
            rows = pg.execute("SELECT run_id FROM keel_runs").fetchall()
    return sorted(str(r[0]) for r in rows if r[0] in run_ids)
