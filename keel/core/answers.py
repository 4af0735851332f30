"""Provider answers this process heard but could not record.

A database that goes away (a restart, a failover, a dropped connection) between a provider's
answer and the ledger's record of it costs the execution, not the answer. The run comes back,
usually to this same process within a second, to a key left pending; any owner must then wait
out that call's deadline before it may ask the provider (keel.core.effects.ledger), a minute
by default. The answer kept here lets this process record it at once instead.

An answer is kept under the effect's key and the lease token its call was made under. A pending
row names the token of the last call made for its key (a reservation or an arm writes it), so
an answer whose token matches is the answer to that last call: nothing was called after it.
Another process has no such answer and waits out the deadline as before.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

LIMIT = 10_000
"""Answers kept at most. Each is one whose record failed, so this is rarely more than the runs
in flight at one outage; past it the oldest go (their runs wait out the deadline)."""


@dataclass(frozen=True)
class Heard:
    """A provider's answer to one call: the attempt it was, and what the provider returned."""

    attempts: int
    value: Any


class UnrecordedAnswers:
    """Answers whose record failed, by (key, lease token). Used on the event loop only."""

    def __init__(self, limit: int = LIMIT) -> None:
        self._limit = limit
        self._answers: OrderedDict[tuple[str, int], Heard] = OrderedDict()

    def keep(self, key: str, token: int, heard: Heard) -> None:
        self._answers[(key, token)] = heard
        while len(self._answers) > self._limit:
            self._answers.popitem(last=False)

    def take(self, key: str, token: int | None) -> Heard | None:
        """The answer to the call `token` made under `key`, forgotten once taken."""
        if token is None:
            return None
        return self._answers.pop((key, token), None)

    def __len__(self) -> int:
        return len(self._answers)
