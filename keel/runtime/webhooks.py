"""Completion webhooks: a run submitted with `webhook=URL` tells that URL when it ends (or
pauses on an interrupt, if asked), once, through the effect outbox.

`register` attaches the webhook to the run after its admission. From then on, the transaction
that ends or pauses the run records an intent of the built-in outbox effect `keel.webhook`
(the triggers of migration 0027 do it, so no statement that moves a run can forget), and every
dispatcher delivers it like any intent: under its id `webhook:<run_id>:<n>` (the Standard
Webhooks `webhook-id` a receiver dedupes by), signed, retried with back-off on network errors,
429 and 5xx (a `Retry-After` is honoured), dead after `max_attempts` and revived with
`keel effects retry`. A dispatcher that died mid-delivery sends it again under the same id (a
receiver is expected to dedupe), never a different one.

The body is the run as it was when it moved (docs/webhooks.md): Keel's summary, or the Agent
Server protocol's run for runs created through that protocol (`format="agent_server"`).
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import importlib
import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from keel.core.codec import loads
from keel.core.effects.options import EffectOptions, Retry
from keel.core.effects.outbox import OutboxEffect
from keel.core.errors import TransientError, UsageError
from keel.core.services import Services
from keel.core.store.store import Store
from keel.core.webhooks import WebhookRefused, WebhookSettings, signed_headers
from keel.runtime.webhook_http import WebhookFailed, post

log = logging.getLogger("keel.runtime.webhooks")
EFFECT = "keel.webhook"
EVENTS = ("completed", "failed", "cancelled", "timed_out", "interrupted")
"""What a run's webhook may be sent for; `interrupted`: the run paused on a wait."""
DEFAULT_EVENTS = ("completed", "failed", "cancelled", "timed_out")
FORMATS: dict[str, str] = {
    "keel": "",
    # The protocol's shapes live with the HTTP service (a layer above): imported by name, at the
    # first delivery that needs them, so a worker that sends none never loads FastAPI.
    "agent_server": "keel.service.agent_server.run_rows:protocol_run",
}

DELIVERING: contextvars.ContextVar[Services | None] = contextvars.ContextVar(
    "keel_webhook_services", default=None
)
"""The services of the dispatcher delivering (set by keel.runtime.dispatcher): its settings
and store."""


def settings_of(services: Services) -> WebhookSettings:
    found = getattr(services, "webhooks", None)
    return found if isinstance(found, WebhookSettings) else WebhookSettings.configure()


def check(
    settings: WebhookSettings, url: str, events: Iterable[str] | None, format: str = "keel"
) -> list[str]:
    """Refuse a webhook Keel could not send (WebhookRefused: no secret, a private address not
    allowed, a host that does not resolve; UsageError: an unknown event); its events."""
    chosen = list(DEFAULT_EVENTS if events is None else events)
    if isinstance(events, str):
        raise UsageError("webhook_on takes a list of events, e.g. ('completed', 'failed')")
    unknown = [e for e in chosen if e not in EVENTS]
    if unknown or not chosen:
        raise UsageError(f"webhook_on takes some of {', '.join(EVENTS)}; not {unknown or chosen}")
    if format not in FORMATS:
        raise UsageError(f"webhook format is one of {', '.join(FORMATS)}, not {format!r}")
    settings.signing_secret()
    try:
        settings.check_url(url)
    except OSError as exc:
        raise WebhookRefused(f"webhook host of {url!r} does not resolve: {exc}") from None
    return sorted(set(chosen), key=EVENTS.index)


async def register(
    store: Store,
    settings: WebhookSettings,
    run_id: str,
    url: str,
    events: list[str],
    format: str = "keel",
) -> bool:
    """Attach the (checked) webhook to the run; False if it had one already (the first
    stays). A run that ended or paused before this commits gets its webhook at once."""
    return await store.register_webhook(
        run_id, url=url, events=events, format=format, max_attempts=settings.max_attempts
    )


# -- the body --------------------------------------------------------------------------------


def _iso(seconds: Any) -> str | None:
    if seconds is None:
        return None
    return dt.datetime.fromtimestamp(float(seconds), dt.UTC).isoformat()


