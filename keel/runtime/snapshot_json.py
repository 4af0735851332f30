"""A thread's state as JSON: LangGraph's `StateSnapshot` in the LangGraph Agent Server's shape
(the HTTP API's, the CLI's, the console's), and the plain-JSON form of the values inside it."""

from __future__ import annotations

from typing import Any

from langgraph.types import StateSnapshot

from keel.core.codec import json_default
from keel.core.wait_model import keel_wait


def state_json(snapshot: StateSnapshot) -> dict[str, Any]:
    """A StateSnapshot as JSON (the LangGraph Agent Server's thread state shape)."""

    def checkpoint(config: Any) -> dict[str, Any] | None:
        if not config:
            return None
        c = config.get("configurable", {})
        return {
            "thread_id": c.get("thread_id"),
            "checkpoint_ns": c.get("checkpoint_ns", ""),
            "checkpoint_id": c.get("checkpoint_id"),
        }

    tasks = [
        {
            "id": t.id,
            "name": t.name,
            "path": list(t.path),
            "error": t.error if t.error is None or isinstance(t.error, str) else repr(t.error),
            "interrupts": [{"value": shown(i.value), "id": i.id} for i in t.interrupts],
            "result": t.result,
        }
        for t in snapshot.tasks
    ]
    current = checkpoint(snapshot.config)
    parent = checkpoint(snapshot.parent_config)
    return jsonable(
        {
            "values": snapshot.values,
            "next": list(snapshot.next),
            "tasks": tasks,
            "interrupts": [{"value": shown(i.value), "id": i.id} for i in snapshot.interrupts],
            "metadata": _stamped(snapshot.metadata, current),
            "created_at": snapshot.created_at,
            "checkpoint": current,
            "checkpoint_id": current and current["checkpoint_id"],
            "parent_checkpoint": parent,
            "parent_checkpoint_id": parent and parent["checkpoint_id"],
        }
    )


def _stamped(metadata: Any, checkpoint: dict[str, Any] | None) -> Any:
    """A checkpoint's metadata with `run_id` and `thread_id`, as the Agent Server writes them
    into every checkpoint: the run that wrote it (`keel_run_id`, for checkpoints written before
    runs stamped `run_id` too) and the thread (LangGraph keeps `thread_id` out of checkpoint
    metadata, so it is the checkpoint's own)."""
    if not isinstance(metadata, dict):
        return metadata
    stamped = dict(metadata)
    if "run_id" not in stamped and metadata.get("keel_run_id"):
        stamped["run_id"] = metadata["keel_run_id"]
    if checkpoint is not None and checkpoint.get("thread_id"):
        stamped.setdefault("thread_id", checkpoint["thread_id"])
    return stamped


def shown(value: Any) -> Any:
    """An interrupt's value as its node gave it: `keel.interrupt()` and `keel.approval()`
    wrap it in their wait's description (deadline, escalation), which clients do not show."""
    spec = keel_wait(value)
    return value if spec is None else spec.get("payload")


def jsonable(value: Any) -> Any:
    """`value` with LangChain messages and other models as plain JSON values."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    try:
        return jsonable(json_default(value))
    except TypeError:
        return repr(value)
