"""The store's queries on waits and their decisions (part of `Store`).

Each change to a wait is a conditional UPDATE on a pending wait (or at one escalation level):
when several deciders or sweepers race, exactly one gets the row back, the others None.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from keel.core.store.base import Connector, Later, Row, Tx


class WaitQueries:
    db: Connector

    # -- reading --------------------------------------------------------------------------------

    @staticmethod
    async def read_wait(tx: Tx, wait_id: str) -> Row | None:
        return await tx.one("get_wait", {"wait_id": wait_id})

    @staticmethod
    async def read_waits(tx: Tx, run_id: str) -> list[Row]:
        """A run's waits, oldest first."""
        return await tx.all("list_waits", {"run_id": run_id})

    async def get_wait(self, wait_id: str) -> Row | None:
        async with self.db.read() as tx:
            return await self.read_wait(tx, wait_id)

    async def waits(self, run_id: str) -> list[Row]:
        async with self.db.read() as tx:
            return await self.read_waits(tx, run_id)

    async def pending_waits(self, limit: int = 100) -> list[Row]:
        async with self.db.read() as tx:
            return await tx.all("list_pending_waits", {"limit": limit})

    async def browse_pending_waits(
        self, *, kind: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[Row]:
        """Open waits of one kind (None: every kind), oldest deadline first."""
        async with self.db.read() as tx:
            return await tx.all(
                "browse_pending_waits", {"kind": kind, "limit": limit, "offset": offset}
            )

    async def count_pending_waits(self, run_ids: list[str]) -> dict[str, int]:
        """{run_id: open waits} for the runs that have any."""
        if not run_ids:
            return {}
        async with self.db.read() as tx:
            rows = await tx.all("count_pending_waits", {"run_ids": json.dumps(run_ids)})
        return {r["run_id"]: int(r["n"]) for r in rows}

    async def due_waits(self, limit: int) -> tuple[list[Row], list[Row]]:
        """Open waits whose next reminder/escalation is due, and those past their deadline, by
        the database's clock."""
        async with self.db.read() as tx:
            staged = await tx.all("due_stages", {"limit": limit})
            expired = await tx.all("expired_waits", {"limit": limit})
        return staged, expired

    # -- changing -------------------------------------------------------------------------------

    @staticmethod
    async def register_wait(
        tx: Tx,
        *,
        wait_id: str,
        run_id: str,
        token: int,
        worker_id: str,
        interrupt_id: str,
        kind: str,
        name: str,
        payload: str,
        approvers: str,
        deadline_after: float | None,
        on_timeout: str,
        schedule: str,
        first_stage_after: float | None,
        event: str,
        notifiers: list[str],
    ) -> Later:
        """Register a pending wait with its event and request intents, sent without waiting:
        its row, once read, or None if it was already registered (a replay) or the run was
        asked to cancel. Its deadline and first stage fall `deadline_after` and
        `first_stage_after` seconds after the database's now."""
        return await tx.send(
            "register_wait",
            {
                "wait_id": wait_id,
                "run_id": run_id,
                "lease_token": token,
                "worker_id": worker_id,
                "interrupt_id": interrupt_id,
                "kind": kind,
                "name": name,
                "payload": payload,
                "approvers": approvers,
                "deadline_after": deadline_after,
                "on_timeout": on_timeout,
                "schedule": schedule,
                "first_stage_after": first_stage_after,
                "event": event,
                "notifiers": json.dumps(notifiers),
            },
        )

    @staticmethod
    async def end_registration(
        tx: Tx, run_id: str, token: int, worker_id: str, wait_ids: list[str]
    ) -> Later:
        """The run's move at the end of a registration (cancelled, queued or waiting), sent
        without waiting: the status it reached, once read (None: not running under `token`)."""
        return await tx.send(
            "end_registration",
            {
                "run_id": run_id,
                "lease_token": token,
                "worker_id": worker_id,
                "wait_ids": json.dumps(wait_ids),
            },
        )

    @staticmethod
    async def decide_wait(
        tx: Tx,
        wait_id: str,
        *,
        decision: str,
        value: str,
        decided_by: str | None,
        action_id: str | None,
        channel: str,
        comment: str | None,
    ) -> Row | None:
        """Record a decision on a pending wait; None if it is no longer pending."""
        return await tx.one(
            "decide_wait",
            {
                "wait_id": wait_id,
                "decision": decision,
                "value": value,
                "decided_by": decided_by,
                "action_id": action_id,
                "channel": channel,
                "comment": comment,
            },
        )

    async def decide(
        self,
        run_id: str,
        *,
        wait_id: str | None,
        decision: str,
        effect_answer: bool,
        value: str,
        decided_by: str | None,
        action_id: str | None,
        channel: str,
        comment: str | None,
        notifiers: list[str],
        details: str,
        recorded_data: str,
        queued_data: str,
        then: Callable[[Tx], Awaitable[Later]] | None = None,
    ) -> tuple[Row | None, Row | None]:
        """A decision on the run's wait and all that follows it, in one transaction of one call
        (the run locked, then the `decide` query: one message on PostgreSQL, one call on
        SQLite's database thread): None if there is no such run, else what was found and
        whether this call recorded it (see the query); and the row of `then`, a write sent
        and committed after it whatever the decision found (a claim by a worker of the
        deciding process, which may take the run the decision queued:
        `LeaseQueries.claim_with`)."""
        params = {
            "run_id": run_id,
            "wait_id": wait_id,
            "decision": decision,
            "effect_answer": int(effect_answer),
            "value": value,
            "decided_by": decided_by,
            "action_id": action_id,
            "channel": channel,
            "comment": comment,
            "notifiers": json.dumps(notifiers),
            "details": details,
            "recorded_data": recorded_data,
            "queued_data": queued_data,
            "wake": int(then is None),
        }

        async def body(tx: Tx) -> tuple[Later, Later | None]:
            # The run first, as every writer of a run and its waits takes it (a registration's
            # fence among them); the decision's own snapshot starts once it is held.
            await tx.send("lock_run", {"run_id": run_id})
            found = await tx.send("decide", params)
            if then is None:
                return found, None
            claimed = await then(tx)
            # Other workers are woken only if the claim left the decided run queued.
            await tx.execute("wake_if_queued", {"run_id": run_id})
            return found, claimed

        found, followed = await self.db.run_transaction(body)
        return await found(), (await followed() if followed is not None else None)

    @staticmethod
    async def expire_wait(tx: Tx, wait_id: str, decision: str, value: str) -> Row | None:
        """End a pending wait without a person (deadline policy, cancellation); None if it is
        no longer pending."""
        return await tx.one(
            "expire_wait", {"wait_id": wait_id, "decision": decision, "value": value}
        )

    @staticmethod
    async def escalate_wait(tx: Tx, wait_id: str, level: int, window: float) -> Row | None:
        """Extend a pending wait's deadline to `window` seconds from the database's now, once
        per escalation level."""
        return await tx.one("escalate_wait", {"wait_id": wait_id, "window": window, "level": level})

    @staticmethod
    async def advance_stage(
        tx: Tx, wait_id: str, level: int, next_stage_at: float | None
    ) -> Row | None:
        """Move a pending wait past its schedule stage `level`, once."""
        return await tx.one(
            "advance_stage",
            {"wait_id": wait_id, "level": level, "next_stage_at": next_stage_at},
        )

    @staticmethod
    async def expire_deadline_now(tx: Tx, wait_id: str) -> None:
        """Let a pending wait's deadline pass (the crash harness's lever)."""
        await tx.execute("expire_deadline_now", {"wait_id": wait_id})
