"""The store's queries on webhooks (part of `Store`): the completion webhooks runs were
submitted with (table `keel_webhooks`; their intents are recorded by the triggers of migration
0027 in the transaction that ends the run) and the inbound deliveries seen (`keel_hook_deliveries`,
whose primary key decides a replay)."""

from __future__ import annotations

from keel.core.store.base import Connector, Row


class WebhookQueries:
    db: Connector

    async def register_webhook(
        self, run_id: str, *, url: str, events: list[str], format: str, max_attempts: int
    ) -> bool:
        """Attach a completion webhook to the run; False if it had one (the first stays).

        The run is locked first, so a move committing meanwhile either sees the registration
        (its trigger records the intent) or has committed before it (the registration's
        trigger records it): never neither, never both."""
        async with self.db.transaction() as tx:
            await tx.one("lock_run", {"run_id": run_id})
            row = await tx.one(
                "insert_webhook",
                {
                    "run_id": run_id,
                    "url": url,
                    "events": "," + ",".join(events) + ",",
                    "format": format,
                    "max_attempts": max_attempts,
                },
            )
        return row is not None

    async def get_webhook(self, run_id: str) -> Row | None:
        async with self.db.read() as tx:
            return await tx.one("get_webhook", {"run_id": run_id})

    async def record_hook_delivery(self, hook: str, delivery_id: str) -> Row | None:
        """Record an inbound delivery by its id. None the first time it is seen; else the row
        recorded then (its `run_id` may still be NULL while the first delivery submits)."""
        async with self.db.transaction() as tx:
            if await tx.one("record_hook_delivery", {"hook": hook, "delivery_id": delivery_id}):
                return None
            found = await tx.one("get_hook_delivery", {"hook": hook, "delivery_id": delivery_id})
        assert found is not None
        return found

    async def set_hook_delivery_run(self, hook: str, delivery_id: str, run_id: str) -> None:
        async with self.db.transaction() as tx:
            await tx.execute(
                "set_hook_delivery_run",
                {"hook": hook, "delivery_id": delivery_id, "run_id": run_id},
            )

    async def forget_hook_delivery(self, hook: str, delivery_id: str) -> None:
        """Forget a delivery whose submit was refused (it admitted no run): the same delivery
        id, fixed, is then a first delivery."""
        async with self.db.transaction() as tx:
            await tx.execute("forget_hook_delivery", {"hook": hook, "delivery_id": delivery_id})
