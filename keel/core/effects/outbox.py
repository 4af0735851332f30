"""The outbox for user effects: a node records an intent; a dispatcher delivers it later.

`@keel.effect(name, outbox=True, ...)` (or `keel.enqueue(effect, ...)` for any effect) does not
call the provider. It stages an intent with the calling task's writes (`RunContext.stage`): the
saver inserts it in the fenced transaction that commits them, so an intent exists if and only if
the step that made it committed. The call returns the intent's id at once; every dispatcher
(keel.core.effects.dispatch) delivers it under that id as idempotency key, rate-limited,
retried, reconciled after a crash, or dead-lettered for a person.

Identity follows the ledger's rules: the id is the call's place in the run and its order among
the task's calls of that effect; the arguments are hashed beside it, and a replay of the step
that brings other arguments is refused (NondeterminismError), never a second intent.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, Literal, ParamSpec, TypeVar, overload

from keel.core.clock import parse_duration
from keel.core.codec import dumps, loads
from keel.core.context import current
from keel.core.effects import ledger
from keel.core.effects.keys import Arguments, Identity, KeySpec
from keel.core.effects.ledger import Duration, Effect, Retry, effect_timeout
from keel.core.errors import EffectFailed, NondeterminismError, NotInRun, UsageError
from keel.core.services import Services
from keel.core.store.base import Row, Tx
from keel.core.store.store import Store
from keel.core.wait_model import WaitKind, WaitStatus

P = ParamSpec("P")
R = TypeVar("R")
log = logging.getLogger("keel.core.effects.outbox")
PREFIX = "outbox:"


class IntentState(StrEnum):
    """Where a user effect intent is: pending -> sending -> delivered, or dead, or in_doubt."""

    PENDING = "pending"
    SENDING = "sending"
    DELIVERED = "delivered"
    DEAD = "dead"
    """Its attempts ran out, or it failed permanently: kept with its error for a person."""
    IN_DOUBT = "in_doubt"
    """Its dispatcher died mid-delivery and nothing can say whether it reached the provider."""


@dataclass(frozen=True)
class Rate:
    """A token bucket: `per_second` tokens a second, at most `burst` saved up."""

    per_second: float
    burst: float

    _FORM = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d*)\s*(s|sec|second|m|min|minute|h|hour)\s*$")
    _UNITS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60}

    @classmethod
    def parse(cls, text: str) -> Rate:
        """`"20/s"`, `"600/m"`, `"1/5s"`, `"100/h"`: a steady rate, with a burst of one
        second's worth (at least one): a quiet effect may send that many at once."""
        found = cls._FORM.match(text) if isinstance(text, str) else None
        if found is None:
            raise UsageError(f"rate {text!r}: write it as N/s, N/m or N/h (e.g. '20/s', '1/5s')")
        count, every, unit = float(found[1]), float(found[2] or 1), found[3]
        seconds = every * cls._UNITS.get(unit, 3600)
        if count <= 0 or seconds <= 0:
            raise UsageError(f"rate {text!r}: must be more than zero")
        per_second = count / seconds
        return cls(per_second, float(max(1, math.floor(per_second))))


class OutboxEffect(Generic[P, R]):
    """An effect whose calls inside a node are recorded as intents and delivered later."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        *,
        reconcile: Callable[..., Any] | None = None,
        provider_idempotent: bool = False,
        retry: Retry | None = None,
        rate: str | None = None,
        max_attempts: int | None = None,
        key: KeySpec = None,
        timeout: Duration | None = None,
    ) -> None:
        if "idempotency_key" not in inspect.signature(fn).parameters:
            raise UsageError(f"effect {name!r}: the function must accept `idempotency_key`")
        self.fn, self.name = fn, name
        self.reconcile = reconcile
        self.provider_idempotent = provider_idempotent
        self.retry = retry or Retry()
        self.timeout_declared = timeout is not None
        self.timeout = effect_timeout(name, timeout)
        """Seconds one delivery's provider call may take before it is abandoned (unknown)."""
        self.rate = Rate.parse(rate) if rate is not None else None
        self.max_attempts = max_attempts if max_attempts is not None else self.retry.max_attempts
        if self.max_attempts < 1:
            raise UsageError(f"effect {name!r}: max_attempts must be at least 1")
        self.arguments = Arguments(fn, name, key)
        functools.update_wrapper(self, fn)
        register(self)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> str:
        return stage(self, args, kwargs)

    def timeout_for(self, services: Services) -> float:
        """This effect's timeout: declared, or the app's default for effects."""
        return self.timeout if self.timeout_declared else services.effect_timeout


@overload
def effect(
    name: str | None = None,
    *,
    outbox: Literal[False] = False,
    reconcile: Callable[..., Any] | None = None,
    provider_idempotent: bool = False,
    retry: Retry | None = None,
    key: KeySpec = None,
    timeout: Duration | None = None,
) -> Callable[[Callable[P, R]], Effect[P, R]]: ...


