"""A thread's stream (`GET /threads/{thread_id}/stream`): the events of its runs, one after
another, as langgraph dev sends them.

Each run it follows is one run's stream (stream.py's Feed, so each event is said only once it
committed) framed the way langgraph-api frames it on a thread: `metadata` `{run_id, attempt}`
when the run starts, the run's events in the stream modes it was created with, then `metadata`
`{"status": "run_done", "run_id"}` when it ends or pauses on an interrupt (a failed run's
`error` comes first). A run that pauses and is resumed (in Keel the same run goes on) is
started again. The stream does not end on its own: it waits for the thread's next runs until
the client goes away (or the thread is deleted).

Without `Last-Event-ID` the stream starts now: the thread's unfinished runs from where they
stand, then every run admitted after. An event's id is `<run id>/<its id in the run's
stream>`: reconnecting with it resumes that run right after the event, then the runs admitted
after it; `-1` replays every run of the thread from its start. `stream_mode` is
`run_modes` (the default: everything above), `lifecycle` (the `metadata` and `error` events
only) or `state_update` (those and the runs' `values`).

(No `from __future__ import annotations`: FastAPI resolves the dependency aliases below.)
"""

import asyncio
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query
from sse_starlette.sse import EventSourceResponse, ServerSentEvent

from keel.core.codec import dumps
from keel.core.errors import KeelError
from keel.core.lifecycle import FINISHED, Status
from keel.core.store.base import Row
from keel.runtime.app import App
from keel.service.agent_server.authz import Gate, visible_thread
from keel.service.agent_server.positions import Event, Position
from keel.service.agent_server.run_rows import protocol_run
from keel.service.agent_server.stream import FIRST_POLL, LAST_POLL, Feed, Graphs, on_app
from keel.service.agent_server.stream_chunks import Messages
from keel.service.auth import Principal
from keel.service.errors import Refused

THREAD_MODES = ("run_modes", "lifecycle", "state_update")
DONE = "done"
"""The name in a `run_done` event's id."""
BATCH = 100
PING_SECONDS = 15


@dataclass
class _Followed:
    """A run the thread's stream follows."""

    seq: int
    feed: Feed
    modes: set[str]
    started: bool = False
    """Its `metadata` was sent (and no `run_done` since)."""
    messages: Messages | None = None
    parked: bool = False
    """It settled and its `run_done` was sent; it is followed again if it goes on."""
    out: list[ServerSentEvent] = field(default_factory=list)


class ThreadFeed:
    """The events of a thread's runs after a place in its stream (its coroutines run on the
    App's loop: `on_app`)."""

    def __init__(self, keel_app: App, graphs: Graphs, thread_id: str, wanted: set[str]) -> None:
        self.app = keel_app
        self.graphs = graphs
        self.thread_id = thread_id
        self.wanted = wanted
        self.seq = 0
        """The `thread_seq` of the last run admitted that this stream knows of."""
        self.followed: list[_Followed] = []
        self.gone = False
        """The thread was deleted: the stream is over."""

    async def open(self, resume: tuple[str, str, str] | None) -> None:
        """Start now (`resume` None), from the start (`("", "", "")`), or right after the event
        `(run id, its position, its name)`."""
        store = self.app.aio.runtime.store
        await self.app.aio.get_thread(self.thread_id)
        if resume is None:
            runs = await store.thread_runs_after(self.thread_id, 0, 1_000_000)
            self.seq = max((int(r["thread_seq"] or 0) for r in runs), default=0)
            for row in runs:
                if Status(row["status"]) not in FINISHED:
                    followed = await self._follow(row, None)
                    # A paused run's stream is over until it goes on.
                    followed.parked = Status(row["status"]) == Status.WAITING
                    followed.started = not followed.parked and row["status"] == Status.RUNNING
                    if followed.started:
                        followed.out.append(self._framed(followed.feed, followed.feed.metadata()))
            return
        run_id, position, name = resume
        if not run_id:
            return  # from the start: every run is new
        found = await store.get_run(run_id)
        if found is None or found.get("thread_id") != self.thread_id:
            raise Refused(400, "invalid_id", f"the thread has no run {run_id!r}")
        self.seq = int(found["thread_seq"] or 0)
        followed = await self._follow(found, Position.parse(position))
        followed.started = name != DONE
        followed.parked = name == DONE

    async def _follow(self, row: Row, after: Position | None) -> _Followed:
        feed = await Feed.open(self.app, self.graphs, str(row["run_id"]), after)
        modes = set(protocol_run(row)["kwargs"]["stream_mode"])
        followed = _Followed(int(row["thread_seq"] or 0), feed, modes)
        if "messages" in modes:
            followed.messages = Messages()
        self.followed.append(followed)
        return followed

    async def poll(self) -> list[ServerSentEvent]:
        """The events committed since the last poll."""
        store = self.app.aio.runtime.store
        fresh = await store.thread_runs_after(self.thread_id, self.seq, BATCH)
        for row in fresh:
            self.seq = int(row["thread_seq"] or 0)
            await self._follow(row, Position())  # a new run: from its start
        if not fresh and not self.followed:
            try:
                await self.app.aio.get_thread(self.thread_id)
            except KeelError:
                self.gone = True
        out: list[ServerSentEvent] = []
        for followed in list(self.followed):
            out += await self._poll_one(followed)
        return out

    async def _poll_one(self, followed: _Followed) -> list[ServerSentEvent]:
        feed = followed.feed
        # A run's start is placed before its events, wherever it was read from: its id is the
        # same in a live stream and in a replay.
        start = replace(feed.metadata(), position=feed.sent)
        events = await feed.poll()
        status = Status(feed.run["status"])
        out, followed.out = followed.out, []
        if followed.parked:
            if status == Status.WAITING or (status in FINISHED and not events):
                if status in FINISHED:
                    self.followed.remove(followed)
                return out
            followed.parked = False  # it goes on (a resume): a new start
        if not followed.started and (status != Status.QUEUED or events):
            followed.started = True
            out.append(self._framed(feed, start))
        for event in events:
            if self._wanted(followed, event.mode or event.event, bool(event.name)):
                out.append(self._framed(feed, event))
            told = followed.messages is not None and "run_modes" in self.wanted
            if told and event.mode == "messages-tuple":
                assert followed.messages is not None
                out += [self._framed(feed, p) for p in followed.messages.of(event)]
        if feed.settled:
            for event in feed.ending()[:-1]:  # its `error`; not its `end`
                out.append(self._framed(feed, event))
            done = {"status": "run_done", "run_id": feed.run_id}
            out.append(self._framed(feed, Event("metadata", done, feed.sent, DONE)))
            followed.started = False
            followed.parked = True
            if status in FINISHED:
                self.followed.remove(followed)
        return out

    def _wanted(self, followed: _Followed, mode: str, framing: bool) -> bool:
        if framing:
            return True
        if "run_modes" in self.wanted and mode in followed.modes:
            return True
        return "state_update" in self.wanted and mode == "values"

    def _framed(self, feed: Feed, event: Event) -> ServerSentEvent:
        return ServerSentEvent(
            data=dumps(event.data), event=event.event, id=f"{feed.run_id}/{event.id}"
        )


