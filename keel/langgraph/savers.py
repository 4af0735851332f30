"""LangGraph's official savers, extended only where fencing needs it: one fenced transaction
per step.

LangGraph (durability="sync") hands each task's writes to `aput_writes` without awaiting them
and awaits only the `aput` of the next checkpoint before the next step starts. So, inside an
execution, a task's ordinary writes wait in a buffer (under the run and lease token that
produced them) and commit with their `step` events, the fence check and the next checkpoint in
one transaction at `aput`: when `aput` returns, the checkpoint and every write buffered before it
are durable. Writes the loop or a read depends on before any checkpoint comes (an interrupt, an
error, a resume, a scheduled write, an error handler's source) commit at once, with whatever is
buffered, before `aput_writes` returns; reads flush the buffer first.

Two checkpoints of a run's first execution wait for the first step's: the input's, and, when
the graph's START runs none of the user's code (plain edges out of it), the START step's, a
mapping of that input onto channels. Until they commit, the admission record holds the same
input durably: a crash before the first step commits restarts the run from it, computing both
again, as resuming from them would. (What a key may name of them commits first: see
`Fencing.settle`.)

Upstream's own code still decides every statement: its `aput` / `aput_writes` run against a
recorder (`_cursor` on PostgreSQL, the connection on SQLite), and Keel replays what they issued
inside its transaction (`Store.step_transaction`: one call on SQLite's database thread, one
pipeline on PostgreSQL).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

import aiosqlite
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from keel.backends.locks import TaskReentrantLock
from keel.backends.postgres import PostgresConnector
from keel.backends.sqlite import SqliteConnector
from keel.core.context import _current as _running
from keel.core.errors import LeaseLost, Released, RunCancelled
from keel.core.faults import fault_point
from keel.core.store.base import Connector, EndWith, Later, Row, Statement, Tx, writing
from keel.core.store.store import Store
from keel.langgraph.buffers import Buffer, Buffered, is_last_step, values_size, write_key
from keel.langgraph.executions import Executions
from keel.langgraph.recording import (
    Recorder,
    SqliteConnection,
    SqliteLock,
    recorded,
    recording,
    small_state,
)
from keel.langgraph.timeline import checkpoint_id

T = TypeVar("T")
log = logging.getLogger("keel.savers")

ERROR_SOURCE_NODE = "__error_source_node__"  # the loop awaits it before an error handler runs
NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"  # input, resume and update_state writes
INTERRUPT, ERROR = "__interrupt__", "__error__"
SPECIAL = frozenset(WRITES_IDX_MAP) | {ERROR_SOURCE_NODE}
"""Channels whose writes commit at once: no checkpoint follows an interrupt or an error, and
the loop reads a resume, a scheduled write or an error's source before the next one."""


_read_ahead: ContextVar[list[tuple[str, CheckpointTuple]] | None] = ContextVar(
    "keel_read_ahead", default=None
)


