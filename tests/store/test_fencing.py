"""Fencing, in-process and honest: after a takeover, the old token can write nothing.

Worker A claims the run (token 1); the ManualClock passes the lease TTL; worker B claims it
again (token 2). Every write path a run has is then tried under token 1, the way a paused or
partitioned A would try it when it wakes up, and must raise LeaseLost and leave no row behind.
The same writes under token 2 succeed. Last, a whole stale execution: even when the new owner
lives in the same process (the same worker re-claimed the run after its own lease expired, e.g.
while its event loop was blocked past the TTL), the stale one checkpoints nothing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypedDict, TypeVar

import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from langgraph.types import Interrupt

import keel
from keel.core import leases, waits
from keel.core.context import RunContext, current, enter, leave
from keel.core.effects import ledger
from keel.core.effects.keys import Identity, effect_key, legacy_key
from keel.core.errors import LeaseLost
from keel.core.ids import StepRef
from keel.core.store.store import Lease
from tests.support.graphs import echo_graph
from tests.support.roundtrips import Count, counting

AppFactory = Callable[..., keel.App]
T = TypeVar("T")
TTL = 30.0


class Takeover:
    """A run claimed by A, then taken over by B after A's lease expired."""

    def __init__(self, make_app: AppFactory) -> None:
        self.clock = keel.ManualClock()
        self.app = make_app(clock=self.clock, lease_ttl=TTL)
        self.app.workflow("echo")(echo_graph)
        self.run_id = self.app.submit("echo", job_id="job-1", input={"text": "x"})["run_id"]
        self.rt = self.app.aio.runtime
        self.a = self.claim("worker-a")
        self.clock.advance(TTL + 1)
        self.b = self.claim("worker-b")

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.rt.portal.call(coro)

    def claim(self, worker: str) -> Lease:
        got = self.call(leases.claim(self.rt.store, worker, self.rt.workflows.keys(), TTL))
        assert got is not None
        return got[0]

    def ctx(self, lease: Lease) -> RunContext:
        def nowhere() -> StepRef:
            raise AssertionError("not called")

        return RunContext(
            run_id=self.run_id,
            job_id="job-1",
            workflow="echo",
            token=lease.token,
            worker_id=lease.worker_id,
            services=self.rt.services,
            locate=nowhere,
            pause=lambda value: None,
        )

    def snapshot(self) -> tuple[Any, ...]:
        details = self.app.get_run(self.run_id)
        return (details.run, details.timeline, details.effects, details.waits)

    def as_if_several_executions_ran(self) -> None:
        """SQLite's transactions then take the database thread, where they group (one
        execution alone commits on the loop's thread, each transaction by itself)."""
        self.rt.connector.commit_here_when = lambda: False  # type: ignore[attr-defined]


@pytest.fixture
def takeover(make_app: AppFactory) -> Takeover:
    return Takeover(make_app)


def test_takeover_bumps_the_token_and_names_the_previous_owner(takeover: Takeover) -> None:
    assert (takeover.a.token, takeover.b.token) == (1, 2)
    run = takeover.app.get_run(takeover.run_id)
    assert (run.status, run.run["lease_owner"], run.run["lease_token"]) == (
        "running",
        "worker-b",
        2,
    )
    [event] = [e for e in run.timeline if e["kind"] == "lease.takeover"]
    assert event["data"]["previous_owner"] == "worker-a"
    assert event["lease_token"] == 2


def test_live_lease_cannot_be_taken_over(takeover: Takeover) -> None:
    takeover.clock.advance(TTL - 1)  # B's lease has not expired yet
    got = takeover.call(leases.claim(takeover.rt.store, "worker-c", ["echo@1"], TTL))
    assert got is None


def test_stale_token_fenced_transaction_raises_lease_lost_and_writes_nothing(
    takeover: Takeover,
) -> None:
    store, run = takeover.rt.store, takeover.run_id
    before = takeover.snapshot()

    async def write(token: int) -> None:
        async with store.fenced(run, token) as tx:
            await store.add_event(tx, run, "probe", {"token": token})

    with pytest.raises(LeaseLost, match=r"token 1 is stale \(current 2, owner worker-b\)"):
        takeover.call(write(1))
    assert takeover.snapshot() == before
    takeover.call(write(2))
    probes = [e for e in takeover.app.get_run(run).timeline if e["kind"] == "probe"]
    assert [p["data"] for p in probes] == [{"token": 2}]


