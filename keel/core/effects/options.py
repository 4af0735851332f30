"""What an effect declares, once for both kinds: `@keel.effect(...)`'s options.

`EffectArgs` (and `OutboxArgs`, for options only an outbox effect takes) is the public keyword
signature of `keel.effect` as callers write it; `EffectOptions` is the same options checked and
parsed, which a ledger effect (keel.core.effects.ledger) and an outbox effect
(keel.core.effects.outbox) both carry, and `DeclaredEffect` what the two kinds share. Adding an
option is a key here, its field and parse line in `EffectOptions.declare`, and the code that
enforces it.
"""

from __future__ import annotations

import functools
import inspect
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, ParamSpec, TypedDict, TypeVar, Unpack, cast

from keel.core.clock import parse_duration
from keel.core.effects.keys import Arguments, KeySpec
from keel.core.effects.rows import DEFAULT_TIMEOUT
from keel.core.errors import TransientError, UsageError
from keel.core.services import Services

P = ParamSpec("P")
R = TypeVar("R")
Duration = float | int | str | timedelta

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


@dataclass(frozen=True)
class Rate:
    """A token bucket shared by every dispatcher: `per_second` tokens a second, at most
    `burst` saved up. With a burst of one (the default) no window of the declared period ever
    sees more deliveries than declared: they are spaced by 1/per_second. A burst of b lets a
    quiet effect send b at once, so a window may see up to b - 1 more."""

    per_second: float
    burst: float = 1.0

    _FORM = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d*)\s*(s|sec|second|m|min|minute|h|hour)\s*$")
    _UNITS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60}

    @classmethod
    def parse(cls, text: str, burst: int | None = None) -> Rate:
        """`"20/s"`, `"600/m"`, `"1/5s"`, `"100/h"`: at most that many in any such window
        (`burst` None or 1); a `burst` above 1 allows that many at once after a quiet spell."""
        found = cls._FORM.match(text) if isinstance(text, str) else None
        if found is None:
            raise UsageError(f"rate {text!r}: write it as N/s, N/m or N/h (e.g. '20/s', '1/5s')")
        count, every, unit = float(found[1]), float(found[2] or 1), found[3]
        seconds = every * cls._UNITS.get(unit, 3600)
        if count <= 0 or seconds <= 0:
            raise UsageError(f"rate {text!r}: must be more than zero")
        if burst is not None and burst < 1:
            raise UsageError(f"rate {text!r}: burst must be at least 1, not {burst!r}")
        return cls(count / seconds, float(burst or 1))


class EffectArgs(TypedDict, total=False):
    """The options of `@keel.effect(...)` that both kinds take, as callers write them."""

    reconcile: Callable[..., Any] | None
    provider_idempotent: bool
    retry: Retry | None
    key: KeySpec
    timeout: Duration | None


class OutboxArgs(EffectArgs, total=False):
    """The options only an outbox effect (``outbox=True``) takes."""

    rate: str | None
    burst: int | None
    max_attempts: int | None


OUTBOX_ONLY = tuple(k for k in OutboxArgs.__annotations__ if k not in EffectArgs.__annotations__)
"""Options a ledger effect refuses (in the order they are declared)."""


@dataclass(frozen=True)
class EffectOptions:
    """An effect's options, checked and parsed: what both kinds of effect carry."""

    name: str
    reconcile: Callable[..., Any] | None = None
    """Asks the provider whether a key happened (same signature as the effect)."""
    provider_idempotent: bool = False
    """The provider dedupes by ``idempotency_key``: a key in doubt is sent again under it."""
    retry: Retry = field(default_factory=Retry)
    key: KeySpec = None
    """Which arguments identify the effect (keel.core.effects.keys)."""
    timeout: float | None = None
    """Seconds one provider call may take, as declared; None: the app's `effect_timeout`,
    and the call itself is never abandoned (docs/effects.md)."""
    rate: Rate | None = None
    """An outbox effect's deliveries, shared by every dispatcher (its burst included)."""
    burst: int | None = None
    """As declared: deliveries a quiet effect may make at once (None: one, so no window of
    the rate's period sees more than declared)."""
    max_attempts: int | None = None
    """An outbox effect's deliveries before it is dead; None: the retry policy's."""

    @classmethod
    def declare(cls, name: str, **args: Unpack[OutboxArgs]) -> EffectOptions:
        """The options of effect `name` from `@keel.effect`'s keywords (an `OutboxArgs`);
        UsageError (naming the effect) for one it cannot take."""
        rate, max_attempts = args.get("rate"), args.get("max_attempts")
        if max_attempts is not None and max_attempts < 1:
            raise UsageError(f"effect {name!r}: max_attempts must be at least 1")
        if args.get("burst") is not None and rate is None:
            raise UsageError(f"effect {name!r}: burst= goes with rate=")
        return cls(
            name,
            reconcile=args.get("reconcile"),
            provider_idempotent=bool(args.get("provider_idempotent", False)),
            retry=args.get("retry") or Retry(),
            key=args.get("key"),
            timeout=_seconds(name, args.get("timeout")),
            rate=Rate.parse(rate, args.get("burst")) if rate is not None else None,
            burst=args.get("burst"),
            max_attempts=max_attempts,
        )

    @property
    def attempts(self) -> int:
        """How many deliveries of an outbox effect's intent are made before it is dead."""
        return self.max_attempts if self.max_attempts is not None else self.retry.max_attempts

    def timeout_for(self, services: Services) -> float:
        """Seconds one provider call of this effect may take: declared, or the app's default."""
        return self.timeout if self.timeout is not None else services.effect_timeout


def _seconds(name: str, timeout: Duration | None) -> float | None:
    """A declared timeout in seconds (None when none is declared)."""
    if timeout is None:
        return None
    try:
        seconds = (
            timeout.total_seconds() if isinstance(timeout, timedelta) else parse_duration(timeout)
        )
    except (TypeError, ValueError) as exc:
        raise UsageError(f"effect {name!r}: timeout {timeout!r}: {exc}") from None
    if seconds <= 0:
        raise UsageError(f"effect {name!r}: timeout must be more than zero, not {timeout!r}")
    return seconds


class DeclaredEffect(Generic[P, R]):
    """A function made an effect, of either kind: its options and its arguments' identity."""

    def __init__(self, fn: Callable[..., Any], options: EffectOptions) -> None:
        if "idempotency_key" not in inspect.signature(fn).parameters:
            raise UsageError(f"effect {options.name!r}: the function must accept `idempotency_key`")
        self.fn, self.name, self.options = fn, options.name, options
        self.arguments = Arguments(fn, options.name, options.key)
        # Each kind is the callable (its own `__call__`): it wears the function's name and doc.
        functools.update_wrapper(cast(Any, self), fn)

    @property
    def timeout(self) -> float:
        """Seconds one provider call may take before it is abandoned (outcome unknown): as
        declared, else DEFAULT_TIMEOUT (a running app's default: `options.timeout_for`)."""
        return self.options.timeout if self.options.timeout is not None else DEFAULT_TIMEOUT

    @property
    def timeout_declared(self) -> bool:
        return self.options.timeout is not None
