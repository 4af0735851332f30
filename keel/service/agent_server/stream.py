"""A run's stream in the Agent Server protocol, derived from what committed.

A worker does not talk to the server: everything a stream says is read back from the database,
so it says only what is durable. Each checkpoint a run commits on its thread (its metadata
carries `keel_run_id`) is one block of events, as LangGraph's own `stream` would have produced
them for that step:

- `updates`: `{node: writes}` for each task that ran from the previous checkpoint (read from
  that checkpoint's pending writes, named by its tasks), `None` for a task that wrote nothing;
  a task whose writes were kept from before a pause is marked `"__metadata__": {"cached": true}`;
- `values`: the state at the checkpoint (none for the run's input checkpoint, nor after a step
  that wrote nothing to the state, as LangGraph);
- after a pause on `interrupt()`: `updates` of the tasks that finished beside it,
  `{"__interrupt__": [...]}`, then `values` with `__interrupt__`; when the run is resumed (in
  Keel the same run goes on) the next block starts with the `values` it goes on from, as
  LangGraph's resuming run does.

Every event's SSE id is its place in that sequence, `<checkpoint id>/<n>` (`-/0` before the
first checkpoint): the same on every server, at every read, so a client that reconnects with
`Last-Event-ID` gets exactly the events after it, across server and worker crashes. A step that
did not commit produced no event; its re-execution produces its events once. The events that
frame a stream (`metadata` first, `error`, `end`) carry the place they were sent at plus their
name (`<checkpoint id>/<n>/end`), so no two events of a stream share an id and a reconnect
from one of them resumes at that place.

`values` and `updates` are told from committed data. `messages` (`messages-tuple`), `custom`,
`tasks`, `checkpoints`, `debug` and a subgraph's `values`/`updates` are captured by the worker
(keel.langgraph.chunks) into `keel_stream_chunks`, fenced by its lease token and anchored at the
run's last committed checkpoint: a chunk's event comes after that checkpoint's own events, with
id `<checkpoint id>/<n>/<chunk id>` (keel.service.agent_server.stream_chunks). Chunks are read
after the checkpoints (a chunk commits before the checkpoint after it), up to the first one
anchored at a checkpoint not listed yet. Chunks of a step a takeover re-ran are superseded and
never sent again; a stream that sent some sends `keel/superseded` before the re-execution's.
`events` (LangChain's `astream_events` v2: `on_chain_start`, `on_chat_model_stream`, ...) is
captured the same way, the worker then running the graph with `astream_events`.

A stream polls: the run's row and its timeline (a step's timeline events commit with its
checkpoint) every 50 ms, backing off to 500 ms while nothing happens, and the checkpoints only
when the timeline moved (or every few seconds, for a step that wrote no event). It ends at the
run's end, or when it pauses on an interrupt (the run's protocol status is then `success`),
or when the client goes away.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.types import StateSnapshot
from sse_starlette.sse import ServerSentEvent

from keel.core.errors import RunNotFound
from keel.core.lifecycle import FINISHED, Status
from keel.core.store.base import Row
from keel.core.store.store import Store
from keel.core.threads import run_config
from keel.langgraph import static_interrupts
from keel.langgraph.graphs import compile_graph
from keel.runtime.app import App
from keel.runtime.snapshot_json import jsonable, shown
from keel.service.agent_server import stream_pauses
from keel.service.agent_server.positions import RESUMED, Event, Position
from keel.service.agent_server.shapes import error_body
from keel.service.agent_server.stream_chunks import Messages, chunk_event, superseded
from keel.service.agent_server.stream_output import INTERRUPT, OutputView

T = TypeVar("T")

STREAMED = ("values", "updates")
"""The stream modes told from committed data."""
CAPTURED = ("messages", "messages-tuple", "custom", "debug", "tasks", "checkpoints", "events")
"""The stream modes the run's worker captures live (keel.langgraph.chunks)."""
MODES = STREAMED + CAPTURED
__all__ = ["Event", "Position"]

FIRST_POLL = 0.05
LAST_POLL = 0.5
CHECKPOINTS_EVERY = 3.0
"""Seconds between reads of the checkpoints when the timeline did not move (a step whose tasks
wrote nothing commits no timeline event)."""


