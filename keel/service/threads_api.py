"""The HTTP API's threads: conversations of many runs over one checkpoint lineage.

Each endpoint is one call of the App's thread operations (keel/runtime/conversations.py); the
shapes follow the LangGraph Agent Server's thread resources (docs/http.md, "Threads"). Reading
takes `runs:read`, acting `runs:write`: answering a thread's plain `interrupt()` is a turn of
the conversation, while an approval still takes `approvals:write` at /v1/approvals (the core
refuses a resume value for an approval's wait).

A request never runs a graph. Two endpoints wait for a worker, bounded: `POST
/v1/threads/{id}/state` (a state update is a run of its own, fenced like any step: it answers 202
with that run when no worker wrote it within its `timeout`) and `GET /v1/runs/{id}/wait`. Each
holds a threadpool thread while it waits, hence their bounds.

(No `from __future__ import annotations`: FastAPI resolves the dependency aliases below.)
"""

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request, Response

from keel.core.codec import loads
from keel.core.errors import RunStillGoing, ThreadNotFound, UsageError
from keel.core.lifecycle import Status
from keel.core.store.base import Row
from keel.core.threads import validate_command
from keel.core.waits import resume_value
from keel.runtime.app import App
from keel.runtime.conversations import SETTLED
from keel.runtime.snapshot_json import state_json
from keel.service import models as m
from keel.service import thread_models as t
from keel.service.auth import Authenticator, Principal
from keel.service.errors import DECISION_CONFLICT, Refused

MAX_WAIT = 300.0
"""The longest `GET /v1/runs/{id}/wait` holds its request (and a threadpool thread), in seconds."""


def _problem(description: str) -> dict[str, Any]:
    return {"model": m.Problem, "description": description}


UNKNOWN: dict[int | str, dict[str, Any]] = {
    400: _problem("A malformed thread id (`invalid_id`)."),
    404: _problem("No such thread (`thread_not_found`)."),
}
EXISTS = _problem("A thread of that id exists (`thread_exists`).")
ANSWER_REFUSED: dict[int | str, dict[str, Any]] = {
    **UNKNOWN,
    409: {
        "model": t.ResumeConflict,
        "description": "Another answer won first (`decision_conflict`, `approval` is the recorded "
        "wait, its `value` the winner's); nothing waits (`no_pending_wait`); the run finished "
        "(`run_finished`); the wait is an approval (`wrong_kind`).",
    },
}


