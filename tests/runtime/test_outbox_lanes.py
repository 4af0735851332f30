"""Outbox delivery in lanes: a slow provider call holds its own lane, never the whole outbox.

A dispatcher delivers up to `concurrency` intents at once and at most half of them for one
effect; a call that outlives its effect's timeout is abandoned (its outcome unknown) and
reconciled once its deadline has passed, never resent on a guess. Each test counts what the
provider received, while the slow call is still blocked.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import keel
from keel.testing.http import HttpSink
from tests.support.checks import wait_until
from tests.support.outbox_flows import State, drain, graph, serving

AppFactory = Callable[..., keel.App]
release = threading.Event()
"""Set by a test to let its blocked calls answer."""


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[HttpSink]:
    release.clear()
    with serving(monkeypatch) as sink:
        yield sink
    release.set()


def _deliver(sink_url: str, route: str, to: str, key: str) -> Any:
    import httpx

    response = httpx.post(sink_url + route, json={"to": to, "ref": key}, timeout=30)
    response.raise_for_status()
    return response.json()


def _url() -> str:
    import os

    return os.environ["OUTBOX_TEST_URL"]


@keel.effect("lane_mail", outbox=True, provider_idempotent=True, timeout=60)
def lane_mail(to: str, *, idempotency_key: str = keel.KEY) -> Any:
    if to.startswith("slow"):
        release.wait(30)  # a provider that takes its time over this one
    return _deliver(_url(), "/mail", to, idempotency_key)


@keel.effect("lane_sms", outbox=True, provider_idempotent=True, timeout=60)
def lane_sms(to: str, *, idempotency_key: str = keel.KEY) -> Any:
    return _deliver(_url(), "/sms", to, idempotency_key)


def _find(to: str, *, idempotency_key: str = keel.KEY) -> Any:
    import httpx

    found = httpx.get(_url() + "/hung", params={"ref": idempotency_key}, timeout=10).json()
    return found["deliveries"][0] if found["deliveries"] else None


@keel.effect("lane_hung", outbox=True, reconcile=_find, timeout=0.5)
async def lane_hung(to: str, *, idempotency_key: str = keel.KEY) -> Any:
    import httpx

    async with httpx.AsyncClient(timeout=10) as client:  # the provider commits, then
        await client.post(_url() + "/hung", json={"to": to, "ref": idempotency_key})
    await asyncio.sleep(5)  # ... its answer never reaches this caller in time


@keel.effect("lane_late", outbox=True, reconcile=_find, timeout=0.5)
def lane_late(to: str, *, idempotency_key: str = keel.KEY) -> Any:
    answer = _deliver(_url(), "/hung", to, idempotency_key)
    time.sleep(1.0)  # answers past its timeout, within its deadline
    return answer


def _sender(effect: Any, *recipients: str) -> Callable[[State], State]:
    def send(state: State) -> State:
        return {"handle": [effect(to) for to in recipients][-1]}

    return send


def _drain_in_background(app: keel.App) -> threading.Thread:
    worker = threading.Thread(target=drain, args=(app,), daemon=True)
    worker.start()
    return worker


def test_one_slow_delivery_does_not_hold_back_the_others_of_its_effect(
    make_app: AppFactory, provider: HttpSink
) -> None:
    app = make_app()
    fast = [f"r{i}@example.com" for i in range(10)]
    app.workflow("slow-first", version="1")(
        graph(
            ("first", _sender(lane_mail, "slow@example.com")), ("then", _sender(lane_mail, *fast))
        )
    )
    app.submit("slow-first", job_id="s-1", input={"to": "x"})
    worker = _drain_in_background(app)
    wait_until(lambda: len(provider.lookup("/mail")) >= len(fast), 30, "the others delivered")
    assert all(d.json()["to"] != "slow@example.com" for d in provider.deliveries)
    release.set()
    worker.join(30)
    assert len(provider.lookup("/mail")) == len(fast) + 1


def test_a_slow_effect_holds_half_the_lanes_at_most(
    make_app: AppFactory, provider: HttpSink
) -> None:
    app = make_app()
    slow = [f"slow{i}@example.com" for i in range(8)]  # as many as the dispatcher's lanes
    app.workflow("slow-many", version="1")(
        graph(("first", _sender(lane_mail, *slow)), ("then", _sender(lane_sms, "sms@example.com")))
    )
    app.submit("slow-many", job_id="s-2", input={"to": "x"})
    worker = _drain_in_background(app)
    wait_until(lambda: provider.lookup("/sms"), 30, "the other effect delivered")
    assert provider.lookup("/mail") == [], "a slow call answered before it was released"
    release.set()
    worker.join(30)
    assert len(provider.lookup("/mail")) == len(slow)


def test_a_call_past_its_timeout_is_abandoned_then_reconciled_not_resent(
    make_app: AppFactory, provider: HttpSink
) -> None:
    app = make_app()
    app.workflow("hung", version="1")(graph(("send", _sender(lane_hung, "h@example.com"))))
    run_id = app.submit("hung", job_id="h-1", input={"to": "x"}).run_id
    drain(app)
    (intent,) = app.effect_intents(run_id=run_id)
    assert intent["status"] == "delivered", intent
    assert intent["attempts"] == 1
    assert len(provider.lookup("/hung")) == 1, "the provider was called twice"
    kinds = [e["kind"] for e in app.get_run(run_id).timeline]
    assert "outbox.reconciled" in kinds


def test_a_sync_call_answering_past_its_timeout_is_recorded_not_reconciled(
    make_app: AppFactory, provider: HttpSink
) -> None:
    app = make_app()
    app.workflow("late", version="1")(graph(("send", _sender(lane_late, "l@example.com"))))
    run_id = app.submit("late", job_id="l-1", input={"to": "x"}).run_id
    drain(app)
    (intent,) = app.effect_intents(run_id=run_id)
    assert intent["status"] == "delivered" and intent["attempts"] == 1, intent
    assert len(provider.lookup("/hung")) == 1
    assert [r.method for r in provider.requests] == ["POST"], "asked while the call ran"
