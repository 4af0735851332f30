"""A real SMTP server on 127.0.0.1 that keeps what it accepted: the outside world, counted.

Each accepted message is kept in memory and, if a spool folder is given, written there as
`<sha256(Message-ID)>.eml` (atomically) so other processes can count it and a reconciler can
look a message up by its Message-ID, as it would ask a mail provider's API.

A slow provider is played by `hold` (seconds the "250" to DATA is held after the message was
accepted and counted) and `hold_quit` (seconds the reply to QUIT, `quit_reply`, is held).
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from keel.notifiers.email import spool_name


@dataclass(frozen=True)
class ReceivedMail:
    mail_from: str
    rcpt_tos: tuple[str, ...]
    message: EmailMessage
    received_ns: int = field(default_factory=time.monotonic_ns)
    """When it was accepted, on the system-wide monotonic clock (comparable across processes)."""

    @property
    def message_id(self) -> str:
        return str(self.message.get("Message-ID", ""))

    @property
    def subject(self) -> str:
        return str(self.message.get("Subject", ""))


class _Handler:
    def __init__(self, sink: SmtpSink) -> None:
        self.sink = sink

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw = envelope.original_content or envelope.content or b""
        data = raw if isinstance(raw, bytes) else raw.encode()
        message = email.message_from_bytes(data, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        self.sink._accept(
            ReceivedMail(str(envelope.mail_from), tuple(envelope.rcpt_tos), message), data
        )
        await asyncio.sleep(self.sink.hold)  # accepted, counted: the sender waits for "250"
        return "250 Message accepted for delivery"

    async def handle_QUIT(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        await asyncio.sleep(self.sink.hold_quit)
        return self.sink.quit_reply


class SmtpSink:
    """`with SmtpSink() as sink:` starts it on 127.0.0.1 on a free port."""

    def __init__(self, *, spool: str | os.PathLike[str] | None = None, port: int = 0) -> None:
        self.spool = Path(spool) if spool else None
        self.hold = 0.0
        self.hold_quit = 0.0
        self.quit_reply = "221 Bye"
        self._messages: list[ReceivedMail] = []
        self._lock = threading.Lock()
        self._controller = Controller(_Handler(self), hostname="127.0.0.1", port=port)
        self.host = "127.0.0.1"
        self.port = port

    def start(self) -> SmtpSink:
        if self.spool:
            self.spool.mkdir(parents=True, exist_ok=True)
        if self.port == 0:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            self._controller.port = self.port
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()

    def __enter__(self) -> SmtpSink:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"smtp://{self.host}:{self.port}"

    @property
    def messages(self) -> list[ReceivedMail]:
        with self._lock:
            return list(self._messages)

    def count(self, **match: str) -> int:
        """How many accepted messages have all these headers (e.g. subject=...)."""
        return sum(
            all(str(m.message.get(k.replace("_", "-"), "")) == v for k, v in match.items())
            for m in self.messages
        )

    def _accept(self, mail: ReceivedMail, raw: bytes) -> None:
        with self._lock:
            self._messages.append(mail)
        if self.spool and mail.message_id:
            fd, tmp = tempfile.mkstemp(dir=self.spool, suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                fh.write(raw)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.spool / spool_name(mail.message_id))
