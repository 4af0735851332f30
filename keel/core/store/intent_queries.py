"""The store's queries on intents, table `keel_intents`: the effect outbox's rows, one per
call of an outbox effect to deliver, and their effects' rate buckets (part of `Store`).

Notifications about waits are elsewhere (`notification_queries`, table `keel_outbox`)."""

from __future__ import annotations

import time

from keel.core.clock import live_within
from keel.core.codec import dumps
from keel.core.store.base import Connector, Row, Tx

OUTBOX_WAKE = "outbox:"
"""How the payload of an intent's wake-up (query `notify_intents`) begins: the NOTIFY that
wakes workers' intent dispatchers and not their claim loops."""


class IntentQueries:
    db: Connector

    @staticmethod
    async def insert_intent(tx: Tx, row: Row) -> bool:
        """Record an intent (pending); False if it exists already (the step ran before)."""
        inserted = await tx.one("insert_intent", row) is not None
        if inserted:  # wake quiet dispatchers when the step commits (PostgreSQL's NOTIFY)
            await tx.one("notify_intents", {"run_id": row["run_id"]})
        return inserted

    @staticmethod
    async def read_intent(tx: Tx, intent_id: str) -> Row | None:
        return await tx.one("get_intent", {"intent_id": intent_id})

    @staticmethod
    async def lock_intent(tx: Tx, intent_id: str) -> Row | None:
        """The intent, locked until `tx` ends (PostgreSQL; SQLite's write lock is held)."""
        return await tx.one("lock_intent", {"intent_id": intent_id})

    async def get_intent(self, intent_id: str) -> Row | None:
        async with self.db.read() as tx:
            return await self.read_intent(tx, intent_id)

    @staticmethod
    async def intent_candidate(tx: Tx, effects: list[str]) -> Row | None:
        """The oldest due intent of `effects` (PostgreSQL: locked, skipping rows others hold)."""
        return await tx.one("intent_candidate", {"effects": dumps(sorted(effects))})

    async def intents_undelivered(self, effects: list[str]) -> bool:
        """Whether any intent of `effects` is pending or sending (due now or later)."""
        async with self.db.read() as tx:
            found = await tx.one("intents_undelivered", {"effects": dumps(sorted(effects))})
        return found is not None

    @staticmethod
    async def claim_intent(
        tx: Tx, intent_id: str, *, worker_id: str, ttl: float, count: bool
    ) -> Row:
        row = await tx.one(
            "claim_intent",
            {"intent_id": intent_id, "worker_id": worker_id, "ttl": ttl, "count": int(count)},
        )
        assert row is not None
        return row

    async def arm_intent(
        self, intent_id: str, claim_token: int, hold: float, *, count: int = 0
    ) -> float | None:
        """The look before a delivery's provider call: if `claim_token` still holds the intent
        (unexpired by the database's clock), its call's deadline moves to `hold` seconds from
        now (its attempts up by `count`: a reclaim's call counts here) and the monotonic time
        read before the statement was sent is returned (the call's
        own deadline counts from it). None if the claim is lost, or if the answer came back too
        late to act on (`live_within`): nothing may be called then."""
        asked_at = time.monotonic()
        found = await self.db.single(
            "arm_intent",
            {"intent_id": intent_id, "claim_token": claim_token, "hold": hold, "count": count},
        )
        if found is None or not live_within(float(found["claim_left"]), asked_at):
            return None
        return asked_at

    async def release_intent_claim(self, intent_id: str, claim_token: int) -> bool:
        """End a held claim now (its call was abandoned); False if it was not held."""
        found = await self.db.single(
            "release_intent_claim", {"intent_id": intent_id, "claim_token": claim_token}
        )
        return found is not None

    async def renew_intent_claim(self, intent_id: str, claim_token: int, ttl: float) -> bool:
        """Push a held claim's expiry `ttl` seconds past the database's now; False if another
        claim holds the intent, or it was settled (the delivery is no longer this one's). A
        claim that lapsed with nobody taking it is still this one's: renewed."""
        found = await self.db.single(
            "renew_intent_claim", {"intent_id": intent_id, "claim_token": claim_token, "ttl": ttl}
        )
        return found is not None

    @staticmethod
    async def settle_intent(
        tx: Tx,
        intent_id: str,
        *,
        claim_token: int,
        status: str,
        result: str | None,
        error: str | None,
        delay: float = 0.0,
    ) -> Row | None:
        """The outcome of a delivery; None if the claim was lost meanwhile (nothing written)."""
        return await tx.one(
            "settle_intent",
            {
                "intent_id": intent_id,
                "claim_token": claim_token,
                "status": status,
                "result": result,
                "error": error,
                "delay": delay,
            },
        )

    @staticmethod
    async def reopen_intent(tx: Tx, intent_id: str, from_status: str) -> Row | None:
        row = await tx.one("reopen_intent", {"intent_id": intent_id, "from_status": from_status})
        if row is not None:
            await tx.one("notify_intents", {"run_id": row["run_id"]})
        return row

    async def intents_due_in(self) -> float | None:
        """Seconds until an intent is deliverable or a sender's claim expires (<= 0: now);
        None when no intent is pending or being sent."""
        async with self.db.read() as tx:
            row = await tx.one("intents_next_due")
        seconds = row["seconds"] if row else None
        return None if seconds is None else float(seconds)

    @staticmethod
    async def resolve_intent_performed(
        tx: Tx, intent_id: str, from_status: str, result: str
    ) -> Row | None:
        return await tx.one(
            "resolve_intent_performed",
            {"intent_id": intent_id, "from_status": from_status, "result": result},
        )

    async def list_intents(
        self, *, status: str | None = None, run_id: str | None = None, limit: int = 100
    ) -> list[Row]:
        async with self.db.read() as tx:
            return await tx.all(
                "list_intents", {"status": status, "run_id": run_id, "limit": limit}
            )

    @staticmethod
    async def intent_counts(tx: Tx, run_id: str) -> dict[str, int]:
        rows = await tx.all("intent_counts", {"run_id": run_id})
        return {str(r["status"]): int(r["n"]) for r in rows}

    @staticmethod
    async def take_rate_token(tx: Tx, effect: str, per_second: float, burst: float) -> float:
        """Take one token from the effect's bucket, shared by every dispatcher; return 0.0, or
        how many seconds until one is there (nothing taken)."""
        await tx.execute("bucket_ensure", {"effect": effect, "burst": burst})
        row = await tx.one("bucket_lock", {"effect": effect})
        assert row is not None
        now = float(row["now"])
        # A clock that went back (a test clock, a failover) refills nothing rather than draining.
        elapsed = max(0.0, now - float(row["updated_at"]))
        tokens = min(burst, float(row["tokens"]) + elapsed * per_second)
        if tokens >= 1.0 - 1e-6:  # epoch seconds in a double: a refill lands a hair short
            taken = max(0.0, tokens - 1.0)
            await tx.execute("bucket_set", {"effect": effect, "tokens": taken, "at": now})
            return 0.0
        await tx.execute("bucket_set", {"effect": effect, "tokens": tokens, "at": now})
        return (1.0 - tokens) / per_second
