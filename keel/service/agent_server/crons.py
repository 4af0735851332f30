"""The Agent Server's crons: LangGraph's names for Keel's schedules (keel/runtime/schedules.py).

A cron is a schedule whose runs start from a cron expression in a timezone (`schedule`,
5 fields, or 6 with seconds first); its id is the schedule's id, its name `cron-<id>`. A
stateless cron (`POST /runs/crons`) starts each run on a thread of its own; a thread's cron
(`POST /threads/{thread_id}/runs/crons`) starts them on that thread, queued behind its
unfinished run. Each tick starts exactly one run, by the database's clock, with Keel's defaults
for what the protocol does not say: `catch_up` latest, `overlap` skip (or enqueue, the
`multitask_strategy` of a thread's cron when it says so).

With an `auth` section in langgraph.json, the project's handlers for the `crons` resource run
as on LangGraph's server: `create` may stamp the cron's `metadata` (an owner), and the filter a
handler returns hides the crons whose metadata does not match from `search`, `count`, `update`
and `delete` (404, as a cron that does not exist).

What Keel does not do with a cron is refused (422 `unsupported`), not ignored: `end_time`,
`webhook`, `config`, `context`, `interrupt_before`/`interrupt_after`, `on_run_completed`.

(No `from __future__ import annotations`: FastAPI resolves the dependency aliases below.)
"""

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Response
from pydantic import BaseModel, ConfigDict, Field

from keel.core.codec import contains
from keel.core.errors import ScheduleNotFound
from keel.runtime.app import App
from keel.service.agent_server.assistants import resolve_assistant
from keel.service.agent_server.authz import Filters, Gate, matches, visible_thread
from keel.service.agent_server.shapes import assistant_id_of, fields_of, iso, refuse_unknown
from keel.service.agent_server.shapes import selected as select_fields
from keel.service.auth import Principal
from keel.service.errors import Refused

UNSUPPORTED = ("end_time", "webhook", "config", "context", "interrupt_before", "interrupt_after")
MAX_PAGE = 1000


class CronCreate(BaseModel):
    model_config = ConfigDict(extra="allow")

    assistant_id: str
    schedule: str
    input: Any = None
    metadata: dict[str, Any] | None = None
    timezone: str | None = None
    enabled: bool | None = None
    multitask_strategy: str | None = None
    on_run_completed: str | None = None


class CronPatch(BaseModel):
    model_config = ConfigDict(extra="allow")

    schedule: str | None = None
    timezone: str | None = None
    input: Any = None
    metadata: dict[str, Any] | None = None
    enabled: bool | None = None


class CronSearch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    assistant_id: str | None = None
    thread_id: str | None = None
    enabled: bool | None = None
    metadata: dict[str, Any] | None = None
    limit: int = Field(10, ge=1, le=MAX_PAGE)
    offset: int = Field(0, ge=0)
    sort_by: (
        Literal[
            "cron_id",
            "assistant_id",
            "thread_id",
            "next_run_date",
            "end_time",
            "created_at",
            "updated_at",
        ]
        | None
    ) = None
    sort_order: Literal["asc", "desc"] | None = None
    select: list[str] | None = None


class CronCount(BaseModel):
    model_config = ConfigDict(extra="forbid")

    assistant_id: str | None = None
    thread_id: str | None = None
    metadata: dict[str, Any] | None = None


def cron_shape(schedule: dict[str, Any]) -> dict[str, Any]:
    """A schedule as the protocol's Cron."""
    assistant = assistant_id_of(schedule["workflow"])
    return {
        "cron_id": schedule["schedule_id"],
        "assistant_id": assistant,
        "thread_id": schedule["thread_id"],
        "on_run_completed": None,
        "end_time": None,
        "schedule": schedule["cron"] or f"every {schedule['every']:g} s",
        "timezone": schedule["timezone"],
        "created_at": iso(schedule["created_at"]),
        "updated_at": iso(schedule["updated_at"]),
        "payload": {"assistant_id": assistant, "input": schedule["input"]},
        "user_id": None,
        "next_run_date": iso(schedule["next_tick"]),
        "metadata": schedule["metadata"],
        "enabled": not schedule["paused"],
    }


CRON_FIELDS = fields_of(
    cron_shape,
    {
        "schedule_id": "",
        "workflow": "",
        "thread_id": None,
        "cron": "",
        "every": 0,
        "timezone": None,
        "created_at": 0,
        "updated_at": 0,
        "input": None,
        "next_tick": None,
        "metadata": None,
        "paused": False,
    },
)


def _refuse_unsupported(extra: dict[str, Any]) -> None:
    given = [k for k in UNSUPPORTED if extra.get(k) not in (None, {}, [])]
    if given:
        raise Refused(
            422,
            "unsupported",
            f"Keel's crons do not take {', '.join(given)} (docs/schedules.md)",
        )


def _matches(cron: dict[str, Any], metadata: dict[str, Any] | None, enabled: bool | None) -> bool:
    if enabled is not None and cron["enabled"] != enabled:
        return False
    return contains(cron["metadata"], metadata or {})


