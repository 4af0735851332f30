"""Static interrupts: a run asked to pause before or after nodes (LangGraph's `interrupt_before`
and `interrupt_after` of an invocation), as the Agent Server's run create asks for them, or a
compiled graph that carries its own (`compile(interrupt_before=...)`).

The options travel with the run's submitted config, under `KWARGS`, so every execution of the
run (a restart, a resume) invokes the graph with them. On such a pause LangGraph's `ainvoke`
returns without `__interrupt__`: the state has next tasks and no interrupts. The executor then
registers one wait of kind interrupt with no payload (`paused`), so the run reads waiting and
its thread interrupted, as an `interrupt()` in a node would leave them. Answering that wait
(any value) lets the run go on from its checkpoint; LangGraph does not pause at the same
boundary twice.
"""

from __future__ import annotations

from typing import Any

from langgraph.types import Interrupt

from keel.langgraph.chunks import KWARGS

OPTIONS = ("interrupt_before", "interrupt_after")
STATIC_WAITS = frozenset(OPTIONS)
"""The names of the waits a static pause registers."""


def invoke_options(submitted: dict[str, Any]) -> dict[str, Any]:
    """The `interrupt_before`/`interrupt_after` a run was submitted with, as `ainvoke` takes
    them (none when it asked for neither)."""
    kept = submitted.get(KWARGS)
    if not isinstance(kept, dict):
        return {}
    return {name: kept[name] for name in OPTIONS if kept.get(name)}


def compiled_with(graph: Any) -> dict[str, Any]:
    """The static interrupts a compiled graph carries (`compile(interrupt_before=...)`, as a
    `langgraph.json` project's graph may): LangGraph pauses there whenever the invocation asks
    for none of its own, so the run must register the pause as it does the run's."""
    found: dict[str, Any] = {}
    for name in OPTIONS:
        nodes = getattr(graph, f"{name}_nodes", None)
        if nodes:
            found[name] = nodes if nodes == "*" else list(nodes)
    return found


async def paused(graph: Any, config: dict[str, Any], options: dict[str, Any]) -> list[Interrupt]:
    """The wait to register when the invocation, run with static interrupt `options`, stopped
    at one of them: its latest checkpoint has next tasks and no interrupts. Its id is that
    checkpoint's, so an execution that registers it again after a crash finds the same wait."""
    if not options:
        return []
    configurable = dict(config.get("configurable") or {})
    configurable.pop("checkpoint_id", None)  # the latest checkpoint, not a fork's start
    state = await graph.aget_state({**config, "configurable": configurable})
    if not state.next or state.interrupts:
        return []
    before = options.get("interrupt_before")
    name = (
        "interrupt_before"
        if before == "*" or (isinstance(before, list) and set(state.next) & set(before))
        else "interrupt_after"
    )
    checkpoint = (state.config.get("configurable") or {}).get("checkpoint_id", "")
    spec = {"kind": "interrupt", "name": name, "payload": None}
    return [Interrupt(value={"keel_wait": spec}, id=interrupt_id(checkpoint))]


def interrupt_id(checkpoint_id: str) -> str:
    """The id of the static pause at that checkpoint (its wait's, `waits.wait_id_for`)."""
    return f"static-{checkpoint_id}"
