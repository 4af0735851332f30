"""Keel's rows in the LangGraph Agent Server's JSON shapes: assistants, threads, thread states
and runs, as langgraph-sdk types them (`langgraph_sdk.schema`).

Timestamps are ISO 8601 strings (Keel stores seconds since the epoch). A graph is a Keel
workflow (graph id = workflow name) and its default assistant has a stable id
(`assistant_id_of`). A thread made through the protocol before any run has no workflow yet
(`NO_GRAPH`): LangGraph threads exist before a run names their graph, while every Keel thread
belongs to one workflow; the first run admitted on it gives it that run's (the store's
`take_thread`), in the transaction that admits the run.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, get_args

from langgraph.types import StateSnapshot

from keel.core.codec import loads, storable_entries
from keel.core.lifecycle import Status, TerminationReason
from keel.core.store.base import Row
from keel.runtime.snapshot_json import state_json
from keel.service.errors import Refused

log = logging.getLogger("keel.service")

NO_GRAPH = ""
"""The workflow (and version) of a thread no run has named a graph for yet."""

EMPTY_STATE: dict[str, Any] = {
    "values": {},
    "next": [],
    "tasks": [],
    "metadata": None,
    "created_at": None,
    "checkpoint": None,
    "parent_checkpoint": None,
    "interrupts": [],
    "checkpoint_id": None,
    "parent_checkpoint_id": None,
}
"""A thread's state before its first checkpoint, as the Agent Server answers it."""

RUN_STATUS = {
    Status.QUEUED: "pending",
    Status.RUNNING: "running",
    Status.COMPLETED: "success",
    # Paused on interrupt(): LangGraph's run has returned; its thread reads `interrupted`.
    Status.WAITING: "success",
    Status.FAILED: "error",
    Status.CANCELLED: "interrupted",
}


def iso(seconds: float | None) -> str | None:
    """Seconds since the epoch as ISO 8601 in UTC (`2026-01-02T03:04:05.123456+00:00`)."""
    if seconds is None:
        return None
    return dt.datetime.fromtimestamp(float(seconds), dt.UTC).isoformat()


def assistant_id_of(graph_id: str) -> str:
    """The id of a graph's default assistant: the same on every server and every restart."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"keel://assistants/{graph_id}"))


def assistant_shape(graph_id: str, version: str, created_at: str) -> dict[str, Any]:
    """A workflow's default assistant (its latest registered version)."""
    return {
        "assistant_id": assistant_id_of(graph_id),
        "graph_id": graph_id,
        "config": {},
        "context": {},
        "metadata": {"created_by": "system", "keel_workflow_version": version},
        "name": graph_id,
        "description": None,
        "version": 1,
        "created_at": created_at,
        "updated_at": created_at,
    }


def state_shape(snapshot: StateSnapshot | None) -> dict[str, Any]:
    """A StateSnapshot as the Agent Server's thread state: `state_json`'s fields, each task's
    subgraph `checkpoint` (or its whole `state` when subgraphs were asked for), and the empty
    state before the first checkpoint."""
    if snapshot is None or snapshot.created_at is None:
        return {**EMPTY_STATE, "values": {}, "next": [], "tasks": [], "interrupts": []}
    body = state_json(snapshot)
    for shown, task in zip(body["tasks"], snapshot.tasks, strict=True):
        sub = task.state
        shown["checkpoint"] = _checkpoint(sub) if isinstance(sub, dict) else None
        shown["state"] = state_shape(sub) if isinstance(sub, StateSnapshot) else None
    return body


def _checkpoint(config: Mapping[str, Any]) -> dict[str, Any] | None:
    c = config.get("configurable") or {}
    if "thread_id" not in c:
        return None
    return {
        "thread_id": c["thread_id"],
        "checkpoint_ns": c.get("checkpoint_ns", ""),
        "checkpoint_id": c.get("checkpoint_id"),
        "checkpoint_map": c.get("checkpoint_map"),
    }


def graph_of(thread: Row) -> str | None:
    """The graph (workflow) a thread belongs to; None before a run named one."""
    workflow = str(thread["workflow"])
    return None if workflow == NO_GRAPH else workflow


def error_body(error: str | None) -> dict[str, str]:
    """A failed run's error as the protocol shows it: `{"error": type, "message": text}` (Keel
    records `Type: message`)."""
    text = error or "the run failed"
    kind, sep, message = text.partition(": ")
    if sep and kind.isidentifier():
        return {"error": kind, "message": message}
    return {"error": "Error", "message": text}


def thread_shape(
    thread: Row, state: dict[str, Any] | None = None, error: str | None = None
) -> dict[str, Any]:
    """A thread (`App.get_thread`'s row) as the Agent Server's: `state` (its `state_shape`)
    gives `values` and `interrupts`; `error` is what its failed last run raised (shown as
    `{"error": type, "message": text}`, as a failed run's).

    The metadata shows `graph_id` and `assistant_id` for every thread of a workflow, as the
    Agent Server stamps them at a thread's first run: a thread Keel's own API or `App.submit`
    made is found by them too (`search_filter`)."""
    graph = graph_of(thread)
    metadata = dict(thread["metadata"] or {})
    if graph is not None:
        metadata = {"graph_id": graph, "assistant_id": assistant_id_of(graph), **metadata}
    stamped = state is not None and state.get("created_at") is not None
    interrupts: dict[str, list[dict[str, Any]]] = {}
    if stamped and state is not None:
        interrupts = {t["id"]: t["interrupts"] for t in state["tasks"] if t["interrupts"]}
    updated = iso(thread["updated_at"])
    return {
        "thread_id": thread["thread_id"],
        "created_at": iso(thread["created_at"]),
        "updated_at": updated,
        "state_updated_at": state["created_at"] if stamped and state is not None else updated,
        "metadata": metadata,
        "status": thread["status"],
        "config": {},
        "values": state["values"] if stamped and state is not None else None,
        "interrupts": interrupts,
        "error": error_body(error) if error is not None else None,
    }


