"""A notifier standing in for Slack or email: it keeps what the outbox asked it to deliver."""

from __future__ import annotations

import threading
from typing import Any

from keel.core.notifications import KINDS, Notification


class Recorder:
    """Records each delivered notification; can fail, or die after delivering, on request.

    `failures` are raised by the next sends, in order: a `Died` (tests/support/by_hand.py)
    after the delivery, as a sender killed before it settled the intent; any other exception
    before it. With `reconcile`, the notifier answers "was it delivered?" with yes, as a
    provider's lookup by intent id would for a message it has.
    """

    def __init__(
        self,
        name: str = "recorder",
        kinds: tuple[str, ...] = KINDS,
        *,
        reconcile: bool = False,
        failures: list[BaseException] | None = None,
    ) -> None:
        self.name = name
        self.kinds = kinds
        self.sent: list[Notification] = []
        self.failures = list(failures or [])
        self._lock = threading.Lock()
        if reconcile:
            self.reconcile = self._reconcile

    def send(self, note: Notification) -> dict[str, Any]:
        with self._lock:
            failure = self.failures.pop(0) if self.failures else None
            if failure is not None and not getattr(failure, "after_delivery", False):
                raise failure
            self.sent.append(note)
            result = {"ts": f"{note.kind}-{len(self.sent)}"}
        if failure is not None:
            raise failure
        return result

    def _reconcile(self, note: Notification) -> dict[str, Any] | None:
        return {"found": True}

    def kinds_sent(self) -> list[str]:
        return [note.kind for note in self.sent]
