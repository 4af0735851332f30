"""Retention: `prune` deletes exactly the old finished runs and everything they left behind
(Keel's tables, LangGraph's checkpoint tables, the artifacts folder), and touches nothing else."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

import psycopg
import pytest
from langgraph.graph import END, START, StateGraph

import keel
from keel.core.clock import ManualClock
from keel.core.errors import UsageError
from keel.core.webhooks import new_secret
from tests.support.graphs import notify_effect
from tests.support.providers import Provider
from tests.support.webhook_receiver import receiving
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]
DAY = 86400.0
KEEL_TABLES = ("keel_runs", "keel_events", "keel_effects", "keel_waits", "keel_outbox")
SQLITE_CHECKPOINTS = ("checkpoints", "writes")
PG_CHECKPOINTS = ("checkpoints", "checkpoint_writes", "checkpoint_blobs")


class State(TypedDict, total=False):
    to: str
    ask: bool
    done: bool


def graph(provider: Provider) -> StateGraph:
    notify = notify_effect(provider)

    def write(state: State) -> State:
        keel.artifacts().write_text("report.md", f"report for {state['to']}\n")
        notify(state["to"])
        return {}

    def ask(state: State) -> State:
        if state.get("ask"):
            keel.approval("manager", payload={"to": state["to"]}, timeout="365d")
        return {"done": True}

    g = StateGraph(State)
    g.add_node("write", write)
    g.add_node("ask", ask)
    g.add_edge(START, "write")
    g.add_edge("write", "ask")
    g.add_edge("ask", END)
    return g


def rows_of(db_url: str, run_id: str) -> dict[str, int]:
    """Rows that belong to `run_id` in every table, read with the driver, not through Keel."""
    counts: dict[str, int] = {}
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(db_url.removeprefix("sqlite:///"))
        try:
            for table in KEEL_TABLES:
                counts[table] = conn.execute(
                    f"SELECT COUNT(*) FROM {table} WHERE run_id = ?", (run_id,)
                ).fetchone()[0]
            for table in SQLITE_CHECKPOINTS:
                counts[table] = conn.execute(
                    f"SELECT COUNT(*) FROM {table} WHERE thread_id = ?", (run_id,)
                ).fetchone()[0]
        finally:
            conn.close()
        return counts
    with psycopg.connect(db_url) as conn:
        for table in KEEL_TABLES:
            row = conn.execute(f"SELECT COUNT(*) FROM {table} WHERE run_id = %s", (run_id,))
            counts[table] = row.fetchone()[0]  # type: ignore[index]
        for table in PG_CHECKPOINTS:
            row = conn.execute(f"SELECT COUNT(*) FROM {table} WHERE thread_id = %s", (run_id,))
            counts[table] = row.fetchone()[0]  # type: ignore[index]
    return counts


def test_prune_removes_exactly_the_old_finished_runs_rows_and_folders(
    make_app: AppFactory, db_url: str, tmp_path: Path
) -> None:
    clock = ManualClock()
    provider = Provider()
    app = make_app(clock=clock)
    app.workflow("report")(lambda: graph(provider))
    old_done = app.submit("report", job_id="old-done", input={"to": "a"})["run_id"]
    old_waiting = app.submit("report", job_id="old-waiting", input={"to": "b", "ask": True})[
        "run_id"
    ]
    drain(app)
    old_cancelled = app.submit("report", job_id="old-cancelled", input={"to": "c", "ask": True})[
        "run_id"
    ]
    drain(app)
    app.cancel(old_cancelled, by="ops")
    clock.advance(31 * DAY)
    new_done = app.submit("report", job_id="new-done", input={"to": "d"})["run_id"]
    drain(app)
    assert [app.get_run(r).status for r in (old_done, old_waiting, old_cancelled, new_done)] == [
        "completed",
        "waiting",
        "cancelled",
        "completed",
    ]
    before = {r: rows_of(db_url, r) for r in (old_done, old_waiting, old_cancelled, new_done)}
    # Every kind of row is there to delete: events, an effect, a wait, checkpoints and writes.
    assert all(n > 0 for t, n in before[old_done].items() if t not in ("keel_waits", "keel_outbox"))
    assert before[old_cancelled]["keel_waits"] == 1
    root = tmp_path / "artifacts"
    assert (root / old_done / "report.md").is_file()

    dry = app.prune(older_than="30d", dry_run=True)
    assert sorted(dry.run_ids) == sorted([old_done, old_cancelled])
    assert rows_of(db_url, old_done) == before[old_done]  # a dry run deletes nothing

    report = app.prune(older_than="30d", batch_size=1)
    assert report.runs == 2 and report.batches == 2 and report.folders == 2
    for gone in (old_done, old_cancelled):
        assert set(rows_of(db_url, gone).values()) == {0}
        assert not (root / gone).exists()
    # The old but unfinished run and the recent finished one are untouched, rows and files.
    assert rows_of(db_url, old_waiting) == before[old_waiting]
    assert rows_of(db_url, new_done) == before[new_done]
    assert (root / old_waiting / "report.md").is_file()
    assert (root / new_done / "report.md").is_file()
    assert app.get_run(old_waiting).status == "waiting"
    # The waiting run can still be decided and finish.
    app.approve(old_waiting, by="manager")
    drain(app)
    assert app.get_run(old_waiting).status == "completed"


def test_prune_keeps_failed_runs_when_asked_and_refuses_unfinished_statuses(
    make_app: AppFactory, db_url: str
) -> None:
    clock = ManualClock()
    app = make_app(clock=clock)

    def boom(state: State) -> State:
        raise RuntimeError("the node failed")

    def failing() -> StateGraph:
        g = StateGraph(State)
        g.add_node("boom", boom)
        g.add_edge(START, "boom")
        g.add_edge("boom", END)
        return g

    app.workflow("failing")(failing)
    failed = app.submit("failing", job_id="f-1", input={"to": "x"})["run_id"]
    drain(app)
    assert app.get_run(failed).status == "failed"
    clock.advance(2 * DAY)
    assert app.prune(older_than="1d", keep_failed=True).runs == 0
    assert app.prune(older_than="1d", statuses=["completed"]).runs == 0
    with pytest.raises(UsageError, match="only finished runs"):
        app.prune(older_than="1d", statuses=["running"])
    with pytest.raises(UsageError, match="not a number"):
        app.prune(older_than="thirty days")
    assert rows_of(db_url, failed)["keel_runs"] == 1
    assert app.prune(older_than="1d").runs == 1
    assert set(rows_of(db_url, failed).values()) == {0}


def _count(db_url: str, sql: str, run_id: str) -> int:
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(db_url.removeprefix("sqlite:///"))
        try:
            return int(conn.execute(sql.replace("%s", "?"), (run_id,)).fetchone()[0])
        finally:
            conn.close()
    with psycopg.connect(db_url) as conn:
        return int(conn.execute(sql, (run_id,)).fetchone()[0])  # type: ignore[index]


WEBHOOK_ROWS = {
    "webhooks": "SELECT COUNT(*) FROM keel_webhooks WHERE run_id = %s",
    "deliveries": "SELECT COUNT(*) FROM keel_hook_deliveries WHERE run_id = %s",
    "intents": "SELECT COUNT(*) FROM keel_intents WHERE run_id = %s",
}


def test_prune_takes_a_runs_webhook_and_inbound_delivery_along(
    make_app: AppFactory, db_url: str
) -> None:
    """A run admitted by an inbound delivery and told to a completion webhook leaves rows in
    keel_webhooks and keel_hook_deliveries: pruned with it, by batch, with its delivered
    webhook intent; a younger run's rows stay."""
    secret = new_secret()
    clock = ManualClock()
    provider = Provider()
    app = make_app(clock=clock, webhook_secret=secret, webhook_allow_hosts=["127.0.0.1"])
    app.workflow("report")(lambda: graph(provider))
    with receiving(secret) as receiver:
        _webhooked_runs_pruned(app, db_url, clock, receiver.url)
        assert len(receiver.accepted()) == 3


