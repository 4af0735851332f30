"""What the notification outbox hands a notifier: the notification, and the notifier's
protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from keel.core.codec import dumps, loads

KINDS = ("request", "remind", "escalate", "decided", "expired")


def notification_payload(
    job_id: str,
    workflow: str,
    wait_id: str,
    kind: str,
    name: str,
    payload: str | None,
    approvers: str | None,
    deadline: float | None,
    details: str,
) -> str:
    """The payload of a wait's notification (JSON text), from the run's and the wait's
    columns (`payload`, `approvers` and `details` as JSON text): the one rule. The
    notification outbox's `record` calls it; SQLite's queries call it as `keel_notification`,
    registered on each connection; PostgreSQL's `keel_notification` (migration 0020) is its
    twin in SQL, which a test compares with it."""
    return dumps(
        {
            "job_id": job_id,
            "workflow": workflow,
            "wait": {
                "wait_id": wait_id,
                "kind": kind,
                "name": name,
                "payload": loads(payload),
                "approvers": loads(approvers),
                "deadline": deadline,
            },
            "details": loads(details),
        }
    )


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
