"""The ledger's rows: an effect call's key reserved (pending) and its outcome recorded, each in
one fenced statement, and the lease bound a reservation hands to the provider call after it.

`keel.core.effects.ledger` decides when these happen (the `@keel.effect` call path) and
`keel.core.effects.in_doubt` what a key left pending by a crash becomes; both write through here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from keel.core.clock import LIVENESS_MARGIN
from keel.core.codec import dumps
from keel.core.context import RunContext
from keel.core.effects.keys import Identity
from keel.core.errors import LeaseLost, RunCancelled, SlowDatabase
from keel.core.ids import StepRef
from keel.core.store.store import Store

log = logging.getLogger("keel.core.effects.ledger")


class EffectStatus(StrEnum):
    """Where a ledger row is: pending -> sent -> confirmed, or failed, or in_doubt."""

    PENDING = "pending"
    SENT = "sent"
    CONFIRMED = "confirmed"
    """The provider (its reconciler, or a person) says it happened."""
    FAILED = "failed"
    IN_DOUBT = "in_doubt"
    """Left pending by a crash, with no way to ask the provider: a person must answer."""


SETTLED = (EffectStatus.SENT, EffectStatus.CONFIRMED, EffectStatus.FAILED)
"""A key in one of these is never performed again: its row answers every later call."""


@dataclass(frozen=True)
class Call:
    """One call of an effect: where it is, its key, what identifies its arguments."""

    where: StepRef
    index: int
    """Its order among the calls of this effect by the same task, from 0."""
    key: str
    legacy_key: str
    identity: Identity
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    tool: str | None = None
    """The tool call it is made in, when its run's keys name one (keel.core.effects.keys)."""
    thread: str | None = None
    """The thread whose runs share its key (`key=` on a thread: `business_key`), else None.
    Its row outlives the run that made it for as long as the thread exists."""


LEASE_MARGIN = LIVENESS_MARGIN
"""The share of the lease left at a reservation within which its provider call goes ahead
without a second look at the lease (the rest is slack for clock rates and scheduling)."""

DEFAULT_TIMEOUT = 60.0
"""An effect's timeout when it declares none and its app sets none (`App(effect_timeout=)`,
$KEEL_EFFECT_TIMEOUT): its call is abandoned after this long, and a new owner of the run waits
this long (and a margin) from the call's start before it reconciles or resends the key."""


def deadline_margin(timeout: float) -> float:
    """Slack past an effect's timeout before anyone else acts on its key: for its caller's
    abandonment to take effect and for clocks that run at slightly different rates."""
    return min(30.0, max(1.0, timeout * 0.1))


def hold(timeout: float) -> float:
    """Seconds from a call's start, by the database's clock, before nobody may act on its key."""
    return timeout + deadline_margin(timeout)


@dataclass(frozen=True)
class LeaseBound:
    """What a fenced reservation proved: this token held the run, unexpired by the database's
    clock, with `left` seconds to go, at some moment after `monotonic` / `clock` were read.

    No one else can hold the run before its lease expires (a takeover claims only expired
    leases; a holder's own release or end is this execution's doing), so until then a
    provider call needs no further look. Time is measured on both the monotonic clock (a
    frozen or suspended process keeps counting: SIGSTOP, a VM pause) and the app's clock (a
    test clock that moves the database's), and the larger wins: any jump means asking again.
    """

    left: float
    monotonic: float
    clock: float

    def elapsed(self, ctx: RunContext) -> float:
        return max(time.monotonic() - self.monotonic, ctx.services.clock.now() - self.clock)

    def holds(self, ctx: RunContext) -> bool:
        return self.elapsed(ctx) < self.left * LEASE_MARGIN

    def remaining(self, ctx: RunContext, timeout: float) -> float:
        """What is left of a call's `timeout` counted from this bound's question: the call's
        deadline is never later than the one the database recorded with it."""
        return timeout - self.elapsed(ctx)


class Reserved(NamedTuple):
    row: dict[str, Any]
    new: bool
    """Reserved (pending) by this call just now."""
    lease: LeaseBound | None
    """For a new reservation: the bound within which its first provider call needs no lease
    check (None for a key found in the ledger: what happens before its call takes time)."""
    deadline_in: float
    """For a key found pending: seconds until its last call's deadline passes, by the
    database's clock (0: passed). Until then that call may be under way: nobody acts on it."""


async def check_lease(ctx: RunContext) -> None:
    """Raise LeaseLost (RunCancelled) unless this run's lease is still ours, unexpired (and
    the run not cancelled), judged by the database now."""
    row = await ctx.services.store.check_lease_held(ctx.run_id, ctx.token)
    if row["cancel_requested"]:
        raise RunCancelled(f"run {ctx.run_id} was cancelled")


