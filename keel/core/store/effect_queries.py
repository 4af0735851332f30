"""The store's queries on the effect ledger, table `keel_effects` (part of `Store`)."""

from __future__ import annotations

import time
from typing import Any

from keel.core import logs
from keel.core.codec import dumps
from keel.core.store.base import Connector, Row, Tx


class EffectQueries:
    db: Connector

    async def reserve_effect(
        self,
        key: str,
        *,
        legacy_key: str,
        run_id: str,
        name: str,
        node: str,
        step: int,
        task_path: str,
        args_hash: str,
        arg_hashes: str,
        call_index: int,
        token: int,
        hold: float,
        thread_id: str | None = None,
    ) -> Row | None:
        """Reserve an idempotency key (pending, its call's deadline `hold` seconds from now) in
        one fenced statement (see the `reserve_effect` query); None, writing nothing, if `token`
        does not hold the run. `thread_id`: the thread whose runs share the key (`key=` on a
        thread), whose row outlives the run that made it for as long as the thread exists."""
        return await self.db.single(
            "reserve_effect",
            {
                "key": key,
                "legacy_key": legacy_key,
                "run_id": run_id,
                "name": name,
                "node": node,
                "step": step,
                "task_path": task_path,
                "args_hash": args_hash,
                "arg_hashes": arg_hashes,
                "call_index": call_index,
                "lease_token": token,
                "hold": hold,
                "thread_id": thread_id,
            },
        )

    async def arm_effect(self, key: str, *, run_id: str, token: int, hold: float) -> Row | None:
        """Move a pending key's call deadline to `hold` seconds from now, before a new provider
        call of it, in one statement fenced like a reservation (see the `arm_effect` query);
        None, writing nothing, if `token` does not hold the run."""
        return await self.db.single(
            "arm_effect", {"key": key, "run_id": run_id, "lease_token": token, "hold": hold}
        )

    async def record_effect(
        self,
        key: str,
        *,
        run_id: str,
        status: str,
        attempts: int,
        result: str,
        error: str | None,
        token: int,
        worker_id: str,
        kind: str,
        data: dict[str, Any],
    ) -> bool:
        """Move a ledger row on, with its timeline event, in one fenced statement; False,
        writing nothing, if `token` does not hold the run."""
        started = time.monotonic()
        row = await self.db.single(
            "record_effect",
            {
                "key": key,
                "run_id": run_id,
                "status": status,
                "attempts": attempts,
                "result": result,
                "error": error,
                "lease_token": token,
                "worker_id": worker_id,
                "kind": kind,
                "data": dumps(data),
            },
        )
        if row is None:
            return False
        took = time.monotonic() - started
        logs.event(run_id, kind, data, worker_id=worker_id, token=token, took=took)
        return True

    @staticmethod
    async def read_effect(tx: Tx, key: str) -> Row | None:
        return await tx.one("get_effect", {"key": key})

    @staticmethod
    async def update_effect(
        tx: Tx,
        key: str,
        *,
        status: str,
        attempts: int,
        result: str,
        error: str | None,
        token: int,
    ) -> None:
        await tx.one(
            "update_effect",
            {
                "key": key,
                "status": status,
                "attempts": attempts,
                "result": result,
                "error": error,
                "lease_token": token,
            },
        )

    async def effects(self, run_id: str) -> list[Row]:
        async with self.db.read() as tx:
            return await tx.all("list_effects", {"run_id": run_id})
