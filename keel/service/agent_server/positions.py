"""Events of a run's stream and their places (ids) in it (keel.service.agent_server.stream)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sse_starlette.sse import ServerSentEvent

from keel.core.codec import dumps

# The checkpoint part is a LangGraph checkpoint id (a UUID) or `-`: anything else (`x/1`) names
# a place no run has, and a stream resumed there would silently skip or repeat events.
_POSITION = re.compile(
    r"(-|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"
    r"/(\d{1,9})(?:/(\d{1,18}))?(?:/(\d{1,18}))?(?:/[a-z]{1,20})?"
)
RESUMED = 999_999_999
"""The `n` of the chunks an execution produced resuming a pause: after the pause's events."""


@dataclass(frozen=True, order=True)
class Position:
    """A place in a run's sequence of events: after event `n` of the block of `checkpoint`
    (`""`: before the run's first checkpoint), and after stream chunk `chunk` placed there.
    Checkpoint ids grow with time (LangGraph's own order of a thread's checkpoints), so
    positions compare as (checkpoint, n, chunk)."""

    checkpoint: str = ""
    n: int = 0
    chunk: int = 0
    """A stream chunk's id (keel_stream_chunks), 0 for an event derived from a checkpoint."""
    again: int = 0
    """For the events of a pause again at a checkpoint the run paused at before (a node that
    calls `interrupt()` once more after its answer): their place after the chunks of the
    execution that paused there again (`chunk`, with `n` RESUMED), numbered by its lease
    token, so each such pause has places of its own."""

    def __str__(self) -> str:
        place = f"{self.checkpoint or '-'}/{self.n}"
        if self.again:
            return f"{place}/{self.chunk}/{self.again}"
        return f"{place}/{self.chunk}" if self.chunk else place

    @classmethod
    def parse(cls, text: str) -> Position:
        """The position an event id names (a framing event's name is dropped); ValueError if
        it is no id of this server's. `-1` is the start, before every event: the id the JS
        SDK's `useStream` rejoins a run with (langgraph-api answers it with the whole stream)."""
        if text.strip() == "-1":
            return cls()
        found = _POSITION.fullmatch(text.strip())
        if found is None:
            raise ValueError(f"{text[:80]!r} is not an event id of this server")
        checkpoint = "" if found[1] == "-" else found[1]
        return cls(checkpoint, int(found[2]), int(found[3] or 0), int(found[4] or 0))


@dataclass(frozen=True)
class Event:
    event: str
    data: Any
    position: Position
    name: str = ""
    """A framing event's name (metadata, error, end, superseded): it is part of the event's
    id."""
    mode: str = ""
    """The stream mode that asks for it (`""`: its event's name; framing events are always
    sent)."""

    @property
    def id(self) -> str:
        return f"{self.position}/{self.name}" if self.name else str(self.position)

    def sse(self) -> ServerSentEvent:
        return ServerSentEvent(data=dumps(self.data), event=self.event, id=self.id)
