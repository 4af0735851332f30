"""`POST /threads/prune` (`threads.prune`): delete many threads at once.

`strategy: "delete"` deletes each named thread with its checkpoints, as `DELETE /threads/{id}`
does, skipping a thread with an unfinished run (it is busy) and one that is not there (or that
the auth handler hides); the answer counts the threads deleted. `keep_latest` (drop every
checkpoint but the latest) is refused: Keel's checkpoints are the runs' record, which a step's
re-execution and a fork read back, and it has no way yet to drop part of a thread's lineage.

(No `from __future__ import annotations`: FastAPI resolves the dependency aliases below.)
"""

from typing import Annotated, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from keel.core.errors import InvalidId, ThreadBusy, ThreadNotFound
from keel.runtime.app import App
from keel.service.agent_server.authz import Gate, visible_thread
from keel.service.auth import Principal
from keel.service.errors import Refused

MAX_PRUNE = 1000


class PruneIn(BaseModel):
    thread_ids: list[Annotated[str, Field(max_length=200)]] = Field(max_length=MAX_PRUNE)
    strategy: Literal["delete", "keep_latest"] = "delete"


def thread_prune_router(keel_app: App, auth: Gate) -> APIRouter:
    router = APIRouter(tags=["threads"])
    Writer = Annotated[Principal, Depends(auth.require("runs:write"))]

    @router.post("/threads/prune")
    def prune_threads(body: PruneIn, principal: Writer) -> dict[str, int]:
        """Delete the named threads that have no unfinished run; `{"pruned_count": n}`."""
        if body.strategy == "keep_latest":
            raise Refused(
                422,
                "unsupported",
                "strategy keep_latest is not supported: Keel keeps a thread's whole checkpoint "
                "lineage (delete the thread, or keel prune its finished runs)",
            )
        pruned = 0
        for thread_id in dict.fromkeys(body.thread_ids):
            try:
                visible_thread(auth, keel_app, principal, thread_id, "delete")
                keel_app.delete_thread(thread_id)
            except (ThreadNotFound, ThreadBusy, InvalidId):
                continue
            pruned += 1
        return {"pruned_count": pruned}

    return router
