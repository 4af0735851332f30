"""A `Send` fan-out's steps are named on the timeline by their node and index, not by
LangGraph's internal task path, on the first execution and after a resume."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keel
from tests.support.graphs import fanout_graph, notify_effect
from tests.support.providers import Provider
from tests.support.workers import drain


def steps(app: keel.App, run_id: str) -> list[dict[str, Any]]:
    return [e["data"] for e in app.get_run(run_id).timeline if e["kind"] == "step"]


def test_send_branches_are_named_by_node_and_index(make_app: Callable[..., keel.App]) -> None:
    app = make_app()
    notify = notify_effect(Provider())
    app.workflow("fan")(lambda: fanout_graph(notify))
    run = app.submit("fan", job_id="fan-1", input={"to": "a@example.com", "copies": 3})
    drain(app)
    assert app.get_run(run.run_id).status == "completed"
    branches = [s for s in steps(app, run.run_id) if s["node"] == "deliver"]
    assert sorted(s["index"] for s in branches) == [0, 1, 2]
    assert not [s for s in steps(app, run.run_id) if "__pregel" in s["node"]]


def test_send_branches_resumed_after_a_wait_keep_their_names(
    make_app: Callable[..., keel.App],
) -> None:
    app = make_app()
    notify = notify_effect(Provider())
    app.workflow("fan")(lambda: fanout_graph(notify, wait=True))
    run = app.submit("fan", job_id="fan-2", input={"to": "a@example.com", "copies": 2})
    drain(app)
    for wait in app.get_run(run.run_id).waits:
        app.approve(run.run_id, wait_id=wait["wait_id"], by="alice")
    restarted = make_app()  # a new process: nothing remembered of the first execution
    restarted.workflow("fan")(lambda: fanout_graph(notify, wait=True))
    drain(restarted)
    assert restarted.get_run(run.run_id).status == "completed"
    named = steps(restarted, run.run_id)
    assert not [s for s in named if "__pregel" in s["node"]], named
    # Each branch ran to its approval, then again on the resume.
    assert sorted(s["index"] for s in named if s["node"] == "deliver") == [0, 0, 1, 1]
