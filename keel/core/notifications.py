"""What the outbox hands a notifier: the notification, and the notifier's protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

KINDS = ("request", "remind", "escalate", "decided", "expired")


@dataclass(frozen=True)
class Notification:
    """What a notifier is asked to say, and what it said before about the same wait."""

    intent_id: str
    kind: str
    run_id: str
    job_id: str
    workflow: str
    wait: dict[str, Any]
    details: dict[str, Any] = field(default_factory=dict)
    earlier: dict[str, Any] = field(default_factory=dict)
    """Results of this notifier's earlier deliveries for the wait, by kind (e.g. the request's
    Slack message `ts`, which a decision update edits)."""


@runtime_checkable
class Notifier(Protocol):
    name: str
    kinds: tuple[str, ...]

    def send(self, notification: Notification) -> Any:
        """Deliver (sync or async); return a JSON result. Raise TransientError to retry."""
        ...