def _webhooked_runs_pruned(app: keel.App, db_url: str, clock: ManualClock, hook: str) -> None:
    runs = []
    for n in range(3):
        run_id, seen = app.accept_hook_delivery(
            "orders", f"d-{n}", workflow="report", job_id=f"order-{n}", input={"to": f"{n}"}
        )
        assert not seen
        # The same job submitted again is the same run; its webhook attaches to it.
        again = app.submit("report", {"to": f"{n}"}, job_id=f"order-{n}", webhook=hook)
        assert again.run_id == run_id
        runs.append(run_id)
    drain(app)
    assert {app.get_run(r).status for r in runs} == {"completed"}
    clock.advance(31 * DAY)
    young, _ = app.accept_hook_delivery(
        "orders", "d-young", workflow="report", job_id="order-young", input={"to": "y"}
    )
    drain(app)
    rows = {r: {k: _count(db_url, q, r) for k, q in WEBHOOK_ROWS.items()} for r in [*runs, young]}
    assert all(rows[r] == {"webhooks": 1, "deliveries": 1, "intents": 1} for r in runs), rows
    report = app.prune(older_than="30d", batch_size=2)
    assert report.runs == 3 and report.batches == 2
    assert report.rows["webhooks"] == 3 and report.rows["hook_deliveries"] == 3
    for gone in runs:
        after = {k: _count(db_url, q, gone) for k, q in WEBHOOK_ROWS.items()}
        assert after == {"webhooks": 0, "deliveries": 0, "intents": 0}
    assert {k: _count(db_url, q, young) for k, q in WEBHOOK_ROWS.items()} == rows[young]
    # The young run's delivery is still remembered: a replay admits nothing new.
    replay = app.accept_hook_delivery(
        "orders", "d-young", workflow="report", job_id="order-young", input={"to": "y"}
    )
    assert replay == (young, True)
