"""The HTTP API's schedules (`/v1/schedules`): crons and intervals that start runs.

Each endpoint is one call of `app.schedules` (keel/runtime/schedules.py); docs/http.md,
"Schedules". Reading takes `runs:read`; creating, changing and triggering `runs:write`.

(No `from __future__ import annotations`: FastAPI resolves the dependency aliases below.)
"""

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from keel.runtime.app import App
from keel.service.auth import Authenticator, Principal


class NewSchedule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128)
    workflow: str = Field(min_length=1)
    cron: str | None = Field(None, description="5 fields, or 6 with seconds first.")
    every: float | None = Field(None, description="Seconds between ticks (at least 1).")
    timezone: str = "UTC"
    input: Any = None
    thread_id: str | None = None
    catch_up: Literal["latest", "all", "none"] = "latest"
    overlap: Literal["skip", "enqueue", "allow"] = "skip"
    metadata: dict[str, Any] | None = None
    paused: bool = False


class ScheduleChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cron: str | None = None
    every: float | None = None
    timezone: str | None = None
    input: Any = None
    catch_up: Literal["latest", "all", "none"] | None = None
    overlap: Literal["skip", "enqueue", "allow"] | None = None
    metadata: dict[str, Any] | None = None
    paused: bool | None = None


class Schedule(BaseModel):
    schedule_id: str
    name: str
    workflow: str
    cron: str | None
    every: float | None
    timezone: str
    input: Any
    thread_id: str | None
    catch_up: str
    overlap: str
    metadata: dict[str, Any]
    paused: bool
    declared: bool
    next_tick: float | None = Field(description="Epoch seconds; null while paused.")
    last_tick: float | None
    last_run_id: str | None
    queued_ticks: int
    created_at: float
    updated_at: float


class ScheduleList(BaseModel):
    schedules: list[Schedule]
    total: int


class Triggered(BaseModel):
    schedule: str
    tick: float
    run_id: str | None


def schedules_router(keel_app: App, auth: Authenticator) -> APIRouter:
    router = APIRouter(tags=["schedules"])
    Reader = Annotated[Principal, Depends(auth.require("runs:read"))]
    Writer = Annotated[Principal, Depends(auth.require("runs:write"))]
    Key = Annotated[str, Path(description="The schedule's name or id.")]
    schedules = keel_app.schedules

    @router.get("/schedules", response_model=ScheduleList)
    def list_schedules(
        _: Reader,
        workflow: Annotated[str | None, Query()] = None,
        thread_id: Annotated[str | None, Query()] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> dict[str, Any]:
        """Schedules by name, with their next and last ticks."""
        rows = schedules.list(workflow=workflow, thread_id=thread_id, limit=limit, offset=offset)
        total = schedules.count(workflow=workflow, thread_id=thread_id)
        return {"schedules": rows, "total": total}

    @router.post("/schedules", response_model=Schedule, status_code=201)
    def create_schedule(_: Writer, body: NewSchedule) -> dict[str, Any]:
        """A new schedule (409 `schedule_exists` if the name is taken)."""
        return schedules.create(**body.model_dump())

    @router.get("/schedules/{key}", response_model=Schedule)
    def get_schedule(_: Reader, key: Key) -> dict[str, Any]:
        return schedules.get(key)

    @router.patch("/schedules/{key}", response_model=Schedule)
    def update_schedule(_: Writer, key: Key, body: ScheduleChange) -> dict[str, Any]:
        """Change what the body gives (a new timing counts from now)."""
        given = body.model_dump(exclude_unset=True)
        return schedules.update(key, **given)

    @router.post("/schedules/{key}/pause", response_model=Schedule)
    def pause_schedule(_: Writer, key: Key) -> dict[str, Any]:
        return schedules.pause(key)

    @router.post("/schedules/{key}/resume", response_model=Schedule)
    def resume_schedule(_: Writer, key: Key) -> dict[str, Any]:
        return schedules.resume(key)

    @router.post("/schedules/{key}/trigger", response_model=Triggered, status_code=201)
    def trigger_schedule(_: Writer, key: Key) -> dict[str, Any]:
        """A run of the schedule now, beside its ticks."""
        tick = schedules.trigger(key)
        return {"schedule": tick.schedule, "tick": tick.tick, "run_id": tick.run_id}

    @router.delete("/schedules/{key}", status_code=204)
    def delete_schedule(_: Writer, key: Key) -> Response:
        """Delete the schedule (its runs stay)."""
        schedules.delete(key)
        return Response(status_code=204)

    return router