class Fencing(Executions):
    """The step transaction: each step's writes, fenced, with its checkpoint; and reads that see
    this execution's own writes first."""

    async def finish(self, run_id: str, token: int) -> None:
        """The graph returned: every write it made must have committed with a checkpoint. The
        START step's, if it still waits (the graph ended or paused right after it), commits
        now, with its checkpoint."""
        self.plain_starts.discard((run_id, token))
        waiting = self.buffers.get((run_id, token))
        if waiting is not None and waiting.final is not None:
            return  # it, its writes and what waits with it commit with the run's end
        if waiting is not None and waiting.paused:
            return  # a pause's writes commit with the wait's registration (`ending`)
        if waiting is not None and waiting.writes and waiting.deferred:
            await self._flush(run_id, waiting)
        buffer = self.buffers.pop((run_id, token), None)
        if buffer is not None and buffer.writes:
            raise AssertionError(
                f"run {run_id}: {len(buffer.writes)} task write(s) buffered after the graph "
                "returned, never committed (LangGraph wrote after its last checkpoint)"
            )

    # -- writes -------------------------------------------------------------------------------

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        run_id = self._run_of(config)
        token, worker_id, ctx = self._held(run_id)
        event = self.step_event(config, writes, task_path)
        # Between a task finishing and its step's checkpoint (a crash here loses the writes).
        fault_point("checkpoint.before_write", "", event["node"])
        special = task_id == NULL_TASK_ID or any(c in SPECIAL for c, _ in writes)
        staged = ctx.take_staged(task_id) if ctx is not None else []
        if all(c in WRITES_IDX_MAP for c, _ in writes):
            # The task failed or paused: it runs again and stages its rows again, under the
            # same keys. (A resumed task's writes carry the resume beside its own: kept.)
            staged = []
        where = (str(config["configurable"].get("checkpoint_ns", "")), checkpoint_id(config))
        recorded = asyncio.get_running_loop().create_future()
        buffer = self._buffer(run_id, token, worker_id) if ctx is not None else None
        if buffer is None:
            # Outside an execution (tools, tests, the conformance suite): nothing to batch with.
            entry = Buffered(token, write_key(token, where, task_id, 0), event, staged, recorded)
        else:
            # In the buffer before anything is awaited: LangGraph starts this call before the
            # `aput` of the step's checkpoint, which must take these writes with it.
            n = buffer.counts.get(f"{where}{task_id}", 0)
            buffer.counts[f"{where}{task_id}"] = n + 1
            entry = Buffered(token, write_key(token, where, task_id, n), event, staged, recorded)
            buffer.writes.append(entry)
        try:
            statements = await self._record_writes(config, writes, task_id, task_path)
        except BaseException as exc:
            recorded.set_exception(exc)
            recorded.exception()  # retrieved: whoever commits the buffer raises it again
            raise
        recorded.set_result(statements)
        if buffer is None:
            await self._commit(run_id, token, worker_id, [entry], None)
        elif special or where in buffer.settled:
            channels = {c for c, _ in writes}
            if INTERRUPT in channels or (ERROR in channels and ERROR_SOURCE_NODE not in channels):
                buffer.settled.add(where)  # no checkpoint follows (an error handler's would)
            if INTERRUPT in channels:
                buffer.paused.add(where)
            # A pause's writes wait for the registration; any other of these the loop reads
            # before a checkpoint comes (a resume, a scheduled write, an error's source).
            urgent = task_id == NULL_TASK_ID or any(
                c in SPECIAL and c != INTERRUPT for c, _ in writes
            )
            if urgent or where not in buffer.paused:
                await self._flush(run_id, buffer)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        run_id = self._run_of(config)
        token, worker_id, ctx = self._held(run_id)
        self.remember_sends(checkpoint)
        if not config["configurable"].get("checkpoint_ns"):
            self.roots[(run_id, token)] = checkpoint["id"]
        recorder: list[Statement] = []
        # Upstream serializes the changed channels it keeps as blobs in a thread: here, if
        # they are small (the others it does not serialize, so they are not looked at).
        values = checkpoint["channel_values"]
        changed = (values[channel] for channel in new_versions if channel in values)
        with recorded(recorder, inline=small_state(changed)):
            next_config: RunnableConfig = await super().aput(  # type: ignore[misc]
                config, checkpoint, metadata, new_versions
            )
        if (
            ctx is not None
            and (run_id, token) in self.first_executions
            and metadata.get("source") == "input"
        ):
            # Nothing to make durable yet: the run's admitted input is (see Buffer.deferred).
            self.unwritten.discard((run_id, token))
            self.first_executions.discard((run_id, token))
            held = self._buffer(run_id, token, worker_id)
            held.deferred = recorder
            held.input_step = int(metadata.get("step", -1))
            return next_config
        buffer = self.buffers.get((run_id, token)) if ctx is not None else None
        if (
            buffer is not None
            and buffer.deferred  # the input's checkpoint: nothing of the run committed yet
            and (run_id, token) in self.plain_starts
            and buffer.input_step is not None
            and metadata.get("step") == buffer.input_step + 1  # 0 on a new thread
            and not config["configurable"].get("checkpoint_ns")
        ):
            # The START step's checkpoint: the admitted input on channels. It and its writes
            # commit with the first step's (the module's docstring says why that is safe).
            self.plain_starts.discard((run_id, token))
            buffer.deferred.extend(recorder)
            return next_config
        if ctx is not None and self._is_last(run_id, token, config, checkpoint, metadata):
            # Nothing runs after it but the graph's return: it commits with the run's end (a
            # read before that commits it first, and reads find it in the database).
            self.unwritten.discard((run_id, token))
            self._buffer(run_id, token, worker_id).final = recorder
            return next_config
        writes, buffer_writes = (buffer.writes, buffer) if buffer else ([], None)
        if buffer_writes is not None:
            buffer_writes.writes = []
        try:
            fence, _ = await self._commit(run_id, token, worker_id, writes, recorder)
        except BaseException:
            if buffer_writes is not None:
                buffer_writes.writes[:0] = writes  # not committed: still this execution's
            raise
        # The checkpoint is durable: a cancelled or released run stops here and loses nothing.
        if fence["cancel_requested"]:
            raise RunCancelled(f"run {run_id} was cancelled")
        if self.draining:
            raise Released(f"run {run_id} released at a step boundary")
        return next_config

    def _is_last(
        self,
        run_id: str,
        token: int,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
    ) -> bool:
        if metadata.get("source") != "loop" or config["configurable"].get("checkpoint_ns"):
            return False  # a step's checkpoint of the run's own graph only
        return is_last_step(checkpoint, self.triggers.get((run_id, token)))

    def ending(self, run_id: str, token: int, *, pause: bool = False) -> EndWith | None:
        """The execution's last transaction, committed with what waits for it (None if nothing
        does): the run's end, with its last step's checkpoint; or (`pause`) the registration
        of the waits it paused on, with the pause's writes and the checkpoints still held
        back (the input's and START's of a first step that paused, a last step's before
        `interrupt_after`). One transaction, the fence first, then the step's events and
        writes, the checkpoints, the end. A cancel asked meanwhile ends nothing there: the
        checkpoint commits, and RunCancelled stops the run as at any other step's boundary.
        (An end takes no input checkpoint: a run cancelled or failed before its first step
        leaves its thread's state as it was.)"""
        buffer = self.buffers.get((run_id, token))
        if buffer is None or (
            buffer.final is None and not buffer.writes and not (pause and buffer.deferred)
        ):
            return None
        held = buffer
        return lambda end: self._flush(run_id, held, end)

    async def settle(self, run_id: str, token: int) -> None:
        """Commit the checkpoints an execution holds back, with their writes, before anything
        that names them happens: an effect inside a subgraph in the first step has a key that
        names its parent task by its id, which comes from the START step's checkpoint (see
        `ids.namespace_without_task_ids`). Nothing to do once they committed."""
        buffer = self.buffers.get((run_id, token))
        if buffer is not None and (buffer.deferred or buffer.final is not None):
            await self._flush(run_id, buffer)

    async def _flush(
        self, run_id: str, buffer: Buffer, end: Callable[[Tx], Awaitable[Later]] | None = None
    ) -> Row | None:
        """Commit what the buffer holds (and `end`, the run's end, after it); `end`'s row."""
        writes, buffer.writes = buffer.writes, []
        final, buffer.final = buffer.final, None
        if end is None and not writes and not buffer.deferred and final is None:
            return None
        try:
            fence, ended = await self._commit(
                run_id, buffer.token, buffer.worker_id, writes, final, then=end
            )
        except BaseException:
            buffer.writes[:0] = writes
            buffer.final = final
            raise
        if final is not None and fence["cancel_requested"] and ended is None:
            # The last step's boundary, reached at the run's end or late (a read, or a pause
            # after it, needed it): a cancel asked meanwhile stops the run, unless the end
            # committed (a cancelled run's own end).
            raise RunCancelled(f"run {run_id} was cancelled")
        return ended

    async def _commit(
        self,
        run_id: str,
        token: int,
        worker_id: str,
        writes: list[Buffered],
        checkpoint: list[Statement] | None,
        then: Callable[[Tx], Awaitable[Later]] | None = None,
    ) -> tuple[Row, Row | None]:
        """One fenced transaction: the fence, each task's `step` event, staged rows and writes,
        then the checkpoint, then `then`'s statement (the run's end). Nothing commits unless
        `token` still holds the run. The fence's row, and `then`'s."""
        # From here on (even if this commit's outcome is unknown) reads go to the database.
        self.unwritten.discard((run_id, token))
        self.first_executions.discard((run_id, token))
        earlier = self.before_commit.get((run_id, token))
        if earlier is not None:
            await earlier()
        if checkpoint is not None:
            fault_point("checkpoint.before_write", "", "")
        stale = [w for w in writes if w.token != token]
        if stale:  # a buffer is one execution's: a write never commits under another token
            raise LeaseLost(f"run {run_id}: a write of token {stale[0].token} under {token}")
        recorded = [await w.recorded for w in writes]
        buffer = self.buffers.get((run_id, token))
        deferred, buffer_deferred = (buffer.deferred, buffer) if buffer else ([], None)
        if buffer_deferred is not None:
            buffer_deferred.deferred = []

        async def step(tx: Tx) -> Any:
            fence = await self.store.fence_step(tx, run_id, token)
            for statement in deferred:
                await tx.replay(statement)
            for write, statements in zip(writes, recorded, strict=True):
                await self.store.add_event(
                    tx, run_id, "step", write.event, worker_id=worker_id, token=token, key=write.key
                )
                for staged in write.staged:
                    await staged(self.store, tx)
                for statement in statements:
                    await tx.replay(statement)
            for statement in checkpoint or ():
                await tx.replay(statement)
            return fence, (await then(tx) if then is not None else None)

        size = writing.set(values_size(deferred, *recorded, checkpoint or ()))
        try:
            try:
                fence, ended = await self.store.step_transaction(step)
            except Exception as exc:
                if not self.store.is_infrastructure(exc):
                    raise
                # A lost connection or a failed commit: the step may or may not have committed.
                # Once more, on a fresh connection: every statement of it is idempotent
                # (upstream's upserts and INSERT ... DO NOTHING, step events by key, staged rows
                # by their deterministic keys), so a step that did commit commits nothing twice.
                log.warning("run %s: step transaction failed (%r); retrying it once", run_id, exc)
                fence, ended = await self.store.step_transaction(step)
        except BaseException:
            if buffer_deferred is not None:
                buffer_deferred.deferred[:0] = deferred  # not committed: still to be written
            raise
        finally:
            writing.reset(size)
        if checkpoint is not None:
            self.progressed.add((run_id, token))
        if (checkpoint is not None or deferred) and (run_id, token) in self.roots:
            self.anchors[(run_id, token)] = self.roots[(run_id, token)]
        return await fence(), (await ended() if ended is not None else None)

    async def _record_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> list[Statement]:
        """Upstream's statements for a task's writes, recorded from its own `aput_writes`."""
        call = super().aput_writes(config, writes, task_id, task_path)  # type: ignore[misc]
        return await self._record(call, inline=small_state(value for _, value in writes))

    async def _record(
        self, call: Coroutine[Any, Any, Any], *, inline: bool = False
    ) -> list[Statement]:
        recorder: list[Statement] = []
        with recorded(recorder, inline=inline):
            await call
        return recorder

    # -- reads: this execution's own writes first ---------------------------------------------

    async def _flush_for(self, config: RunnableConfig | None) -> None:
        ctx = _running.get()
        if ctx is None or config is None:
            return
        if str(config.get("configurable", {}).get("thread_id")) != ctx.thread:
            return
        buffer = self.buffers.get((ctx.run_id, ctx.token))
        if buffer is not None and (buffer.writes or buffer.deferred or buffer.final is not None):
            await self._flush(ctx.run_id, buffer)

    def read_ahead(self, thread_id: str, found: CheckpointTuple) -> None:
        """The executor just read the thread's latest checkpoint: LangGraph's loop, which reads
        it again as it starts, gets this one (once, in this execution) instead of a second
        read."""
        _read_ahead.set([(thread_id, found)])
        ctx = _running.get()
        if ctx is not None and (found.metadata or {}).get("keel_run_id") == ctx.run_id:
            # Its own checkpoint (a thread's turn starting on an earlier run's is none).
            self.anchors.setdefault((ctx.run_id, ctx.token), str(found.checkpoint["id"]))

    def anchor(self, run_id: str, token: int) -> str:
        """The id of the last root checkpoint the execution under `token` knows committed:
        its own last, or the one it started from (`""`: none)."""
        return self.anchors.get((run_id, token), "")

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        ahead = _read_ahead.get()
        configurable = config.get("configurable", {})
        if (
            ahead
            and ahead[0][0] == str(configurable.get("thread_id"))
            and not configurable.get("checkpoint_ns")
            and not configurable.get("checkpoint_id")
        ):
            return ahead.pop()[1]
        if self._unwritten(config):
            return None
        await self._flush_for(config)
        found: CheckpointTuple | None = await super().aget_tuple(config)  # type: ignore[misc]
        if found is not None:
            self.remember_sends(found.checkpoint)  # a resumed run's pending sends
        return found

    def _unwritten(self, config: RunnableConfig) -> bool:
        """Whether `config` asks for the latest root checkpoint of a run that has none yet: the
        first read of a first execution, before any of its writes was committed."""
        configurable = config.get("configurable", {})
        if configurable.get("checkpoint_ns") or configurable.get("checkpoint_id"):
            return False
        run_id = self._run_of(config)
        held = self.holders.get(run_id)
        return held is not None and (run_id, held[0]) in self.unwritten

    async def alist(
        self, config: RunnableConfig | None, **kwargs: Any
    ) -> AsyncIterator[CheckpointTuple]:
        await self._flush_for(config)
        # Closed with this generator: upstream's holds the connection's lock while it lists.
        async with aclosing(super().alist(config, **kwargs)) as items:  # type: ignore[misc]
            async for item in items:
                yield item

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, Any]:
        await self._flush_for(config)
        history: Mapping[str, Any] = await super().aget_delta_channel_history(  # type: ignore[misc]
            config=config, channels=channels
        )
        return history


