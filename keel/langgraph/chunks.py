"""What a run's graph streams in the modes its checkpoints cannot tell, captured for its streams.

A run submitted through the Agent Server protocol names its stream modes (the `keel_kwargs` of
its config). When they include a mode only a live graph produces (`messages`, `custom`,
`tasks`, `debug`, `checkpoints`, or a subgraph's `values`/`updates` with `subgraphs`), the
executor runs the graph with `astream` in those modes instead of `ainvoke` (with `events`,
LangChain's callback events: `astream_events` v2, whose root `on_chain_stream` events carry the
other modes' chunks), and this module
keeps each chunk (its namespace, mode and data as JSON) in the run's `keel_stream_chunks` rows:

- written as they come, in batches at most ~100 ms old, and always before the next step's
  transaction (the saver's `before_commit` hook) and before the run's end or pause, so a chunk
  is durable before anything that comes after it in the stream is;
- fenced by the execution's lease token (a stale worker's chunks are refused);
- anchored at the run's last committed checkpoint when they were produced (the stream places a
  chunk after that checkpoint's own events), and marked `resumed` when produced by an execution
  resuming a pause at that checkpoint (they come after the pause's events);
- superseded when a later execution re-runs their step (it never committed): an execution that
  takes a run over marks older tokens' chunks after its start checkpoint superseded before it
  writes its own.

Root `values` and `updates` are never kept: streams derive them from committed checkpoints. A
run that asked for none of these modes runs with `ainvoke`, exactly as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from langgraph.types import Command

from keel.core.codec import json_default
from keel.core.errors import LeaseLost
from keel.core.store.store import Store

log = logging.getLogger("keel.chunks")

KWARGS = "keel_kwargs"
"""The key of a run's config holding what it was submitted with through the Agent Server
protocol (`stream_mode`, `subgraphs`, ...)."""
LIVE_MODES = frozenset({"messages", "custom", "tasks", "debug", "checkpoints", "events"})
"""LangGraph's stream modes only a live graph produces."""
FLUSH_EVERY = 0.1
INTERRUPT = "__interrupt__"


def wanted(config: Mapping[str, Any]) -> tuple[list[str], bool]:
    """The LangGraph stream modes to capture for a run submitted with `config`, and whether
    its subgraphs' chunks too; ([], False) when nothing needs capturing."""
    kwargs = config.get(KWARGS) or {}
    given = kwargs.get("stream_mode") or []
    asked = {given} if isinstance(given, str) else set(given)
    subgraphs = bool(kwargs.get("subgraphs"))
    modes = {"messages" if m == "messages-tuple" else m for m in asked} & LIVE_MODES
    if subgraphs:
        modes |= asked & {"values", "updates"}
    return sorted(modes), subgraphs and bool(asked)


def text(value: Any) -> str:
    """A chunk's data as JSON text (messages and models as their fields; anything else that
    JSON cannot say as its repr)."""

    def default(item: Any) -> Any:
        try:
            return json_default(item)
        except TypeError:
            return repr(item)

    return json.dumps(value, ensure_ascii=False, default=default)


