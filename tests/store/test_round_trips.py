"""What each operation costs the database, counted at the driver (tests/support/roundtrips.py):
PostgreSQL round trips of Keel's own statements (the pool's checks at checkout counted apart)
and SQLite database-thread calls. One statement, its own transaction, is one of each."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

import keel
from keel.core import leases, notification_outbox, runs, waits
from keel.core.errors import LeaseLost, RunNotFound
from keel.core.lifecycle import Status
from tests.support import by_hand
from tests.support.graphs import echo_graph, held_graph, notify_effect, review_graph
from tests.support.notifiers import Recorder
from tests.support.providers import Provider
from tests.support.roundtrips import Count, counting
from tests.support.workers import claim, execute

AppFactory = Callable[..., keel.App]


def _counted(app: keel.App, step: Callable[[], Any]) -> tuple[Any, Count]:
    async def go() -> tuple[Any, Count]:
        await app.aio.open()
        with counting() as count:
            result = await step()
        return result, count

    return app.aio.runtime.portal.call(go())


def _one_trip(count: Count) -> None:
    # PostgreSQL: one statement (whatever the pool's checks add); SQLite: one call in all.
    assert count.statements == 1, count.kinds


def test_a_claim_is_one_statement_and_writes_its_event(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("echo")(echo_graph)
    run = app.submit("echo", job_id="rt-claim", input={"text": "a"})["run_id"]
    rt = app.aio.runtime
    got, count = _counted(
        app, lambda: leases.claim(rt.store, "w-a", rt.workflows.keys(), rt.lease_ttl)
    )
    _one_trip(count)
    lease, row = got
    assert (row["run_id"], lease.token, row["first_claim"]) == (run, 1, 1)
    claimed = [e for e in app.get_run(run).timeline if e["kind"] == "lease.claimed"]
    assert [(e["data"]["from"], e["data"]["to"], e["lease_token"]) for e in claimed] == [
        ("queued", "running", 1)
    ]
    assert claimed[0]["data"]["expires_at"] == pytest.approx(row["lease_expires_at"])


def test_a_claim_under_a_concurrency_limit_is_one_message(make_app: AppFactory) -> None:
    """With a workflow's `max_concurrency`, the claims' lock and the claim go together: one
    round trip on PostgreSQL (one call on SQLite), and the limit holds."""
    app = make_app()
    app.workflow("echo", max_concurrency=1)(echo_graph)
    first = app.submit("echo", job_id="rt-limit-1", input={"text": "a"})["run_id"]
    second = app.submit("echo", job_id="rt-limit-2", input={"text": "b"})["run_id"]
    rt = app.aio.runtime
    limits = rt.workflows.limits()
    assert limits, "the workflow's limit is in force"

    def take() -> Any:
        return leases.claim(rt.store, "w-a", rt.workflows.keys(), rt.lease_ttl, limits)

    got, count = _counted(app, take)
    _one_trip(count)
    assert got is not None and got[0].run_id == first
    again, count = _counted(app, take)
    _one_trip(count)
    assert again is None  # the first runs: the limit leaves the second queued
    assert app.get_run(second).status == "queued"


def test_a_takeover_is_one_statement_with_the_previous_owner(make_app: AppFactory) -> None:
    # The real clock: a test clock costs a round trip per checkout to hand its time over.
    app = make_app()
    app.workflow("echo")(echo_graph)
    run = app.submit("echo", job_id="rt-takeover", input={"text": "a"})["run_id"]
    dead, _ = claim(app, "w-dead")
    rt = app.aio.runtime
    assert rt.portal.call(leases.end_dead(rt.store, run, dead.token))
    got, count = _counted(
        app, lambda: leases.claim(rt.store, "w-b", rt.workflows.keys(), rt.lease_ttl)
    )
    _one_trip(count)
    lease, row = got
    assert (lease.token, row["crash_count"], row["first_claim"]) == (2, 1, 0)
    takeover = [e for e in app.get_run(run).timeline if e["kind"] == "lease.takeover"]
    assert [(e["data"]["previous_owner"], e["lease_token"]) for e in takeover] == [("w-dead", 2)]


def test_nothing_to_claim_is_one_statement(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("echo")(echo_graph)
    rt = app.aio.runtime
    got, count = _counted(
        app, lambda: leases.claim(rt.store, "w-a", rt.workflows.keys(), rt.lease_ttl)
    )
    assert got is None
    _one_trip(count)


def test_a_worker_saying_it_is_alive_is_one_statement(make_app: AppFactory) -> None:
    app = make_app()
    store = app.aio.runtime.store
    _, count = _counted(
        app,
        lambda: store.upsert_worker("w-a", host="h", pid=1, concurrency=2, workflows=["a@1"]),
    )
    _one_trip(count)
    _, count = _counted(app, lambda: store.stop_worker("w-a"))
    _one_trip(count)


def test_an_idle_heartbeat_renews_nothing_and_costs_nothing(make_app: AppFactory) -> None:
    app = make_app()
    _, count = _counted(app, lambda: leases.renew(app.aio.runtime.store, [], 30))
    assert count.trips == 0, count.kinds


def test_what_is_due_for_an_idle_worker_is_one_read(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("review")(lambda: review_graph(notify_effect(Provider())))
    store, keys = app.aio.runtime.store, app.aio.runtime.workflows.keys()
    due, count = _counted(app, lambda: store.next_due(keys, outbox=True))
    assert (due.queued, due.lease_in, due.sweep_in) == (False, None, None)
    if app.aio.runtime.connector.dialect == "postgres":
        _one_trip(count)
    run = app.submit("review", job_id="rt-due", input={"to": "a@x"})["run_id"]
    assert app.aio.runtime.portal.call(store.next_due(keys, outbox=True)).queued
    execute(app, *claim(app, "w-a"))  # waits for the manager, 1 h
    due = app.aio.runtime.portal.call(store.next_due(keys, outbox=False))
    assert not due.queued and due.lease_in is None
    assert due.sweep_in is not None and 3500 < due.sweep_in <= 3600, run


class CountingReads:
    """Counts the checkpoint reads that reach the database: calls to the upstream saver's
    `aget_tuple` (LangGraph's loop's own included), under Keel's saver."""

    def __init__(self, app: keel.App, monkeypatch: pytest.MonkeyPatch) -> None:
        saver = app.aio.runtime.fencing()
        upstream = next(
            c
            for c in type(saver).__mro__
            if "aget_tuple" in vars(c) and not c.__module__.startswith("keel.")
        )
        self.reads = 0
        original = upstream.aget_tuple

        async def aget_tuple(this: Any, config: Any) -> Any:
            self.reads += 1
            return await original(this, config)

        monkeypatch.setattr(upstream, "aget_tuple", aget_tuple)