def test_stale_token_step_transaction_fails_quietly_and_its_connection_serves_the_next(
    takeover: Takeover, caplog: pytest.LogCaptureFixture
) -> None:
    """A stale token's step transaction raises LeaseLost and nothing else: no driver warning
    (on PostgreSQL the fence aborts the pipeline, and a read inside it meets the failure before
    the pipeline ends; psycopg used to log "error ignored terminating AsyncPipeline" for every
    stale token), and the connection it used serves the next transactions."""
    store, run = takeover.rt.store, takeover.run_id
    before = takeover.snapshot()

    async def step(tx: Any) -> Any:
        fence = await store.fence_step(tx, run, 1)
        await store.add_event(tx, run, "probe", {"token": 1})
        now = await tx.send("database_now", {})
        await now()  # a row read at once: sent before the end, inside the transaction
        return fence

    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            with pytest.raises(LeaseLost, match="token 1 is stale"):
                takeover.call(store.step_transaction(step))
    assert [r.getMessage() for r in caplog.records] == []
    assert takeover.snapshot() == before

    async def fresh(tx: Any) -> Any:
        fence = await store.fence_step(tx, run, 2)
        await store.add_event(tx, run, "probe", {"token": 2})
        return fence

    row = takeover.call(_after(store.step_transaction(fresh)))
    assert row["cancel_requested"] in (0, False)
    probes = [e for e in takeover.app.get_run(run).timeline if e["kind"] == "probe"]
    assert [p["data"] for p in probes] == [{"token": 2}]


def test_step_transactions_that_arrive_together_commit_once_and_a_stale_one_alone_fails(
    takeover: Takeover,
) -> None:
    """SQLite's group commit: the first goes at once; the three that wait for the database
    thread meanwhile go together, in one call with one COMMIT, each in its own savepoint, so
    the stale one between two current ones writes nothing and raises LeaseLost while both
    others commit."""
    store, run = takeover.rt.store, takeover.run_id
    takeover.as_if_several_executions_ran()
    tokens = [2, 1, 2, 2]

    def step(n: int, token: int) -> Any:
        async def body(tx: Any) -> Any:
            fence = await store.fence_step(tx, run, token)
            await store.add_event(tx, run, "probe", {"n": n})
            return fence

        return body

    async def together() -> tuple[list[Any], Count]:
        with counting() as count:
            got = await asyncio.gather(
                *(store.step_transaction(step(n, t)) for n, t in enumerate(tokens)),
                return_exceptions=True,
            )
        return got, count

    got, count = takeover.call(together())
    assert isinstance(got[1], LeaseLost) and "token 1 is stale" in str(got[1])
    assert not any(isinstance(g, BaseException) for i, g in enumerate(got) if i != 1), got
    probes = [e["data"]["n"] for e in takeover.app.get_run(run).timeline if e["kind"] == "probe"]
    assert sorted(probes) == [0, 2, 3]
    if store.dialect == "sqlite":
        assert count.kinds == ["_group", "_group"]  # the first alone, then the three


@pytest.mark.parametrize("backend", ["sqlite"])  # SQLite's group commit
def test_a_group_whose_transaction_sqlite_gives_up_tells_every_member_it_failed(
    takeover: Takeover,
) -> None:
    """When SQLite rolls the whole transaction back (a full disk, an I/O error; here a
    trigger's RAISE(ROLLBACK)), the members whose bodies had run are lost with it: each of them
    raises, none is told it committed, and the connection serves the next transaction."""
    store, run = takeover.rt.store, takeover.run_id
    takeover.as_if_several_executions_ran()
    conn = takeover.rt.connector.connection  # type: ignore[attr-defined]
    takeover.call(
        conn.execute(
            "CREATE TEMP TRIGGER doom BEFORE INSERT ON keel_events WHEN NEW.kind = 'doom' "
            "BEGIN SELECT RAISE(ROLLBACK, 'doomed'); END"
        )
    )

    def step(kind: str) -> Any:
        async def body(tx: Any) -> Any:
            fence = await store.fence_step(tx, run, 2)
            await store.add_event(tx, run, kind, {})
            return fence

        return body

    async def together() -> list[Any]:
        kinds = ["probe", "probe", "doom", "probe"]  # the first alone, then a group
        calls = (store.step_transaction(step(k)) for k in kinds)
        return await asyncio.gather(*calls, return_exceptions=True)

    got = takeover.call(together())
    assert not isinstance(got[0], Exception), got
    assert all(isinstance(g, Exception) and "doomed" in str(g) for g in got[1:]), got
    assert takeover.call(_after(store.step_transaction(step("probe")))) is not None
    kinds = [e["kind"] for e in takeover.app.get_run(run).timeline]
    assert kinds.count("probe") == 2 and "doom" not in kinds


