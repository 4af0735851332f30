"""The console's pages: runs, a run, approvals, workers, and the thread pages of thread_pages.py
(all reads; see actions.py for writes).

Like the API's endpoints these are plain `def`s: FastAPI runs them in its threadpool and they
call the App's blocking facade, which hands the work to the App's own loop.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

from keel.core.codec import loads
from keel.core.effects.outbox import public
from keel.core.errors import KeelError
from keel.core.lifecycle import Status
from keel.runtime.app import App
from keel.runtime.summary import summarize
from keel.service.console.render import page, pretty
from keel.service.console.schedule_pages import schedule_pages_router
from keel.service.console.session import Sessions
from keel.service.console.thread_pages import thread_pages_router
from keel.service.files import artifact_file, download

PAGE = 50
INLINE_LIMIT = 65536
TEXT_SUFFIXES = (".md", ".txt", ".json", ".csv", ".log", ".yaml", ".yml", ".html", ".xml")


def pages_router(keel_app: App, sessions: Sessions) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/ui", response_class=HTMLResponse)
    @router.get("/ui/runs", response_class=HTMLResponse)
    def runs_page(request: Request) -> HTMLResponse:
        session = sessions.require(request, "runs:read")
        q = request.query_params
        problems: list[str] = []
        filters = _run_filters(q, problems)
        offset = _int(q.get("offset"), 0, problems, "offset")
        rows = [] if problems else keel_app.browse_runs(**filters, limit=PAGE + 1, offset=offset)
        return page(
            request,
            "runs.html",
            status_code=400 if problems else 200,
            session=session,
            runs=rows[:PAGE],
            now=keel_app.database_now(),
            has_next=len(rows) > PAGE,
            offset=offset,
            page_size=PAGE,
            query=dict(q),
            problems=problems,
            statuses=[s.value for s in Status],
            workflows=_workflow_names(keel_app),
        )

    @router.get("/ui/runs/{run_id}", response_class=HTMLResponse)
    def run_page(run_id: str, request: Request) -> HTMLResponse:
        session = sessions.require(request, "runs:read")
        details = keel_app.get_run(run_id)
        summary = summarize(details, keel_app.database_now())
        return page(
            request,
            "run.html",
            session=session,
            run=details.run,
            summary=summary,
            timeline=details.timeline,
            failure=details.failure,
            effects=[_effect_view(e) for e in details.effects],
            intents=[_intent_view(i) for i in details.intents],
            waits=[_wait_view(w) for w in details.waits],
            notifications=details.notifications,
            artifacts=[_artifact_view(a) for a in details.artifacts],
            input=pretty(details.run["input"]),
            output=pretty(details.run["output"]) if details.run["output"] else None,
            last_event=details.timeline[-1]["event_id"] if details.timeline else 0,
        )

    @router.get("/ui/runs/{run_id}/live.json")
    def run_live(run_id: str, request: Request, after: int = 0) -> JSONResponse:
        """What changed since event `after`: the page's script polls this."""
        sessions.require(request, "runs:read")
        details = keel_app.get_run(run_id)
        new = [e for e in details.timeline if e["event_id"] > after]
        return JSONResponse(
            {
                "status": details.status,
                "decision": details.decision,
                "termination_reason": details.termination_reason,
                "last_event": details.timeline[-1]["event_id"] if details.timeline else 0,
                "events": [
                    {"event_id": e["event_id"], "at": e["at"], "kind": e["kind"]} for e in new
                ],
            },
            headers={"Cache-Control": "no-store"},
        )

    @router.get("/ui/runs/{run_id}/artifacts/{name}", response_model=None)
    def artifact(run_id: str, name: str, request: Request) -> FileResponse | JSONResponse:
        sessions.require(request, "runs:read")
        return download(artifact_file(keel_app, run_id, name), name, request)

    @router.get("/ui/approvals", response_class=HTMLResponse)
    def approvals_page(request: Request) -> HTMLResponse:
        session = sessions.require(request, "approvals:read")
        q = request.query_params
        problems: list[str] = []
        offset = _int(q.get("offset"), 0, problems, "offset")
        rows = keel_app.browse_pending_waits(kind="approval", limit=PAGE + 1, offset=offset)
        approvals = [_wait_view(w) for w in rows[:PAGE]]
        if (wanted := q.get("wait")) and all(a["wait_id"] != wanted for a in approvals):
            # A run's "decide in the inbox" link: its card first, whatever page it is on.
            approvals[:0] = _pending_approval(keel_app, wanted)
        # In-doubt effects need a person too; they are answered on their run's page.
        in_doubt = keel_app.browse_pending_waits(kind="effect", limit=PAGE)
        decided = None
        if wait_id := q.get("decided"):
            try:
                decided = _wait_view(keel_app.get_wait(wait_id))
            except KeelError:
                decided = None
        return page(
            request,
            "approvals.html",
            session=session,
            approvals=approvals,
            in_doubt=[_wait_view(w) for w in in_doubt],
            has_next=len(rows) > PAGE,
            offset=offset,
            page_size=PAGE,
            now=keel_app.database_now(),
            decided=decided,
            recorded=q.get("recorded") == "1",
            refused=q.get("refused"),
            problems=problems,
        )

    @router.get("/ui/workers", response_class=HTMLResponse)
    def workers_page(request: Request) -> HTMLResponse:
        session = sessions.require(request, "runs:read")
        held: dict[str, list[dict[str, Any]]] = {}
        for row in keel_app.running_runs():
            held.setdefault(row["lease_owner"] or "", []).append(row)
        workers = keel_app.workers()
        known = {w["worker_id"] for w in workers}
        return page(
            request,
            "workers.html",
            session=session,
            workers=workers,
            held=held,
            # Runs held by a worker that stopped heartbeating: a takeover is due.
            orphans={k: v for k, v in held.items() if k not in known},
            now=keel_app.database_now(),
        )

    router.include_router(thread_pages_router(keel_app, sessions))
    router.include_router(schedule_pages_router(keel_app, sessions))
    return router


