"""The Agent Server's assistants: the default assistant of each registered workflow, and
assistants of one's own with their versions (assistant_book.py, in Keel's database).

A graph is a Keel workflow (graph id = workflow name) and its default assistant runs its latest
registered version; its id is stable (`shapes.assistant_id_of`), and the graph id is accepted
wherever an assistant id is (agent-chat-ui sends the graph id). Graphs, schemas and subgraphs
are read from the compiled graph, as LangGraph draws and describes it.

(No `from __future__ import annotations`: FastAPI resolves the dependency aliases below.)
"""

import json
import time
import warnings
from collections.abc import Callable
from typing import Annotated, Any, Literal
from uuid import uuid4

import pydantic
from fastapi import APIRouter, Depends, Path, Query, Response
from langgraph.channels.base import BaseChannel
from pydantic import BaseModel, Field

from keel.core.codec import contains
from keel.langgraph.graphs import compile_graph
from keel.runtime.app import App
from keel.service.agent_server.assistant_book import (
    default_of,
    dumped,
    not_found,
    on_store,
    stored,
    stored_shape,
    version_shape,
    with_context,
    workflows_of,
)
from keel.service.agent_server.authz import Gate, matches
from keel.service.agent_server.run_bodies import RunConfig
from keel.service.agent_server.shapes import (
    ASSISTANT_FIELDS,
    assistant_id_of,
    assistant_shape,
    iso,
    refuse_unknown,
)
from keel.service.agent_server.shapes import selected as select_fields
from keel.service.auth import Principal
from keel.service.errors import Refused

MAX_PAGE = 1000


