"""LangGraph's official savers, extended only where fencing needs it.

Each checkpoint write (`aput`, `aput_writes`) runs inside Keel's fenced transaction: the run's
lease token is checked (and, on PostgreSQL, its row locked FOR SHARE) in the same transaction
as the write, together with the timeline's `step` event. A worker that lost its lease gets
LeaseLost instead of forking the run's history.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

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
from psycopg import AsyncConnection, AsyncCursor
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from keel.backends.locks import TaskReentrantLock
from keel.backends.postgres import PostgresConnector
from keel.backends.sqlite import SqliteConnector
from keel.core.context import StagedWrite
from keel.core.context import _current as _running
from keel.core.errors import LeaseLost, Released, RunCancelled
from keel.core.faults import fault_point
from keel.core.store.base import Connector, Tx
from keel.core.store.store import Store


class Fencing:
    """The leases this process holds, and the fenced transaction around each write."""

    store: Store

    def bind(self, store: Store) -> None:
        self.store = store
        self.holders: dict[str, tuple[int, str]] = {}
        self.sends: dict[str, list[str]] = {}
        """Per checkpoint id, the nodes its pending `Send`s go to: a push task's path names
        only its index, and the timeline should name the node."""

    def remember_sends(self, checkpoint: Checkpoint) -> None:
        pending = checkpoint.get("channel_values", {}).get(TASKS) or []
        nodes = [str(getattr(send, "node", "")) for send in pending]
        if nodes:
            self.sends[checkpoint["id"]] = nodes
            while len(self.sends) > MAX_REMEMBERED:
                del self.sends[next(iter(self.sends))]

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        found: CheckpointTuple | None = await super().aget_tuple(config)  # type: ignore[misc]
        if found is not None:
            self.remember_sends(found.checkpoint)  # a resumed run's pending sends
        return found

    def step_event(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_path: str
    ) -> dict[str, Any]:
        data = step_event(config, writes, task_path)
        parts = [p.strip() for p in task_path.lstrip("~").split(",")]
        if parts[0] == PUSH and len(parts) > 1 and parts[1].isdigit():
            index = int(parts[1])
            nodes = self.sends.get(str(config["configurable"].get("checkpoint_id")), [])
            if index < len(nodes):
                data.update(node=nodes[index], index=index)
        return data

    def hold(self, run_id: str, token: int, worker_id: str) -> None:
        self.holders[run_id] = (token, worker_id)

    def drop(self, run_id: str, token: int) -> None:
        # Only our own hold: this process may already run the same run again under a newer token.
        if self.holders.get(run_id, (None,))[0] == token:
            del self.holders[run_id]

    draining: bool = False
    """Set when the worker stops: runs give their lease back at their next step boundary."""

    @staticmethod
    def take_staged(task_id: str, writes: Sequence[tuple[str, Any]]) -> list[StagedWrite]:
        """What the task staged, to commit with its writes; nothing if they are all special
        (an error, an interrupt): the node runs again and stages the same intents again. A
        resumed task's writes carry its resume value beside its ordinary ones: they commit."""
        ctx = _running.get()
        staged = ctx.take_staged(task_id) if ctx is not None else []
        return [] if all(c in WRITES_IDX_MAP for c, _ in writes) else staged

    @asynccontextmanager
    async def fenced_write(
        self,
        config: RunnableConfig,
        step: dict[str, Any] | None = None,
        staged: Sequence[StagedWrite] = (),
    ) -> AsyncIterator[Tx]:
        """The write's transaction, fenced; a checkpoint (step is None) is a step boundary."""
        run_id = str(config["configurable"]["thread_id"])
        ctx = _running.get()
        # The writing execution's own token when it is known: a stale execution in this process
        # must not borrow the newer token a re-claim of the same run holds.
        held = (ctx.token, ctx.worker_id) if ctx and ctx.run_id == run_id else None
        held = held or self.holders.get(run_id)
        if held is None:
            raise LeaseLost(f"run {run_id}: this process holds no lease for a checkpoint write")
        token, worker_id = held
        async with self.store.transaction() as tx:
            fence = await self.store.check_fence(tx, run_id, token)
            # A task's writes name their node; a checkpoint follows the writes of its step.
            fault_point("checkpoint.before_write", "", step["node"] if step else "")
            if step is not None:
                await self.store.add_event(
                    tx, run_id, "step", step, worker_id=worker_id, token=token
                )
            for write in staged:
                await write(self.store, tx)
            yield tx
        if step is None:
            # The checkpoint is durable: a cancelled or released run stops here and loses nothing.
            if fence["cancel_requested"]:
                raise RunCancelled(f"run {run_id} was cancelled")
            if self.draining:
                raise Released(f"run {run_id} released at a step boundary")


