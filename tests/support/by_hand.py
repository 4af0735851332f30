"""Keel's rules driven by hand, without a worker or LangGraph: the database-free unit tier.

`memory_app()` is a real `keel.App` on `sqlite:///:memory:`: the real store and queries, migrated
in milliseconds, no server and no file (its artifacts folder cannot even be created). `Node`
plays a node of a run: it holds a real lease (claimed as a worker claims), calls effects and
`keel.approval()` inside the run's context from this thread (as a sync node does), and stands in
for LangGraph's `interrupt()`: a pause is recorded and raises `Paused`, unless the test gave the
value a resumed graph would pass.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar

from langgraph.graph import END, START, StateGraph
from langgraph.types import Interrupt

import keel
from keel.core import context, leases, waits
from keel.core.clock import Clock
from keel.core.context import RunContext
from keel.core.ids import StepRef
from keel.core.store.store import Lease

T = TypeVar("T")
WORKFLOW = "unit"
TTL = 30.0


class Paused(Exception):
    """What LangGraph's interrupt() does to a node: it stops there, with the wait's spec."""

    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self.value = value


class Died(BaseException):
    """The worker died right here: raised from an effect's function (or a notifier's send),
    it leaves the ledger (the outbox) as a SIGKILL would: a BaseException, so no error
    handling of Keel's catches it. It is raised after the call reached the outside world."""

    after_delivery = True


class NoteState(TypedDict, total=False):
    job: str
    note: str


def one_node() -> StateGraph:
    """The workflow the unit tier's runs belong to; its graph is never executed here."""
    g = StateGraph(NoteState)
    g.add_node("note", lambda state: {"note": "unused"})
    g.add_edge(START, "note")
    g.add_edge("note", END)
    return g


def memory_app(clock: Clock) -> keel.App:
    """A migrated Keel app on an in-memory SQLite database (gone when the app is closed)."""
    # A folder inside /dev/null cannot be created: any artifact write fails loudly.
    app = keel.App("sqlite:///:memory:", clock=clock, lease_ttl=TTL, artifacts_dir=os.devnull)
    app.workflow(WORKFLOW)(one_node)
    app.migrate()
    return app


def on_loop(app: keel.App, coro: Coroutine[Any, Any, T]) -> T:
    """Run one of Keel's async core operations on the app's loop (where its connection is)."""
    return app.aio.runtime.portal.call(coro)


@dataclass
class Node:
    """One node of a run, executed by hand under a real lease."""

    app: keel.App
    run: dict[str, Any]
    lease: Lease
    name: str = "send"
    step: int = 1
    answers: list[Any] = field(default_factory=list)
    """What the next pauses return, in order (a resumed graph's values); then pauses raise."""
    pauses: list[Any] = field(default_factory=list)
    """Every value the node paused with, in order."""
    ctx: RunContext = field(init=False)
    _attempt: object = field(init=False, default=None)

    def __post_init__(self) -> None:
        run_id = str(self.run["run_id"])
        self.ctx = RunContext(
            run_id=run_id,
            job_id=str(self.run["job_id"]),
            workflow=str(self.run["workflow"]),
            token=self.lease.token,
            worker_id=self.lease.worker_id,
            services=self.app.aio.runtime.services,
            # A task id, as LangGraph's, so the node can stage outbox intents (`ctx.staged`).
            locate=lambda: StepRef(
                run_id,
                self.name,
                self.step,
                f"__pregel_pull/{self.name}",
                scope=self._attempt,
                task_id=f"{self.name}-task",
            ),
            pause=self._pause,
        )

    @property
    def run_id(self) -> str:
        return self.ctx.run_id

    def _pause(self, value: Any) -> Any:
        self.pauses.append(value)
        if self.answers:
            return self.answers.pop(0)
        raise Paused(value)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call `fn` (an effect, `keel.approval`) inside the run, from this thread: one
        execution of the node (a second `call` is its replay)."""
        return self.execute(lambda: fn(*args, **kwargs))

    def execute(self, body: Callable[[], T]) -> T:
        """One execution of the node: `body` may call several effects, numbered in order."""
        self._attempt = object()
        entered = context.enter(self.ctx)
        try:
            return body()
        finally:
            context.leave(entered)

    def ask(self, name: str, **options: Any) -> None:
        """`keel.approval(name, **options)` in the node: it must pause."""
        try:
            self.call(keel.approval, name, **options)
        except Paused:
            return
        raise AssertionError(f"keel.approval({name!r}) did not pause")

    def interrupts(self) -> list[Interrupt]:
        """The node's pauses as LangGraph's interrupts (ids stable, as on a replay)."""
        return [
            Interrupt(value=value, id=f"{self.name}-{n}") for n, value in enumerate(self.pauses)
        ]

    def register_pauses(self) -> str:
        """What the executor does when the graph stopped: register each pause as a wait.

        The interrupt ids are stable, as LangGraph's are on a replay; returns the run's status.
        """
        return str(on_loop(self.app, waits.register(self.ctx, self.interrupts())))

    def resume_values(self) -> list[Any]:
        """The decided waits' values, as the executor hands them to the resumed graph."""
        ids = {f"{self.name}-{n}" for n in range(len(self.pauses))}
        answered = on_loop(self.app, self.app.aio.runtime.store.waits(self.run_id))
        found = waits.resume_map(answered, ids)
        return [found[i] for i in sorted(found)]


def claim(app: keel.App, worker_id: str = "worker-a", **node: Any) -> Node:
    """Claim the oldest claimable run as `worker_id`, as a worker does; a Node of it."""
    rt = app.aio.runtime

    async def go() -> tuple[Lease, dict[str, Any]] | None:
        await rt.open()
        return await leases.claim(rt.store, worker_id, rt.workflows.keys(), rt.lease_ttl)

    got = on_loop(app, go())
    assert got is not None, "nothing to claim"
    lease, row = got
    return Node(app, row, lease, **node)


def start(app: keel.App, job_id: str = "job-1", **node: Any) -> Node:
    """Admit a run and claim it: a Node of a run that is executing now."""
    app.submit(WORKFLOW, job_id=job_id, input={"job": job_id})
    return claim(app, **node)


def take_over(app: keel.App, clock: keel.ManualClock, worker_id: str = "worker-b") -> Node:
    """The lease of the run's owner expires and another worker claims the run (a new token)."""
    clock.advance(app.aio.runtime.lease_ttl + 1)
    return claim(app, worker_id)


def waiting(app: keel.App, *names: str, job_id: str = "job-1", **options: Any) -> Node:
    """A run whose node asked for one approval per name (default: "manager"), each with
    `options`, paused and registered as the executor does: the run is waiting."""
    node = start(app, job_id)
    for name in names or ("manager",):
        node.ask(name, **options)
    status = node.register_pauses()
    assert status == "waiting", status
    return node
