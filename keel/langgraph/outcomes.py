"""What an invocation of a run's graph left: its interrupts, its values, where it failed.

Read by the executor after `graph.ainvoke` returns or raises, from the returned output, the
notes LangGraph adds to a task's exception and the run's checkpoint.
"""

from __future__ import annotations

import json
import re
from typing import Any

from keel.core.codec import dumps

MAX_OUTPUT_BYTES = 1_000_000
"""A run's output larger than this, as JSON, is stored as `{"truncated": true}`."""

TASK_NOTE = re.compile(r"During task with name '(?P<name>.*)' and id '(?P<id>[^']*)'")


async def failed_task(graph: Any, config: dict[str, Any], exc: BaseException) -> dict[str, Any]:
    """Where in the graph `exc` was raised: the node (and, in a subgraph, the node inside it),
    the task's path and the step, from the notes LangGraph adds to a task's exception and the
    run's last checkpoint (whose next tasks include the failed one). What cannot be told is
    left out."""
    tasks = [m for n in getattr(exc, "__notes__", ()) if (m := TASK_NOTE.fullmatch(str(n)))]
    if not tasks:
        return {}
    outer, inner = tasks[-1], tasks[0]  # notes are added as the exception goes up
    where: dict[str, Any] = {"node": outer["name"]}
    if inner is not outer:
        where["inner_node"] = inner["name"]
    try:
        state = await graph.aget_state(config)
    except Exception:  # what the notes said is already worth keeping
        return where
    for task in state.tasks:
        if task.id == outer["id"]:
            where["task_path"] = "/".join(map(str, task.path))
            where["step"] = int(state.metadata.get("step", -1)) + 1
    return where


# LangGraph's interrupt channel (private there since 1.0; resuming after a decision breaks in
# tests/store if it is renamed).
INTERRUPT = "__interrupt__"


def pending_interrupts(writes: Any) -> set[str]:
    """The ids of the interrupts a checkpoint's tasks raised (LangGraph saves them as pending
    writes to its interrupt channel, a subgraph's with its parent task's): what `aget_state`
    would list, without building the state a second time."""
    return {
        str(item.id)
        for _task, channel, value in writes
        if channel == INTERRUPT
        for item in (value if isinstance(value, list | tuple) else (value,))
        if getattr(item, "id", None) is not None
    }


async def interrupts_and_values(graph: Any, config: dict[str, Any], output: Any) -> tuple[Any, Any]:
    """The pending interrupts and final state values of the invocation that just returned.

    When the graph's output is its whole state (no separate output schema) the returned dict
    already carries both, `__interrupt__` included: no second read of the checkpoint.
    """
    builder = getattr(graph, "builder", None)
    whole_state = builder is not None and builder.output_schema is builder.state_schema
    if whole_state and isinstance(output, dict):
        values = dict(output)
        return tuple(values.pop("__interrupt__", ())), values
    state = await graph.aget_state(config)
    return state.interrupts, state.values


def encoded_output(values: Any) -> str | None:
    """A run's output as stored: its final values as JSON, a marker past MAX_OUTPUT_BYTES, or
    None when they do not encode."""
    try:
        text = dumps(values)
    except (TypeError, ValueError):
        return None
    return text if len(text) <= MAX_OUTPUT_BYTES else json.dumps({"truncated": True})
