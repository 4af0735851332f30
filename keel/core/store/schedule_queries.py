"""The store's queries on schedules and their ticks (part of `Store`; keel.core.schedules)."""

from __future__ import annotations

import json
from typing import Any

from keel.core.store.base import Connector, Row, Tx
from keel.core.store.run_queries import note_event

TICKS_KEPT = 1000
"""Fired and skipped ticks remembered per schedule (the newest); older ones are forgotten."""


class ScheduleQueries:
    db: Connector

    @staticmethod
    async def insert_schedule(tx: Tx, values: dict[str, Any]) -> Row | None:
        """A new schedule; None if one of that name exists."""
        return await tx.one("schedule_insert", values)

    @staticmethod
    async def declare_schedule(tx: Tx, values: dict[str, Any]) -> Row | None:
        """A declared schedule created or brought to its declaration (its next tick kept if
        its timing did not change); None if a schedule of that name was made by hand."""
        return await tx.one("schedule_declare", values)

    @staticmethod
    async def read_schedule(tx: Tx, key: str) -> Row | None:
        return await tx.one("schedule_get", {"key": key})

    async def get_schedule(self, key: str) -> Row | None:
        """A schedule by id or name."""
        async with self.db.read() as tx:
            return await tx.one("schedule_get", {"key": key})

    async def list_schedules(
        self, *, workflow: str | None, thread_id: str | None, limit: int, offset: int
    ) -> list[Row]:
        async with self.db.read() as tx:
            return await tx.all(
                "schedule_list",
                {"workflow": workflow, "thread_id": thread_id, "limit": limit, "offset": offset},
            )

    async def count_schedules(self, *, workflow: str | None, thread_id: str | None) -> int:
        async with self.db.read() as tx:
            row = await tx.one("schedule_count", {"workflow": workflow, "thread_id": thread_id})
        return int(row["n"]) if row else 0

    @staticmethod
    async def write_schedule(tx: Tx, values: dict[str, Any]) -> Row | None:
        return await tx.one("schedule_write", values)

    async def delete_schedule(self, schedule_id: str) -> bool:
        """The schedule and its tick records deleted (its runs stay); False if there was none."""
        async with self.db.transaction() as tx:
            await tx.execute("schedule_delete_ticks", {"schedule_id": schedule_id})
            return await tx.one("schedule_delete", {"schedule_id": schedule_id}) is not None

    async def next_schedule_due(self, workflows: list[str]) -> tuple[float | None, bool]:
        """Seconds until a schedule of these workflows is due by the database's clock (None:
        none runs), and whether one holds queued ticks: one round trip."""
        async with self.db.read() as tx:
            row = await tx.one("schedule_next_due", {"workflows": json.dumps(workflows)})
        if row is None:
            return None, False
        wait = row["wait"]
        return (None if wait is None else float(wait)), bool(row["queued"])

    @staticmethod
    async def claim_due_schedules(tx: Tx, workflows: list[str], limit: int) -> list[Row]:
        """Due schedules of these workflows, held by `tx` (skipped by other schedulers on
        PostgreSQL), each with the database's `now`."""
        return await tx.all(
            "schedule_claim_due", {"workflows": json.dumps(workflows), "limit": limit}
        )

    @staticmethod
    async def claim_schedule(tx: Tx, schedule_id: str) -> Row | None:
        """One due schedule, held by `tx` like `claim_due_schedules`'s; None if it is not due
        any more or another scheduler holds it."""
        return await tx.one("schedule_claim_one", {"schedule_id": schedule_id})

    @staticmethod
    async def advance_schedule(
        tx: Tx,
        schedule_id: str,
        *,
        was: float,
        next_tick: float,
        last_tick: float | None,
        last_run_id: str | None,
        queued: int,
    ) -> bool:
        """Move the schedule past the ticks it fired; False if its `next_tick` is not `was`."""
        row = await tx.one(
            "schedule_advance",
            {
                "schedule_id": schedule_id,
                "was": was,
                "next_tick": next_tick,
                "last_tick": last_tick,
                "last_run_id": last_run_id,
                "queued": queued,
            },
        )
        return row is not None

    @staticmethod
    async def record_tick(
        tx: Tx, schedule_id: str, tick: float, outcome: str, run_id: str | None
    ) -> Row | None:
        """The tick's outcome (with `fired_at`), or None if the tick was recorded before."""
        return await tx.one(
            "schedule_record_tick",
            {"schedule_id": schedule_id, "tick": tick, "outcome": outcome, "run_id": run_id},
        )

    @staticmethod
    async def record_missed(tx: Tx, schedule_id: str, ticks: list[float]) -> int:
        """Ticks recorded as missed (not fired, by the schedule's `catch_up`); how many."""
        return await tx.execute(
            "schedule_record_missed", {"schedule_id": schedule_id, "ticks": json.dumps(ticks)}
        )

    @staticmethod
    async def fire_ticks(
        tx: Tx, runs: list[dict[str, Any]], ticks: list[dict[str, Any]], moves: list[dict[str, Any]]
    ) -> tuple[int, list[Row]]:
        """A batch of schedules' due ticks written in two statements, whatever its size: the
        `runs` admitted (those not admitted before with their admitted event: each run's
        `event` is its data as JSON), the schedules moved (`moves`, each only if its
        `next_tick` is still its `was`) and the `ticks` recorded. The schedules moved, and the
        rows of the ticks not recorded before."""
        row = await tx.one(
            "schedule_fire_runs", {"runs": json.dumps(runs), "moves": json.dumps(moves)}
        )
        moved = int(row["moved"]) if row else 0
        admitted = set(json.loads(row["admitted"])) if row else set()
        for run in runs:
            if run["run_id"] in admitted:
                note_event(run["run_id"], "admitted", json.loads(run["event"]))
        if not ticks:
            return moved, []
        return moved, await tx.all("schedule_fire_ticks", {"ticks": json.dumps(ticks)})

    @staticmethod
    async def oldest_queued_tick(tx: Tx, schedule_id: str) -> float | None:
        row = await tx.one("schedule_oldest_queued", {"schedule_id": schedule_id})
        return None if row is None else float(row["tick"])

    @staticmethod
    async def release_tick(tx: Tx, schedule_id: str, tick: float, run_id: str) -> Row | None:
        return await tx.one(
            "schedule_release_tick", {"schedule_id": schedule_id, "tick": tick, "run_id": run_id}
        )

    @staticmethod
    async def prune_ticks(tx: Tx, schedule_id: str) -> None:
        await tx.execute("schedule_prune_ticks", {"schedule_id": schedule_id, "keep": TICKS_KEPT})

    async def schedule_ticks(self, schedule_id: str, limit: int = 100) -> list[Row]:
        """The schedule's recorded ticks, newest first."""
        async with self.db.read() as tx:
            return await tx.all("schedule_ticks", {"schedule_id": schedule_id, "limit": limit})
