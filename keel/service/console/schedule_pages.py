"""The console's schedules page: every schedule with its timing, policies and next and last
ticks (docs/schedules.md)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from keel.runtime.app import App
from keel.service.console.render import page
from keel.service.console.session import Sessions

LISTED = 500


def schedule_pages_router(keel_app: App, sessions: Sessions) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/ui/schedules", response_class=HTMLResponse)
    def schedules_page(request: Request) -> HTMLResponse:
        session = sessions.require(request, "runs:read")
        rows = keel_app.schedules.list(limit=LISTED)
        return page(
            request,
            "schedules.html",
            session=session,
            schedules=rows,
            now=keel_app.database_now(),
        )

    return router
