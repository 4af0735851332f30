"""Leases on an injectable clock: expiry, takeover with a new token, renewal, cancellation,
and a workflow's cluster-wide concurrency limit."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TypedDict

import psycopg
import pytest
from langgraph.graph import END, START, StateGraph

import keel
from keel.backends.pg_batch import _numbered
from keel.core import leases
from keel.core.store.base import load_queries
from tests.support.sqlite_steps import vm_steps


class State(TypedDict, total=False):
    n: int


def noop(state: State) -> State:
    return {"n": state.get("n", 0) + 1}


def chain() -> StateGraph:
    g = StateGraph(State)
    g.add_node("a", noop)
    g.add_node("b", noop)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g


def _call(app: keel.App, coro_fn: Callable[..., object]) -> object:
    async def go() -> object:
        await app.aio.open()
        return await coro_fn()  # type: ignore[misc]

    return app.aio.runtime.portal.call(go())


def test_expired_lease_is_taken_over_with_a_higher_token_and_the_old_one_cannot_renew(
    make_app,
) -> None:
    clock = keel.ManualClock()
    app = make_app(clock=clock, lease_ttl=10)
    app.workflow("chain")(chain)
    run_id = app.submit("chain", job_id="lease", input={"n": 0})["run_id"]
    store, keys = app.aio.runtime.store, app.aio.runtime.workflows.keys()
    first = _call(app, lambda: leases.claim(store, "w-a", keys, 10))
    assert first is not None
    lease_a, _ = first
    assert _call(app, lambda: leases.claim(store, "w-b", keys, 10)) is None
    clock.advance(9)
    assert _call(app, lambda: leases.renew(store, [lease_a], 10)) == []
    clock.advance(9)  # renewed at t=9: still held at t=18
    assert _call(app, lambda: leases.claim(store, "w-b", keys, 10)) is None
    clock.advance(2)  # t=20 > 19: expired
    second = _call(app, lambda: leases.claim(store, "w-b", keys, 10))
    assert second is not None
    lease_b, row = second
    assert (lease_b.run_id, lease_b.token) == (run_id, lease_a.token + 1)
    assert row["lease_owner"] == "w-b"
    assert _call(app, lambda: leases.renew(store, [lease_a], 10)) == [lease_a]
    with pytest.raises(keel.LeaseLost):
        _call(app, lambda: leases.release(store, lease_a, "stale"))
    kinds = [e["kind"] for e in app.get_run(run_id).timeline]
    assert kinds == ["admitted", "lease.claimed", "lease.takeover"]


def test_a_dead_workers_lease_ended_by_hand_is_taken_over_without_waiting_out_the_ttl(
    make_app,
) -> None:
    clock = keel.ManualClock()
    app = make_app(clock=clock, lease_ttl=60)
    app.workflow("chain")(chain)
    run_id = app.submit("chain", job_id="dead", input={"n": 0})["run_id"]
    store, keys = app.aio.runtime.store, app.aio.runtime.workflows.keys()
    first = _call(app, lambda: leases.claim(store, "w-dead", keys, 60))
    assert first is not None
    dead, _ = first
    assert app.end_dead_lease(run_id, dead.token + 1) is False  # not the holder's token
    clock.advance(1)
    assert _call(app, lambda: leases.claim(store, "w-b", keys, 60)) is None
    assert app.end_dead_lease(run_id, dead.token) is True
    clock.advance(0.01)  # far inside the 60 s TTL
    second = _call(app, lambda: leases.claim(store, "w-b", keys, 60))
    assert second is not None and second[0].token == dead.token + 1
    # The new holder's lease is not ended by a late call about the dead one.
    assert app.end_dead_lease(run_id, dead.token) is False
    assert _call(app, lambda: leases.claim(store, "w-c", keys, 60)) is None
    kinds = [e["kind"] for e in app.get_run(run_id).timeline]
    assert kinds == ["admitted", "lease.claimed", "lease.takeover"]


def test_cancel_queued_waiting_and_finished_runs(make_app) -> None:
    app = make_app()

    def ask(state: State) -> State:
        keel.approval("boss")
        return {"n": 1}

    def waits() -> StateGraph:
        g = StateGraph(State)
        g.add_node("ask", ask)
        g.add_edge(START, "ask")
        g.add_edge("ask", END)
        return g

    app.workflow("waits")(waits)
    queued = app.submit("waits", job_id="q", input={"n": 0})["run_id"]
    assert app.cancel(queued, by="ops")["status"] == "cancelled"
    waiting = app.submit("waits", job_id="w", input={"n": 0})["run_id"]
    app.run_worker(stop_when_idle=True, handle_signals=False)
    assert app.get_run(waiting).status == "waiting"
    cancelled = app.cancel(waiting, by="ops")
    assert (cancelled["status"], cancelled["termination_reason"]) == ("cancelled", "cancelled")
    with pytest.raises(keel.RunFinished):
        app.approve(waiting, by="late")
    with pytest.raises(keel.RunFinished):
        app.cancel(waiting)
    with pytest.raises(keel.RunNotFound):
        app.cancel("no-such-run")


def test_cancel_of_a_running_run_stops_it_at_the_next_step_boundary(make_app) -> None:
    app = make_app()
    started = threading.Event()
    release = threading.Event()
    ran: list[str] = []

    def slow(state: State) -> State:
        ran.append("slow")
        started.set()
        release.wait(10)
        return {"n": 1}

    def after(state: State) -> State:
        ran.append("after")
        return {"n": 2}

    def build() -> StateGraph:
        g = StateGraph(State)
        g.add_node("slow", slow)
        g.add_node("after", after)
        g.add_edge(START, "slow")
        g.add_edge("slow", "after")
        g.add_edge("after", END)
        return g

    app.workflow("slow")(build)
    run_id = app.submit("slow", job_id="c", input={"n": 0})["run_id"]
    worker = threading.Thread(
        target=lambda: app.run_worker(stop_when_idle=True, handle_signals=False)
    )
    worker.start()
    assert started.wait(10)
    assert app.cancel(run_id, by="ops")["status"] == "running"  # requested, not yet applied
    release.set()
    worker.join(30)
    details = app.get_run(run_id)
    assert (details.status, details.termination_reason) == ("cancelled", "cancelled")
    assert ran == ["slow"], "the next step must not run after a cancel"
    assert any(e["kind"] == "cancel.requested" for e in details.timeline)


def test_workflow_concurrency_limit_holds_across_the_worker(make_app) -> None:
    app = make_app()
    lock = threading.Lock()
    now_running = [0]
    peak = [0]

    def busy(state: State) -> State:
        with lock:
            now_running[0] += 1
            peak[0] = max(peak[0], now_running[0])
        time.sleep(0.15)
        with lock:
            now_running[0] -= 1
        return {"n": 1}

    def build() -> StateGraph:
        g = StateGraph(State)
        g.add_node("busy", busy)
        g.add_edge(START, "busy")
        g.add_edge("busy", END)
        return g

    app.workflow("limited", max_concurrency=2)(build)
    ids = [app.submit("limited", job_id=f"l-{i}", input={"n": i})["run_id"] for i in range(6)]
    stats = app.run_worker(concurrency=6, stop_when_idle=True, handle_signals=False)
    assert stats.finished == 6
    assert {app.get_run(r).status for r in ids} == {"completed"}
    assert peak[0] == 2


def test_infrastructure_interruptions_count_in_a_row_not_over_the_runs_life(
    make_app: Callable[..., keel.App],
) -> None:
    """max_infra_retries bounds interruptions in a row: one that ends an execution which
    committed a step starts the count again, so a run that goes on through an outage a day is
    not failed on the twenty-first day."""
    app = make_app()
    app.workflow("chain")(chain)
    run = app.submit("chain", job_id="outages", input={"n": 0})["run_id"]
    store = app.aio.runtime.store
    lease, _ = app.aio.runtime.portal.call(
        leases.claim(store, "w-1", app.aio.runtime.workflows.keys(), 30.0)  # type: ignore[arg-type]
    )

    def interrupted(progressed: bool) -> int:
        async def go() -> int:
            async with store.fenced(run, lease.token) as tx:
                _, infra = await store.count_failed_attempt(
                    tx, run, lease.token, crash=False, progressed=progressed
                )
            return infra

        return app.aio.runtime.portal.call(go())

    assert [interrupted(False) for _ in range(3)] == [1, 2, 3]
    assert interrupted(True) == 1  # it had committed a step: a new row of interruptions
    assert [interrupted(False) for _ in range(2)] == [2, 3]
    assert app.get_run(run).run["crash_count"] == 0


def test_a_claim_takes_the_oldest_of_an_expired_lease_and_a_queued_run(make_app) -> None:
    clock = keel.ManualClock()
    app = make_app(clock=clock, lease_ttl=10)
    app.workflow("chain")(chain)
    store, keys = app.aio.runtime.store, app.aio.runtime.workflows.keys()
    older = app.submit("chain", job_id="older", input={"n": 0})["run_id"]
    first = _call(app, lambda: leases.claim(store, "w-dead", keys, 10))
    assert first is not None and first[0].run_id == older
    clock.advance(1)
    newer = app.submit("chain", job_id="newer", input={"n": 0})["run_id"]
    clock.advance(10)  # the older run's lease has run out; the newer run is queued
    taken = [_call(app, lambda: leases.claim(store, "w-b", keys, 10)) for _ in range(3)]
    assert [t[0].run_id if t else None for t in taken] == [older, newer, None]  # type: ignore[index]
    assert app.get_run(older).timeline[-1]["kind"] == "lease.takeover"


FINISHED, BACKLOG = 3000, 3000


def _history_and_backlog(db_url: str) -> None:
    """FINISHED completed runs, then BACKLOG queued ones after them: a deployment's history
    and its queue (planner statistics up to date)."""
    rows = [
        (f"done-{i:05d}", f"job-{i}", "completed", float(i), float(i)) for i in range(FINISHED)
    ] + [
        (f"todo-{i:05d}", f"job-q-{i}", "queued", float(FINISHED + i), None) for i in range(BACKLOG)
    ]
    columns = (
        "run_id, job_id, status, created_at, finished_at, updated_at,"
        " workflow, workflow_version, attempt, input_hash, input"
    )
    constants = "'chain', '1', 1, 'h', '{}'"
    values = [(*row, row[3]) for row in rows]
    if db_url.startswith("sqlite"):
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as db:
            db.executemany(
                f"INSERT INTO keel_runs ({columns}) VALUES (?, ?, ?, ?, ?, ?, {constants})", values
            )
            db.execute("ANALYZE")
        return
    with psycopg.connect(db_url, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO keel_runs ({columns}) VALUES (%s, %s, %s, %s, %s, %s, {constants})",
                values,
            )
        conn.execute("ANALYZE keel_runs")


def _claim_params() -> dict[str, object]:
    return {"workflows": json.dumps(["chain@1"]), "limits": "{}", "worker_id": "w", "ttl": 30.0}


def _rows_read_on_postgres(db_url: str, plan_cache_mode: str) -> int:
    """Rows of keel_runs the claim's plan produced or filtered out, run as Keel runs it (a
    prepared statement: generic plans after the first few), rolled back."""
    sql, keys = _numbered(load_queries("postgres")["claim_next"])
    params = _claim_params()
    with psycopg.connect(db_url) as conn:
        literal = psycopg.ClientCursor(conn)
        args = ", ".join(literal.mogrify("%s", (params[k],)) for k in keys)
        conn.execute(f"SET plan_cache_mode = {plan_cache_mode}".encode(), prepare=False)
        conn.execute(f"PREPARE claim AS {sql}".encode(), prepare=False)
        rows = conn.execute(
            f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim({args})".encode(), prepare=False
        ).fetchone()
        conn.rollback()
    assert rows is not None
    return _read_from_runs(rows[0][0]["Plan"])


def _read_from_runs(node: dict[str, object]) -> int:
    own = 0
    if node.get("Relation Name") == "keel_runs":
        own = sum(
            int(node.get(k, 0))  # type: ignore[call-overload]
            for k in ("Actual Rows", "Rows Removed by Filter", "Rows Removed by Index Recheck")
        )
    children = node.get("Plans", [])
    assert isinstance(children, list)
    return own + sum(_read_from_runs(child) for child in children)


def _steps_on_sqlite(db_url: str) -> int:
    """SQLite virtual-machine steps (in hundreds) of the claim's choice of a run."""
    sql = load_queries("sqlite")["claim_next"].split(";")[0]
    steps, found = vm_steps(db_url, sql, _claim_params())
    assert [r[0] for r in found] == ["todo-00000"]
    return steps


