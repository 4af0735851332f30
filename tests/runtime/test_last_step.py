"""The run's end commits with its last step's checkpoint, in one fenced transaction.

LangGraph saves a checkpoint after its last step and then finds no task to run; the saver
holds that checkpoint (with the step's writes and events) back and the execution's end commits
it (`Fencing.ending`). These tests prove what that must keep: a cancel asked during the last
step still cancels the run at that step's boundary, a takeover during it commits neither the
checkpoint nor the end, a lost answer at that commit ends the run once, and anything that reads
the run's state before the end reads the held checkpoint from the database.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

import keel
from keel.core import leases
from keel.core.context import current
from keel.core.store.base import Tx
from tests.support.providers import Provider
from tests.support.workers import answer_lost_once, claim, execute

AppFactory = Callable[..., keel.App]


class Chain(TypedDict, total=False):
    n: int
    receipt: Any


def chain(last: Callable[[Chain], Any]) -> Callable[[], StateGraph]:
    async def first(state: Chain) -> dict[str, Any]:
        return {"n": state["n"] + 1}

    def build() -> StateGraph:
        g = StateGraph(Chain)
        g.add_node("first", first)
        g.add_node("last", last)
        g.add_edge(START, "first")
        g.add_edge("first", "last")
        g.add_edge("last", END)
        return g

    return build


def checkpoint_of(app: keel.App, run: str) -> dict[str, Any]:
    found = app.aio.runtime.portal.call(
        app.aio.runtime.fencing().aget_tuple(
            {"configurable": {"thread_id": run, "checkpoint_ns": ""}}
        )
    )
    assert found is not None
    return dict(found.checkpoint["channel_values"])


def kinds(app: keel.App, run: str) -> list[str]:
    return [
        e["kind"] if e["kind"] != "step" else f"step:{e['data']['node']}"
        for e in app.get_run(run).timeline
    ]


def test_the_last_step_and_the_end_commit_together(make_app: AppFactory) -> None:
    app = make_app()
    commits: list[int] = []
    real = app.aio.runtime.store.step_transaction

    async def counted(body: Callable[[Tx], Any]) -> Any:
        commits.append(1)
        return await real(body)

    app.aio.runtime.store.step_transaction = counted  # type: ignore[method-assign]

    async def last(state: Chain) -> dict[str, Any]:
        return {"n": state["n"] * 10}

    app.workflow("chain")(chain(last))
    run = app.submit("chain", job_id="last-1", input={"n": 1})["run_id"]
    assert execute(app, *claim(app, "w-a")) == "completed"
    details = app.get_run(run)
    assert (details.status, details.output) == ("completed", {"n": 20})
    assert checkpoint_of(app, run)["n"] == 20
    # One per node's step (the input's and START's checkpoints with the first), the end in the
    # last: no transaction of its own.
    assert len(commits) == 2
    ended = kinds(app, run)
    assert ended.index("step:last") < ended.index("status.completed")


def test_a_cancel_during_the_last_step_cancels_the_run_with_that_step_durable(
    make_app: AppFactory,
) -> None:
    app = make_app()

    async def last(state: Chain) -> dict[str, Any]:
        await asyncio.to_thread(app.cancel, current().run_id, by="ops")
        return {"n": state["n"] * 10}

    app.workflow("chain")(chain(last))
    run = app.submit("chain", job_id="last-cancel", input={"n": 1})["run_id"]
    assert execute(app, *claim(app, "w-a")) == "cancelled"
    details = app.get_run(run)
    assert (details.status, details.termination_reason) == ("cancelled", "cancelled")
    assert details.output is None
    # The step's boundary stopped the run, as at any other step: the step itself is kept.
    assert checkpoint_of(app, run)["n"] == 20
    assert "status.completed" not in kinds(app, run)


def test_a_takeover_during_the_last_step_commits_neither_its_checkpoint_nor_the_end(
    make_app: AppFactory,
) -> None:
    provider = Provider()
    app = make_app()
    ran: list[int] = []
    taken: list[Any] = []

    @keel.effect("charge")
    async def charge(n: int, *, idempotency_key: str) -> Any:
        return provider.deliver(idempotency_key, str(n))

    async def last(state: Chain) -> dict[str, Any]:
        ran.append(current().token)
        if len(ran) == 1:
            # Another worker takes the run over while this step runs (its holder seen dead).
            store = app.aio.runtime.store
            assert await leases.end_dead(store, current().run_id, current().token)
            taken.append(await leases.claim(store, "w-b", app.aio.runtime.workflows.keys(), 30))
        return {"n": state["n"] * 10, "receipt": await charge(state["n"])}

    app.workflow("chain")(chain(last))
    run = app.submit("chain", job_id="last-takeover", input={"n": 1})["run_id"]
    lease, row = claim(app, "w-a")
    assert execute(app, lease, row) == "lease_lost"
    details = app.get_run(run)
    assert details.status == "running"
    assert "n" in checkpoint_of(app, run) and checkpoint_of(app, run)["n"] == 2
    assert "step:last" not in kinds(app, run)
    # The new holder resumes from the first step's checkpoint: the last step runs again, its
    # charge is served from the ledger.
    [(lease_b, row_b)] = taken
    assert execute(app, lease_b, row_b) == "completed"
    assert ran == [1, 2]
    assert len(provider.deliveries) == 1
    details = app.get_run(run)
    assert (details.status, details.output["n"]) == ("completed", 20)
    assert kinds(app, run).count("status.completed") == 1


def test_an_end_whose_commit_answer_was_lost_ends_the_run_once(make_app: AppFactory) -> None:
    app = make_app()

    async def last(state: Chain) -> dict[str, Any]:
        return {"n": state["n"] * 10}

    app.workflow("chain")(chain(last))
    run = app.submit("chain", job_id="last-lost", input={"n": 1})["run_id"]
    lease, row = claim(app, "w-a")
    with answer_lost_once(app, run, "completed") as lost:
        assert execute(app, lease, row) == "completed"
    assert lost == [1]
    assert kinds(app, run).count("status.completed") == 1
    assert app.get_run(run).output == {"n": 20}


class In(TypedDict):
    n: int


class Out(TypedDict):
    doubled: int


class Whole(In, Out, total=False):
    pass


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_graph_whose_output_is_not_its_state_reads_the_held_checkpoint(
    make_app: AppFactory, nodes: int
) -> None:
    """The end reads the state (the output schema is not the state's): the read commits the
    held checkpoint first and finds it, even in a first execution (that has read nothing)."""
    app = make_app()

    async def double(state: Whole) -> dict[str, Any]:
        return {"doubled": state.get("doubled", state["n"]) * 2}

    def build() -> StateGraph:
        g = StateGraph(Whole, input_schema=In, output_schema=Out)
        previous = START
        for i in range(nodes):
            g.add_node(f"d{i}", double)
            g.add_edge(previous, f"d{i}")
            previous = f"d{i}"
        g.add_edge(previous, END)
        return g

    app.workflow("double")(build)
    run = app.submit("double", job_id=f"last-out-{nodes}", input={"n": 3})["run_id"]
    assert execute(app, *claim(app, "w-a")) == "completed"
    details = app.get_run(run)
    assert details.status == "completed"
    assert details.output == {"n": 3, "doubled": 3 * 2**nodes}
    assert checkpoint_of(app, run)["doubled"] == 3 * 2**nodes


def test_a_termination_hook_that_fails_once_does_not_run_the_last_step_again(
    make_app: AppFactory,
) -> None:
    """The workflow's `termination` hook runs between the last step and the end: if it raises,
    the step stays done (its checkpoint commits) and only the end is tried again."""
    from tests.support.workers import drain

    app = make_app(max_attempts=3, retry_backoff=0.01)
    ran: list[int] = []
    calls: list[int] = []

    async def last(state: Chain) -> dict[str, Any]:
        ran.append(1)
        return {"n": state["n"] * 10}

    def termination(values: Any) -> str | None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in the hook, once")
        return None

    app.workflow("chain", termination=termination)(chain(last))
    run = app.submit("chain", job_id="last-hook", input={"n": 1})["run_id"]
    drain(app)
    assert (app.get_run(run).status, len(calls), ran) == ("completed", 2, [1])
    assert kinds(app, run).count("step:last") == 1
