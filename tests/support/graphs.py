"""Small workflows, and the effects they perform against a recording Provider."""

from __future__ import annotations

import operator
import threading
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

import keel
from keel.core.effects.ledger import Effect
from tests.support.providers import Provider

# -- a one-node workflow (admission, artifacts, worker) --------------------------------------


def one_node(schema: Any, name: str, node: Callable[..., Any]) -> StateGraph:
    """START -> `name` -> END over `schema`."""
    g = StateGraph(schema)
    g.add_node(name, node)
    g.add_edge(START, name)
    g.add_edge(name, END)
    return g


class EchoState(TypedDict, total=False):
    text: str
    n: list[int]
    out: str


def echo_graph(node: Callable[[EchoState], dict[str, Any]] | None = None) -> StateGraph:
    def default(state: EchoState) -> dict[str, Any]:
        return {"out": state.get("text", "").upper()}

    return one_node(EchoState, "echo", node or default)


# -- a one-node workflow that keeps a worker's slot busy -------------------------------------


class HeldState(TypedDict, total=False):
    n: int


def held_graph(release: threading.Event, timeout: float = 20) -> Callable[[], StateGraph]:
    """A one-node workflow whose node runs until `release` is set (at most `timeout` s)."""

    def hold(state: HeldState) -> dict[str, Any]:
        release.wait(timeout)
        return {"n": 1}

    return lambda: one_node(HeldState, "hold", hold)


# -- approval then (maybe) an effect ---------------------------------------------------------


class ReviewState(TypedDict, total=False):
    to: str
    log: Annotated[list[str], operator.add]


def review_graph(notify: Effect[..., Any]) -> StateGraph:
    """review (a manager's approval) -> send the notification only if approved."""

    def review(state: ReviewState) -> dict[str, Any]:
        decision = keel.approval("manager", payload={"to": state["to"]}, timeout="1h")
        return {"log": [decision.decision]}

    def send(state: ReviewState) -> dict[str, Any]:
        notify(state["to"])
        return {"log": ["sent"]}

    def route(state: ReviewState) -> str:
        return "send" if state["log"][-1] == "approved" else END

    g = StateGraph(ReviewState)
    g.add_node("review", review)
    g.add_node("send", send)
    g.add_edge(START, "review")
    g.add_conditional_edges("review", route, ["send", END])
    g.add_edge("send", END)
    return g


def notify_effect(provider: Provider, name: str = "notify") -> Effect[..., Any]:
    def notify(to: str, *, idempotency_key: str) -> Any:
        provider.calls.append(idempotency_key)
        return provider.deliver(idempotency_key, {"to": to})

    return keel.effect(name)(notify)


# -- a revision loop whose every iteration performs the same call, then waits ----------------


class LoopState(TypedDict, total=False):
    rounds: int
    revision: int
    results: Annotated[list[Any], operator.add]


def loop_graph(notify: Effect[..., Any]) -> StateGraph:
    """Each round sends the *same* notification, then waits for an approval.

    Code before the approval re-runs when the run resumes, so every round's effect call is
    replayed once: the replay must find the key it reserved the first time.
    """

    def revise(state: LoopState) -> dict[str, Any]:
        result = notify("editor@example.com")
        keel.approval("editor", payload={"revision": state.get("revision", 0)})
        return {"revision": state.get("revision", 0) + 1, "results": [result]}

    def again(state: LoopState) -> str:
        return "revise" if state["revision"] < state["rounds"] else END

    g = StateGraph(LoopState)
    g.add_node("revise", revise)
    g.add_edge(START, "revise")
    g.add_conditional_edges("revise", again, ["revise", END])
    return g


# -- parallel fan-out with identical arguments -----------------------------------------------


class FanState(TypedDict, total=False):
    copies: int
    to: str
    results: Annotated[list[Any], operator.add]


def fanout_graph(notify: Effect[..., Any], *, wait: bool = False) -> StateGraph:
    """`copies` parallel branches (Send) each perform the same call with the same args."""

    def plan(state: FanState) -> dict[str, Any]:
        return {}

    def branches(state: FanState) -> list[Send]:
        return [Send("deliver", {"to": state["to"]}) for _ in range(state["copies"])]

    def deliver(state: FanState) -> dict[str, Any]:
        result = notify(state["to"])
        if wait:
            keel.approval("branch", payload={"to": state["to"]})
        return {"results": [result]}

    g = StateGraph(FanState)
    g.add_node("plan", plan)
    g.add_node("deliver", deliver)
    g.add_edge(START, "plan")
    g.add_conditional_edges("plan", branches, ["deliver"])
    g.add_edge("deliver", END)
    return g


# -- one async node performing one async effect ----------------------------------------------


class PayState(TypedDict, total=False):
    amount: int
    receipt: Any
    again: Any


def pay_graph(charge: Effect[..., Any], *, twice: bool = False) -> StateGraph:
    async def pay(state: PayState) -> dict[str, Any]:
        receipt = await charge(state["amount"])  # type: ignore[misc]
        update: dict[str, Any] = {"receipt": receipt}
        if twice:
            update["again"] = await charge(state["amount"])  # type: ignore[misc]
        return update

    g = StateGraph(PayState)
    g.add_node("pay", pay)
    g.add_edge(START, "pay")
    g.add_edge("pay", END)
    return g


Hook = Callable[[str], Awaitable[None]]


