"""The store's queries on stream chunks (part of `Store`): what a run's graph streamed in the
modes its checkpoints cannot tell, written by its worker under its lease, read by streams."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from keel.core.store.base import Connector, Row


class ChunkQueries:
    db: Connector

    async def write_chunks(self, run_id: str, token: int, rows: Sequence[dict[str, Any]]) -> None:
        """Append an execution's chunks (`anchor`, `resumed`, `ns`, `mode`, `data` as JSON
        text), in order, fenced: LeaseLost if `token` no longer holds the run."""
        if not rows:
            return
        async with self.fenced(run_id, token) as tx:  # type: ignore[attr-defined]
            await tx.execute(
                "insert_chunks",
                {"run_id": run_id, "lease_token": token, "rows": json.dumps(list(rows))},
            )

    async def supersede_chunks(
        self, run_id: str, token: int, anchor: str, *, keep_paused: bool
    ) -> None:
        """The execution under `token` re-runs the steps after checkpoint `anchor` (`""`: from
        the start): older executions' chunks of those steps are no longer served. Fenced."""
        async with self.fenced(run_id, token) as tx:  # type: ignore[attr-defined]
            await tx.execute(
                "supersede_chunks",
                {
                    "run_id": run_id,
                    "lease_token": token,
                    "anchor": anchor,
                    "keep_paused": int(keep_paused),
                },
            )

    async def chunks_after(self, run_id: str, after: int = 0, limit: int = 1000) -> list[Row]:
        """The run's chunks with an id above `after` that were not superseded, in order (ids
        grow in commit order on both backends)."""
        async with self.db.read() as tx:
            return await tx.all("chunks_after", {"run_id": run_id, "after": after, "limit": limit})

    async def chunk_ceiling(self, run_id: str, token: int) -> int:
        """The newest chunk id of the run's executions under lease tokens up to `token`, 0 if
        they produced none (superseded chunks included: ids only place events)."""
        async with self.db.read() as tx:
            row = await tx.one("chunk_ceiling", {"run_id": run_id, "lease_token": token})
        return int(row["ceiling"]) if row else 0

    async def chunk_state(self, run_id: str, chunk_id: int) -> Row | None:
        """The chunk's `superseded`, `lease_token` and `anchor` (None: no such chunk)."""
        async with self.db.read() as tx:
            return await tx.one("chunk_superseded", {"run_id": run_id, "chunk_id": chunk_id})

    async def superseded_count(self, run_id: str, token: int) -> int:
        """How many chunks of the run's execution under `token` were superseded."""
        async with self.db.read() as tx:
            row = await tx.one("superseded_of_token", {"run_id": run_id, "lease_token": token})
        return int(row["n"]) if row else 0
