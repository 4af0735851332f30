"""A failing cell's likely cause, in words a user can act on: which code, what went wrong, and
the fix. A guess from what the outside world and the ledger saw, labelled as such."""

from __future__ import annotations

from collections import Counter

from keel.chaos.checks import Outcome
from keel.chaos.trace import Attributed
from keel.chaos.world import Delivery


def extra_deliveries(clean: list[Delivery], cell: list[Delivery]) -> list[Delivery]:
    """The cell's deliveries beyond the clean run's: matched first by what was sent (probe,
    request, content), then by request alone (content may vary: a timestamp in the body); what
    is left over, the later copies, are the repeats."""
    exact = Counter((d.probe, d.what, d.content) for d in clean)
    unmatched = []
    for d in cell:
        if exact[(d.probe, d.what, d.content)] > 0:
            exact[(d.probe, d.what, d.content)] -= 1
        else:
            unmatched.append(d)
    loose = Counter({(p, w): n for (p, w, _), n in exact.items() if n > 0})
    extra = []
    for d in unmatched:  # the first copies stand for the clean run's, the later ones are extra
        if loose[(d.probe, d.what)] > 0:
            loose[(d.probe, d.what)] -= 1
        else:
            extra.append(d)
    return sorted(extra, key=lambda d: d.at_ns)


def likely_cause(
    clean: Outcome, cell: Outcome, made: list[Attributed], extra: list[Delivery]
) -> str:
    if cell.error and "NondeterminismError" in cell.error:
        return _changed_args(cell) + f" (Keel refused the replay: {cell.error})"
    if extra:
        return _repeat(clean, cell, made, extra)
    if sum(cell.world.values()) < sum(clean.world.values()):
        return (
            "the outside world saw less than in the clean run: a delivery was lost. An effect "
            "whose reconciler answers 'found' for something the provider never received, or a "
            "result recorded before the call, does this; the reconciler must look the key up at "
            "the provider"
        )
    if cell.unsettled:
        return (
            "an effect was left unsettled after the crash: give it a reconciler (`reconcile=`, "
            "a lookup by its idempotency key) or, if the provider dedupes by key, "
            "`provider_idempotent=True`"
        )
    if cell.status != clean.status:
        why = f" ({cell.error})" if cell.error else ""
        return f"the run ended {cell.status}{why} after the crash, {clean.status} in the clean run"
    if cell.stale_writes:
        return "a worker wrote after losing its lease: fencing was bypassed (a Keel bug: report it)"
    return "the run did not end as the clean run did"


def _repeat(clean: Outcome, cell: Outcome, made: list[Attributed], extra: list[Delivery]) -> str:
    what = ", ".join(sorted({d.what for d in extra}))
    culprits = [m for m in made if any(_same(m.delivery, d) for d in extra)]
    outside = [m for m in culprits if not m.effect]
    if outside:
        nodes = ", ".join(sorted({f"`{m.node}`" for m in outside if m.node})) or "a node"
        return (
            f"node {nodes} sent to the provider outside `@keel.effect` ({what}): a crash before "
            "its step's checkpoint runs the node again, and it sends again. Fix: make the call an "
            "effect (`@keel.effect`) so the ledger records it once"
        )
    if any(n > clean.keys.get(name, 0) for name, n in cell.keys.items()):
        return _changed_args(cell)
    keys = {d.key for d in extra} | {m.delivery.key for m in culprits if m.delivery.key is not None}
    effects = ", ".join(sorted({f"`{m.effect}`" for m in culprits})) or "an effect"
    if len(keys - {None}) > 1 or any(d.key is None for d in extra):
        return (
            f"the idempotency key is not stable: {effects} sent the same request ({what}) again "
            "under another key (or none), so the provider could not tell it was a retry. Fix: "
            "pass on the `idempotency_key` Keel gives the effect (the same on every attempt), "
            "not one made with uuid4 or the clock"
        )
    return (
        f"{effects} reached the provider again ({what}) after the crash: with "
        "`provider_idempotent=True` the provider must dedupe by the key; otherwise give it a "
        "reconciler that looks the key up"
    )


def _changed_args(cell: Outcome) -> str:
    names = ", ".join(f"`{n}`" for n in sorted(cell.keys)) or "an effect"
    return (
        f"the effect's arguments changed between attempts ({names}), so a retry is not the "
        "same call. Fix: keep values made at call time (timestamps, uuid4, a model's sampled "
        "text) out of the arguments, or name the identifying ones with `key=`"
    )


def _same(a: Delivery, b: Delivery) -> bool:
    return (a.probe, a.what) == (b.probe, b.what)
