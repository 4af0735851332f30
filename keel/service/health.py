"""Liveness and readiness, without authentication (load balancers and orchestrators ask).

`/healthz` says the process answers. `/readyz` says this process can serve Keel: the database
answers within a few seconds and its schema is the version this Keel needs.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from keel.runtime.app import App
from keel.runtime.preflight import schema_state
from keel.service import models as m

READY_TIMEOUT = 5.0


def health_router(keel_app: App) -> APIRouter:
    router = APIRouter(tags=["health"])

    @router.get("/healthz", response_model=m.Health)
    async def healthz() -> m.Health:
        """The process is up (touches nothing else)."""
        return m.Health(status="ok")

    @router.get(
        "/readyz",
        response_model=m.Ready,
        responses={503: {"model": m.Ready, "description": "Not ready; `reason` says why."}},
    )
    def readyz() -> m.Ready | JSONResponse:
        """The database is reachable and its schema is the version this Keel needs."""
        state = schema_state(keel_app, READY_TIMEOUT)
        body = m.Ready(
            status="ready" if state.ready else "unavailable",
            database=state.database,
            schema_version=state.current,
            expected_schema_version=state.expected,
            reason=state.reason,
        )
        if state.ready:
            return body
        return JSONResponse(body.model_dump(), status_code=503)

    return router