async def reserve(ctx: RunContext, call: Call, name: str, call_timeout: float) -> Reserved:
    """The call's ledger row, whether this reserved it (pending, its call's deadline
    `call_timeout` and a margin from now) just now, and for how long the lease that reserved it
    is known to hold."""
    store: Store = ctx.services.store
    where = call.where
    if ctx.settle is not None and "|" in where.namespace:
        # Inside a subgraph the key names the parent task by its id: the checkpoint that gave
        # it that id must be durable before the effect can happen.
        await ctx.settle()
    # Read before the statement is sent: the database judges the lease after these moments.
    started, clock = time.monotonic(), ctx.services.clock.now()
    # One fenced statement. A run in flight across the upgrade to 0006 finds its earlier
    # effects by their old keys (arguments hashed in, no per-argument hashes): served, never
    # performed again.
    found = await store.reserve_effect(
        call.key,
        legacy_key=call.legacy_key,
        run_id=ctx.run_id,
        name=name,
        node=where.node,
        step=where.step,
        task_path=where.path,
        args_hash=call.identity.digest,
        arg_hashes=dumps(call.identity.hashes),
        call_index=call.index,
        token=ctx.token,
        hold=hold(call_timeout),
        thread_id=call.thread,
    )
    if found is None:
        await store.check_token(ctx.run_id, ctx.token)  # LeaseLost, RunNotFound
        raise LeaseLost(f"run {ctx.run_id}: lease token {ctx.token} could not reserve {call.key}")
    if found.pop("cancelled"):
        # A cancelled run starts no new side effect, whatever its checkpoint cadence.
        raise RunCancelled(f"run {ctx.run_id} was cancelled")
    left = float(found.pop("lease_left") or 0.0)
    deadline_in = float(found.pop("deadline_in") or 0.0)
    legacy, reserved = found.pop("legacy"), bool(found.pop("reserved"))
    existing = found if found.get("idempotency_key") is not None else None
    if existing is None:
        # Not in the ledger, and not reserved: the token is current but its lease expired
        # (takeable by the next claim), so nothing new may start under it.
        raise LeaseLost(f"run {ctx.run_id}: the lease of token {ctx.token} has expired")
    if legacy:
        return Reserved(existing, False, None, 0.0)
    log.info(
        "effect.reserve %s key=%s status=%s%s",
        name,
        call.key,
        existing["status"],
        " (new)" if reserved else "",
        extra={
            "event": "effect.reserve",
            "effect": name,
            "duration": round(time.monotonic() - started, 6),
        },
    )
    bound = LeaseBound(left, started, clock) if reserved else None
    return Reserved(existing, reserved, bound, 0.0 if reserved else deadline_in)


async def arm(ctx: RunContext, key: str, call_timeout: float) -> LeaseBound:
    """Before a new provider call of a pending key (its first was not this execution's, or
    failed, or was abandoned): move the key's deadline to `call_timeout` and a margin from now, in
    one fenced statement, and return the bound its answer proves. LeaseLost unless the lease
    is live and the answer came back soon enough to act on; RunCancelled if a cancel was asked."""
    store: Store = ctx.services.store
    started, clock = time.monotonic(), ctx.services.clock.now()
    row = await store.arm_effect(key, run_id=ctx.run_id, token=ctx.token, hold=hold(call_timeout))
    if row is None:
        await store.check_token(ctx.run_id, ctx.token)  # LeaseLost, RunNotFound
        raise LeaseLost(f"run {ctx.run_id}: lease token {ctx.token} could not arm {key}")
    if row["cancelled"]:
        raise RunCancelled(f"run {ctx.run_id} was cancelled")
    bound = LeaseBound(float(row["lease_left"] or 0.0), started, clock)
    if not row["armed"]:
        why = "has expired" if bound.left <= 0 else f"finds {key} no longer pending"
        raise LeaseLost(f"run {ctx.run_id}: the lease of token {ctx.token} {why}")
    if not bound.holds(ctx):
        # Not lost, unknown: the run is given back (an infrastructure fault), and its next
        # owner waits out the deadline this statement armed before it asks the provider.
        raise SlowDatabase(
            f"run {ctx.run_id}: the lease of token {ctx.token} had {bound.left:.1f}s left, but "
            f"the answer took {bound.elapsed(ctx):.1f}s to arrive: too late to call {key}"
        )
    return bound


async def record(
    ctx: RunContext,
    key: str,
    status: EffectStatus,
    attempts: int,
    *,
    result: Any = None,
    error: str | None = None,
) -> None:
    store = ctx.services.store
    try:
        encoded = dumps(result)
    except (TypeError, ValueError):
        log.warning("result of %s is not JSON; the ledger keeps its repr", key)
        encoded = dumps({"repr": repr(result)})
    recorded = await store.record_effect(
        key,
        run_id=ctx.run_id,
        status=status,
        attempts=attempts,
        result=encoded,
        error=error,
        token=ctx.token,
        worker_id=ctx.worker_id,
        kind=f"effect.{status}",
        data={"key": key, "error": error} if error else {"key": key},
    )
    if not recorded:
        await store.check_token(ctx.run_id, ctx.token)  # LeaseLost, RunNotFound
        raise LeaseLost(f"run {ctx.run_id}: lease token {ctx.token} could not record {key}")


def took(what: str, started: float, key: str, name: str, attempt: int, **more: Any) -> None:
    """One line for a provider call (the effect or its reconciler), with how long it took."""
    shown = " ".join(f"{k}={v}" for k, v in more.items())
    log.info(
        "%s %s key=%s attempt=%d %s",
        what,
        name,
        key,
        attempt,
        shown,
        extra={"event": what, "effect": name, "duration": round(time.monotonic() - started, 6)},
    )


async def event(ctx: RunContext, kind: str, data: dict[str, Any]) -> None:
    store = ctx.services.store
    async with store.fenced(ctx.run_id, ctx.token) as tx:
        await store.add_event(tx, ctx.run_id, kind, data, worker_id=ctx.worker_id, token=ctx.token)
