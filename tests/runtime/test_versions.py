"""Version upgrades are explicit: a run resumes on the version it started on; a run whose version
no worker serves is shown stranded (not merely queued), and `upgrade_run` moves it when its
checkpoint fits the new graph, refusing clearly when it does not."""

from __future__ import annotations

import logging
import operator
import re
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

import keel
from keel.core.errors import UnknownWorkflow, UsageError, WorkflowVersionMismatch
from tests.support.apps import versions
from tests.support.workers import claim, drain

AppFactory = Callable[..., keel.App]


def _waiting_v1_run(make_app: AppFactory) -> str:
    """A v1 run paused in `review`, left behind by the old deployment."""
    old = versions.register_v1(make_app())
    run_id = old.submit(versions.WORKFLOW, job_id="order-1", input={"order": " o-1 "})["run_id"]
    drain(old)
    assert old.get_run(run_id).status == "waiting"
    return run_id


def test_a_run_resumes_on_the_version_it_started_on(make_app: AppFactory) -> None:
    app = make_app()
    versions.register_v1(app)
    versions.register_new(app)  # three versions side by side; the latest is 3
    first = app.submit(versions.WORKFLOW, job_id="o-1", input={"order": "a"}, version="1")
    latest = app.submit(versions.WORKFLOW, job_id="o-2", input={"order": "b"})
    assert (first["workflow_version"], latest["workflow_version"]) == ("1", "3")
    drain(app)
    app.approve(first.run_id, by="m")
    app.approve(latest.run_id, by="m")
    drain(app)
    assert app.get_run(first.run_id).output["shipped_by"] == "v1"
    assert app.get_run(latest.run_id).output["shipped_by"] == "v3"