@pytest.mark.parametrize("backend", ["sqlite"])  # SQLite's group commit
def test_a_group_whose_leading_caller_is_cancelled_still_answers_the_others(
    takeover: Takeover,
) -> None:
    """The caller that took a group to the database thread is cancelled while the group is
    there: the group still commits, and the other member returns its result."""
    store, run = takeover.rt.store, takeover.run_id
    takeover.as_if_several_executions_ran()
    connector = takeover.rt.connector
    gate = threading.Event()

    def step(n: int, *, slow: bool = False) -> Any:
        async def body(tx: Any) -> Any:
            fence = await store.fence_step(tx, run, 2)
            if slow:
                gate.wait(10)  # on the database thread: the group is there
            await store.add_event(tx, run, "probe", {"n": n})
            return fence

        return body

    async def scenario() -> Any:
        release = asyncio.Event()

        async def hold() -> None:
            async with connector.lock:  # type: ignore[attr-defined]
                await release.wait()

        holder = asyncio.create_task(hold())
        await asyncio.sleep(0)
        leader = asyncio.create_task(store.step_transaction(step(0, slow=True)))
        await asyncio.sleep(0)  # the leader waits for the lock ...
        other = asyncio.create_task(store.step_transaction(step(1)))
        await asyncio.sleep(0)  # ... and the other joins its group
        release.set()
        await holder
        await asyncio.sleep(0.05)  # the group is on the thread, held at the gate
        leader.cancel()
        gate.set()
        fence = await asyncio.wait_for(other, 10)
        with pytest.raises(asyncio.CancelledError):
            await leader
        return await fence()

    assert takeover.call(scenario())["run_id"] == run
    probes = [e["data"]["n"] for e in takeover.app.get_run(run).timeline if e["kind"] == "probe"]
    assert sorted(probes) == [0, 1]


def test_a_row_read_inside_a_step_transaction_is_returned(takeover: Takeover) -> None:
    """`tx.one` in a step transaction's body returns the row (an outbox intent's insert reads
    whether it was new this way): on PostgreSQL the body runs in a pipeline, where a result is
    back only after a sync, and `one` returned None before it synced."""
    store, run = takeover.rt.store, takeover.run_id

    async def step(tx: Any) -> Any:
        await store.fence_step(tx, run, 2)
        return await store.check_fence(tx, run, 2)

    row = takeover.call(store.step_transaction(step))
    assert row is not None and row["lease_token"] == 2


@pytest.mark.parametrize("stop", ["raises", "is cancelled"])
def test_a_step_transaction_stopped_half_way_commits_nothing(takeover: Takeover, stop: str) -> None:
    """A body that stops after some statements were sent (a bug, a cancelled task) leaves none
    of them: on PostgreSQL the pipeline has no BEGIN, and its Sync would commit them."""
    store, run = takeover.rt.store, takeover.run_id
    before = takeover.snapshot()
    sent = asyncio.Event()

    async def step(tx: Any) -> Any:
        await store.fence_step(tx, run, 2)
        await store.add_event(tx, run, "half.way", {"sent": True})
        sent.set()
        if stop == "raises":
            raise RuntimeError("a bug half-way through a step")
        await asyncio.sleep(30)

    async def go() -> None:
        task = asyncio.create_task(store.step_transaction(step))
        await sent.wait()
        if stop == "is cancelled":
            task.cancel()
        with pytest.raises((RuntimeError, asyncio.CancelledError)):
            await task

    takeover.call(go())
    assert takeover.snapshot() == before
    # The connection it used serves the next transaction.
    after = takeover.call(_after(store.step_transaction(lambda tx: store.fence_step(tx, run, 2))))
    assert not after["cancel_requested"]


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_step_holds_no_lock_until_its_whole_transaction_is_sent(takeover: Takeover) -> None:
    """A worker frozen (SIGSTOP, a paused VM) half-way through sending a step must hold nothing
    another worker would wait on. On PostgreSQL the statements go as one message at the end: a
    pipeline ran the fence at once, its FOR SHARE held the run with no timeout to end it, and
    the frozen worker's run could not be taken over."""
    # (SQLite takes its write lock for the whole call, on the database thread.)
    store, run = takeover.rt.store, takeover.run_id
    url = takeover.rt.connector.url

    def lockable() -> bool:
        with psycopg.connect(url) as other:
            try:
                other.execute("SELECT 1 FROM keel_runs WHERE run_id = %s FOR UPDATE NOWAIT", (run,))
            except psycopg.errors.LockNotAvailable:
                return False
            return True

    seen: list[bool] = []

    async def step(tx: Any) -> Any:
        fence = await store.fence_step(tx, run, 2)
        await store.add_event(tx, run, "probe", {"token": 2})
        seen.append(await asyncio.to_thread(lockable))  # the step "frozen" here
        return fence

    takeover.call(_after(store.step_transaction(step)))
    assert seen == [True]
    probes = [e for e in takeover.app.get_run(run).timeline if e["kind"] == "probe"]
    assert [p["data"] for p in probes] == [{"token": 2}]


