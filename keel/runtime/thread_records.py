"""A thread's records on `keel.AsyncApp`: create, read, search, update, copy and delete
threads, and list their runs. Their state, runs and answers build on these
(keel.runtime.conversations)."""

from __future__ import annotations

from typing import Any

from keel.core import threads
from keel.core.codec import check_storable, dumps, loads
from keel.core.errors import ThreadBusy, ThreadNotFound, UsageError
from keel.core.store.base import Row
from keel.runtime.runtime import Runtime


class ThreadRecords:
    """The thread record operations of `AsyncApp` (`runtime` is the app's)."""

    runtime: Runtime

    async def open(self) -> None: ...  # AsyncApp's

    async def create_thread(
        self,
        workflow: str,
        *,
        thread_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        if_exists: str = "raise",
    ) -> Row:
        """A new thread of `workflow` (its id generated unless given). An existing id raises
        UsageError, or with `if_exists="do_nothing"` returns that thread."""
        await self.open()
        if if_exists not in ("raise", "do_nothing"):
            raise UsageError(f"if_exists must be raise or do_nothing, not {if_exists!r}")
        wf = self.runtime.workflows.get(workflow, None)
        tid = threads.new_id() if thread_id is None else threads.validate_thread_id(thread_id)
        made = await self.runtime.store.create_thread(
            tid, workflow=wf.name, version=wf.version, metadata=_metadata_json(metadata)
        )
        if made is None and if_exists == "raise":
            raise UsageError(f"thread {tid} already exists")
        return await self.get_thread(tid)

    async def get_thread(self, thread_id: str) -> Row:
        """The thread: workflow, metadata, `status` (idle, busy, interrupted, error, from its
        runs) and `runs`, how many; ThreadNotFound if there is none."""
        await self.open()
        threads.validate_thread_id(thread_id)
        row = await self.runtime.store.get_thread(thread_id)
        if row is None:
            raise ThreadNotFound(f"no thread {thread_id!r}")
        return _thread(row)

    async def search_threads(
        self,
        *,
        metadata: dict[str, Any] | None = None,
        workflow: str | None = None,
        status: str | None = None,
        limit: int = 10,
        offset: int = 0,
    ) -> list[Row]:
        """Threads whose metadata contains `metadata` (JSON containment, PostgreSQL's `@>`, on
        both backends), most recently updated first."""
        await self.open()
        if status is not None and status not in ("idle", "busy", "interrupted", "error"):
            raise UsageError(f"status must be idle, busy, interrupted or error, not {status!r}")
        rows = await self.runtime.store.search_threads(
            metadata=dict(metadata or {}),
            workflow=workflow,
            status=status,
            limit=max(1, min(int(limit), 1000)),
            offset=max(0, int(offset)),
        )
        return [_thread(r) for r in rows]

    async def update_thread(self, thread_id: str, *, metadata: dict[str, Any]) -> Row:
        """Merge keys into the thread's metadata."""
        await self.open()
        threads.validate_thread_id(thread_id)
        check_storable(metadata, "metadata")
        if await self.runtime.store.update_thread_metadata(thread_id, metadata) is None:
            raise ThreadNotFound(f"no thread {thread_id!r}")
        return await self.get_thread(thread_id)

    async def delete_thread(self, thread_id: str) -> None:
        """Delete the thread and its checkpoints; ThreadBusy while a run on it is unfinished.
        The ledger rows its runs shared (`key=` effects on a thread) go too: the thread's
        scope ends with it; so do the schedules on it (LangGraph's server deletes a thread's
        crons with it), or their next tick would make it again. Its runs, their timelines and
        the rest of their ledgers stay (retention prunes them): what they performed stays on
        record."""
        await self.get_thread(thread_id)
        active = await self.runtime.store.delete_thread(thread_id)
        if active is not None:
            raise ThreadBusy(
                f"thread {thread_id} has an unfinished run; cancel it first",
                thread_id=thread_id,
                active_run=str(active["run_id"]),
            )

    async def copy_thread(self, thread_id: str, *, to: str | None = None) -> Row:
        """A new thread holding a copy of the thread's checkpoints (its history); its runs
        stay with the original."""
        await self.get_thread(thread_id)
        target = threads.new_id() if to is None else threads.validate_thread_id(to)
        if await self.runtime.store.copy_thread(thread_id, target) is None:
            raise UsageError(f"thread {target} already exists")
        return await self.get_thread(target)

    async def thread_runs(
        self, thread_id: str, limit: int = 1000, *, newest: bool = False
    ) -> list[Row]:
        """The thread's first `limit` runs in their order, or with `newest` its last ones,
        newest first (rolled-back and interrupted ones included: their `termination_reason`
        says so, and their effects stay in their ledgers)."""
        await self.get_thread(thread_id)
        return await self.runtime.store.thread_runs(thread_id, limit, newest=newest)

    async def active_run(self, thread_id: str) -> Row | None:
        """The thread's active run: its first queued, running or waiting run (None when all
        are finished), however many runs the thread has."""
        await self.get_thread(thread_id)
        return await self.runtime.store.thread_active_run(thread_id)


def _metadata_json(metadata: dict[str, Any] | None) -> str:
    if metadata is not None and not isinstance(metadata, dict):
        raise UsageError("metadata must be an object")
    check_storable(metadata, "metadata")
    return dumps(metadata or {})


def _thread(row: Row) -> Row:
    metadata = row["metadata"]
    return {**row, "metadata": loads(metadata) if isinstance(metadata, str) else metadata}
