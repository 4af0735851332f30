"""The effect ledger: every side effect runs once under a deterministic idempotency key.

The key is the call's place in the run (keel.core.effects.keys); the arguments' hashes are kept
beside it, and a replay that brings other arguments to the same place is refused. reserve
(pending) -> perform -> record (sent): two fenced statements around the provider call. The
reservation proves the lease live for a while (`LeaseBound`); a call made within that bound needs
no other look at it, one made later (a frozen thread, a retry, a reconciler first) looks again
in the thread that makes it. A key found `pending` at reserve time was left by a crash:
`keel.core.effects.in_doubt` decides what it becomes. The rows themselves: `keel.core.effects.rows`.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar, cast

from keel.core import heartbeat
from keel.core.codec import loads
from keel.core.context import RunContext, current
from keel.core.effects import in_doubt
from keel.core.effects.calls import Abandoned, Pending, call_within, token_keyword
from keel.core.effects.heard import heard_before, record_answer
from keel.core.effects.in_doubt import reopen_expired
from keel.core.effects.keys import (
    Identity,
    business_key,
    call_counter,
    effect_key,
    legacy_key,
    refuse_if_diverged,
)
from keel.core.effects.options import DeclaredEffect, EffectOptions
from keel.core.effects.rows import (
    SETTLED,
    Call,
    EffectStatus,
    LeaseBound,
    arm,
    check_lease,
    event,
    hold,
    record,
    reserve,
    took,
)
from keel.core.errors import (
    EffectConflict,
    EffectFailed,
    LeaseLost,
    NondeterminismError,
    RunCancelled,
    UsageError,
)
from keel.core.faults import fault_point
from keel.core.portal import Host
from keel.core.tracing import Mark

P = ParamSpec("P")
R = TypeVar("R")
log = logging.getLogger("keel.core.effects.ledger")


# The module-level names came first; code outside the core still uses them.
PENDING, SENT, CONFIRMED = EffectStatus.PENDING, EffectStatus.SENT, EffectStatus.CONFIRMED
FAILED, IN_DOUBT = EffectStatus.FAILED, EffectStatus.IN_DOUBT
__all__ = ["SETTLED", "Call", "EffectStatus", "check_lease", "record", "reopen_expired", "reserve"]


async def _call(fn: Callable[..., Any], host: Host | None, *args: Any, **kwargs: Any) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    if host is not None:
        return await host.run(fn, *args, **kwargs)
    raise UsageError(
        f"{getattr(fn, '__name__', fn)} is a plain function called from an async node; "
        "make the effect `async def` or the node a plain `def`"
    )


class Effect(DeclaredEffect[P, R]):
    """A function whose every call inside a run goes through the ledger (`keel.effect`)."""

    def __init__(self, fn: Callable[..., Any], options: EffectOptions) -> None:
        super().__init__(fn, options)
        self.is_async = inspect.iscoroutinefunction(fn)
        self._token = token_keyword(fn)
        self._reconcile_token = token_keyword(options.reconcile)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        ctx = current(f"effect {self.name!r}")
        # Arguments the function cannot take fail here, before anything is counted or reserved.
        identity = self.arguments.identity(args, kwargs)
        where = ctx.locate()
        counter, tool = call_counter(self.name, ctx.effect_keys)
        if ctx.replay is None:
            refuse_if_diverged(ctx.calls, where, tool)
        # Numbered now, in the order the node makes its calls, not the order coroutines start
        # (within its tool call, when it is made in one: those run at once).
        index = ctx.calls.next(where, counter)
        shared = self._shared(ctx)
        call = Call(
            where,
            index,
            business_key(ctx.thread_id, self.name, identity)
            if shared
            else effect_key(where, self.name, index, tool),
            legacy_key(where, self.name, args, kwargs),
            identity,
            args,
            kwargs,
            tool,
            ctx.thread_id if shared else None,
        )
        if ctx.replay is not None:
            # A replay performs nothing and writes nothing: the recorded ledger answers.
            served = ctx.replay.effect(
                self.name, call.key, call.legacy_key, where, index, identity, tool
            )
            if self.is_async and ctx.services.portal.on_loop():
                return cast(R, _ready(served))
            return cast(R, served)
        if ctx.services.portal.on_loop():
            if not self.is_async:  # blocking here would wait on the loop it blocks
                raise UsageError(self._blocking(where.node))
            return cast(R, self._settle(ctx, call, None))  # the async node awaits it
        # A sync node's thread blocks until done; an un-awaited coroutine would send nothing.
        return cast(
            R,
            ctx.services.portal.call(
                lambda host: self._settle(ctx, call, host),
                context=contextvars.copy_context(),
            ),
        )

    def _blocking(self, node: str) -> str:
        """Why a sync effect cannot be called from an async node, and the ways out."""
        fn = getattr(self.fn, "__name__", self.name)
        return (
            f"effect {self.name!r} is a plain `def` called from the async node {node!r}: a "
            "blocking Keel call on Keel's event loop, which would wait for itself. Call it as "
            f"`await asyncio.to_thread({fn}, ...)`, make the effect `async def` and `await` "
            "it, or make the node a plain `def` (Keel runs it in a thread)"
        )

    async def _settle(self, ctx: RunContext, call: Call, host: Host | None) -> Any:
        with ctx.tracer.effect(call.where, self.name) as span:
            return await self._settled(ctx, call, host, span)

    def _shared(self, ctx: RunContext) -> bool:
        """Whether this effect's keys are its thread's, shared by the thread's runs (`key=`)."""
        return bool(ctx.thread_id and self.arguments.key is not None)

    async def _settled(self, ctx: RunContext, call: Call, host: Host | None, span: Mark) -> Any:
        fault_point("effect.before_reserve", self.name, call.where.node, call.where.path)
        shared = self._shared(ctx)
        timeout = self.options.timeout_for(ctx.services)
        row, new, lease, deadline_in = await reserve(ctx, call, self.name, timeout)
        key = str(row["idempotency_key"])
        span.note(key=key, ledger=str(row["status"]), new=new)
        if not new:
            await self._same_arguments(ctx, call, row)
        abandoned = 0
        running: Pending | None = None
        if new:
            try:
                result = await self._perform(ctx, call, key, int(row["attempts"]), host, lease)
            except Abandoned as gave_up:
                abandoned, running = 1, gave_up.running
                row, _, _, deadline_in = await reserve(ctx, call, self.name, timeout)
            else:
                span.note(outcome="performed")
                return result
        # A key left pending: by a crash, by a worker cut off from the database while its call
        # was under way, or by this execution's own call, abandoned at its deadline.
        while True:
            if running is not None:
                # Our own abandoned call still has its thread: nothing may be asked or sent
                # while it can still reach the provider. Its answer, if it comes, settles it.
                answered = await self._await_own_call(ctx, key, running, hold(timeout))
                running = None
                if answered is not None:
                    ok, value = answered
                    if ok:
                        await record_answer(
                            ctx, key, int(row["attempts"]) + 1, value, keep=not shared
                        )
                        span.note(outcome="performed (answered late)")
                        return value
                elif row["status"] == EffectStatus.PENDING:
                    await record(ctx, key, EffectStatus.IN_DOUBT, int(row["attempts"]))
                row, _, _, deadline_in = await reserve(ctx, call, self.name, timeout)
                continue
            heard = None if shared else heard_before(ctx, row)
            if heard is not None:
                # This process made the key's last call and heard its answer; only the record
                # was lost (the database went away): no deadline to wait out, nothing to ask.
                log.info(
                    "effect %s: recording the answer its call under %s heard before the "
                    "database went away",
                    self.name,
                    key,
                    extra={"event": "effect.answer_kept", "effect": self.name},
                )
                # Kept again under the row's token if this record fails too: still that call's.
                await record_answer(ctx, key, heard.attempts, heard.value, token=heard.token)
                span.note(outcome="performed (its answer recorded late)")
                return heard.value
            if row["status"] == EffectStatus.PENDING and deadline_in > 0:
                await self._await_deadline(ctx, key, deadline_in)
                row, _, _, deadline_in = await reserve(ctx, call, self.name, timeout)
                continue
            if row["status"] in SETTLED:
                span.note(outcome="served from the ledger")
                return recorded_result(row)
            outcome = await in_doubt.resolve(
                ctx,
                self.name,
                key,
                row,
                reconcile=self._reconciler(ctx, key, call, host),
                provider_idempotent=self.options.provider_idempotent,
            )
            if outcome is not in_doubt.PERFORM:
                span.note(outcome="resolved (reconciled or answered)")
                return outcome
            if abandoned >= self.options.retry.max_attempts:
                # Every call of ours timed out and the provider has none: calling again is
                # for a person to decide.
                await record(ctx, key, EffectStatus.IN_DOUBT, int(row["attempts"]))
                row = {**row, "status": EffectStatus.IN_DOUBT}
                continue
            try:
                result = await self._perform(ctx, call, key, int(row["attempts"]), host, None)
            except Abandoned as gave_up:
                abandoned, running = abandoned + 1, gave_up.running
                row, _, _, deadline_in = await reserve(ctx, call, self.name, timeout)
                continue
            span.note(outcome="performed")
            return result

    async def _await_own_call(
        self, ctx: RunContext, key: str, running: Pending, seconds: float
    ) -> tuple[bool, Any] | None:
        """Wait (holding the lease) up to `seconds` for this execution's abandoned call to end;
        its outcome, or None if it is still under way (then only a person can say)."""
        await event(ctx, "effect.awaiting_call", {"key": key, "effect": self.name})
        until = time.monotonic() + seconds
        renewed = time.monotonic()
        while not running.done.is_set() and time.monotonic() < until:
            await asyncio.sleep(min(0.05, max(0.0, until - time.monotonic())))
            if time.monotonic() - renewed >= ctx.services.lease_ttl / 3:
                await _keep(ctx)
                renewed = time.monotonic()
        return running.outcome()

    async def _await_deadline(self, ctx: RunContext, key: str, seconds: float) -> None:
        """Hold off a key whose last call may still be under way (its caller cut off, or slow)
        until that call's deadline passes by the database's clock: reconciling now could find
        nothing yet and send it again. The run keeps its lease meanwhile."""
        data = {"key": key, "effect": self.name, "seconds": round(seconds, 3)}
        await event(ctx, "effect.awaiting_deadline", data)
        log.info(
            "effect %s: waiting %.1fs for the deadline of its last call under %s before "
            "reconciling (that call may still be under way)",
            self.name,
            seconds,
            key,
            extra={"event": "effect.awaiting_deadline", "effect": self.name},
        )
        # In slices, each keeping the lease: the wait may be longer than the lease, and
        # holding it must not depend on the heartbeat's cadence.
        while seconds > 0:
            pause = min(seconds, ctx.services.lease_ttl / 3)
            await ctx.services.clock.sleep(pause)
            seconds -= pause
            await _keep(ctx)

    def _reconciler(
        self, ctx: RunContext, key: str, call: Call, host: Host | None
    ) -> Callable[[], Awaitable[Any]] | None:
        """The provider asked whether `key` happened (None: the effect has no reconciler)."""
        reconcile = self.options.reconcile
        if reconcile is None:
            return None
        extra = {self._reconcile_token: ctx.token} if self._reconcile_token else {}
        return lambda: _call(
            reconcile, host, *call.args, idempotency_key=key, **extra, **call.kwargs
        )

    async def _same_arguments(self, ctx: RunContext, call: Call, row: dict[str, Any]) -> None:
        """Refuse a replay whose call at this place brings other arguments than the ledger's."""
        changed = changed_arguments(row, call.identity)
        if not changed:
            return
        key = str(row["idempotency_key"])
        refused = NondeterminismError(
            node=call.where.node, effect=self.name, key=key, changed=changed
        )
        ctx.calls.refuse(call.where, call.tool, refused)
        await event(
            ctx,
            "effect.nondeterminism",
            {"key": key, "effect": self.name, "node": call.where.node, "changed": changed},
        )
        raise refused

    async def _perform(
        self,
        ctx: RunContext,
        call: Call,
        key: str,
        attempts: int,
        host: Host | None,
        lease: LeaseBound | None,
    ) -> Any:
        """Call the provider under `key` until it succeeds or fails for good. Only the first
        attempt of a key reserved just now may go on the reservation's `lease` bound; every
        other attempt arms the key's deadline first. Abandoned: an attempt outlived the
        effect's timeout, its outcome unknown (the key stays pending)."""
        where = call.where
        extra = {"idempotency_key": key, **({self._token: ctx.token} if self._token else {})}
        timeout = self.options.timeout_for(ctx.services)
        while True:
            attempts += 1
            started = time.monotonic()
            try:
                result = await self._attempt(
                    ctx, host, lease, key, timeout, call.args, {**call.kwargs, **extra}
                )
            except (LeaseLost, RunCancelled):
                raise  # nothing was performed: the key stays as it was, for the next owner
            except Abandoned:
                took("effect.perform", started, key, self.name, attempts, error="timed out")
                await event(
                    ctx,
                    "effect.timed_out",
                    {"key": key, "effect": self.name, "attempt": attempts, "timeout": timeout},
                )
                raise
            except EffectConflict as conflict:
                # The provider says this key has more than one outcome: a person decides.
                took("effect.perform", started, key, self.name, attempts, error=repr(conflict))
                await in_doubt.conflicting(ctx, self.name, key, attempts, conflict)
                raise Abandoned from conflict
            except _LeaseUnchecked as unchecked:
                # The lease could not be read (the database is unreachable): nothing was
                # performed, so this is no failure of the effect. The store's own error goes
                # up as it is, for the executor to treat as an infrastructure fault.
                assert unchecked.__cause__ is not None
                raise unchecked.__cause__ from None
            except Exception as exc:
                took("effect.perform", started, key, self.name, attempts, error=repr(exc))
                if self.options.retry.retries(exc, attempts):
                    delay = self.options.retry.delay(attempts, exc)
                    await event(
                        ctx,
                        "effect.retry",
                        {"key": key, "attempt": attempts, "delay": delay, "error": repr(exc)},
                    )
                    await ctx.services.clock.sleep(delay)
                    lease = None
                    # A backoff can be as long as the lease: hold it before the next attempt
                    # rather than depend on the heartbeat's cadence (the lease check is next).
                    await heartbeat.renew(ctx)
                    continue
                await record(ctx, key, EffectStatus.FAILED, attempts, error=repr(exc))
                raise EffectFailed(key, repr(exc)) from exc
            took("effect.perform", started, key, self.name, attempts)
            fault_point("effect.after_perform", self.name, where.node, where.path)
            await record_answer(ctx, key, attempts, result, keep=not self._shared(ctx))
            fault_point("effect.after_record", self.name, where.node, where.path)
            return result

    async def _attempt(
        self,
        ctx: RunContext,
        host: Host | None,
        lease: LeaseBound | None,
        key: str,
        call_timeout: float,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """One provider call, where the lease is known to hold (within the reservation's bound,
        or after arming the key where the call is made) and abandoned at its deadline, which is
        never later than the one the database holds for it."""
        if self.is_async:
            fault_point("effect.before_call", self.name)
            bound = lease if lease is not None and lease.holds(ctx) else None
            if bound is None or bound.remaining(ctx, call_timeout) <= 0:
                # Nothing was called yet: a deadline spent before the call (a stall after the
                # reservation) is armed afresh, not taken for an unknown outcome.
                bound = await _armed(ctx, key, call_timeout)
            if self.options.timeout is None:
                return await self.fn(*args, **kwargs)  # never abandoned: see `timeout=`
            deadline = bound.remaining(ctx, call_timeout)
            if deadline <= 0:
                raise Abandoned
            async with asyncio.timeout(deadline) as within:
                try:
                    return await self.fn(*args, **kwargs)
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    # The deadline's own cancel, not another one (a worker told to stop now).
                    if within.expired() and (task is None or task.cancelling() <= 1):
                        raise Abandoned from None
                    raise
            raise AssertionError("unreachable")  # pragma: no cover

        def checked() -> Any:
            fault_point("effect.before_call", self.name)
            # In the thread that makes the call, right before it: a node thread that carried
            # on (or froze) past the reservation's bound asks the database and finds a takeover
            # here, not after paying. What remains is a freeze between this line and the next;
            # docs/effects.md says what closes it.
            bound = lease if lease is not None and lease.holds(ctx) else None
            if bound is None or bound.remaining(ctx, call_timeout) <= 0:
                bound = ctx.services.portal.call(_armed(ctx, key, call_timeout))
            if self.options.timeout is None:
                # In the node's own thread, as always, never abandoned: the app's default
                # timeout only sets the deadline other owners wait for (docs/effects.md).
                return self.fn(*args, **kwargs)
            return call_within(self.fn, args, kwargs, bound.remaining(ctx, call_timeout))

        return await _call(checked, host)


def changed_arguments(row: dict[str, Any], identity: Identity) -> list[str]:
    """The arguments a call brings that differ from those its ledger row recorded."""
    if row["arg_hashes"] is None or row["args_hash"] == identity.digest:
        return []  # a row from before 0006 is found by a key its arguments are hashed into
    return identity.changed(loads(row["arg_hashes"]))


def recorded_result(row: dict[str, Any]) -> Any:
    """What a settled ledger row gives a call back: its result, or its failure raised."""
    if row["status"] == EffectStatus.FAILED:
        raise EffectFailed(str(row["idempotency_key"]), row["error"] or "unknown error")
    return loads(row["result"])


async def _ready(value: Any) -> Any:
    return value


async def _keep(ctx: RunContext) -> None:
    """Renew the run's lease during a wait and stop it if the run was cancelled meanwhile
    (LeaseLost, RunCancelled)."""
    await heartbeat.renew(ctx)
    await check_lease(ctx)


class _LeaseUnchecked(Exception):
    """The last lease check before a provider call could not be made; nothing was called."""


async def _armed(ctx: RunContext, key: str, seconds: float) -> LeaseBound:
    """The key armed for a new call (its deadline from now), or LeaseLost/RunCancelled; a
    store that cannot be reached is no failure of the effect (_LeaseUnchecked)."""
    try:
        return await arm(ctx, key, seconds)
    except (LeaseLost, RunCancelled):
        raise
    except Exception as exc:
        raise _LeaseUnchecked from exc
