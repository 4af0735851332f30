"""Liveness and readiness, without authentication (load balancers and orchestrators ask).

`/healthz` says the process answers. `/readyz` says this process can serve Keel: the database
answers within a few seconds and its schema is the version this Keel needs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import JSONResponse

import keel
from keel.runtime.runtime import Runtime
from keel.service import models as m

READY_TIMEOUT = 5.0


class NotReady(Exception):
    pass


def _check_file(rt: Runtime) -> None:
    if rt.store.dialect == "sqlite":
        from keel.backends.sqlite import sqlite_path

        path = sqlite_path(rt.url)
        # Opening a missing file would create an empty database: a probe must not do that.
        if path != ":memory:" and not Path(path).exists():
            raise NotReady(f"no database file at {path}: run `keel migrate`")


async def _schema_version(rt: Runtime) -> int:
    await rt.connector.open()
    return await rt.store.schema_version()


def health_router(keel_app: keel.App) -> APIRouter:
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
        rt = keel_app.aio
        expected = rt.store.latest_version
        current: int | None = None
        try:
            _check_file(rt)
            current = rt.portal.call(asyncio.wait_for(_schema_version(rt), READY_TIMEOUT))
        except TimeoutError:
            reason = f"the database did not answer within {READY_TIMEOUT:g} s"
        except Exception as exc:
            text = str(exc).strip()
            reason = text.splitlines()[0] if text else type(exc).__name__
        else:
            if current == expected:
                return m.Ready(
                    status="ready",
                    database=rt.store.dialect,
                    schema_version=current,
                    expected_schema_version=expected,
                )
            hint = "run `keel migrate`" if current < expected else "upgrade Keel"
            reason = f"the schema is at version {current}, this Keel needs {expected}: {hint}"
        body = m.Ready(
            status="unavailable",
            database=rt.store.dialect,
            schema_version=current,
            expected_schema_version=expected,
            reason=reason,
        )
        return JSONResponse(body.model_dump(), status_code=503)

    return router