def crons_router(keel_app: App, auth: Gate) -> APIRouter:
    router = APIRouter(tags=["crons"])
    Reader = Annotated[Principal, Depends(auth.require("runs:read"))]
    Writer = Annotated[Principal, Depends(auth.require("runs:write"))]
    CronId = Annotated[str, Path(max_length=200, description="The cron's id.")]
    schedules = keel_app.schedules

    def create(principal: Principal, body: CronCreate, thread_id: str | None) -> dict[str, Any]:
        _refuse_unsupported({**(body.model_extra or {}), "on_run_completed": None})
        workflow, _ = resolve_assistant(keel_app, body.assistant_id)
        if thread_id is not None:
            visible_thread(auth, keel_app, principal, thread_id, "read")  # 404 thread_not_found
        value: dict[str, Any] = {
            "payload": {"assistant_id": body.assistant_id, "input": body.input},
            "schedule": body.schedule,
            "cron_id": None,
            "thread_id": thread_id,
            "user_id": None,
            "end_time": None,
            "metadata": dict(body.metadata or {}),
        }
        auth.check_sync(principal, "crons", "create", value)
        overlap = "enqueue" if body.multitask_strategy == "enqueue" else "skip"
        made = schedules.create(
            f"cron-{uuid.uuid4()}",
            workflow,
            cron=body.schedule,
            timezone=body.timezone or "UTC",
            input=body.input,
            thread_id=thread_id,
            metadata=value["metadata"],
            overlap=overlap,
            # The thread found above must still be there: deleted meanwhile, a cron on it would
            # make it again at its first tick (404, as LangGraph deletes a thread's crons).
            require_thread=thread_id is not None,
            paused=body.enabled is False,
        )
        return cron_shape(made)

    @router.post("/runs/crons")
    def create_cron(principal: Writer, body: CronCreate) -> dict[str, Any]:
        """A cron whose runs each start on a thread of their own."""
        return create(principal, body, None)

    @router.post("/threads/{thread_id}/runs/crons")
    def create_thread_cron(
        principal: Writer, body: CronCreate, thread_id: Annotated[str, Path(max_length=200)]
    ) -> dict[str, Any]:
        """A cron whose runs start on this thread."""
        return create(principal, body, thread_id)

    def found(
        assistant_id: str | None, thread_id: str | None, filters: Filters | None
    ) -> list[dict[str, Any]]:
        workflow = resolve_assistant(keel_app, assistant_id)[0] if assistant_id else None
        rows = schedules.list(workflow=workflow, thread_id=thread_id, limit=100_000)
        crons = (cron_shape(r) for r in rows if r["cron"] is not None)
        return [c for c in crons if matches(c["metadata"], filters)]

    def searched(principal: Principal, body: CronSearch | CronCount) -> list[dict[str, Any]]:
        value: dict[str, Any] = {"assistant_id": body.assistant_id, "thread_id": body.thread_id}
        if isinstance(body, CronSearch):
            value.update(limit=body.limit, offset=body.offset)
        filters = auth.check_sync(principal, "crons", "search", value)
        return found(body.assistant_id, body.thread_id, filters)

    def visible_cron(principal: Principal, cron_id: str, action: str, **asked: Any) -> None:
        """404 for a cron the handler's filter hides, as for one that does not exist."""
        filters = auth.check_sync(principal, "crons", action, {"cron_id": cron_id, **asked})
        cron = cron_shape(schedules.get(cron_id))
        if filters and not matches(cron["metadata"], filters):
            raise ScheduleNotFound(f"no schedule {cron_id!r}")

    @router.post("/runs/crons/search")
    def search_crons(principal: Reader, body: CronSearch) -> list[dict[str, Any]]:
        """Crons matching every filter given, a page of them."""
        refuse_unknown(body.select, CRON_FIELDS)
        crons = [c for c in searched(principal, body) if _matches(c, body.metadata, body.enabled)]
        key = body.sort_by or "created_at"
        crons.sort(key=lambda c: (c[key] is None, c[key] or ""), reverse=body.sort_order == "desc")
        page = crons[body.offset : body.offset + body.limit]
        return [select_fields(c, body.select) for c in page]

    @router.post("/runs/crons/count")
    def count_crons(principal: Reader, body: CronCount) -> int:
        return sum(_matches(c, body.metadata, None) for c in searched(principal, body))

    @router.patch("/runs/crons/{cron_id}")
    def update_cron(principal: Writer, cron_id: CronId, body: CronPatch) -> dict[str, Any]:
        """Change the cron's schedule, timezone, input, metadata or enabled."""
        _refuse_unsupported(body.model_extra or {})
        given = body.model_dump(exclude_unset=True, exclude=set(body.model_extra or {}))
        payload = {"input": given["input"]} if "input" in given else None
        visible_cron(
            principal,
            cron_id,
            "update",
            payload=payload,
            schedule=given.get("schedule"),
            metadata=given.get("metadata"),
        )
        change: dict[str, Any] = {}
        if "schedule" in given:
            change["cron"] = given["schedule"]
        if "enabled" in given:
            change["paused"] = not given["enabled"]
        for field in ("timezone", "input", "metadata"):
            if field in given:
                change[field] = given[field]
        return cron_shape(schedules.update(cron_id, **change))

    @router.delete("/runs/crons/{cron_id}", status_code=204)
    def delete_cron(principal: Writer, cron_id: CronId) -> Response:
        visible_cron(principal, cron_id, "delete")
        schedules.delete(cron_id)
        return Response(status_code=204)

    return router