@dataclass
class _Seen:
    """The newest checkpoint of the run read so far."""

    id: str
    values: Any
    regular: int
    """How many events its own block has (its pause's events come after them)."""


def parse_modes(given: str | list[str] | None, default: list[str]) -> list[str]:
    """The stream modes asked for, as a list; ValueError naming the known ones for another."""
    modes = default if given is None else [given] if isinstance(given, str) else list(given)
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(
            f"unknown stream_mode {', '.join(map(repr, unknown))}: Keel streams {', '.join(MODES)}"
        )
    return modes


def interrupt_json(item: Any) -> dict[str, Any]:
    """An Interrupt as the protocol's streams show it (`value`, `id`, ...), its value as the
    node gave it."""
    plain = dataclasses.is_dataclass(item) and not isinstance(item, type)
    body = jsonable(dataclasses.asdict(item)) if plain else {}
    return {**body, "value": jsonable(shown(getattr(item, "value", None)))}


async def on_app(keel_app: App, work: Coroutine[Any, Any, T]) -> T:
    """Await `work` on the App's own event loop (where Keel's async core lives) from another
    loop's task (uvicorn's); cancelling the awaiting task cancels it there too."""
    loop = keel_app.aio.runtime.portal.loop
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, loop))


class Graphs:
    """Each workflow version's graph compiled once, on the App's fenced saver: the reader of a
    run's checkpoints."""

    def __init__(self, keel_app: App) -> None:
        self.app = keel_app
        self._compiled: dict[str, Any] = {}

    async def of(self, run: Row) -> Any:
        runtime = self.app.aio.runtime
        await self.app.aio.open()
        workflow = runtime.workflows.get(run["workflow"], run["workflow_version"])
        if workflow.key not in self._compiled:
            self._compiled[workflow.key] = compile_graph(workflow, runtime.fencing())
        return self._compiled[workflow.key]


