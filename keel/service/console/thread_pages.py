"""The console's thread pages: threads searched by metadata and status, and one thread with its
runs in order, its state history and the interrupt it waits on (answered in actions.py).

A thread's state is read through its workflow's graph; a server that does not register that
workflow still shows the thread and its runs, and says why it cannot show the state.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from keel.core.codec import loads
from keel.core.errors import KeelError
from keel.core.ids import whole_number
from keel.core.waits import resume_value
from keel.runtime.app import App
from keel.runtime.snapshot_json import jsonable
from keel.service.console.render import page, pretty
from keel.service.console.session import Session, Sessions
from keel.service.errors import keel_message

PAGE = 50
HISTORY = 50
RUNS = 1000
STATUSES = ("idle", "busy", "interrupted", "error")
BADGE = {"idle": "s-idle", "busy": "s-running", "interrupted": "s-waiting", "error": "s-failed"}
"""A thread's status drawn with the run status it stands for (busy runs, an error fails)."""
_PAIR = re.compile(r'([^\s="]+)=("(?:[^"\\]|\\.)*"|[^\s"]\S*|)(?:\s+|$)')
"""One `key=value` of a metadata search: a value is a JSON string in quotes or has no space."""


def thread_pages_router(keel_app: App, sessions: Sessions) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/ui/threads", response_class=HTMLResponse)
    def threads_page(request: Request) -> HTMLResponse:
        session = sessions.require(request, "runs:read")
        q = request.query_params
        problems: list[str] = []
        metadata = parse_metadata(q.get("metadata", ""), problems)
        status = q.get("status") or None
        if status is not None and status not in STATUSES:
            problems.append(f"status {status!r} is not one of {', '.join(STATUSES)}")
        offset = _offset(q.get("offset"), problems)
        registered: list[str] = keel_app.aio.runtime.workflows.keys()
        rows = []
        if not problems:
            rows = keel_app.search_threads(
                metadata=metadata,
                workflow=q.get("workflow") or None,
                status=status,
                limit=PAGE + 1,
                offset=offset,
            )
        return page(
            request,
            "threads.html",
            status_code=400 if problems else 200,
            session=session,
            threads=rows[:PAGE],
            has_next=len(rows) > PAGE,
            offset=offset,
            page_size=PAGE,
            query=dict(q),
            problems=problems,
            statuses=STATUSES,
            badge=BADGE,
            workflows=sorted({key.rpartition("@")[0] for key in registered}),
        )

    @router.get("/ui/threads/{thread_id}", response_class=HTMLResponse)
    def thread_view(thread_id: str, request: Request) -> HTMLResponse:
        session = sessions.require(request, "runs:read")
        return thread_page(keel_app, request, session, thread_id)

    return router


def thread_page(
    keel_app: App,
    request: Request,
    session: Session,
    thread_id: str,
    *,
    status_code: int = 200,
    draft: dict[str, str] | None = None,
) -> HTMLResponse:
    """The thread's page; `draft` keeps an answer that was refused (its wait, text and error)
    in its form, so nothing a person typed is lost."""
    thread = keel_app.get_thread(thread_id)
    q = request.query_params
    runs = keel_app.thread_runs(thread_id, RUNS, newest=True)[::-1]  # its latest, in order
    active = keel_app.active_run(thread_id)
    waits = []
    if active is not None and active["status"] == "waiting":
        details = keel_app.get_run(str(active["run_id"]))
        waits = [_wait_view(w) for w in details.waits if w["status"] == "pending"]
    state, history, unreadable = None, [], None
    before = q.get("before") or None
    try:
        state = _state_view(keel_app.get_state(thread_id, q.get("at") or None))
        history = [
            _state_view(s)
            for s in keel_app.get_history(thread_id, limit=HISTORY + 1, before=before)
        ]
    except KeelError as exc:  # the workflow is not registered here, a checkpoint id unknown
        unreadable = keel_message(exc)
    answered = None
    if wait_id := q.get("answered"):
        try:
            answered = _wait_view(keel_app.get_wait(wait_id))
        except KeelError:
            answered = None
    return page(
        request,
        "thread.html",
        status_code=status_code,
        session=session,
        thread=thread,
        metadata_text=pretty(thread["metadata"]),
        badge=BADGE,
        runs=runs,
        runs_cut=len(runs) >= RUNS,
        active=active,
        waits=waits,
        state=state,
        at=q.get("at") or None,
        history=history[:HISTORY],
        older=history[HISTORY - 1]["checkpoint_id"] if len(history) > HISTORY else None,
        before=before,
        unreadable=unreadable,
        answered=answered,
        notice=q.get("notice", ""),
        draft=draft or {},
    )


def parse_metadata(text: str, problems: list[str]) -> dict[str, Any]:
    """`user=ann tier=2 note="two words"` as {"user": "ann", "tier": 2, "note": "two words"}:
    each value is read as JSON when it is JSON, else as text (so `tier="2"` is the text)."""
    found: dict[str, Any] = {}
    text = text.strip()
    at = 0
    while at < len(text):
        pair = _PAIR.match(text, at)
        if pair is None:
            problems.append(
                f"metadata {text[at:]!r} is not key=value (a value with spaces goes in double "
                'quotes: note="two words")'
            )
            break
        key, raw = pair.group(1), pair.group(2)
        try:
            found[key] = json.loads(raw)
        except ValueError:
            found[key] = raw
        at = pair.end()
    return found


def _offset(text: str | None, problems: list[str]) -> int:
    if not text:
        return 0
    offset = whole_number(text, digits=9)
    if offset is None:
        problems.append(f"offset {text!r} is not a whole number ≥ 0")
        return 0
    return offset


def _state_view(snapshot: Any) -> dict[str, Any]:
    """What the page shows of a StateSnapshot: its checkpoint, who wrote it, and its values."""
    metadata = snapshot.metadata or {}
    configurable = (snapshot.config or {}).get("configurable", {})
    return {
        "checkpoint_id": configurable.get("checkpoint_id"),
        "created_at": _moment(snapshot.created_at),
        "step": metadata.get("step"),
        "source": metadata.get("source"),
        "run_id": metadata.get("keel_run_id"),
        "next": list(snapshot.next),
        "interrupts": sum(len(t.interrupts) for t in snapshot.tasks),
        "values_text": pretty(jsonable(snapshot.values)),
    }


def _moment(iso: str | None) -> float | None:
    """LangGraph's ISO time of a checkpoint as the epoch seconds the console's pages show."""
    return datetime.fromisoformat(iso).timestamp() if iso else None


def _wait_view(row: dict[str, Any]) -> dict[str, Any]:
    answer = loads(row["value"]) if row.get("value") else None
    return {
        **row,
        "payload_text": pretty(row["payload"]),
        # What the graph's interrupt() returned (or returns): a resume's own value.
        "answer_text": pretty(resume_value(answer)) if answer is not None else None,
    }
