"""The Agent Server's runs: on a thread and stateless, in the background, waited for, streamed.

Each run is a Keel run on a thread, admitted by `App.submit` before any answer leaves: a run
whose `create` was answered is durable (a kill -9 of every process right after loses nothing).
Workers execute it; a request never runs a graph. Where the protocol and Keel differ:

- `command.resume` answers the pause of the thread's waiting run: the same Keel run goes on
  (LangGraph starts a new run). The answer is that run, `pending` again; a second answer to the
  same pause is refused (409 `decision_conflict`).
- Streams (stream.py): `values` and `updates` told from committed steps; `messages`,
  `custom`, `tasks`, `checkpoints`, `debug` captured by the worker; `events` accepted and sends
  nothing. `after_seconds` delays the run (admitted at once, `pending`, claimed once the
  database's clock reaches it); `webhook` is told when the run ends (docs/webhooks.md);
  `durability` is accepted (Keel checkpoints every step durably), `stream_subgraphs` adds
  subgraphs' namespaced events.
- `interrupt_before`/`interrupt_after` pause the run as LangGraph does (keel.langgraph.
  static_interrupts): it reads `success`, its thread `interrupted` with `next` set; a run
  without input or command, or a `command.resume`, lets it go on (the same Keel run).
- An assistant's config and context are the run's, its own merged over them.
- Cancelling with `action=rollback` ends the run `interrupted` and discards its checkpoints;
  the run itself stays on record (termination reason `rolled_back`), as do its effects.
- Deleting a run removes a finished run's row with its timeline, effect ledger and waits (as
  `keel prune` would); the thread's checkpoints, and so its state, stay. An unfinished run is
  refused (409 `run_unfinished`).
- A stateless run gets a thread of its own; with `on_completion: delete` (the default) the
  thread goes once the run finished, by the server that admitted it (a restart meanwhile keeps
  the thread).

How a request becomes a Keel run (the assistant's config, the thread's metadata, the
protocol's options kept under `keel_kwargs`) is run_admission.py's.

(No `from __future__ import annotations`: FastAPI resolves the dependency aliases below.)
"""

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse

from keel.core.errors import InvalidInput, KeelError, RunStillGoing, ThreadNotFound
from keel.core.lifecycle import FINISHED, Status
from keel.core.store.base import Row
from keel.langgraph.inputs import check_input
from keel.runtime.app import App
from keel.service.agent_server import stream
from keel.service.agent_server.assistant_book import resolve_for_run
from keel.service.agent_server.authz import Gate, visible_thread
from keel.service.agent_server.run_admission import admit as admit_run
from keel.service.agent_server.run_bodies import RunIn, in_thread, paused_statically
from keel.service.agent_server.run_rows import (
    RUN_FIELDS,
    delete_finished_run,
    delete_thread_after,
    protocol_run,
    roll_back,
    run_of_thread,
)
from keel.service.agent_server.shapes import refuse_unknown, run_status, selected
from keel.service.agent_server.stream import Feed, Graphs, Position, on_app
from keel.service.auth import Principal
from keel.service.errors import Refused

log = logging.getLogger("keel.service")

WAIT_SLICE = 5.0
"""Seconds between checks that a waiting request's client is still there."""
PING_SECONDS = 15
MAX_LIST = 1000


