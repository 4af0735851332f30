"""A deleted thread's runs stay until retention, and never act on a thread made again under
its id: a failed one is not resumed onto it, and its job is not answered with the old run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

import pytest

import keel
from keel.core.errors import InvalidTransition, JobExists, ThreadNotFound
from tests.support.graphs import one_node
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]


class Echo(TypedDict, total=False):
    text: str
    out: str


def echo_app(make_app: AppFactory, failing: dict[str, bool]) -> keel.App:
    def echo(state: Echo) -> dict[str, Any]:
        if failing["on"]:
            raise RuntimeError("boom")
        return {"out": state.get("text", "").upper()}

    app = make_app()
    app.workflow("echo")(lambda: one_node(Echo, "echo", echo))
    return app


@pytest.mark.parametrize("made_again", [True, False])
def test_a_failed_run_of_a_deleted_thread_is_not_resumed(
    make_app: AppFactory, made_again: bool
) -> None:
    # Onto a thread made again under its id (or onto none): it queued there unseen, held the
    # new thread busy and ran on its checkpoints.
    failing = {"on": True}
    app = echo_app(make_app, failing)
    failed = app.submit("echo", {"text": "old"}, thread_id="t-1").run_id
    drain(app)
    assert app.get_run(failed).status == "failed"
    app.delete_thread("t-1")
    if made_again:
        app.create_thread("echo", thread_id="t-1")
    failing["on"] = False
    with pytest.raises(InvalidTransition, match="deleted"):
        app.resume(failed)
    assert app.get_run(failed).status == "failed"
    if not made_again:
        return
    # The new thread is idle and takes runs of its own; the old run ran on nothing of it.
    assert app.get_thread("t-1")["status"] == "idle"
    fresh = app.submit("echo", {"text": "new"}, thread_id="t-1", multitask_strategy="reject")
    drain(app)
    assert app.get_run(fresh.run_id).status == "completed"
    assert app.get_state("t-1").values == {"text": "new", "out": "NEW"}


def test_a_job_of_a_deleted_thread_is_not_answered_with_its_old_run(
    make_app: AppFactory,
) -> None:
    app = echo_app(make_app, {"on": False})
    first = app.submit("echo", {"text": "hi"}, thread_id="t-3", job_id="ticket-1")
    drain(app)
    assert app.submit("echo", {"text": "hi"}, thread_id="t-3", job_id="ticket-1").created is False
    app.delete_thread("t-3")
    with pytest.raises(JobExists) as refused:
        app.submit("echo", {"text": "hi"}, thread_id="t-3", job_id="ticket-1")
    assert refused.value.runs == [first.run_id]
    with pytest.raises(ThreadNotFound):  # refused whole: not even the thread was made
        app.get_thread("t-3")
    again = app.submit("echo", {"text": "hi"}, thread_id="t-3", job_id="ticket-2")
    drain(app)
    assert [r["run_id"] for r in app.thread_runs("t-3")] == [again.run_id]
    assert app.get_state("t-3").values == {"text": "hi", "out": "HI"}
