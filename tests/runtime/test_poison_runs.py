"""Nothing is stuck silently: a graph that cannot compile is refused before any run of it
exists, and a run whose execution keeps crashing outside its nodes ends failed after a bounded
number of attempts, each on its timeline, so a stop-when-idle worker exits."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

import psycopg
import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph

import keel
from keel.core.errors import InvalidWorkflow
from keel.core.workflows import Workflow, Workflows
from tests.support.graphs import echo_graph
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]


class S(TypedDict, total=False):
    text: str


def no_edge_from_start() -> StateGraph:
    g = StateGraph(S)
    g.add_node("a", lambda s: {})
    g.add_edge("a", END)
    return g


def test_a_graph_without_an_edge_from_start_is_refused_at_registration(
    make_app: AppFactory,
) -> None:
    app = make_app()
    with pytest.raises(InvalidWorkflow, match=r"broken@1: its graph does not compile"):
        app.workflow("broken")(no_edge_from_start)
    with pytest.raises(InvalidWorkflow, match="must return a LangGraph builder"):
        app.workflow("not-a-graph")(lambda: "a graph, surely")
    assert app.aio.runtime.workflows.keys() == []  # nothing half-registered


def _with_subgraph(checkpointer: bool | None, *, nested: bool = False) -> StateGraph:
    inner = StateGraph(S)
    inner.add_node("upper", lambda s: {"text": s.get("text", "").upper()})
    inner.add_edge(START, "upper")
    compiled = inner.compile(checkpointer=checkpointer)
    if nested:
        middle = StateGraph(S)
        middle.add_node("inner", compiled)
        middle.add_edge(START, "inner")
        compiled = middle.compile()
    outer = StateGraph(S)
    outer.add_node("sub", compiled)
    outer.add_edge(START, "sub")
    return outer


@pytest.mark.parametrize("nested", [False, True])
def test_a_subgraph_compiled_without_checkpointing_is_refused_under_sync_durability(
    make_app: AppFactory, nested: bool
) -> None:
    """LangGraph itself fails every run of such a graph under durability="sync"
    (AttributeError): refused at registration, naming the subgraph and the ways out."""
    app = make_app()
    where = "sub|inner" if nested else "sub"
    with pytest.raises(InvalidWorkflow, match=rf"subgraph '{where}' is compiled with checkpoint"):
        app.workflow("no-saver")(lambda: _with_subgraph(False, nested=nested))
    assert app.aio.runtime.workflows.keys() == []
    # Under "async" LangGraph runs it; a subgraph that inherits the saver runs under "sync".
    app.workflow("no-saver", durability="async")(lambda: _with_subgraph(False, nested=nested))
    app.workflow("inherits")(lambda: _with_subgraph(None, nested=nested))
    names = ("no-saver", "inherits")
    runs = [app.submit(name, {"text": "hi"}, job_id=name).run_id for name in names]
    drain(app)
    assert [app.get_run(r).status for r in runs] == ["completed", "completed"]
    assert [app.get_run(r).output["text"] for r in runs] == ["HI", "HI"]


def test_a_compiled_graph_runs_on_keels_saver_not_its_own(make_app: AppFactory) -> None:
    # What a langgraph.json project exports: compiled, with a checkpointer of its own.
    own = InMemorySaver()
    app = make_app()
    app.workflow("compiled")(lambda: echo_graph().compile(checkpointer=own))
    run_id = app.submit("compiled", {"text": "hi"}, job_id="c-1").run_id
    drain(app)
    assert app.get_run(run_id).status == "completed"
    assert app.get_state(run_id).values["out"] == "HI"  # read from Keel's database
    assert list(own.list(None)) == []  # its own saver never saw a checkpoint


def test_a_broken_graph_is_refused_at_submit_and_at_worker_start(make_app: AppFactory) -> None:
    # A registry filled without App.workflow (the chaos harness adopts the user's registry).
    app = make_app()
    registry = Workflows()
    registry.add(Workflow("broken", "1", no_edge_from_start))
    app.aio.runtime.adopt(registry)
    with pytest.raises(InvalidWorkflow, match="does not compile"):
        app.submit("broken", job_id="j", input={})
    assert app.list_runs() == []
    with pytest.raises(InvalidWorkflow, match="does not compile"):
        app.run_worker(stop_when_idle=True, handle_signals=False)


def test_a_run_that_crashes_outside_its_nodes_ends_failed_after_max_attempts(
    make_app: AppFactory,
) -> None:
    builds = [0]

    def flaky_factory() -> StateGraph:
        # Builds at registration, then never again (a config file that went missing).
        builds[0] += 1
        if builds[0] > 1:
            raise RuntimeError("graph config vanished")
        return echo_graph()

    app = make_app(max_attempts=3, retry_backoff=0.01)
    app.workflow("flaky")(flaky_factory)
    run_id = app.submit("flaky", job_id="j", input={"text": "x"}).run_id
    stats = drain(app, within=30)  # returns: the stop-when-idle worker exits
    details = app.get_run(run_id)
    assert (details.status, details.termination_reason) == ("failed", "execution_error")
    assert "graph config vanished" in details.run["error"]
    kinds = [e["kind"] for e in details.timeline]
    assert kinds.count("attempt.crashed") == 2
    assert kinds.count("attempt.failed") == 1
    assert kinds.count("lease.claimed") + kinds.count("lease.takeover") == 3
    crashed = [e["data"] for e in details.timeline if e["kind"].startswith("attempt.")]
    assert [d["attempt"] for d in crashed] == [1, 2, 3]
    assert all(d["cause"] == "crash" and d["limit"] == 3 for d in crashed)
    assert stats.claimed == 3


def test_the_graphs_own_failure_ends_the_run_at_once(make_app: AppFactory) -> None:
    def boom(state: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("bad input")

    app = make_app(max_attempts=3, retry_backoff=0.01)
    app.workflow("boom")(lambda: echo_graph(boom))  # type: ignore[arg-type]
    run_id = app.submit("boom", job_id="j", input={"text": "x"}).run_id
    drain(app)
    details = app.get_run(run_id)
    assert details.status == "failed" and "ValueError: bad input" in details.run["error"]
    assert not [e for e in details.timeline if e["kind"].startswith("attempt.")]


def test_a_fault_of_the_nodes_own_database_is_the_graphs_failure_not_keels(
    make_app: AppFactory, tmp_path: Path
) -> None:
    # A node's own database (here a SQLite file another process holds) raises the very driver
    # errors Keel's store would. Giving the run back for them would retry a user's outage
    # max_infra_retries times behind the graph's own retry policy; it fails like any node error.
    # (A fault of Keel's own database inside a node gives the run back: tests/processes/
    # test_infrastructure.py fills a real disk and kills the postmaster under running nodes.)
    own = tmp_path / "crm.db"
    holder = sqlite3.connect(own, isolation_level=None)
    holder.execute("CREATE TABLE contacts (name TEXT)")
    holder.execute("BEGIN EXCLUSIVE")

    def save_contact(state: dict[str, Any]) -> dict[str, Any]:
        crm = sqlite3.connect(own, timeout=0.05)
        try:
            crm.execute("INSERT INTO contacts VALUES (?)", (state["text"],))
        finally:
            crm.close()
        return {"out": "saved"}

    def unreachable_crm(state: dict[str, Any]) -> dict[str, Any]:
        with psycopg.connect("postgresql://crm@127.0.0.1:9/crm", connect_timeout=2):
            return {"out": "saved"}

    app = make_app(max_infra_retries=3)
    app.workflow("locked")(lambda: echo_graph(save_contact))  # type: ignore[arg-type]
    app.workflow("refused")(lambda: echo_graph(unreachable_crm))  # type: ignore[arg-type]
    try:
        runs = [
            app.submit(w, job_id="j", input={"text": "x"}).run_id for w in ("locked", "refused")
        ]
        drain(app)
    finally:
        holder.close()
    for run_id, error in zip(runs, ("database is locked", "OperationalError"), strict=True):
        details = app.get_run(run_id)
        assert (details.status, details.termination_reason) == ("failed", "execution_error")
        assert error in details.run["error"]
        assert not [e for e in details.timeline if e["kind"].startswith("attempt.")]
        assert details.run["infra_retries"] == 0


@task
def doubled(x: int) -> int:
    return x * 2


@entrypoint()
def functional(x: int) -> int:
    return doubled(x).result() + 1


def test_a_functional_api_graph_registers_and_runs(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("functional")(lambda: functional)
    run_id = app.submit("functional", 20, job_id="f-1").run_id  # any input: no state schema
    drain(app)
    details = app.get_run(run_id)
    assert (details.status, details.run["output"]) == ("completed", "41")
