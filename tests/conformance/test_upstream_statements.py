"""The contract Keel's step transaction rests on, recorded from the official savers.

Keel buffers a task's writes until the `aput` of its step's checkpoint and replays, in its own
transaction, the statements upstream's `aput` / `aput_writes` issue (docs/savers.md). Both depend
on what LangGraph does, not on what it documents: which saver calls the loop makes for a graph,
in which order, and which SQL each call issues. This test runs a two-step graph on the official
savers, unmodified (only observed), and compares the calls and their SQL with
`upstream_statements.json`. A LangGraph upgrade that changes either fails here; read upstream's
diff, check savers.py's rules (what is special, what is awaited), then re-record with
`KEEL_RECORD_UPSTREAM=1 pytest tests/conformance/test_upstream_statements.py`.
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import re
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, TypedDict

import aiosqlite
import psycopg
from langgraph._internal import _constants as constants
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph
from psycopg.rows import dict_row

from keel.backends.pg_batch import LARGE
from keel.backends.postgres import normalize_postgres_url
from keel.backends.sqlite import sqlite_path
from keel.core.portal import Portal
from keel.langgraph import recording, savers, timeline

EXPECTED = Path(__file__).with_name("upstream_statements.json")
Call = list[Any]


class Two(TypedDict, total=False):
    seen: Annotated[list[str], operator.add]


def two_steps() -> Any:
    def node(name: str) -> Any:
        def run(state: Two) -> dict[str, Any]:
            return {"seen": [name]}

        return run

    g = StateGraph(Two)
    g.add_node("a", node("a"))
    g.add_node("b", node("b"))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g


_call: ContextVar[Call | None] = ContextVar("upstream_call", default=None)
"""The saver call whose statements are being issued (each call runs in its own task)."""


def _sql(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


class WatchedSqlite(AsyncSqliteSaver):
    calls: list[Call]

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        call: Call = ["aput", metadata.get("step"), []]
        self.calls.append(call)
        _call.set(call)
        return await super().aput(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        call: Call = ["aput_writes", sorted(c for c, _ in writes), []]
        self.calls.append(call)
        _call.set(call)
        await super().aput_writes(config, writes, task_id, task_path)


class WatchedPostgres(AsyncPostgresSaver):
    calls: list[Call]

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        call: Call = ["aput", metadata.get("step"), []]
        self.calls.append(call)
        _call.set(call)
        return await super().aput(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        call: Call = ["aput_writes", sorted(c for c, _ in writes), []]
        self.calls.append(call)
        _call.set(call)
        await super().aput_writes(config, writes, task_id, task_path)


class RecordingCursor(psycopg.AsyncCursor[Any]):
    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        if (call := _call.get()) is not None:
            call[2].append(_sql(str(query)))
        return await super().execute(query, params, **kwargs)

    async def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> None:
        if (call := _call.get()) is not None:
            call[2].append("many: " + _sql(str(query)))
        await super().executemany(query, params_seq, **kwargs)


@asynccontextmanager
async def official_saver(url: str) -> AsyncIterator[Any]:
    calls: list[Call] = []
    if url.startswith("sqlite"):
        async with aiosqlite.connect(sqlite_path(url)) as conn:
            sqlite_saver = WatchedSqlite(conn)
            await sqlite_saver.setup()
            sqlite_saver.calls = calls

            # The database thread runs one queued function at a time: each is tagged with the
            # call that queued it, so its statements are that call's.
            running: list[Call | None] = [None]
            hop = conn._execute

            async def tagged(fn: Any, *args: Any, **kwargs: Any) -> Any:
                call = _call.get()

                def run() -> Any:
                    running[0] = call
                    try:
                        return fn(*args, **kwargs)
                    finally:
                        running[0] = None

                return await hop(run)

            def seen(sql: str) -> None:
                if running[0] is not None and not sql.lstrip().upper().startswith("SELECT"):
                    # Values out: only the statement's shape is the contract.
                    running[0][2].append(_sql(re.sub(r"x?'[^']*'|\b\d+\b", "?", sql)))

            await conn.set_trace_callback(seen)
            conn._execute = tagged  # type: ignore[method-assign]
            yield sqlite_saver
        return
    async with await psycopg.AsyncConnection.connect(
        normalize_postgres_url(url),
        autocommit=True,
        row_factory=dict_row,
        cursor_factory=RecordingCursor,
    ) as conn:
        pg_saver = WatchedPostgres(conn)
        await pg_saver.setup()
        pg_saver.calls = calls
        yield pg_saver


def test_the_official_savers_calls_and_sql_for_a_two_step_graph(db_url: str) -> None:
    async def record() -> list[Call]:
        async with official_saver(db_url) as saver:
            graph = two_steps().compile(checkpointer=saver)
            config = {"configurable": {"thread_id": "contract-1"}}
            await graph.ainvoke({"seen": []}, config, durability="sync")
            return [c for c in saver.calls if c[0] in ("aput", "aput_writes")]

    calls = asyncio.run(record())
    backend = "sqlite" if db_url.startswith("sqlite") else "postgres"
    expected = json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}
    if os.environ.get("KEEL_RECORD_UPSTREAM"):
        expected[backend] = calls
        EXPECTED.write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    assert calls == expected.get(backend), (
        "LangGraph's savers changed what they are asked or what they issue: see this "
        "module's docstring"
    )


def test_the_special_channels_keel_names_are_langgraphs() -> None:
    """savers.py and timeline.py name LangGraph's private constants themselves (what commits
    at once, where a Send's node is found)."""
    assert savers.ERROR_SOURCE_NODE == constants.ERROR_SOURCE_NODE
    assert savers.NULL_TASK_ID == constants.NULL_TASK_ID
    assert (savers.INTERRUPT, savers.ERROR) == (constants.INTERRUPT, constants.ERROR)
    assert (timeline.TASKS, timeline.PUSH) == (constants.TASKS, constants.PUSH)
    assert {constants.INTERRUPT, constants.ERROR, constants.RESUME} <= savers.SPECIAL


