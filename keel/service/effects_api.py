"""The HTTP API's outbox endpoints: list intents (dead letters, in doubt), retry, resolve.

The same operations as `keel effects list/retry/resolve` (docs/outbox.md); each action is a
timeline event of the intent's run. Reading takes `runs:read`, acting `runs:write`.

(No `from __future__ import annotations`: FastAPI resolves the dependency aliases below.)
"""

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query
from pydantic import BaseModel, Field

import keel
from keel.core.effects.outbox import IntentStatus
from keel.service.auth import Authenticator, Principal
from keel.service.models import Intent, Problem

NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": Problem, "description": "No such intent."},
    409: {"model": Problem, "description": "The intent's state does not take this action."},
}


class IntentPage(BaseModel):
    items: list[Intent]


class RetryIn(BaseModel):
    by: str | None = Field(None, max_length=200, description="Who retries (for the timeline).")


class IntentResolutionIn(BaseModel):
    performed: bool = Field(description="Whether the intent reached the provider.")
    result: Any = Field(None, description="The provider's result, when it was performed.")
    by: str | None = Field(None, max_length=200, description="Who answers; defaults to the token.")


def effects_router(keel_app: keel.App, auth: Authenticator) -> APIRouter:
    router = APIRouter(tags=["effects"])
    Reader = Annotated[Principal, Depends(auth.require("runs:read"))]
    Writer = Annotated[Principal, Depends(auth.require("runs:write"))]
    IntentId = Annotated[str, Path(description="The intent's id.", max_length=300)]

    @router.get("/effects", response_model=IntentPage)
    def list_effects(
        _: Reader,
        state: Annotated[IntentStatus | None, Query(description="Only this state.")] = None,
        run_id: Annotated[str | None, Query(max_length=200)] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 100,
    ) -> IntentPage:
        """Outbox intents, oldest first (`state=dead`: the dead letters)."""
        rows = keel_app.effect_intents(
            state=state.value if state else None, run_id=run_id, limit=limit
        )
        return IntentPage(items=[Intent(**r) for r in rows])

    @router.post("/effects/{intent_id}/retry", response_model=Intent, responses=NOT_FOUND)
    def retry_effect(
        intent_id: IntentId,
        principal: Writer,
        body: Annotated[RetryIn | None, Body()] = None,
    ) -> Intent:
        """Deliver a dead intent again, its attempts from zero (409 unless it is dead)."""
        by = (body.by if body else None) or principal.label
        return Intent(**keel_app.retry_intent(intent_id, by=by))

    @router.post("/effects/{intent_id}/resolution", response_model=Intent, responses=NOT_FOUND)
    def resolve_effect(intent_id: IntentId, body: IntentResolutionIn, principal: Writer) -> Intent:
        """Say whether an in-doubt (or dead) intent reached the provider: `performed` settles
        it delivered, never sent again; not performed delivers it now, under the same id."""
        row = keel_app.resolve_intent(
            intent_id, performed=body.performed, result=body.result, by=body.by or principal.label
        )
        return Intent(**row)

    return router