async def _after(call: Coroutine[Any, Any, Any]) -> Any:
    """A step transaction's result: its fence's row, read after the commit."""
    return await (await call)()


def test_stale_token_cannot_reserve_or_record_an_effect(takeover: Takeover) -> None:
    where = StepRef(takeover.run_id, "send", 1, "__pregel_pull/send")
    key = effect_key(where, "email", 0)
    call = ledger.Call(where, 0, key, legacy_key(where, "email", (), {}), Identity({}), (), {})
    stale, live = takeover.ctx(takeover.a), takeover.ctx(takeover.b)
    with pytest.raises(LeaseLost):
        takeover.call(ledger.reserve(stale, call, "email", 5.0))
    assert takeover.app.get_run(takeover.run_id).effects == []

    row, new, _, _ = takeover.call(ledger.reserve(live, call, "email", 5.0))
    assert new and (row["status"], row["lease_token"]) == ("pending", 2)
    before = takeover.snapshot()
    with pytest.raises(LeaseLost):
        takeover.call(ledger.record(stale, key, ledger.SENT, 1, result={"id": "stale"}))
    assert takeover.snapshot() == before
    takeover.call(ledger.record(live, key, ledger.SENT, 1, result={"id": "live"}))
    [row] = takeover.app.get_run(takeover.run_id).effects
    assert (row["status"], row["result"]) == ("sent", '{"id": "live"}')


def test_stale_token_cannot_write_checkpoints_through_the_saver(takeover: Takeover) -> None:
    saver, run = takeover.rt.saver, takeover.run_id
    config: dict[str, Any] = {"configurable": {"thread_id": run, "checkpoint_ns": ""}}
    meta: dict[str, Any] = {"source": "input", "step": -1, "parents": {}}

    saver.hold(run, 1, "worker-a")  # A still believes it holds the run
    with pytest.raises(LeaseLost):
        takeover.call(saver.aput(config, empty_checkpoint(), meta, {}))
    assert takeover.call(saver.aget_tuple(config)) is None

    saver.hold(run, 2, "worker-b")
    saved = takeover.call(saver.aput(config, empty_checkpoint(), meta, {}))
    steps_before = takeover.snapshot()

    saver.hold(run, 1, "worker-a")
    with pytest.raises(LeaseLost):
        takeover.call(saver.aput_writes(saved, [("text", "stale")], "task-a", "__pregel_pull/echo"))
    assert takeover.call(saver.aget_tuple(saved)).pending_writes == []
    assert takeover.snapshot() == steps_before  # not even the `step` event

    saver.hold(run, 2, "worker-b")
    takeover.call(saver.aput_writes(saved, [("text", "live")], "task-b", "__pregel_pull/echo"))
    writes = takeover.call(saver.aget_tuple(saved)).pending_writes
    assert [(task, channel, value) for task, channel, value in writes] == [
        ("task-b", "text", "live")
    ]
    steps = [e for e in takeover.app.get_run(run).timeline if e["kind"] == "step"]
    assert [(s["lease_token"], s["worker_id"]) for s in steps] == [(2, "worker-b")]
    saver.drop(run, 2)