def test_a_first_execution_reads_no_checkpoint(
    make_app: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app()
    app.workflow("echo")(echo_graph)
    app.submit("echo", job_id="rt-first", input={"text": "a"})
    lease, row = claim(app, "w-a")
    counter = CountingReads(app, monkeypatch)
    assert execute(app, lease, row) == "completed"
    # The claim said the run never ran: LangGraph's loop's read as it starts is answered
    # without the database (it would find nothing), and Keel reads nothing either.
    assert counter.reads == 0
    assert app.get_run(row["run_id"]).output == {"text": "a", "out": "A"}


def test_a_resume_after_a_decision_reads_the_checkpoint_once(
    make_app: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = Provider()
    app = make_app()
    app.workflow("review")(lambda: review_graph(notify_effect(provider)))
    run = app.submit("review", job_id="rt-resume", input={"to": "a@x"})["run_id"]
    assert execute(app, *claim(app, "w-a")) == "waiting"
    app.approve(run, by="alice")
    lease, row = claim(app, "w-b")
    counter = CountingReads(app, monkeypatch)
    assert execute(app, lease, row) == "completed"
    # Keel's one read (the pending interrupts come from it), which LangGraph's loop gets as it
    # starts instead of reading again; its own read and an aget_state used to make it three.
    assert counter.reads == 1
    assert len(provider.deliveries) == 1


def test_a_resumed_execution_reads_its_answers_with_its_claim_and_nothing_at_its_end(
    make_app: AppFactory,
) -> None:
    # The claim returns the run's answered waits (the resume map); the end's statement judges
    # the termination reason from the waits itself: the resumed execution reads its checkpoint,
    # commits its steps and ends, nothing more (a waits read and two reads at the end were 3).
    provider = Provider()
    app = make_app()
    app.workflow("review")(lambda: review_graph(notify_effect(provider)))
    run = app.submit("review", job_id="rt-answers", input={"to": "a@x"})["run_id"]
    assert execute(app, *claim(app, "w-a")) == "waiting"
    app.approve(run, by="alice")
    rt = app.aio.runtime
    got, count = _counted(
        app, lambda: leases.claim(rt.store, "w-b", rt.workflows.keys(), rt.lease_ttl)
    )
    _one_trip(count)
    lease, row = got
    [answer] = json.loads(row["decided_waits"])
    [wait] = app.get_run(run).waits
    assert (answer["interrupt_id"], answer["status"]) == (wait["interrupt_id"], "decided")
    assert json.loads(answer["value"]) == json.loads(wait["value"])
    store = rt.store
    steps: list[int] = []
    reads: list[int] = []
    _per_call(store, "step_transaction", Count(), steps)
    _per_call(store, "reserve_effect", Count(), steps)  # the effect's two statements
    _per_call(store, "record_effect", Count(), steps)
    for method in ("waits", "read_waits", "read_run", "get_run"):
        _per_call(store, method, Count(), reads)
    with counting() as count:
        assert execute(app, lease, row) == "completed"
    assert reads == []
    if rt.connector.dialect == "postgres":
        # The checkpoint read, one round trip per step transaction and effect statement; the
        # end commits in the last step's.
        assert count.statements == 1 + len(steps), count.kinds
    details = app.get_run(run)
    assert (details.status, details.decision, details.termination_reason) == (
        "completed",
        "approved",
        "approved",
    )
    ended = [e for e in details.timeline if e["kind"] == "status.completed"]
    assert [e["data"]["termination_reason"] for e in ended] == ["approved"]
    assert len(provider.deliveries) == 1


def test_a_claim_of_a_run_that_never_ran_reads_no_waits(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("echo")(echo_graph)
    app.submit("echo", job_id="rt-no-answers", input={"text": "a"})
    _, row = claim(app, "w-a")
    assert (row["first_claim"], row["decided_waits"]) == (1, None)


def test_an_admission_is_one_statement_with_its_event(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("echo")(echo_graph)

    def submit(**kwargs: Any) -> Callable[[], Any]:
        return lambda: app.aio.submit("echo", job_id="rt-admit", **kwargs)

    first, count = _counted(app, submit(input={"text": "a"}))
    _one_trip(count)
    again, count = _counted(app, submit(input={"text": "a"}))
    _one_trip(count)
    assert first.created and not again.created and again["run_id"] == first["run_id"]
    other, count = _counted(app, submit(input={"text": "b"}, if_exists="new"))
    _one_trip(count)
    assert other.created and other.other_runs == [first["run_id"]]
    kinds = [e["kind"] for e in app.get_run(first["run_id"]).timeline]
    assert kinds == ["admitted"]


def test_an_execution_ends_in_one_statement_with_its_event(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("echo")(echo_graph)
    run = app.submit("echo", job_id="rt-end", input={"text": "a"})["run_id"]
    lease, _ = claim(app, "w-a")
    _, count = _counted(
        app,
        lambda: runs.finish(
            app.aio.runtime.store,
            run,
            lease.token,
            Status.COMPLETED,
            worker_id="w-a",
            termination_reason="completed",
            output='{"out": "A"}',
        ),
    )
    _one_trip(count)
    details = app.get_run(run)
    assert (details.status, details.termination_reason) == ("completed", "completed")
    ended = [e for e in details.timeline if e["kind"] == "status.completed"]
    assert [(e["data"]["from"], e["lease_token"]) for e in ended] == [("running", lease.token)]


def test_an_end_under_a_stale_token_writes_nothing_and_says_why(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("echo")(echo_graph)
    run = app.submit("echo", job_id="rt-stale-end", input={"text": "a"})["run_id"]
    stale, _ = claim(app, "w-a")
    rt = app.aio.runtime
    assert rt.portal.call(leases.end_dead(rt.store, run, stale.token))
    claim(app, "w-b")  # token 2 holds the run now
    with pytest.raises(LeaseLost, match="lease token 1 is stale"):
        rt.portal.call(
            runs.finish(
                rt.store,
                run,
                stale.token,
                Status.COMPLETED,
                worker_id="w-a",
                termination_reason="completed",
            )
        )
    with pytest.raises(RunNotFound):
        rt.portal.call(
            runs.finish(rt.store, "nope", 1, Status.FAILED, worker_id="w-a", termination_reason="x")
        )
    details = app.get_run(run)
    assert details.status == "running"
    assert "status.completed" not in [e["kind"] for e in details.timeline]


def _per_call(store: Any, method: str, count: Count, seen: list[int]) -> None:
    """Record what each call of `store.method` cost (nothing else runs meanwhile here)."""
    original = getattr(store, method)

    async def measured(*args: Any, **kwargs: Any) -> Any:
        before = count.statements
        try:
            return await original(*args, **kwargs)
        finally:
            seen.append(count.statements - before)

    setattr(store, method, measured)


def test_an_effects_reserve_and_record_are_one_statement_each(make_app: AppFactory) -> None:
    provider = Provider()
    app = make_app()
    app.workflow(by_hand.WORKFLOW)(by_hand.one_node)
    node = by_hand.start(app, "rt-effect")
    send = keel.effect("send")(lambda to, *, idempotency_key: provider.deliver(idempotency_key, to))
    store = app.aio.runtime.store
    reserved: list[int] = []
    recorded: list[int] = []
    with counting() as count:
        _per_call(store, "reserve_effect", count, reserved)
        _per_call(store, "record_effect", count, recorded)
        node.call(send, "a@x")
        node.call(send, "a@x")  # the replay: served from the ledger, one reserve
    assert (reserved, recorded) == ([1, 1], [1]), count.kinds
    assert len(provider.deliveries) == 1
    kinds = [e["kind"] for e in app.get_run(node.run_id).timeline]
    assert kinds.count("effect.sent") == 1


def test_a_stale_token_reserves_and_records_nothing(make_app: AppFactory) -> None:
    provider = Provider()
    app = make_app()
    app.workflow(by_hand.WORKFLOW)(by_hand.one_node)
    node = by_hand.start(app, "rt-effect-stale")
    rt = app.aio.runtime
    assert rt.portal.call(leases.end_dead(rt.store, node.run_id, node.lease.token))
    by_hand.claim(app, "worker-b")  # token 2
    send = keel.effect("send")(lambda to, *, idempotency_key: provider.deliver(idempotency_key, to))
    with pytest.raises(LeaseLost, match="lease token 1 is stale"):
        node.call(send, "a@x")
    assert provider.deliveries == []
    assert rt.portal.call(rt.store.effects(node.run_id)) == []


def test_an_effect_costs_two_round_trips_in_all(make_app: AppFactory) -> None:
    # Its reserve and its record; the reservation proves the lease live, so the provider call
    # right after it needs no read of the lease of its own (the third trip it used to cost).
    provider = Provider()
    app = make_app()
    app.workflow(by_hand.WORKFLOW)(by_hand.one_node)
    node = by_hand.start(app, "rt-effect-all")
    send = keel.effect("send")(lambda to, *, idempotency_key: provider.deliver(idempotency_key, to))

    async def send_async(to: str, *, idempotency_key: str) -> Any:
        return provider.deliver(idempotency_key, to)

    for n, effect in enumerate((send, keel.effect("send_async")(send_async))):
        with counting() as count:
            node.call(effect, f"{n}@x")
        assert count.statements == 2, count.kinds
    with counting() as count:
        node.call(send, "0@x")  # a replay: served from the ledger by its reserve
    assert count.statements == 1, count.kinds
    assert sorted(provider.deliveries) == sorted(
        e["idempotency_key"] for e in app.get_run(node.run_id).effects
    )
    assert len(provider.deliveries) == 2


def test_a_decision_is_one_round_trip_with_all_that_follows_it(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow(by_hand.WORKFLOW)(by_hand.one_node)
    node = by_hand.waiting(app, "manager", job_id="rt-decide")
    result, count = _counted(app, lambda: app.aio.approve(node.run_id, by="alice"))
    _one_trip(count)
    assert result.recorded and result.wait["decided_by"] == "alice"
    # A second approver: told what was recorded, in one round trip as well.
    again, count = _counted(app, lambda: app.aio.reject(node.run_id, by="bob"))
    _one_trip(count)
    assert not again.recorded and again.decision == "approved"
    details = app.get_run(node.run_id)
    assert (details.status, details.decision) == ("queued", "approved")
    kinds = [e["kind"] for e in details.timeline]
    assert kinds[-2:] == ["decision.recorded", "status.queued"]
    value = json.loads(details.waits[0]["value"])
    assert (value["decision"], value["by"], value["wait_id"]) == (
        "approved",
        "alice",
        details.waits[0]["wait_id"],
    )
    assert value["at"] == pytest.approx(details.waits[0]["decided_at"])


def test_a_decisions_notifications_are_in_its_one_round_trip_under_the_outbox_rules(
    make_app: AppFactory,
) -> None:
    app = make_app()
    app.workflow(by_hand.WORKFLOW)(by_hand.one_node)
    app.add_notifier(Recorder("slackish"))
    app.add_notifier(Recorder("quiet", kinds=("request",)))
    node = by_hand.waiting(app, "manager", job_id="rt-decide-notify", approvers=["ed@x"])
    [wait] = app.get_run(node.run_id).waits
    result, count = _counted(
        app,
        lambda: app.aio.reject(node.run_id, by="ed", comment="no", principal="p:ed"),
    )
    _one_trip(count)
    assert result.recorded
    decided = [
        i
        for i in app.aio.runtime.portal.call(app.aio.runtime.store.notifications(node.run_id))
        if i["kind"] == "decided"
    ]
    # One per notifier of `decided`, under the id the outbox's own rule gives it.
    assert [(i["intent_id"], i["notifier"]) for i in decided] == [
        (
            notification_outbox.notification_id(
                node.run_id, wait["wait_id"], "decided", 0, "slackish"
            ),
            "slackish",
        )
    ]
    payload = json.loads(decided[0]["payload"])
    assert payload == {
        "job_id": "rt-decide-notify",
        "workflow": by_hand.WORKFLOW,
        "wait": {
            "wait_id": wait["wait_id"],
            "kind": "approval",
            "name": "manager",
            "payload": None,
            "approvers": ["ed@x"],
            "deadline": pytest.approx(wait["deadline"]),
        },
        "details": {
            "stage": 0,
            "decision": "rejected",
            "by": "ed",
            "principal": "p:ed",
            "channel": "api",
            "comment": "no",
        },
    }


def test_a_wait_registration_is_one_round_trip_with_all_that_follows_it(
    make_app: AppFactory,
) -> None:
    # The fence, each wait with its event and request intents, the run's move: one call on
    # SQLite's database thread (it was 29), one pipeline on PostgreSQL (it was 12 round trips).
    app = make_app()
    app.workflow(by_hand.WORKFLOW)(by_hand.one_node)
    app.add_notifier(Recorder("slackish"))
    node = by_hand.start(app, "rt-register")
    node.ask("manager")
    node.ask("legal")
    status, count = _counted(app, lambda: waits.register(node.ctx, node.interrupts()))
    assert status == "waiting"
    _one_trip(count)
    details = app.get_run(node.run_id)
    assert [w["name"] for w in details.waits] == ["manager", "legal"]
    kinds = [e["kind"] for e in details.timeline]
    assert kinds[-3:] == ["wait.registered", "wait.registered", "status.waiting"]
    requests = app.aio.runtime.portal.call(app.aio.runtime.store.notifications(node.run_id))
    # Under the outbox's own id rule (a notifier threads its later messages by it).
    assert sorted(i["intent_id"] for i in requests) == sorted(
        notification_outbox.notification_id(node.run_id, w["wait_id"], "request", 0, "slackish")
        for w in details.waits
    )
    payload = json.loads(requests[0]["payload"])
    [wait] = [w for w in details.waits if w["wait_id"] == requests[0]["wait_id"]]
    assert payload["wait"]["deadline"] == pytest.approx(wait["deadline"])
    assert (payload["job_id"], payload["details"]) == ("rt-register", {"stage": 0})
    # The run resumed by one decision pauses on both again (a replay): nothing is registered
    # twice, the decided wait sends it straight back to the queue, in the same one call.
    app.approve(node.run_id, by="alice", wait_id=details.waits[0]["wait_id"])
    again = by_hand.claim(app, "worker-b")
    again.pauses = list(node.pauses)
    status, count = _counted(app, lambda: waits.register(again.ctx, again.interrupts()))
    assert status == "queued"
    _one_trip(count)
    assert len(app.get_run(node.run_id).waits) == 2
    assert (
        len(app.aio.runtime.portal.call(app.aio.runtime.store.notifications(node.run_id))) == 3
    )  # + one decided


def _pausing(before: int) -> Callable[[], Any]:
    """`before` plain steps, then a node that asks for an approval, then one more step."""

    def build() -> Any:
        from langgraph.graph import END, START, StateGraph

        from tests.support.graphs import EchoState

        def ask(state: Any) -> dict[str, Any]:
            return {"out": f"{state.get('out', '')}{keel.approval('manager').decision}"}

        g = StateGraph(EchoState)
        names = [f"n{i}" for i in range(before)]
        for name in names:
            g.add_node(name, lambda s, name=name: {"out": f"{s.get('out', '')}{name}"})
        g.add_node("ask", ask)
        g.add_node("after", lambda s: {"out": f"{s['out']}!"})
        for a, b in zip(
            [START, *names, "ask", "after"], [*names, "ask", "after", END], strict=True
        ):
            g.add_edge(a, b)
        return g

    return build


@pytest.mark.parametrize("before", [0, 2])
def test_a_pause_commits_its_writes_with_its_waits_in_one_transaction(
    make_app: AppFactory, before: int
) -> None:
    """The interrupt's writes (and, in a first step, the input's and START's checkpoints)
    commit in the wait's registration: admission, claim, one transaction per step before the
    pause, and one for the pause itself. The run then resumes from them as from any pause."""
    app = make_app()
    app.workflow("pausing")(_pausing(before))
    app.add_notifier(Recorder("slackish"))
    rt = app.aio.runtime

    async def run() -> Any:
        await app.aio.submit("pausing", job_id=f"rt-pause-{before}", input={"text": "a"})
        got = await leases.claim(rt.store, "w-a", rt.workflows.keys(), rt.lease_ttl)
        assert got is not None
        return await rt.executor("w-a").execute(*got)

    outcome, count = _counted(app, run)
    assert outcome == "waiting"
    assert count.statements == 1 + 1 + before + 1, count.kinds
    [run_row] = app.list_runs(job_id=f"rt-pause-{before}")
    details = app.get_run(run_row["run_id"])
    assert [w["name"] for w in details.waits] == ["manager"]
    assert len(app.aio.runtime.portal.call(rt.store.notifications(details.run_id))) == 1
    app.approve(details.run_id, by="alice")
    assert app.run_worker(concurrency=1, stop_when_idle=True, handle_signals=False).finished == 1
    done = app.get_run(details.run_id)
    assert done.status == "completed"
    assert done.output["out"] == "".join(f"n{i}" for i in range(before)) + "approved!"


def test_an_admission_on_a_thread_is_two_round_trips(make_app: AppFactory, backend: str) -> None:
    """The thread's lock, with what is read under it (the next place, the unfinished runs),
    then the run, its event and the wake-up with the commit: two round trips on PostgreSQL
    (it was eight), one call on SQLite's database thread."""
    app = make_app()
    app.workflow("chain")(_chain(1))
    app.submit("chain", {"text": "a"}, thread_id="rt-thread")
    submitted, count = _counted(
        app, lambda: app.aio.submit("chain", {"text": "b"}, thread_id="rt-thread")
    )
    assert count.statements == (2 if backend == "postgres" else 1), count.kinds
    place = app.get_run(submitted.run_id).run["thread_seq"]
    assert place == 2  # behind the first turn, which is still queued


def test_a_turn_on_a_thread_commits_its_input_with_its_first_step(
    make_app: AppFactory, backend: str
) -> None:
    """A later turn of a thread: admission, claim, the thread's latest checkpoint read once,
    and one transaction for its one step, which takes the turn's input and START checkpoints
    with it (each committed alone before); then the thread holds both turns once."""
    app = make_app()
    app.workflow("chat")(_chain(1))
    rt = app.aio.runtime

    async def turn(text: str) -> Any:
        await app.aio.submit("chat", {"text": text}, thread_id="rt-chat")
        got = await leases.claim(rt.store, "w-a", rt.workflows.keys(), rt.lease_ttl)
        assert got is not None
        with counting() as count:
            outcome = await rt.executor("w-a").execute(*got)
        return outcome, count

    first, _ = rt.portal.call(turn("a"))
    (second, count), _ = _counted(app, lambda: turn("b"))
    assert (first, second) == ("completed", "completed")
    # PostgreSQL: the read and the step's transaction (the claim was counted apart). SQLite:
    # the read's statements (the checkpoint, its writes) and the transaction on the loop.
    assert count.statements == (2 if backend == "postgres" else 3), count.kinds
    state = app.get_state("rt-chat")
    assert state is not None and state.values["out"] == "n0n0"  # each turn's node once
    assert state.values["text"] == "b"
    history = app.get_history("rt-chat", limit=20)
    sources = [h.metadata.get("source") for h in history]
    assert sources.count("input") == 2, sources


# -- SQLite: one call to the database thread per statement, per transaction ------------------


ON_SQLITE = pytest.mark.parametrize("backend", ["sqlite"])
"""These count SQLite's database-thread calls: they run on SQLite alone."""


@ON_SQLITE
def test_a_read_is_one_database_thread_call_per_statement(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("echo")(echo_graph)
    run = app.submit("echo", job_id="rt-read", input={"text": "a"})["run_id"]
    store = app.aio.runtime.store
    row, count = _counted(app, lambda: store.get_run(run))
    assert row is not None and row["run_id"] == run
    _one_trip(count)  # aiosqlite's execute, fetchone and close were three
    rows, count = _counted(app, lambda: store.list_runs(limit=10))
    assert [r["run_id"] for r in rows] == [run]
    _one_trip(count)


def _chain(n: int) -> Callable[[], Any]:
    def build() -> Any:
        from langgraph.graph import END, START, StateGraph

        from tests.support.graphs import EchoState

        g = StateGraph(EchoState)
        names = [f"n{i}" for i in range(n)]
        for name in names:
            g.add_node(name, lambda s, name=name: {"out": f"{s.get('out', '')}{name}"})
        for a, b in zip([START, *names], [*names, END], strict=True):
            g.add_edge(a, b)
        return g

    return build


@ON_SQLITE
def test_a_checkpoint_read_is_one_database_thread_call_per_statement(
    make_app: AppFactory,
) -> None:
    app = make_app()
    app.workflow("chain")(_chain(3))
    run = app.submit("chain", job_id="rt-cp", input={"text": "a"})["run_id"]
    assert execute(app, *claim(app, "w-a")) == "completed"
    saver = app.aio.runtime.fencing()

    def config(thread: str) -> Any:
        return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}

    found, count = _counted(app, lambda: saver.aget_tuple(config("never-ran")))
    assert found is None
    assert count.trips == 1, count.kinds  # aiosqlite's cursor, execute, fetchone, close: 4
    found, count = _counted(app, lambda: saver.aget_tuple(config(run)))
    assert found is not None and found.checkpoint["channel_values"]["out"] == "n0n1n2"
    assert count.trips == 2, count.kinds  # the checkpoint, then its pending writes

    async def listing() -> list[Any]:
        return [c async for c in saver.alist(config(run))]

    listed, count = _counted(app, listing)
    # The input's, the first step's, one per node: the listing's rows, then each one's writes.
    assert len(listed) == 5
    assert count.trips == 1 + len(listed), count.kinds


@ON_SQLITE
def test_a_five_step_run_alone_costs_one_transaction_each_on_the_loops_thread(
    make_app: AppFactory,
) -> None:
    """Admission, claim, a fenced transaction per step and the end are one transaction each,
    and there is nothing else (aiosqlite's own calls made it 20). With no other execution in
    the process, each runs on the event loop's own thread: no hand-off to the database thread
    at all."""
    app = make_app()
    app.workflow("chain")(_chain(5))
    rt = app.aio.runtime

    async def run() -> Any:
        await app.aio.submit("chain", job_id="rt-run", input={"text": "a"})
        got = await leases.claim(rt.store, "w-a", rt.workflows.keys(), rt.lease_ttl)
        assert got is not None
        return await rt.executor("w-a").execute(*got)

    outcome, count = _counted(app, run)
    assert outcome == "completed"
    # Admission, claim, a transaction per node's step (the input's and START's checkpoints go
    # with the first one, the run's end with the last one); LangGraph's first look for a
    # checkpoint is answered without the database.
    assert count.kinds == ["here"] * (1 + 1 + 5), count.kinds


@ON_SQLITE
def test_two_executions_at_once_commit_on_the_database_thread(make_app: AppFactory) -> None:
    """While several executions run, none of their transactions runs on the loop's thread
    (where one's fsync would stall the others' work); on the database thread they may share
    a COMMIT, so there are at most as many calls as transactions.

    A third execution, held in its node until the two are done, keeps the process from ever
    being down to one (the one that finished second would otherwise commit its last steps on
    the loop's thread, alone, as it should)."""
    app = make_app()
    app.workflow("chain")(_chain(5))
    release = threading.Event()
    app.workflow("hold")(held_graph(release))
    rt = app.aio.runtime

    async def run() -> Any:
        await rt.open()
        await app.aio.submit("hold", job_id="held", input={"n": 0})
        holding = await leases.claim(rt.store, "w-hold", ["hold@1"], rt.lease_ttl)
        assert holding is not None
        held = asyncio.ensure_future(rt.executor("w-hold").execute(*holding))
        for _ in range(1000):  # until the held execution holds its lease in the saver
            if rt.fencing().holders:
                break
            await asyncio.sleep(0.01)
        for job in ("two-a", "two-b"):
            await app.aio.submit("chain", job_id=job, input={"text": "a"})
        claimed = [
            await leases.claim(rt.store, worker, ["chain@1"], rt.lease_ttl)
            for worker in ("w-a", "w-b")
        ]
        with counting() as count:
            outcomes = await asyncio.gather(
                *(rt.executor(got[0].worker_id).execute(*got) for got in claimed if got)
            )
        release.set()
        assert await held == "completed"
        return outcomes, count

    outcomes, count = rt.portal.call(run())
    assert outcomes == ["completed", "completed"]
    assert "here" not in count.kinds, count.kinds
    assert count.kinds and set(count.kinds) == {"_group"}, count.kinds
    assert len(count.kinds) <= 2 * (5 + 1), count.kinds
