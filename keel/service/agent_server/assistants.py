"""The Agent Server's assistants: one default assistant per registered workflow.

A graph is a Keel workflow (graph id = workflow name) and its default assistant runs its latest
registered version; its id is stable (`shapes.assistant_id_of`), and the graph id is accepted
wherever an assistant id is (agent-chat-ui sends the graph id). Graphs, schemas and subgraphs
are read from the compiled graph, as LangGraph draws and describes it.

Assistants of one's own (create, update, versions beyond the first, delete) need a table Keel
does not have yet: those endpoints answer 501 `not_implemented`, naming what is missing.

(No `from __future__ import annotations`: FastAPI resolves the dependency aliases below.)
"""

import time
import warnings
from collections.abc import Callable
from typing import Annotated, Any, Literal

import pydantic
from fastapi import APIRouter, Depends, Path, Query, Response
from langgraph.channels.base import BaseChannel
from pydantic import BaseModel, Field

from keel.core.workflows import Workflow
from keel.langgraph.graphs import compile_graph
from keel.runtime.app import App
from keel.service.agent_server.authz import Gate, matches
from keel.service.agent_server.shapes import assistant_id_of, assistant_shape, contains, iso
from keel.service.agent_server.shapes import selected as select_fields
from keel.service.auth import Principal
from keel.service.errors import Refused

MAX_PAGE = 1000


def workflows_of(keel_app: App) -> list[Workflow]:
    """The latest version of each registered workflow, by name."""
    registry = keel_app.aio.runtime.workflows
    return [registry.get(name) for name in sorted({w.name for w in registry.all()})]


def resolve_assistant(keel_app: App, assistant_id: str) -> tuple[str, str]:
    """The workflow (name, latest version) an assistant id or a graph id names; 404
    `assistant_not_found` if none."""
    for workflow in workflows_of(keel_app):
        if assistant_id in (workflow.name, assistant_id_of(workflow.name)):
            return workflow.name, workflow.version
    raise Refused(404, "assistant_not_found", f"assistant {assistant_id[:200]!r} not found")


def not_implemented(what: str) -> Refused:
    return Refused(
        501,
        "not_implemented",
        f"{what} is not implemented yet: Keel serves one default assistant per registered "
        "workflow (assistants of one's own need a table Keel does not have yet)",
    )


# -- bodies ----------------------------------------------------------------------------------


class Body(BaseModel):
    model_config = {"extra": "ignore"}


class AssistantSearch(Body):
    metadata: dict[str, Any] | None = None
    graph_id: str | None = None
    name: str | None = None
    limit: int = Field(10, ge=1, le=MAX_PAGE)
    offset: int = Field(0, ge=0)
    sort_by: Literal["assistant_id", "graph_id", "name", "created_at", "updated_at"] | None = None
    sort_order: Literal["asc", "desc"] | None = None
    select: list[str] | None = None


class AssistantCount(Body):
    metadata: dict[str, Any] | None = None
    graph_id: str | None = None
    name: str | None = None


class AssistantIn(Body):
    graph_id: str | None = None
    assistant_id: str | None = None
    if_exists: Literal["raise", "do_nothing"] | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    name: str | None = None
    description: str | None = None


class VersionsIn(Body):
    metadata: dict[str, Any] | None = None
    limit: int = Field(10, ge=1, le=MAX_PAGE)
    offset: int = Field(0, ge=0)


class LatestIn(Body):
    version: int


# -- graphs, schemas -------------------------------------------------------------------------


def graph_json(graph: Any, xray: int | bool) -> dict[str, Any]:
    """The graph's nodes and edges as LangGraph draws them (`xray`: subgraphs drawn inside,
    to that depth), without the Python class path of each node's runnable."""
    drawn: dict[str, Any] = graph.get_graph(xray=xray).to_json()
    for node in drawn.get("nodes", []):
        data = node.get("data")
        if isinstance(data, dict):
            data.pop("id", None)
    return drawn


