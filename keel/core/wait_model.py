"""The words of a wait, apart from waits.py: runs, the ledger and deadlines use them, and
waits.py imports those."""

from __future__ import annotations

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


_INTERRUPT_ID = re.compile(r"[0-9a-f]{32}")


def is_interrupt_map(value: Any) -> bool:
    """Whether a resume value answers interrupts by their ids (`{interrupt_id: value}`), as
    LangGraph reads `Command(resume=...)`: an object whose every key is an interrupt's id."""
    return (
        isinstance(value, dict)
        and bool(value)
        and all(isinstance(k, str) and _INTERRUPT_ID.fullmatch(k) for k in value)
    )