# -- helpers ---------------------------------------------------------------------------------


def _workflow_names(keel_app: App) -> list[str]:
    registered: list[str] = keel_app.aio.runtime.workflows.keys()
    return sorted({key.rpartition("@")[0] for key in registered})


def _run_filters(q: Any, problems: list[str]) -> dict[str, Any]:
    status = q.get("status") or None
    if status is not None and status not in {s.value for s in Status}:
        problems.append(f"status {status!r} is not one of {', '.join(s.value for s in Status)}")
    return {
        "status": status,
        "workflow": q.get("workflow") or None,
        "job_prefix": (q.get("job") or "").strip() or None,
        "since": _time(q.get("since"), problems, "from"),
        "until": _time(q.get("until"), problems, "until"),
    }


def _time(text: str | None, problems: list[str], label: str) -> float | None:
    """A `datetime-local` value (or an ISO date), read as UTC."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        problems.append(f"{label} {text!r} is not a date and time like 2026-08-07T09:30")
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _int(text: str | None, default: int, problems: list[str], label: str) -> int:
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        problems.append(f"{label} {text!r} is not a whole number ≥ 0")
        return default
    return value


def _effect_view(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "result_text": pretty(row["result"]) if row["result"] else ""}


def _intent_view(row: dict[str, Any]) -> dict[str, Any]:
    shown = public(row)
    return {
        **shown,
        "args_text": pretty(shown["args"]),
        "result_text": pretty(shown["result"]) if shown["result"] is not None else "",
    }


def _pending_approval(keel_app: Any, wait_id: str) -> list[dict[str, Any]]:
    """The approval's card when it is still pending (none for another id or a decided one)."""
    try:
        row = keel_app.get_wait(wait_id)
    except KeelError:
        return []
    if row.get("kind") != "approval" or row.get("status") != "pending":
        return []
    return [_wait_view(row)]


def _wait_view(row: dict[str, Any]) -> dict[str, Any]:
    value = loads(row.get("value")) if row.get("value") else None
    payload = loads(row["payload"])
    return {
        **row,
        "payload_obj": payload,
        "payload_items": list(payload.items()) if isinstance(payload, dict) else None,
        "payload_text": pretty(payload),
        "approvers_list": loads(row["approvers"]) or [],
        "principal": value.get("principal") if isinstance(value, dict) else None,
        "escalation_level": row.get("escalation_level") or 0,
    }


def _artifact_view(info: Any) -> dict[str, Any]:
    text = None
    if info.size <= INLINE_LIMIT and info.name.lower().endswith(TEXT_SUFFIXES):
        try:
            raw = info.path.read_text(encoding="utf-8")
            text = pretty(raw) if info.name.lower().endswith(".json") else raw
        except (OSError, UnicodeDecodeError):
            text = None
    return {"name": info.name, "size": info.size, "text": text}
