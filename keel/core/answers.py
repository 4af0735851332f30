"""Provider answers this process heard but could not record.

A database that goes away (a restart, a failover, a dropped connection) between a provider's
answer and the ledger's record of it costs the execution, not the answer. The run comes back,
often to this same process, to a key left pending; any owner must then wait out that call's
deadline before it may ask the provider (keel.core.effects.ledger), a minute by default. The
answer kept here lets this process record it at once instead.

An answer is kept for its run and key under the lease token its call was made under. A pending
row names the token of the last call made for its key (a reservation or an arm writes it), and
tokens only grow within a run, so when the row is the run's own and names that token, the
answer is the answer to that last call: nothing was called after it. Keys a thread's runs share
(`key=` on a thread) are not kept: another run's tokens count from 1 too. Another process has
no such answer and waits out the deadline as before.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

LIMIT = 1_000
"""Answers kept at most: one per run in flight at an outage, normally. Past it, or past
`MAX_AGE`, the oldest go (their runs wait out the deadline, as without this)."""
MAX_AGE = 3600.0
"""Seconds an answer is kept: a run that has not come back by then went to another process."""


@dataclass(frozen=True)
class Heard:
    """A provider's answer to one call: the attempt it was, and what the provider returned."""

    token: int
    """The lease token the call was made under."""
    attempts: int
    value: Any
    at: float = field(default_factory=time.monotonic)


class UnrecordedAnswers:
    """Answers whose record failed, one per (run, key). Used on the event loop only."""

    def __init__(self, limit: int = LIMIT, max_age: float = MAX_AGE) -> None:
        self._limit = limit
        self._max_age = max_age
        self._answers: OrderedDict[tuple[str, str], Heard] = OrderedDict()

    def keep(self, run_id: str, key: str, heard: Heard) -> None:
        self._answers.pop((run_id, key), None)
        self._answers[(run_id, key)] = heard
        stale = time.monotonic() - self._max_age
        while self._answers and (
            len(self._answers) > self._limit or next(iter(self._answers.values())).at < stale
        ):
            self._answers.popitem(last=False)

    def take(self, run_id: str, key: str, token: int | None) -> Heard | None:
        """The answer to the call the run made under `key` and `token`. Whatever was kept for
        the key is forgotten either way: under another token it answers an earlier call."""
        heard = self._answers.pop((run_id, key), None)
        if heard is None or token is None or heard.token != token:
            return None
        if heard.at < time.monotonic() - self._max_age:
            return None
        return heard

    def __len__(self) -> int:
        return len(self._answers)