def run_status(row: Row) -> str:
    """A Keel run's status in the protocol's words (pending, running, success, error,
    timeout, interrupted)."""
    if row.get("termination_reason") == TerminationReason.TIMED_OUT:
        return "timeout"
    return RUN_STATUS[Status(row["status"])]


def run_shape(row: Row) -> dict[str, Any]:
    """A Keel run on a thread as the Agent Server's run: its metadata is the `metadata` of the
    config it was submitted with, its `kwargs` what it was started with."""
    config = loads(row["config"]) if row.get("config") else {}
    config = config if isinstance(config, dict) else {}
    command = loads(row["command"]) if row.get("command") else None
    context = config.pop("context", None)
    metadata = config.get("metadata") or {}
    return {
        "run_id": row["run_id"],
        "thread_id": row.get("thread_id") or row["run_id"],
        "assistant_id": assistant_id_of(row["workflow"]),
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
        "status": run_status(row),
        "metadata": metadata,
        "kwargs": {
            "input": loads(row["input"]) if row.get("input") else None,
            "command": command,
            "config": config,
            "context": context,
            "checkpoint_id": row.get("checkpoint_id"),
        },
        "multitask_strategy": row.get("multitask_strategy") or "enqueue",
    }


def selected(body: dict[str, Any], select: list[str] | None) -> dict[str, Any]:
    """Only the `select`ed fields of a body (all of them without a selection). A field named
    `values.<key>` (as the SDKs document for a state) selects that key of `values` alone.
    A field the body does not have is refused (422), as langgraph-api refuses it in a search:
    answering `{}` for a misspelled field reads as an empty state."""
    if not select:
        return body
    refuse_unknown(select, body)
    whole = {k: v for k, v in body.items() if k in select}
    for field in select:
        name, dot, key = field.partition(".")
        part = body.get(name)
        if dot and name not in select and isinstance(part, dict):
            chosen = whole.setdefault(name, {})
            if key in part:
                chosen[key] = part[key]
    return whole


def _sdk_selectable() -> frozenset[str]:
    from langgraph_sdk import schema  # langgraph's own dependency

    literals = ("ThreadSelectField", "RunSelectField", "CronSelectField", "AssistantSelectField")
    return frozenset(name for x in literals for name in get_args(getattr(schema, x, None)))


SDK_SELECTABLE = _sdk_selectable()
"""Every field langgraph-sdk's `select` literals offer: a client may send any of them, so none
is refused, and one Keel does not show (a thread's `context`, a run's `cancel_reason`) is left
out of the answer."""


def refuse_unknown(select: list[str] | None, fields: Iterable[str]) -> None:
    """422 for a `select`ed field (or the field of a `values.<key>`) neither among `fields` nor
    offered by the SDK (`SDK_SELECTABLE`). A list endpoint checks its shape's fields before any
    row: else an empty page answers `[]` to what a page with rows refuses."""
    known = list(fields)
    unknown = [
        f
        for f in select or ()
        if f.partition(".")[0] not in known and f.partition(".")[0] not in SDK_SELECTABLE
    ]
    if unknown:
        raise Refused(
            422,
            "invalid_request",
            f"select: no field {unknown[0][:80]!r}; one of {', '.join(known)}",
        )


def fields_of(shape: Callable[[Row], dict[str, Any]], blank: Row) -> tuple[str, ...]:
    """The fields a shape answers, read off the shape itself (its keys are fixed) applied to a
    blank row, so a list endpoint's known fields cannot drift from what its rows show."""
    return tuple(shape(blank))


STATE_FIELDS = tuple(state_shape(None))
THREAD_FIELDS = fields_of(
    thread_shape,
    {
        "thread_id": "",
        "workflow": NO_GRAPH,
        "metadata": None,
        "status": "idle",
        "created_at": 0,
        "updated_at": 0,
    },
)
ASSISTANT_FIELDS = tuple(assistant_shape(NO_GRAPH, "", ""))


def run_metadata_of(thread: Row) -> dict[str, Any]:
    """The thread's metadata as its runs' config carries it (as the Agent Server copies it):
    without an entry no database may keep any more (a NUL, kept on SQLite before NULs were
    refused), which would make every run on the thread a 422 on a `config` its client never
    sent. The thread keeps it, shown as it is, until a PATCH replaces it."""
    copied, refused = storable_entries(thread_shape(thread)["metadata"], "the thread's metadata")
    for reason in refused:
        log.warning(
            "thread %s: %s; left out of its runs' config metadata (PATCH /threads/%s to fix it)",
            thread["thread_id"],
            reason,
            thread["thread_id"],
        )
    return copied