class Feed:
    """The events of one run after a position, as they commit (its coroutines run on the App's
    loop: `on_app`)."""

    def __init__(self, keel_app: App, graph: Any, run: Row, after: Position) -> None:
        self.app = keel_app
        self.graph = graph
        self.run = run
        self.run_id = str(run["run_id"])
        self.thread_id = str(run.get("thread_id") or run["run_id"])
        self.sent = after
        self._last: _Seen | None = None
        self._timeline = 0
        self._read_at = 0.0
        self._chunk = 0
        """The id of the last stream chunk read."""
        self._regular: dict[str, int] = {}
        """How many events each of the run's checkpoints has in its own block."""
        self._relist = False
        """A chunk read names a checkpoint not listed yet: list them at the next poll."""
        self.token: int | None = None
        """The lease token of the last chunk sent: a chunk of another asks whether those
        were superseded."""
        self._marks: list[Event] = []
        self._told: set[int] = set()
        self._breakpoints = bool(
            static_interrupts.invoke_options(run_config(run))
            or static_interrupts.compiled_with(graph)
        )
        """Whether the run can pause on a breakpoint: only then is a block asked about one."""

    @classmethod
    async def open(cls, keel_app: App, graphs: Graphs, run_id: str, after: Position | None) -> Feed:
        """The feed of the run after `after`; None: after every event committed so far."""
        run = await cls._row(keel_app, run_id)
        feed = cls(keel_app, await graphs.of(run), run, after or Position())
        if after is None:
            await feed.catch_up()
        elif after.chunk and not after.again:
            # A reconnect after a chunk: if it was superseded since, the client hears so first.
            store = keel_app.aio.runtime.store
            found = await store.chunk_state(feed.run_id, after.chunk)
            if found is not None:
                feed.token = int(found["lease_token"])
                if found["superseded"]:
                    await feed._superseded()
        return feed

    @staticmethod
    async def _row(keel_app: App, run_id: str) -> Row:
        await keel_app.aio.open()
        row = await keel_app.aio.runtime.store.get_run(run_id)
        if row is None:
            raise RunNotFound(f"no run {run_id!r}")
        return row

    @property
    def _store(self) -> Store:
        return self.app.aio.runtime.store

    @property
    def settled(self) -> bool:
        """Whether the run has ended or waits for an answer: its stream is over."""
        return Status(self.run["status"]) in FINISHED | {Status.WAITING}

    async def catch_up(self) -> None:
        """Move past every event committed so far (a stream "from now")."""
        self.sent = max([self.sent, *(e.position for e in await self._read(force=True))])
        # None of those chunks went out: a later execution's supersede none the client saw.
        self.token = None

    async def poll(self) -> list[Event]:
        """The events committed since the last poll that come after `sent`; then `settled`
        says whether the run's stream is over."""
        return self._unsent(await self._read(force=False))

    def _unsent(self, events: list[Event]) -> list[Event]:
        fresh = sorted((e for e in events if e.position > self.sent), key=lambda e: e.position)
        marks, self._marks = self._marks, []
        if fresh:
            self.sent = fresh[-1].position
        return marks + fresh

    async def _superseded(self) -> None:
        """If the chunks of the execution last heard from (`token`) were superseded, the
        marker that says so goes out before what comes next; the check is made once."""
        if self.token is None:
            return
        token, self.token = self.token, None
        if token in self._told:
            return
        self._told.add(token)
        count = await self.app.aio.runtime.store.superseded_count(self.run_id, token)
        if count:
            self._marks.append(superseded(self.sent, token, count))

    async def _chunks(self) -> list[Event]:
        """The chunks committed since the last read, up to the first one placed at a
        checkpoint not listed yet (listed at the next poll)."""
        rows = await self.app.aio.runtime.store.chunks_after(self.run_id, self._chunk)
        out: list[Event] = []
        for row in rows:
            anchor = str(row["anchor"])
            if anchor and anchor not in self._regular:
                self._relist = True
                break
            self._chunk = int(row["chunk_id"])
            event = chunk_event(row, self._regular)
            if event.position <= self.sent:
                continue  # sent before (a reconnect reads the chunks again from the start)
            token = int(row["lease_token"])
            if self.token is not None and token != self.token:
                await self._superseded()
            self.token = token
            out.append(event)
        return out

    async def _read(self, *, force: bool) -> list[Event]:
        store = self.app.aio.runtime.store
        # The status first: a run's end commits with its last checkpoint, so the checkpoints
        # read after it hold everything it wrote.
        self.run = await self._row(self.app, self.run_id)
        moved = await store.events_after(self.run_id, self._timeline, 500)
        if moved:
            self._timeline = int(moved[-1]["event_id"])
        due = time.monotonic() - self._read_at >= CHECKPOINTS_EVERY
        events: list[Event] = []
        if force or moved or due or self.settled or self._relist:
            self._read_at = time.monotonic()
            self._relist = False
            for checkpoint_id in await self._newer():
                events += await self._block(checkpoint_id)
        # After the checkpoints: a chunk is written before the checkpoint after it commits.
        events += await self._chunks()
        if self.settled and self._last is not None:
            events += await self._pause(self._last, await self._state(self._last.id))
        elif self.run["status"] == Status.WAITING:
            # Paused where it began, on another run's checkpoint (no input on a paused thread):
            # the state it began from, then its pause there.
            latest = await self._state(None)
            began = str((latest.config or {}).get("configurable", {}).get("checkpoint_id") or "")
            if began:
                values = jsonable(latest.values)
                pause = await self._pause(_Seen(began, values, 1), latest)
                if pause:
                    events += [Event("values", values, Position(began, 1)), *pause]
        return events

    async def _newer(self) -> list[str]:
        """Ids of the run's checkpoints (its graph's, not its subgraphs') newer than the last
        one read, oldest first."""
        saver = self.app.aio.runtime.fencing()
        newer: list[str] = []
        seen = self._last.id if self._last else ""
        # Closed at once when left early: the saver holds its connection while it lists.
        async with _listing(saver, self.thread_id, self.run_id) as found:
            async for saved in found:
                checkpoint_id = str(saved.config["configurable"]["checkpoint_id"])
                if checkpoint_id <= seen:
                    break
                newer.append(checkpoint_id)
        return newer[::-1]

    async def _state(self, checkpoint_id: str | None) -> StateSnapshot:
        """The state at that checkpoint of the run's thread (None: its latest)."""
        configurable = {"thread_id": self.thread_id, "checkpoint_ns": ""}
        if checkpoint_id is not None:
            configurable["checkpoint_id"] = checkpoint_id
        config: RunnableConfig = {"configurable": configurable}
        state: StateSnapshot = await self.graph.aget_state(config)
        return state

    async def _block(self, checkpoint_id: str) -> list[Event]:
        """The events of the previous checkpoint's pause (if it paused), then this one's."""
        out: list[Event] = []
        block: list[tuple[str, Any]] = []
        last = self._last
        wrote = True  # the run's first checkpoint (not its input's) shows its state
        if last is not None:
            before = await self._state(last.id)  # again: its tasks' writes committed since
            out += await self._pause(last, before)
            paused = _paused(before)
            if paused or (
                self._breakpoints
                and await stream_pauses.paused_statically(self._store, self.run_id, last.id)
            ):
                # The run went on from a pause there: first the state it goes on from.
                block.append(("values", last.values))
            for task in before.tasks:
                update = _update(task, cached=paused and not task.interrupts)
                if update is not None:
                    block.append(("updates", update))
            # As LangGraph: a step that wrote nothing to the state streams no values.
            wrote = any(task.result not in (None, {}) for task in before.tasks)
        state = await self._state(checkpoint_id)
        if last is None and (state.metadata or {}).get("source") == "loop":
            # The run's first checkpoint follows another run's (no input: a `goto`, going on
            # from a pause or a fork): as LangGraph's, its stream starts from that state.
            block += await self._went_on_from(state)
        values = jsonable(state.values)
        if wrote and (state.metadata or {}).get("source") != "input":
            block.append(("values", values))
        out += [
            Event(kind, data, Position(checkpoint_id, n))
            for n, (kind, data) in enumerate(block, start=1)
        ]
        self._last = _Seen(checkpoint_id, values, len(block))
        self._regular[checkpoint_id] = len(block)
        return out

    async def _pause(self, seen: _Seen, state: StateSnapshot) -> list[Event]:
        """The events of a pause on `interrupt()` at checkpoint `seen` (none if it did not
        pause there): the updates of the tasks that finished beside it, the interrupts, and the
        state with them. A pause again at the same checkpoint (a node asking once more after
        its answer) has places of its own, after what the execution that paused again
        streamed, and starts with the state the run went on from, as LangGraph's resuming run
        streams it."""
        interrupts = [interrupt_json(i) for task in state.tasks for i in task.interrupts]
        if not interrupts:
            return []
        again = await stream_pauses.again(self._store, self.run_id, state)
        block: list[tuple[str, Any]] = []
        if again is not None:
            block.append(("values", seen.values))
        else:
            for task in state.tasks:
                if not task.interrupts:
                    update = _update(task, cached=False)
                    if update is not None:
                        block.append(("updates", update))
        block.append(("updates", {INTERRUPT: interrupts}))
        block.append(("values", {**_dict(seen.values), INTERRUPT: interrupts}))
        if again is None:
            places = [Position(seen.id, seen.regular + n) for n in range(1, len(block) + 1)]
        else:
            ceiling, token = again
            places = [
                Position(seen.id, RESUMED, ceiling, token * stream_pauses.AGAIN_STRIDE + n)
                for n in range(1, len(block) + 1)
            ]
        return [Event(kind, data, place) for (kind, data), place in zip(block, places, strict=True)]

    async def _went_on_from(self, state: StateSnapshot) -> list[tuple[str, Any]]:
        """The state a run's first checkpoint went on from (its parent's, another run's), and
        the updates of the tasks that ran from there."""
        parent = ((state.parent_config or {}).get("configurable") or {}).get("checkpoint_id")
        if not parent:
            return []
        before = await self._state(str(parent))
        block: list[tuple[str, Any]] = [("values", jsonable(before.values))]
        for task in before.tasks:
            update = _update(task, cached=False)
            if update is not None:
                block.append(("updates", update))
        return block

    def ending(self) -> list[Event]:
        """The events that end a settled run's stream: `error` for a failed run, then `end`."""
        events: list[Event] = []
        if self.run["status"] == Status.FAILED:
            events.append(Event("error", error_body(self.run.get("error")), self.sent, "error"))
        events.append(Event("end", None, self.sent, "end"))
        return events

    def metadata(self) -> Event:
        """The event a new stream starts with (LangGraph's `{run_id, attempt}`)."""
        attempt = int(self.run.get("attempt") or 1)
        return Event("metadata", {"run_id": self.run_id, "attempt": attempt}, self.sent, "metadata")


