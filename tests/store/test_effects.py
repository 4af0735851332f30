"""Effects: once per deterministic key, through loops, fan-out, replays, retries (the effect's
own, and LangGraph's RetryPolicy re-running a failed node) and failures."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableLambda
from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy

import keel
from keel.core.errors import NotInRun, UsageError
from keel.runtime.runtime import RunDetails
from tests.support.checks import event_kinds
from tests.support.graphs import (
    charge_effect,
    echo_graph,
    fanout_graph,
    loop_graph,
    notify_effect,
    pay_graph,
)
from tests.support.providers import Provider
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]


def test_effect_outside_a_run_raises_not_in_run() -> None:
    notify = notify_effect(Provider())
    with pytest.raises(NotInRun, match="'notify'"):
        notify("ops@example.com")
    with pytest.raises(NotInRun, match=r"keel\.approval\(\)"):
        keel.approval("manager")


def test_effect_function_without_idempotency_key_is_refused_at_decoration() -> None:
    def send(to: str) -> None: ...

    with pytest.raises(UsageError, match="idempotency_key"):
        keel.effect("send")(send)


def test_loop_iterations_perform_the_same_call_twice_with_distinct_keys(
    make_app: AppFactory,
) -> None:
    provider = Provider()
    app = make_app()
    app.workflow("loop")(lambda: loop_graph(notify_effect(provider)))
    run = app.submit("loop", job_id="nl-1", input={"rounds": 2, "revision": 0})["run_id"]
    for _ in range(2):
        drain(app)
        assert app.get_run(run).status == "waiting"
        app.approve(run, by="editor")
    drain(app)
    details = app.get_run(run)
    assert details.status == "completed"
    # Two rounds, two performances, two keys; the resume of each round replayed its call.
    assert len(provider.calls) == 2
    assert len(set(provider.calls)) == 2
    assert [e["idempotency_key"] for e in details.effects] == provider.calls
    assert [e["status"] for e in details.effects] == ["sent", "sent"]
    assert len({e["step"] for e in details.effects}) == 2
    # What the graph kept came from the replayed calls: the ledger's stored results, in order.
    assert [r["id"] for r in details.output["results"]] == ["p-1", "p-2"]


def test_replay_after_resume_reuses_the_key_and_does_not_perform_again(
    make_app: AppFactory,
) -> None:
    provider = Provider()
    app = make_app()
    app.workflow("loop")(lambda: loop_graph(notify_effect(provider)))
    run = app.submit("loop", job_id="nl-1", input={"rounds": 1, "revision": 0})["run_id"]
    drain(app)
    key = provider.calls[0]
    app.approve(run, by="editor")
    drain(app)
    assert provider.calls == [key]
    assert provider.deliveries == [key]
    assert [e["idempotency_key"] for e in app.get_run(run).effects] == [key]
    assert event_kinds(app, run).count("effect.sent") == 1


def test_parallel_fanout_branches_get_distinct_keys(make_app: AppFactory) -> None:
    provider = Provider()
    app = make_app()
    app.workflow("fan")(lambda: fanout_graph(notify_effect(provider)))
    run = app.submit("fan", job_id="fan-1", input={"copies": 3, "to": "same@example.com"})
    drain(app)
    details = app.get_run(run["run_id"])
    assert details.status == "completed"
    assert len(set(provider.calls)) == 3
    assert sorted(e["idempotency_key"] for e in details.effects) == sorted(provider.calls)
    assert len({e["task_path"] for e in details.effects}) == 3


def test_parallel_fanout_replay_reuses_each_branch_key(make_app: AppFactory) -> None:
    provider = Provider()
    app = make_app()
    app.workflow("fan")(lambda: fanout_graph(notify_effect(provider), wait=True))
    run = app.submit("fan", job_id="fan-1", input={"copies": 3, "to": "same@example.com"})
    run_id = run["run_id"]
    drain(app)
    waits = app.get_run(run_id).waits
    assert len(waits) == 3
    first_keys = list(provider.calls)
    for wait in waits:
        assert app.approve(run_id, by="ops", wait_id=wait["wait_id"]).recorded
    drain(app)
    details = app.get_run(run_id)
    assert details.status == "completed"
    assert provider.calls == first_keys  # three branches replayed, none performed again
    assert sorted(r["id"] for r in details.output["results"]) == ["p-1", "p-2", "p-3"]


def test_same_call_twice_in_one_node_is_two_effects_with_their_own_keys(
    make_app: AppFactory,
) -> None:
    provider = Provider()
    app = make_app()
    app.workflow("pay")(lambda: pay_graph(charge_effect(provider), twice=True))
    run = app.submit("pay", job_id="order-1", input={"amount": 5})["run_id"]
    drain(app)
    details = app.get_run(run)
    assert details.status == "completed"
    assert len(provider.deliveries) == 2  # two charges asked for, two made
    assert details.output["receipt"] != details.output["again"]
    assert sorted(e["call_index"] for e in details.effects) == [0, 1]


def test_effects_called_through_runnables_a_node_invokes_are_numbered_in_one_order(
    make_app: AppFactory,
) -> None:
    provider = Provider()

    @keel.effect("send")
    def send(to: str, *, idempotency_key: str) -> Any:
        return provider.deliver(idempotency_key, to)

    tool = RunnableLambda(lambda to: send(to))  # its own child config, the node's task

    def deliver(state: MailState) -> dict[str, Any]:
        return {"receipt": [tool.invoke(state["to"]), tool.invoke("b@x")]}

    def build() -> StateGraph:
        g = StateGraph(MailState)
        g.add_node("deliver", deliver)
        g.add_edge(START, "deliver")
        g.add_edge("deliver", END)
        return g

    app = make_app()
    app.workflow("mail")(build)
    run = app.submit("mail", job_id="tools-1", input={"to": "a@x"})["run_id"]
    drain(app)
    details = app.get_run(run)
    assert details.status == "completed", details.run["error"]
    assert len(provider.deliveries) == 2
    assert sorted(e["call_index"] for e in details.effects) == [0, 1]


def test_sync_effect_in_sync_node_performs_each_call_once(make_app: AppFactory) -> None:
    provider = Provider()
    notify = notify_effect(provider)

    def node(state: dict[str, Any]) -> dict[str, Any]:
        a, b, a_again = notify("a@x"), notify("b@x"), notify("a@x")
        return {"out": f"{a['id']},{b['id']},{a_again['id']}"}

    app = make_app()
    app.workflow("echo")(lambda: echo_graph(node))  # type: ignore[arg-type]
    run = app.submit("echo", job_id="e-1", input={})["run_id"]
    drain(app)
    assert app.get_run(run).output["out"] == "p-1,p-2,p-3"
    assert len(provider.calls) == len(set(provider.calls)) == 3


def test_async_effect_in_async_node_is_recorded_in_the_ledger(make_app: AppFactory) -> None:
    provider = Provider()
    app = make_app()
    app.workflow("pay")(lambda: pay_graph(charge_effect(provider)))
    run = app.submit("pay", job_id="order-1", input={"amount": 7})["run_id"]
    drain(app)
    details = app.get_run(run)
    assert details.status == "completed"
    assert details.output["receipt"] == {"id": "p-1", "payload": 7}
    [row] = details.effects
    assert (row["status"], row["attempts"], row["name"], row["node"]) == (
        "sent",
        1,
        "charge",
        "pay",
    )
    assert row["idempotency_key"] == provider.calls[0]
    assert row["idempotency_key"].startswith("effect:charge:")


def test_sync_effect_called_from_async_node_fails_the_run_with_a_clear_usage_error(
    make_app: AppFactory,
) -> None:
    provider = Provider()
    notify = notify_effect(provider)

    async def node(state: dict[str, Any]) -> dict[str, Any]:
        notify("a@x")
        return {}

    app = make_app()
    app.workflow("echo")(lambda: echo_graph(node))  # type: ignore[arg-type]
    run = app.submit("echo", job_id="e-1", input={})["run_id"]
    drain(app)
    details = app.get_run(run)
    assert (details.status, details.termination_reason) == ("failed", "execution_error")
    assert details.run["error"].startswith("UsageError")
    assert "plain `def`" in details.run["error"]
    assert provider.calls == []
    assert details.effects == []


def test_async_effect_called_from_sync_node_is_performed_not_dropped(
    make_app: AppFactory,
) -> None:
    """An async effect in a plain `def` node must run (or fail loudly), never be skipped.

    Before, the call returned an un-awaited coroutine: the run completed, nothing was sent.
    """
    provider = Provider()
    charge = charge_effect(provider)

    def node(state: dict[str, Any]) -> dict[str, Any]:
        first, again = charge(5), charge(5)
        return {"out": f"{first['id']},{again['id']}"}

    app = make_app()
    app.workflow("echo")(lambda: echo_graph(node))  # type: ignore[arg-type]
    run = app.submit("echo", job_id="e-1", input={})["run_id"]
    drain(app)
    details = app.get_run(run)
    assert (details.status, details.output["out"]) == ("completed", "p-1,p-2")
    assert len(provider.calls) == 2
    assert [e["status"] for e in details.effects] == ["sent", "sent"]


# -- retries ---------------------------------------------------------------------------------


def flaky_charge(provider: Provider, failures: list[BaseException], retry: keel.Retry) -> Any:
    """An async charge that raises the given errors first, in order, then succeeds."""

    async def charge(amount: int, *, idempotency_key: str) -> Any:
        provider.calls.append(idempotency_key)
        if failures:
            raise failures.pop(0)
        return provider.deliver(idempotency_key, amount)

    return keel.effect("charge", retry=retry)(charge)


def run_pay(make_app: AppFactory, charge: Any, clock: keel.ManualClock) -> RunDetails:
    app = make_app(clock=clock)
    app.workflow("pay")(lambda: pay_graph(charge))
    run = app.submit("pay", job_id="order-1", input={"amount": 5})["run_id"]
    drain(app)
    return app.get_run(run)


def retry_events(details: RunDetails) -> list[dict[str, Any]]:
    return [e["data"] for e in details.timeline if e["kind"] == "effect.retry"]


def test_transient_errors_retry_under_the_same_key_with_backoff_on_the_clock(
    make_app: AppFactory,
) -> None:
    clock = keel.ManualClock()
    provider = Provider()
    retry = keel.Retry(max_attempts=5, initial=1.0, multiplier=2.0, jitter=0.0)
    errors: list[BaseException] = [keel.TransientError("503"), keel.TransientError("502")]
    start = clock.now()
    details = run_pay(make_app, flaky_charge(provider, errors, retry), clock)
    assert details.status == "completed"
    assert clock.now() - start == pytest.approx(1.0 + 2.0)
    assert len(provider.calls) == 3 and len(set(provider.calls)) == 1
    assert provider.deliveries == provider.calls[:1]
    [row] = details.effects
    assert (row["status"], row["attempts"]) == ("sent", 3)
    assert row["idempotency_key"] == provider.calls[0]
    assert [(e["attempt"], e["delay"]) for e in retry_events(details)] == [(1, 1.0), (2, 2.0)]


def test_retry_after_hint_sets_the_backoff_capped_at_the_maximum(make_app: AppFactory) -> None:
    clock = keel.ManualClock()
    provider = Provider()
    retry = keel.Retry(max_attempts=5, initial=1.0, maximum=30.0, jitter=0.0)
    errors: list[BaseException] = [
        keel.TransientError("429", retry_after=7),
        keel.TransientError("429", retry_after=3600),
    ]
    start = clock.now()
    details = run_pay(make_app, flaky_charge(provider, errors, retry), clock)
    assert details.status == "completed"
    assert [e["delay"] for e in retry_events(details)] == [7.0, 30.0]
    assert clock.now() - start == pytest.approx(37.0)


def test_default_backoff_is_jittered_below_the_exponential_delay(make_app: AppFactory) -> None:
    clock = keel.ManualClock()
    provider = Provider()
    errors: list[BaseException] = [keel.TransientError("503") for _ in range(3)]
    details = run_pay(make_app, flaky_charge(provider, errors, keel.Retry()), clock)
    delays = [e["delay"] for e in retry_events(details)]
    assert len(delays) == 3
    for attempt, delay in enumerate(delays, start=1):
        base = 0.5 * 2 ** (attempt - 1)
        assert base * 0.5 <= delay <= base


def test_transient_errors_past_max_attempts_fail_the_effect_and_the_run(
    make_app: AppFactory,
) -> None:
    clock = keel.ManualClock()
    provider = Provider()
    retry = keel.Retry(max_attempts=3, initial=1.0, jitter=0.0)
    errors: list[BaseException] = [keel.TransientError(f"503 #{i}") for i in range(5)]
    start = clock.now()
    details = run_pay(make_app, flaky_charge(provider, errors, retry), clock)
    assert len(provider.calls) == 3 and len(set(provider.calls)) == 1
    assert clock.now() - start == pytest.approx(1.0 + 2.0)
    [row] = details.effects
    assert (row["status"], row["attempts"]) == ("failed", 3)
    assert "503 #2" in row["error"]
    assert (details.status, details.termination_reason) == ("failed", "execution_error")


def test_permanent_error_is_not_retried_and_fails_the_run(make_app: AppFactory) -> None:
    clock = keel.ManualClock()
    provider = Provider()
    errors: list[BaseException] = [ValueError("card declined")]
    start = clock.now()
    details = run_pay(make_app, flaky_charge(provider, errors, keel.Retry()), clock)
    assert len(provider.calls) == 1
    assert clock.now() == start
    [row] = details.effects
    assert (row["status"], row["attempts"]) == ("failed", 1)
    assert "card declined" in row["error"]
    assert (details.status, details.termination_reason) == ("failed", "execution_error")
    assert details.run["error"].startswith("EffectFailed")
    assert "card declined" in details.run["error"]
    assert row["idempotency_key"] in details.run["error"]
    assert "effect.failed" in [e["kind"] for e in details.timeline]


# -- a node re-run by LangGraph's RetryPolicy, in the same step -----------------------------


class MailState(TypedDict, total=False):
    to: str
    receipt: Any
    attempts: int


def test_node_retried_by_langgraph_performs_its_effect_once(make_app: AppFactory) -> None:
    provider = Provider()
    attempts: list[str] = []

    @keel.effect("send")
    def send(to: str, *, idempotency_key: str) -> Any:
        return provider.deliver(idempotency_key, to)

    def deliver(state: MailState) -> dict[str, Any]:
        receipt = send(state["to"])
        attempts.append(receipt["id"])
        if len(attempts) == 1:
            raise ConnectionError("the CRM update after the email failed")  # retried
        return {"receipt": receipt}

    def build() -> StateGraph:
        g = StateGraph(MailState)
        g.add_node(
            "deliver",
            deliver,
            retry_policy=RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False),
        )
        g.add_edge(START, "deliver")
        g.add_edge("deliver", END)
        return g

    app = make_app()
    app.workflow("mail")(build)
    run = app.submit("mail", job_id="retry-1", input={"to": "a@x"})["run_id"]
    drain(app)
    details = app.get_run(run)
    assert details.status == "completed"
    assert len(attempts) == 2  # the node ran twice...
    assert len(provider.deliveries) == 1  # ...the email went out once
    assert attempts[0] == attempts[1] == details.output["receipt"]["id"]


class OrderState(TypedDict, total=False):
    order: str
    receipts: Annotated[list[Any], operator.add]


ONCE_MORE = RetryPolicy(max_attempts=2, initial_interval=0.01, jitter=False, retry_on=ValueError)


def one_node(name: str, action: Any, retry: RetryPolicy | None = None) -> StateGraph:
    """START -> `name` (`action`, retried under `retry`) -> END, on OrderState."""
    g = StateGraph(OrderState)
    g.add_node(name, action, retry_policy=retry)
    g.add_edge(START, name)
    g.add_edge(name, END)
    return g


@pytest.mark.parametrize("fails", ["the charging node", "a later node", "the calling node"])
def test_subgraph_retried_by_langgraph_performs_its_effects_once(
    make_app: AppFactory, fails: str
) -> None:
    """A retry invokes its subgraphs again: LangGraph counts the invocations on, and ran the
    retry's under a namespace of its own (new keys), unless Keel counts each attempt's from the
    first again (keel.langgraph.retries). Two invocations in one attempt stay two calls."""
    provider = Provider()
    failed: list[str] = []

    @keel.effect("charge")
    def charge(order: str, *, idempotency_key: str) -> Any:
        return provider.deliver(idempotency_key, order)

    def once(where: str) -> None:
        if fails == where and not failed:
            failed.append(where)
            raise ConnectionError(f"{where} failed after the charge")  # retried

    def pay(state: OrderState) -> dict[str, Any]:
        receipt = charge(state["order"])
        once("the charging node")
        return {"receipts": [receipt["id"]]}

    def record(state: OrderState) -> dict[str, Any]:
        once("a later node")
        return {}

    sub = StateGraph(OrderState)
    sub.add_node("pay", pay)
    sub.add_node("record", record)
    sub.add_edge(START, "pay")
    sub.add_edge("pay", "record")
    sub.add_edge("record", END)
    billing = sub.compile()
    retry = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False)

    def calling(state: OrderState) -> dict[str, Any]:
        first = billing.invoke({"order": state["order"]})
        second = billing.invoke({"order": state["order"] + "-refill"})
        once("the calling node")
        return {"receipts": first["receipts"] + second["receipts"]}

    def build() -> StateGraph:
        return one_node("billing", calling if fails == "the calling node" else billing, retry)

    app = make_app()
    app.workflow("orders")(build)
    run = app.submit("orders", job_id="retry-sub", input={"order": "o-1"})["run_id"]
    drain(app)
    details = app.get_run(run)
    assert details.status == "completed", details.run["error"]
    assert failed == [fails]  # the retry happened
    calls = 2 if fails == "the calling node" else 1
    assert len(provider.deliveries) == calls, provider.deliveries  # charged once per call
    assert sorted(details.output["receipts"]) == [f"p-{n}" for n in range(1, calls + 1)]


def test_a_retried_nodes_subgraph_runs_afresh_and_changed_arguments_are_refused(
    make_app: AppFactory,
) -> None:
    """The retry's subgraph runs with the retry's input (a check that failed and asks again
    gets a new answer, not the first attempt's); an effect it calls with other arguments at
    the first attempt's place is refused, as any changed replay is, and performs nothing."""
    provider = Provider()
    asked: list[str] = []

    @keel.effect("charge")
    def charge(order: str, *, idempotency_key: str) -> Any:
        return provider.deliver(idempotency_key, order)

    def answer(state: OrderState) -> dict[str, Any]:
        asked.append(state["order"])
        if state["order"].startswith("pay"):
            charge(state["order"])
        return {"receipts": [f"answer to {state['order']}"]}

    agent = one_node("answer", answer).compile()

    def check(state: OrderState) -> dict[str, Any]:
        attempt = len(asked) + 1
        got = agent.invoke({"order": f"{state['order']} #{attempt}"})
        if attempt == 1:
            raise ValueError("the answer did not pass the check")  # retried
        return {"receipts": got["receipts"]}

    def build() -> StateGraph:
        return one_node("check", check, ONCE_MORE)

    app = make_app()
    app.workflow("checked")(build)
    asking = app.submit("checked", job_id="ask", input={"order": "ask"})["run_id"]
    drain(app)
    assert app.get_run(asking).output["receipts"] == ["answer to ask #2"]
    asked.clear()
    paying = app.submit("checked", job_id="pay", input={"order": "pay"})["run_id"]
    drain(app)
    details = app.get_run(paying)
    assert details.status == "failed"
    assert "NondeterminismError" in details.run["error"], details.run["error"]
    assert provider.deliveries and len(provider.deliveries) == 1  # the first attempt's only


def test_a_retrys_numbering_is_the_executions_own(make_app: AppFactory) -> None:
    """A run resumed in the same process gives its task the same id (same checkpoint): what an
    earlier execution's retry numbered must not re-key this one's second subgraph call as its
    first (it would be taken for done and never performed)."""
    provider = Provider()
    failing = [True]

    @keel.effect("send")
    def send(order: str, *, idempotency_key: str) -> Any:
        return provider.deliver(idempotency_key, order)

    def say(state: OrderState) -> dict[str, Any]:
        send(state["order"])
        return {}

    said = one_node("say", say).compile()

    def node(state: OrderState) -> dict[str, Any]:
        said.invoke({"order": "first"})
        if failing[0]:
            raise ValueError("provider down")  # retried once, then the run fails
        said.invoke({"order": "second"})  # a second call: a second effect
        return {}

    def build() -> StateGraph:
        return one_node("node", node, ONCE_MORE)

    app = make_app()
    # "exit": nothing is checkpointed before the end, so the resumed run runs the task again
    # under the same id, its subgraphs afresh.
    app.workflow("twice", durability="exit")(build)
    run = app.submit("twice", job_id="twice", input={"order": "go"})["run_id"]
    drain(app)
    assert app.get_run(run).status == "failed"
    assert len(provider.deliveries) == 1  # "first", found again by the retry
    failing[0] = False
    app.resume(run)
    drain(app)
    assert app.get_run(run).status == "completed"
    assert [provider.results[k]["payload"] for k in provider.deliveries] == ["first", "second"]
