"""The outside world of one execution: a fresh SMTP sink and HTTP sink, counted.

The clean run and every cell get their own: a cell's run has the clean run's run id and effect
keys (same job, same input), so a sink shared between them would take a cell's correct delivery
for a repeat of the clean run's and not count it.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from keel.testing.http import HttpSink
from keel.testing.smtp import SmtpSink

SMTP, HTTP = "smtp messages", "http deliveries"


@dataclass(frozen=True)
class Delivery:
    """One thing the outside world received and counted."""

    probe: str
    """SMTP or HTTP (the names `Outcome.world` counts under)."""
    what: str
    """`POST /charges` or `mail to ana@example.com: Re: ticket 17`."""
    key: str | None
    """Its Idempotency-Key header or Message-ID: how the provider could tell a repeat."""
    content: str
    """A digest of its body: the same request sent twice has the same content."""
    at_ns: int
    """When it arrived, on the system-wide monotonic clock (compared with the fault trace)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class World:
    """`with World(folder) as world:` an SMTP sink spooling under `folder`, an HTTP sink."""

    def __init__(self, folder: Path) -> None:
        self.smtp = SmtpSink(spool=folder / "spool")
        self.http = HttpSink()

    def __enter__(self) -> World:
        self.smtp.start()
        try:
            self.http.start()
        except BaseException:
            self.smtp.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.http.stop()
        self.smtp.stop()

    def placeholders(self) -> dict[str, str]:
        """What `{smtp_url}`, `{smtp_spool}` and `{http_url}` stand for in `--env`."""
        return {
            "smtp_url": self.smtp.url,
            "smtp_spool": str(self.smtp.spool),
            "http_url": self.http.url,
        }

    def counts(self) -> dict[str, int]:
        return {SMTP: len(self.smtp.messages), HTTP: len(self.http.deliveries)}

    def deliveries(self) -> list[Delivery]:
        found = [
            Delivery(
                SMTP,
                f"mail to {', '.join(m.rcpt_tos)}: {m.subject}",
                m.message_id or None,
                _digest(m.message.get_body(("plain", "html")) or m.message),
                m.received_ns,
            )
            for m in self.smtp.messages
        ]
        found += [
            Delivery(
                HTTP, f"{r.method} {r.route}", r.idempotency_key, _digest(r.body), r.received_ns
            )
            for r in list(self.http.deliveries)
        ]
        return sorted(found, key=lambda d: d.at_ns)


def _digest(content: Any) -> str:
    if not isinstance(content, bytes):
        content = str(content.get_content() if hasattr(content, "get_content") else content)
        content = content.encode()
    return hashlib.sha256(content).hexdigest()[:12]
