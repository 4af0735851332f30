"""Wait notifications by email: approval requests, reminders and escalations, sent with smtplib.

`EmailNotifier` is a Keel notifier (see keel.core.notification_outbox): the outbox hands it each
notification once,
with the intent id as idempotency key. The key names the message (`Message-ID:
<{intent hex}@keel.invalid>`, plus an `X-Keel-Intent-Id` header), so a mail provider can be asked
later whether it got *this* message. That question is `reconcile`, asked when a dispatcher died
between handing the message over and recording it: with a `spool` folder (where an SMTP server
keeps what it accepted, like `keel.testing.SmtpSink(spool=...)`, or your provider's sent-mail
lookup mirrored there) Keel learns the answer; without one the notification is marked in doubt
rather than sent twice.

    app.add_notifier(EmailNotifier("smtp://mail.internal:25", "keel@example.com"))

Recipients: the wait's `approvers` (request, reminder) and `escalate_to` (escalation); names that
are not email addresses (e.g. Slack user ids) are skipped.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import hashlib
import json
import os
import re
import smtplib
import ssl
from collections.abc import Sequence
from email.message import EmailMessage
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from keel.core import notification_outbox, notifications
from keel.core.errors import TransientError, UsageError
from keel.core.ids import digest
from keel.core.notifications import Notification

DEFAULT_KINDS = ("request", "remind", "escalate")
MAX_PAYLOAD_CHARS = 20_000
_HEX = re.compile(r"[0-9a-f]{16,64}")


def message_id_for(key: str) -> str:
    """The Message-ID of the one email an idempotency key (or intent id) may send."""
    tail = key.rsplit(":", 1)[-1].lower()
    if not _HEX.fullmatch(tail):
        tail = digest(key)[:32]
    return f"<{tail}@keel.invalid>"


def send_message(smtp_url: str, msg: EmailMessage, *, timeout: float = 10.0) -> None:
    """Hand `msg` to the SMTP server at `smtp://[user:pass@]host[:port]` (or `smtps://`).

    Raises TransientError when the server could not be reached or said "not now" (4xx): nothing
    was accepted, so retrying under the same key cannot send twice. Once the server accepted
    the message (250 to DATA), a failure of the QUIT that follows is not raised.
    """
    parts = urlsplit(smtp_url)
    if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
        raise UsageError(f"an SMTP URL looks like smtp://host:port, not {smtp_url!r}")
    try:
        if parts.scheme == "smtps":
            client: smtplib.SMTP = smtplib.SMTP_SSL(
                parts.hostname,
                parts.port or 465,
                timeout=timeout,
                context=ssl.create_default_context(),
            )
        else:
            client = smtplib.SMTP(parts.hostname, parts.port or 25, timeout=timeout)
    except OSError as exc:
        raise TransientError(f"SMTP server {parts.netloc} unreachable: {exc}") from exc
    accepted = False
    try:
        with client:
            try:
                if parts.username:
                    client.login(unquote(parts.username), unquote(parts.password or ""))
                client.send_message(msg)
                accepted = True
            except smtplib.SMTPResponseException as exc:
                if 400 <= exc.smtp_code < 500:
                    raise TransientError(f"SMTP {exc.smtp_code}: {exc.smtp_error!r}") from exc
                raise
    except (smtplib.SMTPException, OSError):
        if not accepted:
            raise
        # The server answered 250 to DATA: the message is delivered, whatever saying goodbye
        # (QUIT) met afterwards. Recorded failed, it would be a delivered message in doubt.


def email_addresses(names: Sequence[str]) -> list[str]:
    """The entries of `names` that are email addresses (`a@b.c` or `Name <a@b.c>`)."""
    found = []
    for name in names:
        _, address = email.utils.parseaddr(str(name))
        if re.fullmatch(r"[^@\s<>]+@[^@\s<>]+\.[^@\s<>]+", address) and name not in found:
            found.append(str(name))
    return found


def _when(deadline: Any) -> str:
    if deadline is None:
        return "none"
    moment = dt.datetime.fromtimestamp(float(deadline), dt.UTC)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


class EmailNotifier:
    """Email the people a wait is waiting for; each notification once (see module doc)."""

    def __init__(
        self,
        smtp_url: str,
        sender: str,
        name: str = "email",
        *,
        kinds: Sequence[str] = DEFAULT_KINDS,
        spool: str | Path | None = None,
        approval_url: str | None = None,
        timeout: float = 10.0,
        send_timeout: float | None = None,
    ) -> None:
        """`approval_url`, if given, is formatted with `run_id` and `wait_id` into a link
        (e.g. the console's inbox, "https://keel.internal/ui/approvals#{wait_id}").
        `timeout` bounds each exchange with the server; `send_timeout` a whole send
        (`keel.core.notification_outbox.SEND_TIMEOUT` unless given)."""
        unknown = set(kinds) - set(notifications.KINDS)
        if unknown:
            raise UsageError(f"unknown notification kinds {sorted(unknown)}")
        urlsplit(smtp_url)  # a malformed URL fails here, not at the first reminder
        self.smtp_url = smtp_url
        self.sender = sender
        self.name = name
        self.kinds = tuple(kinds)
        self.spool = Path(spool) if spool else None
        self.approval_url = approval_url
        self.timeout = timeout
        self.send_timeout = send_timeout
        # Without a place to look a message up, Keel must not guess: no reconciler at all.
        self.reconcile = self._lookup if self.spool else None

    def recipients(self, note: Notification) -> list[str]:
        if note.kind == "escalate":
            names = note.details.get("to") or note.wait.get("approvers") or []
        else:
            names = note.wait.get("approvers") or []
        return email_addresses(names)

    def compose(self, note: Notification, to: Sequence[str]) -> EmailMessage:
        wait, name = note.wait, note.wait.get("name", "approval")
        subjects = {
            "request": f"[keel] Approval needed: {name} for {note.job_id}",
            "remind": f"[keel] Reminder: {name} for {note.job_id} is waiting for you",
            "escalate": f"[keel] Escalated: {name} for {note.job_id} needs a decision",
            "decided": f"[keel] Decided: {name} for {note.job_id}",
            "expired": f"[keel] Deadline passed: {name} for {note.job_id}",
        }
        msg = EmailMessage()
        msg["From"] = self.sender
        msg["To"] = ", ".join(to)
        msg["Subject"] = subjects[note.kind]
        msg["Date"] = email.utils.formatdate(usegmt=True)
        msg["Message-ID"] = message_id_for(note.intent_id)
        if note.kind != "request":
            # Mail clients thread the reminder under the request it is about.
            first = message_id_for(
                notification_outbox.notification_id(
                    note.run_id, wait["wait_id"], "request", 0, self.name
                )
            )
            msg["In-Reply-To"] = first
            msg["References"] = first
        msg["X-Keel-Intent-Id"] = note.intent_id
        msg["X-Keel-Run-Id"] = note.run_id
        msg["X-Keel-Wait-Id"] = str(wait["wait_id"])
        msg["X-Keel-Notification"] = note.kind
        msg.set_content(self.body(note))
        return msg

    def body(self, note: Notification) -> str:
        wait = note.wait
        intro = {
            "request": "A run is waiting for your decision.",
            "remind": "Reminder: a run is still waiting for your decision.",
            "escalate": "Escalation: a run has waited too long for a decision; please decide.",
            "decided": f"Decided: {note.details.get('decision')} by {note.details.get('by')}.",
            "expired": f"The deadline passed; policy {note.details.get('policy')} applied.",
        }[note.kind]
        payload = json.dumps(wait.get("payload"), indent=2, sort_keys=True, ensure_ascii=False)
        if len(payload) > MAX_PAYLOAD_CHARS:
            payload = payload[:MAX_PAYLOAD_CHARS] + "\n... (truncated)"
        lines = [
            intro,
            "",
            f"Workflow: {note.workflow}",
            f"Job:      {note.job_id}",
            f"Run:      {note.run_id}",
            f"Wait:     {wait['wait_id']} ({wait.get('kind')} {wait.get('name')!r})",
            f"Deadline: {_when(wait.get('deadline'))}",
            "",
            payload,
            "",
        ]
        if note.kind in ("request", "remind", "escalate"):
            if self.approval_url:
                link = self.approval_url.format(run_id=note.run_id, wait_id=wait["wait_id"])
                lines += [f"Decide here: {link}", ""]
            lines += [
                "Or from a shell:",
                f"  keel approve {note.run_id} --wait-id {wait['wait_id']} --comment '...'",
                f"  keel reject {note.run_id} --wait-id {wait['wait_id']} --comment '...'",
                "",
            ]
        lines.append("-- Keel")
        return "\n".join(lines) + "\n"

    def send(self, note: Notification) -> dict[str, Any]:
        if note.kind in ("request", "remind", "escalate") and (
            "decided" in note.earlier or "expired" in note.earlier
        ):
            return {"skipped": "the wait was decided before this was delivered"}
        to = self.recipients(note)
        if not to:
            return {"skipped": "no email address among the recipients"}
        msg = self.compose(note, to)
        send_message(self.smtp_url, msg, timeout=self.timeout)
        return {"message_id": str(msg["Message-ID"]), "to": to}

    def _lookup(self, note: Notification) -> dict[str, Any] | None:
        assert self.spool is not None
        message_id = message_id_for(note.intent_id)
        if not spooled(self.spool, message_id):
            return None
        return {"message_id": message_id, "to": self.recipients(note), "found_by": "reconciler"}


# -- the mail spool: a provider's lookup by Message-ID ------------------------------------------


def spool_name(message_id: str) -> str:
    """The file a spooling SMTP server keeps a message under (one per Message-ID)."""
    return hashlib.sha256(message_id.strip().encode()).hexdigest()[:32] + ".eml"


def spooled(spool: str | os.PathLike[str], message_id: str) -> bool:
    """Whether an SMTP server spooling to `spool` accepted a message with this Message-ID:
    the reconcilers' lookup ("did the provider get it?")."""
    return (Path(spool) / spool_name(message_id)).exists()
