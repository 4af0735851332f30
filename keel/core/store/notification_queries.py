"""The store's queries on notifications, table `keel_outbox` (part of `Store`).

A notification is what the notification outbox (keel.core.notification_outbox) hands a
notifier about a wait. The table keeps its first name; its column `intent_id` holds the
notification's id. User effect intents are elsewhere (`intent_queries`, table `keel_intents`).
"""

from __future__ import annotations

from keel.core.store.base import Connector, Row, Tx


class NotificationQueries:
    db: Connector

    @staticmethod
    async def insert_notification(tx: Tx, row: Row) -> None:
        """Record a notification to deliver, once (a replay records nothing): sent without
        waiting for its answer, so a pipelined transaction goes on. `row` holds `intent_id`,
        `run_id`, `wait_id`, `notifier`, `kind` and `payload`."""
        await tx.send("insert_notification", row)

    @staticmethod
    async def notification_candidate(tx: Tx) -> Row | None:
        """The oldest notification due, or one whose sender's claim expired, by the database's
        clock (PostgreSQL: locked, skipping rows others hold)."""
        return await tx.one("notification_candidate", {})

    @staticmethod
    async def claim_notification(
        tx: Tx, notification_id: str, *, status: str, worker_id: str, ttl: float
    ) -> Row | None:
        params = {"status": status, "worker_id": worker_id, "ttl": ttl}
        return await tx.one("claim_notification", {"intent_id": notification_id, **params})

    @staticmethod
    async def settle_notification(
        tx: Tx,
        notification_id: str,
        *,
        worker_id: str,
        attempts: int,
        status: str,
        result: str,
        error: str | None,
        delay: float,
    ) -> Row | None:
        """Record a notification's outcome; None unless the claim `worker_id` took as its
        `attempts`-th still holds it."""
        claim = {"intent_id": notification_id, "worker_id": worker_id, "attempts": attempts}
        outcome = {"status": status, "result": result, "error": error, "delay": delay}
        return await tx.one("settle_notification", {**claim, **outcome})

    async def defer_notification(
        self, notification_id: str, *, worker_id: str, attempts: int, delay: float
    ) -> None:
        """Put a claimed notification back, due in `delay` seconds, its claim not counted."""
        claim = {"intent_id": notification_id, "worker_id": worker_id, "attempts": attempts}
        async with self.db.transaction() as tx:
            await tx.one("defer_notification", {**claim, "delay": delay})

    async def renew_notification_claim(
        self, notification_id: str, *, worker_id: str, attempts: int, ttl: float
    ) -> bool:
        """Push a held claim's expiry `ttl` seconds past the database's now; False if another
        claim holds the notification, or it was settled (its send is no longer this one's). A
        claim that lapsed with nobody taking it is still this one's: renewed."""
        claim = {"intent_id": notification_id, "worker_id": worker_id, "attempts": attempts}
        return await self.db.single("renew_notification_claim", {**claim, "ttl": ttl}) is not None

    async def count_reconcile_timeout(
        self, notification_id: str, *, worker_id: str, attempts: int
    ) -> int | None:
        """Count one more reconcile of a notification that went unanswered within its timeout,
        under the claim that asked it; the count so far, None if that claim no longer holds it
        (another dispatcher's reconcile is counted by that one)."""
        claim = {"intent_id": notification_id, "worker_id": worker_id, "attempts": attempts}
        found = await self.db.single("count_reconcile_timeout", claim)
        return None if found is None else int(found["reconcile_timeouts"])

    async def notifications(self, run_id: str) -> list[Row]:
        async with self.db.read() as tx:
            return await tx.all("list_notifications", {"run_id": run_id})

    async def notifications_for_wait(self, wait_id: str) -> list[Row]:
        async with self.db.read() as tx:
            return await tx.all("notifications_for_wait", {"wait_id": wait_id})
