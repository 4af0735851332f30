"""Wait notifications through the outbox: request, reminder, escalation, decision, each once —
with racing dispatchers and sweepers, and never twice after a sender died mid-delivery."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

import keel
from keel.core import notification_outbox
from tests.support.notifiers import Recorder


class State(TypedDict, total=False):
    decision: str


def ask(state: State) -> State:
    answer = keel.approval(
        "editor",
        payload={"title": "Weekly"},
        approvers=["ed@example.com"],
        remind_after="1h",
        escalate_after="2h",
        escalate_to=["chief@example.com"],
        timeout="3h",
    )
    return {"decision": answer.decision}


def build() -> StateGraph:
    g = StateGraph(State)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g


def _on_loop(app: keel.App, fn: Callable[[], Any]) -> Any:
    async def go() -> Any:
        await app.aio.open()
        return await fn()

    return app.aio.runtime.portal.call(go())


def _race(apps: list[keel.App], make: Callable[[keel.App], Callable[[], Any]]) -> None:
    threads = [threading.Thread(target=_on_loop, args=(a, make(a))) for a in apps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_each_notification_is_delivered_once_across_racing_workers(make_app) -> None:
    clock = keel.ManualClock()
    recorder = Recorder()
    apps = [make_app(clock=clock) for _ in range(3)]
    for app in apps:
        app.workflow("ask")(build)
        app.add_notifier(recorder)
    main = apps[0]
    run_id = main.submit("ask", job_id="notify", input={})["run_id"]
    main.run_worker(stop_when_idle=True, handle_signals=False)

    def dispatch_all() -> None:
        _race(apps, lambda a: lambda: a.aio.runtime.dispatch(f"w-{id(a)}"))

    def sweep_all() -> None:
        _race(apps, lambda a: lambda: a.aio.runtime.sweep())

    dispatch_all()
    assert [n.kind for n in recorder.sent] == ["request"]
    assert recorder.sent[0].wait["approvers"] == ["ed@example.com"]
    clock.advance(3600)
    sweep_all()
    dispatch_all()
    clock.advance(3600)
    sweep_all()
    sweep_all()
    dispatch_all()
    assert [n.kind for n in recorder.sent] == ["request", "remind", "escalate"]
    assert recorder.sent[2].details["to"] == ["chief@example.com"]
    result = main.approve(run_id, by="chief@example.com")
    assert result.recorded
    dispatch_all()
    dispatch_all()
    decided = recorder.sent[-1]
    assert decided.kind == "decided" and decided.details["decision"] == "approved"
    assert decided.earlier["request"] == {"ts": "request-1"}, "a decision can edit the request"
    assert Counter(n.kind for n in recorder.sent) == Counter(
        {"request": 1, "remind": 1, "escalate": 1, "decided": 1}
    )
    main.run_worker(stop_when_idle=True, handle_signals=False)
    details = main.get_run(run_id)
    assert details.status == "completed"
    kinds = [e["kind"] for e in details.timeline]
    assert kinds.count("notification.delivered") == 4
    assert kinds.count("wait.reminded") == 1 and kinds.count("wait.escalated") == 1


def test_a_notification_whose_sender_died_is_not_sent_twice(make_app) -> None:
    clock = keel.ManualClock()
    plain = Recorder("plain")
    reconciling = Recorder("reconciling", reconcile=True)
    app = make_app(clock=clock, lease_ttl=30)
    app.workflow("ask")(build)
    app.add_notifier(plain)
    app.add_notifier(reconciling)
    run_id = app.submit("ask", job_id="died", input={})["run_id"]
    app.run_worker(stop_when_idle=True, handle_signals=False)
    # The idle worker delivered the approval requests before it left.
    assert [n.kind for n in plain.sent] == [n.kind for n in reconciling.sent] == ["request"]
    app.approve(run_id, by="ed")  # records one `decided` intent per notifier, undelivered
    # A dispatcher claims both intents and dies before settling them (no send recorded here).
    for _ in range(2):
        assert (
            _on_loop(app, lambda: notification_outbox._claim(app.aio.runtime.store, "dead", 30))
            is not None
        )
    clock.advance(31)
    _on_loop(app, lambda: app.aio.runtime.dispatch("alive"))
    assert [n.kind for n in plain.sent] == [n.kind for n in reconciling.sent] == ["request"]
    decided = {
        r["notifier"]: r["status"]
        for r in app.get_run(run_id).notifications
        if r["kind"] == "decided"
    }
    assert decided == {"plain": "in_doubt", "reconciling": "delivered"}
