"""A workflow version is held to the graph it was first served with: a worker whose graph was
edited under the same version refuses it, and the runs in flight stay queued and stranded, with
a one-line reason, never completed by a graph they were not built for."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

import keel
from keel.core.errors import WorkflowVersionMismatch
from tests.support.apps import versions
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]
RENAMED = "node 'review' renamed to 'signoff'"


def paused_in_review(make_app: AppFactory) -> str:
    old = versions.register_v1(make_app())
    run_id = old.submit(versions.WORKFLOW, job_id="order-1", input={"order": "o-1"})["run_id"]
    drain(old)
    assert old.get_run(run_id).status == "waiting"
    return run_id


def test_an_edited_graph_under_the_same_version_does_not_complete_the_run(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    run_id = paused_in_review(make_app)
    edited = versions.register_edited_v1(make_app())
    versions.register_new(edited)  # the worker has other work, so it starts
    edited.approve(run_id, by="manager")

    with caplog.at_level(logging.ERROR, logger="keel.runtime.worker"):
        stats = drain(edited)
    assert stats.claimed == 0
    [refusal] = [r.getMessage() for r in caplog.records if "refuses" in r.getMessage()]
    assert "order@1" in refusal and RENAMED in refusal and "new version" in refusal

    details = edited.get_run(run_id)
    assert details.status == "queued", "completed by a graph it was not built for"
    assert details.run["output"] is None and details.run["finished_at"] is None
    assert details.stranded and details.stranded_reason is not None
    assert RENAMED in details.stranded_reason
    assert edited.summary(run_id).why.startswith("stranded: workers refuse order@1")
    [listed] = edited.stranded_runs()
    assert listed["run_id"] == run_id and RENAMED in listed["stranded_reason"]

    original = versions.register_v1(make_app())  # the deployment with the right graph
    drain(original)
    done = original.get_run(run_id)
    assert (done.status, done.output["shipped_by"]) == ("completed", "v1")
    assert not done.stranded


def test_a_worker_whose_every_workflow_is_edited_refuses_to_start(make_app: AppFactory) -> None:
    run_id = paused_in_review(make_app)
    edited = versions.register_edited_v1(make_app())
    edited.approve(run_id, by="manager")
    with pytest.raises(WorkflowVersionMismatch, match=f"order@1: {RENAMED}"):
        edited.run_worker(stop_when_idle=True, handle_signals=False)
    assert edited.get_run(run_id).status == "queued"


def test_the_first_graph_served_is_the_versions_and_an_unchanged_one_is_served(
    make_app: AppFactory,
) -> None:
    first = versions.register_v1(make_app())
    drain(first)  # nothing to do, but it records version 1's graph
    edited = versions.register_edited_v1(make_app())
    run_id = edited.submit(versions.WORKFLOW, job_id="order-2", input={"order": "o-2"}).run_id
    with pytest.raises(WorkflowVersionMismatch):
        drain(edited)  # the edited graph came second: it is not version 1's
    again = versions.register_v1(make_app())
    drain(again)  # the same graph, built again, is served
    assert again.get_run(run_id).status == "waiting"


class Routed(TypedDict, total=False):
    n: int
    decision: str


def routed(router_name: str) -> Callable[[], StateGraph]:
    """START -> ask (an approval) -> a router (named `router_name`) -> done | again."""

    def build() -> StateGraph:
        def route(state: Routed) -> Literal["done", "again"]:
            return "done" if state.get("decision") == "approved" else "again"

        route.__name__ = route.__qualname__ = router_name
        g = StateGraph(Routed)
        g.add_node("ask", lambda s: {"decision": keel.approval("m", payload={}).decision})
        g.add_node("done", lambda s: {"n": 1})
        g.add_node("again", lambda s: {"n": 2})
        g.add_edge(START, "ask")
        g.add_conditional_edges("ask", route)
        g.add_edge("done", END)
        g.add_edge("again", END)
        return g

    return build


def test_an_operator_accepts_a_harmless_edit_and_the_version_is_served_again(
    make_app: AppFactory,
) -> None:
    """A router renamed changes the digest (its name is the branch's), not where runs go: the
    operator's word (`keel versions accept`) holds the version to the graph as it is now."""
    first = make_app()
    first.workflow("routed", version="1")(routed("route"))
    run_id = first.submit("routed", job_id="r-1", input={"n": 0}).run_id
    drain(first)
    assert first.get_run(run_id).status == "waiting"
    edited = make_app()
    edited.workflow("routed", version="1")(routed("route_after_ask"))
    edited.approve(run_id, by="m")
    with pytest.raises(WorkflowVersionMismatch, match="conditional edges from 'ask' changed"):
        drain(edited)
    change = edited.accept_graph("routed", "1", by="ops")
    assert change is not None and "conditional edges from 'ask' changed" in change
    assert edited.accept_graph("routed", "1", by="ops") is None, "accepted twice"
    drain(edited)
    assert edited.get_run(run_id).output == {"n": 1, "decision": "approved"}


def test_accepting_an_edit_that_strands_a_paused_run_is_refused_and_changes_nothing(
    make_app: AppFactory,
) -> None:
    run_id = paused_in_review(make_app)
    edited = versions.register_edited_v1(make_app())
    with pytest.raises(WorkflowVersionMismatch) as refused:
        edited.accept_graph(versions.WORKFLOW, "1", by="ops")
    assert f"run {run_id}: node 'review' is not in that version" in str(refused.value)
    assert RENAMED in str(refused.value) and "new version" in str(refused.value)
    edited.approve(run_id, by="manager")
    with pytest.raises(WorkflowVersionMismatch, match=RENAMED):
        drain(edited)  # still held to the graph it was first served with
    assert edited.get_run(run_id).status == "queued"