class Capture:
    """One execution's captured chunks, on their way to the database."""

    def __init__(
        self, store: Store, saver: Any, run_id: str, token: int, modes: list[str], subgraphs: bool
    ) -> None:
        self.store = store
        self.saver = saver
        self.run_id = run_id
        self.token = token
        self.modes = modes
        self.subgraphs = subgraphs
        self.start = ""
        """The checkpoint the execution started from (`""`: none of the run's)."""
        self.resumed = False
        self.pending: list[dict[str, Any]] = []
        self._lock = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None
        self._lost = False

    async def begin(self, graph_input: Any, *, first: bool) -> None:
        """Before the graph runs: where the execution starts, and (unless it is the run's first)
        older executions' chunks of the steps it re-runs superseded."""
        self.start = self.saver.anchor(self.run_id, self.token)
        self.resumed = isinstance(graph_input, Command) and graph_input.resume is not None
        self.saver.before_commit[(self.run_id, self.token)] = self.flush
        if not first:
            await self.store.supersede_chunks(
                self.run_id, self.token, self.start, keep_paused=self.resumed
            )

    def add(self, ns: tuple[str, ...], mode: str, data: Any) -> None:
        anchor = self.saver.anchor(self.run_id, self.token)
        self.pending.append(
            {
                "anchor": anchor,
                "resumed": int(self.resumed and anchor == self.start),
                "ns": "|".join(ns),
                "mode": mode,
                "data": text(data),
            }
        )
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._later())

    async def _later(self) -> None:
        await asyncio.sleep(FLUSH_EVERY)
        with contextlib.suppress(LeaseLost):  # the execution learns it at its next commit
            await self.flush()

    async def flush(self) -> None:
        """Write what was captured so far (in order, one batch, fenced)."""
        async with self._lock:
            if not self.pending or self._lost:
                return
            rows, self.pending = self.pending, []
            try:
                await self.store.write_chunks(self.run_id, self.token, rows)
            except LeaseLost:
                self._lost = True
                raise
            except BaseException:
                self.pending[:0] = rows
                raise

    async def close(self) -> None:
        """The execution is over: nothing more is written for it."""
        self.saver.before_commit.pop((self.run_id, self.token), None)
        if self._flusher is not None and not self._flusher.done():
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._flusher

    async def run(self, graph: Any, graph_input: Any, config: Any, **kwargs: Any) -> Any:
        """`graph.ainvoke(graph_input, config, **kwargs)`'s output, its chunks captured."""
        latest: Any = None
        interrupts: list[Any] = []
        modes = sorted({*self.modes, "updates", "values"} - {"events"})
        try:
            async for ns, mode, data in self._chunks(graph, graph_input, config, modes, kwargs):
                if not ns:
                    # As ainvoke: the last root `values`, with the interrupts `updates` saw.
                    if mode == "values":
                        latest = data
                    elif mode == "updates" and isinstance(data, dict) and INTERRUPT in data:
                        interrupts.extend(data[INTERRUPT])
                    if mode in ("values", "updates"):
                        continue  # streams derive these from the committed checkpoints
                if mode in self.modes and (self.subgraphs or not ns):
                    self.add(tuple(ns), mode, data)  # as LangGraph: a subgraph's if asked
            await self.flush()
        except BaseException:
            with contextlib.suppress(Exception):
                await self.flush()  # what the graph streamed before it failed
            raise
        finally:
            await self.close()
        if interrupts and isinstance(latest, dict):
            return {**latest, INTERRUPT: interrupts}
        return latest

    async def _chunks(
        self, graph: Any, graph_input: Any, config: Any, modes: list[str], kwargs: Any
    ) -> Any:
        """`graph.astream(..., subgraphs=...)`'s (namespace, mode, data) chunks; with `events`
        asked for, read from `astream_events` (v2): the root graph's `on_chain_stream` events
        carry those chunks, every other event is kept as an `events` chunk.

        Subgraphs are streamed only when the client asked for them, as LangGraph's server
        does: without, LangGraph's `messages` mode sends a subgraph's model output as the
        finished message when the subgraph's node ends; with, as tokens under the subgraph's
        namespace."""
        if "events" not in self.modes:
            async for chunk in graph.astream(
                graph_input, config, stream_mode=modes, subgraphs=self.subgraphs, **kwargs
            ):
                yield chunk if self.subgraphs else ((), *chunk)
            return
        root: str | None = None
        async for event in graph.astream_events(
            graph_input,
            config,
            version="v2",
            stream_mode=modes,
            subgraphs=self.subgraphs,
            **kwargs,
        ):
            if root is None and event.get("event") == "on_chain_start":
                root = event.get("run_id")
            if event.get("event") == "on_chain_stream" and event.get("run_id") == root:
                # The other modes' chunks: not an event of its own (as LangGraph's server).
                chunk = event["data"]["chunk"]
                yield chunk if self.subgraphs else ((), *chunk)
            else:
                self.add((), "events", event)


def capture_for(
    store: Store, saver: Any, run_id: str, token: int, config: Mapping[str, Any]
) -> Capture | None:
    """The capture an execution of a run submitted with `config` needs (None: no stream asked
    for a mode only a live graph produces)."""
    modes, subgraphs = wanted(config)
    return Capture(store, saver, run_id, token, modes, subgraphs) if modes else None
