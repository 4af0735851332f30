"""One fenced transaction per step: what commits when, counted at the database.

Counting: on SQLite, the connection's trace callback (every statement the database thread
runs, split into transactions at BEGIN IMMEDIATE / COMMIT); on PostgreSQL, libpq's protocol
trace of each connection the pool hands out (one checkout, one transaction), where a round trip
is one ReadyForQuery (the server's answer to one Sync).
"""

from __future__ import annotations

import asyncio
import operator
import re
import sqlite3
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import RetryPolicy

import keel
from keel.backends import pg_batch
from keel.core.context import current
from keel.core.store.base import Tx
from keel.core.store.store import Store
from keel.langgraph.graphs import locate
from tests.support.providers import Provider
from tests.support.workers import claim, drain, execute

AppFactory = Callable[..., keel.App]


# -- counting --------------------------------------------------------------------------------


@dataclass
class Transaction:
    statements: list[str] = field(default_factory=list)
    round_trips: int = 0

    def writes(self, table: str) -> bool:
        """Whether it wrote LangGraph's `checkpoints` or `writes` (`checkpoint_writes` on
        PostgreSQL) table."""
        names = (table, f"checkpoint_{table}") if table == "writes" else (table,)
        return any(re.search(rf"INTO\s+{name}\b", s) for s in self.statements for name in names)

    @property
    def checkpoints(self) -> int:
        """How many checkpoints it wrote."""
        return sum(bool(re.search(r"INTO\s+checkpoints\b", s)) for s in self.statements)


@dataclass
class Trace:
    transactions: list[Transaction] = field(default_factory=list)

    @property
    def steps(self) -> list[Transaction]:
        """The transactions that wrote a checkpoint or task writes (LangGraph's tables)."""
        return [t for t in self.transactions if t.writes("checkpoints") or t.writes("writes")]


