"""Live events: `GET /v1/runs/{id}/events` streams a run's timeline as Server-Sent Events.

Each event's SSE `id` is its timeline id. A client (or a browser's EventSource, on its own)
that reconnects with `Last-Event-ID: N` (or `?after=N`) gets every event after N and then the
new ones as they commit: ids grow in commit order on both backends (see the `events_after`
query), so a resumed stream has no gap and no repeat. New events are found by polling the
store every `poll` seconds (250 ms), the same on SQLite and PostgreSQL. When the run has
finished and every event was sent, the stream ends with an `end` event (`data` is the final
status), so a client knows to stop rather than reconnect.

(No `from __future__ import annotations`: FastAPI resolves the local `Reader` alias from a
real annotation object, as in keel/service/api.py.)
"""

from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Header, Path, Query
from sse_starlette.sse import EventSourceResponse, ServerSentEvent

from keel.core.codec import dumps
from keel.core.ids import whole_number
from keel.runtime.app import App
from keel.runtime.follow import Cursor, event_json
from keel.service.auth import Authenticator, Principal
from keel.service.errors import Refused

POLL_SECONDS = 0.25
PING_SECONDS = 15
LAST_ID = 10**18 - 1
"""The largest event id a client may name (`after`, as `Last-Event-ID`: 18 digits), so that it
fits the database's 64-bit integer: past it the stream had started (200) before the query
failed, and the connection dropped."""


def events_router(keel_app: App, auth: Authenticator, *, poll: float = POLL_SECONDS) -> APIRouter:
    router = APIRouter(tags=["runs"])
    Reader = Annotated[Principal, Depends(auth.require("runs:read"))]

    @router.get(
        "/runs/{run_id}/events",
        response_class=EventSourceResponse,
        responses={
            200: {"description": "The run's timeline, then live events, as text/event-stream."},
            400: {"description": "A malformed id or Last-Event-ID."},
            404: {"description": "No such run."},
            422: {"description": "`after` is not an event id (0 to 10^18 - 1)."},
        },
    )
    def run_events(
        run_id: Annotated[str, Path(description="The run's id.", max_length=200)],
        _: Reader,
        after: Annotated[
            int | None,
            Query(ge=0, le=LAST_ID, description="Start after this event id (0: the start)."),
        ] = None,
        last_event_id: Annotated[str | None, Header(max_length=40)] = None,
    ) -> EventSourceResponse:
        """Server-Sent Events: every timeline event after `Last-Event-ID` (or `after`), then
        new ones as they commit, until the run has finished (`event: end`)."""
        keel_app.run_status(run_id)  # 404 before the stream starts
        start = after or 0
        if last_event_id is not None:
            seen = whole_number(last_event_id)
            if seen is None:
                raise Refused(400, "invalid_id", f"Last-Event-ID {last_event_id!r} is not an id")
            start = max(start, seen)
        return EventSourceResponse(_stream(keel_app, run_id, start, poll), ping=PING_SECONDS)

    return router


async def _stream(keel_app: App, run_id: str, after: int, poll: float) -> AsyncIterator[Any]:
    cursor = Cursor(keel_app, run_id, after)
    while True:
        rows, over = await anyio.to_thread.run_sync(cursor.poll)
        for row in rows:
            yield ServerSentEvent(
                data=dumps(event_json(row)), event=row["kind"], id=str(row["event_id"])
            )
        if over:
            yield ServerSentEvent(data=dumps({"status": cursor.status}), event="end")
            return
        if not rows:
            await anyio.sleep(poll)
