"""The store's queries for operators (part of `Store`): following a timeline by cursor, the
figures /metrics reports, and deleting finished runs."""

from __future__ import annotations

import json
from typing import Any

from keel.core.codec import loads
from keel.core.store.base import Connector, Row, Tx

# One run's rows in every table that holds them, children first, each with the query that
# deletes them (a prune reports its counts by table); LangGraph's checkpoint tables are keyed
# by thread_id, which is the run's id.
PRUNED_TABLES = {
    "events": "prune_events",
    "effects": "prune_effects",
    "waits": "prune_waits",
    "outbox": "prune_notifications",
    "intents": "prune_intents",
    "checkpoints": "prune_checkpoints",
    "checkpoint_writes": "prune_checkpoint_writes",
    "checkpoint_blobs": "prune_checkpoint_blobs",
    "stream_chunks": "prune_stream_chunks",
    "webhooks": "prune_webhooks",
    "hook_deliveries": "prune_hook_deliveries",
}


class OpsQueries:
    db: Connector

    # -- following a timeline -------------------------------------------------------------------

    async def events_after(self, run_id: str, after: int = 0, limit: int = 500) -> list[Row]:
        """A run's events with an id above `after`, in order: ids grow in commit order on both
        backends, so `after` = the last id seen resumes without gaps or repeats."""
        async with self.db.read() as tx:
            rows = await tx.all("events_after", {"run_id": run_id, "after": after, "limit": limit})
        for row in rows:
            row["data"] = loads(row["data"])
        return rows

    # -- metrics --------------------------------------------------------------------------------

    async def metrics_snapshot(self) -> dict[str, Any]:
        """What the database says right now, by its own clock (`now`): runs per workflow and
        status, the queue, the ledger per state, open waits, notifications ("outbox") and
        intents, the oldest overdue sweep."""
        async with self.db.read() as tx:
            now = await tx.one("database_now")
            queue = await tx.one("metrics_queue")
            overdue = await tx.one("metrics_overdue")
            return {
                "now": float(now["now"]) if now else 0.0,
                "runs": await tx.all("metrics_runs"),
                "queue": queue or {"n": 0, "oldest": None},
                "effects": await tx.all("metrics_effects"),
                "waits": await tx.all("metrics_waits"),
                "outbox": await tx.all("metrics_notifications"),
                "intents": await tx.all("metrics_intents"),
                "overdue": (overdue or {}).get("oldest"),
            }

    # -- retention ------------------------------------------------------------------------------

    async def prune_candidates(
        self, statuses: list[str], older_than: float, limit: int
    ) -> list[Row]:
        """Finished runs that finished more than `older_than` seconds ago (database clock)."""
        async with self.db.read() as tx:
            return await tx.all(
                "prune_candidates",
                {"statuses": json.dumps(statuses), "older_than": older_than, "limit": limit},
            )

    @staticmethod
    async def prune_batch(
        tx: Tx, statuses: list[str], older_than: float, limit: int
    ) -> tuple[list[str], dict[str, int]]:
        """Delete up to `limit` finished runs and all their rows inside `tx`; return their ids
        and how many rows went from each table."""
        gone = await tx.all(
            "prune_runs",
            {"statuses": json.dumps(statuses), "older_than": older_than, "limit": limit},
        )
        ids = [str(r["run_id"]) for r in gone]
        counts = {"runs": len(ids)}
        if not ids:
            return ids, counts
        params = {"run_ids": json.dumps(ids)}
        for table, query in PRUNED_TABLES.items():
            counts[table] = max(0, await tx.execute(query, params))
        await tx.execute("record_pruned_folders", params)
        return ids, counts

    async def delete_finished_run(self, thread_id: str, run_id: str) -> dict[str, int] | None:
        """Delete one finished run of a thread with its timeline, ledger, waits, notifications
        and delivered intents, as a prune would (its artifact folder goes at the next prune);
        the thread's checkpoints stay, and so do the ledger rows its runs share (`key=`).
        None if the run is unfinished, held, or not there."""
        async with self.db.transaction() as tx:
            gone = await tx.all("delete_finished_run", {"thread_id": thread_id, "run_id": run_id})
            if not gone:
                return None
            params = {"run_ids": json.dumps([run_id])}
            counts = {"runs": 1}
            for table, query in PRUNED_TABLES.items():
                if not table.startswith("checkpoint"):
                    counts[table] = max(0, await tx.execute(query, params))
            await tx.execute("record_pruned_folders", params)
            return counts

    async def pruned_folders(self, limit: int) -> list[str]:
        """Runs pruned whose artifact folders may still be on disk (see `prune_batch`)."""
        async with self.db.read() as tx:
            return [str(r["run_id"]) for r in await tx.all("pruned_folders", {"limit": limit})]

    async def forget_pruned_folders(self, run_ids: list[str]) -> None:
        async with self.db.transaction() as tx:
            await tx.execute("forget_pruned_folders", {"run_ids": json.dumps(run_ids)})