@asynccontextmanager
async def traced(app: keel.App) -> AsyncIterator[Trace]:
    """Every write transaction of `app`'s connector while the block runs."""
    trace = Trace()
    connector: Any = app.aio.runtime.connector
    if app.aio.runtime.store.dialect == "sqlite":
        current_tx: list[Transaction] = []

        def seen(sql: str) -> None:  # on the database thread
            text = sql.strip()
            if text.upper().startswith("BEGIN"):
                current_tx[:] = [Transaction()]
            elif current_tx:
                current_tx[0].statements.append(text)
                if text.upper().startswith("COMMIT"):
                    trace.transactions.append(current_tx.pop())

        # Under the connector's lock: a transaction may run on the loop's thread on this same
        # connection (SqliteConnector._here), and sqlite3 installs a callback holding the GIL
        # while it waits for the connection's mutex, which that transaction's callbacks (this
        # one, keel_now) hold while they wait for the GIL: the process would hang.
        async with connector.lock:
            await connector.connection.set_trace_callback(seen)
        try:
            yield trace
        finally:
            async with connector.lock:
                await connector.connection.set_trace_callback(None)
        return

    pool = connector.pool
    checkout = pool.connection
    prepared: dict[tuple[int, str], str] = {}
    prepared_sql: dict[str, str] = {}

    @asynccontextmanager
    async def tracing(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async with checkout(*args, **kwargs) as conn:
            with tempfile.TemporaryFile() as log:
                conn.pgconn.trace(log.fileno())
                conn.pgconn.set_trace_flags(
                    psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE
                )
                try:
                    yield conn
                finally:
                    conn.pgconn.untrace()
                    log.seek(0)
                    # One protocol message per entry (a statement's SQL may span lines).
                    text = log.read().decode(errors="replace")
                    messages = re.split(r"\n(?=[FB]\t\d+\t)", text)
                    statements = []
                    for m in messages:
                        if parsed := re.match(r'F\t\d+\tParse\t "([^"]*)" ', m):
                            prepared[(id(conn), parsed[1])] = m
                            statements.append(m)
                        elif bound := re.match(r'F\t\d+\tBind\t "[^"]*" "([^"]+)"', m):
                            # psycopg prepares a statement it has run a few times: a Bind
                            # to its name, with no Parse, runs it again.
                            statements.append(prepared.get((id(conn), bound[1]), m))
                        elif re.match(r"F\t\d+\tQuery\t", m):
                            # A step's statements, sent as one message (keel.backends.pg_batch):
                            # an EXECUTE stands for the statement PREPAREd under its name.
                            for part in m.split(";\n"):
                                if made := re.search(r"PREPARE (keel_\d+) AS ", part):
                                    prepared_sql[made[1]] = part
                                    continue
                                run = re.search(r"EXECUTE (keel_\d+)", part)
                                if run and run[1] not in prepared_sql:
                                    # PREPAREd on this connection before the trace began.
                                    known = pg_batch._prepared.get(conn, {})
                                    prepared_sql.update({v: k for k, v in known.items()})
                                statements.append(prepared_sql.get(run[1], part) if run else part)
                    tx = Transaction(
                        statements,
                        sum(1 for m in messages if re.match(r"B\t\d+\tReadyForQuery\t", m)),
                    )
                    # One checkout is one transaction: a step's pipeline (committed at its
                    # Sync, with no BEGIN/COMMIT) or one autocommitted statement.
                    if tx.statements:
                        trace.transactions.append(tx)

    pool.connection = tracing
    try:
        yield trace
    finally:
        del pool.connection


def run_traced(app: keel.App, worker: str = "w1") -> tuple[str, Trace]:
    lease, row = claim(app, worker)

    async def go() -> tuple[str, Trace]:
        async with traced(app) as trace:
            outcome = await app.aio.runtime.executor(worker).execute(lease, row)
        return str(outcome), trace

    return app.aio.runtime.portal.call(go())


# -- graphs ----------------------------------------------------------------------------------


class Fan(TypedDict, total=False):
    seen: Annotated[list[str], operator.add]


def fan_graph(provider: Provider | None = None) -> Callable[[], StateGraph]:
    def node(name: str) -> Callable[[Fan], Any]:
        async def run(state: Fan) -> dict[str, Any]:
            if provider is not None:
                await send(name)
            return {"seen": [name]}

        return run

    @keel.effect("notify")
    async def send(name: str, *, idempotency_key: str) -> Any:
        assert provider is not None
        return provider.deliver(idempotency_key, name)

    def build() -> StateGraph:
        g = StateGraph(Fan)
        for name in ("a", "b", "c", "d"):
            g.add_node(name, node(name))
        for name in ("a", "b", "c"):
            g.add_edge(START, name)
            g.add_edge(name, "d")
        g.add_edge("d", END)
        return g

    return build


# -- one commit per superstep ----------------------------------------------------------------


def test_each_superstep_is_one_durable_commit(make_app: AppFactory) -> None:
    """Three parallel tasks, then a fourth: their writes commit with the step's checkpoint,
    never on their own; on PostgreSQL each of those transactions is one round trip."""
    app = make_app()
    app.workflow("fan")(fan_graph())
    run = app.submit("fan", job_id="fan-1", input={"seen": []})["run_id"]
    outcome, trace = run_traced(app)
    assert outcome == "completed"
    assert sorted(app.get_run(run).output["seen"]) == ["a", "b", "c", "d"]

    steps = trace.steps
    # Checkpoints: the input's (-1) and START's (0) with the one after the fan-out (1) (the
    # admitted input is durable already: see test_the_first_checkpoints_commit_with_the_first_
    # step), after d (2).
    assert [t.writes("checkpoints") for t in steps] == [True] * 2, [t.statements for t in steps]
    assert [t.checkpoints for t in steps] == [3, 1], [t.statements for t in steps]
    with_writes = [t for t in steps if t.writes("writes")]
    assert len(with_writes) == 2, [t.statements for t in steps]  # START's + a-b-c's, d's
    if app.aio.runtime.store.dialect == "postgres":
        assert [t.round_trips for t in steps] == [1] * 2
    events = [e for e in app.get_run(run).timeline if e["kind"] == "step"]
    assert sorted(e["data"]["node"] for e in events if e["data"]["node"] in "abcd") == [
        "a",
        "b",
        "c",
        "d",
    ]


# -- a first execution's first checkpoints ----------------------------------------------------


class Count(TypedDict, total=False):
    n: int
    seen: Annotated[list[str], operator.add]


def _bump(state: Count) -> dict[str, Any]:
    return {"n": state.get("n", 0) + 1}


def _two_nodes(routed: bool) -> Callable[[], StateGraph]:
    def build() -> StateGraph:
        g = StateGraph(Count)
        g.add_node("a", _bump)
        g.add_node("b", _bump)
        if routed:
            g.add_conditional_edges(START, lambda state: "a")
        else:
            g.add_edge(START, "a")
        g.add_edge("a", "b")
        g.add_edge("b", END)
        return g

    return build


def test_the_first_checkpoints_commit_with_the_first_step(make_app: AppFactory) -> None:
    """A first execution commits nothing before its first node's step: the input's checkpoint
    and the START step's (that input on channels, with its writes) commit with it. A router out
    of START is the user's code, which may choose otherwise if run again: its step then
    commits on its own."""
    app = make_app()
    app.workflow("plain")(_two_nodes(routed=False))
    app.workflow("routed")(_two_nodes(routed=True))
    for workflow, expected in (("plain", [3, 1]), ("routed", [2, 1, 1])):
        run = app.submit(workflow, job_id=f"{workflow}-1", input={"n": 0})["run_id"]
        outcome, trace = run_traced(app)
        assert outcome == "completed"
        assert app.get_run(run).output["n"] == 2
        steps = trace.steps
        assert [t.checkpoints for t in steps] == expected, (workflow, [t.statements for t in steps])
        assert all(t.writes("writes") for t in steps)


def test_a_graph_that_ends_at_start_commits_its_first_checkpoints_as_it_ends(
    make_app: AppFactory,
) -> None:
    """No node runs (START goes straight to END): the checkpoints that waited for a first step
    commit, with START's writes, when the graph returns."""

    def build() -> StateGraph:
        g = StateGraph(Count)
        g.add_node("unused", _bump)
        g.add_edge(START, END)
        return g

    app = make_app()
    app.workflow("empty")(build)
    run = app.submit("empty", job_id="empty-1", input={"n": 7})["run_id"]
    outcome, trace = run_traced(app)
    assert outcome == "completed"
    assert app.get_run(run).output["n"] == 7
    assert [(t.checkpoints, t.writes("writes")) for t in trace.steps] == [(2, True)]


def _root_checkpoints(db_url: str, run_id: str) -> int:
    """The run's root checkpoints committed, read on a connection of its own."""
    sql = "SELECT COUNT(*) FROM checkpoints WHERE thread_id = {0} AND checkpoint_ns = ''"
    if db_url.startswith("sqlite"):
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as db:
            return int(db.execute(sql.format("?"), (run_id,)).fetchone()[0])
    with psycopg.connect(db_url) as conn:
        found = conn.execute(sql.format("%s"), (run_id,)).fetchone()
        assert found is not None
        return int(found[0])


def test_an_effect_in_a_subgraph_of_the_first_step_follows_its_parents_checkpoint(
    make_app: AppFactory, db_url: str
) -> None:
    """Inside a subgraph an effect's key names its parent task by the id the START step's
    checkpoint gave it: that checkpoint is durable before the effect happens (else a crash
    there would restart the run, give the task another id, and repeat the effect), even in a
    subgraph that saves no checkpoints of its own and so never reads one. (LangGraph runs such
    a subgraph only under durability="async": under "sync" it fails on a checkpoint it never
    put.)"""
    seen: list[tuple[str, int]] = []

    @keel.effect("notify")
    def notify(to: str, *, idempotency_key: str) -> str:
        seen.append((locate().namespace, _root_checkpoints(db_url, run_id)))
        return to

    def inner(state: Count) -> dict[str, Any]:
        return {"seen": [notify("x")]}

    def build() -> StateGraph:
        sub = StateGraph(Count)
        sub.add_node("inner", inner)
        sub.add_edge(START, "inner")
        sub.add_edge("inner", END)
        g = StateGraph(Count)
        g.add_node("outer", sub.compile(checkpointer=False))
        g.add_edge(START, "outer")
        g.add_edge("outer", END)
        return g

    app = make_app()
    app.workflow("nested", durability="async")(build)
    run_id = app.submit("nested", job_id="nested-1", input={"n": 0})["run_id"]
    outcome, _ = run_traced(app)
    assert outcome == "completed"
    assert app.get_run(run_id).output["seen"] == ["x"]
    [(namespace, durable)] = seen
    assert "|" in namespace, namespace  # the key does name its parent task
    assert durable == 2, "the START step's checkpoint was not durable when the effect ran"


def test_a_staged_write_commits_in_its_tasks_checkpoint_transaction(make_app: AppFactory) -> None:
    """RunContext.stage: the row commits with the task's writes and the next checkpoint."""
    app = make_app()

    async def staged_event(store: Store, tx: Tx) -> None:
        await store.add_event(tx, current_run["id"], "staged.row", {"by": "stage"})

    current_run: dict[str, str] = {}

    async def work(state: Fan) -> dict[str, Any]:
        from langgraph.config import get_config

        ctx = current()
        current_run["id"] = ctx.run_id
        ctx.stage(get_config()["configurable"]["__pregel_task_id"], staged_event)
        return {"seen": ["work"]}

    def build() -> StateGraph:
        g = StateGraph(Fan)
        g.add_node("work", work)
        g.add_edge(START, "work")
        g.add_edge("work", END)
        return g

    app.workflow("stage")(build)
    run = app.submit("stage", job_id="stage-1", input={"seen": []})["run_id"]
    outcome, trace = run_traced(app)
    assert outcome == "completed"
    kinds = [e["kind"] for e in app.get_run(run).timeline]
    assert kinds.count("staged.row") == 1
    # The staged row is in the transaction of work's writes, which holds a checkpoint.
    [with_row] = [
        t for t in trace.transactions if any("staged.row" in s for s in t.statements)
    ] or [None]
    if app.aio.runtime.store.dialect == "sqlite":
        assert with_row is not None and with_row.writes("checkpoints") and with_row.writes("writes")
    step = [e for e in app.get_run(run).timeline if e["kind"] in ("step", "staged.row")]
    assert [e["kind"] for e in step][-2:] == ["step", "staged.row"]


# -- LangGraph's special writes --------------------------------------------------------------


class Ask(TypedDict, total=False):
    seen: Annotated[list[str], operator.add]
    decision: str


@pytest.mark.parametrize("durability", ["sync", "exit", "async"])
def test_an_interrupt_inside_a_parallel_step_keeps_the_siblings_writes(
    make_app: AppFactory, durability: str
) -> None:
    """`ask` pauses while `work` finishes beside it: no checkpoint follows, so work's writes
    commit with the interrupt (and work is not run again on resume). With durability="exit"
    LangGraph saves the pending writes after its last checkpoint, at exit: they commit too;
    with "async" the pause's writes commit with the waits as with "sync"."""
    app = make_app()
    runs: list[str] = []

    async def ask(state: Ask) -> dict[str, Any]:
        decision = keel.approval("manager").decision
        return {"decision": decision, "seen": ["ask"]}

    async def work(state: Ask) -> dict[str, Any]:
        runs.append("work")
        await asyncio.sleep(0.05)  # finishes after ask has paused
        return {"seen": ["work"]}

    def build() -> StateGraph:
        g = StateGraph(Ask)
        g.add_node("ask", ask)
        g.add_node("work", work)
        g.add_edge(START, "ask")
        g.add_edge(START, "work")
        g.add_edge("ask", END)
        g.add_edge("work", END)
        return g

    app.workflow("ask", durability=durability)(build)
    run = app.submit("ask", job_id="ask-1", input={"seen": []})["run_id"]
    assert execute(app, *claim(app, "w1")) == "waiting"
    app.approve(run, by="alice")
    drain(app)
    done = app.get_run(run)
    assert done.status == "completed", done
    assert sorted(done.output["seen"]) == ["ask", "work"]
    assert runs == ["work"], "a finished sibling ran again after the interrupt"


class Flaky(TypedDict, total=False):
    seen: Annotated[list[str], operator.add]


def test_an_error_handler_node_runs_after_a_node_that_keeps_raising(
    make_app: AppFactory,
) -> None:
    """The failing node's error is durable before its handler runs; the handler's writes
    commit with the next checkpoint; the run completes."""
    app = make_app()
    attempts: list[int] = []

    async def flaky(state: Flaky) -> dict[str, Any]:
        attempts.append(1)
        raise ValueError("provider down")

    async def recover(state: Flaky) -> dict[str, Any]:
        return {"seen": ["recovered"]}

    def build() -> StateGraph:
        g = StateGraph(Flaky)
        kwargs: dict[str, Any] = {
            "retry_policy": RetryPolicy(
                max_attempts=2, initial_interval=0.01, jitter=False, retry_on=ValueError
            )
        }
        g.add_node("flaky", flaky, error_handler=recover, **kwargs)
        g.add_edge(START, "flaky")
        g.add_edge("flaky", END)
        return g

    app.workflow("flaky")(build)
    run = app.submit("flaky", job_id="flaky-1", input={"seen": []})["run_id"]
    outcome, trace = run_traced(app)
    done = app.get_run(run)
    assert outcome == "completed", done
    assert done.output["seen"] == ["recovered"]
    assert len(attempts) == 2
    # The error (a special write) committed at once, before any checkpoint after it: with the
    # run's input and START checkpoints, which waited for a first step's (none came); then the
    # handler's writes with the next checkpoint. (Buffered, the error would have waited for
    # that checkpoint: one transaction of three.)
    steps = trace.steps
    assert [t.checkpoints for t in steps] == [2, 1], [t.statements for t in steps]
    assert all(t.writes("writes") for t in steps)
    if app.aio.runtime.store.dialect == "sqlite":  # (PostgreSQL's trace shows no values)
        assert "'__error__'" in " ".join(steps[0].statements), steps[0].statements


class Chat(TypedDict, total=False):
    messages: Annotated[list[Any], add_messages]


def test_a_reducer_channel_accumulates_across_batched_steps(make_app: AppFactory) -> None:
    """add_messages across three steps, resumed after a crash-like stop: every step's writes
    were committed with their checkpoint, so nothing is lost or doubled."""
    app = make_app()

    def say(text: str) -> Callable[[Chat], Any]:
        async def node(state: Chat) -> dict[str, Any]:
            return {"messages": [("ai", f"{text} after {len(state['messages'])}")]}

        return node

    def build() -> StateGraph:
        g = StateGraph(Chat)
        for name in ("one", "two", "three"):
            g.add_node(name, say(name))
        g.add_edge(START, "one")
        g.add_edge("one", "two")
        g.add_edge("two", "three")
        g.add_edge("three", END)
        return g

    app.workflow("chat")(build)
    run = app.submit("chat", job_id="chat-1", input={"messages": [("human", "hi")]})["run_id"]
    drain(app)
    texts = [m["content"] for m in app.get_run(run).output["messages"]]
    assert texts == ["hi", "one after 1", "two after 2", "three after 3"]


# -- subgraphs -------------------------------------------------------------------------------


class Outer(TypedDict, total=False):
    seen: Annotated[list[str], operator.add]


def test_a_subgraph_beside_a_sibling_reads_its_own_writes_across_a_pause(
    make_app: AppFactory,
) -> None:
    """A subgraph of two steps, paused in its second, runs beside a plain sibling; the resumed
    subgraph reads its first step's writes (committed before its read) and the sibling's
    writes are not lost."""
    app = make_app()
    calls: list[str] = []

    async def first(state: Outer) -> dict[str, Any]:
        calls.append("first")
        return {"seen": ["first"]}

    async def second(state: Outer) -> dict[str, Any]:
        assert "first" in state["seen"], state
        keel.approval("inner")
        return {"seen": ["second"]}

    def inner() -> Any:
        g = StateGraph(Outer)
        g.add_node("first", first)
        g.add_node("second", second)
        g.add_edge(START, "first")
        g.add_edge("first", "second")
        g.add_edge("second", END)
        return g.compile()

    async def sibling(state: Outer) -> dict[str, Any]:
        calls.append("sibling")
        return {"seen": ["sibling"]}

    def build() -> StateGraph:
        g = StateGraph(Outer)
        g.add_node("sub", inner())
        g.add_node("sibling", sibling)
        g.add_edge(START, "sub")
        g.add_edge(START, "sibling")
        g.add_edge("sub", END)
        g.add_edge("sibling", END)
        return g

    app.workflow("outer")(build)
    run = app.submit("outer", job_id="outer-1", input={"seen": []})["run_id"]
    assert execute(app, *claim(app, "w1")) == "waiting"
    app.approve(run, by="alice")
    drain(app)
    done = app.get_run(run)
    assert done.status == "completed", done
    assert sorted(done.output["seen"]) == ["first", "second", "sibling"]
    assert sorted(calls) == ["first", "sibling"], "a finished task ran again"


# -- cancel at a step boundary ---------------------------------------------------------------


def test_cancel_stops_at_the_next_step_boundary_with_the_step_durable(
    make_app: AppFactory,
) -> None:
    """A cancel requested during the fan-out stops the run at the checkpoint that commits the
    fan-out's writes: they are durable, d never runs."""
    app = make_app()
    ran: list[str] = []

    def node(name: str) -> Callable[[Fan], Any]:
        async def run(state: Fan) -> dict[str, Any]:
            ran.append(name)
            if name == "a":
                await asyncio.to_thread(app.cancel, current().run_id, by="ops")
            return {"seen": [name]}

        return run

    def build() -> StateGraph:
        g = StateGraph(Fan)
        for name in ("a", "b", "c", "d"):
            g.add_node(name, node(name))
        for name in ("a", "b", "c"):
            g.add_edge(START, name)
            g.add_edge(name, "d")
        g.add_edge("d", END)
        return g

    app.workflow("fan")(build)
    run = app.submit("fan", job_id="fan-c", input={"seen": []})["run_id"]
    outcome, _ = run_traced(app)
    assert outcome == "cancelled"
    assert "d" not in ran
    state = app.aio.runtime.portal.call(
        app.aio.runtime.fencing().aget_tuple(
            {"configurable": {"thread_id": run, "checkpoint_ns": ""}}
        )
    )
    assert state is not None
    assert sorted(state.checkpoint["channel_values"]["seen"]) == ["a", "b", "c"]


# -- a step whose commit's outcome was lost ---------------------------------------------------


def test_a_step_retried_after_its_commit_was_lost_adds_nothing_twice(
    make_app: AppFactory,
) -> None:
    """The first step transaction of the fan-out commits, then the client loses the answer
    (the connection drops at COMMIT): the saver runs it again, and its keyed `step` events,
    upserted checkpoint and writes are not doubled."""
    app = make_app()
    app.workflow("fan")(fan_graph())
    run = app.submit("fan", job_id="fan-lost", input={"seen": []})["run_id"]
    store = app.aio.runtime.store
    real = store.step_transaction
    calls: list[int] = []
    lost: list[int] = []

    async def commits_then_loses_the_answer(body: Callable[[Tx], Any]) -> Any:
        result = await real(body)
        calls.append(1)
        # The second: the checkpoint after the fan-out, with a's, b's and c's writes and events
        # (and the run's first checkpoints, which waited for it).
        if len(calls) == 2:
            lost.append(1)
            if store.dialect == "sqlite":
                raise sqlite3.OperationalError("disk I/O error")
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return result

    store.step_transaction = commits_then_loses_the_answer  # type: ignore[method-assign]
    try:
        outcome, _ = run_traced(app)
    finally:
        del store.step_transaction
    assert lost == [1]
    assert outcome == "completed"
    steps = [e["data"]["node"] for e in app.get_run(run).timeline if e["kind"] == "step"]
    assert sorted(n for n in steps if n in "abcd") == ["a", "b", "c", "d"], steps
    assert len(steps) == len(set(steps)), f"a step event was added twice: {steps}"
