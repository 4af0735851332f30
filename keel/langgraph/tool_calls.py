"""Which tool call an effect is made in.

LangGraph's ToolNode runs the tool calls of one AI message at once (sync tools on threads, async
ones as tasks), so the order in which they reach an effect changes from one execution to the
next. Keys numbered by that order named another call after a crash or a resume: a call refused
as changed, or, worse, sent again under a number no call had used yet. Each tool call has an
id, though, stored in the checkpointed message and so the same on every execution.

LangChain hands that id to callbacks (`on_tool_start(tool_call_id=...)`) in the thread or task
that runs the tool, right before the tool's body runs in a copy of that context. `ToolCalls`
puts it in `keel.core.effects.keys.tool_call` there, so the tool's effects are numbered within
their tool call, and puts back what was there when the tool ends.
"""

from __future__ import annotations

import threading
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler

from keel.core.effects.keys import tool_call


class ToolCalls(BaseCallbackHandler):
    """Sets the running tool call's id for the effects its tool makes. One per execution."""

    run_inline = True  # in the tool call's own thread or task: where its body will run
    raise_error = False
    # Only tool events matter (LangChain files them under "agent"): it skips the rest here.
    ignore_chain = True
    ignore_llm = True
    ignore_chat_model = True
    ignore_retriever = True
    ignore_retry = True
    ignore_custom_event = True

    def __init__(self) -> None:
        self._before: dict[UUID, str | None] = {}
        self._lock = threading.Lock()  # sync tools start and end on threads of their own

    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        **kwargs: Any,
    ) -> None:
        call_id = kwargs.get("tool_call_id")
        if not call_id:
            return  # a tool invoked with plain arguments: its caller's scope, if any, goes on
        with self._lock:
            self._before[run_id] = tool_call.get()
        tool_call.set(str(call_id))

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._restore(run_id)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._restore(run_id)

    def _restore(self, run_id: UUID) -> None:
        with self._lock:
            if run_id not in self._before:
                return
            before = self._before.pop(run_id)
        tool_call.set(before)
