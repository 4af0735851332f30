"""Issue 33's three parts together (delayed runs and durable sleep, completion webhooks,
schedules), on both backends: what one part does to another. The webhooks a run's moves owe
are read as the outbox intents they recorded, and delivered to a receiver on 127.0.0.1."""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

import keel
from keel.core.schedules import Tick
from keel.core.webhooks import new_secret
from keel.runtime.schedules import fire_due
from tests.support.graphs import ask_graph, echo_graph
from tests.support.webhook_receiver import Receiver, receiving
from tests.support.workers import drain, sweep

AppFactory = Callable[..., keel.App]
SECRET = new_secret()
ALL = ["completed", "failed", "cancelled", "timed_out", "interrupted"]


class Nap(TypedDict, total=False):
    seconds: list[float]
    log: Annotated[list[str], operator.add]


def napping_graph(calls: list[str]) -> StateGraph:
    """One node that sleeps each of `seconds` in turn, then ends."""

    def nap(state: Nap) -> dict[str, Any]:
        calls.append("nap")
        for n, seconds in enumerate(state.get("seconds", [60])):
            keel.sleep(seconds)
            calls.append(f"woke-{n}")
        return {"log": ["rested"]}

    g = StateGraph(Nap)
    g.add_node("nap", nap)
    g.add_edge(START, "nap")
    g.add_edge("nap", END)
    return g


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving(SECRET) as r:
        yield r


def _app(make_app: AppFactory, **kwargs: Any) -> keel.App:
    return make_app(webhook_secret=SECRET, webhook_allow_hosts=["127.0.0.1"], **kwargs)


def _fire(app: keel.App) -> list[Tick]:
    rt = app.aio.runtime
    return rt.portal.call(fire_due(rt, rt.workflows))


def _told(app: keel.App, run_id: str) -> list[tuple[str, str]]:
    """(delivery id, event) of every webhook the run's moves owe, in order."""
    rows = [i for i in app.effect_intents(run_id=run_id) if i["effect"] == "keel.webhook"]
    told = []
    for row in sorted(rows, key=lambda r: int(str(r["intent_id"]).rsplit(":", 1)[1])):
        args = json.loads(row["args"]) if isinstance(row["args"], str) else row["args"]
        told.append((str(row["intent_id"]), str(args["kwargs"]["event"])))
    return told


def test_a_sleep_is_not_an_interrupt_for_the_webhook(
    make_app: AppFactory, receiver: Receiver
) -> None:
    """A run that sleeps twice then ends tells a webhook asking for every event once: it
    completed. A sleep waits for nobody; a real interrupt on the same app is still told."""
    clock = keel.ManualClock()
    calls: list[str] = []
    app = _app(make_app, clock=clock)
    app.workflow("nap")(lambda: napping_graph(calls))
    app.workflow("ask")(ask_graph)
    napper = app.submit(
        "nap", {"seconds": [30, 40]}, job_id="j-nap", webhook=receiver.url, webhook_on=ALL
    )
    asker = app.submit("ask", {}, job_id="j-ask", webhook=receiver.url, webhook_on=ALL)
    for seconds in (30, 40):
        drain(app)
        assert app.get_run(napper.run_id).status == "waiting"
        assert _told(app, napper.run_id) == [], "a sleep is nobody's news"
        clock.advance(seconds + 1)
        assert sweep(app) == 1
    drain(app)
    assert app.get_run(napper.run_id).status == "completed"
    assert _told(app, napper.run_id) == [(f"webhook:{napper.run_id}:0", "completed")]
    assert app.get_run(asker.run_id).status == "waiting"
    assert _told(app, asker.run_id) == [(f"webhook:{asker.run_id}:0", "interrupted")]
    got = sorted((d.id, d.json["type"]) for d in receiver.all())
    assert got == sorted(
        [
            (f"webhook:{napper.run_id}:0", "run.completed"),
            (f"webhook:{asker.run_id}:0", "run.interrupted"),
        ]
    )


def sleeping_beside_a_question() -> StateGraph:
    """Two branches at once: `nap` sleeps twice; `ask` asks a person once (`interrupt()`)."""
    from langgraph.types import interrupt

    def nap(state: Nap) -> dict[str, Any]:
        keel.sleep(30)
        keel.sleep(30)
        return {"log": ["rested"]}

    def ask(state: Nap) -> dict[str, Any]:
        return {"log": [f"answered {interrupt({'question': 'go?'})}"]}

    g = StateGraph(Nap)
    g.add_node("nap", nap)
    g.add_node("ask", ask)
    g.add_edge(START, "nap")
    g.add_edge(START, "ask")
    g.add_edge("nap", END)
    g.add_edge("ask", END)
    return g


def test_a_question_still_open_is_told_once_however_often_a_sleep_beside_it_wakes(
    make_app: AppFactory, receiver: Receiver
) -> None:
    """Each wake of the sleeping branch moves the run back to `waiting`, the question still
    open: the webhook was told of it once and is not told again (each telling is a delivery
    of its own, with its own id: a receiver could not tell them apart). A new question is."""
    clock = keel.ManualClock()
    app = _app(make_app, clock=clock)
    app.workflow("both")(sleeping_beside_a_question)
    run = app.submit("both", {}, job_id="j-both", webhook=receiver.url, webhook_on=ALL)
    for _ in range(2):
        drain(app)
        assert app.get_run(run.run_id).status == "waiting"
        clock.advance(31)
        assert sweep(app) == 1  # the timer: the run is queued, and pauses again on the question
    drain(app)
    assert app.get_run(run.run_id).status == "waiting"
    assert _told(app, run.run_id) == [(f"webhook:{run.run_id}:0", "interrupted")]
    app.resume(run.run_id, "yes", by="ann")
    drain(app)
    assert sorted(app.get_run(run.run_id).output["log"]) == ["answered yes", "rested"]
    assert _told(app, run.run_id) == [
        (f"webhook:{run.run_id}:0", "interrupted"),
        (f"webhook:{run.run_id}:1", "completed"),
    ]


