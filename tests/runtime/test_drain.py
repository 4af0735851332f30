"""A worker draining a backlog: its free slots filled by one batch claim, then each run's last
transaction (its last checkpoint and its end) claiming the next run into the slot it gives up
(keel.runtime.handoff, `Worker._successor`). Counted in the database's own transactions."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

import psycopg

import keel
from keel.runtime.worker import Worker
from tests.runtime.test_step_transaction import traced
from tests.support.graphs import echo_graph

AppFactory = Callable[..., keel.App]
RUNS, CONCURRENCY = 9, 3


def _claimed(statements: list[str]) -> int:
    """How many runs the transaction claimed (SQLite's trace: a claim's event is written only
    when it claims)."""
    return sum("'lease.claimed'" in s and "INSERT INTO keel_events" in s for s in statements)


def _ends(statements: list[str]) -> bool:
    return any("UPDATE keel_runs" in s and "finished_at" in s for s in statements)


def _transactions(app: keel.App, db_url: str, traced_sqlite: list[list[str]]) -> list[Counter[str]]:
    """Per write transaction that claimed, in commit order: its claims and its runs' ends. On
    PostgreSQL, from the events' own transaction ids (xmin), a claim statement being sent
    whether or not it claims."""
    if not db_url.startswith("postgresql"):
        return [
            Counter({"claimed": _claimed(t), "ended": int(_ends(t))})
            for t in traced_sqlite
            if _claimed(t)
        ]
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT xmin::text::bigint AS tx, kind FROM keel_events"
            " WHERE kind IN ('lease.claimed', 'status.completed') ORDER BY event_id"
        ).fetchall()
    by_tx: dict[int, Counter[str]] = {}
    for tx, kind in rows:
        by_tx.setdefault(tx, Counter())["claimed" if kind == "lease.claimed" else "ended"] += 1
    return [c for c in by_tx.values() if c["claimed"]]


def test_a_draining_worker_claims_each_next_run_with_the_end_of_the_last(
    make_app: AppFactory, db_url: str
) -> None:
    app = make_app()
    app.workflow("echo")(echo_graph)
    ids = [
        app.submit("echo", job_id=f"d-{i}", input={"text": str(i)})["run_id"] for i in range(RUNS)
    ]
    rt = app.aio.runtime

    async def drain() -> tuple[object, list[list[str]]]:
        await rt.open()
        async with traced(app) as trace:
            stats = await Worker(rt, concurrency=CONCURRENCY, stop_when_idle=True).run()
        return stats, [t.statements for t in trace.transactions]

    stats, traced_sqlite = rt.portal.call(drain())
    assert stats.finished == RUNS and stats.lost == 0  # type: ignore[attr-defined]
    for run_id in ids:
        run = app.get_run(run_id)
        assert run.status == "completed"
        kinds = Counter(e["kind"] for e in run.timeline)
        assert kinds["lease.claimed"] == 1 and kinds["lease.takeover"] == 0, run.timeline
    claiming = _transactions(app, db_url, traced_sqlite)
    assert sum(c["claimed"] for c in claiming) == RUNS
    # The first claim fills every slot at once; every later run is claimed by the end of one
    # before it, in its transaction (on SQLite several executions' transactions may share one
    # COMMIT, a group): no transaction of the drain claims alone but the first.
    assert claiming[0] == Counter({"claimed": CONCURRENCY}), claiming
    assert all(c["ended"] for c in claiming[1:]), claiming


def test_a_stopping_worker_claims_nothing_with_its_runs_ends(make_app: AppFactory) -> None:
    """Told to stop while runs are queued, the worker lets its running runs end and claims no
    successor with their ends: the queued runs stay queued, claimable by the next worker."""
    app = make_app()
    app.workflow("echo")(echo_graph)
    ids = [app.submit("echo", job_id=f"s-{i}", input={"text": str(i)})["run_id"] for i in range(6)]
    rt = app.aio.runtime

    async def stop_at_once() -> object:
        await rt.open()
        worker = Worker(rt, concurrency=2)
        task = asyncio.ensure_future(worker.run())
        while worker.stats.claimed < 2:  # noqa: ASYNC110 - the worker's own counter
            await asyncio.sleep(0.001)
        worker.stop()
        return await task

    stats = rt.portal.call(stop_at_once())
    statuses = Counter(app.get_run(r).status for r in ids)
    assert stats.claimed == 2, stats  # type: ignore[attr-defined]
    assert statuses["queued"] == 4 and statuses["completed"] + statuses["queued"] == 6, statuses
