"""Workflows that charge a card at an HTTP provider (`PAYMENTS_URL`, the harness's `{http_url}`),
each in one style, for the crash harness: three correct, three unsafe.

Correct:
- `pay-idempotent`: an effect marked `provider_idempotent=True` that sends Keel's key as the
  `Idempotency-Key` header: a retry after a crash is deduplicated by the provider.
- `pay-reconciled`: an effect whose provider does not dedupe; the charge carries Keel's key as its
  `reference`, and the reconciler looks it up (`GET /charges?reference=KEY`) before any retry.
- `pay-lookup-first`: the reconciled style, with a GET lookup of the customer in the node: a GET
  is not a delivery.

Unsafe (the harness must fail the cell right after the charge, naming the node):
- `pay-direct`: the node POSTs straight to the provider, outside any effect.
- `pay-fresh-key`: an effect that says `provider_idempotent=True` but sends a fresh uuid4 as its
  Idempotency-Key on every attempt, so the provider cannot tell a retry.
- `pay-changing-args`: an effect called with the time of the call among its arguments: every
  attempt is a new effect with a new key.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any, TypedDict

import httpx
from langgraph.graph import END, START, StateGraph

import keel

app = keel.App()


def _url(path: str) -> str:
    return os.environ["PAYMENTS_URL"] + path


class State(TypedDict, total=False):
    order: str
    amount: int
    charge: int
    customer: dict[str, Any]
    receipt: str


def price(state: State) -> State:
    return {"amount": 4200}


def receipt(state: State) -> State:
    return {"receipt": f"order {state['order']}: charge {state.get('charge')}"}


def _post(body: dict[str, Any], key: str | None) -> dict[str, Any]:
    headers = {"Idempotency-Key": key} if key else {}
    response = httpx.post(_url("/charges"), json=body, headers=headers, timeout=10)
    response.raise_for_status()
    return dict(response.json())


@keel.effect("charge", provider_idempotent=True)
def charge_idempotent(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    return _post({"order": order, "amount": amount}, idempotency_key)


def find_charge(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any] | None:
    response = httpx.get(_url("/charges"), params={"reference": idempotency_key}, timeout=10)
    response.raise_for_status()
    found = response.json()["deliveries"]
    return dict(found[0]) if found else None


@keel.effect("charge", reconcile=find_charge)
def charge_reconciled(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    return _post({"order": order, "amount": amount, "reference": idempotency_key}, None)


@keel.effect("charge", provider_idempotent=True)
def charge_fresh_key(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    return _post({"order": order, "amount": amount}, str(uuid.uuid4()))  # UNSAFE


@keel.effect("charge", provider_idempotent=True)
def charge_at(order: str, amount: int, at: float, *, idempotency_key: str) -> dict[str, Any]:
    return _post({"order": order, "amount": amount}, idempotency_key)


def _charged(result: dict[str, Any] | None) -> State:
    return {"charge": int((result or {}).get("delivery", 0))}


def pay_idempotent(state: State) -> State:
    return _charged(charge_idempotent(state["order"], state["amount"]))


def pay_reconciled(state: State) -> State:
    return _charged(charge_reconciled(state["order"], state["amount"]))


def pay_lookup_first(state: State) -> State:
    customer = httpx.get(_url("/customers"), params={"order": state["order"]}, timeout=10)
    return {
        **_charged(charge_reconciled(state["order"], state["amount"])),
        "customer": customer.json(),
    }


def pay_direct(state: State) -> State:
    # UNSAFE: not an effect, and a new key each time the node runs.
    result = _post({"order": state["order"], "amount": state["amount"]}, str(uuid.uuid4()))
    return _charged(result)


def pay_fresh_key(state: State) -> State:
    return _charged(charge_fresh_key(state["order"], state["amount"]))


def pay_changing_args(state: State) -> State:
    return _charged(charge_at(state["order"], state["amount"], time.time()))  # UNSAFE


def _graph(pay: Any) -> StateGraph:
    g = StateGraph(State)
    g.add_node("price", price)
    g.add_node("pay", pay)
    g.add_node("receipt", receipt)
    g.add_edge(START, "price")
    g.add_edge("price", "pay")
    g.add_edge("pay", "receipt")
    g.add_edge("receipt", END)
    return g


STYLES = {
    "pay-idempotent": pay_idempotent,
    "pay-reconciled": pay_reconciled,
    "pay-lookup-first": pay_lookup_first,
    "pay-direct": pay_direct,
    "pay-fresh-key": pay_fresh_key,
    "pay-changing-args": pay_changing_args,
}
for _name, _pay in STYLES.items():
    app.workflow(_name)(lambda pay=_pay: _graph(pay))
