"""Small workflows and a fake provider shared by the integration tests.

The provider stands in for the outside world (a payment API, a mail server): it is not what
these tests test, Keel is. It records every call it receives and every delivery it accepted,
so a test can count what the outside world saw rather than what Keel believes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import operator
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

import keel
from keel.core import leases
from keel.core.ledger import Effect
from keel.runtime.worker import Worker, WorkerStats


@dataclass
class Provider:
    """A provider that keeps what it received, keyed by idempotency key."""

    dedupe: bool = False
    """Honour idempotency keys (a second delivery under a key returns the first)."""
    calls: list[str] = field(default_factory=list)
    deliveries: list[str] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def deliver(self, key: str, payload: Any) -> Any:
        with self.lock:
            if self.dedupe and key in self.results:
                return self.results[key]
            self.deliveries.append(key)
            result = {"id": f"p-{len(self.deliveries)}", "payload": payload}
            self.results[key] = result
            return result

    def lookup(self, key: str) -> Any:
        with self.lock:
            return self.results.get(key)


def drain(
    app: keel.App, concurrency: int = 4, within: float = 30.0, worker: Worker | None = None
) -> WorkerStats:
    """Run a worker until nothing is queued or running; fail (not hang) if that takes too long.

    A run left `running` under a live lease would keep a stop-when-idle worker polling until
    the lease expires, which never happens on a ManualClock: that is a bug, reported as one.
    """
    worker = worker or Worker(app.aio, concurrency=concurrency, stop_when_idle=True)
    loop = app.aio.portal.loop
    future = asyncio.run_coroutine_threadsafe(worker.run(), loop)
    try:
        return future.result(timeout=within)
    except concurrent.futures.TimeoutError:
        for _ in range(2):  # drain, then stop now
            loop.call_soon_threadsafe(worker.stop)
        future.result(timeout=10)
        stuck = app.list_runs(status="running")
        raise AssertionError(f"worker did not drain within {within}s; running: {stuck}") from None


def execute_once(app: keel.App, worker_id: str) -> str:
    """Claim the oldest claimable run as `worker_id` and execute it once, as a worker does."""

    async def claim_and_execute() -> str:
        rt = app.aio
        await rt.open()
        got = await leases.claim(
            rt.store, worker_id, rt.workflows.keys(), rt.clock.now(), rt.lease_ttl
        )
        assert got is not None, "nothing to claim"
        lease, row = got
        return await rt.executor(worker_id).execute(lease, row)

    return app.aio.portal.call(claim_and_execute())


def event_kinds(app: keel.App, run_id: str) -> list[str]:
    return [e["kind"] for e in app.get_run(run_id).timeline]


# -- a one-node workflow (admission, artifacts, worker) --------------------------------------


class EchoState(TypedDict, total=False):
    text: str
    out: str


def echo_graph(node: Callable[[EchoState], dict[str, Any]] | None = None) -> StateGraph:
    def default(state: EchoState) -> dict[str, Any]:
        return {"out": state.get("text", "").upper()}

    g = StateGraph(EchoState)
    g.add_node("echo", node or default)
    g.add_edge(START, "echo")
    g.add_edge("echo", END)
    return g


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


async def steal_lease(app: keel.App, clock: keel.ManualClock) -> None:
    """What a second worker does when the first stalls past its lease: take the run over."""
    rt = app.aio
    clock.advance(rt.lease_ttl + 1)
    # PostgreSQL claims skip a row locked by a checkpoint write still in flight (FOR UPDATE
    # SKIP LOCKED against the write's FOR SHARE fence): poll, as a real worker would.
    for _ in range(500):
        got = await leases.claim(rt.store, "thief", rt.workflows.keys(), clock.now(), rt.lease_ttl)
        if got is not None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("nothing to take over")


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
