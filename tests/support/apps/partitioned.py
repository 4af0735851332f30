"""Charges at a slow HTTP provider that does not deduplicate (`PAYMENTS_URL`, a
keel.testing.HttpSink with `commit_after`), for partition tests: a worker cut off from the
database while its call is on the wire, or handed a "lease is live" answer too late.

- `charge` (sync) and `charge-async`: one ledger effect each, reconciled by looking the charge
  up by its reference (Keel's key); its timeout is $PARTITION_EFFECT_TIMEOUT seconds.
- `charge-outbox`: the same charge as an outbox effect, delivered by the workers' dispatchers.

The provider counts every POST it commits: a second POST for one reference is a double charge.
"""

from __future__ import annotations

import os
from typing import Any, TypedDict

import httpx
from langgraph.graph import END, START, StateGraph

import keel

TIMEOUT = float(os.environ.get("PARTITION_EFFECT_TIMEOUT", "8"))
RETRY = keel.Retry(max_attempts=5, initial=0.5, maximum=1.0)

app = keel.App()


def _url(path: str) -> str:
    return os.environ["PAYMENTS_URL"] + path


def _post(order: str, key: str) -> dict[str, Any]:
    response = httpx.post(
        _url("/charges"), json={"order": order, "reference": key}, timeout=TIMEOUT + 5
    )
    if response.status_code >= 500:
        raise keel.TransientError(f"provider said {response.status_code}")
    response.raise_for_status()
    return dict(response.json())


def find(order: str, *, idempotency_key: str = keel.KEY) -> dict[str, Any] | None:
    response = httpx.get(_url("/charges"), params={"reference": idempotency_key}, timeout=10)
    response.raise_for_status()
    found = response.json()["deliveries"]
    if len(found) > 1:
        raise keel.EffectConflict(f"{len(found)} charges carry this reference", records=found)
    return dict(found[0]) if found else None


async def find_async(order: str, *, idempotency_key: str = keel.KEY) -> dict[str, Any] | None:
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(_url("/charges"), params={"reference": idempotency_key})
    response.raise_for_status()
    found = response.json()["deliveries"]
    if len(found) > 1:
        raise keel.EffectConflict(f"{len(found)} charges carry this reference", records=found)
    return dict(found[0]) if found else None


@keel.effect("charge", reconcile=find, timeout=TIMEOUT, retry=RETRY)
def charge(order: str, *, idempotency_key: str = keel.KEY) -> dict[str, Any]:
    return _post(order, idempotency_key)


@keel.effect("charge_async", reconcile=find_async, timeout=TIMEOUT, retry=RETRY)
async def charge_async(order: str, *, idempotency_key: str = keel.KEY) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=TIMEOUT + 5) as client:
        response = await client.post(
            _url("/charges"), json={"order": order, "reference": idempotency_key}
        )
    if response.status_code >= 500:
        raise keel.TransientError(f"provider said {response.status_code}")
    response.raise_for_status()
    return dict(response.json())


@keel.effect("charge_outbox", outbox=True, reconcile=find, timeout=TIMEOUT, retry=RETRY)
def charge_outbox(order: str, *, idempotency_key: str = keel.KEY) -> dict[str, Any]:
    return _post(order, idempotency_key)


class State(TypedDict, total=False):
    order: str
    charge: Any


def pay(state: State) -> State:
    return {"charge": charge(state["order"])}


async def pay_async(state: State) -> State:
    return {"charge": await charge_async(state["order"])}


def pay_later(state: State) -> State:
    return {"charge": charge_outbox(state["order"])}


def _one(node: Any) -> StateGraph:
    g = StateGraph(State)
    g.add_node("pay", node)
    g.add_edge(START, "pay")
    g.add_edge("pay", END)
    return g


@app.workflow("charge", version="1")
def charge_flow() -> StateGraph:
    return _one(pay)


@app.workflow("charge-async", version="1")
def charge_async_flow() -> StateGraph:
    return _one(pay_async)


@app.workflow("charge-outbox", version="1")
def charge_outbox_flow() -> StateGraph:
    return _one(pay_later)
