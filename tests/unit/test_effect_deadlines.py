"""Effect deadlines, by hand: a call that may still be under way is never reconciled or resent.

A key left pending by an execution that lost the database, or its lease, while its provider call
was in flight waits for that call's deadline (its effect's timeout and a margin, by the
database's clock) before anyone asks the provider or calls it again. A call that outlives its
timeout is abandoned (its outcome unknown) and settles the same way. A provider that holds two
outcomes for one key puts the key in doubt with both, never marks it sent.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import keel
from keel.core.effects.rows import DEFAULT_TIMEOUT, deadline_margin
from tests.support.by_hand import Died, Node, Paused, memory_app, start, take_over
from tests.support.providers import Provider

TIMEOUT = 120.0


def ledger(node: Node) -> list[tuple[str, int]]:
    return [(e["status"], e["attempts"]) for e in node.app.get_run(node.run_id).effects]


def timeline(node: Node, kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in node.app.get_run(node.run_id).timeline if e["kind"] == kind]


def test_a_key_whose_call_may_be_under_way_is_reconciled_only_after_its_deadline(
    app: keel.App, clock: keel.ManualClock
) -> None:
    """Worker A is cut off mid-call; B takes the run over once A's lease lapses, long before A's
    call could have ended: B holds off until the deadline, then asks the provider, which has
    the late commit by then. One delivery, the key confirmed."""
    provider = Provider()
    asked_at: list[float] = []
    started = clock.now()

    def send(to: str, *, idempotency_key: str) -> Any:
        provider.calls.append(idempotency_key)
        raise Died  # A loses everything here, its request still on the wire

    def lookup(to: str, *, idempotency_key: str) -> Any:
        asked_at.append(clock.now())
        # The provider commits A's request 60 s after it arrived (a slow payment API).
        if clock.now() >= started + 60 and not provider.lookup(idempotency_key):
            provider.deliver(idempotency_key, to)
        return provider.lookup(idempotency_key)

    effect = keel.effect("send", reconcile=lookup, timeout=TIMEOUT)(send)
    a = start(app)
    with pytest.raises(Died):
        a.call(effect, "a@example.com")
    b = take_over(app, clock)  # the lease lapsed: 31 s after A's reservation, not 120
    result = b.call(effect, "a@example.com")

    assert result == provider.results[provider.calls[0]]
    assert len(provider.calls) == 1, "B called the provider again"
    assert len(provider.deliveries) == 1
    assert asked_at and asked_at[0] >= started + TIMEOUT + deadline_margin(TIMEOUT)
    assert ledger(b) == [("confirmed", 1)]
    waited = timeline(b, "effect.awaiting_deadline")
    assert len(waited) == 1 and waited[0]["effect"] == "send"
    assert waited[0]["seconds"] == pytest.approx(TIMEOUT + deadline_margin(TIMEOUT) - 31, abs=1)


def test_a_key_past_its_deadline_is_reconciled_at_once(
    app: keel.App, clock: keel.ManualClock
) -> None:
    provider = Provider()
    script = ["after"]

    def send(to: str, *, idempotency_key: str) -> Any:
        provider.calls.append(idempotency_key)
        result = provider.deliver(idempotency_key, to)
        if script and script.pop(0) == "after":
            raise Died
        return result

    effect = keel.effect(
        "send", reconcile=lambda to, *, idempotency_key: provider.lookup(idempotency_key)
    )(send)
    a = start(app)
    with pytest.raises(Died):
        a.call(effect, "a@example.com")
    b = take_over(app, clock)  # 31 s later: the 2 s timeout (tests' default) has long passed
    b.call(effect, "a@example.com")
    assert len(provider.deliveries) == 1
    assert timeline(b, "effect.awaiting_deadline") == []
    assert ledger(b) == [("confirmed", 1)]


def test_a_reconciler_that_finds_two_outcomes_puts_the_key_in_doubt_with_both(
    app: keel.App, clock: keel.ManualClock
) -> None:
    provider = Provider()
    records = [{"id": "ch_1"}, {"id": "ch_2"}]

    def charge(amount: int, *, idempotency_key: str) -> Any:
        provider.calls.append(idempotency_key)
        raise Died

    def find(amount: int, *, idempotency_key: str) -> Any:
        raise keel.EffectConflict("two charges carry this key", records=records)

    effect = keel.effect("charge", reconcile=find)(charge)
    a = start(app)
    with pytest.raises(Died):
        a.call(effect, 100)
    b = take_over(app, clock)
    with pytest.raises(Paused):
        b.call(effect, 100)
    assert ledger(b) == [("in_doubt", 0)]
    row = b.app.get_run(b.run_id).effects[0]
    assert json.loads(row["result"])["records"] == records
    assert "two charges" in row["error"]
    assert timeline(b, "effect.conflict")[0]["n"] == 2


def test_an_effect_without_a_timeout_takes_the_apps_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KEEL_EFFECT_TIMEOUT", raising=False)
    made = memory_app(keel.ManualClock())
    try:
        assert made.aio.runtime.services.effect_timeout == DEFAULT_TIMEOUT == 60.0
    finally:
        made.close()
    declared = keel.effect("x", timeout="90s")(lambda *, idempotency_key: None)
    assert declared.timeout == 90.0 and declared.timeout_declared
    with pytest.raises(keel.KeelError, match="timeout"):
        keel.effect("x", timeout="soon")(lambda *, idempotency_key: None)


@pytest.mark.parametrize(
    ("given", "env"), [(0, None), (-5, None), (float("nan"), None), (30, "abc")]
)
def test_a_lease_ttl_that_is_no_positive_number_is_refused_clearly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, given: float, env: str | None
) -> None:
    """A TTL of zero or less had every worker take its own runs over at once, until they
    failed ('the run's worker died 9 times'); a TTL that is no number was a traceback."""
    if env is None:
        monkeypatch.delenv("KEEL_LEASE_TTL", raising=False)
    else:
        monkeypatch.setenv("KEEL_LEASE_TTL", env)
    with pytest.raises(keel.KeelError, match=r"KEEL_LEASE_TTL|lease_ttl"):
        keel.App(f"sqlite:///{tmp_path}/k.db", lease_ttl=given)
