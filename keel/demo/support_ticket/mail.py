"""Sending the reply: one email per approved ticket, through Keel's effect ledger.

`send_email` is a Keel effect: Keel derives its idempotency key from the run, the step and the
arguments, and performs it once per key. The key also names the message: the Message-ID is
`<{key hex}@keel.invalid>` and the key travels in an `X-Keel-Idempotency-Key` header, so the
provider can be asked later whether it got *this* message.

That question is `lookup_sent_email`, the effect's reconciler. Keel calls it when a worker died
after reserving the key but before recording the result: the email may or may not have left.
In production it is your mail provider's message-lookup API (search sent mail by Message-ID or
by your idempotency header: Postmark's and SendGrid's message search, SES with a sent-mail event
store, Gmail's `rfc822msgid:` search). Here "the provider" is Keel's test SMTP sink, whose spool
folder ($SUPPORT_MAIL_SPOOL) keeps every accepted message under a name derived from its
Message-ID; with the file transport it is that transport's own folder. Found: Keel records the
effect as confirmed and does not send again. Not found: it was never sent, and Keel sends it.

Transports, chosen from the environment at send time:
- $SUPPORT_SMTP_URL = smtp://host:port: plain SMTP (smtplib).
- else $SUPPORT_MAIL_DIR: write the .eml into that folder atomically (temp, fsync, rename).
"""

from __future__ import annotations

import email.utils
import hashlib
import os
import re
import smtplib
import tempfile
from email.message import EmailMessage
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import keel
from keel.notifiers.email import spool_name, spooled

SMTP_ENV = "SUPPORT_SMTP_URL"
SPOOL_ENV = "SUPPORT_MAIL_SPOOL"
DIR_ENV = "SUPPORT_MAIL_DIR"
FROM_ENV = "SUPPORT_MAIL_FROM"
DEFAULT_FROM = "Nimbus Support <support@nimbus.example>"
KEY_HEADER = "X-Keel-Idempotency-Key"
TICKET_HEADER = "X-Support-Ticket"


def message_id_for(idempotency_key: str) -> str:
    """The Message-ID of the one email an idempotency key may send."""
    tail = idempotency_key.rsplit(":", 1)[-1].lower()
    if not re.fullmatch(r"[0-9a-f]{16,64}", tail):
        tail = hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]
    return f"<{tail}@keel.invalid>"


def compose(
    to: str, subject: str, body: str, *, ticket_id: str, idempotency_key: str
) -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = os.environ.get(FROM_ENV, DEFAULT_FROM)
    msg["To"] = to
    msg["Subject"] = subject
    msg["Date"] = email.utils.formatdate(usegmt=True)
    msg["Message-ID"] = message_id_for(idempotency_key)
    msg[KEY_HEADER] = idempotency_key
    msg[TICKET_HEADER] = ticket_id
    msg.set_content(body)
    return msg


def transport() -> tuple[str, str]:
    """("smtp", url) or ("file", folder), from the environment."""
    if url := os.environ.get(SMTP_ENV):
        return "smtp", url
    if folder := os.environ.get(DIR_ENV):
        return "file", folder
    raise RuntimeError(f"no mail transport: set {SMTP_ENV} (smtp://host:port) or {DIR_ENV}")


def _send_smtp(url: str, msg: EmailMessage) -> None:
    parts = urlsplit(url)
    if parts.scheme != "smtp" or not parts.hostname:
        raise ValueError(f"{SMTP_ENV} must look like smtp://host:port, not {url!r}")
    try:
        client = smtplib.SMTP(parts.hostname, parts.port or 25, timeout=10)
    except OSError as exc:
        # Nothing was handed over yet: retrying under the same key cannot send twice.
        raise keel.TransientError(f"SMTP server {parts.netloc} unreachable: {exc}") from exc
    with client:
        try:
            client.send_message(msg)
        except smtplib.SMTPResponseException as exc:
            if 400 <= exc.smtp_code < 500:  # the server said "not now": nothing was accepted
                raise keel.TransientError(f"SMTP {exc.smtp_code}: {exc.smtp_error!r}") from exc
            raise


def _write_file(folder: str, msg: EmailMessage) -> Path:
    target_dir = Path(folder)
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / spool_name(str(msg["Message-ID"]))
    fd, tmp = tempfile.mkstemp(prefix=".mail.", suffix=".tmp", dir=target_dir)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(msg.as_bytes())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(target_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return target


def lookup_sent_email(
    to: str, subject: str, body: str, *, ticket_id: str, idempotency_key: str
) -> dict[str, Any] | None:
    """Ask "the provider" whether it accepted this key's email: its result, or None."""
    kind, where = transport()
    folder = where if kind == "file" else os.environ.get(SPOOL_ENV)
    if not folder:
        # No way to ask: raising (not returning None) makes Keel mark the effect in doubt and
        # wait for a person, instead of guessing "not sent" and maybe sending twice.
        raise RuntimeError(f"cannot look up sent mail: set {SPOOL_ENV} for the SMTP transport")
    message_id = message_id_for(idempotency_key)
    if not spooled(folder, message_id):
        return None
    raw = (Path(folder) / spool_name(message_id)).read_bytes()
    return {
        "message_id": message_id,
        "to": to,
        "transport": kind,
        "found_by": "reconciler",
        "eml": raw.decode("utf-8", "replace"),
    }


@keel.effect(
    "send_email",
    reconcile=lookup_sent_email,
    retry=keel.Retry(max_attempts=4, initial=0.2, maximum=5.0),
    # One call's bound, as its client's own: a new owner of the run waits this long (and a
    # margin) from the call's start before it reconciles a key a crash left pending.
    timeout="10s",
)
def send_email(
    to: str, subject: str, body: str, *, ticket_id: str, idempotency_key: str = keel.KEY
) -> dict[str, Any]:
    """Send the reply; Keel calls this at most once per idempotency key (see module doc)."""
    msg = compose(to, subject, body, ticket_id=ticket_id, idempotency_key=idempotency_key)
    kind, where = transport()
    if kind == "smtp":
        _send_smtp(where, msg)
    else:
        _write_file(where, msg)
    return {
        "message_id": str(msg["Message-ID"]),
        "to": to,
        "transport": kind,
        "eml": msg.as_string(),
    }
