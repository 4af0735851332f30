"""The effect ledger: every side effect runs once under a deterministic idempotency key.

The key is the call's place in the run (keel.core.effect_keys); the arguments' hashes are kept
beside it, and a replay that brings other arguments to the same place is refused. reserve
(pending) -> lease check -> perform -> record (sent): two fenced commits around the provider
call, and a last look at the lease in the thread that makes it. A key found `pending` at
reserve time was left by a crash: it may or may not have reached the provider, so Keel asks
the effect's reconciler, retries under the same key if the provider dedupes by key, or marks it
`in_doubt` and pauses the run for a person. It never guesses.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, ParamSpec, TypeVar, cast

from keel.core import heartbeat
from keel.core.codec import dumps, loads
from keel.core.context import RunContext, current
from keel.core.effect_keys import Arguments, Identity, KeySpec, effect_key, legacy_key
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
from keel.core.portal import Host
from keel.core.store.base import Tx
from keel.core.store.store import Store
from keel.core.tracing import Mark
from keel.core.wait_model import EffectAnswer, WaitKind, WaitStatus

P = ParamSpec("P")
R = TypeVar("R")
log = logging.getLogger("keel.core.ledger")


class EffectStatus(StrEnum):
    """Where a ledger row is: pending -> sent -> confirmed, or failed, or in_doubt."""

    PENDING = "pending"
    SENT = "sent"
    CONFIRMED = "confirmed"
    """The provider (its reconciler, or a person) says it happened."""
    FAILED = "failed"
    IN_DOUBT = "in_doubt"
    """Left pending by a crash, with no way to ask the provider: a person must answer."""


# The module-level names came first; code outside the core still uses them.
PENDING, SENT, CONFIRMED = EffectStatus.PENDING, EffectStatus.SENT, EffectStatus.CONFIRMED
FAILED, IN_DOUBT = EffectStatus.FAILED, EffectStatus.IN_DOUBT
SETTLED = (EffectStatus.SENT, EffectStatus.CONFIRMED, EffectStatus.FAILED)
"""A key in one of these is never performed again: its row answers every later call."""
_PERFORM = object()

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


async def _call(fn: Callable[..., Any], host: Host | None, *args: Any, **kwargs: Any) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    if host is not None:
        return await host.run(fn, *args, **kwargs)
    raise UsageError(
        f"{getattr(fn, '__name__', fn)} is a plain function called from an async node; "
        "make the effect `async def` or the node a plain `def`"
    )


async def check_lease(ctx: RunContext) -> None:
    """Raise LeaseLost (RunCancelled) unless this run's lease is still ours, unexpired (and
    the run not cancelled), judged by the database now."""
    row = await ctx.services.store.check_lease_held(ctx.run_id, ctx.token)
    if row["cancel_requested"]:
        raise RunCancelled(f"run {ctx.run_id} was cancelled")


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
        row, new = await reserve(ctx, call, self.name)
        key = str(row["idempotency_key"])
        span.note(key=key, ledger=str(row["status"]), new=new)
        if not new:
            await self._same_arguments(ctx, call, row)
        if row["status"] in SETTLED:
            span.note(outcome="served from the ledger")
            return recorded_result(row)
        attempts = int(row["attempts"])
        if not new:
            outcome = await self._in_doubt(ctx, key, row, call.args, call.kwargs, host)
            if outcome is not _PERFORM:
                span.note(outcome="resolved (reconciled or answered)")
                return outcome
        result = await self._perform(ctx, call.where, key, attempts, call.args, call.kwargs, host)
        span.note(outcome="performed")
        return result

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

    async def _in_doubt(
        self,
        ctx: RunContext,
        key: str,
        row: dict[str, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        host: Host | None,
    ) -> Any:
        """A key left pending by a crash: find out, retry under the key, or ask a person."""
        answered = _answered(row)
        if row["status"] == EffectStatus.PENDING:
            if self.reconcile is not None:
                started = time.monotonic()
                try:
                    extra = {self._reconcile_token: ctx.token} if self._reconcile_token else {}
                    found = await _call(
                        self.reconcile, host, *args, idempotency_key=key, **extra, **kwargs
                    )
                except Exception as exc:
                    log.warning("reconciler of %s failed for %s: %r", self.name, key, exc)
                else:
                    _took(
                        "effect.reconcile",
                        started,
                        key,
                        self.name,
                        int(row["attempts"]),
                        found=found is not None,
                    )
                    if found is None:
                        await event(ctx, "effect.reconciled", {"key": key, "found": False})
                        return _PERFORM
                    await record(ctx, key, EffectStatus.CONFIRMED, _reached(row), result=found)
                    return found
            elif self.provider_idempotent:
                return _PERFORM
            kept = {"answered": answered} if answered else None
            await record(ctx, key, EffectStatus.IN_DOUBT, int(row["attempts"]), result=kept)
        # Plain strings: the spec goes into the checkpoint, read back by any later version.
        spec = {
            "keel_wait": {
                "kind": WaitKind.EFFECT.value,
                "name": self.name,
                "payload": {"idempotency_key": key, "effect": self.name},
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
            await record(ctx, key, EffectStatus.CONFIRMED, _reached(row), result=result)
            return result
        if (
            not isinstance(resolution, dict)
            or resolution.get("decision") != EffectAnswer.NOT_PERFORMED
        ):
            # Not an answer (the deadline passed, an approval landed here): never guess.
            what = resolution.get("decision") if isinstance(resolution, dict) else resolution
            raise EffectFailed(key, f"in doubt and not resolved (the wait ended {what!r})")
        if resolution.get("wait_id"):
            # Back to pending before performing: a crash now leaves the key in doubt, not answered.
            answered = [*answered, str(resolution["wait_id"])]
            await record(
                ctx, key, EffectStatus.PENDING, int(row["attempts"]), result={"answered": answered}
            )
        return _PERFORM

    async def _perform(
        self,
        ctx: RunContext,
        where: StepRef,
        key: str,
        attempts: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        host: Host | None,
    ) -> Any:
        extra = {"idempotency_key": key, **({self._token: ctx.token} if self._token else {})}
        while True:
            attempts += 1
            started = time.monotonic()
            try:
                result = await self._attempt(ctx, host, args, {**kwargs, **extra})
            except (LeaseLost, RunCancelled):
                raise  # nothing was performed: the key stays as it was, for the next owner
            except _LeaseUnchecked as unchecked:
                # The lease could not be read (the database is unreachable): nothing was
                # performed, so this is no failure of the effect. The store's own error goes
                # up as it is, for the executor to treat as an infrastructure fault.
                assert unchecked.__cause__ is not None
                raise unchecked.__cause__ from None
            except Exception as exc:
                _took("effect.perform", started, key, self.name, attempts, error=repr(exc))
                if self.retry.retries(exc, attempts):
                    delay = self.retry.delay(attempts, exc)
                    await event(
                        ctx,
                        "effect.retry",
                        {"key": key, "attempt": attempts, "delay": delay, "error": repr(exc)},
                    )
                    await ctx.services.clock.sleep(delay)
                    # A backoff can be as long as the lease: hold it before the next attempt
                    # rather than depend on the heartbeat's cadence (the lease check is next).
                    await heartbeat.renew(ctx)
                    continue
                await record(ctx, key, EffectStatus.FAILED, attempts, error=repr(exc))
                raise EffectFailed(key, repr(exc)) from exc
            _took("effect.perform", started, key, self.name, attempts)
            fault_point("effect.after_perform", self.name, where.node, where.path)
            await record(ctx, key, EffectStatus.SENT, attempts, result=result)
            fault_point("effect.after_record", self.name, where.node, where.path)
            return result

    async def _attempt(
        self, ctx: RunContext, host: Host | None, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """One provider call, after a last check of the lease where the call is made."""
        if self.is_async:
            fault_point("effect.before_call", self.name)
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
            # on (or froze) past a takeover finds out here, not after paying. What remains is a
            # freeze between this line and the next; docs/effects.md says what closes it.
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
        answered = _answered(row)
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


def _reached(row: dict[str, Any]) -> int:
    """The attempts of a key confirmed after a crash: the crashed attempt reached the provider
    (its reconciler or a person says so) but died before it was counted."""
    return int(row["attempts"]) + 1


def _answered(row: dict[str, Any]) -> list[str]:
    """Waits whose answer about this key was already acted upon (kept while it is unsettled)."""
    kept = (
        loads(row["result"])
        if row["status"] in (EffectStatus.PENDING, EffectStatus.IN_DOUBT)
        else None
    )
    return [str(w) for w in kept.get("answered", [])] if isinstance(kept, dict) else []


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


# -- ledger rows (fenced) --------------------------------------------------------------------


async def reserve(ctx: RunContext, call: Call, name: str) -> tuple[dict[str, Any], bool]:
    """The call's ledger row, and whether this reserved it (pending) just now."""
    store: Store = ctx.services.store
    where = call.where
    started = time.monotonic()
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
    )
    if found is None:
        await store.check_token(ctx.run_id, ctx.token)  # LeaseLost, RunNotFound
        raise LeaseLost(f"run {ctx.run_id}: lease token {ctx.token} could not reserve {call.key}")
    if found.pop("cancelled"):
        # A cancelled run starts no new side effect, whatever its checkpoint cadence.
        raise RunCancelled(f"run {ctx.run_id} was cancelled")
    legacy, reserved = found.pop("legacy"), bool(found.pop("reserved"))
    existing = found if found.get("idempotency_key") is not None else None
    if legacy:
        assert existing is not None
        return existing, False
    row = existing if reserved else None
    assert existing is not None
    log.info(
        "effect.reserve %s key=%s status=%s%s",
        name,
        call.key,
        existing["status"],
        "" if row is None else " (new)",
        extra={
            "event": "effect.reserve",
            "effect": name,
            "duration": round(time.monotonic() - started, 6),
        },
    )
    return existing, row is not None


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


def _took(what: str, started: float, key: str, name: str, attempt: int, **more: Any) -> None:
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