class FencedSqliteSaver(Fencing, AsyncSqliteSaver):
    """AsyncSqliteSaver on Keel's own connection; its writes replayed in Keel's transaction."""

    def __init__(self, conn: aiosqlite.Connection, lock: TaskReentrantLock) -> None:
        super().__init__(conn)
        self.conn = SqliteConnection(conn)  # type: ignore[assignment]
        # One lock for every user of the connection (upstream takes it around its reads).
        self.lock = SqliteLock(lock)  # type: ignore[assignment]


class FencedPostgresSaver(Fencing, AsyncPostgresSaver):
    """AsyncPostgresSaver whose writes are replayed in Keel's pipelined step transaction."""

    def __init__(self, pool: AsyncConnectionPool[AsyncConnection[DictRow]]) -> None:
        super().__init__(pool)

    @asynccontextmanager
    async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[Any]:
        into = recording.get()
        if into is not None:
            # Upstream serializes blobs inside its cursor: recorded, no connection waits on it.
            yield Recorder(into)
            return
        async with super()._cursor(pipeline=pipeline) as cur:
            yield cur


FencedSaver = FencedSqliteSaver | FencedPostgresSaver


def make_saver(connector: Connector, store: Store) -> FencedSaver:
    """The official LangGraph saver for the connector's database, fenced, on its connections."""
    saver: FencedSaver
    if isinstance(connector, SqliteConnector):
        saver = FencedSqliteSaver(connector.connection, connector.lock)
    elif isinstance(connector, PostgresConnector):
        saver = FencedPostgresSaver(connector.pool)
    else:
        raise TypeError(f"no LangGraph saver for {type(connector).__name__}")
    saver.bind(store)
    return saver
