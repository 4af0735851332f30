"""Outbox effects in runs executed in this process, against a real HTTP provider on 127.0.0.1.

An intent exists only once its step committed (a node that pauses or fails before its end
leaves none), a dead letter waits for a person and is delivered once after `retry`, a replay
with other arguments is refused, and a finished run says which of its effects are undelivered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from typer.testing import CliRunner

import keel
from keel.cli.commands import cli
from keel.core.effects import outbox as effect_outbox
from keel.core.effects.dispatch import retry as retry_intent
from keel.testing.http import HttpSink
from tests.support.outbox_flows import State, drain, enqueue, graph, mail, serving, wait

AppFactory = Callable[..., keel.App]


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[HttpSink]:
    with serving(monkeypatch) as sink:
        yield sink


def test_a_dead_letter_is_listed_retried_by_command_and_delivered_once(
    make_app: AppFactory, provider: HttpSink, db_url: str
) -> None:
    app = make_app()
    app.workflow("dead", version="1")(graph(("enqueue", enqueue), ("wait", wait)))
    run_id = app.submit("dead", job_id="d-1", input={"to": "ann@example.com"}).run_id
    provider.refuse(500)  # an outage that outlasts every attempt
    drain(app)
    (dead,) = app.effect_intents(state="dead")
    assert dead["attempts"] == 3 and "gave up after 3 attempts" in dead["error"]
    assert app.get_run(run_id).status == "waiting"  # the run awaits it: a person decides
    # ... with `keel effects`: an outbox wait is no approval, and approval inboxes omit it.
    assert [w["kind"] for w in app.get_run(run_id).waits] == ["outbox"]
    assert app.pending_waits() == []
    counted = {(r["effect"], r["status"]): r["n"] for r in app.metrics_snapshot()["intents"]}
    assert counted == {("rt_mail", "dead"): 1}  # keel_effect_intents{state="dead"} on /metrics
    runner = CliRunner()
    listed = runner.invoke(cli, ["effects", "list", "--state", "dead", "--json", "--db", db_url])
    assert listed.exit_code == 0, listed.output
    assert dead["intent_id"] in listed.output
    provider.accept()  # the provider is fixed
    retried = runner.invoke(cli, ["effects", "retry", dead["intent_id"], "--db", db_url])
    assert retried.exit_code == 0, retried.output
    drain(app)
    details = app.get_run(run_id)
    assert details.status == "completed", details.timeline
    assert len(provider.deliveries) == 1
    assert details.output["result"] == {"ok": True, "delivery": 1}
    kinds = [e["kind"] for e in details.timeline]
    assert kinds.index("outbox.dead") < kinds.index("outbox.retried")
    assert kinds.index("outbox.retried") < kinds.index("outbox.delivered")
    shown = runner.invoke(cli, ["runs", "show", run_id, "--db", db_url])
    assert shown.exit_code == 0 and dead["intent_id"] in shown.output, shown.output
    again = runner.invoke(cli, ["effects", "retry", dead["intent_id"], "--db", db_url])
    assert again.exit_code == 1 and "only a dead intent" in again.output


def test_a_node_that_pauses_after_enqueueing_records_its_intent_only_when_it_commits(
    make_app: AppFactory, provider: HttpSink
) -> None:
    def ask_then_send(state: State) -> State:
        handle = mail(state["to"])
        decision = keel.approval("send?", timeout="1h")  # the node stops here, uncommitted
        return {"handle": handle, "approved": decision.approved}

    app = make_app()
    app.workflow("ask", version="1")(graph(("ask", ask_then_send)))
    run_id = app.submit("ask", job_id="a-1", input={"to": "bo@example.com"}).run_id
    drain(app)
    assert app.get_run(run_id).status == "waiting"
    assert app.effect_intents(run_id=run_id) == []
    assert provider.deliveries == []
    app.approve(run_id, by="alice")
    drain(app)
    assert app.get_run(run_id).status == "completed"
    assert [i["status"] for i in app.effect_intents(run_id=run_id)] == ["delivered"]
    assert len(provider.deliveries) == 1


def test_a_node_that_fails_after_enqueueing_leaves_no_intent(
    make_app: AppFactory, provider: HttpSink
) -> None:
    def send_then_fail(state: State) -> State:
        mail(state["to"])
        raise RuntimeError("the node fails after enqueueing")

    app = make_app()
    app.workflow("fails", version="1")(graph(("fails", send_then_fail)))
    run_id = app.submit("fails", job_id="f-1", input={"to": "cy@example.com"}).run_id
    drain(app)
    assert app.get_run(run_id).status == "failed"
    assert app.effect_intents(run_id=run_id) == []
    assert provider.deliveries == []


def test_a_finished_run_says_which_effects_are_undelivered(
    make_app: AppFactory, provider: HttpSink
) -> None:
    app = make_app()
    app.workflow("fire", version="1")(graph(("enqueue", enqueue)))
    run_id = app.submit("fire", job_id="u-1", input={"to": "di@example.com"}).run_id
    provider.refuse(500)
    drain(app)
    summary = app.summary(run_id)
    assert summary.status == "completed"
    assert summary.undelivered == 1 and summary.intents == {"dead": 1}
    assert "1 outbox effect(s) undelivered" in summary.outcome
    assert "1 dead" in summary.why


def test_a_replay_with_other_arguments_is_refused(make_app: AppFactory, provider: HttpSink) -> None:
    """A step's intent committed; its step staged again (a replay) with another address is
    NondeterminismError in the step's own transaction: nothing of the replay commits."""
    app = make_app()
    app.workflow("replay", version="1")(graph(("enqueue", enqueue)))
    run_id = app.submit("replay", job_id="r-1", input={"to": "ed@example.com"}).run_id
    drain(app)
    (intent,) = app.effect_intents(run_id=run_id)
    identity = mail.arguments.identity(("someone-else@example.com",), {})
    replayed = effect_outbox._Intent(
        intent["intent_id"],
        {**_row(app, intent["intent_id"]), "args_hash": identity.digest},
        identity,
    )
    store = app.aio.runtime.store

    async def replay() -> None:
        async with store.transaction() as tx:
            await replayed(store, tx)

    with pytest.raises(keel.NondeterminismError, match=r"rt_mail.*changed: to"):
        app.aio.runtime.portal.call(replay())
    assert len(app.effect_intents(run_id=run_id)) == 1
    assert len(provider.deliveries) == 1