def parse_resume(last_event_id: str | None) -> tuple[str, str, str] | None:
    """Where a reconnect resumes: None (now), `("", "", "")` (`-1`: the start), or the run id,
    position and name of the event last received; Refused 400 for an id of no thread stream."""
    if not last_event_id:
        return None
    text = last_event_id.strip()
    if text == "-1":
        return ("", "", "")
    run_id, _, rest = text.partition("/")
    name = rest.rsplit("/", 1)[-1] if rest.count("/") >= 1 else ""
    try:
        Position.parse(rest)
    except ValueError:
        message = f"{text[:80]!r} is not an event id of a thread stream"
        raise Refused(400, "invalid_id", message) from None
    return run_id, rest, name if name.isalpha() else ""


def thread_stream_router(keel_app: App, auth: Gate) -> APIRouter:
    router = APIRouter(tags=["threads"])
    Reader = Annotated[Principal, Depends(auth.require("runs:read"))]
    ThreadId = Annotated[str, Path(description="The thread's id.", max_length=200)]
    graphs = Graphs(keel_app)

    @router.get("/threads/{thread_id}/stream", response_class=EventSourceResponse)
    def join_thread_stream(
        thread_id: ThreadId,
        principal: Reader,
        stream_mode: Annotated[list[str] | None, Query()] = None,
        last_event_id: Annotated[str | None, Header(max_length=300)] = None,
    ) -> EventSourceResponse:
        """The events of the thread's runs, one run after another, after `Last-Event-ID` (or
        from now), until the client goes away."""
        visible_thread(auth, keel_app, principal, thread_id, "read")
        wanted = {m for m in stream_mode or [] if m} or {"run_modes"}
        unknown = sorted(wanted - set(THREAD_MODES))
        if unknown:
            known = ", ".join(THREAD_MODES)
            raise Refused(422, "invalid_request", f"unknown stream_mode {unknown}: one of {known}")
        feed = ThreadFeed(keel_app, graphs, thread_id, wanted)
        keel_app.aio.runtime.portal.call(feed.open(parse_resume(last_event_id)))

        async def body() -> Any:
            pause = FIRST_POLL
            while not feed.gone:
                fresh = await on_app(keel_app, feed.poll())
                for event in fresh:
                    yield event
                pause = FIRST_POLL if fresh else min(pause * 1.5, LAST_POLL)
                await asyncio.sleep(pause)

        return EventSourceResponse(body(), ping=PING_SECONDS)

    return router
