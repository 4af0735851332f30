"""The store's queries on threads: conversations of many runs over one checkpoint lineage
(part of `Store`).

A thread's status is never stored: each read derives it from its runs (`get_thread`), so it
cannot disagree with them.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from keel.core.store.base import Connector, Later, Row, Tx
from keel.core.store.run_queries import NewRun


@dataclass(frozen=True)
class ThreadPlace:
    """Where and how a run on a thread starts, beside what every run has (`NewRun`)."""

    thread_id: str
    thread_seq: int
    command: str | None
    """LangGraph's Command (resume, update, goto) as JSON, or None: the run starts from input."""
    checkpoint_id: str | None
    """A past checkpoint of the thread the run forks from; None: the thread's latest."""
    config: str | None
    """Its configurable, context and metadata as JSON."""
    multitask_strategy: str


class ThreadQueries:
    db: Connector

    @staticmethod
    async def take_thread(
        tx: Tx, thread_id: str, *, create: bool, workflow: str, version: str, metadata: str
    ) -> Row | None:
        """The thread, created if `create` and missing, held until `tx` ends (admissions on
        one thread are serialized); None: no such thread."""
        taken = await ThreadQueries.send_take_thread(
            tx, thread_id, create=create, workflow=workflow, version=version, metadata=metadata
        )
        return await taken()

    @staticmethod
    async def send_take_thread(
        tx: Tx, thread_id: str, *, create: bool, workflow: str, version: str, metadata: str
    ) -> Later:
        """`take_thread`, sent: statements sent after it run under its lock, and the row
        comes back with theirs (one round trip on PostgreSQL)."""
        return await tx.send(
            "take_thread",
            {
                "thread_id": thread_id,
                "create": int(create),
                "workflow": workflow,
                "workflow_version": version,
                "metadata": metadata,
            },
        )

    async def create_thread(
        self, thread_id: str, *, workflow: str, version: str, metadata: str
    ) -> Row | None:
        """A new thread; None if one of that id exists."""
        async with self.db.transaction() as tx:
            return await tx.one(
                "create_thread",
                {
                    "thread_id": thread_id,
                    "workflow": workflow,
                    "workflow_version": version,
                    "metadata": metadata,
                },
            )

    async def get_thread(self, thread_id: str) -> Row | None:
        async with self.db.read() as tx:
            return await tx.one("get_thread", {"thread_id": thread_id})

    async def search_threads(
        self,
        *,
        metadata: dict[str, Any],
        workflow: str | None,
        status: str | None,
        limit: int,
        offset: int,
    ) -> list[Row]:
        async with self.db.read() as tx:
            return await tx.all(
                "search_threads",
                {
                    "metadata": json.dumps(metadata),
                    "workflow": workflow,
                    "status": status,
                    "limit": limit,
                    "offset": offset,
                },
            )

    async def update_thread_metadata(self, thread_id: str, metadata: dict[str, Any]) -> Row | None:
        async with self.db.transaction() as tx:
            return await tx.one(
                "update_thread_metadata", {"thread_id": thread_id, "metadata": json.dumps(metadata)}
            )

    @staticmethod
    async def merge_thread_metadata(tx: Tx, thread_id: str, metadata: dict[str, Any]) -> None:
        """`update_thread_metadata` inside another write (an admission's)."""
        await tx.one(
            "update_thread_metadata", {"thread_id": thread_id, "metadata": json.dumps(metadata)}
        )

    async def thread_runs(
        self, thread_id: str, limit: int = 1000, *, newest: bool = False
    ) -> list[Row]:
        """The thread's first `limit` runs in their order; `newest`: its last ones, newest
        first."""
        query = "thread_runs_newest" if newest else "thread_runs"
        async with self.db.read() as tx:
            return await tx.all(query, {"thread_id": thread_id, "limit": limit})

    async def thread_active_run(self, thread_id: str) -> Row | None:
        """The thread's active run (its first unfinished one), however many runs it has."""
        async with self.db.read() as tx:
            return await tx.one("thread_active_run", {"thread_id": thread_id})

    async def thread_runs_after(self, thread_id: str, after: int, limit: int = 100) -> list[Row]:
        """The thread's runs placed after `after` (a `thread_seq`), in their order."""
        async with self.db.read() as tx:
            params = {"thread_id": thread_id, "after": after, "limit": limit}
            return await tx.all("thread_runs_after", params)

    @staticmethod
    async def thread_unfinished(tx: Tx, thread_id: str) -> list[Row]:
        """The thread's queued, running and waiting runs, in their order."""
        return await tx.all("thread_unfinished", {"thread_id": thread_id})

    @staticmethod
    async def insert_thread_run(tx: Tx, run: NewRun, place: ThreadPlace) -> None:
        """Admit a run (queued) on a thread at its place, which the caller read under
        `take_thread` (`next_thread_seq`, `thread_place`); nothing if it was already admitted
        (the caller read it first)."""
        await tx.execute("insert_thread_run", {**asdict(run), **asdict(place)})

    @staticmethod
    async def thread_place(
        tx: Tx, thread_id: str
    ) -> Callable[[], Awaitable[tuple[int, list[Row]]]]:
        """Sent, to read under `take_thread`'s lock: the place the next run on the thread takes
        and its unfinished runs (queued, running, waiting: run_id, status, thread_seq) in
        their order."""
        sent = await tx.send("thread_place", {"thread_id": thread_id})

        async def read() -> tuple[int, list[Row]]:
            row = await sent()
            assert row is not None
            runs = sorted(json.loads(row["unfinished"]), key=lambda r: int(r["thread_seq"]))
            return int(row["seq"]), runs

        return read

    @staticmethod
    async def lock_thread(tx: Tx, thread_id: str) -> Row | None:
        """The thread's row (its id and `first_seq`), held until `tx` ends: a deletion of it
        waits, and so does an admission on it. None if there is no such thread."""
        return await tx.one("lock_thread", {"thread_id": thread_id})

    @staticmethod
    async def next_thread_seq(tx: Tx, thread_id: str) -> int:
        row = await tx.one("next_thread_seq", {"thread_id": thread_id})
        assert row is not None
        return int(row["seq"])

    @staticmethod
    async def set_cancel_reason(tx: Tx, run_id: str, reason: str) -> None:
        await tx.execute("set_cancel_reason", {"run_id": run_id, "reason": reason})

    @staticmethod
    async def discard_rolled_back(tx: Tx, thread_id: str) -> int:
        """Delete the checkpoints the thread's rolled-back runs wrote; how many."""
        row = await tx.one("rolled_back_checkpoints", {"thread_id": thread_id})
        return int(row["discarded"]) if row else 0

    async def delete_thread(self, thread_id: str) -> Row | None:
        """The thread, its checkpoints, the effect rows its runs shared (`key=` on a thread)
        and the schedules on it deleted, unless a run of it is unfinished: that run (its
        first), and nothing deleted. Decided under the thread's lock, which an admission on it
        takes: no run is left unfinished on a thread gone (a new thread of its id would own
        it), and no tick of its schedules makes it again."""
        async with self.db.transaction() as tx:
            params = {"thread_id": thread_id}
            await tx.all("lock_thread_schedules", params)
            if await tx.one("lock_thread", params) is None:
                return None
            active = await tx.one("thread_active_run", params)
            if active is not None:
                return active
            await tx.one("delete_thread_schedules", params)  # two statements on SQLite: a chain
            await tx.one("delete_thread", params)
            return None

    async def copy_thread(self, from_thread: str, to_thread: str) -> Row | None:
        """A copy of the thread's checkpoints under a new thread; None if `from_thread` does
        not exist or `to_thread` does."""
        async with self.db.transaction() as tx:
            return await tx.one("copy_thread", {"from_thread": from_thread, "to_thread": to_thread})
