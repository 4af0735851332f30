"""The effect outbox: a node records an intent; a dispatcher delivers it later.

(Its rows are intents, table `keel_intents`; notifications about waits have an outbox of their
own, keel.core.notification_outbox.)

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

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ParamSpec, TypeVar

from keel.core.clock import parse_duration
from keel.core.codec import dumps, loads
from keel.core.context import current
from keel.core.effects.keys import Identity, call_counter, refuse_if_diverged
from keel.core.effects.ledger import Effect
from keel.core.effects.options import DeclaredEffect, EffectOptions
from keel.core.errors import EffectFailed, NondeterminismError, NotInRun, UsageError
from keel.core.store.base import Row, Tx
from keel.core.store.store import Store
from keel.core.wait_model import WaitKind, WaitStatus

P = ParamSpec("P")
R = TypeVar("R")
log = logging.getLogger("keel.core.effects.outbox")
PREFIX = "outbox:"


class IntentStatus(StrEnum):
    """Where an intent is: pending -> sending -> delivered, or dead, or in_doubt. (Not
    `keel.IntentState`: that is the error an action on an intent in the wrong status raises.)"""

    PENDING = "pending"
    SENDING = "sending"
    DELIVERED = "delivered"
    DEAD = "dead"
    """Its attempts ran out, or it failed permanently: kept with its error for a person."""
    IN_DOUBT = "in_doubt"
    """Its dispatcher died mid-delivery and nothing can say whether it reached the provider."""


class OutboxEffect(DeclaredEffect[P, R]):
    """An effect whose calls inside a node are recorded as intents and delivered later
    (`keel.effect(outbox=True)`)."""

    def __init__(self, fn: Callable[..., Any], options: EffectOptions) -> None:
        super().__init__(fn, options)
        register(self)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> str:
        return stage(self, args, kwargs)


EFFECTS: dict[str, OutboxEffect[Any, Any]] = {}
"""Outbox effects by name, as this process declared them: what its dispatcher can deliver."""


def register(effect: OutboxEffect[Any, Any]) -> None:
    known = EFFECTS.get(effect.name)
    if known is not None and known.fn is not effect.fn:
        log.warning("outbox effect %r declared again: the later declaration delivers", effect.name)
    EFFECTS[effect.name] = effect


def as_outbox(effect: Effect[Any, Any] | OutboxEffect[Any, Any]) -> OutboxEffect[Any, Any]:
    """The outbox form of a ledger effect (the same function and options)."""
    if isinstance(effect, OutboxEffect):
        return effect
    if not isinstance(effect, Effect):
        raise UsageError(f"keel.enqueue() takes a @keel.effect, not {type(effect).__name__}")
    known = EFFECTS.get(effect.name)
    if known is not None and known.fn is effect.fn:
        return known
    return OutboxEffect(effect.fn, effect.options)


def enqueue(effect: Effect[P, R] | OutboxEffect[P, R], *args: P.args, **kwargs: P.kwargs) -> str:
    """Record an intent to call `effect(*args, **kwargs)` with this step; return its id.

    The intent commits with the calling task's writes (nothing is recorded if the step does not
    commit) and a dispatcher delivers it later, with the intent id as idempotency key."""
    return stage(as_outbox(effect), args, kwargs)


@dataclass(frozen=True)
class _Intent:
    """One staged intent: what the saver inserts in the transaction of its task's writes."""

    key: str
    """Its id (`stage` drops an earlier attempt's intent of the same id)."""
    row: Row
    identity: Identity

    async def __call__(self, store: Store, tx: Tx) -> None:
        if await store.insert_intent(tx, self.row):
            await store.add_event(
                tx,
                self.row["run_id"],
                "outbox.enqueued",
                {"intent_id": self.key, "effect": self.row["effect"], "node": self.row["node"]},
                worker_id=self.row.get("worker_id"),
                token=self.row.get("token"),
            )
            return
        found = await store.read_intent(tx, self.key)
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
    counter, tool = call_counter(PREFIX + effect.name, ctx.effect_keys)
    if ctx.replay is None:
        refuse_if_diverged(ctx.calls, where, tool)
    index = ctx.calls.next(where, counter)
    place = f"call:{index}" if tool is None else f"tool:{tool}:call:{index}"
    intent_id = where.key("outbox", effect.name, place)
    if ctx.replay is not None:
        return intent_id  # a replay records nothing: the same id, nothing staged
    intent = _Intent(
        intent_id,
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
            "max_attempts": effect.options.attempts,
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
    return await_effects([handle], timeout=timeout, on_dead=on_dead)[0]


def await_effects(
    handles: list[str], *, timeout: float | str = "7d", on_dead: str = "wait"
) -> list[Any]:
    """Pause the run once until every intent of `handles` is delivered; return their results,
    in order. One wait, one pause and one resume for all of them (awaiting them one by one
    pauses and resumes the run once each). As `await_effect` otherwise: with
    `on_dead="raise"` the first dead one raises EffectFailed, naming it."""
    for handle in handles:
        if not isinstance(handle, str) or not handle.startswith(PREFIX):
            raise UsageError(
                f"keel.await_effect() takes an intent id from an outbox effect, not {handle!r}"
            )
    if on_dead not in ("wait", "raise"):
        raise UsageError(f"on_dead must be 'wait' or 'raise', not {on_dead!r}")
    if not handles:
        return []
    ctx = current("keel.await_effect()")
    names = sorted({h.split(":", 2)[1] for h in handles})
    payload: dict[str, Any] = (
        {"intent_id": handles[0]} if len(handles) == 1 else {"intent_ids": list(handles)}
    )
    spec = {
        "keel_wait": {
            "kind": WaitKind.OUTBOX.value,
            "name": ",".join(names),
            "payload": {**payload, "on_dead": on_dead},
            "timeout": parse_duration(timeout),
            "on_timeout": "fail",
        }
    }
    answer = ctx.pause(spec)
    decision = answer.get("decision") if isinstance(answer, dict) else answer
    if decision == IntentStatus.DELIVERED:
        results = answer.get("results")
        return list(results) if isinstance(results, list) else [answer.get("result")]
    failed = answer.get("intent_id") if isinstance(answer, dict) else None
    if decision == IntentStatus.DEAD:
        raise EffectFailed(str(failed or handles[0]), str(answer.get("error") or "dead"))
    raise EffectFailed(str(failed or handles[0]), f"not delivered (the wait ended {decision!r})")


def awaited(payload: Any) -> list[str]:
    """The intent ids an outbox wait's payload awaits (one, or several at once)."""
    if not isinstance(payload, dict):
        return []
    many = payload.get("intent_ids")
    return [str(i) for i in many] if isinstance(many, list) else [str(payload.get("intent_id"))]


async def answer_waits(store: Store, tx: Tx, intent: Row) -> int:
    """Decide the run's pending waits on `intent` if it is settled for them; return how many.

    A wait on several intents is decided when all are delivered (or, with `on_dead="raise"`,
    when one is dead). In the transaction that settles the intent (after the run's lock, so a
    concurrent settle of another intent of the wait is seen), and in the one that registers a
    wait (an intent delivered before its wait exists resumes the run at once)."""
    if intent["status"] not in (IntentStatus.DELIVERED, IntentStatus.DEAD):
        return 0
    answered = 0
    for wait in await store.read_waits(tx, intent["run_id"]):
        payload = loads(wait["payload"]) if wait["kind"] == WaitKind.OUTBOX else None
        ids = awaited(payload)
        if wait["status"] != WaitStatus.PENDING or intent["intent_id"] not in ids:
            continue
        assert isinstance(payload, dict)
        rows = [intent if i == intent["intent_id"] else await store.read_intent(tx, i) for i in ids]
        value = _outcome(wait["wait_id"], rows, raise_dead=payload.get("on_dead") == "raise")
        if value is None:
            continue
        decided = await store.decide_wait(
            tx,
            wait["wait_id"],
            decision=str(value["decision"]),
            value=dumps(value),
            decided_by="outbox",
            action_id=None,
            channel="outbox",
            comment=None,
        )
        answered += decided is not None
    return answered


def _outcome(wait_id: str, rows: list[Row | None], *, raise_dead: bool) -> dict[str, Any] | None:
    """The answer of an outbox wait on these intents, or None while it must wait on."""
    dead = [r for r in rows if r is not None and r["status"] == IntentStatus.DEAD]
    if dead and raise_dead:
        first = dead[0]
        return {
            "decision": IntentStatus.DEAD,
            "wait_id": wait_id,
            "intent_id": first["intent_id"],
            "result": None,
            "error": first["error"],
        }
    if any(r is None or r["status"] != IntentStatus.DELIVERED for r in rows):
        return None
    results = [loads(r["result"]) for r in rows if r is not None]
    return {
        "decision": IntentStatus.DELIVERED,
        "wait_id": wait_id,
        "intent_id": rows[0]["intent_id"] if rows[0] is not None else None,
        "result": results[0],
        "results": results,
        "error": None,
    }


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
