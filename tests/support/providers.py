"""A fake provider standing in for the outside world (a payment API, a mail server).

It is not what the tests test, Keel is. It records every call it receives and every delivery
it accepted, so a test counts what the outside world saw rather than what Keel believes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Provider:
    """A provider that keeps what it received, keyed by idempotency key."""

    dedupe: bool = False
    """Honour idempotency keys (a second delivery under a key returns the first)."""
    calls: list[str] = field(default_factory=list)
    """Keys of the calls an effect made (appended by the effect, delivered or not)."""
    deliveries: list[str] = field(default_factory=list)
    """Keys of the deliveries the provider accepted: what the world saw."""
    results: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def deliver(self, key: str, payload: Any) -> Any:
        with self.lock:
            if self.dedupe and key in self.results:
                return self.results[key]
            self.deliveries.append(key)
            result = {"id": f"p-{len(self.deliveries)}", "payload": payload}
            self.results[key] = result
            return result

    def lookup(self, key: str) -> Any:
        """What a reconciler asks: the result of the delivery under `key`, if there was one."""
        with self.lock:
            return self.results.get(key)
