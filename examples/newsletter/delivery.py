"""Telling people: the approval notifications, and the one announcement once it is published.

Both are wired from the environment, so the same `examples.newsletter:app` runs offline, with a
mail server, or with Slack:

- $SLACK_BOT_TOKEN and $SLACK_CHANNEL (a channel id; $SLACK_API_URL overrides Slack's API
  address, e.g. for a local stand-in): approval requests go to Slack with Approve/Reject
  buttons (`keel.notifiers.slack.SlackNotifier`), and the announcement is posted there too.
- $NEWSLETTER_SMTP_URL (smtp://host:port): approval requests, reminders and escalations are
  emailed (`keel.notifiers.email.EmailNotifier`), and the announcement is emailed to the run's
  `notify_to`. $NEWSLETTER_MAIL_SPOOL is where the mail server keeps what it accepted (the
  reconciler looks there); $NEWSLETTER_MAIL_FROM is the sender.
- Neither: nothing leaves the machine; the announcement records that it had nowhere to go.

`announce` is a Keel outbox effect (docs/outbox.md): the node records the announcement with its
step and a dispatcher sends it, at most 30 a minute across all workers (a mail relay's or
Slack's limit), retried through an outage without holding a worker. Its key names the message
(the email's Message-ID, the Slack message's metadata), so its reconciler can ask the provider
whether a dispatcher that died after sending got it through.
"""

from __future__ import annotations

import email.utils
import os
from email.message import EmailMessage
from typing import Any

import keel
from keel.core.notifications import Notifier
from keel.notifiers.email import EmailNotifier, message_id_for, send_message, spooled

SMTP_ENV = "NEWSLETTER_SMTP_URL"
SPOOL_ENV = "NEWSLETTER_MAIL_SPOOL"
FROM_ENV = "NEWSLETTER_MAIL_FROM"
DEFAULT_FROM = "Keel newsletter <newsletter@keel.example>"
EVENT_TYPE = "keel_effect"


def slack_client() -> tuple[Any, str] | None:
    """(WebClient, channel id) from $SLACK_BOT_TOKEN, $SLACK_CHANNEL, $SLACK_API_URL; or None."""
    token, channel = os.environ.get("SLACK_BOT_TOKEN"), os.environ.get("SLACK_CHANNEL")
    if not token or not channel:
        return None
    from slack_sdk import WebClient

    base = os.environ.get("SLACK_API_URL") or WebClient.BASE_URL
    return WebClient(token=token, base_url=base if base.endswith("/") else base + "/"), channel


def notifiers_from_env() -> list[Notifier]:
    found: list[Notifier] = []
    if slack := slack_client():
        from keel.notifiers.slack import SlackNotifier

        found.append(SlackNotifier(*slack))
    if url := os.environ.get(SMTP_ENV):
        sender = os.environ.get(FROM_ENV, DEFAULT_FROM)
        found.append(EmailNotifier(url, sender, spool=os.environ.get(SPOOL_ENV) or None))
    return found


def transport() -> str:
    if os.environ.get(SMTP_ENV):
        return "smtp"
    if slack_client():
        return "slack"
    return "none"


def compose(to: str, subject: str, link: str, digest: str, key: str) -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = os.environ.get(FROM_ENV, DEFAULT_FROM)
    msg["To"] = to
    msg["Subject"] = subject
    msg["Date"] = email.utils.formatdate(usegmt=True)
    msg["Message-ID"] = message_id_for(key)
    msg["X-Keel-Idempotency-Key"] = key
    msg.set_content(f"{subject}\n\nRead it here: {link}\n(sha256 {digest})\n\n-- Keel\n")
    return msg


def _slack_post(text: str, key: str) -> dict[str, Any]:
    from slack_sdk.errors import SlackApiError

    client, channel = slack_client() or (None, "")
    assert client is not None
    try:
        resp = client.chat_postMessage(
            channel=channel,
            text=text,
            metadata={"event_type": EVENT_TYPE, "event_payload": {"idempotency_key": key}},
        )
    except SlackApiError as exc:
        status = int(exc.response.status_code or 0)
        if status == 429 or status >= 500:
            # Look before retrying: a 5xx may come after Slack posted it.
            raise keel.TransientError(f"Slack answered {status}") from exc
        raise
    return {"transport": "slack", "channel": resp["channel"], "ts": resp["ts"]}


def _slack_find(key: str, pages: int = 5) -> dict[str, Any] | None:
    client, channel = slack_client() or (None, "")
    assert client is not None
    cursor = None
    for _ in range(pages):
        resp = client.conversations_history(
            channel=channel, limit=200, include_all_metadata=True, cursor=cursor
        )
        for msg in resp.get("messages", []):
            meta = msg.get("metadata") or {}
            if (
                meta.get("event_type") == EVENT_TYPE
                and (meta.get("event_payload") or {}).get("idempotency_key") == key
            ):
                return {"transport": "slack", "channel": channel, "ts": msg["ts"]}
        cursor = (resp.get("response_metadata") or {}).get("next_cursor")
        if not resp.get("has_more") or not cursor:
            return None
    return None


def find_announcement(
    to: str, subject: str, link: str, digest: str, *, idempotency_key: str
) -> dict[str, Any] | None:
    """Ask the provider whether it got this key's announcement: its result, or None."""
    kind = transport()
    if kind == "slack":
        return _slack_find(idempotency_key)
    if kind == "smtp":
        spool = os.environ.get(SPOOL_ENV)
        if not spool:
            # No way to ask: raising makes Keel hold the effect in doubt for a person.
            raise RuntimeError(f"cannot look up sent mail: set {SPOOL_ENV}")
        message_id = message_id_for(idempotency_key)
        if spooled(spool, message_id):
            return {"transport": "smtp", "message_id": message_id, "to": to, "found": True}
    return None


@keel.effect(
    "announce",
    outbox=True,
    reconcile=find_announcement,
    retry=keel.Retry(max_attempts=4, initial=0.2, maximum=5.0),
    # One call's bound, as its client's own: a new owner of the run waits this long (and a
    # margin) from the call's start before it reconciles a key a crash left pending.
    timeout="10s",
    rate="30/m",
)
def announce(
    to: str, subject: str, link: str, digest: str, *, idempotency_key: str = keel.KEY
) -> Any:
    """Email or post the link to the published newsletter; once per key (see module doc)."""
    kind = transport()
    if kind == "smtp":
        msg = compose(to, subject, link, digest, idempotency_key)
        send_message(os.environ[SMTP_ENV], msg)
        return {"transport": "smtp", "message_id": str(msg["Message-ID"]), "to": to}
    if kind == "slack":
        # A retried post (after a 5xx or a timeout) may follow one Slack did get: look first.
        return _slack_find(idempotency_key) or _slack_post(f"{subject}: {link}", idempotency_key)
    return {"transport": "none", "note": f"set {SMTP_ENV} or SLACK_BOT_TOKEN/SLACK_CHANNEL"}