def keel_body(event: str, run: dict[str, Any]) -> dict[str, Any]:
    """Keel's body: `{"type": "run.<event>", "timestamp", "data": <the run's summary>}`."""
    output = run.get("output")
    data = {
        "run_id": run["run_id"],
        "job_id": run.get("job_id"),
        "thread_id": run.get("thread_id"),
        "workflow": run.get("workflow"),
        "workflow_version": run.get("workflow_version"),
        "attempt": run.get("attempt"),
        "status": run.get("status"),
        "decision": run.get("decision"),
        "termination_reason": run.get("termination_reason"),
        "error": run.get("error"),
        "output": loads(output) if isinstance(output, str) else output,
        "created_at": _iso(run.get("created_at")),
        "updated_at": _iso(run.get("updated_at")),
        "finished_at": _iso(run.get("finished_at")),
    }
    return {"type": f"run.{event}", "timestamp": data["updated_at"], "data": data}


def _formatter(format: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    module, _, name = FORMATS[format].partition(":")
    shaped: Callable[[dict[str, Any]], dict[str, Any]] = getattr(
        importlib.import_module(module), name
    )
    return shaped


ADMITTED = ("input", "thread_id", "command", "checkpoint_id", "config", "multitask_strategy")
"""A run's fields that never change after its admission: read at delivery, not copied into
every intent (its input may be large)."""


async def body_of(event: str, format: str, run: dict[str, Any]) -> bytes:
    """The bytes a delivery posts: the same on every attempt (the run as it moved, with what it
    was admitted with read from the store; None for those if it was pruned meanwhile)."""
    services = DELIVERING.get()
    stored = await services.store.get_run(run["run_id"]) if services is not None else None
    row = {**{k: (stored or {}).get(k) for k in ADMITTED}, **run}
    if format == "keel" or format not in FORMATS:
        shaped = keel_body(event, row)
    else:
        shaped = {**_formatter(format)(row), "webhook_event": event}
    return json.dumps(shaped, sort_keys=True, separators=(",", ":")).encode()


# -- the delivery ----------------------------------------------------------------------------


async def deliver(
    url: str, event: str, format: str, run: dict[str, Any], *, idempotency_key: str
) -> dict[str, Any]:
    """POST one completion webhook, signed; what the receiver answered."""
    try:
        status = await _deliver(url, event, format, run, idempotency_key)
    except TransientError as exc:
        _counted(idempotency_key, "retry", str(exc))
        raise
    except WebhookRefused as exc:
        _counted(idempotency_key, "blocked", str(exc))
        raise
    except WebhookFailed as exc:
        _counted(idempotency_key, "refused", str(exc))
        raise
    _counted(idempotency_key, "delivered", f"receiver answered {status}")
    return {"status": status, "event": event}


async def _deliver(url: str, event: str, format: str, run: dict[str, Any], delivery_id: str) -> int:
    services = DELIVERING.get()
    settings = settings_of(services) if services is not None else WebhookSettings.configure()
    secret = settings.signing_secret()
    try:
        # Checked again here: what the host resolves to may have changed since the submit.
        # The request goes to the addresses checked now, not to a fresh answer.
        to = await asyncio.to_thread(settings.destination, url)
    except OSError as exc:
        raise TransientError(f"webhook host does not resolve: {exc}") from None
    body = await body_of(event, format, run)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "keel-webhooks",
        **signed_headers(secret, delivery_id, int(time.time()), body),
    }
    return await asyncio.to_thread(
        post, to, body, headers, timeout=settings.timeout, deadline=settings.deadline
    )


def _counted(delivery_id: str, outcome: str, what: str) -> None:
    """One delivery attempt's line: `/metrics` counts them by outcome (keel.service.metrics)."""
    log.log(
        logging.INFO if outcome == "delivered" else logging.WARNING,
        "webhook %s: %s (%s)",
        delivery_id,
        outcome,
        what,
        extra={"event": "webhook.delivery", "outcome": outcome},
    )


WEBHOOK: OutboxEffect[..., dict[str, Any]] = OutboxEffect(
    deliver,
    EffectOptions.declare(
        EFFECT,
        # Receivers dedupe by webhook-id: one a dead dispatcher may have sent goes again.
        provider_idempotent=True,
        retry=Retry(
            max_attempts=10,
            initial=1.0,
            maximum=300.0,
            on=(TransientError,),
        ),
    ),
)
"""The built-in outbox effect every dispatcher delivers completion webhooks with."""
