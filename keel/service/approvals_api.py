"""Keel's approvals API: open waits, one wait, and the answers to it (a decision, an in-doubt
effect's resolution); the first answer wins.

(No `from __future__ import annotations`: FastAPI resolves the dependency aliases below.)
"""

import functools
import re
from collections.abc import Callable
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Request

import keel
from keel.core.decisions import DecisionResult
from keel.core.errors import InvalidId, RunFinished, WrongWaitKind
from keel.service import models as m
from keel.service.auth import Authenticator, Principal
from keel.service.errors import (
    DECISION_CONFLICT,
    Refused,
    conflict_message,
    conflicts,
    finished_message,
    keel_message,
    keel_status,
)
from keel.service.responses import MAX_PAGE, NOT_FOUND, paging, refused_with, run_url

_APPROVAL_ID = re.compile(r"[a-z0-9][a-z0-9._-]*")


def approvals_router(keel_app: keel.App, auth: Authenticator) -> APIRouter:
    router = APIRouter(tags=["approvals"])
    Reader = Annotated[Principal, Depends(auth.require("approvals:read"))]
    Writer = Annotated[Principal, Depends(auth.require("approvals:write"))]
    ApprovalId = Annotated[str, Path(description="The approval's (wait's) id.", max_length=200)]
    IdempotencyKey = Annotated[
        str | None, Header(min_length=1, max_length=200, description="Deduplication key.")
    ]

    @router.get("/approvals", response_model=m.ApprovalPage)
    def list_approvals(
        request: Request,
        _: Reader,
        status: Annotated[
            Literal["pending"], Query(description="Only open waits are listed here.")
        ] = "pending",
        kind: Annotated[
            str, Query(max_length=50, description="approval, effect, interrupt, or all.")
        ] = "approval",
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> m.ApprovalPage:
        """Open waits, oldest deadline first (decided ones are on their run's page)."""
        want = offset + limit + 1
        fetch = want
        while True:
            rows = keel_app.pending_waits(limit=fetch)
            matching = [w for w in rows if kind == "all" or w["kind"] == kind]
            if len(matching) >= want or len(rows) < fetch:
                break
            fetch *= 4
        page = matching[offset : offset + limit + 1]
        return m.ApprovalPage(
            approvals=[m.approval_model(w, run_url(request, w["run_id"])) for w in page[:limit]],
            **paging(offset, limit, len(page)),
        )

    @router.get("/approvals/{approval_id}", response_model=m.Approval, responses=NOT_FOUND)
    def get_approval(approval_id: ApprovalId, request: Request, _: Reader) -> m.Approval:
        """One wait, open or decided."""
        wait = keel_app.get_wait(_checked(approval_id))
        return m.approval_model(wait, run_url(request, wait["run_id"]))

    @router.post(
        "/approvals/{approval_id}/decision",
        response_model=m.DecisionOut,
        responses=refused_with(
            "Another decision was recorded first (`decision_conflict`), or the run finished or "
            "the wait expired (`run_finished`); `approval` shows what was recorded instead."
        ),
    )
    def decide(
        approval_id: ApprovalId,
        body: m.DecisionIn,
        request: Request,
        principal: Writer,
        idempotency_key: IdempotencyKey = None,
    ) -> m.DecisionOut:
        """Approve or reject; the first decision wins. The same decision again is told it was
        recorded (200), another one is refused (409 `decision_conflict`)."""
        approve = body.decision == "approve"
        record = keel_app.approve if approve else keel_app.reject
        wanted = "approved" if approve else "rejected"
        return _answer(record, wanted, approval_id, body, request, principal, idempotency_key)

    @router.post(
        "/approvals/{approval_id}/resolution",
        response_model=m.DecisionOut,
        responses=refused_with("Not an in-doubt effect, finished, or answered otherwise first."),
    )
    def resolve_effect(
        approval_id: ApprovalId,
        body: m.ResolutionIn,
        request: Request,
        principal: Writer,
        idempotency_key: IdempotencyKey = None,
    ) -> m.DecisionOut:
        """Say whether an in-doubt effect reached the provider; the first answer wins."""
        record = functools.partial(
            keel_app.resolve_effect, performed=body.performed, result=body.result
        )
        wanted = "performed" if body.performed else "not_performed"
        return _answer(record, wanted, approval_id, body, request, principal, idempotency_key)

    def _answer(
        record: Callable[..., DecisionResult],
        wanted: str,
        approval_id: str,
        body: m.DecisionIn | m.ResolutionIn,
        request: Request,
        principal: Principal,
        idempotency_key: str | None,
    ) -> m.DecisionOut:
        """Record an answer (`wanted`, as the wait records it); the wait as it is now, whether
        this call recorded it. A refusal carries the wait too: the run finished, the wait takes
        another kind of answer, or another answer won (a conflict: the CLI's exit 1)."""
        wait = keel_app.get_wait(_checked(approval_id))
        url = run_url(request, wait["run_id"])
        action_id = idempotency_key or body.action_id
        try:
            result = record(
                wait["run_id"],
                wait_id=approval_id,
                by=body.by or principal.label,
                principal=principal.label,
                action_id=action_id,
                comment=body.comment,
                channel="http",
            )
        except (RunFinished, WrongWaitKind) as exc:
            status, code = keel_status(exc)
            now = m.approval_fields(keel_app.get_wait(approval_id), url)
            raise Refused(status, code, keel_message(exc), approval=now) from None
        fields = m.approval_fields(result.wait, url)
        retried = action_id is not None and result.wait.get("action_id") == action_id
        if result.finished and not result.recorded and not retried:
            # Decided, and the run finished since: the API's documented 409 `run_finished`
            # (the CLI's error), saying who decided; a retry of the winner is still a 200.
            raise Refused(
                *keel_status(RunFinished()), finished_message(result.wait), approval=fields
            )
        if conflicts(result, wanted, action_id):
            raise Refused(
                *DECISION_CONFLICT, conflict_message(result.wait, wanted), approval=fields
            )
        return m.DecisionOut(**fields, recorded=result.recorded)

    return router


def _checked(approval_id: str) -> str:
    if not _APPROVAL_ID.fullmatch(approval_id):
        raise InvalidId(
            f"approval_id {approval_id[:60]!r} may only contain lowercase letters, digits, '.', "
            "'_' and '-'"
        )
    return approval_id
