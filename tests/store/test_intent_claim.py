"""An effect outbox intent's claim, renewed while its provider call runs
(keel/core/effects/delivery.py, through keel.core.leases.claim_kept).

A renewal is fenced by the claim's token alone, as a notification's is by its holder and
number: one that lands just past the claim's expiry (its database away a moment) keeps a claim
nobody took, rather than stopping renewal for the rest of the call and leaving the intent to a
dispatcher that would take it for a dead one's. A claim another dispatcher took (a new token)
is not renewed by its former holder.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import keel
from tests.support.by_hand import WORKFLOW, one_node, start
from tests.support.outbox_flows import mail

TTL = 1.0


def _on_loop(app: keel.App, fn: Callable[[], Any]) -> Any:
    async def go() -> Any:
        await app.aio.open()
        return await fn()

    return app.aio.runtime.portal.call(go())


def _pending_intent(make_app: Callable[..., keel.App]) -> tuple[keel.App, str]:
    """An app, and an intent of `mail` a node recorded with its step, due for delivery."""
    app = make_app(lease_ttl=TTL)
    app.workflow(WORKFLOW)(one_node)
    node = start(app)
    intent_id = node.call(mail, "ann@example.com")
    (staged,) = [write for writes in node.ctx.staged.values() for write in writes]
    store = app.aio.runtime.store

    async def commit() -> None:
        async with store.transaction() as tx:
            await staged(store, tx)

    _on_loop(app, commit)
    return app, intent_id


def _claim(app: keel.App, intent_id: str, worker_id: str, ttl: float) -> Any:
    """Take the intent as a dispatcher does; its row under the new claim."""
    store = app.aio.runtime.store

    async def go() -> Any:
        async with store.transaction() as tx:
            return await store.claim_intent(tx, intent_id, worker_id=worker_id, ttl=ttl, count=True)

    return _on_loop(app, go)


def _renew(app: keel.App, intent_id: str, token: int) -> bool:
    store = app.aio.runtime.store
    return bool(_on_loop(app, lambda: store.renew_intent_claim(intent_id, token, TTL)))


def _row(app: keel.App, intent_id: str) -> Any:
    store = app.aio.runtime.store
    return _on_loop(app, lambda: store.get_intent(intent_id))


def _up_for_grabs(app: keel.App) -> bool:
    """Whether a dispatcher would take an intent now (a lapsed claim's, as a dead one's)."""
    store = app.aio.runtime.store

    async def go() -> Any:
        async with store.transaction() as tx:
            return await store.intent_candidate(tx, [mail.name])

    return _on_loop(app, go) is not None


def test_a_renewal_after_its_claim_lapsed_keeps_it_if_nobody_took_it(
    make_app: Callable[..., keel.App],
) -> None:
    app, intent_id = _pending_intent(make_app)
    claimed = _claim(app, intent_id, "sender", 0.2)
    time.sleep(0.4)  # the claim lapses (by the database's clock)
    assert _up_for_grabs(app), "the claim did not lapse"
    assert _renew(app, intent_id, claimed["claim_token"])
    renewed = _row(app, intent_id)
    assert (renewed["status"], renewed["claimed_by"]) == ("sending", "sender")
    assert renewed["claim_token"] == claimed["claim_token"]
    assert renewed["claim_expires_at"] > claimed["claim_expires_at"]
    assert not _up_for_grabs(app), "a renewed claim was left for another dispatcher"


def test_a_claim_another_dispatcher_took_is_not_renewed_by_its_former_holder(
    make_app: Callable[..., keel.App],
) -> None:
    app, intent_id = _pending_intent(make_app)
    earlier = _claim(app, intent_id, "sender", 0.2)
    time.sleep(0.4)  # the claim lapses (by the database's clock)
    later = _claim(app, intent_id, "rival", TTL)
    assert later["claim_token"] == earlier["claim_token"] + 1
    taken = _row(app, intent_id)
    assert not _renew(app, intent_id, earlier["claim_token"])
    assert _row(app, intent_id) == taken
    assert _renew(app, intent_id, later["claim_token"])