@overload
def effect(
    name: str | None = None,
    *,
    outbox: Literal[True],
    reconcile: Callable[..., Any] | None = None,
    provider_idempotent: bool = False,
    retry: Retry | None = None,
    key: KeySpec = None,
    rate: str | None = None,
    max_attempts: int | None = None,
    timeout: Duration | None = None,
) -> Callable[[Callable[P, R]], OutboxEffect[P, R]]: ...


def effect(
    name: str | None = None,
    *,
    outbox: bool = False,
    reconcile: Callable[..., Any] | None = None,
    provider_idempotent: bool = False,
    retry: Retry | None = None,
    key: KeySpec = None,
    rate: str | None = None,
    max_attempts: int | None = None,
    timeout: Duration | None = None,
) -> Callable[[Callable[P, R]], Any]:
    """`keel.effect`: a ledger effect (keel.core.effects.ledger.effect), or with ``outbox=True`` an
    outbox effect: a call inside a node records an intent with the step and returns its id at
    once; a dispatcher delivers it (``rate="20/s"`` shared by all dispatchers, up to
    ``max_attempts``, retried per ``retry``; see docs/outbox.md). ``timeout`` bounds one provider
    call (default: the app's ``effect_timeout``, 60 s): nobody reconciles or resends the key
    before that deadline and a margin have passed (docs/effects.md)."""
    if not outbox:
        if rate is not None or max_attempts is not None:
            raise UsageError("rate= and max_attempts= apply to outbox effects (outbox=True)")
        return ledger.effect(
            name,
            reconcile=reconcile,
            provider_idempotent=provider_idempotent,
            retry=retry,
            key=key,
            timeout=timeout,
        )

    def wrap(fn: Callable[P, R]) -> OutboxEffect[P, R]:
        return OutboxEffect(
            fn,
            name or fn.__name__,
            reconcile=reconcile,
            provider_idempotent=provider_idempotent,
            retry=retry,
            rate=rate,
            max_attempts=max_attempts,
            key=key,
            timeout=timeout,
        )

    return wrap


EFFECTS: dict[str, OutboxEffect[Any, Any]] = {}
"""Outbox effects by name, as this process declared them: what its dispatcher can deliver."""


def register(effect: OutboxEffect[Any, Any]) -> None:
    known = EFFECTS.get(effect.name)
    if known is not None and known.fn is not effect.fn:
        log.warning("outbox effect %r declared again: the later declaration delivers", effect.name)
    EFFECTS[effect.name] = effect


def as_outbox(effect: Effect[Any, Any] | OutboxEffect[Any, Any]) -> OutboxEffect[Any, Any]:
    """The outbox form of a ledger effect (same function, reconciler and retry policy)."""
    if isinstance(effect, OutboxEffect):
        return effect
    if not isinstance(effect, Effect):
        raise UsageError(f"keel.enqueue() takes a @keel.effect, not {type(effect).__name__}")
    known = EFFECTS.get(effect.name)
    if known is not None and known.fn is effect.fn:
        return known
    return OutboxEffect(
        effect.fn,
        effect.name,
        reconcile=effect.reconcile,
        provider_idempotent=effect.provider_idempotent,
        retry=effect.retry,
        key=effect.arguments.key,
        timeout=effect.timeout if effect.timeout_declared else None,
    )


def enqueue(effect: Effect[P, R] | OutboxEffect[P, R], *args: P.args, **kwargs: P.kwargs) -> str:
    """Record an intent to call `effect(*args, **kwargs)` with this step; return its id.

    The intent commits with the calling task's writes (nothing is recorded if the step does not
    commit) and a dispatcher delivers it later, with the intent id as idempotency key."""
    return stage(as_outbox(effect), args, kwargs)


@dataclass(frozen=True)
class _Intent:
    """One staged intent: what the saver inserts in the transaction of its task's writes."""

    row: Row
    identity: Identity

    @property
    def key(self) -> str:
        return str(self.row["intent_id"])

    async def __call__(self, store: Store, tx: Tx) -> None:
        if await store.insert_effect_intent(tx, self.row):
            await store.add_event(
                tx,
                self.row["run_id"],
                "outbox.enqueued",
                {"intent_id": self.key, "effect": self.row["effect"], "node": self.row["node"]},
                worker_id=self.row.get("worker_id"),
                token=self.row.get("token"),
            )
            return
        found = await store.read_effect_intent(tx, self.key)
        if found is not None and found["args_hash"] != self.row["args_hash"]:
            # Refused in the step's own transaction: nothing of this step commits.
            raise NondeterminismError(
                node=str(self.row["node"]),
                effect=str(self.row["effect"]),
                key=self.key,
                changed=self.identity.changed(loads(found["arg_hashes"])),
            )