def _attempt(make: Callable[[], Any]) -> Any:
    """A schema LangGraph computes, or None where it cannot (a `typing.TypedDict` state on
    Python < 3.12, which pydantic refuses)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return make()
    except Exception:
        return None


def _channels_schema(title: str, channels: dict[str, Any]) -> dict[str, Any] | None:
    fields: dict[str, Any] = {
        name: (channel.ValueType, None)
        for name, channel in channels.items()
        if isinstance(channel, BaseChannel) and not name.startswith(("_", "branch:"))
    }
    model = pydantic.create_model(title, **fields)
    schema: dict[str, Any] = model.model_json_schema()
    return schema


def _typed_schema(graph: Any, which: str) -> dict[str, Any] | None:
    """The input or output schema from the builder's own channels, when LangGraph's JSON
    schema fails (`_attempt`)."""
    builder = getattr(graph, "builder", None)
    schema_type = getattr(builder, which, None)
    channels = getattr(builder, "schemas", {}).get(schema_type)
    if schema_type is None or not channels:
        return None
    title = str(getattr(schema_type, "__name__", which))
    return _attempt(lambda: _channels_schema(title, channels))


def graph_schemas(graph: Any, state_title: str) -> dict[str, Any]:
    """The graph's input, output, state, config and context JSON schemas (None where it has
    none, or where it cannot be described)."""
    input_schema = _attempt(graph.get_input_jsonschema) or _typed_schema(graph, "input_schema")
    output_schema = _attempt(graph.get_output_jsonschema) or _typed_schema(graph, "output_schema")
    context = _attempt(graph.get_context_jsonschema)
    return {
        "input_schema": input_schema,
        "output_schema": output_schema,
        "state_schema": _attempt(lambda: _channels_schema(state_title, dict(graph.channels))),
        "config_schema": context or {},
        "context_schema": context,
    }


def _xray(value: str) -> int | bool:
    lowered = value.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(lowered)
    except ValueError:
        raise Refused(422, "invalid_request", "xray must be true, false or a depth") from None


# -- the router ------------------------------------------------------------------------------


def assistants_router(keel_app: App, auth: Gate) -> APIRouter:
    router = APIRouter(tags=["assistants"])
    Reader = Annotated[Principal, Depends(auth.require("runs:read"))]
    Writer = Annotated[Principal, Depends(auth.require("runs:write"))]
    AssistantId = Annotated[str, Path(max_length=200, description="An assistant or graph id.")]
    started = iso(time.time()) or ""
    compiled: dict[str, Any] = {}

    def assistants() -> list[dict[str, Any]]:
        return [assistant_shape(w.name, w.version, started) for w in workflows_of(keel_app)]

    def assistant(
        assistant_id: str, principal: Principal | None = None, action: str = "read"
    ) -> dict[str, Any]:
        """The assistant, if the project's auth lets `principal` do `action` on it (one its
        filter hides is not found)."""
        name, version = resolve_assistant(keel_app, assistant_id)
        found = assistant_shape(name, version, started)
        if principal is not None:
            value = {"assistant_id": found["assistant_id"], "metadata": dict(found["metadata"])}
            filters = auth.check_sync(principal, "assistants", action, value)
            if filters and not matches(found["metadata"], filters):
                raise Refused(
                    404, "assistant_not_found", f"assistant {assistant_id[:200]!r} not found"
                )
        return found

    def graph_of(assistant_id: str, principal: Principal) -> tuple[str, Any]:
        assistant(assistant_id, principal)
        name, version = resolve_assistant(keel_app, assistant_id)
        workflow = keel_app.aio.runtime.workflows.get(name, version)
        if workflow.key not in compiled:
            compiled[workflow.key] = compile_graph(workflow)
        return name, compiled[workflow.key]

    def matching(
        principal: Principal,
        metadata: dict[str, Any] | None,
        graph_id: str | None,
        name: str | None,
        **asked: Any,
    ) -> list[dict[str, Any]]:
        value = {"graph_id": graph_id, "metadata": dict(metadata or {}), **asked}
        filters = auth.check_sync(principal, "assistants", "search", value)
        return [
            a
            for a in assistants()
            if (graph_id is None or a["graph_id"] == graph_id)
            and (name is None or name.lower() in a["name"].lower())
            and contains(a["metadata"], metadata or {})
            and matches(a["metadata"], filters)
        ]

    @router.post("/assistants/search")
    def search_assistants(
        body: AssistantSearch, response: Response, principal: Reader
    ) -> list[dict[str, Any]]:
        """Assistants by graph, name (a part of it) and metadata; `X-Pagination-Next` is the
        next page's offset."""
        asked = {"limit": body.limit, "offset": body.offset}
        found = matching(principal, body.metadata, body.graph_id, body.name, **asked)
        key = body.sort_by or "graph_id"
        found.sort(key=lambda a: (str(a[key]), a["graph_id"]), reverse=body.sort_order == "desc")
        page = found[body.offset : body.offset + body.limit]
        response.headers["X-Pagination-Total"] = str(len(found))
        if body.offset + body.limit < len(found):
            response.headers["X-Pagination-Next"] = str(body.offset + body.limit)
        return [select_fields(a, body.select) for a in page]

    @router.post("/assistants/count")
    def count_assistants(body: AssistantCount, principal: Reader) -> int:
        """How many assistants match."""
        return len(matching(principal, body.metadata, body.graph_id, body.name))

    @router.get("/assistants/{assistant_id}")
    def get_assistant(assistant_id: AssistantId, principal: Reader) -> dict[str, Any]:
        """An assistant, by its id or its graph's id."""
        return assistant(assistant_id, principal)

    @router.get("/assistants/{assistant_id}/graph")
    def get_assistant_graph(
        assistant_id: AssistantId,
        principal: Reader,
        xray: Annotated[str, Query(description="true, false, or a depth")] = "false",
    ) -> dict[str, Any]:
        """The graph's nodes and edges (`xray`: with its subgraphs drawn inside)."""
        return graph_json(graph_of(assistant_id, principal)[1], _xray(xray))

    @router.get("/assistants/{assistant_id}/schemas")
    def get_assistant_schemas(assistant_id: AssistantId, principal: Reader) -> dict[str, Any]:
        """The graph's input, output, state, config and context JSON schemas."""
        name, graph = graph_of(assistant_id, principal)
        return {"graph_id": name, **graph_schemas(graph, f"{name}_state")}

    def subgraphs(
        principal: Principal, assistant_id: str, namespace: str | None, recurse: bool
    ) -> dict[str, Any]:
        graph = graph_of(assistant_id, principal)[1]
        return {
            ns: graph_schemas(sub, sub.get_name("State"))
            for ns, sub in graph.get_subgraphs(namespace=namespace, recurse=recurse)
        }

    @router.get("/assistants/{assistant_id}/subgraphs")
    def get_assistant_subgraphs(
        assistant_id: AssistantId, principal: Reader, recurse: bool = False
    ) -> dict[str, Any]:
        """The schemas of the graph's subgraphs, by namespace (`recurse`: theirs too)."""
        return subgraphs(principal, assistant_id, None, recurse)

    @router.get("/assistants/{assistant_id}/subgraphs/{namespace}")
    def get_assistant_subgraph(
        assistant_id: AssistantId,
        namespace: Annotated[str, Path(max_length=500)],
        principal: Reader,
        recurse: bool = False,
    ) -> dict[str, Any]:
        """The schemas of the subgraph at `namespace`."""
        return subgraphs(principal, assistant_id, namespace, recurse)

    @router.post("/assistants/{assistant_id}/versions")
    def get_assistant_versions(
        assistant_id: AssistantId, body: VersionsIn, principal: Reader
    ) -> list[dict[str, Any]]:
        """A default assistant's versions: it has one."""
        found = assistant(assistant_id, principal)
        version = {k: v for k, v in found.items() if k != "updated_at"}
        versions = [version] if contains(version["metadata"], body.metadata or {}) else []
        return versions[body.offset : body.offset + body.limit]

    @router.post("/assistants/{assistant_id}/latest")
    def set_latest_version(
        assistant_id: AssistantId, body: LatestIn, principal: Writer
    ) -> dict[str, Any]:
        """Make a version the latest: a default assistant has only version 1."""
        found = assistant(assistant_id, principal, "update")
        if body.version != found["version"]:
            raise Refused(
                404,
                "version_not_found",
                f"assistant {found['assistant_id']} has no version {body.version}",
            )
        return found

    @router.post("/assistants")
    def create_assistant(body: AssistantIn, principal: Writer) -> dict[str, Any]:
        """Only a graph's default assistant exists: creating it again with `if_exists:
        do_nothing` answers it; any other assistant answers 501."""
        if body.graph_id is not None and body.if_exists == "do_nothing":
            name = resolve_assistant(keel_app, body.graph_id)[0]
            if body.assistant_id == assistant_id_of(name):
                return assistant(body.assistant_id, principal)
        raise not_implemented("creating an assistant")

    @router.patch("/assistants/{assistant_id}")
    def update_assistant(assistant_id: AssistantId, principal: Writer) -> dict[str, Any]:
        """Answers 501: a default assistant is its workflow's, as registered."""
        assistant(assistant_id, principal, "update")
        raise not_implemented("updating an assistant")

    @router.delete("/assistants/{assistant_id}")
    def delete_assistant(assistant_id: AssistantId, principal: Writer) -> None:
        """Answers 501: a default assistant lives as long as its workflow is registered."""
        assistant(assistant_id, principal, "delete")
        raise not_implemented("deleting an assistant")

    return router
