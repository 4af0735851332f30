"""The effect ledger: every side effect runs once under a deterministic idempotency key.

reserve (pending) -> perform -> record (sent), two fenced commits. A key found `pending` at
reserve time was left by a crash: it may or may not have reached the provider, so Keel asks
the effect's reconciler, retries under the same key if the provider dedupes by key, or marks it
`in_doubt` and pauses the run for a person. It never guesses.
"""

from __future__ import annotations

import asyncio
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

from keel.core.codec import dumps, loads
from keel.core.context import RunContext, current
from keel.core.errors import EffectFailed, RunCancelled, TransientError, UsageError
from keel.core.faults import fault_point
from keel.core.ids import StepRef, args_hash
from keel.core.portal import Host
from keel.core.store.store import Store
from keel.core.wait_model import EffectAnswer, WaitKind

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
_PERFORM = object()


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
    ) -> None:
        if "idempotency_key" not in inspect.signature(fn).parameters:
            raise UsageError(f"effect {name!r}: the function must accept `idempotency_key`")
        self.fn, self.name = fn, name
        self.reconcile = reconcile
        self.provider_idempotent = provider_idempotent
        self.retry = retry
        self.is_async = inspect.iscoroutinefunction(fn)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        # Typed loosely on purpose: callers omit `idempotency_key`, which Keel supplies.
        ctx = current(f"effect {self.name!r}")
        if self.is_async and ctx.services.portal.on_loop():
            return cast(R, self._run(ctx, args, kwargs, None))  # the async node awaits it
        # A sync node's thread blocks until done; an un-awaited coroutine would send nothing.
        return cast(
            R,
            ctx.services.portal.call(
                lambda host: self._run(ctx, args, kwargs, host),
                context=contextvars.copy_context(),
            ),
        )

    async def _run(
        self, ctx: RunContext, args: tuple[Any, ...], kwargs: dict[str, Any], host: Host | None
    ) -> Any:
        where = ctx.locate()
        content = args_hash(args, kwargs)
        key = where.key("effect", self.name, content)
        # Two identical calls in flight in one task (asyncio.gather) share one performance.
        if key in ctx.inflight:
            return await ctx.inflight[key]
        waiter = asyncio.get_running_loop().create_future()
        ctx.inflight[key] = waiter
        try:
            result = await self._settle(ctx, where, key, content, args, kwargs, host)
        except BaseException as exc:
            waiter.set_exception(exc)
            waiter.exception()  # retrieved: a lone caller must not log "never retrieved"
            raise
        else:
            waiter.set_result(result)
            return result
        finally:
            del ctx.inflight[key]

    async def _settle(
        self,
        ctx: RunContext,
        where: StepRef,
        key: str,
        content: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        host: Host | None,
    ) -> Any:
        fault_point("effect.before_reserve", self.name)
        row, new = await reserve(ctx, key, where, self.name, content)
        status = row["status"]
        if status in (EffectStatus.SENT, EffectStatus.CONFIRMED):
            return loads(row["result"])
        if status == EffectStatus.FAILED:
            raise EffectFailed(key, row["error"] or "unknown error")
        attempts = int(row["attempts"])
        if not new:
            outcome = await self._in_doubt(ctx, key, row, args, kwargs, host)
            if outcome is not _PERFORM:
                return outcome
        return await self._perform(ctx, key, attempts, args, kwargs, host)

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
                    found = await _call(self.reconcile, host, *args, idempotency_key=key, **kwargs)
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
                    await record(
                        ctx, key, EffectStatus.CONFIRMED, int(row["attempts"]), result=found
                    )
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
        # An answer already acted upon (performed, then a crash before the record) says nothing
        # about that later attempt: the key is in doubt again and needs a new answer.
        while isinstance(resolution, dict) and resolution.get("wait_id") in answered:
            resolution = ctx.pause(spec)
        if isinstance(resolution, dict) and resolution.get("performed"):
            result = resolution.get("result")
            await record(ctx, key, EffectStatus.CONFIRMED, int(row["attempts"]), result=result)
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
        key: str,
        attempts: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        host: Host | None,
    ) -> Any:
        while True:
            attempts += 1
            started = time.monotonic()
            try:
                result = await _call(self.fn, host, *args, idempotency_key=key, **kwargs)
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
                    continue
                await record(ctx, key, EffectStatus.FAILED, attempts, error=repr(exc))
                raise EffectFailed(key, repr(exc)) from exc
            _took("effect.perform", started, key, self.name, attempts)
            fault_point("effect.after_perform", self.name)
            await record(ctx, key, EffectStatus.SENT, attempts, result=result)
            fault_point("effect.after_record", self.name)
            return result


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
) -> Callable[[Callable[P, R]], Effect[P, R]]:
    """Make a function an effect: once per key, whatever the retries and crashes around it.

    The function (sync or async) must take an ``idempotency_key`` keyword; pass it on to the
    provider if it dedupes by key. ``reconcile`` has the same signature and returns the
    effect's result if the provider has it, ``None`` if it never happened.
    """

    def wrap(fn: Callable[P, R]) -> Effect[P, R]:
        return Effect(
            fn,
            name or fn.__name__,
            reconcile=reconcile,
            provider_idempotent=provider_idempotent,
            retry=retry or Retry(),
        )

    return wrap


# -- ledger rows (fenced) --------------------------------------------------------------------


async def reserve(
    ctx: RunContext, key: str, where: StepRef, name: str, content: str
) -> tuple[dict[str, Any], bool]:
    store: Store = ctx.services.store
    async with store.transaction() as tx:
        fence = await store.check_fence(tx, ctx.run_id, ctx.token)
        if fence["cancel_requested"]:
            # A cancelled run starts no new side effect, whatever its checkpoint cadence.
            raise RunCancelled(f"run {ctx.run_id} was cancelled")
        row = await store.insert_effect(
            tx,
            key,
            run_id=ctx.run_id,
            name=name,
            node=where.node,
            step=where.step,
            task_path=where.path,
            args_hash=content,
            token=ctx.token,
        )
        existing = row or await store.read_effect(tx, key)
    assert existing is not None
    log.info(
        "effect.reserve %s key=%s status=%s%s",
        name,
        key,
        existing["status"],
        "" if row is None else " (new)",
        extra={"event": "effect.reserve", "effect": name},
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
    async with store.fenced(ctx.run_id, ctx.token) as tx:
        await store.update_effect(
            tx,
            key,
            status=status,
            attempts=attempts,
            result=encoded,
            error=error,
            token=ctx.token,
        )
        await store.add_event(
            tx,
            ctx.run_id,
            f"effect.{status}",
            {"key": key, "error": error} if error else {"key": key},
            worker_id=ctx.worker_id,
            token=ctx.token,
        )


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
