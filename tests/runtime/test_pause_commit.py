"""A pause's writes commit with its waits' registration, in the saver's step transaction.

A crash before that transaction commits nothing of the paused step: the step runs again, its
sibling's effect comes from the ledger and its outbox intent is recorded once. The transaction
is retried once after an infrastructure failure (`Fencing._commit`): when the failure hid a
commit that went through, the run is still paused once, as an end retried the same way ends
once (tests/runtime/test_last_step.py). A cancel asked during the paused step ends the run
there, with the reason the cancel gave.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send, interrupt

import keel
from keel.core.store.base import Tx
from keel.testing.http import HttpSink
from tests.support.graphs import notify_effect
from tests.support.outbox_flows import mail, serving
from tests.support.providers import Provider
from tests.support.workers import answer_lost_once, claim, drain, execute

AppFactory = Callable[..., keel.App]


class Asked(TypedDict, total=False):
    n: int
    answer: Any


def asking() -> StateGraph:
    async def first(state: Asked) -> dict[str, Any]:
        return {"n": state["n"] + 1}

    async def ask(state: Asked) -> dict[str, Any]:
        return {"answer": interrupt({"question": state["n"]})}

    g = StateGraph(Asked)
    g.add_node("first", first)
    g.add_node("ask", ask)
    g.add_edge(START, "first")
    g.add_edge("first", "ask")
    g.add_edge("ask", END)
    return g


def kinds(app: keel.App, run: str) -> list[str]:
    return [e["kind"] for e in app.get_run(run).timeline]


def test_a_pause_whose_commit_answer_was_lost_pauses_the_run_once(make_app: AppFactory) -> None:
    """The registration commits, then the connection drops before its answer: the retried
    transaction finds the run waiting under its own token and reports the pause, not an
    error (the run waits on one wait, moved there once)."""
    app = make_app()
    app.workflow("asking")(asking)
    run = app.submit("asking", job_id="pause-lost", input={"n": 1})["run_id"]
    lease, row = claim(app, "w-a")
    with answer_lost_once(app, run, "waiting") as lost:
        assert execute(app, lease, row) == "waiting"
    assert lost == [1]
    assert app.get_run(run).status == "waiting"
    assert kinds(app, run).count("status.waiting") == 1
    assert len(app.get_run(run).waits) == 1
    app.resume(run, {"ok": True})
    assert execute(app, *claim(app, "w-b")) == "completed"
    assert app.get_run(run).output == {"n": 2, "answer": {"ok": True}}


@pytest.fixture
def sink(monkeypatch: pytest.MonkeyPatch) -> Iterator[HttpSink]:
    with serving(monkeypatch) as serve:
        yield serve


class Beside(TypedDict, total=False):
    to: str
    decision: str
    handle: str
    sent: Any


def test_a_crash_before_the_pause_commits_runs_its_step_again_with_effects_once(
    make_app: AppFactory, sink: HttpSink
) -> None:
    """`ask` pauses while `work` finishes beside it, after an effect and an outbox intent. The
    pause's transaction fails before it commits: nothing of the step is durable (no wait, no
    intent), the next execution runs the step again, and the world sees one call and one
    delivery."""
    app = make_app(retry_backoff=0.01)
    provider = Provider()
    notify = notify_effect(provider, "pc_notify")
    worked: list[str] = []

    async def ask(state: Beside) -> dict[str, Any]:
        return {"decision": keel.approval("manager").decision}

    def work(state: Beside) -> dict[str, Any]:
        time.sleep(0.05)  # after ask paused
        worked.append("work")
        return {"sent": notify(state["to"]), "handle": mail(state["to"])}

    def build() -> StateGraph:
        g = StateGraph(Beside)
        g.add_node("ask", ask)
        g.add_node("work", work)
        g.add_edge(START, "ask")
        g.add_edge(START, "work")
        g.add_edge("ask", END)
        g.add_edge("work", END)
        return g

    app.workflow("beside")(build)
    run = app.submit("beside", job_id="beside-1", input={"to": "ed@example.com"})["run_id"]
    store = app.aio.runtime.store
    real = store.step_transaction
    crashed: list[int] = []

    async def crashes_before_commit(body: Callable[[Tx], Any]) -> Any:
        async def then_crash(tx: Tx) -> Any:
            await body(tx)
            crashed.append(1)
            raise RuntimeError("the worker died before its commit")

        return await real(then_crash if not crashed else body)

    lease, row = claim(app, "w-a")
    store.step_transaction = crashes_before_commit  # type: ignore[method-assign]
    try:
        execute(app, lease, row)
    finally:
        del store.step_transaction
    assert crashed == [1]
    assert worked == ["work"]
    details = app.get_run(run)
    assert details.waits == [] and app.effect_intents(run_id=run) == []
    assert [e["kind"] for e in details.timeline if e["kind"] == "step"] == []

    drain(app)
    assert app.get_run(run).status == "waiting"
    assert worked == ["work", "work"]
    assert len(app.get_run(run).waits) == 1
    app.approve(run, by="alice")
    app.run_worker(stop_when_idle=True, handle_signals=False, concurrency=2)
    done = app.get_run(run)
    assert done.status == "completed", done
    assert worked == ["work", "work"], "a sibling finished before the pause ran again"
    assert len(provider.deliveries) == 1
    assert len(sink.deliveries) == 1
    assert [i["status"] for i in app.effect_intents(run_id=run)] == ["delivered"]


class Turn(TypedDict, total=False):
    question: str
    answer: Any


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
def test_a_run_stopped_by_a_newer_turn_at_its_pause_says_why(
    make_app: AppFactory, strategy: str
) -> None:
    """A newer run on the thread stops the running one (`multitask_strategy`) while its step
    pauses: the pause is that step's boundary, and the run ends cancelled with the reason the
    newer run gave, as it does at any other boundary (or waiting: test_threads.py)."""
    app = make_app()

    def ask(state: Turn) -> dict[str, Any]:
        if state["question"] == "first":
            # A client's next turn arrives while this step runs.
            app.submit("turns", {"question": "next"}, thread_id="t-pc", multitask_strategy=strategy)
        return {"answer": interrupt(state["question"])}

    def build() -> StateGraph:
        g = StateGraph(Turn)
        g.add_node("ask", ask)
        g.add_edge(START, "ask")
        g.add_edge("ask", END)
        return g

    app.workflow("turns")(build)
    first = app.submit("turns", {"question": "first"}, thread_id="t-pc").run_id
    assert execute(app, *claim(app, "w-a")) == "cancelled"
    stopped = app.get_run(first)
    assert (stopped.status, stopped.termination_reason) == ("cancelled", strategy_reason(strategy))
    ended = [e for e in stopped.timeline if e["kind"] == "status.cancelled"]
    assert [e["data"].get("termination_reason") for e in ended] == [strategy_reason(strategy)]
    assert [w for w in stopped.waits if w["status"] == "pending"] == []  # nobody is asked
    drain(app)
    assert app.get_state("t-pc").tasks[0].interrupts[0].value == "next"


def strategy_reason(strategy: str) -> str:
    return {"interrupt": "interrupted", "rollback": "rolled_back"}[strategy]


class Fan(TypedDict, total=False):
    names: list[str]
    said: Annotated[list[str], operator.add]


def test_sends_that_all_pause_register_each_wait_once_across_resumes(
    make_app: AppFactory,
) -> None:
    """A first step of `Send`s, each pausing on its own approval: the pause commits their
    interrupts with the run's first checkpoints and three waits; answered one at a time, the
    run resumes each, pauses again on those left (the same waits) and ends with every answer."""
    app = make_app()

    async def ask(state: Fan) -> dict[str, Any]:
        name = state["names"][0]
        return {"said": [f"{name}:{keel.approval(name).decision}"]}

    def build() -> StateGraph:
        g = StateGraph(Fan)
        g.add_node("ask", ask)
        g.add_conditional_edges(
            START, lambda s: [Send("ask", {"names": [n]}) for n in s["names"]], ["ask"]
        )
        g.add_edge("ask", END)
        return g

    app.workflow("fan-ask")(build)
    run = app.submit("fan-ask", job_id="fan-ask", input={"names": ["a", "b", "c"]})["run_id"]
    assert execute(app, *claim(app, "w-a")) == "waiting"
    waits = app.get_run(run).waits
    assert sorted(w["name"] for w in waits) == ["a", "b", "c"]
    for n, wait in enumerate(sorted(waits, key=lambda w: w["name"])):
        verdict = "approve" if n != 1 else "reject"
        getattr(app, verdict)(run, by="alice", wait_id=wait["wait_id"])
        outcome = execute(app, *claim(app, f"w-{n}"))
        assert outcome == ("waiting" if n < 2 else "completed"), (n, outcome)
    done = app.get_run(run)
    assert sorted(done.output["said"]) == ["a:approved", "b:rejected", "c:approved"]
    assert sorted(w["wait_id"] for w in done.waits) == sorted(w["wait_id"] for w in waits)
