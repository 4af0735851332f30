"""PostgreSQL races between a worker and the API: READ COMMITTED reads, row locks, lock order.

SQLite serializes every write transaction (BEGIN IMMEDIATE), so a value read at the start of a
transaction is still true at its end. On PostgreSQL it is not, unless the row is locked. These
tests put real Keel code on both sides of a race; a raw connection holding one row or table
lock is only the stopwatch that makes the interleaving happen every time instead of rarely.
"""

from __future__ import annotations

import asyncio
import operator
import threading
import time
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

import keel
from keel.core import leases
from keel.core.schedules import Tick, fire_schedule
from keel.runtime.cron import timing_of
from keel.runtime.schedules import fire_due
from tests.support.graphs import echo_graph
from tests.support.providers import Provider
from tests.support.workers import claim, drain, execute

AppFactory = Callable[..., keel.App]
pytestmark = pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)]
)


@pytest.fixture
def raw(db_url: str) -> Iterator[Callable[[], psycopg.Connection[Any]]]:
    conns: list[psycopg.Connection[Any]] = []

    def connect() -> psycopg.Connection[Any]:
        conn = psycopg.connect(db_url, autocommit=True)
        conns.append(conn)
        return conn

    yield connect
    for conn in conns:
        conn.close()


@pytest.fixture
def waiters(raw: Callable[[], psycopg.Connection[Any]]) -> Callable[[], int]:
    """Sessions of the test's database waiting on a lock, polled through one connection (one
    per poll would hold up to a connection every 20 ms until the test ends)."""
    watch = raw()
    return lambda: lock_waiters(watch)