def test_a_delayed_run_cancelled_before_its_time_tells_its_webhook_once(
    make_app: AppFactory, receiver: Receiver
) -> None:
    clock = keel.ManualClock()
    app = _app(make_app, clock=clock)
    app.workflow("echo")(echo_graph)
    run = app.submit("echo", {"text": "later"}, job_id="j-later", after=3600, webhook=receiver.url)
    app.cancel(run.run_id, by="ops")
    details = app.get_run(run.run_id)
    assert (details.status, details.run["termination_reason"]) == ("cancelled", "cancelled")
    clock.advance(3601)
    drain(app)
    assert app.get_run(run.run_id).status == "cancelled", "its time came: it stays cancelled"
    kinds = [e["kind"] for e in app.get_run(run.run_id).timeline]
    assert kinds == ["admitted", "status.cancelled", "outbox.delivered"], "never claimed"
    assert _told(app, run.run_id) == [(f"webhook:{run.run_id}:0", "cancelled")]
    # Cancelling again changes nothing and owes nothing more.
    with pytest.raises(keel.KeelError, match="already cancelled"):
        app.cancel(run.run_id, by="ops")
    drain(app)
    assert len(_told(app, run.run_id)) == 1
    assert [(d.id, d.json["type"]) for d in receiver.all()] == [
        (f"webhook:{run.run_id}:0", "run.cancelled")
    ]


def test_a_sleeping_tick_run_is_unfinished_for_the_overlap_policy(
    make_app: AppFactory,
) -> None:
    """A schedule whose run sleeps past the next tick skips that tick (`overlap="skip"`): a
    sleeping run is unfinished, whatever it holds (no worker, no lease)."""
    clock = keel.ManualClock()
    calls: list[str] = []
    app = make_app(clock=clock)
    app.workflow("nap")(lambda: napping_graph(calls))
    app.schedules.create("s", "nap", every=60, input={"seconds": [150]}, overlap="skip")
    clock.advance(60)
    (first,) = _fire(app)
    assert first.outcome == "fired" and first.run_id
    drain(app)
    assert app.get_run(first.run_id).status == "waiting"
    clock.advance(60)
    (second,) = _fire(app)
    assert (second.outcome, second.run_id) == ("skipped", None), "behind a sleeping run"
    clock.advance(91)  # the sleep (150 s from the first tick) is over: the run wakes and ends
    assert sweep(app) == 1
    drain(app)
    assert app.get_run(first.run_id).status == "completed"
    clock.advance(60)
    (third,) = _fire(app)
    assert third.outcome == "fired" and third.run_id != first.run_id
    assert calls == ["nap", "nap", "woke-0"]


class Fan(TypedDict, total=False):
    waits: list[float]
    log: Annotated[list[str], operator.add]


def fan_graph(calls: list[str]) -> StateGraph:
    """Two parallel branches (Send), each sleeping its own time."""

    def spread(state: Fan) -> list[Send]:
        return [Send("branch", {"waits": [s]}) for s in state["waits"]]

    def branch(state: Fan) -> dict[str, Any]:
        [seconds] = state["waits"]
        calls.append(f"branch-{seconds:g}")
        keel.sleep(seconds)
        calls.append(f"woke-{seconds:g}")
        return {"log": [f"slept {seconds:g}"]}

    g = StateGraph(Fan)
    g.add_node("branch", branch)
    g.add_conditional_edges(START, spread, ["branch"])
    g.add_edge("branch", END)
    return g


def test_two_parallel_branches_sleep_their_own_times_and_both_wake(
    make_app: AppFactory,
) -> None:
    clock = keel.ManualClock()
    calls: list[str] = []
    app = make_app(clock=clock)
    app.workflow("fan")(lambda: fan_graph(calls))
    run_id = app.submit("fan", {"waits": [30, 90]}, job_id="j-fan").run_id
    drain(app)
    pending = [w for w in app.get_run(run_id).waits if w["status"] == "pending"]
    assert sorted(w["kind"] for w in pending) == ["timer", "timer"]
    assert len({w["wait_id"] for w in pending}) == 2, "each branch's sleep is its own wait"
    assert sorted(w["deadline"] - clock.now() for w in pending) == pytest.approx([30, 90])
    clock.advance(31)
    sweep(app)
    drain(app)
    assert app.get_run(run_id).status == "waiting", "the longer sleep is not over"
    clock.advance(60)
    sweep(app)
    drain(app)
    details = app.get_run(run_id)
    assert details.status == "completed"
    assert sorted(json.loads(details.run["output"])["log"]) == ["slept 30", "slept 90"]
    assert sorted(w["decision"] for w in details.waits) == ["woke", "woke"]
    assert calls.count("woke-30") >= 1 and calls.count("woke-90") == 1
