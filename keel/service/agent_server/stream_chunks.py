"""The stream modes a run's worker captured live (keel.langgraph.chunks), as protocol events.

A chunk row is placed after the events of the checkpoint it is anchored at (the run's last
committed one when the chunk was produced): `Position(anchor, n, chunk id)` with `n` the
number of that checkpoint's own events, or `RESUMED` for a chunk produced resuming a pause
there (after the pause's events). Its event is named as LangGraph's server names it: the mode,
`|`-joined with the subgraph namespace when it came from a subgraph (`updates|sub:<task id>`).
A `messages` chunk is sent as `messages` (`[message, metadata]`) to a `messages-tuple` stream,
and as `messages/metadata` then `messages/partial` (the message so far) to a `messages` one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from keel.core.store.base import Row
from keel.service.agent_server.positions import RESUMED, Event, Position

SUPERSEDED = "keel/superseded"
"""The event a stream sends before the events of an execution that re-runs a step whose
chunks it already sent (the step never committed)."""


def chunk_event(row: Row, regular: Mapping[str, int]) -> Event:
    """The event of a chunk row; `regular`: how many events each checkpoint's block has."""
    anchor = str(row["anchor"])
    n = RESUMED if int(row["resumed"]) else regular.get(anchor, 0)
    mode = str(row["mode"])
    ns = str(row["ns"] or "")
    position = Position(anchor, n, int(row["chunk_id"]))
    name = f"{mode}|{ns}" if ns else mode
    data = json.loads(row["data"])
    if mode == "messages":
        return Event(name, data, position, mode="messages-tuple")
    if mode == "debug":
        data = debug_checkpoint(data)
    return Event(name, data, position, mode=mode)


def debug_checkpoint(data: Any) -> Any:
    """A `debug` checkpoint event with the `checkpoint` and `parent_checkpoint` references
    LangGraph's server adds to its payload (the ids of its `config` and `parent_config`)."""
    payload = data.get("payload") if isinstance(data, dict) else None
    if not isinstance(payload, dict) or data.get("type") != "checkpoint":
        return data
    for key, config in (("checkpoint", "config"), ("parent_checkpoint", "parent_config")):
        configurable = (payload.get(config) or {}).get("configurable") or {}
        payload.setdefault(
            key,
            {k: configurable.get(k) for k in ("checkpoint_id", "thread_id", "checkpoint_ns")}
            if configurable.get("checkpoint_id")
            else None,
        )
    return data


def superseded(position: Position, token: int, count: int) -> Event:
    """The marker that the chunks an execution under `token` sent were superseded."""
    body = {"lease_token": token, "superseded_chunks": count}
    return Event(SUPERSEDED, body, position, name="superseded")


class Messages:
    """A `messages` stream's view of `messages-tuple` events: the metadata of each message
    once, then the message as streamed so far."""

    def __init__(self) -> None:
        self.so_far: dict[str, Any] = {}

    def of(self, event: Event) -> list[Event]:
        message, metadata = [*list(event.data), None, None][:2]
        if not isinstance(message, dict):
            return []
        ns = event.event.partition("|")[2]
        suffix = f"|{ns}" if ns else ""
        key = str(message.get("id") or "")
        out: list[Event] = []
        if key not in self.so_far:
            body = {key: {"metadata": metadata or {}}}
            out.append(Event(f"messages/metadata{suffix}", body, event.position, "metadata"))
            self.so_far[key] = message
        else:
            self.so_far[key] = _joined(self.so_far[key], message)
        out.append(Event(f"messages/partial{suffix}", [_whole(self.so_far[key])], event.position))
        return out


def _whole(message: dict[str, Any]) -> dict[str, Any]:
    """The message so far as a message, not a chunk (`type` `ai`, no chunk fields), as
    LangGraph's server sends `messages/partial`."""
    if message.get("type") != "AIMessageChunk":
        return message
    try:
        from langchain_core.messages import AIMessageChunk, message_chunk_to_message

        fields = {k: v for k, v in message.items() if k != "type"}
        return dict(message_chunk_to_message(AIMessageChunk(**fields)).model_dump())
    except Exception:  # a chunk LangChain cannot rebuild: as it came
        return message


def _joined(left: dict[str, Any], right: dict[str, Any]) -> dict[str, Any]:
    """Two chunks of one message as one (LangChain's own `+` of message chunks)."""
    try:
        from langchain_core.messages import AIMessageChunk

        fields = {k: v for k, v in left.items() if k != "type"}
        more = {k: v for k, v in right.items() if k != "type"}
        total = AIMessageChunk(**fields) + AIMessageChunk(**more)
        return dict(total.model_dump())
    except Exception:  # not an AI message chunk: its text, at least
        joined = dict(left)
        if isinstance(left.get("content"), str) and isinstance(right.get("content"), str):
            joined["content"] = left["content"] + right["content"]
        return joined
