"""`App.replay`: a run re-executed in a throwaway copy, effects served from its ledger,
approvals answered as recorded, reporting the first step where a changed graph diverged.

The provider is a real HTTP sink: a replay must not reach it, whatever the graph now does.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from typing import Any, TypedDict

import psycopg
import pytest
from langgraph.graph import END, START, StateGraph

import keel
from keel.core.errors import UsageError
from keel.testing.http import HttpSink
from tests.support.apps import versions
from tests.support.graphs import (
    async_double,
    charge_graph,
    double_then_check_graph,
    fanout_graph,
    http_charge,
    loop_graph,
    notify_effect,
    plain_interrupt_graph,
    subgraph_approval_graph,
)
from tests.support.in_doubt import in_doubt
from tests.support.providers import Provider
from tests.support.workers import drain

ORDER = {"order": "o-1", "amount": 40, "log": []}


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        yield server


def recorded(app: keel.App, run_id: str) -> dict[str, Any]:
    """What the run left in the database: a replay must leave all of it as it was."""
    details = app.get_run(run_id)
    return {
        "run": details.run,
        "timeline": details.timeline,
        "effects": details.effects,
        "waits": details.waits,
        "artifacts": [a.name for a in details.artifacts],
    }


def deployed(make_app: Callable[..., keel.App], sink: HttpSink, **change: Any) -> keel.App:
    """An App with the `charge` workflow, version 1, its graph changed by `change` (a deploy
    after the run); `then=True` adds a `refund` effect the recorded run never called."""
    app = make_app()
    charge = http_charge(sink.url)
    then = http_charge(sink.url, "refund") if change.pop("then", False) else None
    app.workflow("charge")(lambda: charge_graph(charge, then=then, **change))
    return app


@pytest.fixture
def charged(make_app: Callable[..., keel.App], sink: HttpSink) -> tuple[keel.App, str]:
    """A run a manager approved, that charged once at the sink and completed."""
    app = deployed(make_app, sink)
    run_id = app.submit("charge", job_id="order-1", input=ORDER).run_id
    drain(app)
    app.approve(run_id, by="manager")
    drain(app)
    assert app.get_run(run_id).status == "completed"
    assert len(sink.requests) == 1
    return app, run_id


def test_an_unchanged_graph_replays_with_no_divergence_and_touches_nothing(
    charged: tuple[keel.App, str], sink: HttpSink
) -> None:
    app, run_id = charged
    before = recorded(app, run_id)
    report = app.replay(run_id)
    assert not report.diverged, report.model_dump()
    assert (report.step, report.differences, report.from_step) == (None, [], 0)
    assert (report.effects_served, report.approvals_answered) == (1, 1)
    assert report.last_step == 2  # input, review, charge
    assert len(sink.requests) == 1, "the replay reached the provider"
    assert recorded(app, run_id) == before


def test_a_renamed_route_names_the_step_and_both_routes(
    charged: tuple[keel.App, str], make_app: Callable[..., keel.App], sink: HttpSink
) -> None:
    _, run_id = charged
    report = deployed(make_app, sink, node="pay").replay(run_id)
    assert report.diverged
    assert (report.step, report.nodes) == (1, ["review"])
    (route,) = [d for d in report.differences if d.what == "route"]
    assert (route.recorded, route.replayed) == (["charge"], ["pay"])
    assert len(sink.requests) == 1


def test_an_effect_called_with_changed_arguments_names_the_effect_and_step(
    charged: tuple[keel.App, str], make_app: Callable[..., keel.App], sink: HttpSink
) -> None:
    app, run_id = charged
    before = recorded(app, run_id)
    report = deployed(make_app, sink, amount=lambda a: a * 100).replay(run_id)
    assert report.diverged
    assert (report.step, report.nodes) == (2, ["charge"])
    first = report.differences[0]
    assert (first.what, first.node) == ("effect_arguments", "charge")
    assert first.recorded["effect"] == first.replayed["effect"] == "charge"
    assert first.recorded["args_hash"] != first.replayed["args_hash"]
    assert "amount" in first.detail
    assert len(sink.requests) == 1
    assert recorded(app, run_id) == before


def test_an_effect_key_the_run_never_had_is_reported_and_not_performed(
    charged: tuple[keel.App, str], make_app: Callable[..., keel.App], sink: HttpSink
) -> None:
    app, run_id = charged
    before = recorded(app, run_id)
    report = deployed(make_app, sink, then=True).replay(run_id)
    assert report.diverged
    assert report.step == 2
    (new,) = [d for d in report.differences if d.what == "effect_key"]
    assert new.node == "charge" and new.replayed["effect"] == "refund"
    assert new.replayed["key"] not in {e["idempotency_key"] for e in before["effects"]}
    assert report.effects_served == 1  # the recorded charge, served from the ledger
    assert [r.route for r in sink.requests] == ["/charges"], "the new effect reached the sink"
    assert recorded(app, run_id) == before


def test_replay_from_a_middle_step_compares_from_there(
    charged: tuple[keel.App, str], make_app: Callable[..., keel.App], sink: HttpSink
) -> None:
    app, run_id = charged
    report = app.replay(run_id, from_step=2)
    assert not report.diverged
    assert (report.from_step, report.last_step) == (2, 2)
    # Step 1 (the approval) is not re-executed: it comes from the recorded checkpoint.
    assert (report.effects_served, report.approvals_answered) == (1, 0)
    # A change that only step 2 shows is found from there too.
    changed = deployed(make_app, sink, amount=lambda a: a + 1).replay(run_id, from_step=2)
    assert (changed.diverged, changed.step) == (True, 2)
    with pytest.raises(UsageError, match="no step 7: its steps are 0 to 2"):
        app.replay(run_id, from_step=7)
    assert len(sink.requests) == 1


def test_a_waiting_run_replays_up_to_its_pending_wait(
    make_app: Callable[..., keel.App], sink: HttpSink
) -> None:
    app = deployed(make_app, sink)
    run_id = app.submit("charge", job_id="order-2", input=ORDER).run_id
    drain(app)
    before = recorded(app, run_id)
    report = app.replay(run_id)
    assert not report.diverged, report.model_dump()
    assert report.note and "waiting on" in report.note
    assert recorded(app, run_id) == before
    assert sink.requests == []


def test_a_failed_run_replays_its_failure_and_a_fix_is_named(
    make_app: Callable[..., keel.App],
) -> None:
    provider = Provider()
    app = make_app()
    double = async_double(provider)
    app.workflow("grow")(lambda: double_then_check_graph(double, fail=True))
    run_id = app.submit("grow", job_id="g-1", input={"n": 3}).run_id
    drain(app)
    assert app.get_run(run_id).status == "failed"
    assert len(provider.calls) == 1
    # The same graph fails the same way at the same step: no divergence. The async effect
    # awaited by the async node is served from the ledger.
    same = app.replay(run_id)
    assert not same.diverged, same.model_dump()
    assert (same.effects_served, same.last_step) == (1, 2)
    fixed = make_app()
    fixed.workflow("grow")(lambda: double_then_check_graph(double, fail=False))
    report = fixed.replay(run_id)
    assert (report.diverged, report.step, report.nodes) == (True, 2, ["check"])
    (error,) = report.differences
    assert error.what == "error" and "too big" in error.recorded and error.replayed is None
    assert len(provider.calls) == 1, "the replay performed the effect"


SHAPES: dict[str, tuple[Callable[[Any], Any], dict[str, Any]]] = {
    # Each round calls the same effect and waits: one key and one approval per round.
    "loop": (loop_graph, {"rounds": 3, "revision": 0}),
    # Parallel Sends with the same arguments, each waiting for its own approval.
    "fan-out": (lambda n: fanout_graph(n, wait=True), {"copies": 3, "to": "a@x"}),
    # An approval inside a subgraph, between two effects.
    "subgraph": (subgraph_approval_graph, {"to": "a@x"}),
    # LangGraph's own interrupt() (a plain wait): it really pauses the replay, resumed as recorded.
    "plain-interrupt": (plain_interrupt_graph, {"to": "a@x", "log": []}),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_loops_fan_out_and_subgraphs_replay_with_no_divergence(
    make_app: Callable[..., keel.App], shape: str
) -> None:
    build, data = SHAPES[shape]
    provider = Provider()
    app = make_app()
    notify = notify_effect(provider)
    app.workflow(shape)(lambda: build(notify))
    run_id = app.submit(shape, job_id=f"{shape}-1", input=data).run_id
    drain(app)
    decided = 0
    while app.get_run(run_id).status == "waiting":
        for wait in app.get_run(run_id).waits:
            if wait["status"] == "pending":
                app.approve(run_id, by="alice", wait_id=wait["wait_id"])
                decided += 1
        drain(app)
    done = app.get_run(run_id)
    assert done.status == "completed" and decided == len(done.waits) >= 1
    sent = len(provider.deliveries)
    report = app.replay(run_id)
    assert not report.diverged, report.model_dump()
    assert report.approvals_answered == decided
    assert report.effects_served == len(done.effects)
    assert len(provider.deliveries) == sent, "the replay performed an effect"
    # Replayed to the end: the last step is the one of the last effect, the graph's last node.
    assert report.last_step == max(e["step"] for e in done.effects)


def test_an_in_doubt_effect_ends_the_replay_there_unperformed(
    make_app: Callable[..., keel.App],
) -> None:
    """A key the ledger holds as in doubt has no result to serve: the replay stops at it and
    says so (not a divergence: the graph did not change), and calls nothing."""
    provider = Provider()
    app, run_id = in_doubt(make_app, provider, delivered=False)
    calls, before = list(provider.calls), recorded(app, run_id)
    report = app.replay(run_id)
    assert not report.diverged, report.model_dump()
    assert report.note and "in_doubt in the ledger" in report.note
    assert provider.calls == calls, "the replay called the provider"
    assert recorded(app, run_id) == before


class Report(TypedDict, total=False):
    topic: str
    report: str


def write_report(state: Report) -> Report:
    path = keel.artifacts().write_json("report.json", {"topic": state["topic"]})
    return {"report": str(path)}  # the path kept in the state, as a next node would read it


def report_graph() -> StateGraph:
    graph = StateGraph(Report)
    graph.add_node("write", write_report)
    graph.add_edge(START, "write")
    graph.add_edge("write", END)
    return graph


def test_an_artifact_path_kept_in_the_state_replays_with_no_divergence(
    make_app: Callable[..., keel.App],
) -> None:
    app = make_app()
    app.workflow("report")(report_graph)
    run_id = app.submit("report", job_id="r-1", input={"topic": "ai"}).run_id
    drain(app)
    details = app.get_run(run_id)
    assert details.status == "completed" and details.output["report"].endswith("report.json")
    report = app.replay(run_id)
    assert not report.diverged, report.model_dump()
    assert [a.name for a in app.get_run(run_id).artifacts] == ["report.json"]


def forget_graph_shapes(db_url: str) -> None:
    """What a Keel without graph identity let happen: no version is held to a graph."""
    if db_url.startswith("sqlite:"):
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            conn.execute("DELETE FROM keel_graph_shapes")
        return
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("DELETE FROM keel_graph_shapes")


def test_a_run_an_edited_graph_ended_early_diverges_where_its_graph_goes_on(
    make_app: Callable[..., keel.App], db_url: str
) -> None:
    old = versions.register_v1(make_app())
    run_id = old.submit(versions.WORKFLOW, job_id="order-1", input={"order": "o-1"}).run_id
    drain(old)
    forget_graph_shapes(db_url)
    edited = versions.register_edited_v1(make_app())
    edited.approve(run_id, by="manager")
    drain(edited)
    ended = edited.get_run(run_id)
    assert ended.status == "completed" and "shipped_by" not in (ended.output or {})
    report = versions.register_v1(make_app()).replay(run_id)
    assert report.diverged, report.model_dump()
    assert (report.step, report.nodes) == (3, ["ship"])  # what the run never ran
    [route] = report.differences
    assert route.what == "route" and "goes on and runs ship" in route.detail