def _row(app: keel.App, intent_id: str) -> dict[str, Any]:
    row = app.aio.runtime.portal.call(app.aio.runtime.store.get_intent(intent_id))
    assert row is not None
    return dict(row)


def test_await_effect_and_the_outbox_wait_refuse_what_they_cannot_take(
    make_app: AppFactory, provider: HttpSink
) -> None:
    def bad(state: State) -> State:
        return {"result": keel.await_effect("not-an-intent")}

    app = make_app()
    app.workflow("bad", version="1")(graph(("bad", bad)))
    run_id = app.submit("bad", job_id="b-1", input={}).run_id
    drain(app)
    details = app.get_run(run_id)
    assert details.status == "failed" and "intent id" in details.run["error"]
    with pytest.raises(keel.KeelError, match="no outbox intent"):
        app.aio.runtime.portal.call(retry_intent(app.aio.runtime.services, "outbox:nope:0"))


class Many(TypedDict, total=False):
    to: str
    handles: list[str]
    results: list[Any]


def test_await_effects_waits_for_many_intents_in_one_pause(
    make_app: AppFactory, provider: HttpSink
) -> None:
    def send_three(state: Many) -> Many:
        return {"handles": [mail(f"{state['to']}-{n}") for n in range(3)]}

    def wait_all(state: Many) -> Many:
        return {"results": keel.await_effects(state["handles"])}

    def build() -> StateGraph:
        g = StateGraph(Many)
        g.add_node("send_three", send_three)
        g.add_node("wait_all", wait_all)
        g.add_edge(START, "send_three")
        g.add_edge("send_three", "wait_all")
        g.add_edge("wait_all", END)
        return g

    app = make_app()
    app.workflow("many")(build)
    run_id = app.submit("many", job_id="m-1", input={"to": "ana"}).run_id
    drain(app)
    details = app.get_run(run_id)
    assert details.status == "completed"
    assert len(details.waits) == 1, "one pause for the three intents, not three"
    handles = details.output["handles"]
    results = details.output["results"]  # in the order of the handles, whatever the delivery's
    assert [provider.deliveries[r["delivery"] - 1].idempotency_key for r in results] == handles
    assert len(provider.deliveries) == 3
    claims = [e for e in details.timeline if e["kind"] in ("lease.claimed", "lease.takeover")]
    assert len(claims) <= 2  # the first execution, and the one resumed by the last delivery


def test_await_effects_of_nothing_returns_nothing_and_checks_its_handles() -> None:
    assert keel.await_effects([]) == []
    with pytest.raises(keel.KeelError, match="intent id"):
        keel.await_effects(["outbox:x:0", "nope"])