TASKS, PUSH = "__pregel_tasks", "__pregel_push"  # LangGraph's channel of Sends, its push tasks
MAX_REMEMBERED = 256


def step_event(config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_path: str) -> dict:
    parts = [p.strip() for p in task_path.lstrip("~").split(",")]
    node = parts[1] if len(parts) > 1 and parts[0] == "__pregel_pull" else task_path
    data: dict[str, Any] = {
        "node": node,
        "writes": sorted({c for c, _ in writes if not c.startswith("branch:")}),
    }
    if ns := config["configurable"].get("checkpoint_ns"):
        data["namespace"] = ns.split(":", 1)[0]
    return data


class FencedSqliteSaver(Fencing, AsyncSqliteSaver):
    """AsyncSqliteSaver on Keel's own connection; writes fenced under BEGIN IMMEDIATE."""

    def __init__(self, conn: aiosqlite.Connection, lock: TaskReentrantLock) -> None:
        super().__init__(conn)
        # One lock for every user of the connection; the saver re-enters it inside our txn.
        self.lock = lock  # type: ignore[assignment]

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self.remember_sends(checkpoint)
        async with self.fenced_write(config):
            return await super().aput(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        step, staged = self.step_event(config, writes, task_path), self.take_staged(task_id, writes)
        async with self.fenced_write(config, step, staged):
            await super().aput_writes(config, writes, task_id, task_path)


_fenced_conn: ContextVar[AsyncConnection[DictRow] | None] = ContextVar(
    "keel_fenced_conn", default=None
)
_deferred_write: ContextVar[tuple[RunnableConfig, dict[str, Any], list[StagedWrite]] | None] = (
    ContextVar("keel_deferred_write", default=None)
)


class FencedPostgresSaver(Fencing, AsyncPostgresSaver):
    """AsyncPostgresSaver whose writes join Keel's fenced transaction on one connection."""

    def __init__(self, pool: AsyncConnectionPool[AsyncConnection[DictRow]]) -> None:
        super().__init__(pool)

    @asynccontextmanager
    async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[AsyncCursor[DictRow]]:
        deferred = _deferred_write.get()
        if deferred is not None:
            async with (
                self.fenced_write(*deferred) as tx,
                tx.connection.cursor(binary=True, row_factory=dict_row) as cur,  # type: ignore[attr-defined]
            ):
                yield cur
            return
        conn = _fenced_conn.get()
        if conn is None:
            async with super()._cursor(pipeline=pipeline) as cur:
                yield cur
            return
        async with conn.cursor(binary=True, row_factory=dict_row) as cur:
            yield cur

    @asynccontextmanager
    async def _joined(
        self, config: RunnableConfig, step: dict[str, Any] | None = None
    ) -> AsyncIterator[None]:
        async with self.fenced_write(config, step) as tx:
            token = _fenced_conn.set(tx.connection)  # type: ignore[attr-defined]
            try:
                yield
            finally:
                _fenced_conn.reset(token)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self.remember_sends(checkpoint)
        async with self._joined(config):
            return await super().aput(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        # LangGraph serializes the writes in a worker thread, then asks for a cursor: the fenced
        # transaction opens at that cursor, so its pooled connection never waits for a thread
        # (sync nodes may hold every thread while they wait for a connection).
        step, staged = self.step_event(config, writes, task_path), self.take_staged(task_id, writes)
        deferred = _deferred_write.set((config, step, staged))
        try:
            await super().aput_writes(config, writes, task_id, task_path)
        finally:
            _deferred_write.reset(deferred)


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
