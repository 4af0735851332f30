"""What a step's timeline event says: the node that ran (a `Send`'s target node and index,
not only the push task's path), the channels it wrote, and its subgraph's namespace."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint

TASKS, PUSH = "__pregel_tasks", "__pregel_push"  # LangGraph's channel of Sends, its push tasks
MAX_REMEMBERED = 256


class StepTimeline:
    """The saver's memory of pending `Send`s, to name a push task's node in its event."""

    sends: dict[str, list[str]]

    def remember_sends(self, checkpoint: Checkpoint) -> None:
        pending = checkpoint.get("channel_values", {}).get(TASKS) or []
        nodes = [str(getattr(send, "node", "")) for send in pending]
        if nodes:
            self.sends[checkpoint["id"]] = nodes
            while len(self.sends) > MAX_REMEMBERED:
                del self.sends[next(iter(self.sends))]

    def step_event(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_path: str
    ) -> dict[str, Any]:
        data = step_event(config, writes, task_path)
        parts = [p.strip() for p in task_path.lstrip("~").split(",")]
        if parts[0] == PUSH and len(parts) > 1 and parts[1].isdigit():
            index = int(parts[1])
            nodes = self.sends.get(checkpoint_id(config), [])
            if index < len(nodes):
                data.update(node=nodes[index], index=index)
        return data


def checkpoint_id(config: RunnableConfig) -> str:
    return str(config["configurable"].get("checkpoint_id"))


def step_event(config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_path: str) -> dict:
    parts = [p.strip() for p in task_path.lstrip("~").split(",")]
    node = parts[1] if len(parts) > 1 and parts[0] == "__pregel_pull" else task_path
    data: dict[str, Any] = {
        "node": node,
        "writes": sorted({c for c, _ in writes if not c.startswith("branch:")}),
    }
    if ns := config["configurable"].get("checkpoint_ns"):
        data["namespace"] = ns.split(":", 1)[0]
    return data
