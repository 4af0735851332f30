"""Errors as HTTP answers, and the request-size limit.

Every error response has the same shape, `{"error": code, "message": sentence}` (plus the
recorded `approval` on a refused decision). Keel's exceptions are mapped in one table; a
decision that lost to another one, which Python returns rather than raises, is the one code
beside it (`decision_conflict`).
"""

from __future__ import annotations

import json
import logging
import sqlite3
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from keel.core import errors as core
from keel.core.codec import check_storable
from keel.core.decisions import DecisionResult
from keel.core.runs import job_exists_message
from keel.core.wait_model import WaitKind
from keel.service.auth import AuthError

log = logging.getLogger("keel.service")

API_PREFIX = "/v1"
"""Where Keel's own API lives: the root belongs to the LangGraph Agent Server protocol."""
MOVED = ("runs", "approvals", "effects")
"""The first segments of Keel's released API paths before they moved under `API_PREFIX` (its
thread endpoints were never released at the root, where the protocol's threads now live)."""

# Most specific first: InputTooLarge is an InvalidInput, both are ValueErrors; WrongWaitKind
# is a UsageError.
KEEL_ERRORS: tuple[tuple[type[core.KeelError], int, str], ...] = (
    (core.InputTooLarge, 413, "input_too_large"),
    (core.InvalidId, 400, "invalid_id"),
    (core.InvalidInput, 422, "invalid_input"),
    (core.UnknownWorkflow, 422, "unknown_workflow"),
    (core.RunNotFound, 404, "run_not_found"),
    (core.ThreadNotFound, 404, "thread_not_found"),
    (core.CheckpointNotFound, 404, "checkpoint_not_found"),
    (core.ScheduleNotFound, 404, "schedule_not_found"),
    (core.ScheduleExists, 409, "schedule_exists"),
    (core.WaitNotFound, 404, "approval_not_found"),
    (core.IntentNotFound, 404, "intent_not_found"),
    (core.IntentState, 409, "wrong_state"),
    (core.RunFinished, 409, "run_finished"),
    (core.JobExists, 409, "job_exists"),
    (core.ThreadBusy, 409, "thread_busy"),
    (core.DecisionConflict, 409, "decision_conflict"),
    (core.WorkflowVersionMismatch, 409, "version_mismatch"),
    (core.NoPendingWait, 409, "no_pending_wait"),
    (core.InvalidTransition, 409, "invalid_transition"),
    (core.LeaseLost, 409, "lease_lost"),
    (core.SchemaMismatch, 503, "schema_mismatch"),
    (core.WrongWaitKind, 409, "wrong_kind"),
    (core.WebhookRefused, 422, "webhook_refused"),
    (core.UsageError, 400, "bad_request"),
)
DECISION_CONFLICT = (409, "decision_conflict")
"""Another decision won the wait. Not an exception in Python (`recorded=False`, the recorded
decision beside it); the CLI exits 1, the API refuses it like the errors above."""


def conflicts(result: DecisionResult, wanted: str, action_id: str | None) -> bool:
    """Whether an answer that was not recorded lost to another one. The recorded answer again
    (a double click, a second approver agreeing), or a retry of the winning call (its action
    id), is told what was recorded instead."""
    if result.recorded or result.wait["decision"] == wanted:
        return False
    return action_id is None or result.wait.get("action_id") != action_id


def conflict_message(wait: dict[str, Any], wanted: str) -> str:
    return f"not {wanted.replace('_', ' ')}: {_decided(wait)} (the first decision wins)"


def finished_message(wait: dict[str, Any]) -> str:
    """A decision on a wait decided before its run finished: who decided it."""
    return f"run {wait['run_id']} has finished: {_decided(wait)}; it takes no more decisions"


def _decided(wait: dict[str, Any]) -> str:
    by = wait.get("decided_by") or "someone"
    via = f" via {wait['channel']}" if wait.get("channel") else ""
    done = str(wait["decision"]).replace("_", " ")
    return f"{wait['wait_id']} was already {done} by {by}{via}"


