"""Slack for approvals, inbound: the endpoint that receives the Approve/Reject clicks.

`slack_router()` serves `POST /slack/actions`, Slack's interactivity URL: it verifies the
request's signature and timestamp with the signing secret, then records the click through the
same first-decision-wins path as the CLI and the HTTP API. It never runs the graph: a worker
resumes the run. The messages carrying the buttons are posted by
`keel.notifiers.slack.SlackNotifier`. See docs/slack.md for wiring a Slack app.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import JSONResponse
from slack_sdk.signature import Clock as SlackClock
from slack_sdk.signature import SignatureVerifier

from keel.core.codec import check_storable
from keel.core.errors import (
    InvalidId,
    InvalidInput,
    KeelError,
    RunFinished,
    UsageError,
    WaitNotFound,
    WrongWaitKind,
)
from keel.core.ids import whole_number
from keel.core.wait_model import escalation_targets
from keel.notifiers.slack import APPROVE, REJECT

if TYPE_CHECKING:
    from keel.runtime.app import App

log = logging.getLogger("keel.slack")

WINDOW = 300  # seconds; Slack's own recommendation for replayed requests
MAX_ACTION_BYTES = 64 * 1024
REFUSALS: tuple[tuple[type[KeelError], int, str], ...] = (
    (WaitNotFound, 404, "approval_not_found"),
    (RunFinished, 409, "run_finished"),
    (WrongWaitKind, 409, "not_an_approval"),  # a button on an in-doubt effect: none is posted
    (InvalidId, 400, "bad_request"),
    (UsageError, 400, "bad_request"),
)


# -- the interactivity endpoint --------------------------------------------------------------


class _Now(Protocol):
    def now(self) -> float: ...


class _VerifierClock(SlackClock):
    def __init__(self, clock: _Now) -> None:
        self._clock = clock

    def now(self) -> float:
        return self._clock.now()


class _Refusal(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def parse_action(body: bytes) -> dict[str, Any]:
    """The first action of a Slack `block_actions` form payload; _Refusal(400) if malformed."""
    try:
        form = parse_qs(body.decode("utf-8"), strict_parsing=True)
        (raw,) = form["payload"]
        payload = json.loads(raw)
    except (UnicodeDecodeError, ValueError, KeyError) as exc:
        raise _Refusal(
            400, "malformed_payload", f"expected a form field `payload`: {exc}"
        ) from None
    except RecursionError:  # nested past what the parser follows
        raise _Refusal(400, "malformed_payload", "the payload is nested too deeply") from None
    if not isinstance(payload, dict) or payload.get("type") != "block_actions":
        raise _Refusal(400, "malformed_payload", "expected a block_actions payload")
    actions, user = payload.get("actions"), payload.get("user")
    if not isinstance(actions, list) or not actions or not isinstance(actions[0], dict):
        raise _Refusal(400, "malformed_payload", "the payload has no actions")
    if not isinstance(user, dict) or not isinstance(user.get("id"), str) or not user["id"]:
        raise _Refusal(400, "malformed_payload", "the payload names no user")
    action = actions[0]
    if action.get("action_id") in (APPROVE, REJECT):
        value = action.get("value")
        if not isinstance(value, str) or not value:
            raise _Refusal(400, "malformed_payload", "the action carries no approval id")
    found = {
        "action_id": action.get("action_id"),
        "wait_id": action.get("value"),
        "user": user["id"],
        "click": str(action.get("action_ts") or payload.get("trigger_id") or ""),
    }
    try:
        # Looked up and recorded: a lone surrogate cannot be encoded, a NUL not stored.
        check_storable(found, "the action")
    except InvalidInput as exc:
        raise _Refusal(400, "malformed_payload", str(exc)) from None
    return found


def may_decide(wait: dict[str, Any], user: str) -> bool:
    """Whether Slack user `user` is among the wait's approvers or escalation targets (its
    `escalate_to`, with or without an `escalate_after` stage)."""
    named = [*_json_list(wait.get("approvers")), *escalation_targets(wait.get("schedule") or [])]
    return user in named or f"slack:{user}" in named


def _json_list(value: Any) -> list[Any]:
    parsed = json.loads(value) if isinstance(value, str) else value
    return parsed if isinstance(parsed, list) else []


def slack_router(
    keel_app: App,
    signing_secret: str,
    *,
    clock: _Now | None = None,
    restrict_to_approvers: bool = False,
) -> APIRouter:
    """`POST /slack/actions`: Slack's interactivity URL for Keel's Approve/Reject buttons.

    With `restrict_to_approvers`, only users named (by Slack user id) in the approval's
    `approvers` or `escalate_to` may decide; others get 403. Otherwise channel membership is
    the access control."""
    verifier = SignatureVerifier(signing_secret, clock=_VerifierClock(clock or SlackClock()))
    now = verifier.clock.now
    router = APIRouter(tags=["slack"])

    async def raw_body(request: Request) -> bytes:
        # Read at most one byte past the limit; the endpoint answers 413 for that.
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > MAX_ACTION_BYTES:
                break
        return bytes(data)

    def answer(status: int, body: dict[str, Any]) -> JSONResponse:
        return JSONResponse(body, status_code=status)

    def check(body: bytes, timestamp: str | None, signature: str | None) -> None:
        if not timestamp or not signature:
            raise _Refusal(
                400, "missing_headers", "X-Slack-Request-Timestamp and X-Slack-Signature needed"
            )
        sent_at = whole_number(timestamp, digits=12)
        if sent_at is None:
            raise _Refusal(400, "bad_timestamp", "X-Slack-Request-Timestamp is not a number")
        if abs(now() - sent_at) > WINDOW:
            raise _Refusal(401, "stale_request", "the request is older than five minutes")
        try:
            body.decode("utf-8")  # Slack sends form-encoded ASCII; the verifier would crash
        except UnicodeDecodeError:
            raise _Refusal(400, "malformed_payload", "the body is not UTF-8") from None
        if not verifier.is_valid(body, timestamp, signature):
            raise _Refusal(401, "bad_signature", "the signature does not match")

    def decide(action: dict[str, Any]) -> dict[str, Any]:
        wait = keel_app.get_wait(action["wait_id"])
        approve = action["action_id"] == APPROVE
        if restrict_to_approvers and not may_decide(wait, action["user"]):
            raise _Refusal(403, "not_an_approver", f"{action['user']} may not decide this")
        decide_fn = keel_app.approve if approve else keel_app.reject
        outcome = decide_fn(
            wait["run_id"],
            wait_id=wait["wait_id"],
            by=f"slack:{action['user']}",
            principal=f"slack:{action['user']}",
            action_id=f"slack:{action['click']}" if action["click"] else None,
            channel="slack",
        )
        # A click that lost to another decision is acknowledged too (200), not refused with the
        # API's 409, also once the run finished: Slack shows the person an error for any other
        # status, and the message's update (the "decided" notification) shows everyone the
        # decision that won.
        return {
            "ok": True,
            "recorded": outcome.recorded,
            "decision": outcome.decision,
            "approval_id": wait["wait_id"],
            "run_id": wait["run_id"],
        }

    # A plain `def`: it runs in the threadpool and blocks on the App's own event loop (the
    # App's async core is bound to that loop, not to uvicorn's), and it only records.
    @router.post("/slack/actions", summary="Slack interactivity (Approve/Reject buttons)")
    def slack_actions(
        body: bytes = Depends(raw_body),
        x_slack_request_timestamp: str | None = Header(default=None),
        x_slack_signature: str | None = Header(default=None),
    ) -> JSONResponse:
        try:
            if len(body) > MAX_ACTION_BYTES:
                raise _Refusal(413, "body_too_large", f"over {MAX_ACTION_BYTES} bytes")
            check(body, x_slack_request_timestamp, x_slack_signature)
            action = parse_action(body)
            if action["action_id"] not in (APPROVE, REJECT):
                return answer(200, {"ok": True, "ignored": "not a Keel action"})
            return answer(200, decide(action))
        except _Refusal as exc:
            if exc.status == 401:
                log.warning("refused a Slack request: %s", exc.message)
            return answer(exc.status, {"error": exc.code, "message": exc.message})
        except KeelError as exc:
            status, code = next(((s, c) for t, s, c in REFUSALS if isinstance(exc, t)), (409, ""))
            return answer(status, {"error": code or "refused", "message": str(exc)})

    return router
