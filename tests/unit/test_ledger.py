"""The effect ledger's states, by hand: pending -> sent, confirmed, failed or in_doubt; and a
stale lease token refused before anything is written or performed.

A node (tests/support/by_hand.py) calls a real effect under a real lease on an in-memory
database. A worker's death around the provider call is played by an effect that raises `Died`
(a BaseException, as far from the effect's own error handling as a SIGKILL): the key stays
`pending`, as a crash leaves it.
"""

from __future__ import annotations

from typing import Any

import pytest

import keel
from keel.core.effects.ledger import Effect
from keel.core.errors import EffectFailed, LeaseLost, RunCancelled
from tests.support.by_hand import Died, Node, Paused, claim, start, take_over
from tests.support.providers import Provider


def send_effect(
    provider: Provider,
    *,
    crashes: list[str] | None = None,
    fail_with: BaseException | None = None,
    reconcile: bool = False,
    **options: Any,
) -> Effect[..., Any]:
    """An email effect. `crashes` says, call by call, where the worker dies: "before" the
    provider is reached, or "after" it accepted the email (before the ledger recorded it);
    calls past the list succeed."""
    script = list(crashes or [])

    def send(to: str, *, idempotency_key: str) -> Any:
        provider.calls.append(idempotency_key)
        crash = script.pop(0) if script else None
        if crash == "before":
            raise Died
        if fail_with is not None:
            raise fail_with
        result = provider.deliver(idempotency_key, to)
        if crash == "after":
            raise Died
        return result

    def lookup(to: str, *, idempotency_key: str) -> Any:
        return provider.lookup(idempotency_key)

    return keel.effect("send", reconcile=lookup if reconcile else None, **options)(send)


def ledger(node: Node) -> list[tuple[str, int]]:
    return [(e["status"], e["attempts"]) for e in node.app.get_run(node.run_id).effects]


def kinds(node: Node) -> list[str]:
    return [e["kind"] for e in node.app.get_run(node.run_id).timeline]


def crashed(node: Node, send: Effect[..., Any]) -> None:
    """The first call's worker died (before or after the provider got the email)."""
    with pytest.raises(Died):
        node.call(send, "a@example.com")
    assert ledger(node) == [("pending", 0)]  # reserved, never recorded


# -- pending -> sent, and a replay served from the ledger --------------------------------------


def test_a_call_is_reserved_performed_and_recorded_sent_then_served_from_the_ledger(
    app: keel.App,
) -> None:
    provider = Provider()
    send = send_effect(provider)
    node = start(app)
    first = node.call(send, "a@example.com")
    assert ledger(node) == [("sent", 1)]
    again = node.call(send, "a@example.com")  # the node re-runs on a replay
    assert again == first == provider.results[provider.calls[0]]
    assert len(provider.calls) == 1 and len(provider.deliveries) == 1
    assert kinds(node).count("effect.sent") == 1


def test_other_arguments_in_one_execution_are_another_effect_with_another_key(
    app: keel.App,
) -> None:
    provider = Provider()
    send = send_effect(provider)
    node = start(app)
    node.execute(lambda: (send("a@example.com"), send("b@example.com")))
    assert len(set(provider.deliveries)) == 2
    assert ledger(node) == [("sent", 1), ("sent", 1)]


def test_the_same_call_twice_in_one_execution_is_two_effects_served_on_replay(
    app: keel.App,
) -> None:
    provider = Provider()
    send = send_effect(provider)
    node = start(app)
    first = node.execute(lambda: (send("a@example.com"), send("a@example.com")))
    assert first[0] != first[1] and len(provider.deliveries) == 2
    again = node.execute(lambda: (send("a@example.com"), send("a@example.com")))
    assert again == first and len(provider.calls) == 2
    assert sorted(e["call_index"] for e in app.get_run(node.run_id).effects) == [0, 1]


def test_a_replay_with_other_arguments_is_refused_naming_them_and_performs_nothing(
    app: keel.App,
) -> None:
    provider = Provider()
    calls: list[str] = []

    @keel.effect("notify")
    def notify(to: str, body: str, *, idempotency_key: str) -> Any:
        calls.append(idempotency_key)
        return provider.deliver(idempotency_key, body)

    node = start(app, name="tell")
    node.call(notify, "a@example.com", "sent at 10:00")
    with pytest.raises(keel.NondeterminismError) as info:
        node.call(notify, "a@example.com", body="sent at 10:05")  # a replay, a new timestamp
    assert (info.value.node, info.value.effect, info.value.changed) == ("tell", "notify", ["body"])
    assert "node 'tell'" in str(info.value) and "changed: body" in str(info.value)
    # Both fixes, in the words a user acts on: split the node, or name the identifying arguments.
    assert "call the effect in the next one" in str(info.value)
    assert "@keel.effect('notify', key=[...])" in str(info.value)
    assert len(calls) == 1 and len(provider.deliveries) == 1
    assert ledger(node) == [("sent", 1)]  # the recorded effect is kept as it was
    refused = [e for e in app.get_run(node.run_id).timeline if e["kind"] == "effect.nondeterminism"]
    assert refused[0]["data"]["changed"] == ["body"]