def threads_router(keel_app: App, auth: Authenticator) -> APIRouter:
    router = APIRouter(tags=["threads"])
    Reader = Annotated[Principal, Depends(auth.require("runs:read"))]
    Writer = Annotated[Principal, Depends(auth.require("runs:write"))]
    ThreadId = Annotated[str, Path(description="The thread's id.")]
    IdempotencyKey = Annotated[
        str | None, Header(min_length=1, max_length=200, description="Deduplication key.")
    ]

    def thread_url(request: Request, thread_id: str) -> str:
        return str(request.url_for("get_thread", thread_id=thread_id))

    def run_url(request: Request, run_id: str) -> str:
        return str(request.url_for("get_run", run_id=run_id))

    def thread(request: Request, row: Row) -> t.Thread:
        return t.thread_model(row, thread_url(request, row["thread_id"]))

    def existing(thread_id: str | None) -> Row | None:
        if thread_id is None:
            return None
        try:
            return keel_app.get_thread(thread_id)
        except ThreadNotFound:
            return None

    def refuse_existing(thread_id: str) -> Refused:
        return Refused(409, "thread_exists", f"thread {thread_id} already exists")

    # -- threads ----------------------------------------------------------------------------

    @router.post(
        "/threads",
        status_code=201,
        response_model=t.Thread,
        responses={
            200: {"model": t.Thread, "description": "`if_exists: do_nothing`: the existing one."},
            201: {"description": "A new thread."},
            400: UNKNOWN[400],
            409: EXISTS,
        },
    )
    def create_thread(
        body: t.ThreadIn, request: Request, response: Response, _: Writer
    ) -> t.Thread:
        """Create a thread of a workflow, with metadata; it holds no run yet."""
        try:
            row = keel_app.create_thread(
                body.workflow, thread_id=body.thread_id, metadata=body.metadata
            )
        except UsageError:
            found = existing(body.thread_id)
            if found is None or body.thread_id is None:
                raise
            if body.if_exists == "raise":
                raise refuse_existing(body.thread_id) from None
            response.status_code = 200
            return thread(request, found)
        response.headers["Location"] = thread_url(request, row["thread_id"])
        return thread(request, row)

    @router.post("/threads/search", response_model=t.ThreadPage)
    def search_threads(body: t.ThreadSearchIn, request: Request, _: Reader) -> t.ThreadPage:
        """Threads whose metadata holds every given key and value, of a workflow, in a status;
        most recently updated first. `next_offset` is null on the last page."""
        rows = keel_app.search_threads(
            metadata=body.metadata,
            workflow=body.workflow,
            status=body.status,
            limit=body.limit + 1,  # one more tells whether there is a next page
            offset=body.offset,
        )
        more = len(rows) > body.limit
        return t.ThreadPage(
            threads=[thread(request, r) for r in rows[: body.limit]],
            limit=body.limit,
            offset=body.offset,
            next_offset=body.offset + body.limit if more else None,
        )

    @router.get("/threads/{thread_id}", response_model=t.Thread, responses=UNKNOWN)
    def get_thread(thread_id: ThreadId, request: Request, _: Reader) -> t.Thread:
        """The thread: workflow, metadata, status (from its runs) and how many runs it holds."""
        return thread(request, keel_app.get_thread(thread_id))

    @router.patch("/threads/{thread_id}", response_model=t.Thread, responses=UNKNOWN)
    def update_thread(
        thread_id: ThreadId, body: t.ThreadPatch, request: Request, _: Writer
    ) -> t.Thread:
        """Merge keys into the thread's metadata."""
        return thread(request, keel_app.update_thread(thread_id, metadata=body.metadata))

    @router.delete(
        "/threads/{thread_id}",
        status_code=204,
        response_class=Response,
        responses={
            **UNKNOWN,
            409: _problem("A run of the thread is unfinished (`thread_busy`): cancel it first."),
        },
    )
    def delete_thread(thread_id: ThreadId, _: Writer) -> Response:
        """Delete the thread and its checkpoints. Its runs, their timelines and ledgers stay."""
        keel_app.delete_thread(thread_id)
        return Response(status_code=204)

    @router.post(
        "/threads/{thread_id}/copy",
        status_code=201,
        response_model=t.Thread,
        responses={**UNKNOWN, 409: EXISTS},
    )
    def copy_thread(
        thread_id: ThreadId,
        request: Request,
        response: Response,
        _: Writer,
        body: Annotated[t.CopyIn | None, Body()] = None,
    ) -> t.Thread:
        """A new thread with a copy of the thread's checkpoints; its runs stay with the
        original."""
        to = body.to if body else None
        try:
            row = keel_app.copy_thread(thread_id, to=to)
        except UsageError:
            if to is None or existing(to) is None:
                raise
            raise refuse_existing(to) from None
        response.headers["Location"] = thread_url(request, row["thread_id"])
        return thread(request, row)

    # -- state ------------------------------------------------------------------------------

    def state(thread_id: str, checkpoint_id: str | None) -> dict[str, Any]:
        snapshot = keel_app.get_state(thread_id, checkpoint_id)
        if checkpoint_id and snapshot.created_at is None:
            # LangGraph answers an empty state for a checkpoint it has not: say so instead.
            raise Refused(
                404,
                "checkpoint_not_found",
                f"thread {thread_id} has no checkpoint {checkpoint_id[:80]!r}",
            )
        return state_json(snapshot)

    state_errors = {**UNKNOWN, 404: _problem("No such thread or checkpoint.")}

    @router.get("/threads/{thread_id}/state", response_model=t.ThreadState, responses=state_errors)
    def thread_state(
        thread_id: ThreadId,
        _: Reader,
        checkpoint_id: Annotated[
            str | None, Query(max_length=200, description="A past checkpoint; the latest if not.")
        ] = None,
    ) -> dict[str, Any]:
        """The thread's state at its latest checkpoint (or `checkpoint_id`): values, next
        nodes, tasks with their interrupts, checkpoint and parent."""
        return state(thread_id, checkpoint_id)

    @router.get(
        "/threads/{thread_id}/state/{checkpoint_id}",
        response_model=t.ThreadState,
        responses=state_errors,
    )
    def thread_state_at(
        thread_id: ThreadId,
        checkpoint_id: Annotated[str, Path(max_length=200)],
        _: Reader,
    ) -> dict[str, Any]:
        """The thread's state at one of its checkpoints."""
        return state(thread_id, checkpoint_id)

    @router.get(
        "/threads/{thread_id}/history", response_model=list[t.ThreadState], responses=UNKNOWN
    )
    def thread_history(
        thread_id: ThreadId,
        _: Reader,
        limit: Annotated[int, Query(ge=1, le=500)] = 10,
        before: Annotated[
            str | None, Query(max_length=200, description="Only checkpoints older than this one.")
        ] = None,
    ) -> list[dict[str, Any]]:
        """The thread's checkpoints as states, newest first (every branch a fork made)."""
        return [state_json(s) for s in keel_app.get_history(thread_id, limit, before)]

    @router.post(
        "/threads/{thread_id}/state",
        response_model=t.StateUpdated,
        responses={
            **UNKNOWN,
            202: {"model": t.StateUpdated, "description": "No worker wrote it yet: its run."},
            400: _problem(
                "A malformed thread id (`invalid_id`), or `as_node` names no node of the graph "
                "(`bad_request`: nothing is admitted)."
            ),
            409: _problem("The update's run was cancelled (`state_update_failed`)."),
            422: _problem("The update's run failed (`state_update_failed`)."),
        },
    )
    def update_thread_state(
        thread_id: ThreadId,
        body: t.StateUpdateIn,
        request: Request,
        response: Response,
        _: Writer,
    ) -> t.StateUpdated:
        """Write values to the thread's state as a new checkpoint, as if `as_node` wrote them.
        The update is a run of its own, after the thread's earlier runs, executed by a worker:
        200 once it wrote the checkpoint, 202 with the run if that took over `timeout`. On an
        interrupted thread it answers the interrupt, as in LangGraph: the waiting run ends
        (`interrupted`) and the update goes on from its last checkpoint."""
        try:
            row = keel_app.update_state(thread_id, body.values, body.as_node, timeout=body.timeout)
        except RunStillGoing as going:
            row = keel_app.get_run(going.run_id).run
            response.status_code = 202
            response.headers["Location"] = str(request.url_for("wait_run", run_id=row["run_id"]))
            return t.StateUpdated(
                checkpoint=None,
                checkpoint_id=None,
                run=t.thread_run(row, run_url(request, row["run_id"])),
            )
        if row["status"] != Status.COMPLETED:
            raise Refused(
                422 if row["status"] == Status.FAILED else 409,
                "state_update_failed",
                f"the state update (run {row['run_id']}) ended {row['status']}: "
                f"{row['error'] or row['termination_reason']}",
            )
        checkpoint_id = loads(row["output"])["checkpoint_id"]
        return t.StateUpdated(
            checkpoint=t.CheckpointRef(
                thread_id=thread_id, checkpoint_ns="", checkpoint_id=checkpoint_id
            ),
            checkpoint_id=checkpoint_id,
            run=t.thread_run(row, run_url(request, row["run_id"])),
        )

    # -- runs on a thread -------------------------------------------------------------------

    @router.post(
        "/threads/{thread_id}/runs",
        status_code=201,
        response_model=t.ThreadRun,
        responses={
            200: {"model": t.ThreadRun, "description": "That job's run, or the resumed run."},
            201: {"description": "A new run on the thread, queued for a worker."},
            **UNKNOWN,
            409: _problem(
                "The thread is busy and the strategy is `reject` (`thread_busy`); a "
                "`command.resume` refused as on /v1/threads/{thread_id}/resume."
            ),
        },
    )
    def submit_thread_run(
        thread_id: ThreadId,
        body: t.ThreadRunIn,
        request: Request,
        response: Response,
        principal: Writer,
    ) -> t.ThreadRun:
        """Admit a run on the thread (created with `workflow` if new): a turn of the
        conversation, from the thread's latest checkpoint or the `checkpoint_id` it forks
        from. `command.resume` answers the thread's pending interrupt instead."""
        command = validate_command(body.command.as_dict()) if body.command else None
        if command is not None and "resume" in command:
            response.status_code = 200
            return resume(request, thread_id, command["resume"], principal)
        workflow = body.workflow or keel_app.get_thread(thread_id)["workflow"]
        row = keel_app.submit(
            workflow,
            body.input,
            thread_id=thread_id,
            command=command,
            config=body.config,
            context=body.context,
            checkpoint_id=body.checkpoint_id,
            multitask_strategy=body.multitask_strategy,
            metadata=body.metadata,
            job_id=body.job_id,
            version=body.version,
            after=body.after,
        )
        url = run_url(request, row.run_id)
        response.status_code = 201 if row.created else 200
        if row.created:
            response.headers["Location"] = url
        return t.thread_run(row, url)

    @router.get("/threads/{thread_id}/runs", response_model=list[t.ThreadRun], responses=UNKNOWN)
    def list_thread_runs(
        thread_id: ThreadId,
        request: Request,
        _: Reader,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> list[t.ThreadRun]:
        """The thread's runs in their order (`thread_seq`), the first `limit`."""
        rows = keel_app.thread_runs(thread_id, limit)
        return [t.thread_run(r, run_url(request, r["run_id"])) for r in rows]

    @router.post(
        "/threads/{thread_id}/resume", response_model=t.ThreadRun, responses=ANSWER_REFUSED
    )
    def resume_thread(
        thread_id: ThreadId,
        body: t.ResumeValueIn,
        request: Request,
        principal: Writer,
        idempotency_key: IdempotencyKey = None,
    ) -> t.ThreadRun:
        """Answer the interrupt the thread's active run waits on with any JSON value (what
        `interrupt()` returns); the first answer wins. The run goes back to the queue."""
        return resume(
            request,
            thread_id,
            body.value,
            principal,
            by=body.by,
            comment=body.comment,
            action_id=idempotency_key or body.action_id,
            wait_id=body.wait_id,
        )

    def resume(
        request: Request,
        thread_id: str,
        value: Any,
        principal: Principal,
        *,
        by: str | None = None,
        comment: str | None = None,
        action_id: str | None = None,
        wait_id: str | None = None,
    ) -> t.ThreadRun:
        result = keel_app.resume_thread(
            thread_id,
            value,
            wait_id=wait_id,
            by=by or principal.label,
            principal=principal.label,
            comment=comment,
            action_id=action_id,
            channel="http",
        )
        wait = result.wait
        url = run_url(request, wait["run_id"])
        retried = action_id is not None and wait.get("action_id") == action_id
        if not result.recorded and not retried:
            recorded = {**m.approval_fields(wait, url), "value": answer_of(wait)}
            by_whom = wait.get("decided_by") or "someone"
            via = f" via {wait['channel']}" if wait.get("channel") else ""
            raise Refused(
                *DECISION_CONFLICT,
                f"not recorded: {wait['wait_id']} was already answered by {by_whom}{via} (the "
                "first answer wins)",
                approval=recorded,
            )
        return t.thread_run(keel_app.get_run(wait["run_id"]).annotated_run, url)

    @router.get(
        "/runs/{run_id}/wait",
        response_model=t.WaitedRun,
        tags=["runs"],
        responses={
            202: {"model": t.WaitedRun, "description": "Still queued or running at `timeout`."},
            400: UNKNOWN[400],
            404: _problem("No such run."),
        },
    )
    def wait_run(
        run_id: Annotated[str, Path(description="The run's id.", max_length=200)],
        request: Request,
        response: Response,
        _: Reader,
        timeout: Annotated[
            float, Query(ge=0, le=MAX_WAIT, description="Seconds to wait at most.")
        ] = 30.0,
    ) -> t.WaitedRun:
        """Wait until the run has ended or waits for input (200), at most `timeout` seconds
        (then 202 with the run as it is). The answer carries the graph's output."""
        try:
            row = keel_app.wait(run_id, timeout=timeout)
        except TimeoutError:
            row = keel_app.get_run(run_id).annotated_run
        response.status_code = 200 if row["status"] in SETTLED else 202
        return t.waited_run(row, run_url(request, run_id))

    return router


def answer_of(wait: Row) -> Any:
    """The value a wait was answered with, as `interrupt()` returns it."""
    return resume_value(loads(wait["value"])) if wait.get("value") else None
