"""In-doubt effects: a key found `pending` at reserve time was left by a crash. It may or may not
have reached the provider, so Keel asks the effect's reconciler, retries under the same key if
the provider dedupes by key, or marks it `in_doubt` and pauses the run for a person. It never
guesses.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from keel.core.codec import dumps, loads
from keel.core.context import RunContext
from keel.core.effects.rows import EffectStatus, event, record, took
from keel.core.errors import EffectConflict, EffectFailed
from keel.core.store.base import Tx
from keel.core.store.store import Store
from keel.core.wait_model import EffectAnswer, WaitKind, WaitStatus

log = logging.getLogger("keel.core.effects.ledger")

PERFORM = object()
"""What `resolve` returns when the key is to be performed (again) under its own key."""


async def resolve(
    ctx: RunContext,
    name: str,
    key: str,
    row: dict[str, Any],
    *,
    reconcile: Callable[[], Awaitable[Any]] | None,
    provider_idempotent: bool,
) -> Any:
    """A key of effect `name` left pending by a crash: find out (`reconcile` asks the
    provider), retry under the key, or ask a person. The effect's result if it is known to
    have happened, else PERFORM."""
    answered = answered_waits(row)
    conflict: EffectConflict | None = None
    if row["status"] == EffectStatus.PENDING:
        if reconcile is not None:
            started = time.monotonic()
            try:
                found = await reconcile()
            except EffectConflict as exc:
                conflict = exc
            except Exception as exc:
                log.warning("reconciler of %s failed for %s: %r", name, key, exc)
            else:
                took(
                    "effect.reconcile",
                    started,
                    key,
                    name,
                    int(row["attempts"]),
                    found=found is not None,
                )
                if found is None:
                    await event(ctx, "effect.reconciled", {"key": key, "found": False})
                    return PERFORM
                await record(ctx, key, EffectStatus.CONFIRMED, reached(row), result=found)
                return found
        elif provider_idempotent:
            return PERFORM
        if conflict is not None:
            await conflicting(ctx, name, key, int(row["attempts"]), conflict, answered)
        else:
            kept = {"answered": answered} if answered else None
            await record(ctx, key, EffectStatus.IN_DOUBT, int(row["attempts"]), result=kept)
    # Plain strings: the spec goes into the checkpoint, read back by any later version.
    spec = {
        "keel_wait": {
            "kind": WaitKind.EFFECT.value,
            "name": name,
            "payload": {"idempotency_key": key, "effect": name},
            "timeout": 7 * 86400,
            "on_timeout": "fail",
        }
    }
    resolution = ctx.pause(spec)
    # An answer already acted upon (performed, then a crash before the record; a deadline
    # that failed the run, now resumed: `reopen_expired`) says nothing about the key now: it
    # is in doubt again and needs a new answer, on a fresh wait.
    while isinstance(resolution, dict) and resolution.get("wait_id") in answered:
        resolution = ctx.pause(spec)
    if isinstance(resolution, dict) and resolution.get("performed"):
        result = resolution.get("result")
        await record(ctx, key, EffectStatus.CONFIRMED, reached(row), result=result)
        return result
    if not isinstance(resolution, dict) or resolution.get("decision") != EffectAnswer.NOT_PERFORMED:
        # Not an answer (the deadline passed, an approval landed here): never guess.
        what = resolution.get("decision") if isinstance(resolution, dict) else resolution
        raise EffectFailed(key, f"in doubt and not resolved (the wait ended {what!r})")
    if resolution.get("wait_id"):
        # Back to pending before performing: a crash now leaves the key in doubt, not answered.
        answered = [*answered, str(resolution["wait_id"])]
        await record(
            ctx, key, EffectStatus.PENDING, int(row["attempts"]), result={"answered": answered}
        )
    return PERFORM


async def conflicting(
    ctx: RunContext,
    name: str,
    key: str,
    attempts: int,
    conflict: EffectConflict,
    answered: list[str] | None = None,
) -> None:
    """The provider holds more than one outcome for `key` (or reports one that conflicts with
    the call): the key is in doubt with what the provider said, never marked sent, and the run
    waits for a person."""
    records = conflict.records
    log.error(
        "effect %s: the provider reports conflicting outcomes for %s (%d records): %s",
        name,
        key,
        len(records),
        conflict,
        extra={"event": "effect.conflict", "effect": name},
    )
    await event(
        ctx,
        "effect.conflict",
        {"key": key, "effect": name, "error": str(conflict), "n": len(records)},
    )
    kept: dict[str, Any] = {"conflict": str(conflict), "records": records}
    if answered:
        kept["answered"] = answered
    await record(ctx, key, EffectStatus.IN_DOUBT, attempts, result=kept, error=str(conflict))


async def reopen_expired(store: Store, tx: Tx, run_id: str) -> list[str]:
    """Count the run's expired in-doubt waits as answered; return their wait ids.

    For `resume` of a failed run, in its transaction: the deadline's `timed_out` was acted upon
    (it failed the run), so on the replay it is not an answer any more and the key's next pause
    opens a fresh wait for a person. The key stays in doubt: it is never performed on a guess.
    """
    reopened = []
    for wait in await store.read_waits(tx, run_id):
        payload = loads(wait["payload"]) if wait["kind"] == WaitKind.EFFECT else None
        if wait["status"] != WaitStatus.EXPIRED or not isinstance(payload, dict):
            continue
        row = await store.read_effect(tx, str(payload.get("idempotency_key")))
        if row is None or row["status"] not in (EffectStatus.PENDING, EffectStatus.IN_DOUBT):
            continue
        answered = answered_waits(row)
        if wait["wait_id"] in answered:
            continue
        await store.update_effect(
            tx,
            row["idempotency_key"],
            status=row["status"],
            attempts=int(row["attempts"]),
            result=dumps({"answered": [*answered, wait["wait_id"]]}),
            error=row["error"],
            token=int(row["lease_token"]),
        )
        reopened.append(str(wait["wait_id"]))
    return reopened


def reached(row: dict[str, Any]) -> int:
    """The attempts of a key confirmed after a crash: the crashed attempt reached the provider
    (its reconciler or a person says so) but died before it was counted."""
    return int(row["attempts"]) + 1


def answered_waits(row: dict[str, Any]) -> list[str]:
    """Waits whose answer about this key was already acted upon (kept while it is unsettled)."""
    kept = (
        loads(row["result"])
        if row["status"] in (EffectStatus.PENDING, EffectStatus.IN_DOUBT)
        else None
    )
    return [str(w) for w in kept.get("answered", [])] if isinstance(kept, dict) else []
