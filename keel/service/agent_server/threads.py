"""The Agent Server's threads, their state and history, on Keel's threads.

Each endpoint is one or two calls of the App's thread operations (keel/runtime/conversations.py)
answered in the protocol's shapes (`shapes`). Where the protocol and Keel differ:

- A thread made before any run has no graph yet unless its metadata names one (`graph_id`, as
  the SDK's `threads.create(graph_id=...)` sends it): it belongs to no workflow (`NO_GRAPH`)
  until its first run, whose admission gives it that run's. Its state is empty meanwhile, and
  a state update is refused (400 `no_graph`), as the Agent Server refuses it.
- A state update is a run of its own, executed by a worker (its checkpoint is written under a
  lease like any step): the request waits for it, at most `UPDATE_WAIT` seconds, then answers
  202 with that run's id and no checkpoint yet.
- Deleting a thread whose run is unfinished is refused (409 `thread_busy`): cancel the run
  first; what it did stays on record.
- A search by `values`, by `ids`, or sorted otherwise than most recently updated first reads
  at most `MAX_SCAN` threads.

(No `from __future__ import annotations`: FastAPI resolves the dependency aliases below.)
"""

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Response

from keel.core.codec import contains, dumps, loads
from keel.core.errors import (
    InvalidId,
    InvalidInput,
    RunStillGoing,
    ThreadNotFound,
    UnknownWorkflow,
)
from keel.core.lifecycle import Status
from keel.core.store.base import Row
from keel.core.threads import new_id, validate_thread_id
from keel.runtime.app import App
from keel.service.agent_server.assistants import resolve_assistant, workflows_of
from keel.service.agent_server.authz import (
    Filters,
    Gate,
    exact_part,
    matches,
    merged,
    visible_thread,
)
from keel.service.agent_server.shapes import (
    NO_GRAPH,
    STATE_FIELDS,
    THREAD_FIELDS,
    graph_of,
    refuse_unknown,
    selected,
    state_shape,
    thread_shape,
)
from keel.service.agent_server.thread_bodies import (
    MAX_PAGE,
    Body,
    HistoryIn,
    StateAt,
    StateUpdate,
    ThreadCount,
    ThreadCreate,
    ThreadPatch,
    ThreadSearch,
)
from keel.service.auth import Principal
from keel.service.errors import Refused

MAX_SCAN = 10_000
"""The most threads a search that Keel's store cannot page for (`values`, another sort) reads."""
UPDATE_WAIT = 30.0
"""Seconds a state update's request waits for a worker to write it."""


def not_implemented(what: str) -> Refused:
    return Refused(501, "not_implemented", f"{what} is not implemented by Keel yet")


def checkpoint_id_of(ref: str | dict[str, Any] | None) -> str | None:
    """A checkpoint id given as itself, as a Checkpoint, or as a config holding one."""
    if ref is None or isinstance(ref, str):
        return ref or None
    if ref.get("checkpoint_ns"):
        raise not_implemented("reading a subgraph's checkpoint by its namespace")
    found = ref.get("checkpoint_id") or (ref.get("configurable") or {}).get("checkpoint_id")
    if found is not None and not isinstance(found, str):
        raise Refused(422, "invalid_request", "checkpoint_id must be a string")
    return found


# -- the router ------------------------------------------------------------------------------