def runs_router(keel_app: App, auth: Gate) -> APIRouter:
    router = APIRouter(tags=["runs"])
    Reader = Annotated[Principal, Depends(auth.require("runs:read"))]
    Writer = Annotated[Principal, Depends(auth.require("runs:write"))]
    ThreadId = Annotated[str, Path(description="The thread's id.", max_length=200)]
    RunId = Annotated[str, Path(description="The run's id.", max_length=200)]
    graphs = Graphs(keel_app)
    cleaning: set[concurrent.futures.Future[None]] = set()

    def call(work: Coroutine[Any, Any, Any]) -> Any:
        return keel_app.aio.runtime.portal.call(work)

    # -- admission --------------------------------------------------------------------------

    def admit(
        body: RunIn, thread_id: str | None, principal: Principal
    ) -> tuple[Row, str, list[str]]:
        return admit_run(keel_app, auth, body, thread_id, principal)

    def on_thread(principal: Principal, thread_id: str, run_id: str, action: str = "read") -> Row:
        """The run, if it is one of the thread's and the auth handler lets `principal` do
        `action` on the thread (404 otherwise)."""
        if auth.custom:
            visible_thread(auth, keel_app, principal, thread_id, action, run_id=run_id)
        # The run's row alone (not its timeline, effects, waits: `App.get_run`), with the
        # thread's existence, in one call: a client polls this.
        return call(run_of_thread(keel_app.aio, thread_id, run_id, thread=not auth.custom))

    shape = protocol_run

    def locations(row: Row, stateless: bool, tail: str) -> dict[str, str]:
        run_path = f"/threads/{row.get('thread_id') or row['run_id']}/runs/{row['run_id']}"
        headers = {"Content-Location": f"/runs/{row['run_id']}" if stateless else run_path}
        if tail:
            headers["Location"] = f"{run_path}/{tail}"
        return headers

    # -- stateless runs' threads ------------------------------------------------------------

    def clean_now(body: RunIn, row: Row) -> None:
        """Delete a stateless run's thread now that the run was waited for."""
        if (body.on_completion or "delete") == "delete":
            call(delete_thread_after(keel_app.aio, row["run_id"], row["thread_id"], wait=False))

    def clean_later(body: RunIn, row: Row) -> None:
        """Delete a stateless run's thread once the run has finished (a task of this server's)."""
        if (body.on_completion or "delete") != "delete":
            return
        work = delete_thread_after(keel_app.aio, row["run_id"], row["thread_id"], wait=True)
        task = asyncio.run_coroutine_threadsafe(work, keel_app.aio.runtime.portal.loop)
        cleaning.add(task)
        task.add_done_callback(cleaning.discard)

    def joined(principal: Principal, thread_id: str, run_id: str, cancel: bool) -> Row:
        """The run a join reads; one that cancels it when the client goes (`cancel`) needs
        what a cancel needs."""
        if cancel and not auth.custom and "runs:write" not in principal.scopes:
            raise Refused(403, "forbidden", "cancel_on_disconnect cancels: it needs runs:write")
        return on_thread(principal, thread_id, run_id, "update" if cancel else "read")

    # -- outcomes ---------------------------------------------------------------------------

    async def settle(request: Request, run_id: str, cancel: bool) -> Row:
        """The run once it has ended or paused, polled in slices while the client is there;
        with `cancel`, a client gone cancels the run (`on_disconnect="cancel"`)."""
        while True:
            try:
                return await on_app(keel_app, keel_app.aio.wait(run_id, timeout=WAIT_SLICE))
            except RunStillGoing:
                if await request.is_disconnected():
                    if cancel:
                        await cancel_gone(run_id)
                    raise Refused(499, "client_gone", "the client went away") from None

    async def cancel_gone(run_id: str) -> None:
        try:
            await on_app(keel_app, keel_app.aio.cancel(run_id, by="client disconnected"))
        except KeelError as exc:
            log.info("run %s: not cancelled on disconnect: %s", run_id, exc)

    async def outcome(
        request: Request, row: Row, headers: dict[str, str], *, cancel: bool = False
    ) -> Response:
        settled = await settle(request, str(row["run_id"]), cancel)
        body = await on_app(keel_app, stream.outcome(keel_app, graphs, settled))
        return _json(body, headers)

    def feed(run_id: str, after: Position | None) -> Feed:
        return call(Feed.open(keel_app, graphs, run_id, after))

    def sse(
        events_of: Feed,
        modes: list[str],
        headers: dict[str, str],
        *,
        metadata: bool,
        cancel: bool,
        then: Callable[[], None] | None = None,
        gone: Callable[[], None] | None = None,
    ) -> EventSourceResponse:
        """The feed's events as SSE; `then` once the stream ended, `gone` if the client went
        away first (after the run's cancel, with `cancel`)."""
        run_id = events_of.run_id

        def on_disconnect() -> None:
            if cancel:
                try:
                    keel_app.cancel(run_id, by="client disconnected")
                except KeelError as exc:
                    log.info("run %s: not cancelled on disconnect: %s", run_id, exc)
            if gone is not None:
                gone()

        async def body() -> Any:
            async for event in stream.events(
                keel_app, events_of, modes, metadata=metadata, on_disconnect=on_disconnect
            ):
                yield event
            if then is not None:
                await asyncio.to_thread(then)

        return EventSourceResponse(body(), headers=headers, ping=PING_SECONDS)

    def stream_new(body: RunIn, thread_id: str | None, principal: Principal) -> EventSourceResponse:
        """Admit a run and stream it from its start (a resume: from where it paused)."""
        resume = body.command is not None and "resume" in body.command
        if body.command is None and body.input is None and thread_id is not None:
            # Continuing from a breakpoint is a resume too (`admit` makes it one): its stream
            # goes on from where the paused run's stands, not from the run's start.
            try:
                resume = paused_statically(keel_app, keel_app.get_thread(thread_id))
            except ThreadNotFound:
                resume = False
        waiting = None
        if resume and thread_id is not None:
            visible_thread(auth, keel_app, principal, thread_id, "read")
            # Where the paused run's events stand, read before the answer lets it go on.
            active = keel_app.active_run(thread_id)
            if active is not None:
                waiting = feed(str(active["run_id"]), None)
        row, _thread, modes = admit(body, thread_id, principal)
        if waiting is not None and waiting.run_id == row["run_id"]:
            events_of = waiting
        else:
            # A resume no run waited for is a new run (paused_without_run): from its start.
            events_of = feed(str(row["run_id"]), None if waiting is not None else Position())
        stateless = thread_id is None
        return sse(
            events_of,
            modes,
            locations(row, stateless, "stream"),
            metadata=True,
            cancel=body.on_disconnect == "cancel",
            # A stateless run's thread goes once its stream read it all.
            then=(lambda: clean_now(body, row)) if stateless else None,
            gone=(lambda: clean_later(body, row)) if stateless else None,
        )

    # -- runs on a thread -------------------------------------------------------------------

    @router.post("/threads/{thread_id}/runs")
    def create_run(thread_id: ThreadId, body: RunIn, principal: Writer) -> Response:
        """Admit a run on the thread, durably, before answering (`pending`); a worker executes
        it. `command.resume` answers the thread's pause instead: that run goes on."""
        row, _thread, _modes = admit(body, thread_id, principal)
        return _json(shape(row), locations(row, False, ""))

    @router.post("/threads/{thread_id}/runs/stream", response_class=EventSourceResponse)
    def stream_run(thread_id: ThreadId, body: RunIn, principal: Writer) -> EventSourceResponse:
        """Admit a run on the thread and stream its committed steps (Server-Sent Events)."""
        return stream_new(body, thread_id, principal)

    @router.post("/threads/{thread_id}/runs/wait")
    async def wait_run(
        thread_id: ThreadId, body: RunIn, request: Request, principal: Writer
    ) -> Response:
        """Admit a run on the thread and answer its final state values once it ended (with
        `__interrupt__` when it paused, `__error__` when it failed)."""
        row, _thread, _modes = await in_thread(admit, body, thread_id, principal)
        cancel = body.on_disconnect == "cancel"
        return await outcome(request, row, locations(row, False, "join"), cancel=cancel)

    @router.get("/threads/{thread_id}/runs")
    def list_runs(
        thread_id: ThreadId,
        principal: Reader,
        limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 10,
        offset: Annotated[int, Query(ge=0)] = 0,
        status: Annotated[
            Literal["pending", "running", "success", "error", "timeout", "interrupted"] | None,
            Query(),
        ] = None,
        select: Annotated[list[str] | None, Query()] = None,
    ) -> list[dict[str, Any]]:
        """The thread's runs, newest first (of its latest 1000)."""
        refuse_unknown(select, RUN_FIELDS)
        visible_thread(auth, keel_app, principal, thread_id, "read")
        rows = keel_app.thread_runs(thread_id, MAX_LIST, newest=True)
        if status is not None:
            rows = [r for r in rows if run_status(r) == status]
        return [selected(shape(r), select) for r in rows[offset : offset + limit]]

    @router.get("/threads/{thread_id}/runs/{run_id}")
    async def get_run(thread_id: ThreadId, run_id: RunId, principal: Reader) -> dict[str, Any]:
        """The run (status `success` also for a run paused on an interrupt)."""
        if auth.custom:  # its handlers are awaited from a worker thread (`in_thread`)
            return shape(await in_thread(on_thread, principal, thread_id, run_id))
        # Clients poll this: read straight from the App's loop, no thread-pool hop.
        return shape(
            await on_app(keel_app, run_of_thread(keel_app.aio, thread_id, run_id, thread=True))
        )

    @router.get("/threads/{thread_id}/runs/{run_id}/join")
    async def join_run(
        thread_id: ThreadId,
        run_id: RunId,
        request: Request,
        principal: Reader,
        cancel_on_disconnect: bool = False,
    ) -> Response:
        """Wait for the run to end or pause; its final state values, as `wait` answers them
        (`cancel_on_disconnect`: a client gone first cancels the run)."""
        row = await in_thread(joined, principal, thread_id, run_id, cancel_on_disconnect)
        headers = locations(row, False, "join")
        return await outcome(request, row, headers, cancel=cancel_on_disconnect)

    @router.get("/threads/{thread_id}/runs/{run_id}/stream", response_class=EventSourceResponse)
    def join_stream(
        thread_id: ThreadId,
        run_id: RunId,
        principal: Reader,
        stream_mode: Annotated[list[str] | None, Query()] = None,
        cancel_on_disconnect: bool = False,
        last_event_id: Annotated[str | None, Header(max_length=300)] = None,
    ) -> EventSourceResponse:
        """The run's events after `Last-Event-ID` (each committed step's events once, across
        server and worker restarts), or from now without it, until it ends or pauses."""
        row = joined(principal, thread_id, run_id, cancel_on_disconnect)
        after = None
        if last_event_id:
            try:
                after = Position.parse(last_event_id)
            except ValueError as exc:
                raise Refused(400, "invalid_id", str(exc)) from None
        asked = [m for m in stream_mode or [] if m]
        try:
            modes = stream.parse_modes(asked or None, shape(row)["kwargs"]["stream_mode"])
        except ValueError as exc:
            raise Refused(422, "invalid_request", str(exc)) from None
        headers = locations(row, False, "stream")
        # `-1` asks for the whole stream again, its `metadata` event first, as langgraph-api
        # answers useStream's rejoin.
        whole = bool(last_event_id) and str(last_event_id).strip() == "-1"
        return sse(feed(run_id, after), modes, headers, metadata=whole, cancel=cancel_on_disconnect)

    @router.post("/threads/{thread_id}/runs/{run_id}/cancel")
    async def cancel_run(
        thread_id: ThreadId,
        run_id: RunId,
        request: Request,
        principal: Writer,
        wait: bool = False,
        action: Literal["interrupt", "rollback"] = "interrupt",
    ) -> Response:
        """Cancel the run: a queued or paused one at once, a running one at its next step
        boundary. `rollback` also discards what it checkpointed. With `wait`, answer once it
        ended (its final values), else 202 at once."""
        row = await in_thread(on_thread, principal, thread_id, run_id, "update")
        if action == "rollback":
            await on_app(keel_app, roll_back(keel_app.aio, run_id, principal.label))
        else:
            await asyncio.to_thread(keel_app.cancel, run_id, by=principal.label)
        if not wait:
            return Response(status_code=202)
        return await outcome(request, row, locations(row, False, "join"))

    @router.delete("/threads/{thread_id}/runs/{run_id}", status_code=204)
    def delete_run(thread_id: ThreadId, run_id: RunId, principal: Writer) -> Response:
        """Delete a finished run: its row, timeline, effect ledger and waits go, as `keel
        prune` removes them (the thread's checkpoints stay: its state is unchanged). 409
        `run_unfinished` while it is queued, running or paused: cancel it first."""
        row = on_thread(principal, thread_id, run_id, "delete")
        gone = None
        if Status(row["status"]) in FINISHED:
            gone = call(delete_finished_run(keel_app.aio, thread_id, run_id))
        if gone is None:
            raise Refused(
                409,
                "run_unfinished",
                f"run {run_id} is {row['status']}: cancel it before deleting it",
            )
        log.info("run %s of thread %s deleted: %s", run_id, thread_id, gone)
        return Response(status_code=204)

    # -- stateless runs ---------------------------------------------------------------------

    def admit_stateless(body: RunIn, principal: Principal) -> Row:
        if body.command and "resume" in body.command:
            raise Refused(400, "bad_request", "a stateless run has no pause to resume")
        row, _thread, _modes = admit(body, None, principal)
        clean_later(body, row)
        return row

    @router.post("/runs")
    def create_stateless(body: RunIn, principal: Writer) -> Response:
        """Admit a run on a thread of its own, durably, before answering."""
        row = admit_stateless(body, principal)
        return _json(shape(row), locations(row, True, ""))

    @router.post("/runs/batch")
    def create_batch(bodies: list[RunIn], principal: Writer) -> list[dict[str, Any]]:
        """Admit each run as `POST /runs` does, in order; the runs. Every item's assistant
        and input are checked before any is admitted: a refused batch admitted nothing (a
        client retrying it admitted its first runs twice)."""
        workflows = keel_app.aio.runtime.workflows
        for n, body in enumerate(bodies):
            try:
                if body.command and "resume" in body.command:
                    raise Refused(400, "bad_request", "a stateless run has no pause to resume")
                assistant = resolve_for_run(keel_app, body.assistant_id)
                if body.input is not None:
                    wf = workflows.get(assistant.graph, assistant.version)
                    check_input(wf, body.input, partial=True)  # as a run on a thread is
            except Refused as refused:
                raise Refused(refused.status, refused.code, f"run {n}: {refused.message}") from None
            except InvalidInput as invalid:
                raise Refused(422, "invalid_input", f"run {n}: {invalid}") from None
        return [shape(admit_stateless(body, principal)) for body in bodies]

    @router.post("/runs/stream", response_class=EventSourceResponse)
    def stream_stateless(body: RunIn, principal: Writer) -> EventSourceResponse:
        """Admit a run on a thread of its own and stream its committed steps."""
        if body.command and "resume" in body.command:
            raise Refused(400, "bad_request", "a stateless run has no pause to resume")
        return stream_new(body, None, principal)

    @router.post("/runs/wait")
    async def wait_stateless(body: RunIn, request: Request, principal: Writer) -> Response:
        """Admit a run on a thread of its own and answer its final values once it ended."""
        if body.command and "resume" in body.command:
            raise Refused(400, "bad_request", "a stateless run has no pause to resume")
        row, _thread, _modes = await in_thread(admit, body, None, principal)
        try:
            cancel = body.on_disconnect == "cancel"
            answer = await outcome(request, row, locations(row, True, "join"), cancel=cancel)
        except BaseException:
            await asyncio.to_thread(clean_later, body, row)
            raise
        await asyncio.to_thread(clean_now, body, row)
        return answer

    return router


def _json(body: Any, headers: dict[str, str]) -> Response:
    return JSONResponse(body, headers=headers)
