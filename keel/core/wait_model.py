"""The words of a wait, apart from waits.py: runs, the ledger and deadlines use them, and
waits.py imports those."""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Any


class WaitKind(StrEnum):
    APPROVAL = "approval"
    EFFECT = "effect"
    """An in-doubt effect: a person says whether it reached the provider."""
    OUTBOX = "outbox"
    """`keel.await_effect()`: the dispatcher answers it when the intent is delivered."""
    INTERRUPT = "interrupt"
    """A plain `interrupt()` from user code."""
    TIMER = "timer"
    """`keel.sleep()`: its deadline is its wake time; nobody answers it (keel.core.timers)."""


class WaitStatus(StrEnum):
    PENDING = "pending"
    DECIDED = "decided"
    EXPIRED = "expired"
    """Its deadline's policy (or a cancellation) answered it."""


class EffectAnswer(StrEnum):
    """The answers an in-doubt effect wait takes; every other wait takes any other answer."""

    PERFORMED = "performed"
    NOT_PERFORMED = "not_performed"


class ExpiryDecision(StrEnum):
    """The decision recorded on a wait that nobody answered: its deadline's policy applied,
    or its run was cancelled."""

    REJECTED = "rejected"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    WOKE = "woke"
    """A timer wait (`keel.sleep()`) whose wake time came."""


def keel_wait(value: Any) -> dict[str, Any] | None:
    """The description of the wait an interrupt's value carries when Keel paused on it
    (`keel.interrupt()`, `keel.approval()`, `keel.sleep()`, an effect's, a static breakpoint's:
    `{"keel_wait": {...}}`), or None for a plain `interrupt(value)` from user code."""
    if isinstance(value, dict) and isinstance(value.get("keel_wait"), dict):
        return value["keel_wait"]
    return None


def interrupt_kind(value: Any) -> str:
    """The kind of wait an interrupt's value is registered as: its Keel wait's, or a plain
    interrupt's (which a spec without a kind, written by an older version, is too)."""
    spec = keel_wait(value)
    return str(spec.get("kind", WaitKind.INTERRUPT) if spec is not None else WaitKind.INTERRUPT)


RESUMED = "resumed"
"""The decision of a plain interrupt answered with a value (`resume`): the graph's
`interrupt()` returns that value itself, not a decision."""


_INTERRUPT_ID = re.compile(r"[0-9a-f]{32}")


def is_interrupt_map(value: Any) -> bool:
    """Whether a resume value answers interrupts by their ids (`{interrupt_id: value}`), as
    LangGraph reads `Command(resume=...)`: an object whose every key is an interrupt's id."""
    return (
        isinstance(value, dict)
        and bool(value)
        and all(isinstance(k, str) and _INTERRUPT_ID.fullmatch(k) for k in value)
    )


def schedule_stages(schedule: Any) -> list[dict[str, Any]]:
    """A wait's reminder and escalation stages, in order, from its `schedule` (the column's
    JSON text, or its value): `{"stages": [...], "escalate_to": [...]}`, or, as waits
    registered before the escalation targets were kept apart, the list of stages itself."""
    value = json.loads(schedule) if isinstance(schedule, str) else schedule
    if isinstance(value, dict):
        value = value.get("stages")
    return [stage for stage in value if isinstance(stage, dict)] if isinstance(value, list) else []


def escalation_targets(schedule: Any) -> list[str]:
    """Who a wait's escalations go to (its `escalate_to`), whether a stage (`escalate_after`)
    or the deadline's `escalate` policy escalates it; they may decide it as its approvers do.
    A wait registered before they were kept apart names them only in its escalation stages."""
    value = json.loads(schedule) if isinstance(schedule, str) else schedule
    if isinstance(value, dict) and isinstance(value.get("escalate_to"), list):
        return [str(who) for who in value["escalate_to"]]
    named: list[str] = []
    for stage in schedule_stages(value):
        for who in stage.get("to") or []:
            if str(who) not in named:
                named.append(str(who))
    return named


def stored_schedule(stages: list[dict[str, Any]], escalate_to: list[str]) -> dict[str, Any]:
    """What a wait's `schedule` column keeps: its stages, and its escalation targets apart
    from them, for the deadline's `escalate` policy too (it has no stage of its own)."""
    return {"stages": stages, "escalate_to": escalate_to}