def threads_router(keel_app: App, auth: Gate) -> APIRouter:
    router = APIRouter(tags=["threads"])
    Reader = Annotated[Principal, Depends(auth.require("runs:read"))]
    Writer = Annotated[Principal, Depends(auth.require("runs:write"))]
    ThreadId = Annotated[str, Path(max_length=200, description="The thread's id.")]

    def visible(principal: Principal, thread_id: str, action: str, **asked: Any) -> Row:
        return visible_thread(auth, keel_app, principal, thread_id, action, **asked)

    def state(thread: Row, checkpoint_id: str | None = None, subgraphs: bool = False) -> Any:
        if graph_of(thread) is None:
            return state_shape(None)
        snapshot = keel_app.get_state(thread["thread_id"], checkpoint_id, subgraphs=subgraphs)
        return state_shape(snapshot)

    def shape(thread: Row) -> dict[str, Any]:
        try:
            current = state(thread)
        except UnknownWorkflow:  # a workflow this server does not register: no values to show
            current = None
        error = None
        if thread["status"] == "error":
            runs = keel_app.thread_runs(thread["thread_id"], 1, newest=True)
            error = runs[0]["error"] if runs else None
        return thread_shape(thread, current, error)

    def create(thread_id: str, graph: str | None, metadata: dict[str, Any]) -> Row | None:
        """A new thread (of `graph`, or of no workflow yet); None if one of that id exists."""
        workflow = keel_app.aio.runtime.workflows.get(graph) if graph else None

        async def made() -> Row | None:
            await keel_app.aio.open()
            return await keel_app.aio.runtime.store.create_thread(
                thread_id,
                workflow=workflow.name if workflow else NO_GRAPH,
                version=workflow.version if workflow else NO_GRAPH,
                metadata=dumps(metadata),
            )

        row: Row | None = keel_app.aio.runtime.portal.call(made())
        return row

    def store_filter(metadata: dict[str, Any] | None) -> tuple[dict[str, Any], str | None, bool]:
        """A metadata filter as Keel's store reads it: `graph_id` and `assistant_id` (shown on
        every thread of a workflow, stamped on few) name the thread's workflow. Also whether
        anything can match (they may name two workflows)."""
        rest = dict(metadata or {})
        names = {w.name for w in workflows_of(keel_app)}
        workflow = None
        if isinstance(rest.get("graph_id"), str) and rest["graph_id"] in names:
            workflow = rest.pop("graph_id")
        if isinstance(rest.get("assistant_id"), str):
            try:
                named = resolve_assistant(keel_app, rest["assistant_id"])[0]
            except Refused:
                named = None
            if named is not None:
                rest.pop("assistant_id")
                if workflow not in (None, named):
                    return rest, workflow, False
                workflow = named
        return rest, workflow, True

    def scan(
        metadata: dict[str, Any] | None, status: str | None, post: Filters | None = None
    ) -> list[Row]:
        rest, workflow, possible = store_filter(metadata)
        rows: list[Row] = []
        while possible and len(rows) < MAX_SCAN:
            page = keel_app.search_threads(
                metadata=rest, workflow=workflow, status=status, limit=1000, offset=len(rows)
            )
            rows.extend(page)
            if len(page) < 1000:
                break
        if post:
            rows = [r for r in rows if matches(thread_shape(r)["metadata"], post)]
        return rows[:MAX_SCAN]

    def by_ids(ids: list[str], metadata: dict[str, Any] | None, status: str | None) -> list[Row]:
        rows = []
        for thread_id in dict.fromkeys(ids):
            try:
                row = keel_app.get_thread(thread_id)
            except (ThreadNotFound, InvalidId):
                continue
            if (status is None or row["status"] == status) and contains(
                thread_shape(row)["metadata"], metadata or {}
            ):
                rows.append(row)
        return rows

    def searched(
        principal: Principal, action: str, body: ThreadCount, **asked: Any
    ) -> tuple[dict[str, Any] | None, Filters, bool]:
        """A search's metadata filter with the auth handler's exact conditions, the handler's
        other conditions, and whether anything can match."""
        value = {
            "metadata": dict(body.metadata or {}),
            "values": body.values,
            "status": body.status,
            **asked,
        }
        exact, post = exact_part(auth.check_sync(principal, "threads", action, value))
        metadata = merged(value["metadata"], exact)
        return metadata, post, metadata is not None

    # -- threads ----------------------------------------------------------------------------

    @router.post("/threads")
    def create_thread(body: ThreadCreate, response: Response, principal: Writer) -> dict[str, Any]:
        """A thread, of the graph its metadata's `graph_id` names, or of none until its first
        run. An existing id: 409, or with `if_exists: do_nothing` that thread."""
        if body.supersteps:
            raise not_implemented("creating a thread with supersteps")
        if body.ttl is not None:
            raise not_implemented("a thread's time to live (ttl)")
        metadata = dict(body.metadata or {})
        if body.graph_id is not None:
            metadata.setdefault("graph_id", body.graph_id)
        thread_id = new_id() if body.thread_id is None else validate_thread_id(body.thread_id)
        value: dict[str, Any] = {
            "thread_id": thread_id,
            "metadata": metadata,
            "if_exists": body.if_exists,
        }
        filters = auth.check_sync(principal, "threads", "create", value)
        metadata = dict(value.get("metadata") or {})
        graph = metadata.get("graph_id")
        registered = {w.name for w in workflows_of(keel_app)}
        made = create(thread_id, graph if graph in registered else None, metadata)
        if made is not None:
            # What was just written, as a read would show it: no runs (idle), no checkpoint.
            fresh = {**made, "metadata": metadata, "status": "idle", "runs": 0}
            return thread_shape({**fresh, "latest_version": made["workflow_version"]})
        row = keel_app.get_thread(thread_id)
        hidden = bool(filters) and not matches(thread_shape(row)["metadata"], filters)
        if body.if_exists != "do_nothing" or hidden:
            raise Refused(409, "thread_exists", f"thread {thread_id} already exists")
        return shape(row)

    @router.post("/threads/search")
    def search_threads(body: ThreadSearch, principal: Reader) -> list[dict[str, Any]]:
        """Threads by metadata, values (each key holding its value), status or ids; most
        recently updated first unless `sort_by` says otherwise."""
        if body.extract:
            raise not_implemented("extracting values in a thread search")
        refuse_unknown(body.select, THREAD_FIELDS)
        asked = {"limit": body.limit, "offset": body.offset, "ids": body.ids}
        metadata, post, possible = searched(principal, "search", body, **asked)
        if not possible:
            return []
        default_order = body.sort_by in (None, "updated_at") and body.sort_order != "asc"
        if body.ids is None and body.values is None and default_order and not post:
            rest, workflow, possible = store_filter(metadata)
            rows = (
                keel_app.search_threads(
                    metadata=rest,
                    workflow=workflow,
                    status=body.status,
                    limit=body.limit,
                    offset=body.offset,
                )
                if possible
                else []
            )
            return [selected(shape(r), body.select) for r in rows]
        rows = (
            by_ids(body.ids, metadata, body.status)
            if body.ids is not None
            else scan(metadata, body.status)
        )
        rows = [r for r in rows if matches(thread_shape(r)["metadata"], post)]
        shapes = [shape(r) for r in rows]
        if body.values is not None:
            shapes = [s for s in shapes if contains(s["values"], body.values)]
        key = body.sort_by or "updated_at"
        shapes.sort(key=lambda s: (str(s[key]), s["thread_id"]), reverse=body.sort_order != "asc")
        page = shapes[body.offset : body.offset + body.limit]
        return [selected(s, body.select) for s in page]

    @router.post("/threads/count")
    def count_threads(body: ThreadCount, principal: Reader) -> int:
        """How many threads match (as `search`)."""
        metadata, post, possible = searched(principal, "search", body)
        if not possible:
            return 0
        rows = scan(metadata, body.status, post)
        if body.values is None:
            return len(rows)
        return sum(1 for r in rows if contains(shape(r)["values"], body.values))

    @router.get("/threads/{thread_id}")
    def get_thread(thread_id: ThreadId, principal: Reader) -> dict[str, Any]:
        """The thread: metadata, status (from its runs), its current values and interrupts."""
        return shape(visible(principal, thread_id, "read"))

    @router.patch("/threads/{thread_id}", response_model=None)
    def update_thread(
        thread_id: ThreadId,
        body: ThreadPatch,
        principal: Writer,
        prefer: Annotated[str | None, Header()] = None,
    ) -> dict[str, Any] | Response:
        """Merge keys into the thread's metadata."""
        if body.ttl is not None:
            raise not_implemented("a thread's time to live (ttl)")
        value: dict[str, Any] = {"thread_id": thread_id, "metadata": dict(body.metadata)}
        filters = auth.check_sync(principal, "threads", "update", value)
        current = thread_shape(keel_app.get_thread(thread_id))["metadata"]
        if filters and not matches(current, filters):
            raise ThreadNotFound(f"no thread {thread_id!r}")
        row = keel_app.update_thread(thread_id, metadata=dict(value.get("metadata") or {}))
        if prefer and "return=minimal" in prefer.replace(" ", ""):
            return Response(status_code=204)
        return shape(row)

    @router.delete("/threads/{thread_id}", status_code=204, response_class=Response)
    def delete_thread(thread_id: ThreadId, principal: Writer) -> Response:
        """Delete the thread and its checkpoints; 409 `thread_busy` while a run of it is
        unfinished. Its runs, their timelines and ledgers stay."""
        visible(principal, thread_id, "delete")
        keel_app.delete_thread(thread_id)
        return Response(status_code=204)

    @router.post("/threads/{thread_id}/copy")
    def copy_thread(
        thread_id: ThreadId, principal: Writer, body: Body | None = None
    ) -> dict[str, Any]:
        """A new thread with a copy of the thread's checkpoints (and its metadata, its owner's
        included); its runs stay with it. No body, or an object: invalid JSON is 422."""
        visible(principal, thread_id, "read")
        return shape(keel_app.copy_thread(thread_id))

    # -- state ------------------------------------------------------------------------------

    def state_at(
        principal: Principal, thread_id: str, checkpoint_id: str, subgraphs: bool
    ) -> dict[str, Any]:
        thread = visible(principal, thread_id, "read")
        found: dict[str, Any] = state(thread, checkpoint_id, subgraphs)
        if found["created_at"] is None:
            raise Refused(
                404,
                "checkpoint_not_found",
                f"thread {thread_id} has no checkpoint {checkpoint_id[:80]!r}",
            )
        return found

    Select = Annotated[list[str] | None, Query()]

    @router.get("/threads/{thread_id}/state")
    def get_state(
        thread_id: ThreadId, principal: Reader, subgraphs: bool = False, select: Select = None
    ) -> dict[str, Any]:
        """The thread's state at its latest checkpoint: values, next nodes, tasks with their
        interrupts, checkpoint and parent (empty before the first)."""
        thread = visible(principal, thread_id, "read")
        return selected(state(thread, None, subgraphs), select)

    @router.get("/threads/{thread_id}/state/{checkpoint_id}")
    def get_state_at(
        thread_id: ThreadId,
        checkpoint_id: Annotated[str, Path(max_length=200)],
        principal: Reader,
        subgraphs: bool = False,
        select: Select = None,
    ) -> dict[str, Any]:
        """The thread's state at one of its checkpoints; 404 `checkpoint_not_found`."""
        return selected(state_at(principal, thread_id, checkpoint_id, subgraphs), select)

    @router.post("/threads/{thread_id}/state/checkpoint")
    def post_state_at(thread_id: ThreadId, body: StateAt, principal: Reader) -> dict[str, Any]:
        """The thread's state at the checkpoint the body names."""
        checkpoint_id = checkpoint_id_of(body.checkpoint)
        if checkpoint_id is None:
            latest = state(visible(principal, thread_id, "read"), None, body.subgraphs)
            return selected(latest, body.select)
        found = state_at(principal, thread_id, checkpoint_id, body.subgraphs)
        return selected(found, body.select)

    @router.post("/threads/{thread_id}/state")
    def update_state(
        thread_id: ThreadId, body: StateUpdate, response: Response, principal: Writer
    ) -> dict[str, Any]:
        """Write values to the thread's state as a new checkpoint, as if `as_node` wrote them.
        A worker writes it (a run of its own, after the thread's earlier runs): the answer
        names the checkpoint, or, if no worker wrote it within `UPDATE_WAIT` seconds, is 202
        with the run's id. A run paused on `interrupt()` is answered by the update: it ends
        (`interrupted`) and the thread goes on from the update. A run waiting on a
        `keel.approval`, `keel.sleep` or an in-doubt effect stays: the update queues behind it
        (202)."""
        thread = visible(principal, thread_id, "update")
        if graph_of(thread) is None:
            raise Refused(
                400,
                "no_graph",
                f"thread {thread_id} has no graph yet: run it first, or create it with a "
                "graph_id, before updating its state",
            )
        if body.checkpoint or body.checkpoint_id:
            raise not_implemented("updating the state of a past checkpoint")
        try:
            row = keel_app.update_state(thread_id, body.values, body.as_node, timeout=UPDATE_WAIT)
        except RunStillGoing as going:
            response.status_code = 202
            return {"checkpoint": None, "checkpoint_id": None, "run_id": going.run_id}
        except InvalidInput as refused:
            if not isinstance(body.values, list):
                raise
            # langgraph-api's status for a list (its graph refuses it as a node's return).
            raise Refused(400, "invalid_input", str(refused)) from None
        if row["status"] != Status.COMPLETED:
            raise Refused(
                422 if row["status"] == Status.FAILED else 409,
                "state_update_failed",
                f"the state update (run {row['run_id']}) ended {row['status']}: "
                f"{row['error'] or row['termination_reason']}",
            )
        checkpoint_id = loads(row["output"])["checkpoint_id"]
        checkpoint = {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}
        return {
            "checkpoint": checkpoint,
            "configurable": dict(checkpoint),
            "checkpoint_id": checkpoint_id,
        }

    # -- history ----------------------------------------------------------------------------

    def history(principal: Principal, thread_id: str, body: HistoryIn) -> list[dict[str, Any]]:
        thread = visible(principal, thread_id, "read")
        refuse_unknown(body.select, STATE_FIELDS)
        if graph_of(thread) is None:
            return []
        at = checkpoint_id_of(body.checkpoint)
        if at is not None:
            snapshots = [keel_app.get_state(thread_id, at)]
            snapshots = [s for s in snapshots if s.created_at is not None]
        else:
            # A metadata filter is applied here, after LangGraph listed the checkpoints.
            limit = None if body.metadata else body.limit
            snapshots = keel_app.get_history(thread_id, limit, checkpoint_id_of(body.before))
        wanted = body.metadata or {}
        # Matched on the metadata shown (with its `run_id` and `thread_id`).
        shaped = [state_shape(s) for s in snapshots]
        states = [s for s in shaped if contains(s["metadata"] or {}, wanted)]
        return [selected(s, body.select) for s in states[: body.limit]]

    @router.post("/threads/{thread_id}/history")
    def post_history(
        thread_id: ThreadId, body: HistoryIn, principal: Reader
    ) -> list[dict[str, Any]]:
        """The thread's checkpoints as states, newest first: at most `limit`, older than
        `before`, whose metadata holds each key of `metadata` with its value."""
        return history(principal, thread_id, body)

    @router.get("/threads/{thread_id}/history")
    def get_history(
        thread_id: ThreadId,
        principal: Reader,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 10,
        before: Annotated[str | None, Query(max_length=200)] = None,
    ) -> list[dict[str, Any]]:
        """The thread's checkpoints as states, newest first (`limit`, `before`)."""
        return history(principal, thread_id, HistoryIn(limit=limit, before=before))

    return router
