"""Inbound webhooks: `POST /hooks/{name}` for each `app.webhook(name, ...)` (docs/webhooks.md).

A delivery is refused, with a status and an error code and no run, when its hook is unknown
(404 `unknown_hook`), its body is over the hook's limit (413 `body_too_large`, told from
Content-Length before the body is read), its signature is missing, wrong or stale (401
`missing_signature`, `bad_signature`, `stale_timestamp`, `bad_timestamp`), or its body is not
JSON or cannot become a submit (400 `malformed_json`, `bad_payload`). A verified delivery
admits its run once per delivery id: the first answers 202 with the run, a replay 200 with the
same run (`duplicate: true`). Neither the secret nor the signature is ever logged.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from keel.core.codec import check_storable
from keel.core.errors import InvalidId, InvalidInput, UnknownWorkflow, UsageError
from keel.core.ids import whole_number
from keel.core.webhooks import BadSignature
from keel.runtime.inbound import BadPayload, InboundHook

if TYPE_CHECKING:
    from keel.runtime.app import App

log = logging.getLogger("keel.service.hooks")


class _Refusal(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _refused(name: str, refusal: _Refusal) -> JSONResponse:
    # The reason only: never a header (the signature) nor the secret.
    log.warning(
        "webhook %s: refused a delivery (%s): %s",
        name,
        refusal.code,
        refusal.message,
        extra={"event": "webhook.refused", "reason": refusal.code},
    )
    return JSONResponse(
        {"error": refusal.code, "message": refusal.message}, status_code=refusal.status
    )


def hooks_router(keel_app: App) -> APIRouter:
    """`POST /hooks/{name}`: the inbound webhooks `keel_app` declares (`app.webhook`)."""
    router = APIRouter(tags=["webhooks"])

    async def capped_body(request: Request, name: str) -> bytes | _Refusal:
        hook = keel_app.hooks.get(name)
        if hook is None:
            return _Refusal(404, "unknown_hook", f"no webhook {name!r} is declared")
        declared = whole_number(request.headers.get("content-length"))
        if declared is not None and declared > hook.max_bytes:
            return _Refusal(413, "body_too_large", f"over {hook.max_bytes} bytes")
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > hook.max_bytes:  # a chunked body is cut off here, not read whole
                return _Refusal(413, "body_too_large", f"over {hook.max_bytes} bytes")
        return bytes(data)

    # A plain `def`: it runs in the threadpool and blocks on the App's own event loop.
    @router.post("/hooks/{name}", summary="An inbound webhook (app.webhook)")
    def receive(
        name: str,
        request: Request,
        body: bytes | _Refusal = Depends(capped_body),  # noqa: B008 (FastAPI's own idiom)
    ) -> JSONResponse:
        try:
            if isinstance(body, _Refusal):
                raise body
            hook = keel_app.hooks[name]
            return _accept(keel_app, hook, dict(request.headers), body)
        except _Refusal as refusal:
            return _refused(name, refusal)

    return router


def _accept(keel_app: App, hook: InboundHook, headers: dict[str, str], body: bytes) -> JSONResponse:
    try:
        verified = hook.verified(headers, body, now=time.time())
    except BadSignature as exc:
        raise _Refusal(401, exc.code, str(exc)) from None
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _Refusal(400, "malformed_json", f"the body is not JSON: {exc!r:.200}") from None
    try:
        check_storable(payload, "the payload")
        delivery_id = hook.delivery_id(verified, payload, body)
        job_id = hook.job_of(payload, delivery_id)
        run_input = hook.input_of(payload)
    except (BadPayload, InvalidId, InvalidInput) as exc:
        raise _Refusal(400, "bad_payload", str(exc)) from None
    try:
        run_id, duplicate = keel_app.accept_hook_delivery(
            hook.name, delivery_id, workflow=hook.workflow, job_id=job_id, input=run_input
        )
    except UnknownWorkflow as exc:
        # The server's mistake, not the sender's: a 5xx, so a sender that retries comes back.
        raise _Refusal(503, "unknown_workflow", str(exc)) from None
    except (InvalidInput, UsageError) as exc:
        raise _Refusal(400, "bad_payload", str(exc)) from None
    answer: dict[str, Any] = {
        "ok": True,
        "run_id": run_id,
        "job_id": job_id,
        "delivery_id": delivery_id,
        "duplicate": duplicate,
    }
    return JSONResponse(answer, status_code=200 if duplicate else 202)