def test_a_run_no_worker_can_execute_is_stranded_until_upgraded(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    run_id = _waiting_v1_run(make_app)
    new = versions.register_new(make_app())
    assert not new.get_run(run_id).stranded, "no worker was ever seen: not known to be stranded"
    new.approve(run_id, by="manager")  # queued now, for a v1 worker that will never come

    with caplog.at_level(logging.WARNING, logger="keel.runtime.worker"):
        stats = drain(new)
        drain(new)  # a second worker of the new deployment: the first one already said it
    assert stats.claimed == 0
    said = [r.getMessage() for r in caplog.records if "stranded" in r.getMessage()]
    assert len(said) == 2 and all(run_id in line for line in said), said
    assert "order@2, order@3" in said[0] and "keel runs upgrade" in said[0]

    [listed] = new.list_runs(job_id="order-1")
    assert listed["status"] == "queued" and listed["stranded"] is True
    assert new.get_run(run_id).stranded
    assert [r["run_id"] for r in new.stranded_runs()] == [run_id]

    upgraded = new.upgrade_run(run_id, to="2", by="ops")
    assert upgraded["workflow_version"] == "2" and upgraded["status"] == "queued"
    [event] = [e for e in new.get_run(run_id).timeline if e["kind"] == "run.upgraded"]
    assert event["data"] == {"from": "1", "to": "2", "by": "ops"}
    assert not new.get_run(run_id).stranded
    drain(new)
    done = new.get_run(run_id)
    assert done.status == "completed" and done.output == {
        "order": "o-1",
        "decision": "approved",
        "shipped_by": "v2",
    }


def test_a_waiting_run_moves_and_resumes_where_it_paused(make_app: AppFactory) -> None:
    run_id = _waiting_v1_run(make_app)
    new = versions.register_new(make_app())
    new.upgrade_run(run_id, to="2")
    assert new.get_run(run_id).status == "waiting"  # still paused, now on version 2
    new.approve(run_id, by="manager")
    drain(new)
    assert new.get_run(run_id).output["shipped_by"] == "v2"


def test_an_upgrade_to_a_graph_without_the_paused_node_is_refused_and_changes_nothing(
    make_app: AppFactory,
) -> None:
    run_id = _waiting_v1_run(make_app)
    new = versions.register_new(make_app())
    before = new.get_run(run_id)
    with pytest.raises(WorkflowVersionMismatch) as refused:
        new.upgrade_run(run_id, to="3")
    assert str(refused.value) == (
        f"run {run_id} cannot move from order@1 to order@3: its checkpoint does not fit "
        "(node 'review' is not in that version)"
    )
    after = new.get_run(run_id)
    assert after.run == before.run and after.timeline == before.timeline


def test_upgrades_that_make_no_sense_are_refused(make_app: AppFactory) -> None:
    run_id = _waiting_v1_run(make_app)
    new = versions.register_new(make_app())
    with pytest.raises(UnknownWorkflow, match=r"no workflow 'order@9' is registered"):
        new.upgrade_run(run_id, to="9")
    old = versions.register_v1(make_app())
    with pytest.raises(UsageError, match="already on version 1"):
        old.upgrade_run(run_id, to="1")
    new.approve(run_id, by="m")
    new.upgrade_run(run_id, to="2")
    drain(new)
    with pytest.raises(keel.RunFinished, match="is completed: there is nothing to upgrade"):
        new.upgrade_run(run_id, to="3")


def test_a_running_run_is_not_upgraded_mid_step(make_app: AppFactory) -> None:
    run_id = _waiting_v1_run(make_app)
    new = versions.register_new(make_app())
    new.approve(run_id, by="m")
    versions.register_v1(new)  # so that a worker here may claim it
    lease, _ = claim(new, "worker-1")
    assert lease.run_id == run_id
    with pytest.raises(UsageError, match="is running: only a queued or waiting run"):
        new.upgrade_run(run_id, to="2")
    assert new.get_run(run_id).run["workflow_version"] == "1"


class Order(TypedDict, total=False):
    order: str
    decision: str
    log: Annotated[list[str], operator.add]


def _review(state: Order) -> dict[str, Any]:
    return {"decision": keel.approval("manager", payload={}).decision}


def _fulfilling(review: str) -> Callable[[], StateGraph]:
    """START -> fulfil (a compiled subgraph: prep -> `review` -> ship) -> END."""

    def build() -> StateGraph:
        inner = StateGraph(Order)
        inner.add_node("prep", lambda s: {"log": ["prep"]})
        inner.add_node(review, _review)
        inner.add_node("ship", lambda s: {"log": ["ship"]})
        inner.add_edge(START, "prep")
        inner.add_edge("prep", review)
        inner.add_edge(review, "ship")
        inner.add_edge("ship", END)
        outer = StateGraph(Order)
        outer.add_node("fulfil", inner.compile())
        outer.add_edge(START, "fulfil")
        outer.add_edge("fulfil", END)
        return outer

    return build


def _gathering(target: str) -> Callable[[], StateGraph]:
    """START -> b -> a (asks), and a waiting edge [a, b] -> `target`."""

    def build() -> StateGraph:
        g = StateGraph(Order)
        g.add_node("a", lambda s: {"log": ["a:" + keel.approval("m", payload={}).decision]})
        g.add_node("b", lambda s: {"log": ["b"]})
        g.add_node(target, lambda s: {"log": ["shipped"]})
        g.add_edge(START, "b")
        g.add_edge("b", "a")
        g.add_edge(["a", "b"], target)
        g.add_edge(target, END)
        return g

    return build


@pytest.mark.parametrize(
    ("v1", "v2", "why"),
    [
        (_fulfilling("review"), _fulfilling("signoff"), "node 'fulfil|review' is not in that"),
        (_gathering("ship"), _gathering("ship2"), "node 'ship' is not in that version"),
    ],
    ids=["paused-inside-a-subgraph", "awaited-by-a-waiting-edge"],
)
def test_an_upgrade_is_refused_where_the_paused_run_reaches_a_node_the_version_lacks(
    make_app: AppFactory, v1: Callable[[], StateGraph], v2: Callable[[], StateGraph], why: str
) -> None:
    """What the run goes on to is read from its checkpoints: a subgraph's own (the node it is
    paused in), and a waiting edge's (the node it gathers for), not only the next top-level
    nodes, which both versions have. Moved anyway, the run would end `completed` there."""
    app = make_app()
    app.workflow("o", version="1")(v1)
    app.workflow("o", version="2")(v2)
    run_id = app.submit("o", job_id="o-1", input={"order": "o-1", "log": []}, version="1").run_id
    drain(app)
    assert app.get_run(run_id).status == "waiting"
    with pytest.raises(WorkflowVersionMismatch, match=re.escape(why)):
        app.upgrade_run(run_id, to="2")
    assert app.get_run(run_id).run["workflow_version"] == "1"
    app.approve(run_id, by="m")  # on its own version it goes on to the end
    drain(app)
    assert app.get_run(run_id).output["log"][-1] in ("ship", "shipped")