def lock_waiters(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def until(condition: Callable[[], bool], what: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Background:
    """A call in a thread; `.result()` re-raises what it raised."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._out: list[Any] = []
        self._err: list[BaseException] = []

        def run() -> None:
            try:
                self._out.append(fn())
            except BaseException as exc:
                self._err.append(exc)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self, timeout: float = 20.0) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "background call did not finish"
        if self._err:
            raise self._err[0]
        return self._out[0]


# -- cancel racing a claim ---------------------------------------------------------------------


class MailState(TypedDict, total=False):
    to: str
    receipt: Any


def mail_graph(send: Any) -> StateGraph:
    """prepare -> deliver: the email goes out in the second step."""

    def prepare(state: MailState) -> dict[str, Any]:
        return {"to": state["to"].lower()}

    def deliver(state: MailState) -> dict[str, Any]:
        return {"receipt": send(state["to"])}

    g = StateGraph(MailState)
    g.add_node("prepare", prepare)
    g.add_node("deliver", deliver)
    g.add_edge(START, "prepare")
    g.add_edge("prepare", "deliver")
    g.add_edge("deliver", END)
    return g


def _mail_app(make_app: AppFactory, provider: Provider) -> tuple[keel.App, str]:
    def send(to: str, *, idempotency_key: str) -> Any:
        return provider.deliver(idempotency_key, to)

    app = make_app()
    app.workflow("mail")(lambda: mail_graph(keel.effect("send")(send)))
    run = app.submit("mail", job_id="mail-1", input={"to": "a@x"})["run_id"]
    app.get_run(run)  # open the app's pool before the race
    return app, run


def test_cancel_racing_a_claim_never_leaves_a_cancelled_run_executing(
    make_app: AppFactory, raw: Callable[[], psycopg.Connection[Any]], waiters: Callable[[], int]
) -> None:
    """The claim is one statement: it has locked and taken the run (status running) and waits
    to write its event when the cancel arrives. The cancel must wait for the claim, see the run
    running, and ask it to stop: a stale "queued" read would cancel it under the worker's feet
    while the worker went on to send."""
    provider = Provider()
    app, run = _mail_app(make_app, provider)

    stopwatch = raw()
    # The claim's event waits for the run's turn on the timeline (insert_event's lock), after
    # its UPDATE took the row: the claim is held mid-statement, the row locked.
    stopwatch.execute("SELECT pg_advisory_lock(74213003, hashtext(%s))", (run,))
    claiming = Background(lambda: claim(app, "worker-a"))
    until(lambda: waiters() >= 1, "the claim to wait")
    cancelling = Background(lambda: app.cancel(run, by="ops"))
    until(lambda: waiters() >= 2, "the cancel to wait")
    stopwatch.execute("SELECT pg_advisory_unlock(74213003, hashtext(%s))", (run,))
    lease, row = claiming.result()
    cancelling.result()

    try:
        outcome = execute(app, lease, row)
    except Exception as exc:  # what the worker's task would die of
        outcome = f"crashed: {exc!r}"
    details = app.get_run(run)
    assert details.status == "cancelled", outcome
    # Cancelled while being claimed: the claimed worker must stop at its first step boundary,
    # before the step that sends. The world must not see the email.
    assert provider.deliveries == [], f"a cancelled run performed its effect ({outcome})"
    assert outcome == "cancelled"
    kinds = [e["kind"] for e in details.timeline]
    assert kinds.index("lease.claimed") < kinds.index("cancel.requested"), kinds
    moves = [e["data"] for e in details.timeline if e["kind"] == "status.cancelled"]
    assert [(m["from"], m["to"]) for m in moves] == [("running", "cancelled")]


def test_a_claim_racing_a_cancel_that_holds_the_run_skips_it(
    make_app: AppFactory, raw: Callable[[], psycopg.Connection[Any]], waiters: Callable[[], int]
) -> None:
    """The other order: the cancel has locked the queued run and waits to write its event when
    the claim arrives. The claim must not take the run the cancel is ending (nor wait for it):
    it skips the row, and once the cancel committed there is nothing to claim."""
    provider = Provider()
    app, run = _mail_app(make_app, provider)

    stopwatch = raw()
    stopwatch.execute("SELECT pg_advisory_lock(74213003, hashtext(%s))", (run,))
    cancelling = Background(lambda: app.cancel(run, by="ops"))
    until(lambda: waiters() >= 1, "the cancel to wait")
    rt = app.aio.runtime
    got = rt.portal.call(leases.claim(rt.store, "worker-a", rt.workflows.keys(), rt.lease_ttl))
    assert got is None, "a claim took a run that a cancel had locked"
    stopwatch.execute("SELECT pg_advisory_unlock(74213003, hashtext(%s))", (run,))
    cancelling.result()
    got = rt.portal.call(leases.claim(rt.store, "worker-a", rt.workflows.keys(), rt.lease_ttl))
    assert got is None, "a cancelled run was claimed"
    details = app.get_run(run)
    assert details.status == "cancelled"
    assert provider.deliveries == []
    assert "lease.claimed" not in [e["kind"] for e in details.timeline]


# -- two approvals of one run, answered while the worker re-registers the second -------------


class PairState(TypedDict, total=False):
    results: Annotated[list[str], operator.add]


class Gate:
    def __init__(self) -> None:
        self.armed = False
        self.arrived = threading.Event()
        self.open = threading.Event()

    def pass_(self) -> None:
        if self.armed:
            self.arrived.set()
            assert self.open.wait(15), "gate never opened"


def pair_graph(gate: Gate) -> StateGraph:
    """Two parallel branches, each waiting for its own approver."""

    def fan(state: PairState) -> list[Send]:
        return [Send("ask", {"who": "a"}), Send("ask", {"who": "b"})]

    def ask(state: dict[str, str]) -> dict[str, Any]:
        decision = keel.approval(f"approver-{state['who']}", timeout="1h")
        if state["who"] == "a":
            gate.pass_()
        return {"results": [f"{state['who']}:{decision.decision}"]}

    g = StateGraph(PairState)
    g.add_node("ask", ask)
    g.add_conditional_edges(START, fan, ["ask"])
    g.add_edge("ask", END)
    return g


def waits_by_name(app: keel.App, run: str) -> dict[str, dict[str, Any]]:
    return {w["name"]: w for w in app.get_run(run).waits}


def run_waiting_on_two(make_app: AppFactory, gate: Gate) -> tuple[keel.App, str]:
    app = make_app()
    app.workflow("pair")(lambda: pair_graph(gate))
    run = app.submit("pair", job_id="pair-1", input={"results": []})["run_id"]
    drain(app)
    assert app.get_run(run).status == "waiting"
    assert sorted(waits_by_name(app, run)) == ["approver-a", "approver-b"]
    return app, run


def test_second_approval_racing_the_reregistration_is_not_lost(
    make_app: AppFactory, raw: Callable[[], psycopg.Connection[Any]], waiters: Callable[[], int]
) -> None:
    """The second approver answers while the worker, resumed by the first, re-registers the
    second wait. Whatever the interleaving, the run must resume with both answers."""
    gate = Gate()
    app, run = run_waiting_on_two(make_app, gate)
    wait_b = waits_by_name(app, run)["approver-b"]["wait_id"]
    app.approve(run, by="alice", wait_id=waits_by_name(app, run)["approver-a"]["wait_id"])

    gate.armed = True
    working = Background(lambda: drain(app, concurrency=1))
    assert gate.arrived.wait(15)  # branch a resumed; branch b paused again
    stopwatch = raw()
    stopwatch.execute("BEGIN")
    # The second decision stops right after it read the run (still running)...
    stopwatch.execute("SELECT 1 FROM keel_waits WHERE wait_id = %s FOR UPDATE", (wait_b,))
    deciding = Background(lambda: app.approve(run, by="bob", wait_id=wait_b))
    until(lambda: waiters() >= 1, "the second decision to wait")
    gate.armed = False
    gate.open.set()  # ...while the worker finishes the step and re-registers wait b.
    status = raw()

    def registered_or_queued() -> bool:
        row = status.execute("SELECT status FROM keel_runs WHERE run_id = %s", (run,)).fetchone()
        return (row is not None and row[0] == "waiting") or waiters() >= 2

    until(registered_or_queued, "the worker to register the wait (or to queue behind the decision)")
    stopwatch.execute("COMMIT")
    assert deciding.result().recorded
    working.result()
    drain(app)
    details = app.get_run(run)
    assert [w["status"] for w in details.waits] == ["decided", "decided"]
    assert details.status == "completed", f"stuck {details.status} with every wait decided"
    assert sorted(details.output["results"]) == ["a:approved", "b:approved"]


def test_second_approval_and_reregistration_do_not_deadlock(
    make_app: AppFactory, raw: Callable[[], psycopg.Connection[Any]], waiters: Callable[[], int]
) -> None:
    """Lock order: a decision updates the wait, then the run; a registration locks the run
    (fence, FOR SHARE), then inserts the wait. Crossed, PostgreSQL aborts one of them."""
    gate = Gate()
    app, run = run_waiting_on_two(make_app, gate)
    wait_b = waits_by_name(app, run)["approver-b"]["wait_id"]
    app.approve(run, by="alice", wait_id=waits_by_name(app, run)["approver-a"]["wait_id"])

    gate.armed = True
    working = Background(lambda: drain(app, concurrency=1))
    assert gate.arrived.wait(15)
    stopwatch = raw()
    stopwatch.execute("BEGIN")
    # A reader holding the run row (as a fenced checkpoint write does, FOR SHARE) stops the
    # second decision between its wait update and its run update...
    stopwatch.execute("SELECT 1 FROM keel_runs WHERE run_id = %s FOR SHARE", (run,))
    deciding = Background(lambda: app.approve(run, by="bob", wait_id=wait_b))
    until(lambda: waiters() >= 1, "the second decision to wait")
    gate.armed = False
    gate.open.set()  # ...while the worker registers wait b under its own FOR SHARE fence.
    until(lambda: waiters() >= 2, "the registration to wait")
    stopwatch.execute("COMMIT")
    errors = []
    try:
        deciding.result()
    except Exception as exc:
        errors.append(repr(exc))
    working.result()
    drain(app)
    details = app.get_run(run)
    assert errors == [], "the approver got an error"
    assert details.status == "completed", f"run {details.status}: {details.run['error']}"
    assert sorted(details.output["results"]) == ["a:approved", "b:approved"]


# -- a schedule's tick racing its thread's deletion -------------------------------------------


def test_a_tick_racing_its_threads_deletion_neither_deadlocks_nor_makes_it_again(
    make_app: AppFactory, waiters: Callable[[], int]
) -> None:
    """Lock order: a scheduler claims a schedule's row, then takes its thread; a thread's
    deletion deletes the schedules on it, so it locks them first too. Crossed, PostgreSQL
    aborts one of them; in order, the tick claimed first fires and the deletion finds its run."""
    clock = keel.ManualClock()
    app = make_app(clock=clock)
    app.workflow("echo")(echo_graph)
    made = app.schedules.create("t", "echo", every=60, input={"text": "x"}, thread_id="daily")
    rt = app.aio.runtime
    clock.advance(60)
    rt.portal.call(fire_due(rt, rt.workflows))
    drain(app)
    clock.advance(60)
    store, version = rt.services.store, rt.workflows.get("echo").version
    claimed = threading.Event()

    async def fire_held() -> list[Tick]:
        async with store.transaction() as tx:
            row = await store.claim_schedule(tx, made["schedule_id"])
            assert row is not None
            claimed.set()
            await asyncio.to_thread(until, lambda: waiters() >= 1, "the deletion to wait")
            return await fire_schedule(store, tx, row, version, timing_of(row))

    firing = Background(lambda: rt.portal.call(fire_held()))
    assert claimed.wait(10)
    deleting = Background(lambda: app.delete_thread("daily"))
    (tick,) = firing.result()
    with pytest.raises(keel.ThreadBusy):
        deleting.result()
    assert tick.outcome == "fired"
    assert app.get_thread("daily")["thread_id"] == "daily"
    assert [s["name"] for s in app.schedules.list()] == ["t"]


# -- a database connection dropped under a running run ---------------------------------------


class StepState(TypedDict, total=False):
    n: int


def test_connections_dropped_by_the_server_do_not_fail_the_run(
    make_app: AppFactory, raw: Callable[[], psycopg.Connection[Any]]
) -> None:
    """A PostgreSQL restart or failover, a proxy's idle timeout: the pool's connections die.
    The run's next checkpoint write must not turn that into a failed run."""
    inside, go = threading.Event(), threading.Event()

    def slow(state: StepState) -> dict[str, Any]:
        inside.set()
        assert go.wait(15)
        return {"n": state["n"] + 1}

    def build() -> StateGraph:
        g = StateGraph(StepState)
        g.add_node("slow", slow)
        g.add_edge(START, "slow")
        g.add_edge("slow", END)
        return g

    app = make_app()
    app.workflow("slow")(build)
    run = app.submit("slow", job_id="slow-1", input={"n": 0})["run_id"]
    working = Background(lambda: drain(app, concurrency=1))
    assert inside.wait(15)
    killer = raw()
    killed = killer.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        # Clients only: an autovacuum worker on the database is the server's own.
        " AND backend_type = 'client backend'"
    ).fetchone()
    assert killed is not None and killed[0] >= 1
    go.set()
    working.result()
    details = app.get_run(run)
    assert details.status == "completed", details.run["error"]
    assert details.output == {"n": 1}


def test_a_pooled_connection_the_server_dropped_is_replaced_at_checkout(
    make_app: AppFactory, raw: Callable[[], psycopg.Connection[Any]]
) -> None:
    """The pool checks a connection at checkout only when it may be broken (it idled, or its
    socket is readable): a backend the server terminated says so on its socket, so the next
    transaction gets a fresh connection instead of failing."""
    app = make_app()
    app.workflow("echo")(echo_graph)
    first = app.submit("echo", job_id="drop-1", input={"text": "a"})["run_id"]
    admin = raw()
    killed = admin.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND backend_type = 'client backend'"
    ).fetchone()
    assert killed is not None and killed[0] >= 1
    # pg_terminate_backend only signals: wait until those backends have exited (and so told
    # their sockets), as a server's restart or an admin's kill has by the time a request comes.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        others = admin.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
        if others is not None and others[0] == 0:
            break
        time.sleep(0.02)
    second = app.submit("echo", job_id="drop-2", input={"text": "b"})["run_id"]
    assert app.get_run(first).status == app.get_run(second).status == "queued"