def test_key_names_the_arguments_that_identify_the_effect_the_others_may_change(
    app: keel.App,
) -> None:
    provider = Provider()

    @keel.effect("notify", key=("to",))
    def notify(to: str, body: str, *, idempotency_key: str) -> Any:
        return provider.deliver(idempotency_key, body)

    node = start(app)
    first = node.call(notify, "a@example.com", "sent at 10:00")
    assert node.call(notify, "a@example.com", "sent at 10:05") == first  # served, not re-sent
    assert len(provider.deliveries) == 1
    with pytest.raises(keel.NondeterminismError, match=r"changed: to;"):
        node.call(notify, "b@example.com", "sent at 10:05")
    assert len(provider.deliveries) == 1


def test_arguments_the_function_cannot_take_fail_before_anything_is_reserved(
    app: keel.App,
) -> None:
    provider = Provider()
    send = send_effect(provider)
    node = start(app)
    with pytest.raises(TypeError, match="effect 'send'"):
        node.call(send, "a@example.com", "unexpected")
    with pytest.raises(keel.KeelError, match="Keel supplies `idempotency_key`"):
        node.call(send, "a@example.com", idempotency_key="mine")
    assert provider.calls == [] and ledger(node) == []


def test_a_permanent_error_is_recorded_failed_and_never_performed_again(app: keel.App) -> None:
    provider = Provider()
    send = send_effect(provider, fail_with=ValueError("mailbox does not exist"))
    node = start(app)
    with pytest.raises(EffectFailed, match="mailbox does not exist"):
        node.call(send, "a@example.com")
    assert ledger(node) == [("failed", 1)]
    with pytest.raises(EffectFailed, match="mailbox does not exist"):
        node.call(send, "a@example.com")
    assert len(provider.calls) == 1  # the replay read the failure; it did not try again


def test_transient_errors_are_retried_under_the_same_key_until_the_last_attempt(
    app: keel.App, clock: keel.ManualClock
) -> None:
    provider = Provider()
    retry = keel.Retry(max_attempts=3, initial=2.0, jitter=0.0)
    send = send_effect(provider, fail_with=keel.TransientError("503"), retry=retry)
    node = start(app)
    started = clock.now()
    with pytest.raises(EffectFailed, match="503"):
        node.call(send, "a@example.com")
    assert len(provider.calls) == 3 and len(set(provider.calls)) == 1
    assert clock.now() - started == pytest.approx(2.0 + 4.0)  # backoff on the run's clock
    assert ledger(node) == [("failed", 3)]
    assert kinds(node).count("effect.retry") == 2


# -- a key left pending by a crash -------------------------------------------------------------


def test_a_reconciler_that_finds_the_effect_confirms_it_without_performing_again(
    app: keel.App,
) -> None:
    provider = Provider()
    send = send_effect(provider, crashes=["after"], reconcile=True)
    node = start(app)
    crashed(node, send)
    result = node.call(send, "a@example.com")  # the restarted worker replays the node
    assert result == provider.results[provider.calls[0]]
    assert len(provider.deliveries) == 1
    assert ledger(node) == [("confirmed", 1)]  # the crashed attempt reached the provider


def test_a_reconciler_that_finds_nothing_lets_the_effect_be_performed_once_more(
    app: keel.App,
) -> None:
    provider = Provider()
    send = send_effect(provider, crashes=["before"], reconcile=True)
    node = start(app)
    crashed(node, send)
    node.call(send, "a@example.com")
    assert len(provider.calls) == 2 and len(set(provider.calls)) == 1  # same key both times
    assert len(provider.deliveries) == 1
    assert ledger(node) == [("sent", 1)]
    reconciled = [e["data"] for e in app.get_run(node.run_id).timeline]
    assert {"key": provider.calls[0], "found": False} in reconciled


def test_a_provider_that_dedupes_by_key_gets_the_same_key_again(app: keel.App) -> None:
    provider = Provider(dedupe=True)
    send = send_effect(provider, crashes=["after"], provider_idempotent=True)
    node = start(app)
    crashed(node, send)
    node.call(send, "a@example.com")
    assert len(provider.calls) == 2 and len(set(provider.calls)) == 1
    assert len(provider.deliveries) == 1  # the provider deduplicated the retry by key
    assert ledger(node) == [("sent", 1)]


