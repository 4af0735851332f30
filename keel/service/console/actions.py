"""The console's forms: log in and out, decide an approval, resolve an in-doubt effect, answer a
thread's interrupt with a JSON value.

Every decision goes through the same `App.approve` / `App.reject` / `App.resolve_effect` /
`App.resume_thread` as the CLI, the HTTP API and Slack: the first decision wins, and a person
whose click came second is shown the decision that was recorded, never told theirs was. Each
decision records the name the person typed (the token's label when empty) and, for approvals and
effects, beside it the token's identity (`principal`).
"""

from __future__ import annotations

import hmac
import json
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import BaseModel, Field

from keel.core.errors import KeelError, NoPendingWait, RunFinished, WrongWaitKind
from keel.core.ids import validate_run_id
from keel.runtime.app import App
from keel.service.console.render import page
from keel.service.console.session import (
    COOKIE,
    LOGIN_COOKIE,
    PATH,
    ConsoleRefusal,
    Session,
    Sessions,
    home_of,
    new_login_nonce,
    secure,
)
from keel.service.console.thread_pages import thread_page

SESSION_MAX_AGE = 12 * 3600
MAX_ANSWER = 1_000_000
"""Characters of a JSON answer to an interrupt, as a run's input (`max_input_bytes`); the
service's body limit (`max_body_bytes`, 64 KiB by default) usually refuses a long one first."""
Short = Annotated[str, Form(max_length=200)]


class AnswerForm(BaseModel):
    """What every answer's form posts beside its verdict."""

    by: str = Field("", max_length=200)
    comment: str = Field("", max_length=10_000)
    csrf: str = Field("", max_length=200)
    action_id: str = Field("", max_length=200)


class DecisionForm(AnswerForm):
    decision: str = Field("", max_length=200)
    back: str = Field("/ui/approvals", max_length=2000)


class ResolutionForm(AnswerForm):
    performed: str = Field("", max_length=200)


class ResumeForm(BaseModel):
    """An answer to a thread's interrupt: a JSON value, the wait it answers, who gives it."""

    value: str = Field("", max_length=MAX_ANSWER)
    wait_id: str = Field("", max_length=200)
    by: str = Field("", max_length=200)
    csrf: str = Field("", max_length=200)
    action_id: str = Field("", max_length=200)


