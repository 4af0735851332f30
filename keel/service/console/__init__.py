"""The web console at /ui: runs, a run, approvals, workers (see docs/console.md).

Server-rendered (Jinja2), with a little plain JavaScript for live updates; every asset ships in
the package and is served from here, so the console works on a machine without internet.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from keel.core.errors import KeelError
from keel.runtime.app import App
from keel.service.auth import Authenticator
from keel.service.console.actions import actions_router
from keel.service.console.pages import pages_router
from keel.service.console.render import page
from keel.service.console.session import COOKIE, PATH, ConsoleRefusal, Sessions
from keel.service.errors import Refused, keel_message, keel_status, validation_message

Handler = Callable[[Request, Any], Any]


def install_console(api: FastAPI, keel_app: App, auth: Authenticator) -> None:
    """Add /ui to the service; its errors are pages for people, the API's stay JSON."""
    sessions = Sessions(auth)
    api.mount(
        "/ui/static",
        StaticFiles(packages=[("keel.service.console", "static")]),
        name="console-static",
    )
    api.include_router(actions_router(keel_app, sessions))
    api.include_router(pages_router(keel_app, sessions))

    async def on_refusal(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ConsoleRefusal)
        if exc.status == 401 and request.method == "GET":
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            redirect = RedirectResponse(f"/ui/login?next={quote(target)}", status_code=303)
            if COOKIE in request.cookies:
                # An unknown token (a rotated one): sent again, it would count as a failure.
                redirect.delete_cookie(COOKIE, path=PATH)
            return redirect
        answer = _error_page(request, sessions, exc.status, exc.message)
        if exc.retry_after is not None:
            answer.headers["Retry-After"] = str(exc.retry_after)
        return answer

    api.add_exception_handler(ConsoleRefusal, on_refusal)
    for kind in (KeelError, Refused, RequestValidationError):
        api.add_exception_handler(kind, _for_people(api.exception_handlers[kind], sessions))


def _for_people(api_handler: Handler, sessions: Sessions) -> Handler:
    async def handler(request: Request, exc: Exception) -> Response:
        if not request.url.path.startswith("/ui"):
            answer = api_handler(request, exc)
            return await answer if inspect.isawaitable(answer) else answer
        if isinstance(exc, Refused):
            return _error_page(request, sessions, exc.status, exc.message)
        if isinstance(exc, RequestValidationError):  # a form field too long, a bad number
            return _error_page(request, sessions, 422, validation_message(exc))
        assert isinstance(exc, KeelError)
        status, _ = keel_status(exc)
        return _error_page(request, sessions, status, keel_message(exc))

    return handler


def _error_page(request: Request, sessions: Sessions, status: int, message: str) -> Response:
    return page(
        request,
        "error.html",
        status_code=status,
        session=sessions.current(request),
        status=status,
        message=message,
    )


__all__ = ["install_console"]
