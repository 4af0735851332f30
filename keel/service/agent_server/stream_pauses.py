"""Which pauses a run's stream tells, and where (keel.service.agent_server.stream): a breakpoint
the run went on from, and a pause again at a checkpoint the run paused at before."""

from __future__ import annotations

from langgraph.types import Interrupt, StateSnapshot

from keel.core.store.store import Store
from keel.core.waits import wait_id_for
from keel.langgraph import static_interrupts

NS_END = ":"  # LangGraph's, between a task's name and its id in its checkpoint namespace
AGAIN_STRIDE = 1000
"""Places per execution for a pause again at a checkpoint (`Position.again`)."""


async def paused_statically(store: Store, run_id: str, checkpoint_id: str) -> bool:
    """Whether the run paused at that checkpoint on a breakpoint (`interrupt_before` /
    `_after`: its wait is named after the checkpoint, keel.langgraph.static_interrupts)."""
    wait_id = wait_id_for(run_id, static_interrupts.interrupt_id(checkpoint_id))
    return any(w["wait_id"] == wait_id for w in await store.waits(run_id))


async def again(store: Store, run_id: str, state: StateSnapshot) -> tuple[int, int] | None:
    """For a pause again at a checkpoint (a task whose interrupt is not the first it raised
    there: LangGraph numbers a task's interrupts by the answers it already has), the chunk it
    comes after and the lease token of the execution that paused; None for a first pause. A
    subgraph's interrupts are left as first pauses."""
    repeated = [
        i.id
        for task in state.tasks
        if task.state is None
        for i in task.interrupts
        if i.id != Interrupt.from_ns(None, f"{task.name}{NS_END}{task.id}").id
    ]
    if not repeated:
        return None
    wanted = {wait_id_for(run_id, interrupt_id) for interrupt_id in repeated}
    tokens = [
        int(e["lease_token"])
        for e in await store.events(run_id)
        if e["kind"] == "wait.registered"
        and isinstance(e["data"], dict)
        and e["data"].get("wait_id") in wanted
        and e["lease_token"] is not None
    ]
    if not tokens:
        return None
    token = max(tokens)
    return await store.chunk_ceiling(run_id, token), token