class Refused(Exception):
    """An answer the service decides itself (an unknown artifact), or a Keel error answered
    with the wait as recorded beside it (a refused decision)."""

    def __init__(
        self, status: int, code: str, message: str, *, approval: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.approval = approval


def problem(
    status: int,
    code: str,
    message: str,
    *,
    approval: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"error": code, "message": message}
    if approval is not None:
        body["approval"] = approval
    return JSONResponse(jsonable_encoder(body), status_code=status, headers=headers)


def keel_status(exc: core.KeelError) -> tuple[int, str]:
    for cls, status, code in KEEL_ERRORS:
        if isinstance(exc, cls):
            return status, code
    return 500, "keel_error"


def keel_message(exc: core.KeelError) -> str:
    """The exception's sentence, but in the API's words where the core's are Python's: an
    answer of the wrong kind names the endpoint, a refused submit the body's field."""
    if isinstance(exc, core.JobExists):
        return job_exists_message(
            exc.job_id, exc.runs[0], new='"if_exists": "new"', reuse='"if_exists": "reuse"'
        )
    if not isinstance(exc, core.WrongWaitKind):
        return str(exc)
    if exc.wait_kind in (WaitKind.OUTBOX, WaitKind.TIMER):  # nobody decides these
        return str(exc)
    if exc.with_value:
        return str(exc)  # a resume value for an approval or an effect: the core's words fit
    wait_id = exc.wait_id
    if exc.wait_kind == WaitKind.EFFECT:
        return (
            f"{wait_id} is an in-doubt effect, not an approval: tell Keel whether it reached the "
            "provider (`keel resolve-effect`), do not approve it"
        )
    return (
        f"{wait_id} is a {exc.wait_kind} wait, not an in-doubt effect: decide it at "
        f"{API_PREFIX}/approvals/{wait_id}/decision"
    )


def not_found_message(path: str, detail: str) -> str:
    """A 404 that no route answered: for one of Keel's API paths of before the move under
    `API_PREFIX`, where it lives now (a client written against the old paths learns why)."""
    first = path.lstrip("/").partition("/")[0]
    if first not in MOVED:
        return detail
    return f"{detail}: Keel's own API moved under {API_PREFIX} (try {API_PREFIX}{path})"


def _where(loc: Any) -> str:
    return ".".join(str(part) for part in loc)


def validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            # Its loc is (body, character offset): say that in words.
            reason = (err.get("ctx") or {}).get("error", "invalid JSON")
            offset = err.get("loc", ("body", "?"))[-1]
            parts.append(f"the body is not valid JSON: {reason} (at character {offset})")
            continue
        where = _where(err.get("loc", ()))
        parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else err.get("msg", ""))
    return "; ".join(parts) or "invalid request"


def install(api: FastAPI) -> None:
    async def on_keel(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, core.KeelError)
        status, code = keel_status(exc)
        if status >= 500:
            log.error("%s %s: %r", request.method, request.url.path, exc)
        approval = getattr(exc, "approval", None)
        response = problem(status, code, keel_message(exc), approval=approval)
        if isinstance(exc, core.InvalidInput) and exc.errors:
            response = JSONResponse(
                {"error": code, "message": str(exc), "errors": exc.errors}, status_code=status
            )
        return response

    async def on_refused(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Refused)
        return problem(exc.status, exc.code, exc.message, approval=exc.approval)

    async def on_auth(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, AuthError)
        return problem(exc.status, exc.code, exc.message, headers=exc.headers or None)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return problem(422, "invalid_request", validation_message(exc))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        codes = {404: "not_found", 405: "method_not_allowed"}
        message = str(exc.detail)
        if exc.status_code == 404 and "endpoint" not in request.scope:
            # No route matched (a route's own 404 has its endpoint in the scope).
            message = not_found_message(request.url.path, message)
        return problem(
            exc.status_code,
            codes.get(exc.status_code, "http_error"),
            message,
            headers=dict(exc.headers or {}),
        )

    async def on_database(request: Request, exc: Exception) -> JSONResponse:
        # The database is down or locked past its timeout: the request may be retried.
        log.warning("%s %s: database unavailable: %r", request.method, request.url.path, exc)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return problem(503, "database_unavailable", f"the database is unavailable: {first}")

    async def on_out_of_range(request: Request, exc: Exception) -> JSONResponse:
        # A number the client sent that the database cannot hold (an offset of 2**63): SQLite's
        # binding raises OverflowError, PostgreSQL "out of range". Nothing was written.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return problem(422, "invalid_input", f"a number in the request is out of range: {first}")

    api.add_exception_handler(OverflowError, on_out_of_range)
    api.add_exception_handler(psycopg.errors.NumericValueOutOfRange, on_out_of_range)
    api.add_exception_handler(core.KeelError, on_keel)
    api.add_exception_handler(Refused, on_refused)
    api.add_exception_handler(AuthError, on_auth)
    api.add_exception_handler(RequestValidationError, on_validation)
    api.add_exception_handler(StarletteHTTPException, on_http)
    api.add_exception_handler(psycopg.OperationalError, on_database)
    api.add_exception_handler(sqlite3.OperationalError, on_database)