def test_without_reconciler_or_idempotent_provider_the_key_is_in_doubt_and_a_person_is_asked(
    app: keel.App,
) -> None:
    provider = Provider()
    send = send_effect(provider, crashes=["after"])
    node = start(app)
    crashed(node, send)
    with pytest.raises(Paused) as paused:
        node.call(send, "a@example.com")
    spec = paused.value.value["keel_wait"]
    assert (spec["kind"], spec["name"]) == ("effect", "send")
    assert spec["payload"]["idempotency_key"] == provider.calls[0]
    assert len(provider.calls) == 1  # never guessed: not sent a second time
    assert ledger(node) == [("in_doubt", 0)]
    assert node.register_pauses() == "waiting"
    [wait] = app.get_run(node.run_id).waits
    assert (wait["kind"], wait["status"]) == ("effect", "pending")


def asked(node: Node, send: Effect[..., Any]) -> None:
    """The replay finds the key in doubt; the run waits for a person (as the executor does)."""
    with pytest.raises(Paused):
        node.call(send, "a@example.com")
    assert node.register_pauses() == "waiting"


@pytest.mark.parametrize("performed", [True, False])
def test_a_persons_answer_settles_an_in_doubt_key(app: keel.App, performed: bool) -> None:
    provider = Provider()
    send = send_effect(provider, crashes=["after" if performed else "before"])
    node = start(app)
    crashed(node, send)
    asked(node, send)
    app.resolve_effect(node.run_id, performed=performed, result={"id": "by-hand"}, by="ops")
    resumed = claim(app, "worker-b")
    resumed.answers.extend(node.resume_values())
    result = resumed.call(send, "a@example.com")
    if performed:
        assert result == {"id": "by-hand"}  # the person's result, nothing sent again
        assert ledger(node) == [("confirmed", 1)]  # the crashed attempt reached the provider
    else:
        assert result == provider.results[provider.calls[0]]
        assert ledger(node) == [("sent", 1)]  # performed on the person's word
    assert len(provider.deliveries) == 1


def test_an_answer_already_acted_upon_is_not_used_for_a_second_delivery(
    app: keel.App, clock: keel.ManualClock
) -> None:
    """The person said "not performed", the effect was performed on that answer, and the worker
    died again before recording it: the old answer says nothing about that delivery."""
    provider = Provider()
    send = send_effect(provider, crashes=["before", "after"])
    node = start(app)
    crashed(node, send)
    asked(node, send)
    app.resolve_effect(node.run_id, performed=False, by="ops")
    answer = node.resume_values()
    resumed = claim(app, "worker-b")
    resumed.answers.extend(answer)
    with pytest.raises(Died):  # performed on that answer; died before the record
        resumed.call(send, "a@example.com")
    assert len(provider.deliveries) == 1
    again = take_over(app, clock, "worker-c")
    again.answers.extend(answer)  # the executor still hands the replay that decided wait
    with pytest.raises(Paused):
        again.call(send, "a@example.com")
    assert len(provider.deliveries) == 1, "the old answer was used for a second delivery"
    assert len(again.pauses) == 2  # the old answer came back, so a person is asked anew
    assert ledger(node) == [("in_doubt", 0)]


# -- fencing order: the lease first, then any write ---------------------------------------------


def test_a_stale_token_is_refused_before_anything_is_written_or_performed(
    app: keel.App, clock: keel.ManualClock
) -> None:
    provider = Provider()
    send = send_effect(provider)
    stale = start(app)
    live = take_over(app, clock)
    assert (stale.ctx.token, live.ctx.token) == (1, 2)
    before = app.get_run(stale.run_id).timeline
    with pytest.raises(LeaseLost, match="token 1 is stale"):
        stale.call(send, "a@example.com")
    assert provider.calls == []
    assert ledger(stale) == []
    assert app.get_run(stale.run_id).timeline == before
    live.call(send, "a@example.com")
    assert [e["lease_token"] for e in app.get_run(live.run_id).effects] == [2]


def test_a_worker_that_lost_its_lease_mid_call_cannot_record_the_outcome(
    app: keel.App, clock: keel.ManualClock
) -> None:
    provider = Provider()
    taken: list[Node] = []

    def send(to: str, *, idempotency_key: str) -> Any:
        taken.append(take_over(app, clock))  # the worker stalls past its lease, mid-call
        return provider.deliver(idempotency_key, to)

    node = start(app)
    with pytest.raises(LeaseLost):
        node.call(keel.effect("send")(send), "a@example.com")
    assert len(provider.deliveries) == 1
    assert ledger(node) == [("pending", 0)]  # the new owner will find it in doubt
    assert "effect.sent" not in kinds(node)


