"""A resume of a thread no run waits on: a new run only where LangGraph's would be one and
nothing Keel promised is bypassed.

After a state update ends a run paused on a plain `interrupt()`, a `command.resume` runs the
checkpoint's pending node as a new run (as LangGraph resumes a checkpoint), and so does a copy
of a thread paused on one (`keel.interrupt()` is one too: the same wait kind). A failed run's
checkpoint, a cancelled approval and a copy of an approval are not such pauses: a new run there
performed the failed node's effects a second time, and took a caller-written decision past an
approval's approvers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypedDict

import pytest
from langgraph.types import interrupt

import keel
from keel.core.errors import NoPendingWait
from tests.support.checks import wait_until
from tests.support.graphs import one_node
from tests.support.providers import Provider
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]


class Order(TypedDict, total=False):
    amount: int
    out: str


def refund_app(make_app: AppFactory) -> tuple[keel.App, Provider]:
    """A `refund` workflow whose one node asks alice's approval, then refunds (the provider
    counts refunds made)."""
    refunds = Provider()

    @keel.effect("refund")
    def refund(amount: int, *, idempotency_key: str = keel.KEY) -> Any:
        return refunds.deliver(idempotency_key, {"amount": amount})

    def ask(state: Order) -> dict[str, Any]:
        decided = keel.approval("refund", payload=state, approvers=["alice"], timeout="1h")
        if decided.decision != "approve":
            return {"out": "rejected"}
        refund(state["amount"])
        return {"out": f"refunded by {decided.by}"}

    app = make_app()
    app.workflow("refund")(lambda: one_node(Order, "ask", ask))
    return app, refunds


def test_a_failed_runs_checkpoint_is_not_resumed_by_a_new_run(make_app: AppFactory) -> None:
    mails = Provider()
    failing = {"on": True}

    @keel.effect("email")
    def email(to: str, *, idempotency_key: str = keel.KEY) -> Any:
        return mails.deliver(idempotency_key, {"to": to})

    def send(state: Order) -> dict[str, Any]:
        email("ana@example.com")
        if failing["on"]:
            raise RuntimeError("the provider answered 500 after the email")
        return {"out": "sent"}

    app = make_app()
    app.workflow("mail")(lambda: one_node(Order, "send", send))
    failed = app.submit("mail", {"amount": 1}, thread_id="t-fail").run_id
    drain(app)
    assert app.get_run(failed).status == "failed"
    assert app.get_state("t-fail").next == ("send",)
    failing["on"] = False
    with pytest.raises(NoPendingWait):
        app.submit("mail", None, thread_id="t-fail", command={"resume": "go on"})
    drain(app)
    assert len(mails.deliveries) == 1
    # The failed run itself is still the one to resume, and its recorded email is served.
    app.resume(failed)
    drain(app)
    assert app.get_run(failed).status == "completed"
    assert len(mails.deliveries) == 1


def test_a_cancelled_approval_is_not_decided_by_a_resume(make_app: AppFactory) -> None:
    app, refunds = refund_app(make_app)
    run = app.submit("refund", {"amount": 500}, thread_id="t-refund").run_id
    drain(app)
    app.cancel(run, by="ops")
    drain(app)
    assert app.get_run(run).status == "cancelled"
    assert app.get_state("t-refund").next == ("ask",)
    forged = {"decision": "approve", "by": "mallory"}
    with pytest.raises(NoPendingWait):
        app.submit("refund", None, thread_id="t-refund", command={"resume": forged})
    drain(app)
    assert refunds.deliveries == []


def test_a_resume_after_a_state_update_is_a_new_run_of_the_pending_node(
    make_app: AppFactory,
) -> None:
    asked: list[Any] = []

    def question(state: Order) -> dict[str, Any]:
        answer = interrupt("how much?")
        asked.append(answer)
        return {"out": f"answered {answer}"}

    app = make_app()
    app.workflow("ask")(lambda: one_node(Order, "question", question))
    paused = app.submit("ask", {"amount": 1}, thread_id="t-ask").run_id
    drain(app)
    updating = threading.Thread(target=lambda: app.update_state("t-ask", {"amount": 2}))
    updating.start()  # it returns once a worker has executed the update's run
    wait_until(lambda: len(app.thread_runs("t-ask")) == 2, 10, "the update's run")
    drain(app)
    updating.join(30)
    assert app.get_run(paused).status == "cancelled"
    resumed = app.submit("ask", None, thread_id="t-ask", command={"resume": "three"})
    drain(app)
    assert resumed.run_id != paused
    assert app.get_run(resumed.run_id).status == "completed"
    assert app.get_state("t-ask").values == {"amount": 2, "out": "answered three"}
    # Answered, the thread has no pause left: another resume is refused.
    with pytest.raises(NoPendingWait):
        app.submit("ask", None, thread_id="t-ask", command={"resume": "four"})


def test_a_copy_of_a_thread_paused_on_keel_interrupt_is_resumed_by_a_new_run(
    make_app: AppFactory,
) -> None:
    asked: list[Any] = []

    def question(state: Order) -> dict[str, Any]:
        answer = keel.interrupt("how much?", timeout="1h")
        asked.append(answer)
        return {"out": f"answered {answer}"}

    app = make_app()
    app.workflow("ask")(lambda: one_node(Order, "question", question))
    paused = app.submit("ask", {"amount": 1}, thread_id="t-orig").run_id
    drain(app)
    app.copy_thread("t-orig", to="t-copy")
    resumed = app.submit("ask", None, thread_id="t-copy", command={"resume": "three"})
    drain(app)
    assert resumed.run_id != paused
    assert app.get_run(resumed.run_id).status == "completed"
    assert app.get_state("t-copy").values == {"amount": 1, "out": "answered three"}
    assert asked == ["three"]
    # The original still waits on its own run, answered through its wait.
    assert app.get_run(paused).status == "waiting"
    assert app.get_state("t-orig").values == {"amount": 1}


def test_a_copy_of_a_thread_paused_on_an_approval_is_not_decided_by_a_resume(
    make_app: AppFactory,
) -> None:
    app, refunds = refund_app(make_app)
    app.submit("refund", {"amount": 500}, thread_id="t-orig")
    drain(app)
    app.copy_thread("t-orig", to="t-copy")
    assert app.get_state("t-copy").next == ("ask",)
    forged = {"decision": "approve", "by": "mallory"}
    with pytest.raises(NoPendingWait):
        app.submit("refund", None, thread_id="t-copy", command={"resume": forged})
    drain(app)
    assert app.thread_runs("t-copy") == []
    assert refunds.deliveries == []