class NoNul:
    """Refuse a NUL character (`%00`) in the path or query string with 400, for every route.

    No id, filter or name Keel keeps may hold one (PostgreSQL's text cannot): past the door a
    filter such as `?job_id=a%00b` reached the query and failed there (a 500 on PostgreSQL).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _has_nul(scope):
            await problem(
                400,
                "bad_request",
                "the request's path or query string holds a NUL character (%00), which no id, "
                "filter or name may contain",
            )(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _has_nul(scope: Scope) -> bool:
    query = bytes(scope.get("query_string", b"")).lower()
    return "\x00" in str(scope.get("path", "")) or b"%00" in query or b"\x00" in query


class BodyLimit:
    """Refuse request bodies over `max_bytes` with 413 before anything parses them.

    The declared Content-Length is checked first; the body is then read (at most `max_bytes`
    plus one chunk, whatever the client declared or did not) and handed on whole, so a chunked
    upload cannot slip past the limit.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            if declared <= DRAIN_BYTES:
                await _drain(receive)
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                if message.get("more_body", False):
                    await _drain(receive)
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body and not _takes(scope):
            await problem(
                415,
                "unsupported_media_type",
                "send the body as JSON (Content-Type: application/json), not "
                f"{_header(scope, b'content-type')}",
            )(scope, receive, send)
            return
        unstorable = _unstorable(scope, body)
        if unstorable is not None:
            await problem(422, "invalid_input", unstorable)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem(
            413, "body_too_large", f"the request body is larger than {self.max_bytes} bytes"
        )
        # The unread rest of the body makes the connection unusable for another request.
        response.headers["Connection"] = "close"
        await response(scope, receive, send)


DRAIN_BYTES = 1 << 20
"""Bytes of an oversized body read and dropped before its 413 goes out. A connection closed
with unread data is reset by the kernel, and the reset can reach the client before the 413
does (it then sees "connection reset", not why); past this, it is closed unread."""


async def _drain(receive: Receive) -> None:
    """Read and drop the rest of a request body, up to `DRAIN_BYTES`."""
    dropped = 0
    while dropped <= DRAIN_BYTES:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        dropped += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


FORM_PATHS = ("/slack/actions",)
"""Slack posts its actions form-encoded."""
FORM_PREFIXES = ("/ui/",)
"""The console's pages post HTML forms; every other body Keel reads is JSON."""
HOOKS = ("/hooks/",)
"""Inbound webhooks judge their bodies themselves, after the signature, in their own words
(keel.service.hooks)."""


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _takes(scope: Scope) -> bool:
    """Whether the request's body is in a type its endpoint reads (JSON, or a form: Slack's,
    the console's)."""
    path = str(scope.get("path", ""))
    if path.endswith(FORM_PATHS) or path.startswith(FORM_PREFIXES):
        return True
    given = _header(scope, b"content-type")
    if given is None:
        return True  # read as JSON, as FastAPI does
    kind = given.split(";")[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def _unstorable(scope: Scope, body: bytes) -> str | None:
    """Why a JSON body's value cannot be kept (nested past `codec.MAX_DEPTH`, or text that
    is not valid Unicode), checked once for every route: past the door such a value was
    stored and then broke every read of it, or failed its run in the worker. None when it
    can, or is no JSON at all (the endpoint says what is wrong with it)."""
    path = str(scope.get("path", ""))
    if not body or path.endswith(FORM_PATHS) or path.startswith(FORM_PREFIXES + HOOKS):
        return None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    try:
        check_storable(value, "the request body")
    except core.InvalidInput as exc:
        return str(exc)
    return None


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
