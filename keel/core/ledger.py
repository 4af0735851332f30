"""The effect ledger: every side effect runs once under a deterministic idempotency key.

The key is the call's place in the run (keel.core.effect_keys); the arguments' hashes are kept
beside it, and a replay that brings other arguments to the same place is refused. reserve
(pending) -> perform -> record (sent): two fenced statements around the provider call. The
reservation proves the lease live for a while (`LeaseBound`); a call made within that bound needs
no other look at it, one made later (a frozen thread, a retry, a reconciler first) looks again
in the thread that makes it. A key found `pending` at reserve time was left by a crash:
`keel.core.in_doubt` decides what it becomes. The rows themselves: `keel.core.effect_ledger`.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar, cast

from keel.core import heartbeat, in_doubt
from keel.core.codec import loads
from keel.core.context import RunContext, current
from keel.core.effect_keys import Arguments, Identity, KeySpec, effect_key, legacy_key
from keel.core.effect_ledger import (
    SETTLED,
    Call,
    EffectStatus,
    LeaseBound,
    check_lease,
    event,
    record,
    reserve,
    took,
)
from keel.core.errors import (
    EffectFailed,
    LeaseLost,
    NondeterminismError,
    RunCancelled,
    TransientError,
    UsageError,
)
from keel.core.faults import fault_point
from keel.core.ids import StepRef
from keel.core.in_doubt import reopen_expired
from keel.core.portal import Host
from keel.core.tracing import Mark

P = ParamSpec("P")
R = TypeVar("R")
log = logging.getLogger("keel.core.ledger")


# The module-level names came first; code outside the core still uses them.
PENDING, SENT, CONFIRMED = EffectStatus.PENDING, EffectStatus.SENT, EffectStatus.CONFIRMED
FAILED, IN_DOUBT = EffectStatus.FAILED, EffectStatus.IN_DOUBT
__all__ = ["SETTLED", "Call", "EffectStatus", "check_lease", "record", "reopen_expired", "reserve"]

KEY: str = "<supplied by keel>"
"""The default to give an effect's ``idempotency_key`` parameter, so that type checkers let
callers omit it (``*, idempotency_key: str = keel.KEY``): Keel always passes the real key."""


@dataclass(frozen=True)
class Retry:
    """Which errors are transient and how long to back off between attempts (same key)."""

    max_attempts: int = 5
    initial: float = 0.5
    maximum: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.5
    on: tuple[type[BaseException], ...] = (TransientError,)

    def delay(self, attempt: int, exc: BaseException) -> float:
        hint = getattr(exc, "retry_after", None)
        if isinstance(hint, int | float) and hint >= 0:
            return min(float(hint), self.maximum)
        base = min(self.maximum, self.initial * self.multiplier ** (attempt - 1))
        # Jitter spreads retries of many runs hit by the same outage.
        return base * (1 - self.jitter * random.random())

    def retries(self, exc: BaseException, attempt: int) -> bool:
        return attempt < self.max_attempts and isinstance(exc, self.on)


NO_RETRY = Retry(max_attempts=1)


async def _call(fn: Callable[..., Any], host: Host | None, *args: Any, **kwargs: Any) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    if host is not None:
        return await host.run(fn, *args, **kwargs)
    raise UsageError(
        f"{getattr(fn, '__name__', fn)} is a plain function called from an async node; "
        "make the effect `async def` or the node a plain `def`"
    )


def _token_keyword(fn: Callable[..., Any] | None) -> str | None:
    """The keyword under which `fn` takes the lease's fencing token, if it takes it."""
    params = inspect.signature(fn).parameters if fn is not None else {}
    return next((k for k in ("fencing_token", "lease_token") if k in params), None)


