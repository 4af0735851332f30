"""Apps for `keel audit` (tests/interfaces/test_audit.py): one with every fix applied, one with
each problem the audit knows, and one whose graph changed under the same version.

- `clean_app`: workflow `clean` (pinned), effects that are provider-idempotent or take the
  fencing token, each with a declared timeout under the lease TTL, an approval with a deadline,
  a node that calls a helper of its own (no client): audits clean.
- `flawed_app` (lease TTL 5 s): workflow `flawed`, registered without `version=`, whose nodes
  have each problem once: `refund` reconciles only and declares a 60 s timeout, `page` has
  neither reconciler nor timeout, `ask` approves without timeout, `pause` calls LangGraph's
  interrupt(), `post` reaches smtplib through a helper.
- `drift_v1` / `drift_changed`: `order@1` from tests/support/apps/versions.py, and an `order@1`
  whose `review` node was renamed `approve` without a new version.

Each attribute builds a new App on $KEEL_DATABASE_URL at each use (the CLI closes it).
"""

from __future__ import annotations

import os
import smtplib
import urllib.request
from collections.abc import Callable
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import keel
from tests.support.apps import versions

LEASE_TTL = 30.0
FLAWED_LEASE_TTL = 5.0


class State(TypedDict, total=False):
    order: str
    charged: dict[str, Any]
    notified: dict[str, Any]
    decision: str
    answer: Any


# -- the clean app ----------------------------------------------------------------------------


@keel.effect("charge", provider_idempotent=True, timeout=10)
def charge(order: str, *, idempotency_key: str = keel.KEY) -> dict[str, Any]:
    # The provider call belongs here: the audit does not read an effect's own function.
    request = urllib.request.Request(
        "http://127.0.0.1:9/charges",
        data=order.encode(),
        headers={"Idempotency-Key": idempotency_key},
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        return {"status": answer.status}


def find_notice(order: str, *, idempotency_key: str, fencing_token: int = 0) -> Any:
    return None


@keel.effect("notify", reconcile=find_notice, timeout="15s")
def notify(
    order: str, *, idempotency_key: str = keel.KEY, fencing_token: int = 0
) -> dict[str, Any]:
    return {"order": order, "key": idempotency_key, "token": fencing_token}


def _label(order: str) -> str:
    return order.strip().upper()


def prepare(state: State) -> State:
    return {"order": _label(state["order"])}


def pay(state: State) -> State:
    return {"charged": charge(state["order"])}


def review(state: State) -> State:
    decision = keel.approval("manager", payload=state["order"], timeout="1h", on_timeout="reject")
    return {"decision": decision.decision}


def tell(state: State) -> State:
    return {"notified": notify(state["order"])}


def _chain(*nodes: tuple[str, Callable[..., Any]]) -> StateGraph:
    graph = StateGraph(State)
    previous = START
    for name, fn in nodes:
        graph.add_node(name, fn)
        graph.add_edge(previous, name)
        previous = name
    graph.add_edge(previous, END)
    return graph


def register_clean(app: keel.App) -> keel.App:
    @app.workflow("clean", version="1")
    def clean() -> StateGraph:
        return _chain(("prepare", prepare), ("pay", pay), ("review", review), ("tell", tell))

    return app


# -- the flawed app ---------------------------------------------------------------------------


def find_refund(order: str, *, idempotency_key: str) -> Any:
    return None


@keel.effect("refund", reconcile=find_refund, timeout="60s")
def refund(order: str, *, idempotency_key: str = keel.KEY) -> dict[str, Any]:
    return {"order": order}


@keel.effect("page")
def page(order: str, *, idempotency_key: str = keel.KEY) -> dict[str, Any]:
    return {"order": order}


def give_back(state: State) -> State:
    return {"charged": refund(state["order"])}


def wake_someone(state: State) -> State:
    return {"notified": page(state["order"])}


def ask(state: State) -> State:
    return {"decision": keel.approval("boss", payload=state["order"]).decision}


def pause(state: State) -> State:
    return {"answer": interrupt({"question": "go on?"})}


def _post_status(order: str) -> None:
    with smtplib.SMTP("127.0.0.1", 9) as smtp:
        smtp.sendmail("keel@example.com", ["ops@example.com"], f"order {order}")


def post(state: State) -> State:
    _post_status(state["order"])
    return {}


def register_flawed(app: keel.App) -> keel.App:
    @app.workflow("flawed")
    def flawed() -> StateGraph:
        return _chain(
            ("give_back", give_back),
            ("wake_someone", wake_someone),
            ("ask", ask),
            ("pause", pause),
            ("post", post),
        )

    return app


def __getattr__(name: str) -> Any:
    url = os.environ.get("KEEL_DATABASE_URL")
    if name == "clean_app":
        return register_clean(keel.App(url, lease_ttl=LEASE_TTL))
    if name == "flawed_app":
        return register_flawed(keel.App(url, lease_ttl=FLAWED_LEASE_TTL))
    if name == "drift_v1":
        return versions.register_v1(keel.App(url))
    if name == "drift_changed":
        app = keel.App(url)
        app.workflow(versions.WORKFLOW, version="1")(lambda: versions._graph("v1", "approve"))
        return app
    raise AttributeError(name)