def test_saver_without_a_held_lease_refuses_to_write(takeover: Takeover) -> None:
    config: dict[str, Any] = {"configurable": {"thread_id": takeover.run_id, "checkpoint_ns": ""}}
    meta: dict[str, Any] = {"source": "input", "step": -1, "parents": {}}
    with pytest.raises(LeaseLost, match="holds no lease"):
        takeover.call(takeover.rt.saver.aput(config, empty_checkpoint(), meta, {}))


def test_stale_token_cannot_register_a_wait_or_change_status(takeover: Takeover) -> None:
    before = takeover.snapshot()
    pause = [Interrupt(value={"keel_wait": {"kind": "approval", "name": "m"}}, id="i-1")]
    with pytest.raises(LeaseLost):
        takeover.call(waits.register(takeover.ctx(takeover.a), pause))
    assert takeover.snapshot() == before
    assert takeover.call(waits.register(takeover.ctx(takeover.b), pause)).value == "waiting"
    details = takeover.app.get_run(takeover.run_id)
    assert details.status == "waiting"
    assert [w["interrupt_id"] for w in details.waits] == ["i-1"]


def test_stale_token_cannot_renew_or_release_the_lease(takeover: Takeover) -> None:
    store = takeover.rt.store
    lost = takeover.call(leases.renew(store, [takeover.a, takeover.b], TTL))
    assert lost == [takeover.a]
    before = takeover.snapshot()
    with pytest.raises(LeaseLost):
        takeover.call(leases.release(store, takeover.a, "stale shutdown"))
    assert takeover.snapshot() == before
    takeover.call(leases.release(store, takeover.b, "shutdown"))
    run = takeover.app.get_run(takeover.run_id).run
    assert (run["status"], run["lease_owner"]) == ("queued", None)


# -- a whole stale execution -----------------------------------------------------------------


class WhoState(TypedDict, total=False):
    who: str


def test_stale_execution_in_the_same_process_cannot_write_checkpoints(
    make_app: AppFactory,
) -> None:
    clock = keel.ManualClock()
    app = make_app(clock=clock, lease_ttl=30)
    rt = app.aio.runtime
    inside: dict[int, asyncio.Event] = {}
    go: dict[int, asyncio.Event] = {}

    async def work(state: WhoState) -> dict[str, Any]:
        token = current().token
        inside[token].set()
        await go[token].wait()
        return {"who": "stale" if token == 1 else "fresh"}

    def build() -> StateGraph:
        g = StateGraph(WhoState)
        g.add_node("work", work)
        g.add_edge(START, "work")
        g.add_edge("work", END)
        return g

    app.workflow("who")(build)
    run = app.submit("who", job_id="who-1", input={"who": ""})["run_id"]

    async def scenario() -> tuple[str, str, list[Any]]:
        for token in (1, 2):
            inside[token], go[token] = asyncio.Event(), asyncio.Event()

        async def start(worker: str) -> asyncio.Task[str]:
            # PostgreSQL skips a row a checkpoint write holds (SKIP LOCKED): poll, as workers do.
            for _ in range(500):
                got = await leases.claim(rt.store, worker, rt.workflows.keys(), 30)
                if got is not None:
                    return asyncio.create_task(rt.executor(worker).execute(*got))
                await asyncio.sleep(0.01)
            raise AssertionError("nothing to claim")

        first = await start("worker-a")
        await inside[1].wait()
        clock.advance(31)  # worker-a's loop was blocked past its lease...
        second = await start("worker-b")  # ...and this process re-claimed the run
        await inside[2].wait()
        go[1].set()  # the stale execution finishes its step
        stale = await first
        go[2].set()
        fresh = await second
        config = {"configurable": {"thread_id": run}}
        history = [c.checkpoint["channel_values"].get("who") async for c in rt.saver.alist(config)]
        return stale, fresh, history

    stale, fresh, history = rt.portal.call(scenario())
    assert (stale, fresh) == ("lease_lost", "completed")
    assert app.get_run(run).output == {"who": "fresh"}
    # Token 1 lost the run before its node returned: none of its state may be checkpointed.
    assert "stale" not in history, f"a stale execution wrote checkpoints: {history}"


# -- the step transaction: buffered writes, one pipeline -------------------------------------