def test_a_claim_reads_a_few_runs_however_many_have_finished(db_url: str) -> None:
    """Thousands of finished runs before a backlog: the claim must not walk them (one query
    over both claimable statuses, ordered by creation, led PostgreSQL's planner to scan every
    run ever created from the oldest, and SQLite to sort the whole backlog)."""
    _history_and_backlog(db_url)
    if db_url.startswith("sqlite"):
        steps = _steps_on_sqlite(db_url)
        assert steps < 50, f"the claim's choice took {steps} hundred steps"
        return
    for mode in ("force_custom_plan", "force_generic_plan"):
        read = _rows_read_on_postgres(db_url, mode)
        assert read < 20, f"{mode}: the claim read {read} rows of keel_runs"


def test_a_batch_claim_takes_the_oldest_runs_once_each_in_one_commit(make_app) -> None:
    """`claim_batch`: the oldest claimable runs (an expired lease among them), each once, each
    with its own token and timeline event; a second batch beside it gets the rest; a limit caps
    the batch as it caps single claims."""
    clock = keel.ManualClock()
    app = make_app(clock=clock, lease_ttl=10)
    app.workflow("chain")(chain)
    app.workflow("limited", max_concurrency=2)(chain)
    store, keys = app.aio.runtime.store, app.aio.runtime.workflows.keys()
    dead = app.submit("chain", job_id="dead", input={"n": 0})["run_id"]
    assert _call(app, lambda: leases.claim(store, "w-dead", keys, 10)) is not None
    clock.advance(1)
    queued = [app.submit("chain", job_id=f"q-{i}", input={"n": i})["run_id"] for i in range(4)]
    clock.advance(10)  # the dead worker's lease has run out

    def batch(worker: str, count: int) -> tuple[list[str], bool]:
        got, full = _call(app, lambda: leases.claim_batch(store, worker, keys, 10, count))  # type: ignore[misc]
        assert all(lease.worker_id == worker for lease, _ in got)
        return [lease.run_id for lease, _ in got], full

    assert batch("w-a", 3) == ([dead, *queued[:2]], True)
    assert batch("w-b", 3) == (queued[2:], False)
    assert batch("w-c", 3) == ([], False)
    for run_id in [dead, *queued]:
        run = app.get_run(run_id)
        assert run.status == "running"
        claims = [e for e in run.timeline if e["kind"] in ("lease.claimed", "lease.takeover")]
        assert len(claims) == (2 if run_id == dead else 1)
    assert app.get_run(dead).timeline[-1]["kind"] == "lease.takeover"

    limited = [app.submit("limited", job_id=f"l-{i}", input={"n": i})["run_id"] for i in range(3)]
    limits = app.aio.runtime.workflows.limits()
    got, full = _call(app, lambda: leases.claim_batch(store, "w-d", keys, 10, 3, limits))  # type: ignore[misc]
    assert [lease.run_id for lease, _ in got] == limited[:2] and not full
    assert app.get_run(limited[2]).status == "queued"
