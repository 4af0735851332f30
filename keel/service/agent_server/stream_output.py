"""What a graph with an output schema (`StateGraph(..., output_schema=...)`) shows its clients,
as LangGraph's server shows it: `wait` and `join` answer its output keys, as `invoke` returns
them; a stream's `values` carry its output keys alone, sent when they changed, and a node's
`updates` its writes to them (None when it wrote none). Its input and private keys stay on the
server (a thread's state still reads them all, as LangGraph's does)."""

from __future__ import annotations

import dataclasses
from typing import Any

from keel.service.agent_server.positions import Event

INTERRUPT = "__interrupt__"
_UNSEEN = object()


class OutputView:
    """The output keys of one graph, and the last `values` one stream sent through it."""

    def __init__(self, graph: Any) -> None:
        self.keys = output_keys(graph)
        self.last: Any = _UNSEEN

    def values(self, values: Any) -> Any:
        if self.keys is None or not isinstance(values, dict):
            return values
        return {k: v for k, v in values.items() if k in self.keys or k == INTERRUPT}

    def shown(self, event: Event) -> Event | None:
        """The event as the client sees it; None for `values` that show nothing new."""
        if self.keys is None:
            return event
        if event.event == "values":
            data = self.values(event.data)
            if INTERRUPT not in data and (data == self.last or (self.last is _UNSEEN and not data)):
                return None
            self.last = data
            return dataclasses.replace(event, data=data)
        if event.event == "updates" and isinstance(event.data, dict):
            shown = {node: self._update(node, wrote) for node, wrote in event.data.items()}
            return dataclasses.replace(event, data=shown)
        return event

    def _update(self, node: str, wrote: Any) -> Any:
        if node.startswith("__") or not isinstance(wrote, dict) or self.keys is None:
            return wrote
        return {k: v for k, v in wrote.items() if k in self.keys} or None


def output_keys(graph: Any) -> frozenset[str] | None:
    """The graph's output keys when they are fewer than its state's (None: it shows all)."""
    output = getattr(graph, "output_channels", None)
    state = getattr(graph, "stream_channels_asis", None)
    if not isinstance(output, list | tuple) or not isinstance(state, list | tuple):
        return None
    keys = frozenset(output)
    return keys if keys < frozenset(state) else None
