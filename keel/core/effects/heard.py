"""Provider answers a worker heard but could not record, on the ledger's side: keeping one when
its record fails, and finding it when the run's next execution here meets its key
(keel.core.answers keeps them)."""

from __future__ import annotations

from typing import Any

from keel.core.answers import Heard
from keel.core.context import RunContext
from keel.core.effects.rows import EffectStatus, record
from keel.core.errors import LeaseLost


async def record_answer(
    ctx: RunContext,
    key: str,
    attempts: int,
    value: Any,
    *,
    token: int | None = None,
    keep: bool = True,
) -> None:
    """Record the provider's answer to a call of this run's, made under `token` (default: this
    execution's), as `sent`. An answer whose record the database could not take is kept for
    the run's next execution in this process (keel.core.answers); one fenced out (LeaseLost)
    is not: the run has another owner."""
    try:
        await record(ctx, key, EffectStatus.SENT, attempts, result=value)
    except LeaseLost:
        raise
    except Exception:
        if keep:
            heard = Heard(ctx.token if token is None else token, attempts, value)
            ctx.services.answers.keep(ctx.run_id, key, heard)
        raise


def heard_before(ctx: RunContext, row: dict[str, Any]) -> Heard | None:
    """The answer this process heard to the last call of a key of this run still pending, if
    it kept one (anything kept for the key is forgotten: a settled key needs none)."""
    token = row.get("lease_token")
    heard = ctx.services.answers.take(
        ctx.run_id, str(row["idempotency_key"]), None if token is None else int(token)
    )
    if row["status"] != EffectStatus.PENDING or row.get("run_id") != ctx.run_id:
        return None
    return heard
