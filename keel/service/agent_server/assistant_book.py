"""The Agent Server's assistants of one's own, kept in Keel's database (migration 0028), beside
the default assistant of each registered graph (assistants.py).

An assistant names a graph and holds the config, context and metadata its runs start with (a
run's own are merged over them, `Resolved.run_config`). Every update adds a version; any past
version can be put in use again. A default assistant is stored only once it is updated: its
first version is then the default's fields, and the stored row answers from there on. Default
assistants cannot be deleted (LangGraph deletes them until the server restarts and makes them
again; in Keel a graph's default assistant lives as long as its workflow is registered).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from keel.core.store.base import Row
from keel.core.store.store import Store
from keel.core.workflows import Workflow
from keel.runtime.app import App
from keel.service.agent_server.shapes import assistant_id_of, iso
from keel.service.errors import Refused

T = TypeVar("T")


def workflows_of(keel_app: App) -> list[Workflow]:
    """The latest version of each registered workflow, by name."""
    registry = keel_app.aio.runtime.workflows
    return [registry.get(name) for name in sorted({w.name for w in registry.all()})]


def default_of(keel_app: App, assistant_id: str) -> Workflow | None:
    """The workflow whose default assistant `assistant_id` names (its id or the graph id)."""
    for workflow in workflows_of(keel_app):
        if assistant_id in (workflow.name, assistant_id_of(workflow.name)):
            return workflow
    return None


def not_found(assistant_id: str) -> Refused:
    return Refused(404, "assistant_not_found", f"assistant {assistant_id[:200]!r} not found")


def on_store(keel_app: App, work: Callable[[Store], Coroutine[Any, Any, T]]) -> T:
    """`work` on Keel's store, from a route FastAPI runs in a worker thread."""

    async def go() -> T:
        await keel_app.aio.open()
        return await work(keel_app.aio.runtime.store)

    return keel_app.aio.runtime.portal.call(go())


def _json(text: Any) -> Any:
    found = json.loads(text) if text else None
    return found if isinstance(found, dict) else {}


def stored_shape(row: Row) -> dict[str, Any]:
    """A stored assistant as the Agent Server answers it."""
    return {
        "assistant_id": row["assistant_id"],
        "graph_id": row["graph_id"],
        "config": _json(row["config"]),
        "context": _json(row["context"]),
        "metadata": _json(row["metadata"]),
        "name": row["name"],
        "description": row["description"],
        "version": int(row["version"]),
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
    }


def version_shape(row: Row) -> dict[str, Any]:
    """One version of a stored assistant (an assistant's fields without `updated_at`)."""
    return {
        "assistant_id": row["assistant_id"],
        "version": int(row["version"]),
        "graph_id": row["graph_id"],
        "config": _json(row["config"]),
        "context": _json(row["context"]),
        "metadata": _json(row["metadata"]),
        "created_at": iso(row["created_at"]),
        "name": row["name"],
        "description": row["description"],
    }


def with_context(config: dict[str, Any] | None, context: dict[str, Any] | None) -> dict[str, Any]:
    """An assistant's config as LangGraph keeps it: its context is also its `configurable`
    (both at once are refused, 400 `bad_request`, as LangGraph refuses them)."""
    config = dict(config or {})
    if context is not None and config.get("configurable"):
        raise Refused(
            400,
            "bad_request",
            "cannot specify both configurable and context: prefer setting context alone",
        )
    if context is not None:
        config["configurable"] = dict(context)
    return config


def dumped(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


@dataclass(frozen=True)
class Resolved:
    """What a run started with an assistant runs: the workflow (name, version) and the
    assistant's id, config, context and metadata."""

    graph: str
    version: str
    assistant_id: str
    config: dict[str, Any] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    def run_config(self, given: dict[str, Any]) -> dict[str, Any]:
        """The run's config `given` merged over the assistant's (`configurable` and
        `metadata` key by key)."""
        out = {**self.config, **given}
        for key in ("configurable", "metadata"):
            if key in self.config or key in given:
                out[key] = {**(self.config.get(key) or {}), **(given.get(key) or {})}
        return out

    def run_context(self, given: Any) -> Any:
        """The run's context merged over the assistant's (a non-object one replaces it)."""
        if given is None:
            return dict(self.context) or None
        if isinstance(given, dict):
            return {**self.context, **given}
        return given


def stored(keel_app: App, assistant_id: str) -> Row | None:
    return on_store(keel_app, lambda s: s.get_assistant(assistant_id))


def resolve_for_run(keel_app: App, assistant_id: str) -> Resolved:
    """The assistant a run names (its id, or a graph id for the graph's default assistant);
    404 `assistant_not_found` if none, or if its graph is no longer registered."""
    workflow = default_of(keel_app, assistant_id)
    found_id = assistant_id_of(workflow.name) if workflow is not None else assistant_id
    row = stored(keel_app, found_id)
    if row is None:
        if workflow is None:
            raise not_found(assistant_id)
        return Resolved(workflow.name, workflow.version, found_id)
    graph = default_of(keel_app, str(row["graph_id"]))
    if graph is None:
        raise Refused(
            404, "graph_not_found", f"assistant {found_id}: graph {row['graph_id']!r} not found"
        )
    shape = stored_shape(row)
    return Resolved(
        graph.name,
        graph.version,
        found_id,
        shape["config"],
        shape["context"],
        shape["metadata"],
    )
