"""Runs by the many: `POST /runs/cancel` (`runs.cancel_many`).

Cancelling many runs is each run's cancel (runs.py): a queued or paused run ends at once, a
running one at its next step boundary; `action=rollback` also discards what it checkpointed.
The runs are named by `thread_id` and `run_ids`, or by `status` (`pending`, `running` or `all`
of them, Keel's queued, running and waiting runs). Runs that already ended are left as they
are; none found to cancel is 404, as on LangGraph's server. Under a project's auth, each run's
thread is checked as a single cancel checks it (threads, update): a run whose thread the
handler hides is not found.

(No `from __future__ import annotations`: FastAPI resolves the dependency aliases below.)
"""

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, ConfigDict, Field

from keel.core.errors import KeelError, RunNotFound
from keel.core.lifecycle import Status
from keel.runtime.app import App
from keel.service.agent_server.authz import Gate, visible_thread
from keel.service.agent_server.run_rows import roll_back
from keel.service.auth import Principal
from keel.service.errors import Refused

MAX_RUNS = 1000
STATUSES: dict[str, tuple[Status, ...]] = {
    "pending": (Status.QUEUED,),
    "running": (Status.RUNNING, Status.WAITING),
    "all": (Status.QUEUED, Status.RUNNING, Status.WAITING),
}


class CancelMany(BaseModel):
    model_config = ConfigDict(extra="forbid")

    thread_id: str | None = Field(None, max_length=200)
    run_ids: list[str] | None = Field(None, max_length=MAX_RUNS)
    status: Literal["pending", "running", "all"] | None = None


def run_batches_router(keel_app: App, auth: Gate) -> APIRouter:
    router = APIRouter(tags=["runs"])
    Writer = Annotated[Principal, Depends(auth.require("runs:write"))]

    def named(principal: Principal, body: CancelMany) -> list[tuple[str, str]]:
        """(thread id, run id) of each run the body names that `principal` may cancel."""
        if body.status is not None:
            if body.thread_id or body.run_ids:
                raise Refused(422, "invalid_request", "give status, or thread_id and run_ids")
            rows = [
                row
                for status in STATUSES[body.status]
                for row in keel_app.list_runs(status=status, limit=MAX_RUNS)
                if row.get("thread_id")
            ]
        elif body.thread_id and body.run_ids:
            rows = []
            for run_id in body.run_ids:
                try:
                    row = keel_app.get_run(run_id).run
                except RunNotFound:
                    continue
                if row.get("thread_id") == body.thread_id:
                    rows.append(row)
        else:
            raise Refused(422, "invalid_request", "give status, or thread_id and run_ids")
        allowed = []
        for row in rows:
            thread_id, run_id = str(row["thread_id"]), str(row["run_id"])
            try:
                visible_thread(auth, keel_app, principal, thread_id, "update", run_id=run_id)
            except KeelError:
                continue
            allowed.append((thread_id, run_id))
        return allowed

    @router.post("/runs/cancel", status_code=204)
    def cancel_many(
        body: CancelMany,
        principal: Writer,
        action: Literal["interrupt", "rollback"] = "interrupt",
    ) -> Response:
        """Cancel the runs named (by thread and ids, or by status): each as its own cancel."""
        cancelled = 0
        for _thread_id, run_id in named(principal, body):
            try:
                if action == "rollback":
                    keel_app.aio.runtime.portal.call(
                        roll_back(keel_app.aio, run_id, principal.label)
                    )
                else:
                    keel_app.cancel(run_id, by=principal.label)
            except KeelError:  # it ended meanwhile: nothing to cancel
                continue
            cancelled += 1
        if not cancelled:
            raise Refused(404, "run_not_found", "no runs found to cancel")
        return Response(status_code=204)

    return router