def test_stale_token_commits_none_of_its_buffered_writes_nor_its_checkpoint(
    takeover: Takeover,
) -> None:
    """A's task writes wait in A's buffer for the step's checkpoint; A lost the run meanwhile:
    the step transaction (on PostgreSQL one pipeline: fence, events, writes, checkpoint) is
    aborted by its fence and nothing of it commits, not even a `step` event."""
    saver, run = takeover.rt.saver, takeover.run_id
    assert saver is not None
    config: dict[str, Any] = {"configurable": {"thread_id": run, "checkpoint_ns": ""}}
    meta: dict[str, Any] = {"source": "loop", "step": 0, "parents": {}}
    saved = takeover.call(
        _as(takeover.ctx(takeover.b), saver.aput(config, empty_checkpoint(), meta, {}))
    )
    before = takeover.snapshot()

    async def stale_step() -> None:
        await saver.aput_writes(saved, [("text", "stale")], "task-a", "__pregel_pull/echo")
        assert len(saver.buffers[(run, 1)].writes) == 1  # buffered, not yet written
        await saver.aput(saved, empty_checkpoint(), meta, {})

    with pytest.raises(LeaseLost, match="token 1 is stale"):
        takeover.call(_as(takeover.ctx(takeover.a), stale_step()))
    assert takeover.snapshot() == before
    tuple_ = takeover.call(saver.aget_tuple(config))
    assert (
        tuple_ is not None
        and tuple_.config["configurable"]["checkpoint_id"]
        == (saved["configurable"]["checkpoint_id"])
    ), "the stale checkpoint committed"
    assert tuple_.pending_writes == []

    # A special write (an error) commits at once: under the stale token, it raises there.
    with pytest.raises(LeaseLost):
        takeover.call(
            _as(
                takeover.ctx(takeover.a),
                saver.aput_writes(saved, [("__error__", "boom")], "task-a", "__pregel_pull/echo"),
            )
        )
    assert takeover.snapshot() == before

    # A pause's write waits for the wait's registration, which its fence aborts.
    async def stale_pause() -> None:
        await saver.aput_writes(saved, [("__interrupt__", "q")], "task-b", "__pregel_pull/echo")
        within = saver.ending(run, 1, pause=True)
        assert within is not None, "the pause's write did not wait for its registration"

        async def register(tx: Any) -> Any:
            # (PostgreSQL pipelines it behind the fence, which aborts all of it.)
            await tx.execute("set_run_decision", {"run_id": run, "decision": "stale"})

            async def nothing() -> None:
                return None

            return nothing

        await within(register)

    with pytest.raises(LeaseLost):
        takeover.call(_as(takeover.ctx(takeover.a), stale_pause()))
    assert takeover.snapshot() == before
    saver.drop(run, 1)


def test_a_buffered_write_commits_only_under_the_token_that_produced_it(
    takeover: Takeover,
) -> None:
    """The same process runs the run again under B's token while A's execution still has a
    write buffered: B's checkpoint does not take A's write with it."""
    saver, run = takeover.rt.saver, takeover.run_id
    assert saver is not None
    config: dict[str, Any] = {"configurable": {"thread_id": run, "checkpoint_ns": ""}}
    meta: dict[str, Any] = {"source": "loop", "step": 0, "parents": {}}
    live = takeover.ctx(takeover.b)
    saved = takeover.call(_as(live, saver.aput(config, empty_checkpoint(), meta, {})))
    takeover.call(
        _as(
            takeover.ctx(takeover.a),
            saver.aput_writes(saved, [("text", "stale")], "task-a", "__pregel_pull/echo"),
        )
    )
    takeover.call(
        _as(live, saver.aput_writes(saved, [("text", "live")], "task-b", "__pregel_pull/echo"))
    )
    later = takeover.call(_as(live, saver.aput(saved, empty_checkpoint(), meta, {})))
    writes = takeover.call(saver.aget_tuple(saved)).pending_writes
    assert [(t, c, v) for t, c, v in writes] == [("task-b", "text", "live")]
    steps = [e for e in takeover.app.get_run(run).timeline if e["kind"] == "step"]
    assert [(s["lease_token"], s["worker_id"]) for s in steps] == [(2, "worker-b")]
    assert later["configurable"]["checkpoint_id"]
    saver.drop(run, 1)
    saver.drop(run, 2)


async def _as(ctx: RunContext, call: Coroutine[Any, Any, T]) -> T:
    """Run `call` inside an execution's context, as the executor's graph does."""
    entered = enter(ctx)
    try:
        return await call
    finally:
        leave(entered)
