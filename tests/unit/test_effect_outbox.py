"""The outbox's own rules on an in-memory app: the rate's forms, the token bucket shared in the
database (by its clock), and what an outbox effect refuses at declaration."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields

import pytest

import keel
from keel.core.effects.options import OUTBOX_ONLY, EffectOptions, OutboxArgs, Rate
from keel.core.effects.outbox import as_outbox
from tests.support.by_hand import memory_app, on_loop


@pytest.fixture
def clock() -> keel.ManualClock:
    return keel.ManualClock(1_800_000_000.0)


@pytest.fixture
def app(clock: keel.ManualClock) -> Iterator[keel.App]:
    with memory_app(clock) as the_app:
        yield the_app


def take(app: keel.App, effect: str, rate: Rate) -> float:
    store = app.aio.runtime.store

    async def go() -> float:
        async with store.transaction() as tx:
            return await store.take_rate_token(tx, effect, rate.per_second, rate.burst)

    return on_loop(app, go())


def test_rates_are_read_in_their_usual_forms() -> None:
    assert Rate.parse("20/s") == Rate(20.0, 1.0)
    assert Rate.parse("600/m") == Rate(10.0, 1.0)
    assert Rate.parse("1/5s") == Rate(0.2, 1.0)
    assert Rate.parse("3600 / hour") == Rate(1.0, 1.0)
    for bad in ("fast", "0/s", "20", "-1/s"):
        with pytest.raises(keel.KeelError, match=r"N/s|more than zero"):
            Rate.parse(bad)


def test_no_window_of_the_period_sees_more_than_the_rate(
    app: keel.App, clock: keel.ManualClock
) -> None:
    rate = Rate.parse("20/s")
    assert take(app, "mail", rate) == 0.0
    assert take(app, "mail", rate) == pytest.approx(0.05)  # the next token's time
    assert take(app, "sms", rate) == 0.0  # one bucket per effect
    clock.advance(60)  # a quiet minute saves up nothing: no burst on the next second
    sent: list[float] = []
    while len(sent) < 100:  # a greedy dispatcher: take, or sleep until the next token
        wait = take(app, "mail", rate)
        if wait == 0.0:
            sent.append(clock.now())
        else:
            clock.advance(wait)
    # (less a microsecond: the database's epoch seconds are a double, and a token due at a
    # time may be taken a hair before it, which the bucket allows)
    most = max(sum(1 for t in sent if start <= t < start + 1.0 - 1e-6) for start in sent)
    assert most == 20


def test_an_explicit_burst_is_what_a_quiet_effect_may_send_at_once(
    app: keel.App, clock: keel.ManualClock
) -> None:
    rate = Rate.parse("20/s", burst=5)
    clock.advance(60)
    assert [take(app, "mail", rate) for _ in range(6)][-2:] == [0.0, pytest.approx(0.05)]
    with pytest.raises(keel.KeelError, match="burst"):
        Rate.parse("20/s", burst=0)
    with pytest.raises(keel.KeelError, match="burst= goes with rate="):
        keel.effect("x", outbox=True, burst=5)(lambda *, idempotency_key: None)


def test_an_outbox_effect_refuses_what_it_cannot_take() -> None:
    with pytest.raises(keel.KeelError, match="outbox effects"):
        keel.effect("x", rate="1/s")
    with pytest.raises(keel.KeelError, match="idempotency_key"):
        keel.effect("y", outbox=True)(lambda to: to)
    with pytest.raises(keel.KeelError, match="max_attempts"):
        keel.effect("z", outbox=True, max_attempts=0)(lambda *, idempotency_key: None)
    with pytest.raises(keel.KeelError, match="intent id"):
        keel.await_effect("not-an-intent")
    with pytest.raises(keel.NotInRun):
        keel.await_effect("outbox:x:0")


def test_both_kinds_carry_one_set_of_options() -> None:
    # The public keywords (EffectArgs, OutboxArgs) and the parsed options are declared apart:
    # an option added to one and not the other fails here.
    assert set(OutboxArgs.__annotations__) == {f.name for f in fields(EffectOptions)} - {"name"}
    assert OUTBOX_ONLY == ("rate", "burst", "max_attempts")

    def send(to: str, *, idempotency_key: str = keel.KEY) -> str:
        return to

    ledger = keel.effect("opts_send", timeout="90s", retry=keel.Retry(max_attempts=2))(send)
    assert ledger.options == EffectOptions(
        "opts_send", retry=keel.Retry(max_attempts=2), timeout=90.0
    )
    assert ledger.options.attempts == 2 and ledger.timeout == 90.0 and ledger.timeout_declared
    queued = as_outbox(ledger)  # keel.enqueue's form of a ledger effect: the same options
    assert queued.options is ledger.options and queued.fn is send
    outbox = keel.effect("opts_post", outbox=True, rate="2/s", max_attempts=3)(send)
    assert outbox.options.rate == Rate(2.0, 1.0) and outbox.options.attempts == 3
    assert outbox.options.timeout is None and not outbox.timeout_declared
    with pytest.raises(TypeError, match="colour"):
        keel.effect("opts_bad", colour="red")  # type: ignore[call-overload]