def resolve_assistant(keel_app: App, assistant_id: str) -> tuple[str, str]:
    """The workflow (name, latest version) a default assistant's id or a graph id names; 404
    `assistant_not_found` if none."""
    workflow = default_of(keel_app, assistant_id)
    if workflow is None:
        raise not_found(assistant_id)
    return workflow.name, workflow.version


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
    # A path segment it can be read, changed and deleted by again (langgraph-api takes UUIDs).
    assistant_id: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
    if_exists: Literal["raise", "do_nothing"] | None = None
    config: RunConfig | None = None
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

    def default_shape(assistant_id: str) -> dict[str, Any] | None:
        workflow = default_of(keel_app, assistant_id)
        if workflow is None:
            return None
        return assistant_shape(workflow.name, workflow.version, started)

    def current(assistant_id: str) -> tuple[dict[str, Any], bool]:
        """The assistant as it is now (a default one: as stored once it was updated), and
        whether it is stored."""
        default = default_shape(assistant_id)
        row = stored(keel_app, default["assistant_id"] if default else assistant_id)
        if row is not None:
            return stored_shape(row), True
        if default is None:
            raise not_found(assistant_id)
        return default, False

    def allowed(found: dict[str, Any], principal: Principal, action: str, **asked: Any) -> None:
        """404 unless the project's auth lets `principal` do `action` on the assistant (one its
        filter hides is not found)."""
        value = {"assistant_id": found["assistant_id"], "metadata": dict(found["metadata"])}
        filters = auth.check_sync(principal, "assistants", action, {**value, **asked})
        if filters and not matches(found["metadata"], filters):
            raise not_found(str(found["assistant_id"]))

    def assistant(
        assistant_id: str, principal: Principal | None = None, action: str = "read"
    ) -> dict[str, Any]:
        found = current(assistant_id)[0]
        if principal is not None:
            allowed(found, principal, action)
        return found

    def graph_of(assistant_id: str, principal: Principal) -> tuple[str, Any]:
        name = assistant(assistant_id, principal)["graph_id"]
        workflow = default_of(keel_app, name)
        if workflow is None:
            raise Refused(404, "graph_not_found", f"graph {name!r} is not registered")
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
        rows = on_store(
            keel_app, lambda s: s.search_assistants(graph_id=graph_id, metadata=metadata or {})
        )
        own = [stored_shape(r) for r in rows]
        ids = {a["assistant_id"] for a in own}
        defaults = [
            assistant_shape(w.name, w.version, started)
            for w in workflows_of(keel_app)
            if assistant_id_of(w.name) not in ids
        ]
        return [
            a
            for a in own + defaults
            if (graph_id is None or a["graph_id"] == graph_id)
            and (name is None or name.lower() in str(a["name"]).lower())
            and contains(a["metadata"], metadata or {})
            and matches(a["metadata"], filters)
        ]

    @router.post("/assistants/search")
    def search_assistants(
        body: AssistantSearch, response: Response, principal: Reader
    ) -> list[dict[str, Any]]:
        """Assistants by graph, name (a part of it) and metadata; `X-Pagination-Next` is the
        next page's offset."""
        refuse_unknown(body.select, ASSISTANT_FIELDS)
        asked = {"limit": body.limit, "offset": body.offset}
        found = matching(principal, body.metadata, body.graph_id, body.name, **asked)
        # Newest first by default, as LangGraph lists them; then by graph (stable sorts).
        found.sort(key=lambda a: (a["graph_id"], a["assistant_id"]))
        key = body.sort_by or "created_at"
        found.sort(key=lambda a: str(a[key]), reverse=body.sort_order != "asc")
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
        """An assistant, by its id (or, for a graph's default assistant, the graph's id)."""
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
        """The assistant's versions, newest first (a default assistant never updated has one)."""
        found, is_stored = current(assistant_id)
        allowed(found, principal, "read")
        if not is_stored:
            version = {k: v for k, v in found.items() if k != "updated_at"}
            versions = [version] if contains(version["metadata"], body.metadata or {}) else []
            return versions[body.offset : body.offset + body.limit]
        rows = on_store(
            keel_app,
            lambda s: s.assistant_versions(
                found["assistant_id"],
                metadata=body.metadata or {},
                limit=body.limit,
                offset=body.offset,
            ),
        )
        return [version_shape(r) for r in rows]

    @router.post("/assistants/{assistant_id}/latest")
    def set_latest_version(
        assistant_id: AssistantId, body: LatestIn, principal: Writer
    ) -> dict[str, Any]:
        """Put one of the assistant's versions in use (404 `version_not_found` if it has no
        such version)."""
        found, is_stored = current(assistant_id)
        allowed(found, principal, "update", version=body.version)
        row = None
        if is_stored:
            aid = str(found["assistant_id"])
            row = on_store(keel_app, lambda s: s.set_assistant_version(aid, body.version))
        elif body.version == found["version"]:
            return found
        if row is None:
            raise Refused(
                404,
                "version_not_found",
                f"assistant {found['assistant_id']} has no version {body.version}",
            )
        return stored_shape(row)

    @router.post("/assistants")
    def create_assistant(body: AssistantIn, principal: Writer) -> dict[str, Any]:
        """A new assistant of a registered graph (409 `assistant_exists` if its id is taken,
        unless `if_exists: do_nothing`: then the existing one)."""
        if not body.graph_id:
            raise Refused(422, "invalid_request", "graph_id is required")
        workflow = default_of(keel_app, body.graph_id)
        if workflow is None:
            raise Refused(404, "graph_not_found", f"graph {body.graph_id[:200]!r} not found")
        value: dict[str, Any] = {
            "assistant_id": body.assistant_id or str(uuid4()),
            "graph_id": workflow.name,
            "config": dict(body.config or {}),
            "context": dict(body.context) if body.context is not None else None,
            "metadata": dict(body.metadata or {}),
            "if_exists": body.if_exists or "raise",
            "name": body.name,
            "description": body.description,
        }
        auth.check_sync(principal, "assistants", "create", value)
        aid = str(value["assistant_id"])
        config = with_context(value["config"], value["context"])
        row = None
        if default_of(keel_app, aid) is None:
            row = on_store(
                keel_app,
                lambda s: s.create_assistant(
                    aid,
                    graph_id=workflow.name,
                    name=value["name"] or "Untitled",
                    description=value["description"],
                    config=json.dumps(config),
                    context=json.dumps(value["context"] or {}),
                    metadata=json.dumps(value["metadata"] or {}),
                ),
            )
        if row is not None:
            return stored_shape(row)
        if value["if_exists"] == "do_nothing":
            return assistant(aid, principal)
        raise Refused(409, "assistant_exists", f"assistant {aid} already exists")

    @router.patch("/assistants/{assistant_id}")
    def update_assistant(
        assistant_id: AssistantId, body: AssistantIn, principal: Writer
    ) -> dict[str, Any]:
        """A new version of the assistant, in use at once: the fields given replace the
        current version's (metadata is merged into it). A default assistant is stored from its
        first update on."""
        found, is_stored = current(assistant_id)
        aid = str(found["assistant_id"])
        value: dict[str, Any] = {
            "assistant_id": aid,
            "graph_id": body.graph_id,
            "config": body.config,
            "context": body.context,
            "metadata": body.metadata,
            "name": body.name,
            "description": body.description,
        }
        allowed(found, principal, "update", **{k: v for k, v in value.items() if k != "metadata"})
        if value["graph_id"] is not None and default_of(keel_app, value["graph_id"]) is None:
            raise Refused(404, "graph_not_found", f"graph {value['graph_id'][:200]!r} not found")
        config = value["config"]
        if value["context"] is not None:
            config = with_context(config, value["context"])
        if not is_stored:
            on_store(
                keel_app,
                lambda s: s.create_assistant(
                    aid,
                    graph_id=found["graph_id"],
                    name=found["name"],
                    description=found["description"],
                    config=json.dumps(found["config"]),
                    context=json.dumps(found["context"]),
                    metadata=json.dumps(found["metadata"]),
                ),
            )
        row = on_store(
            keel_app,
            lambda s: s.update_assistant(
                aid,
                graph_id=value["graph_id"],
                name=value["name"],
                description=value["description"],
                config=dumped(config),
                context=dumped(value["context"]),
                metadata=dumped(value["metadata"]),
            ),
        )
        if row is None:  # deleted meanwhile
            raise not_found(aid)
        return stored_shape(row)

    @router.delete("/assistants/{assistant_id}", status_code=204)
    def delete_assistant(
        assistant_id: AssistantId, principal: Writer, delete_threads: bool = False
    ) -> Response:
        """Delete an assistant and its versions (`delete_threads`: and the threads its runs
        stamped with its id). A graph's default assistant is refused (409
        `assistant_is_default`): it lives as long as its workflow is registered."""
        found = assistant(assistant_id, principal, "delete")
        aid = str(found["assistant_id"])
        if default_of(keel_app, aid) is not None:
            raise Refused(
                409,
                "assistant_is_default",
                f"assistant {aid} is graph {found['graph_id']!r}'s default assistant: it cannot "
                "be deleted",
            )
        if not on_store(keel_app, lambda s: s.delete_assistant(aid)):
            raise not_found(aid)
        if delete_threads:
            for thread in keel_app.search_threads(metadata={"assistant_id": aid}, limit=MAX_PAGE):
                keel_app.delete_thread(thread["thread_id"])
        return Response(status_code=204)

    return router