class Effect(Generic[P, R]):
    """A function whose every call inside a run goes through the ledger."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        *,
        reconcile: Callable[..., Any] | None,
        provider_idempotent: bool,
        retry: Retry,
        key: KeySpec = None,
    ) -> None:
        if "idempotency_key" not in inspect.signature(fn).parameters:
            raise UsageError(f"effect {name!r}: the function must accept `idempotency_key`")
        self.fn, self.name = fn, name
        self.reconcile = reconcile
        self.provider_idempotent = provider_idempotent
        self.retry = retry
        self.arguments = Arguments(fn, name, key)
        self.is_async = inspect.iscoroutinefunction(fn)
        self._token = _token_keyword(fn)
        self._reconcile_token = _token_keyword(reconcile)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        ctx = current(f"effect {self.name!r}")
        # Arguments the function cannot take fail here, before anything is counted or reserved.
        identity = self.arguments.identity(args, kwargs)
        where = ctx.locate()
        # Numbered now, in the order the node makes its calls, not the order coroutines start.
        index = ctx.calls.next(where, self.name)
        call = Call(
            where,
            index,
            effect_key(where, self.name, index),
            legacy_key(where, self.name, args, kwargs),
            identity,
            args,
            kwargs,
        )
        if ctx.replay is not None:
            # A replay performs nothing and writes nothing: the recorded ledger answers.
            served = ctx.replay.effect(self.name, call.key, call.legacy_key, where, index, identity)
            if self.is_async and ctx.services.portal.on_loop():
                return cast(R, _ready(served))
            return cast(R, served)
        if self.is_async and ctx.services.portal.on_loop():
            return cast(R, self._settle(ctx, call, None))  # the async node awaits it
        # A sync node's thread blocks until done; an un-awaited coroutine would send nothing.
        return cast(
            R,
            ctx.services.portal.call(
                lambda host: self._settle(ctx, call, host),
                context=contextvars.copy_context(),
            ),
        )

    async def _settle(self, ctx: RunContext, call: Call, host: Host | None) -> Any:
        with ctx.tracer.effect(call.where, self.name) as span:
            return await self._settled(ctx, call, host, span)

    async def _settled(self, ctx: RunContext, call: Call, host: Host | None, span: Mark) -> Any:
        fault_point("effect.before_reserve", self.name, call.where.node, call.where.path)
        row, new, lease = await reserve(ctx, call, self.name)
        key = str(row["idempotency_key"])
        span.note(key=key, ledger=str(row["status"]), new=new)
        if not new:
            await self._same_arguments(ctx, call, row)
        if row["status"] in SETTLED:
            span.note(outcome="served from the ledger")
            return recorded_result(row)
        attempts = int(row["attempts"])
        if not new:
            outcome = await in_doubt.resolve(
                ctx,
                self.name,
                key,
                row,
                reconcile=self._reconciler(ctx, key, call, host),
                provider_idempotent=self.provider_idempotent,
            )
            if outcome is not in_doubt.PERFORM:
                span.note(outcome="resolved (reconciled or answered)")
                return outcome
        result = await self._perform(
            ctx, call.where, key, attempts, call.args, call.kwargs, host, lease
        )
        span.note(outcome="performed")
        return result

    def _reconciler(
        self, ctx: RunContext, key: str, call: Call, host: Host | None
    ) -> Callable[[], Awaitable[Any]] | None:
        """The provider asked whether `key` happened (None: the effect has no reconciler)."""
        reconcile = self.reconcile
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
        await event(
            ctx,
            "effect.nondeterminism",
            {"key": key, "effect": self.name, "node": call.where.node, "changed": changed},
        )
        raise NondeterminismError(node=call.where.node, effect=self.name, key=key, changed=changed)

    async def _perform(
        self,
        ctx: RunContext,
        where: StepRef,
        key: str,
        attempts: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        host: Host | None,
        lease: LeaseBound | None,
    ) -> Any:
        """Call the provider under `key` until it succeeds or fails for good. Only the first
        attempt of a key reserved just now may go on the reservation's `lease` bound."""
        extra = {"idempotency_key": key, **({self._token: ctx.token} if self._token else {})}
        while True:
            attempts += 1
            started = time.monotonic()
            try:
                result = await self._attempt(ctx, host, lease, args, {**kwargs, **extra})
            except (LeaseLost, RunCancelled):
                raise  # nothing was performed: the key stays as it was, for the next owner
            except _LeaseUnchecked as unchecked:
                # The lease could not be read (the database is unreachable): nothing was
                # performed, so this is no failure of the effect. The store's own error goes
                # up as it is, for the executor to treat as an infrastructure fault.
                assert unchecked.__cause__ is not None
                raise unchecked.__cause__ from None
            except Exception as exc:
                took("effect.perform", started, key, self.name, attempts, error=repr(exc))
                if self.retry.retries(exc, attempts):
                    delay = self.retry.delay(attempts, exc)
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
            await record(ctx, key, EffectStatus.SENT, attempts, result=result)
            fault_point("effect.after_record", self.name, where.node, where.path)
            return result

    async def _attempt(
        self,
        ctx: RunContext,
        host: Host | None,
        lease: LeaseBound | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """One provider call, where the lease is known to hold: within the reservation's bound,
        or after a last check of it where the call is made."""
        if self.is_async:
            fault_point("effect.before_call", self.name)
            if lease is None or not lease.holds(ctx):
                try:
                    await check_lease(ctx)
                except (LeaseLost, RunCancelled):
                    raise
                except Exception as exc:
                    raise _LeaseUnchecked from exc
            return await self.fn(*args, **kwargs)

        def checked() -> Any:
            fault_point("effect.before_call", self.name)
            # In the thread that makes the call, right before it: a node thread that carried
            # on (or froze) past the reservation's bound asks the database and finds a takeover
            # here, not after paying. What remains is a freeze between this line and the next;
            # docs/effects.md says what closes it.
            if lease is None or not lease.holds(ctx):
                try:
                    ctx.services.portal.call(check_lease(ctx))
                except (LeaseLost, RunCancelled):
                    raise
                except Exception as exc:
                    raise _LeaseUnchecked from exc
            return self.fn(*args, **kwargs)

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


class _LeaseUnchecked(Exception):
    """The last lease check before a provider call could not be made; nothing was called."""


def effect(
    name: str | None = None,
    *,
    reconcile: Callable[..., Any] | None = None,
    provider_idempotent: bool = False,
    retry: Retry | None = None,
    key: KeySpec = None,
) -> Callable[[Callable[P, R]], Effect[P, R]]:
    """Make a function an effect: once per key, whatever the retries and crashes around it.

    The function (sync or async) must take an ``idempotency_key`` keyword; pass it on to the
    provider if it dedupes by key. A function that takes ``fencing_token`` (or
    ``lease_token``) also gets the run's lease token, for providers that refuse stale writers.
    ``reconcile`` has the same signature and returns the effect's result if the provider has
    it, ``None`` if it never happened. ``key`` names the arguments that identify the effect
    (or is a function of the bound arguments): a replay may change the others.
    """

    def wrap(fn: Callable[P, R]) -> Effect[P, R]:
        return Effect(
            fn,
            name or fn.__name__,
            reconcile=reconcile,
            provider_idempotent=provider_idempotent,
            retry=retry or Retry(),
            key=key,
        )

    return wrap
