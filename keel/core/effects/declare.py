"""`keel.effect`: the one declaration of an effect, of either kind.

Without ``outbox=True`` the effect is called in its node through the ledger
(keel.core.effects.ledger); with it, a call records an intent that a dispatcher delivers
later (keel.core.effects.outbox). Both carry the same `EffectOptions`; the keywords are
declared once, in keel.core.effects.options.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, ParamSpec, TypeVar, Unpack, overload

from keel.core.effects.ledger import Effect
from keel.core.effects.options import OUTBOX_ONLY, EffectArgs, EffectOptions, OutboxArgs
from keel.core.effects.outbox import OutboxEffect
from keel.core.errors import UsageError

P = ParamSpec("P")
R = TypeVar("R")


@overload
def effect(
    name: str | None = None, *, outbox: Literal[False] = False, **options: Unpack[EffectArgs]
) -> Callable[[Callable[P, R]], Effect[P, R]]: ...


@overload
def effect(
    name: str | None = None, *, outbox: Literal[True], **options: Unpack[OutboxArgs]
) -> Callable[[Callable[P, R]], OutboxEffect[P, R]]: ...


def effect(
    name: str | None = None, *, outbox: bool = False, **options: Unpack[OutboxArgs]
) -> Callable[[Callable[P, R]], Any]:
    """Make a function an effect: once per key, whatever the retries and crashes around it.

    The function (sync or async) must take an ``idempotency_key`` keyword; pass it on to the
    provider if it dedupes by key. A function that takes ``fencing_token`` (or
    ``lease_token``) also gets the run's lease token, for providers that refuse stale writers.
    ``reconcile`` has the same signature and returns the effect's result if the provider has
    it, ``None`` if it never happened; ``provider_idempotent=True`` says the provider dedupes
    by key, so a key in doubt is sent again under it. ``retry`` (a `keel.Retry`) says which
    errors are transient and how to back off. ``key`` names the arguments that identify the
    effect (or is a function of the bound arguments): a replay may change the others.

    ``timeout`` (seconds, ``"30s"``, a timedelta; default: the app's ``effect_timeout``, 60 s)
    bounds one provider call: the caller stops waiting then and the outcome counts as unknown.
    It is recorded with the key, and a new owner of the run neither reconciles nor resends the
    key before that deadline (and a margin) has passed by the database's clock
    (docs/effects.md).

    With ``outbox=True`` a call inside a node records an intent with the step and returns its
    id at once; a dispatcher delivers it (``rate="20/s"`` shared by all dispatchers, up to
    ``max_attempts``, retried per ``retry``; see docs/outbox.md).
    """
    unknown = sorted(set(options) - set(OutboxArgs.__annotations__))
    if unknown:  # as a signature that names every keyword would
        raise TypeError(f"effect() got an unexpected keyword argument {unknown[0]!r}")
    given = [k for k in OUTBOX_ONLY if options.get(k) is not None]
    if given and not outbox:
        listed = " and ".join(f"{k}=" for k in OUTBOX_ONLY)
        raise UsageError(f"{listed} apply to outbox effects (outbox=True)")
    kind = OutboxEffect if outbox else Effect

    def wrap(fn: Callable[P, R]) -> Any:
        return kind(fn, EffectOptions.declare(name or fn.__name__, **options))

    return wrap