def test_a_run_cancelled_while_running_starts_no_new_effect(app: keel.App) -> None:
    provider = Provider()
    node = start(app)
    assert app.cancel(node.run_id, by="ops")["status"] == "running"  # requested
    with pytest.raises(RunCancelled):
        node.call(send_effect(provider), "a@example.com")
    assert provider.calls == [] and ledger(node) == []


# -- the last look at the lease, right before the provider call ----------------------------------


def test_a_lease_expired_after_the_reserve_performs_nothing(
    app: keel.App, clock: keel.ManualClock
) -> None:
    provider = Provider()

    def lookup(to: str, *, idempotency_key: str) -> Any:
        clock.advance(app.aio.runtime.lease_ttl + 1)  # the worker stalls here, past its lease
        return None

    send = keel.effect("send", reconcile=lookup)(
        lambda to, *, idempotency_key: provider.deliver(idempotency_key, to)
    )
    node = start(app)
    crashed(node, send_effect(provider, crashes=["before"]))
    provider.calls.clear()
    with pytest.raises(LeaseLost, match="expired"):
        node.call(send, "a@example.com")  # reserved, reconciled: then the lease is gone
    assert provider.deliveries == [] and ledger(node) == [("pending", 0)]


def _stall_after_reserve(app: keel.App, clock: keel.ManualClock, seconds: float) -> None:
    """The worker stalls right after each reservation commits (a GC pause, a frozen thread)."""
    store = app.aio.runtime.store
    reserve = store.reserve_effect

    async def stalled(*args: Any, **kwargs: Any) -> Any:
        found = await reserve(*args, **kwargs)
        clock.advance(seconds)
        return found

    store.reserve_effect = stalled  # type: ignore[method-assign]


@pytest.mark.parametrize("style", ["sync", "async"])
def test_a_call_made_past_the_reservations_lease_bound_looks_again_and_performs_nothing(
    app: keel.App, clock: keel.ManualClock, style: str
) -> None:
    provider = Provider()
    node = start(app)
    _stall_after_reserve(app, clock, app.aio.runtime.lease_ttl + 1)

    def send(to: str, *, idempotency_key: str) -> Any:
        return provider.deliver(idempotency_key, to)

    async def send_async(to: str, *, idempotency_key: str) -> Any:
        return provider.deliver(idempotency_key, to)

    effect = keel.effect("send")(send if style == "sync" else send_async)
    with pytest.raises(LeaseLost, match="expired"):
        node.call(effect, "a@example.com")  # an async one is awaited on the loop
    assert provider.deliveries == []
    assert ledger(node) == [("pending", 0)]  # reserved under a live lease, never performed


def test_a_call_within_the_reservations_lease_bound_goes_ahead(
    app: keel.App, clock: keel.ManualClock
) -> None:
    provider = Provider()
    node = start(app)
    _stall_after_reserve(app, clock, app.aio.runtime.lease_ttl * 0.4)  # well inside the lease left
    node.call(send_effect(provider), "a@example.com")
    assert len(provider.deliveries) == 1 and ledger(node) == [("sent", 1)]


def test_an_expired_lease_reserves_no_new_key(app: keel.App, clock: keel.ManualClock) -> None:
    provider = Provider()
    node = start(app)
    clock.advance(app.aio.runtime.lease_ttl + 1)  # still the current token, but takeable by anyone
    with pytest.raises(LeaseLost, match="expired"):
        node.call(send_effect(provider), "a@example.com")
    assert provider.calls == [] and ledger(node) == []


def test_a_function_that_takes_a_fencing_token_receives_the_runs_token(
    app: keel.App, clock: keel.ManualClock
) -> None:
    seen: list[tuple[str, int]] = []

    @keel.effect("write")
    def write(row: str, *, idempotency_key: str, fencing_token: int) -> Any:
        seen.append((row, fencing_token))
        return row

    @keel.effect("legacy_write")
    def legacy_write(row: str, *, idempotency_key: str, lease_token: int) -> Any:
        seen.append((row, lease_token))
        return row

    node = start(app)
    node.execute(lambda: (write("r1"), legacy_write("r2")))
    live = take_over(app, clock)
    live.step = 2
    live.call(write, "r3")
    assert seen == [("r1", 1), ("r2", 1), ("r3", 2)]
