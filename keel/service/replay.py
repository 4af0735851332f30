"""`POST /v1/runs/{id}/replay`: the run re-executed in a throwaway copy, its report returned.

A POST with the `runs:write` scope although nothing of the run is written: a replay runs the
workflow's nodes again (what they do outside effects, a model call, happens again), which is
not a read. The report is keel.runtime.replay's model as it is. Divergence is a 200 with
`diverged: true`; the run's missing workflow version is a 422, a step it lacks a 400.

(No `from __future__ import annotations`: FastAPI resolves the local aliases from real
annotation objects, as in keel/service/api.py.)
"""

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Path, Query

from keel.runtime.app import App
from keel.runtime.replay import ReplayReport
from keel.service.auth import Authenticator, Principal
from keel.service.models import Body as Strict


class NoOptions(Strict):
    """A replay's body: its options are the query's (`from`); none is taken here."""


def replay_router(keel_app: App, auth: Authenticator) -> APIRouter:
    router = APIRouter(tags=["runs"])
    Writer = Annotated[Principal, Depends(auth.require("runs:write"))]

    @router.post(
        "/runs/{run_id}/replay",
        response_model=ReplayReport,
        responses={404: {"description": "No such run."}},
    )
    def replay_run(
        run_id: Annotated[str, Path(description="The run's id.", max_length=200)],
        _: Writer,
        from_step: Annotated[
            int | None, Query(ge=0, alias="from", description="Replay from this step.")
        ] = None,
        body: Annotated[NoOptions | None, Body()] = None,
    ) -> ReplayReport:
        """Re-execute the run's graph in a throwaway copy (effects served from its ledger,
        approvals answered as recorded) and report the first step that diverged. No body, or
        `{}`: anything else (invalid JSON, a field) is 422, not silently ignored."""
        return keel_app.replay(run_id, from_step)

    return router
