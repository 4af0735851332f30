"""A workflow whose node enqueues outbox effects to an HTTP provider (`OUTBOX_URL`, a
keel.testing.HttpSink), and a later node that awaits the last one.

- `send_reconciled`: the provider is asked (GET by idempotency key) before any redelivery.
- `send_idempotent`: the provider dedupes by the `Idempotency-Key` header.
- `send_blind`: neither: a dead dispatcher leaves it in doubt for a person.

Input: `{"count": n, "effect": "reconciled" | "idempotent" | "blind", "tag": "..."}`. The
enqueuing node puts its process id in every intent (`pid`): an intent from an execution that
did not commit would name a dead worker's pid.
"""

from __future__ import annotations

import os
from typing import Any, TypedDict

import httpx
from langgraph.graph import END, START, StateGraph

import keel

RATE = os.environ.get("OUTBOX_RATE") or None
RETRY = keel.Retry(
    max_attempts=int(os.environ.get("OUTBOX_MAX_ATTEMPTS", "50")), initial=0.1, maximum=1.0
)


def _post(path: str, body: dict[str, Any], key: str) -> dict[str, Any]:
    response = httpx.post(
        os.environ["OUTBOX_URL"] + path, json=body, headers={"Idempotency-Key": key}, timeout=30
    )
    if response.status_code == 429 or response.status_code >= 500:
        after = response.headers.get("retry-after")
        raise keel.TransientError(
            f"provider said {response.status_code}",
            retry_after=float(after) if after else None,
        )
    response.raise_for_status()
    return dict(response.json())


def _lookup(path: str, key: str) -> dict[str, Any] | None:
    response = httpx.get(os.environ["OUTBOX_URL"] + path, params={"idempotency_key": key})
    response.raise_for_status()
    found = response.json()["deliveries"]
    return {"ok": True, "delivery": found[0]["delivery"]} if found else None


def find(to: str, pid: int, tag: str, *, idempotency_key: str = keel.KEY) -> Any:
    return _lookup("/reconciled", idempotency_key)


@keel.effect("send_reconciled", outbox=True, reconcile=find, retry=RETRY, rate=RATE)
def send_reconciled(to: str, pid: int, tag: str, *, idempotency_key: str = keel.KEY) -> Any:
    return _post("/reconciled", {"to": to, "pid": pid, "tag": tag}, idempotency_key)


@keel.effect(
    "send_idempotent", outbox=True, provider_idempotent=True, retry=RETRY, rate=RATE, key="to"
)
def send_idempotent(to: str, pid: int, tag: str, *, idempotency_key: str = keel.KEY) -> Any:
    return _post("/idempotent", {"to": to, "pid": pid, "tag": tag}, idempotency_key)


@keel.effect("send_blind", outbox=True, retry=RETRY, rate=RATE)
def send_blind(to: str, pid: int, tag: str, *, idempotency_key: str = keel.KEY) -> Any:
    # Deliberately no Idempotency-Key: a provider that cannot tell a retry.
    response = httpx.post(os.environ["OUTBOX_URL"] + "/blind", json={"to": to}, timeout=30)
    response.raise_for_status()
    return dict(response.json())


EFFECTS = {"reconciled": send_reconciled, "idempotent": send_idempotent, "blind": send_blind}


class State(TypedDict, total=False):
    count: int
    effect: str
    tag: str
    handles: list[str]
    last: Any


def enqueue(state: State) -> State:
    effect = EFFECTS[state.get("effect", "reconciled")]
    # The pid is not part of send_idempotent's identity (key="to"); for the other two it is,
    # so a step that did not commit and runs again elsewhere brings other arguments: allowed,
    # as nothing of the first execution was recorded.
    tag = state.get("tag", "t")
    return {
        "handles": [effect(f"user{i}@example.com", os.getpid(), tag) for i in range(state["count"])]
    }


def wait(state: State) -> State:
    return {"last": keel.await_effect(state["handles"][-1])}


def outbox_flow() -> StateGraph:
    g = StateGraph(State)
    g.add_node("enqueue", enqueue)
    g.add_node("wait", wait)
    g.add_edge(START, "enqueue")
    g.add_edge("enqueue", "wait")
    g.add_edge("wait", END)
    return g


def register(app: keel.App) -> keel.App:
    app.workflow("outbox", version="1")(outbox_flow)
    return app


app = register(keel.App())