def stage(effect: OutboxEffect[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    ctx = current(f"outbox effect {effect.name!r}")
    identity = effect.arguments.identity(args, kwargs)
    try:
        encoded = dumps({"args": list(args), "kwargs": kwargs})
    except (TypeError, ValueError) as exc:
        raise UsageError(
            f"outbox effect {effect.name!r}: its arguments are stored until delivery and must "
            f"be JSON (or dates, enums, dataclasses, models): {exc}"
        ) from None
    where = ctx.locate()
    if not where.task_id:
        raise NotInRun(f"outbox effect {effect.name!r} must be called inside a LangGraph node")
    index = ctx.calls.next(where, PREFIX + effect.name)
    intent_id = where.key("outbox", effect.name, f"call:{index}")
    if ctx.replay is not None:
        return intent_id  # a replay records nothing: the same id, nothing staged
    intent = _Intent(
        {
            "intent_id": intent_id,
            "run_id": ctx.run_id,
            "effect": effect.name,
            "node": where.node,
            "step": where.step,
            "task_path": where.path,
            "call_index": index,
            "args": encoded,
            "args_hash": identity.digest,
            "arg_hashes": dumps(identity.hashes),
            "max_attempts": effect.max_attempts,
            "worker_id": ctx.worker_id,
            "token": ctx.token,
        },
        identity,
    )
    # A task attempt that LangGraph retried staged the same ids: only the last attempt's count.
    staged = ctx.staged.get(where.task_id, [])
    staged[:] = [w for w in staged if getattr(w, "key", None) != intent_id]
    ctx.stage(where.task_id, intent)
    return intent_id


def await_effect(handle: str, *, timeout: float | str = "7d", on_dead: str = "wait") -> Any:
    """Pause the run (a wait: no worker is held) until the intent `handle` is delivered;
    return the provider's result.

    Call it in a node after the one that enqueued (its step must have committed for the intent
    to exist). A dead intent keeps the run waiting until a person retries or resolves it
    (`on_dead="wait"`), or raises EffectFailed in the node (`on_dead="raise"`). Like
    `keel.approval()` it is a LangGraph interrupt: the node runs again from its start when the
    run resumes, and an intent delivered already resumes it at once.
    """
    if not isinstance(handle, str) or not handle.startswith(PREFIX):
        raise UsageError(
            f"keel.await_effect() takes an intent id from an outbox effect, not {handle!r}"
        )
    if on_dead not in ("wait", "raise"):
        raise UsageError(f"on_dead must be 'wait' or 'raise', not {on_dead!r}")
    ctx = current("keel.await_effect()")
    spec = {
        "keel_wait": {
            "kind": WaitKind.OUTBOX.value,
            "name": handle.split(":", 2)[1],
            "payload": {"intent_id": handle, "on_dead": on_dead},
            "timeout": parse_duration(timeout),
            "on_timeout": "fail",
        }
    }
    answer = ctx.pause(spec)
    decision = answer.get("decision") if isinstance(answer, dict) else answer
    if decision == IntentState.DELIVERED:
        return answer.get("result")
    if decision == IntentState.DEAD:
        raise EffectFailed(handle, str(answer.get("error") or "dead"))
    raise EffectFailed(handle, f"not delivered (the wait ended {decision!r})")


async def answer_waits(store: Store, tx: Tx, intent: Row) -> int:
    """Decide the run's pending waits on `intent` if it is settled for them; return how many.

    In the transaction that settles the intent (after the run's lock), and in the one that
    registers a wait (an intent delivered before its wait exists resumes the run at once)."""
    state = intent["status"]
    if state not in (IntentState.DELIVERED, IntentState.DEAD):
        return 0
    answered = 0
    for wait in await store.read_waits(tx, intent["run_id"]):
        payload = loads(wait["payload"]) if wait["kind"] == WaitKind.OUTBOX else None
        if wait["status"] != WaitStatus.PENDING or not isinstance(payload, dict):
            continue
        if payload.get("intent_id") != intent["intent_id"]:
            continue
        if state == IntentState.DEAD and payload.get("on_dead") != "raise":
            continue
        value = {
            "decision": state,
            "wait_id": wait["wait_id"],
            "intent_id": intent["intent_id"],
            "result": loads(intent["result"]),
            "error": intent["error"],
        }
        decided = await store.decide_wait(
            tx,
            wait["wait_id"],
            decision=str(state),
            value=dumps(value),
            decided_by="outbox",
            action_id=None,
            channel="outbox",
            comment=None,
        )
        answered += decided is not None
    return answered


def public(row: Row) -> dict[str, Any]:
    """An intent as `keel effects list` and the HTTP API show it."""
    shown = {k: row[k] for k in INTENT_FIELDS}
    shown["args"] = loads(row["args"])
    shown["result"] = loads(row["result"])
    return shown


INTENT_FIELDS = (
    "intent_id",
    "run_id",
    "effect",
    "node",
    "step",
    "status",
    "attempts",
    "max_attempts",
    "error",
    "created_at",
    "updated_at",
    "delivered_at",
)