def test_small_writes_are_serialized_on_the_loop_and_large_ones_in_a_thread() -> None:
    """FencedPostgresSaver records a task's writes from upstream's own `aput_writes`; for small
    values (recording.small_state) upstream's hop to a thread to serialize them runs on the
    loop instead. Either way the statements are upstream's, for both of its queries (ordinary
    writes, and special ones that upsert)."""
    from psycopg_pool import AsyncConnectionPool

    config = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c1"}}
    small: list[list[tuple[str, Any]]] = [
        [("n", 1), ("branch:to:b", None)],
        [("text", "short"), ("ratio", 0.5), ("flag", True), ("raw", b"\x00\x01")],
        [(constants.INTERRUPT, "why"), (constants.RESUME, 3)],
        [(constants.RESUME, "yes"), ("n", 2)],  # a resumed task: its resume beside its own
        [("messages", [{"role": "user", "content": "hi " * 100}] * 10)],
    ]
    large: list[list[tuple[str, Any]]] = [
        [("long", "x" * (LARGE + 1))],
        [("n", 1), ("many", list(range(recording.WALK + 1)))],
    ]

    async def both() -> list[tuple[bool, list[Any], list[Any], str, str]]:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool("postgresql://unused", open=False)
        saver = savers.FencedPostgresSaver(pool)
        dumped_on: list[str] = []
        dump = saver._dump_writes

        def watched(*args: Any) -> Any:
            dumped_on.append(threading.current_thread().name)
            return dump(*args)

        saver._dump_writes = watched  # type: ignore[method-assign]
        found = []
        for writes in small + large:
            dumped_on.clear()
            ours = await saver._record_writes(config, writes, "task-1", "~__pregel_pull, a")
            upstream = AsyncPostgresSaver.aput_writes(
                saver, config, writes, "task-1", "~__pregel_pull, a"
            )
            theirs = await saver._record(upstream)
            our_thread, upstream_thread = dumped_on  # each call serialized its writes once
            found.append((writes in small, ours, theirs, our_thread, upstream_thread))
        return found

    portal = Portal(name="keel-test-loop")  # the loop a worker runs on, and its threads
    try:
        results = portal.call(both())
    finally:
        portal.close()
    for is_small, ours, theirs, our_thread, upstream_thread in results:
        assert ours == theirs
        assert upstream_thread.startswith("keel-node")  # upstream's own call: always a hop
        if is_small:
            assert our_thread == "keel-test-loop"
        else:
            assert our_thread.startswith("keel-node")
