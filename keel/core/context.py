"""The run a node is executing in: set by the executor, read by effects, approvals, artifacts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from keel.core.errors import NotInRun
from keel.core.ids import CallOrder, Identity, StepRef
from keel.core.services import Services
from keel.core.store.base import Tx
from keel.core.store.store import Store
from keel.core.tracing import NO_TRACER, Tracer

StagedWrite = Callable[[Store, Tx], Awaitable[None]]
"""A row a node asks to commit in the same fenced transaction as its task's writes."""


class Replaying(Protocol):
    """What serves a replayed run's effects from its recorded ledger (keel.runtime.replay)."""

    def effect(
        self,
        name: str,
        key: str,
        legacy_key: str,
        where: StepRef,
        index: int,
        identity: Identity,
        tool: str | None = None,
    ) -> Any:
        """The recorded result of this call; raises to stop the replay where it diverged."""
        ...


@dataclass
class RunContext:
    run_id: str
    job_id: str
    workflow: str
    token: int
    worker_id: str
    services: Services
    locate: Callable[[], StepRef]
    """Where the calling node is (run, node, step, task path): the parts of every key."""
    pause: Callable[[Any], Any]
    """Pause the graph for a wait (LangGraph's interrupt); returns the resume value."""
    last_heartbeat: Any = None
    """Details the previous attempt stored with keel.heartbeat(), if any."""
    calls: CallOrder = field(default_factory=CallOrder)
    """How many times each task of this execution has called each effect (the call order)."""
    pending_heartbeat: asyncio.Task[Any] | None = None
    tracer: Tracer = NO_TRACER
    """Draws the spans the core marks (keel.core.tracing); a no-op unless tracing is on."""
    replay: Replaying | None = None
    """Set when the run is replayed in a throwaway copy: effects are served from the ledger,
    never performed, and nothing is written to the run's own rows (no lease is held)."""
    staged: dict[str, list[StagedWrite]] = field(default_factory=dict)
    """What each task of this execution staged (outbox intents), by LangGraph task id."""
    thread_id: str = ""
    """The LangGraph thread the run executes on (its checkpoints' `thread_id`); empty: the run
    is a thread of its own, named by its run id."""
    effect_keys: int = 1
    """How the run's effect calls are numbered (`keel_runs.effect_keys`, keel.core.effects.keys):
    2 numbers calls inside a tool call within that tool call."""
    subgraph_ordinals: dict[str, int] = field(default_factory=dict)
    """A retried task's subgraph invocations in this execution, by the namespace LangGraph
    gave each: its number within its attempt, what its effects' keys use
    (keel.langgraph.retries)."""
    settle: Callable[[], Awaitable[None]] | None = None
    """Commit the checkpoints the execution still holds back (a first execution's input and
    START step wait for its first step's): called before an effect whose key names a task
    by the id those checkpoints gave it."""

    @property
    def thread(self) -> str:
        return self.thread_id or self.run_id

    def stage(self, task_id: str, write: StagedWrite) -> None:
        self.staged.setdefault(task_id, []).append(write)

    def take_staged(self, task_id: str) -> list[StagedWrite]:
        return self.staged.pop(task_id, [])


_current: ContextVar[RunContext | None] = ContextVar("keel_run", default=None)


def current(what: str = "this") -> RunContext:
    ctx = _current.get()
    if ctx is None:
        raise NotInRun(
            f"{what} must be called inside a node of a run that Keel executes "
            "(submit the run and let a Keel worker execute it)"
        )
    return ctx


def enter(ctx: RunContext) -> object:
    return _current.set(ctx)


def leave(token: object) -> None:
    _current.reset(token)  # type: ignore[arg-type]
