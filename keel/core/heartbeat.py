"""Heartbeats from inside a long step, as Temporal activities send them.

`keel.heartbeat(details)` renews the run's lease (fenced by its token) and stores `details`, so a
later attempt (after a crash or a takeover) can read where the work got to with
`keel.last_heartbeat()` and continue from there. From a sync node it blocks until recorded; from
an async node it is scheduled on the loop and never blocks it (a lost lease surfaces at the next
call or the next write).
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from keel.core.codec import dumps
from keel.core.context import RunContext, current
from keel.core.errors import LeaseLost


async def _beat(ctx: RunContext, details: Any) -> None:
    rt = ctx.services
    store = rt.store
    async with store.transaction() as tx:
        if not await store.renew_lease(tx, ctx.run_id, ctx.token, rt.lease_ttl):
            raise LeaseLost(f"run {ctx.run_id}: lease {ctx.token} was taken over")
        if details is not None:
            await store.set_heartbeat_details(tx, ctx.run_id, ctx.token, dumps(details))


def heartbeat(details: Any = None) -> None:
    """Renew this run's lease and remember `details` (JSON) for a retried attempt."""
    ctx = current("keel.heartbeat()")
    if ctx.replay is not None:
        return  # a replay holds no lease and keeps nothing for a later attempt
    previous = ctx.pending_heartbeat
    if previous is not None and previous.done() and previous.exception() is not None:
        raise previous.exception()  # type: ignore[misc]
    portal = ctx.services.portal
    if portal.on_loop():
        ctx.pending_heartbeat = asyncio.get_running_loop().create_task(_beat(ctx, details))
        return
    portal.call(_beat(ctx, details), context=contextvars.copy_context())


async def renew(ctx: RunContext) -> None:
    """Renew the run's lease now (LeaseLost if it was taken over): after a long backoff."""
    await _beat(ctx, None)


def last_heartbeat() -> Any:
    """The details the previous attempt of this run stored with heartbeat(), or None."""
    return current("keel.last_heartbeat()").last_heartbeat
