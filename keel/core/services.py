"""What the core's operations need from the process around them, and nothing more.

The runtime builds one `Services` and hands it down: to the executor's `RunContext` (what a node
may use: the store, the clock, the portal for sync calls), to the sweeper, the outbox and
decisions. Core code never sees the Runtime, so it cannot reach upward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from keel.core.answers import UnrecordedAnswers
from keel.core.clock import Clock
from keel.core.infra import Attempts
from keel.core.notifications import Notifier
from keel.core.portal import Portal
from keel.core.store.store import Store
from keel.core.webhooks import WebhookSettings


@dataclass
class Services:
    store: Store
    clock: Clock
    portal: Portal
    lease_ttl: float
    artifacts_root: Path
    notifiers: dict[str, Notifier] = field(default_factory=dict)
    wake: Callable[[], None] = lambda: None
    """Wake this process's workers (a run was queued, a decision recorded)."""
    attempts: Attempts = field(default_factory=Attempts)
    """How many crashed or interrupted executions a run gets before it ends failed."""
    effect_timeout: float = 60.0
    """Seconds one provider call of an effect that declares no `timeout=` may take."""
    webhooks: WebhookSettings = field(default_factory=WebhookSettings)
    """How completion webhooks are signed and where they may go (keel.runtime.webhooks)."""
    answers: UnrecordedAnswers = field(default_factory=UnrecordedAnswers)
    """Provider answers this process heard but could not record (keel.core.answers)."""
    recording: set[str] = field(default_factory=set)
    """Outbox intents whose delivery's outcome this process is recording through an outage: its
    dispatchers do not reclaim them meanwhile (keel.core.effects.delivery.settle)."""