def actions_router(keel_app: App, sessions: Sessions) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/ui/login", response_class=HTMLResponse)
    def login_form(request: Request, next: str = "") -> HTMLResponse:
        nonce = new_login_nonce()
        response = page(
            request, "login.html", session=None, nonce=nonce, next=_local(next), error=None
        )
        _set_cookie(request, response, LOGIN_COOKIE, nonce, max_age=3600)
        return response

    @router.post("/ui/login", response_class=HTMLResponse)
    def login(
        request: Request,
        token: Annotated[str, Form(max_length=1000)] = "",
        csrf: Short = "",
        next: Annotated[str, Form(max_length=2000)] = "",
    ) -> Response:
        expected = request.cookies.get(LOGIN_COOKIE, "")
        if not expected or not hmac.compare_digest(csrf, expected):
            raise ConsoleRefusal(403, "the login form expired: reload the page and try again")
        principal = sessions.login(request, token.strip()) if token.strip() else None
        if principal is None:
            nonce = new_login_nonce()
            response = page(
                request,
                "login.html",
                status_code=401,
                session=None,
                nonce=nonce,
                next=_local(next),
                error="That token is not one this service knows.",
            )
            _set_cookie(request, response, LOGIN_COOKIE, nonce, max_age=3600)
            return response
        # Without a page asked for: the first one the token can read (an approver's inbox).
        home = home_of(principal) or "/ui/runs"  # none: /ui/runs says which scope it lacks
        redirect = RedirectResponse(_local(next) or home, status_code=303)
        _set_cookie(request, redirect, COOKIE, token.strip(), max_age=SESSION_MAX_AGE)
        redirect.delete_cookie(LOGIN_COOKIE, path=PATH)
        return redirect

    @router.post("/ui/logout")
    def logout(request: Request, csrf: Short = "") -> Response:
        session = sessions.current(request)
        if session is not None and not hmac.compare_digest(csrf, session.csrf):
            raise ConsoleRefusal(403, "this form's security token is wrong: reload and retry")
        redirect = RedirectResponse("/ui/login", status_code=303)
        redirect.delete_cookie(COOKIE, path=PATH)
        return redirect

    @router.post("/ui/approvals/{wait_id}/decision")
    def decide(wait_id: str, request: Request, form: Annotated[DecisionForm, Form()]) -> Response:
        session = sessions.require_action(request, "approvals:write", form.csrf)
        if form.decision not in ("approve", "reject"):
            raise ConsoleRefusal(400, "choose approve or reject")
        wait = keel_app.get_wait(wait_id)
        record = keel_app.approve if form.decision == "approve" else keel_app.reject
        query = {"decided": wait_id}
        try:
            result = record(wait["run_id"], **_answer(session, wait_id, form))
            query["recorded"] = "1" if result.recorded else "0"
        except (RunFinished, NoPendingWait) as exc:
            query["refused"] = str(exc)
        back = _local(form.back) or "/ui/approvals"
        return RedirectResponse(f"{back}?{urlencode(query)}", status_code=303)

    @router.post("/ui/runs/{run_id}/effects/{wait_id}/resolve")
    def resolve(
        run_id: str, wait_id: str, request: Request, form: Annotated[ResolutionForm, Form()]
    ) -> Response:
        session = sessions.require_action(request, "approvals:write", form.csrf)
        validate_run_id(run_id)
        if form.performed not in ("yes", "no"):
            raise ConsoleRefusal(400, "say whether the effect reached the provider: yes or no")
        try:
            result = keel_app.resolve_effect(
                run_id, performed=form.performed == "yes", **_answer(session, wait_id, form)
            )
            notice = "recorded" if result.recorded else "already"
        except (RunFinished, NoPendingWait) as exc:
            notice = "refused:" + str(exc)
        return RedirectResponse(
            f"/ui/runs/{quote(run_id)}?{urlencode({'resolved': wait_id, 'notice': notice})}",
            status_code=303,
        )

    @router.post("/ui/threads/{thread_id}/answer")
    def answer_thread(
        thread_id: str, request: Request, form: Annotated[ResumeForm, Form()]
    ) -> Response:
        session = sessions.require_action(request, "approvals:write", form.csrf)
        try:
            value = _json_answer(form.value)
        except ValueError as exc:
            # The page again, the text kept in its form: nothing recorded, nothing lost.
            draft = {"wait_id": form.wait_id, "value": form.value, "by": form.by, "error": str(exc)}
            return thread_page(keel_app, request, session, thread_id, status_code=400, draft=draft)
        wait_id = form.wait_id or None
        try:
            result = keel_app.resume_thread(
                thread_id,
                value,
                wait_id=wait_id,
                by=form.by.strip() or session.principal.label,
                principal=session.principal.label,
                action_id=form.action_id or None,
                channel="console",
            )
            wait_id = result.wait["wait_id"]
            notice = "recorded" if _ours(result.wait, result.recorded, form) else "already"
        except (RunFinished, NoPendingWait) as exc:
            # The run went on (or ended) since the page was drawn: if the wait it showed was
            # answered meanwhile, say by whom, else why nothing was recorded.
            notice = _settled(wait_id, form) or "refused:" + str(exc)
        except WrongWaitKind as exc:  # an approval or an effect: not answered with a value
            notice = "refused:" + str(exc)
        query = urlencode({"answered": wait_id or "", "notice": notice})
        return RedirectResponse(f"/ui/threads/{quote(thread_id)}?{query}", status_code=303)

    def _settled(wait_id: str | None, form: ResumeForm) -> str | None:
        if not wait_id:
            return None
        try:
            wait = keel_app.get_wait(wait_id)
        except KeelError:
            return None
        if wait["status"] != "decided":
            return None
        return "recorded" if _ours(wait, False, form) else "already"

    def _answer(session: Session, wait_id: str, form: AnswerForm) -> dict[str, Any]:
        """Who answers, and the rest every answer records. A wait that takes another kind of
        answer is the core's refusal, a 409 page (keel.service.errors)."""
        return {
            "wait_id": wait_id,
            "by": form.by.strip() or session.principal.label,
            "principal": session.principal.label,
            "action_id": form.action_id or None,
            "comment": form.comment.strip() or None,
            "channel": "console",
        }

    return router


def _ours(wait: dict[str, Any], recorded: bool, form: ResumeForm) -> bool:
    """Recorded by this call, or by this very form before (a double click, a retried post)."""
    return recorded or bool(form.action_id and wait.get("action_id") == form.action_id)


def _json_answer(text: str) -> Any:
    """The answer's JSON value; ValueError with a sentence for a person otherwise."""
    if not text.strip():
        raise ValueError("Write the answer as a JSON value: nothing was recorded.")

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    try:
        return json.loads(text, parse_constant=refuse)
    except RecursionError:
        raise ValueError("The answer is nested too deeply: nothing was recorded.") from None
    except ValueError as exc:
        raise ValueError(
            f"The answer is not JSON ({exc}): nothing was recorded. Text goes in double quotes, "
            'like "teal".'
        ) from None


def _local(target: str) -> str:
    """Only paths inside the console: a login link cannot send a person elsewhere ("" for any
    other, and for none: the caller's own page then)."""
    if not target.startswith("/ui") or target.startswith("//") or "\\" in target:
        return ""
    return target


def _set_cookie(
    request: Request, response: Response, name: str, value: str, *, max_age: int
) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=PATH,
        httponly=True,
        samesite="strict",
        secure=secure(request),
    )