def _listing(
    saver: Any, thread_id: str, run_id: str, limit: int | None = None
) -> aclosing[AsyncGenerator[CheckpointTuple, None]]:
    """The run's checkpoints on its thread (its graph's, not its subgraphs'), newest first."""
    config: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    listed = saver.alist(config, filter={"keel_run_id": run_id}, limit=limit)
    return aclosing(cast(AsyncGenerator[CheckpointTuple, None], listed))


def _paused(state: StateSnapshot) -> bool:
    return any(task.interrupts for task in state.tasks)


def _dict(values: Any) -> dict[str, Any]:
    return dict(values) if isinstance(values, dict) else {"__root__": values}


def _update(task: Any, *, cached: bool) -> dict[str, Any] | None:
    """A finished task's `updates` event (`{name: writes}`), as LangGraph streams it; None for
    a task that did not finish or is LangGraph's own (`__start__`)."""
    if task.result is None or (task.name.startswith("__") and task.name.endswith("__")):
        return None
    # A task that wrote nothing to the state streams None (its result here is {}).
    update: dict[str, Any] = {task.name: jsonable(task.result) if task.result != {} else None}
    if cached:
        update["__metadata__"] = {"cached": True}
    return update


async def events(
    keel_app: App,
    feed: Feed,
    modes: list[str],
    *,
    metadata: bool,
    on_disconnect: Callable[[], None] | None = None,
) -> AsyncIterator[ServerSentEvent]:
    """The SSE events of `feed` in `modes` until the run's stream is over; `on_disconnect` is
    called (in a thread) if the client goes away first."""
    wanted = set(modes)
    messages = Messages() if "messages" in wanted else None
    output = OutputView(feed.graph)
    over = False
    try:
        if metadata:
            yield feed.metadata().sse()
        pause = FIRST_POLL
        while True:
            fresh = await on_app(keel_app, feed.poll())
            for event in fresh:
                if event.name or (event.mode or event.event) in wanted:
                    shown = output.shown(event)
                    if shown is not None:
                        yield shown.sse()
                if messages is not None and event.mode == "messages-tuple":
                    for part in messages.of(event):
                        yield part.sse()
            if feed.settled:
                over = True
                for event in feed.ending():
                    yield event.sse()
                return
            pause = FIRST_POLL if fresh else min(pause * 1.5, LAST_POLL)
            await asyncio.sleep(pause)
    finally:
        if not over and on_disconnect is not None:
            # Not awaited: the client's going away cancelled this generator's task.
            asyncio.get_running_loop().run_in_executor(None, on_disconnect)


async def outcome(keel_app: App, graphs: Graphs, run: Row) -> Any:
    """What `wait` and `join` answer for a run that ended or paused: the state values at its
    last checkpoint (with `__interrupt__` when it paused there), `{"__error__": {error,
    message}}` when it failed; the thread's latest values when it wrote no checkpoint of its own
    (no input on a finished thread, an update alone), as LangGraph's `invoke` returns them."""
    if run["status"] == Status.FAILED:
        return {"__error__": error_body(run.get("error"))}
    graph = await graphs.of(run)
    thread = str(run.get("thread_id") or run["run_id"])
    saver = keel_app.aio.runtime.fencing()
    newest = None
    async with _listing(saver, thread, str(run["run_id"]), limit=1) as found:
        async for saved in found:
            newest = saved.config
    latest: dict[str, Any] = {"configurable": {"thread_id": thread}}
    state: StateSnapshot = await graph.aget_state(newest or latest)
    values = OutputView(graph).values(jsonable(state.values))
    interrupts = [interrupt_json(i) for task in state.tasks for i in task.interrupts]
    if run["status"] == Status.WAITING and interrupts:
        return {**_dict(values), INTERRUPT: interrupts}
    return values