def charge_effect(
    provider: Provider,
    *,
    stall: Hook | None = None,
    deliver_before_stall: bool = True,
    reconcile: bool = False,
    provider_idempotent: bool = False,
    retry: keel.Retry | None = None,
) -> Effect[..., Any]:
    """An async payment effect. With `stall`, its first call stalls its worker past the lease.

    `deliver_before_stall` says whether that first call reached the provider before the stall
    (after which the stale worker can no longer record anything: its writes are fenced).
    """
    pending = [stall] if stall else []

    async def charge(amount: int, *, idempotency_key: str) -> Any:
        provider.calls.append(idempotency_key)
        if pending:
            hook = pending.pop()
            result = provider.deliver(idempotency_key, amount) if deliver_before_stall else None
            await hook(idempotency_key)
            if result is None:
                raise ConnectionResetError("connection reset before the provider answered")
            return result
        return provider.deliver(idempotency_key, amount)

    async def lookup(amount: int, *, idempotency_key: str) -> Any:
        return provider.lookup(idempotency_key)

    return keel.effect(
        "charge",
        reconcile=lookup if reconcile else None,
        provider_idempotent=provider_idempotent,
        retry=retry,
    )(charge)


# -- approve, then charge at an HTTP provider: the graph changed after its run (replay) -------


class ChargeState(TypedDict, total=False):
    order: str
    amount: int
    log: Annotated[list[str], operator.add]


def http_charge(url: str, name: str = "charge") -> Effect[..., Any]:
    """An effect that POSTs a charge to `url` (a keel.testing HttpSink) under Keel's key."""

    def charge(order: str, amount: int, *, idempotency_key: str) -> Any:
        import httpx

        answer = httpx.post(
            f"{url}/charges",
            json={"order": order, "amount": amount},
            headers={"Idempotency-Key": idempotency_key},
            timeout=10,
        )
        return answer.json()

    return keel.effect(name)(charge)


def charge_graph(
    charge: Effect[..., Any],
    *,
    node: str = "charge",
    amount: Callable[[int], int] = lambda a: a,
    then: Effect[..., Any] | None = None,
) -> StateGraph:
    """review (approval) -> `node` (charges `amount(state.amount)`, then calls `then`) -> END.

    The keywords are the changes a replay must find: `node` renames the route, `amount`
    changes an effect's arguments, `then` adds an effect the recorded run never called."""

    def review(state: ChargeState) -> dict[str, Any]:
        decision = keel.approval("manager", payload={"order": state["order"]}, timeout="1h")
        return {"log": [decision.decision]}

    def pay(state: ChargeState) -> dict[str, Any]:
        charge(state["order"], amount(state["amount"]))
        if then is not None:
            then(state["order"], state["amount"])
        return {"log": ["charged"]}

    def route(state: ChargeState) -> str:
        return node if state["log"][-1] == "approved" else END

    g = StateGraph(ChargeState)
    g.add_node("review", review)
    g.add_node(node, pay)
    g.add_edge(START, "review")
    g.add_conditional_edges("review", route, [node, END])
    g.add_edge(node, END)
    return g


class CountState(TypedDict, total=False):
    n: int


def double_then_check_graph(double: Effect[..., Any], *, fail: bool) -> StateGraph:
    """An async node awaiting an async effect (`double`), then a node that raises if `fail`."""

    async def grow(state: CountState) -> dict[str, Any]:
        return {"n": await double(state["n"])}

    def check(state: CountState) -> dict[str, Any]:
        if fail:
            raise ValueError(f"n={state['n']} is too big")
        return {"n": state["n"] + 1}

    g = StateGraph(CountState)
    g.add_node("grow", grow)
    g.add_node("check", check)
    g.add_edge(START, "grow")
    g.add_edge("grow", "check")
    g.add_edge("check", END)
    return g


def async_double(provider: Provider) -> Effect[..., Any]:
    async def double(n: int, *, idempotency_key: str) -> int:
        provider.calls.append(idempotency_key)
        return 2 * n

    return keel.effect("double")(double)


class SubIn(TypedDict, total=False):
    to: str
    results: Annotated[list[Any], operator.add]


def subgraph_approval_graph(notify: Effect[..., Any]) -> StateGraph:
    """A subgraph node that notifies, waits for a manager, then notifies again."""

    def inner(state: SubIn) -> dict[str, Any]:
        before = notify(state["to"])
        decision = keel.approval("manager", payload={"to": state["to"]}, timeout="1h")
        after = notify(state["to"] + ".done")
        return {"results": [before["id"], decision.decision, after["id"]]}

    sub = StateGraph(SubIn)
    sub.add_node("inner", inner)
    sub.add_edge(START, "inner")
    sub.add_edge("inner", END)
    g = StateGraph(SubIn)
    g.add_node("sub", sub.compile())
    g.add_edge(START, "sub")
    g.add_edge("sub", END)
    return g


def plain_interrupt_graph(notify: Effect[..., Any]) -> StateGraph:
    """ask (LangGraph's own `interrupt()`, not keel.approval) -> send (one effect) -> END."""
    from langgraph.types import interrupt

    def ask(state: ReviewState) -> dict[str, Any]:
        answer = interrupt({"question": f"notify {state['to']}?"})
        return {"log": [str(answer.get("decision"))]}

    def send(state: ReviewState) -> dict[str, Any]:
        notify(state["to"])
        return {"log": ["sent"]}

    g = StateGraph(ReviewState)
    g.add_node("ask", ask)
    g.add_node("send", send)
    g.add_edge(START, "ask")
    g.add_edge("ask", "send")
    g.add_edge("send", END)
    return g


# -- a one-node workflow that pauses on a plain interrupt() ----------------------------------


class AskState(TypedDict, total=False):
    answer: Any


def ask_graph() -> StateGraph:
    """Pauses once on `interrupt({"question": "go?"})`, then ends with the answer."""
    from langgraph.types import interrupt

    def ask(state: AskState) -> dict[str, Any]:
        return {"answer": interrupt({"question": "go?"})}

    g = StateGraph(AskState)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g
